"""The header grammar: role, recipient, channel and content type.

- ``parse_reference``: the reference's reading of a decoded header string, rule
  for rule (strict mode, and the tolerant mode's first try, which keeps the
  tolerant parser identical to the reference on well-formed output);
- the pieces the tolerant reading (``rules.resolve``, which never fails and
  names each repair it makes) is built from: a header's text with the tokens
  behind each character (``decode_header``), its words, and what a word may be
  (a channel in disguise, a plausible recipient, a content type).

``parse_reference`` follows openai-harmony's header parsing (Apache-2.0, Copyright OpenAI)
rule for rule; see NOTICE.
"""

from __future__ import annotations

import functools
import re
from bisect import bisect_right
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from ..model import Role
from ..tokens import (
    CHANNEL,
    CHANNEL_MARKER,
    CONSTRAIN,
    CONSTRAIN_MARKER,
    SPECIAL_TOKEN_NAMES,
    STARTOFTEXT,
)
from ._rust_escape import ESCAPED
from .result import Repair

# Rust's char::is_whitespace (Unicode White_Space); Python's str.isspace differs.
RUST_WS = frozenset(
    "\t\n\x0b\x0c\r \x85\xa0\u1680\u2028\u2029\u202f\u205f\u3000"
    + "".join(chr(c) for c in range(0x2000, 0x200B))
)
_ASCII_WS = re.compile(r"[ \t\n\x0c\r]+")
_RUST_WS_RE = re.compile("[" + re.escape("".join(sorted(RUST_WS))) + "]")
# Only a word holding these letters can be a channel name in disguise (cheap to rule out).
_HAS_CHANNEL_LETTERS = re.compile(r"(?i)analysis|commentary|final")
_WORD = re.compile(r"[^ \t\n\x0c\r]+")
_CHANNEL_END = re.compile("[<" + re.escape("".join(sorted(RUST_WS))) + "]")
ROLES = {r.value: r for r in Role}
KNOWN_CHANNELS = ("analysis", "commentary", "final")
_KNOWN_CONTENT_TYPES = frozenset({"json", "code", "text", "python", "markdown", "html", "xml"})
_MIME = re.compile(r"^[a-z]+/[a-z0-9.+\-]+$")
DOUBLED_ROLE = re.compile(r"^(user|assistant|system|developer)\1+$")
GLUED_CHANNEL = re.compile(r"^(user|assistant|system|developer)+(analysis|commentary|final)$")
TITLE_WORD = re.compile(r"^[A-Z][A-Za-z0-9_\-]*$")
_STRIPPED = re.compile(r"^\s*(analysis|commentary|final)(?=\S)")
_STRIPPED_SPLIT = re.compile(r"(?:assistant)+(?=(?:analysis|commentary|final))")


class HeaderError(Exception):
    """A header the reference rejects; the text is the reference's."""


@dataclass(frozen=True, slots=True)
class Header:
    """A message header as read; shared by the messages that repeat it, so never changed."""

    role: Role
    name: str | None = None
    recipient: str | None = None
    channel: str | None = None
    content_type: str | None = None

    def to_state(self) -> dict[str, object]:
        author: dict[str, object] = {"role": self.role.value}
        if self.name is not None:
            author["name"] = self.name
        return {
            "author": author,
            "recipient": self.recipient,
            "channel": self.channel,
            "content_type": self.content_type,
        }


def rust_trim(s: str) -> str:
    i, j = 0, len(s)
    while i < j and s[i] in RUST_WS:
        i += 1
    while j > i and s[j - 1] in RUST_WS:
        j -= 1
    return s[i:j]


_ESCAPED_STARTS = [lo for lo, _ in ESCAPED]


def _rust_escapes(ch: str) -> bool:
    """Whether Rust's ``{:?}`` escapes ``ch`` (not printable, or grapheme-extending)."""
    cp = ord(ch)
    k = bisect_right(_ESCAPED_STARTS, cp) - 1
    return k >= 0 and cp <= ESCAPED[k][1]


_RUST_ESCAPES = {'"': '\\"', "\\": "\\\\", "\n": "\\n", "\r": "\\r", "\t": "\\t", "\0": "\\0"}


def rust_debug(s: str) -> str:
    """A string as Rust's ``{:?}`` prints it."""
    out = ['"']
    for ch in s:
        esc = _RUST_ESCAPES.get(ch)
        if esc is None and ch != " " and _rust_escapes(ch):
            esc = f"\\u{{{ord(ch):x}}}"
        out.append(esc or ch)
    out.append('"')
    return "".join(out)


def parse_reference(
    header: str, role: Role | None, parse_recipient_and_type: bool
) -> tuple[Header, str | None]:
    """The reference's header rules; returns the header and any words left over."""
    channel: str | None = None
    idx = header.find(CHANNEL_MARKER)
    if idx != -1:
        after = header[idx + len(CHANNEL_MARKER) :]
        m = _CHANNEL_END.search(after)
        end = m.start() if m else len(after)
        if end == 0:
            raise HeaderError("channel marker present but no channel value found in header")
        channel = after[:end]
        header = header[:idx] + after[end:]
    header = rust_trim(header)
    if CONSTRAIN_MARKER in header:
        header = rust_trim(header.replace(CONSTRAIN_MARKER, " " + CONSTRAIN_MARKER))
    parts = [p for p in _ASCII_WS.split(header) if p]
    role_str: str | None = None
    if role is None:
        if not parts:
            raise HeaderError("message header did not contain a role")
        role_str = parts[0]
        parsed = ROLES.get(role_str)
        if parsed is None:
            if len(parts) > 1 or parts[0].startswith("to="):
                parts.pop(0)
                parsed = Role.TOOL
            else:
                raise HeaderError(f"Unknown role: {role_str}")
        role = parsed
    if parts and parts[0] == role.value:
        parts.pop(0)
    recipient: str | None = None
    content_type: str | None = None
    if parse_recipient_and_type and parts:
        n = len(parts)
        last = parts.pop()
        if last.startswith("to="):
            recipient = last[3:]
        elif n == 1:
            # 0.0.8 reads a lone part as the recipient, even <|constrain|>json
            # (garbage: strict mode raises on it, tolerant mode repairs it).
            recipient = last
        else:
            content_type = last
            if parts:
                raw = parts.pop()
                recipient = raw[3:] if raw.startswith("to=") else raw
    remaining = " ".join(parts) if parts else None
    name = role_str if role is Role.TOOL else None
    return Header(role, name, recipient, channel, content_type), remaining


def fix_lone_constrain(header: Header) -> Header:
    """``<|channel|>final <|constrain|>json``: 0.0.8 reads the lone part as the recipient;
    it is the content type (as later reference versions read it)."""
    if header.recipient is not None and header.recipient.startswith(CONSTRAIN_MARKER) \
            and header.content_type is None:
        return Header(header.role, header.name, None, header.channel, header.recipient)
    return header


def has_control_text(header: Header) -> str | None:
    """The first special-token text inside a header field, if any (garbage the reference returns)."""
    fields = [header.name, header.recipient, header.channel]
    ct = header.content_type
    if ct is not None:
        fields.append(ct[len(CONSTRAIN_MARKER) :] if ct.startswith(CONSTRAIN_MARKER) else ct)
    for value in fields:
        if value and "<|" in value:
            for m in re.finditer(r"<\|[a-z_0-9]+\|>", value):
                return m.group()
    return None


# ---------------------------------------------------------------------------
# The tolerant reading
# ---------------------------------------------------------------------------


@dataclass
class _Segment:
    """A stretch of a header: a run of text tokens, or one marker token."""

    char_start: int
    text: str
    first: int  # index of its first token
    tokens: Sequence[int]
    _byte_starts: list[int] | None = None


@dataclass
class HeaderText:
    """A header's tokens decoded, with <|channel|> and <|constrain|> kept as marker text."""

    text: str
    first: int
    end: int
    has_special: bool
    token_bytes: Callable[[int], bytes]
    repairs: list[Repair] = field(default_factory=list)
    segments: list[_Segment] = field(default_factory=list)
    _starts: list[int] | None = None

    def token_after(self, char: int) -> int:
        """Index just past the token holding character ``char - 1``: where text that ends at
        ``char`` ends in tokens (a token such as ``'.\\n'`` may hold more than the text)."""
        return self.first if char <= 0 else min(self.token_at(char - 1) + 1, self.end)

    def markers(self) -> list[tuple[int, int]]:
        """Character ranges of the <|channel|> and <|constrain|> tokens."""
        return [(seg.char_start, seg.char_start + len(seg.text)) for seg in self.segments
                if len(seg.tokens) == 1 and seg.tokens[0] in (CHANNEL, CONSTRAIN)]

    def token_at(self, char: int) -> int:
        """Index of the token holding character ``char`` (``end`` past the text)."""
        if char >= len(self.text) or not self.segments:
            return self.end
        if self._starts is None:  # built once: a header may ask for thousands of positions
            self._starts = [seg.char_start for seg in self.segments]
        k = max(bisect_right(self._starts, char) - 1, 0)
        seg = self.segments[k]
        if len(seg.tokens) == 1:
            return seg.first
        if seg._byte_starts is None:  # worked out only when a repair needs it
            starts, pos = [], 0
            for t in seg.tokens:
                starts.append(pos)
                pos += len(self.token_bytes(t))
            seg._byte_starts = starts
        byte = len(seg.text[: char - seg.char_start].encode("utf-8", "surrogatepass"))
        return seg.first + max(bisect_right(seg._byte_starts, byte) - 1, 0)


def decode_header(
    tokens: Sequence[int],
    first: int,
    token_bytes: Callable[[int], bytes],
    decode_run: Callable[[Sequence[int]], bytes],
) -> HeaderText:
    """Decode header tokens, setting aside control tokens and marking bad bytes.

    Linear in the number of tokens: each run of text tokens is decoded at once.
    """
    parts: list[str] = []
    repairs: list[Repair] = []
    segments: list[_Segment] = []
    length = 0
    has_special = False
    i, n = 0, len(tokens)
    while i < n:
        tok = tokens[i]
        if 0 <= tok < STARTOFTEXT:
            j = i + 1
            while j < n and 0 <= tokens[j] < STARTOFTEXT:
                j += 1
            raw = decode_run(tokens[i:j])
            text = raw.decode("utf-8", "replace")
            if "\ufffd" in text and text.count("\ufffd") != raw.count("\ufffd".encode()):
                repairs.append(Repair("invalid_utf8", first + i, first + j,
                                      "header bytes that are not UTF-8 were replaced by U+FFFD"))
            segments.append(_Segment(length, text, first + i, tokens[i:j]))
            parts.append(text)
            length += len(text)
            i = j
            continue
        has_special = True
        if tok == CHANNEL or tok == CONSTRAIN:
            marker = SPECIAL_TOKEN_NAMES[tok]
            segments.append(_Segment(length, marker, first + i, tokens[i : i + 1]))
            parts.append(marker)
            length += len(marker)
        else:
            what = SPECIAL_TOKEN_NAMES.get(tok, f"invalid token id {tok}")
            repairs.append(Repair("control_token_in_header", first + i, first + i + 1,
                                  f"{what} removed from a header"))
        i += 1
    return HeaderText("".join(parts), first, first + n, has_special, token_bytes, repairs, segments)


@dataclass(slots=True)
class Word:
    start: int
    end: int
    text: str
    section: int
    n: int  # ordinal among all words of the header (plain words are not kept)
    used: bool = False


def is_content_type(word: str) -> bool:
    return word in _KNOWN_CONTENT_TYPES or bool(_MIME.match(word))


@functools.lru_cache(maxsize=256)
def _folded(tools: frozenset[str]) -> frozenset[str]:
    return frozenset(t.casefold() for t in tools)


def tool_match(name: str, tools: frozenset[str] | None) -> bool:
    """Whether ``name`` (with or without ``functions.``, in any case) is a declared tool."""
    if not tools:
        return False
    bare = name[len("functions.") :] if name.startswith("functions.") else name
    if bare in tools or name in tools:
        return True
    folded = _folded(tools)
    return bare.casefold() in folded or name.casefold() in folded


def named_nothing(recipient: str) -> bool:
    """A recipient that names nothing: empty, ``functions.`` alone, or holding markup."""
    bare = recipient[len("functions.") :] if recipient.startswith("functions.") else recipient
    return not bare or "<|" in recipient


def plausible_recipient(recipient: str, tools: frozenset[str] | None) -> bool:
    """A recipient that needs no repair: a declared function, a built-in tool, or anything
    when no tools were declared (but never a channel word, or a role glued to one)."""
    if named_nothing(recipient) or _RUST_WS_RE.search(recipient):
        return False
    if _HAS_CHANNEL_LETTERS.search(recipient) and (
            junk_channel_word(recipient) or recipient in KNOWN_CHANNELS or GLUED_CHANNEL.match(recipient)):
        return False
    if not tools or recipient == "python":
        return True
    if "." in recipient and not recipient.startswith("functions."):
        return True  # a built-in tool: browser.search, container.exec, ...
    return tool_match(recipient, tools)


_CHANNEL_NAMES = ("analysis", "commentary", "final")
FOLLOWERS = 8  # words kept after "to=" (tool names with spaces) and <|constrain|>


def header_words(text: str) -> tuple[list[Word], list[tuple[int, int, str]]]:
    """The words of a header that can be header fields, and its channel values.

    Returns (words, channels): channels are (start, end, value) per <|channel|>.
    Plain words (most of the text of a header that is really prose) are not
    kept: they are always left over, and ``leftover`` reads them from the text.
    Kept: the first two words, "to=" and <|constrain|> words and the words
    after them, words holding a channel name, content-type words, and the last
    plain word. Keeping a header of a million words as objects would be slow.
    """
    words: list[Word] = []
    channels: list[tuple[int, int, str]] = []
    pos = 0
    section = 0
    n = 0
    follow = 0
    last_plain: Word | None = None
    while True:
        idx = text.find(CHANNEL_MARKER, pos)
        chunk_end = idx if idx != -1 else len(text)
        for m in _WORD.finditer(text, pos, chunk_end):
            s = m.start()
            piece = m.group()
            pieces = [piece]
            if CONSTRAIN_MARKER in piece:
                # <|constrain|> always starts a word of its own.
                pieces = [(CONSTRAIN_MARKER + sub if k else sub) for k, sub in
                          enumerate(piece.split(CONSTRAIN_MARKER))]
            for sub in pieces:
                if not sub:
                    continue
                word = Word(s, s + len(sub), sub, section, n)
                marker = sub.startswith(("to=", CONSTRAIN_MARKER))
                if marker or follow or n < 2 or is_content_type(sub) \
                        or any(c in sub for c in _CHANNEL_NAMES):
                    words.append(word)
                    follow = FOLLOWERS if marker else max(follow - 1, 0)
                else:
                    last_plain = word
                n += 1
                s += len(sub)
        if idx == -1:
            break
        section += 1
        follow = 0
        after = idx + len(CHANNEL_MARKER)
        m2 = _CHANNEL_END.search(text, after)
        value_end = m2.start() if m2 else len(text)
        channels.append((idx, value_end, text[after:value_end]))
        pos = value_end
    if last_plain is not None and (not words or words[-1].n < last_plain.n):
        words.append(last_plain)
    return words, channels


def leftover_text(text: str, removed: list[tuple[int, int]]) -> tuple[str, int, int]:
    """The text with header fields cut out: one space where a field stood, ends trimmed.

    Returns (leftover, start, end): where the leftover begins and ends in ``text``.
    """
    kept: list[tuple[int, int]] = []
    pos = 0
    for a, b in sorted(removed):
        if a > pos:
            kept.append((pos, a))
        pos = max(pos, b)
    if pos < len(text):
        kept.append((pos, len(text)))
    pieces: list[str] = []
    start, end = 0, 0
    for a, b in kept:
        piece = text[a:b]
        stripped = piece.strip(" \t\n\x0c\r")
        if stripped:
            if not pieces:
                start = a + piece.index(stripped[0])
            end = a + len(piece.rstrip(" \t\n\x0c\r"))
            pieces.append(stripped)
    return " ".join(pieces), start, end


def junk_channel_word(word: str) -> bool:
    """A channel name wrapped in junk or repeated (``––commentary``, ``final?``), not a plain word."""
    return word not in KNOWN_CHANNELS and repair_channel(word) is not None


_MANGLED_CHANNEL = re.compile(r"(analysis|commentary|final)\1*")


def repair_channel(value: str) -> str | None:
    """The known channel a mangled channel name stands for (``––commentary``, ``final?final?``,
    ``Final.``), or None; a known name is itself."""
    if value in KNOWN_CHANNELS:
        return value
    m = _MANGLED_CHANNEL.fullmatch(re.sub(r"[^a-z]", "", value.lower()))
    return m.group(1) if m else None


def sound_header(header: Header, tools: frozenset[str] | None) -> bool:
    """Whether a header read by the reference's rules needs no repair: no control-token text
    in a field, a known or unmangled channel, a content type (not a channel name) after
    <|constrain|>, and a plausible recipient."""
    channel, ct = header.channel, header.content_type
    if ct is not None and ct.startswith(CONSTRAIN_MARKER) and repair_channel(ct[len(CONSTRAIN_MARKER):]):
        return False  # <|constrain|>final: a channel name is no content type
    return has_control_text(header) is None and ct != CONSTRAIN_MARKER \
        and (channel is None or channel in KNOWN_CHANNELS or repair_channel(channel) is None) \
        and (header.recipient is None or plausible_recipient(header.recipient, tools))


_STRIPPED_CALL = re.compile(r"\s*to=([^\s{\[]+)")
_STRIPPED_TYPE = re.compile(r"\s*(json|code)(?=[\s{\[]|$)")


def split_stripped_markup(
    text: str,
) -> list[tuple[str, str | None, str | None, str, int, int]] | None:
    """Text whose special tokens an engine stripped (``analysisUser says...assistantfinalHi``).

    Returns (channel, recipient, content type, body, start, end) pieces, or None
    when the text does not look like stripped Harmony. A stripped tool call reads
    ``commentary to=functions.f json{"a": 1}``.
    """
    m = _STRIPPED.match(text)
    if not m:
        return None
    pieces: list[tuple[str, str | None, str | None, str, int, int]] = []
    starts = [m.start(1)] + [x.end() for x in _STRIPPED_SPLIT.finditer(text)]
    cuts = [x.start() for x in _STRIPPED_SPLIT.finditer(text)] + [len(text)]
    for start, end in zip(starts, cuts, strict=True):
        seg = text[start:end]
        channel = next(c for c in KNOWN_CHANNELS if seg.startswith(c))
        rest = seg[len(channel) :]
        recipient = content_type = None
        call = _STRIPPED_CALL.match(rest)
        if call:
            recipient, rest = call.group(1), rest[call.end() :]
            ctype = _STRIPPED_TYPE.match(rest)
            if ctype:
                content_type, rest = ctype.group(1), rest[ctype.end() :]
        pieces.append((channel, recipient, content_type, rest.strip(), start, end))
    return pieces
