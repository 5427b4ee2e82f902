"""Finding the vocabulary offline: the search order, the hash check, the error that says how to fix it."""

from __future__ import annotations

import gzip
import threading
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

import harmonykit as hk
from budget import examples
from harmonykit import vocab


@pytest.fixture
def plain_vocab(tmp_path: Path) -> Path:
    bundled = vocab.candidate_sources()[-1][1]
    assert bundled is not None
    with gzip.open(bundled) as src:
        (tmp_path / vocab.FILENAME).write_bytes(src.read())
    return tmp_path


def test_ranks_are_sequential_in_the_checked_file(plain_vocab: Path) -> None:
    # parse_ranks counts ranks instead of reading them: true of this exact file.
    lines = (plain_vocab / vocab.FILENAME).read_bytes().split(b"\n")
    assert all(int(line.split()[1]) == i for i, line in enumerate(lines) if line)
    ranks = vocab.parse_ranks((plain_vocab / vocab.FILENAME).read_bytes())
    assert len(ranks) == 199998 and ranks[b"hello"] == 24912


def test_prefers_tiktoken_encodings_base(monkeypatch: pytest.MonkeyPatch, plain_vocab: Path) -> None:
    monkeypatch.setenv("TIKTOKEN_ENCODINGS_BASE", str(plain_vocab))
    assert vocab.candidate_sources()[0][1] == plain_vocab / vocab.FILENAME
    assert vocab.read_vocabulary() == (plain_vocab / vocab.FILENAME).read_bytes()


def test_falls_back_to_tiktoken_cache_then_bundled_copy(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                        plain_vocab: Path) -> None:
    monkeypatch.setenv("TIKTOKEN_ENCODINGS_BASE", str(tmp_path / "missing"))
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / vocab.TIKTOKEN_CACHE_KEY).write_bytes((plain_vocab / vocab.FILENAME).read_bytes())
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(cache))
    assert vocab.read_vocabulary()[:20] == (plain_vocab / vocab.FILENAME).read_bytes()[:20]
    (cache / vocab.TIKTOKEN_CACHE_KEY).unlink()
    assert len(vocab.read_vocabulary()) == 3613922  # from the bpe-openai package


def test_corrupt_file_is_rejected_and_next_source_used(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    (tmp_path / vocab.FILENAME).write_bytes(b"not a vocabulary")
    monkeypatch.setenv("TIKTOKEN_ENCODINGS_BASE", str(tmp_path))
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", "")
    assert vocab.read_vocabulary() != b"not a vocabulary"


def test_error_lists_where_it_looked_and_how_to_fix(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    (tmp_path / vocab.FILENAME).write_bytes(b"corrupt")
    monkeypatch.setenv("TIKTOKEN_ENCODINGS_BASE", str(tmp_path))
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path / "nocache"))
    monkeypatch.setattr(vocab, "_bpe_openai_copy", lambda: None)
    with pytest.raises(hk.VocabularyError) as info:
        vocab.read_vocabulary()
    message = str(info.value)
    assert "$TIKTOKEN_ENCODINGS_BASE" in message and "has sha256" in message
    assert "tiktoken's cache" in message and "does not exist" in message
    assert "the bpe-openai package: not set" in message
    assert "pip install bpe-openai" in message and vocab.SHA256 in message
    assert isinstance(info.value, hk.HarmonyError)


def test_loaded_once_and_thread_safe() -> None:
    results: list[object] = []
    threads = [threading.Thread(target=lambda: results.append(hk.load_harmony_encoding("HarmonyGptOss")))
               for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len({id(r) for r in results}) == 1
    assert hk.load_harmony_encoding(hk.HarmonyEncodingName.HARMONY_GPT_OSS) is results[0]


def test_unknown_encoding_name() -> None:
    with pytest.raises(ValueError, match="Invalid HarmonyEncodingName: nope"):
        hk.load_harmony_encoding("nope")


def test_vocabulary_special_tokens(enc: hk.HarmonyEncoding) -> None:
    assert len(enc.special_tokens_set) == 1091
    assert enc.encode("<|return|><|constrain|><|channel|><|start|><|end|><|message|><|call|>",
                      allowed_special="all") == [200002, 200003, 200005, 200006, 200007, 200008, 200012]
    assert enc.decode_utf8([200014]) == "<|reserved_200014|>"
    assert enc.decode_utf8([201088]) == "<|reserved_201088|>"
    assert enc.is_special_token(200006) and not enc.is_special_token(24912)
    assert sorted(enc.stop_tokens()) == [200002, 200007, 200012]
    assert sorted(enc.stop_tokens_for_assistant_actions()) == [200002, 200012]


_PIECES = ["<|start|>", "<|end|>", "<|reserved_200020|>", "<|constrain|>", "<|", "|>", "<|foo|>", "a", " b", "é",
           "<|channel|>x", "<|start|", "\n", "😊"]


@examples(400)
@given(st.lists(st.one_of(st.sampled_from(_PIECES), st.text(max_size=5)), max_size=12),
       st.sampled_from(["all", frozenset({"<|start|>", "<|end|>"}), frozenset()]))
def test_encode_with_special_tokens_is_tiktokens(pieces: list[str], allowed: Any) -> None:
    """The special-token split is ours (for speed); the ids are exactly tiktoken's."""
    enc = hk.load_harmony_encoding(hk.HarmonyEncodingName.HARMONY_GPT_OSS)
    text = "".join(pieces)
    expected = enc.bpe.encode(text.encode("utf-16", "surrogatepass").decode("utf-16", "replace"),
                               allowed_special=allowed, disallowed_special=())
    assert enc.encode(text, allowed_special=allowed, disallowed_special=()) == expected


@examples(300)
@given(st.lists(st.one_of(st.integers(0, 201100), st.integers(195000, 201100), st.integers(-5, 2**33)),
                max_size=40))
def test_special_positions_is_the_plain_scan(ids: list[int]) -> None:
    from harmonykit.tokens import STARTOFTEXT, special_positions

    assert special_positions(ids) == (ids, [i for i, t in enumerate(ids) if not 0 <= t < STARTOFTEXT])
    assert special_positions(tuple(ids))[1] == special_positions(ids)[1]


@pytest.mark.parametrize("c", [" ", "\t", "\u3000", "\n", "\xa0"])
def test_long_whitespace_runs_encode_as_tiktoken_does(c: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Below tiktoken's breaking point the shortened-run encoding is tiktoken's own, exactly."""
    import harmonykit.vocab as v

    bpe = v.load_bpe()
    monkeypatch.setattr(v, "_RUN_LIMIT", 2000)
    encode = v.ordinary_encoder(bpe)
    for n in (2000, 2001, 3333, 8191):
        for before, after in (("", ""), ("a", "b"), ("x\n", " y"), ("  ", "\t"), ("\n", "\n")):
            text = before + c * n + after
            assert encode(text) == bpe.encode_ordinary(text), (c, n, before, after)


@pytest.mark.parametrize("c", [" ", "\t", "\u3000"])
def test_a_million_whitespace_characters_do_not_panic(c: str) -> None:
    enc = hk.load_harmony_encoding(hk.HarmonyEncodingName.HARMONY_GPT_OSS)
    text = "hi" + c * 1_000_800 + "there"
    tokens = enc.encode(text)
    assert enc.decode(tokens) == text
    convo = hk.Conversation.from_messages([hk.Message.from_role_and_content(hk.Role.USER, text)])
    assert enc.decode(enc.render_conversation(convo)).count(c) == 1_000_800


def test_what_still_breaks_the_tokenizer_is_a_harmony_error() -> None:
    enc = hk.load_harmony_encoding(hk.HarmonyEncodingName.HARMONY_GPT_OSS)
    with pytest.raises(hk.HarmonyError, match="whitespace"):
        enc.encode(" \t" * 600_000)
