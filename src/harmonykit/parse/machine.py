"""The parser: one sans-IO state machine, tokens in, messages and repairs out.

Batch parsing and streaming are the same machine: ``feed`` takes one token,
``feed_text`` a run of ordinary text tokens (the batch fast path), ``end``
marks the end of the stream. Feeding tokens one by one or in runs gives the
same messages, spans, skipped ranges and repairs.

The transitions are data (``STRICT`` and ``TOLERANT`` below): for each state and
kind of token, the name of the action to take. Strict mode is the reference's
parser (and raises where the reference returns garbage); tolerant mode never
raises and accounts for every token: each one ends up in a message's span or in
a skipped range with a repair that says why.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Final

from typing_extensions import Self

from ..errors import HarmonyError
from ..model import Message, Role, StreamState, text_author, text_message
from ..tokens import (
    CALL,
    CHANNEL,
    CHANNEL_MARKER,
    CONSTRAIN,
    END,
    MESSAGE,
    N_VOCAB,
    RETURN,
    SPECIAL_TOKEN_NAMES,
    START,
    STARTOFTEXT,
    STOP_NAMES,
    StopName,
    token_id,
)
from .header import (
    Header,
    HeaderError,
    HeaderText,
    decode_header,
    fix_lone_constrain,
    has_control_text,
    parse_reference,
    rust_debug,
    sound_header,
    split_stripped_markup,
)
from .result import ParseResult, Repair
from .rules import Resolution, resolve

REPLACEMENT: Final = "\ufffd"
_WORDISH: Final = re.compile(r"\w\w|[^\W\d_]")  # two word characters, or one letter
# The end of a body read from a long header that may still be header fields, should
# <|message|> follow: "... Let's open to=browser.open code".
_MAYBE_FIELDS: Final = re.compile(r"\s*\bto(?:=\S*(?:[ \t]+\S+){0,2}[ \t]*)?$")


class Kind(Enum):
    """What a token is, as far as the grammar cares."""

    __hash__ = object.__hash__  # members are singletons; Enum's own hash runs Python per lookup

    TEXT = "text"
    START = "start"
    CHANNEL = "channel"
    CONSTRAIN = "constrain"
    MESSAGE = "message"
    STOP = "stop"
    SPECIAL = "special"  # any other special token (reserved, <|endoftext|>, ...)
    INVALID = "invalid"  # not an id of the vocabulary


HeaderCache = dict[tuple[tuple[int, ...], Role | None, frozenset[str] | None, bool], Header]
HEADER_CACHE_LIMIT: Final = 4096  # headers kept per encoding (then read each time)
#: Tolerant mode: a header this many tokens long with no ``<|message|>`` can no longer become
#: one (a role, a channel, a recipient and a content type take a few tokens each), and once it
#: holds words that no header field takes, those words are a body and stream as one.
HEADER_LIMIT: Final = 64

_SPECIAL_KINDS: Final = {
    START: Kind.START,
    CHANNEL: Kind.CHANNEL,
    CONSTRAIN: Kind.CONSTRAIN,
    MESSAGE: Kind.MESSAGE,
    END: Kind.STOP,
    RETURN: Kind.STOP,
    CALL: Kind.STOP,
}


def kind_of(token: int) -> Kind:
    if 0 <= token < STARTOFTEXT:
        return Kind.TEXT
    if STARTOFTEXT <= token < N_VOCAB:
        return _SPECIAL_KINDS.get(token, Kind.SPECIAL)
    return Kind.INVALID


S = StreamState
K = Kind

# state -> kind -> action. "push": the token joins the header being read.
STRICT: Final[dict[StreamState, dict[Kind, str]]] = {
    S.EXPECT_START: {k: "error_expect_start" for k in Kind} | {K.START: "open_header"},
    S.HEADER: {k: "push" for k in Kind} | {K.MESSAGE: "close_header"},
    S.CONTENT: {k: "body_text" for k in Kind} | {K.STOP: "close_body", K.INVALID: "body_invalid"},
}
TOLERANT: Final[dict[StreamState, dict[Kind, str]]] = {
    S.EXPECT_START: {
        K.TEXT: "open_stray",
        K.SPECIAL: "open_stray",
        K.INVALID: "open_stray",
        K.CONSTRAIN: "open_stray",
        K.START: "open_header",
        K.CHANNEL: "open_implicit",
        K.MESSAGE: "open_implicit",
        K.STOP: "stray_stop",
    },
    S.HEADER: {k: "grow_header" for k in Kind}
    | {K.MESSAGE: "close_header", K.STOP: "headerless", K.START: "restart_header"},
    S.CONTENT: {
        K.TEXT: "body_text",
        K.STOP: "close_body",
        K.START: "header_in_body",
        K.CHANNEL: "header_in_body",
        K.MESSAGE: "body_message",
        K.CONSTRAIN: "body_control",
        K.SPECIAL: "body_control",
        K.INVALID: "body_invalid",
    },
}


@dataclass(frozen=True)
class MachineIO:
    """What the parser needs of a vocabulary (``HarmonyEncoding.machine_io``): an ordinary
    token's bytes; a map from ids to their text when the bytes are UTF-8 on their own ("" when
    not), filled as tokens are met; a run's bytes; text to ordinary tokens; and the well-formed
    headers read so far. The machine does no I/O of its own: this is all it reads."""

    token_bytes: Callable[[int], bytes]
    str_cache: dict[int, str]
    decode_run: Callable[[Sequence[int]], bytes]
    encode_text: Callable[[str], list[int]]
    header_cache: HeaderCache


def check_role(role: object) -> Role | None:
    """A role argument: a ``Role``, its value (``"assistant"``), or None."""
    if role is None or isinstance(role, Role):
        return role
    if isinstance(role, str) and role in Role._value2member_map_:
        return Role(role)
    raise TypeError(f"role must be a Role (or None), got {type(role).__name__} {role!r}")


def check_tools(tools: object) -> frozenset[str] | None:
    """A tools argument: declared function names, or None."""
    if tools is None:
        return None
    names = list(tools) if isinstance(tools, Iterable) and not isinstance(tools, str) else None
    if names is None or not all(isinstance(t, str) for t in names):
        raise TypeError(f"tools must be a list of function names (str), got {tools!r:.80}")
    return frozenset(names)


class Machine:
    """The Harmony parser's state machine (see the module docstring), over a vocabulary's
    ``MachineIO``. ``role`` is the role whose header was already rendered (the prompt ended in
    ``<|start|>assistant``), or None when output starts with ``<|start|>``.

    >>> from harmonykit import load_harmony_encoding, Role
    >>> enc = load_harmony_encoding("HarmonyGptOss")
    >>> m = Machine(enc.machine_io, Role.ASSISTANT, strict=False)
    >>> m.feed_text(enc.encode("Hi"))  # a header with no <|message|> yet
    >>> [msg.content[0].text for msg in m.end().result().messages]
    ['Hi']
    """

    def __init__(
        self,
        io: MachineIO,
        role: Role | None,
        *,
        strict: bool = True,
        tools: frozenset[str] | None = None,
    ) -> None:
        self._token_bytes = io.token_bytes
        self._str_cache = io.str_cache
        self._decode_run = io.decode_run
        self._encode_text = io.encode_text
        self._header_cache = io.header_cache
        self.strict = strict
        self.tools = tools
        self._table = _STRICT_ACTIONS if strict else _TOLERANT_ACTIONS
        self._default_role = role or Role.ASSISTANT
        self.next_role: Role | None = role
        self.state: StreamState = S.HEADER if role is not None else S.EXPECT_START
        self._tokens: list[int] = []
        self._messages: list[Message] = []
        self.spans: list[tuple[int, int]] = []
        self.skipped: list[tuple[int, int]] = []
        self.repairs: list[Repair] = []
        self.stop: StopName | None = None
        self.ended = False
        self._plain_body = False
        self.open_at_end = False
        self.last_content_delta: str | None = None
        # The message being read.
        self._cursor = 0  # first token not yet in a span or skipped range
        self.header_tokens: list[int] = []
        self._weak = False  # the header is stray text, not a message begun with <|start|>
        self._bound_at = HEADER_LIMIT  # header length at which to try reading it as a body
        # A body read from a long header ("loose"): <|message|> may still come and make it a
        # header after all; until then the text that could be header fields is held (``_tail``).
        self._loose = False
        self._loose_role: Role | None = None
        self._loose_repairs = 0  # len(repairs) before the header was read as a body
        self._tail = ""
        self._tail_fields = False  # the tail holds more than white space
        # The body being read: its header, its text delta by delta, bytes not yet
        # valid UTF-8, the reference's undecodable tail (strict), the joined text.
        self.header: Header | None = None
        self.parts: list[str] = []
        self.pending = bytearray()
        self._pending_at = 0  # the token the pending bytes began in
        self._poisoned: list[int] = []
        self._joined = ""
        self._joined_parts = 0

    # -- feeding ---------------------------------------------------------

    def feed(self, token: int) -> Self:
        """Consume one token."""
        # The hot path: an ordinary token inside a body that decodes on its own.
        # (`_plain_body`: in a body, with no pending bytes and no undecodable token.)
        if self._plain_body and type(token) is int and 0 <= token < 199998:
            s = self._str_cache.get(token)
            if s is None:
                s = self._fill_str(token)
            if s:
                self._tokens.append(token)
                self.parts.append(s)
                self.last_content_delta = s
                return self
        index = len(self._tokens)
        if type(token) is not int:
            token = token_id(token, f"token {index}")
        self._tokens.append(token)
        self._table[self.state][kind_of(token)](self, token, index)
        self._plain_body = (self.state is S.CONTENT and not self.pending and not self._poisoned
                            and not self._loose)
        return self

    def feed_text(self, run: Sequence[int]) -> None:
        """Consume a run of ordinary text tokens at once (same result as one by one)."""
        if not run:
            return
        self._feed_text(run)
        self._plain_body = (self.state is S.CONTENT and not self.pending and not self._poisoned
                            and not self._loose)

    def _feed_text(self, run: Sequence[int]) -> None:
        if self.state is S.CONTENT and not self._poisoned:
            data = self._decode_run(run)
            try:
                text = (bytes(self.pending) + data).decode("utf-8")
            except UnicodeDecodeError:
                # Bad or split UTF-8: token by token, so repairs point at the right token.
                for token in run:
                    self.feed(token)
                return
            self._tokens += run
            self.pending.clear()
            self._add_text(text)
            return
        if self.state is S.CONTENT:
            self._tokens += run
            self._poisoned += run
            self.last_content_delta = None
            return
        if self.state is S.HEADER:
            room = self._bound_at - len(self.header_tokens)
            if self.strict or len(run) < room:
                self._tokens += run
                self.header_tokens += run
                return
            # The bound falls inside the run: decide where one-by-one feeding would.
            self._tokens += run[:room]
            self.header_tokens += run[:room]
            self._header_past_bound()
            self._feed_text(run[room:])
            return
        # Between messages: the first token decides, the rest follows as header text.
        self.feed(run[0])
        self._feed_text(run[1:])

    def end(self) -> Self:
        """The end of the stream."""
        if self.ended:
            return self
        index = len(self._tokens)
        if self.state is S.HEADER:
            if self.strict:
                raise HarmonyError(
                    "Unexpected EOS while waiting for message header to complete",
                    token_index=index,
                )
            self.open_at_end = not self._weak and (bool(self.header_tokens) or self._cursor < index)
            self._close_header_without_body(index, terminated=False)
        elif self.state is S.CONTENT:
            # Stray text after a message, read as a body past the bound, leaves the turn complete
            # as it would have as stray text.
            stop, self.open_at_end = self.stop, not self._weak
            self._finish_body(index, None)
            if self._weak:
                self.stop = stop
        if self.open_at_end:
            self.stop = None
        self.ended = True
        self._plain_body = False
        return self

    # -- between messages --------------------------------------------------

    def _error_expect_start(self, token: int, index: int) -> None:
        raise HarmonyError(
            f"Unexpected token {token} while expecting start token {START}", token_index=index
        )

    def _begin_header(self, index: int, tokens: list[int], *, weak: bool, implied: bool) -> None:
        # ``implied``: no <|start|> + role came first, so the expected role stands in.
        self._skip_to(index)
        self.state = S.HEADER
        self.header_tokens = tokens
        self._weak = weak
        self._bound_at = HEADER_LIMIT
        if implied:
            self.next_role = self.next_role or self._default_role

    def _open_header(self, token: int, index: int) -> None:
        self._begin_header(index, [], weak=False, implied=False)

    def _open_implicit(self, token: int, index: int) -> None:
        # <|channel|> or <|message|> with no <|start|> before it.
        self._begin_header(index, [] if token == MESSAGE else [token], weak=False, implied=True)
        self.repairs.append(Repair("missing_start", index, index, "message began without <|start|>"))
        if token == MESSAGE:
            self._close_header(token, index)

    def _open_stray(self, token: int, index: int) -> None:
        # Text after a message: kept as a header until something decides what it is.
        self._begin_header(index, [token], weak=True, implied=True)

    def _stray_stop(self, token: int, index: int) -> None:
        self._skip_to(index)
        self._skip(index + 1, "stray_stop_token", f"{SPECIAL_TOKEN_NAMES[token]} outside a message")
        self.stop = STOP_NAMES[token]

    # -- header ------------------------------------------------------------

    def _push(self, token: int, index: int) -> None:
        self.header_tokens.append(token)

    def _grow_header(self, token: int, index: int) -> None:
        self.header_tokens.append(token)
        if len(self.header_tokens) >= self._bound_at:
            self._header_past_bound()

    def _header_past_bound(self) -> None:
        """A header of ``HEADER_LIMIT`` tokens or more: when its words are not all header
        fields, the rest is the body, open from here (it streams instead of waiting for
        the end). Otherwise it is read again once it has grown by a quarter."""
        tokens = self.header_tokens
        self._bound_at = len(tokens) + max(HEADER_LIMIT, len(tokens) // 4)
        end = len(self._tokens)
        start = end - len(tokens)
        ht = decode_header(tokens, start, self._token_bytes, self._decode_run)
        pieces = None if ht.has_special else split_stripped_markup(ht.text)
        if pieces:
            if pieces[-1][0] != "final":
                return  # stripped markup is split by what is still to come; the answer comes last
            role = self.next_role or self._default_role
            for channel, recipient, content_type, body, _s, e in pieces[:-1]:
                self._emit(Header(role, None, recipient, channel, content_type), body,
                           max(ht.token_after(e), self._cursor + 1))
            channel, recipient, content_type, body, _s, _e = pieces[-1]
            self.repairs += ht.repairs
            self.repairs.append(Repair("stripped_markup", start, end,
                                       f"{len(pieces)} messages read from text without special tokens"))
            self._open_body(Header(role, None, recipient, channel, content_type), body)
            return
        res = resolve(ht, self.next_role, self._default_role, self.tools, with_body=False)
        body = res.leftover.lstrip()
        if not _WORDISH.search(body):
            return
        loose_repairs, hint = len(self.repairs), self.next_role
        self.repairs += ht.repairs + res.repairs
        if self._weak:
            self.repairs.append(Repair("missing_start", start, start, "message began without <|start|>"))
        self.repairs.append(Repair("missing_message_token", start, end,
                                   f"{len(tokens)} header tokens without <|message|>; "
                                   "the rest became the body"))
        self._open_body(res.header, "")
        self._loose, self._loose_role, self._loose_repairs = True, hint, loose_repairs
        self._add_text(body)

    def _open_body(self, header: Header, text: str) -> None:
        self.next_role = None
        self.header_tokens = []
        self._reset_body(header)
        self.state = S.CONTENT
        self._add_text(text)

    def _restart_header(self, token: int, index: int) -> None:
        if not self.header_tokens:
            self.repairs.append(Repair("doubled_start", index, index + 1, "<|start|> repeated"))
            return
        self._close_header_without_body(index, terminated=False)
        self._open_header(token, index)

    def _close_header(self, token: int, index: int) -> None:
        start = index - len(self.header_tokens)
        # A rollout's headers are a handful, repeated: one read well is not read again.
        key = (tuple(self.header_tokens), self.next_role, self.tools, self.strict)
        header = self._header_cache.get(key)
        if header is None:
            if self.strict:
                header, sound = self._strict_header(start, index), True
            else:
                header, sound = self._tolerant_header(start, index)
            if sound and len(self._header_cache) < HEADER_CACHE_LIMIT:
                self._header_cache[key] = header
        self.next_role = None
        self._weak = False
        self._reset_body(header)
        self.state = S.CONTENT

    def _strict_header(self, start: int, index: int) -> Header:
        try:
            text = self._decode_strict(self.header_tokens)
        except UnicodeDecodeError:
            raise HarmonyError("could not decode header", token_index=start) from None
        try:
            header, remaining = parse_reference(text, self.next_role, True)
        except HeaderError as e:
            raise HarmonyError(str(e), token_index=index) from None
        header = fix_lone_constrain(header)
        if remaining is not None:
            raise HarmonyError(
                f"unexpected tokens remaining in message header: Some({rust_debug(remaining)})",
                token_index=index,
            )
        bad = has_control_text(header)
        if bad is not None:
            hits = [start + k for k, t in enumerate(self.header_tokens) if SPECIAL_TOKEN_NAMES.get(t) == bad]
            if bad == CHANNEL_MARKER:
                hits = hits[1:]  # the first <|channel|> is the header's own
            where = hits[0] if hits else index
            raise HarmonyError(
                f"control token {bad} inside the message header; a header may hold only "
                "role, recipient, channel and content type",
                token_index=where,
            )
        return header

    def _decode_strict(self, tokens: Sequence[int]) -> str:
        out = bytearray()
        for t in tokens:
            if 0 <= t < STARTOFTEXT:
                out += self._token_bytes(t)
            elif STARTOFTEXT <= t < N_VOCAB:
                out += SPECIAL_TOKEN_NAMES[t].encode()
            else:
                raise UnicodeDecodeError("utf-8", b"", 0, 0, "invalid token")
        return out.decode("utf-8")

    def _tolerant_header(self, start: int, index: int) -> tuple[Header, bool]:
        """The header, and whether it was read as the reference reads it, with no repair."""
        if not self._weak:
            # Well-formed headers (nearly all) are read by the reference's rules from the plain
            # decode; the tolerant reading's bookkeeping is built only when that fails.
            try:
                text = self._decode_strict(self.header_tokens)
                header, remaining = parse_reference(text, self.next_role, True)
            except (UnicodeDecodeError, HeaderError):
                pass
            else:
                header = fix_lone_constrain(header)
                if remaining is None and sound_header(header, self.tools):
                    return header, True
        ht = decode_header(self.header_tokens, start, self._token_bytes, self._decode_run)
        if self._weak:
            self.repairs.append(Repair("missing_start", start, start, "message began without <|start|>"))
        res = resolve(ht, self.next_role, self._default_role, self.tools, with_body=True)
        self.repairs += ht.repairs
        prose, split = _prose_of(ht, res, start, index)
        if split is not None:
            # Free text before the recipient: a message of its own, before this one.
            self._emit(Header(res.header.role, res.header.name, None, res.header.channel, None),
                       prose, split)
            self.repairs.append(Repair("prose_in_header", start, split,
                                       "text in the header became a message of its own"))
        elif prose and len(prose.split()) >= 3:
            res.repairs.append(Repair("prose_in_header", start, index,
                                      f"text in the header set aside: {prose!r}"))
        elif prose:
            res.repairs.append(Repair("unknown_header_word", ht.token_at(res.leftover_start),
                                      max(ht.token_at(res.leftover_end - 1) + 1, start + 1),
                                      f"header words {prose!r} set aside"))
        self.repairs += res.repairs
        return res.header, False

    def _headerless(self, token: int, index: int) -> None:
        # A stop token ended a header that never reached <|message|>.
        self._close_header_without_body(index + 1, terminated=True, stop_token=token)
        self.stop = STOP_NAMES[token]

    def _close_header_without_body(
        self, end: int, *, terminated: bool, stop_token: int | None = None
    ) -> None:
        tokens = self.header_tokens
        body_end = end - 1 if terminated else end
        start = body_end - len(tokens)
        role_hint = self.next_role
        self.next_role = None
        self.state = S.EXPECT_START
        self.header_tokens = []
        if not tokens:
            if terminated:
                self._skip(end, "stray_stop_token", "stop token with no message before it")
            else:
                self._skip(end, "empty_message", "<|start|> with no header after it")
            return
        if self._weak and not terminated:
            self._skip(end, "stray_text", "text outside any message")
            return
        ht = decode_header(tokens, start, self._token_bytes, self._decode_run)
        pieces = None if ht.has_special else split_stripped_markup(ht.text)
        if pieces:
            self.repairs += ht.repairs
            role = role_hint or self._default_role
            for k, (channel, recipient, content_type, body, _s, e) in enumerate(pieces):
                cut = end if k == len(pieces) - 1 else max(ht.token_after(e), self._cursor + 1)
                self._emit(Header(role, None, recipient, channel, content_type), body, cut)
            self.repairs.append(Repair("stripped_markup", start, end,
                                       f"{len(pieces)} messages read from text without special tokens"))
            return
        res = resolve(ht, role_hint, self._default_role, self.tools, with_body=False)
        self.repairs += ht.repairs + res.repairs
        body = res.leftover.strip()
        if not body or (res.header.channel != "final" and not _WORDISH.search(body)):
            # Nothing, or noise such as "??" or "2?" (an answer of "4" on final is kept).
            self._skip(end, "empty_message", f"a header with no body{f': {body!r}' if body else ''}")
            return
        if self._weak:
            self.repairs.append(Repair("missing_start", start, start, "message began without <|start|>"))
        self.repairs.append(Repair("missing_message_token", start, end,
                                   "header without <|message|>; its text became the body"))
        self._emit(res.header, body, end)

    # -- body --------------------------------------------------------------

    def _fill_str(self, token: int) -> str:
        try:
            s = self._token_bytes(token).decode("utf-8")
        except UnicodeDecodeError:
            s = ""
        self._str_cache[token] = s
        return s

    def _body_text(self, token: int, index: int) -> None:
        if self._poisoned:
            self._poisoned.append(token)
            self.last_content_delta = None
            return
        if 0 <= token < STARTOFTEXT:
            data = self._token_bytes(token)
        else:  # strict mode: a special token's text is body text, as in the reference
            data = SPECIAL_TOKEN_NAMES[token].encode()
        self._body_bytes(data, index)

    def _body_bytes(self, data: bytes, index: int) -> None:
        # As the reference: decode what is pending; at most one bad sequence per
        # token becomes U+FFFD, and bytes after it wait for the next token.
        held = len(self.pending)  # bytes of earlier tokens, from token _pending_at on
        if not held:
            self._pending_at = index
        self.pending += data
        try:
            text = self.pending.decode("utf-8")
            self.pending.clear()
        except UnicodeDecodeError as e:
            text = self.pending[: e.start].decode("utf-8")
            rest = e.start  # where the bytes still pending begin
            if e.reason == "unexpected end of data" and e.end == len(self.pending):
                del self.pending[: e.start]  # a character still arriving
            else:
                rest = e.end
                text += REPLACEMENT
                del self.pending[: e.end]
                if not self.strict:  # blamed on the tokens that hold the broken sequence
                    self.repairs.append(Repair("invalid_utf8", self._pending_at if e.start < held else index,
                                               index + 1 if e.end > held else index,
                                               "bytes that are not UTF-8 became U+FFFD"))
            if self.pending and rest >= held:
                self._pending_at = index
        self._add_text(text)

    def _add_text(self, text: str) -> None:
        if self._loose:
            text = self._hold_back(text)
        if text:
            self.parts.append(text)
            self.last_content_delta = text
        else:
            self.last_content_delta = None

    def _hold_back(self, text: str) -> str:
        """Of a loose body's new text, what may be shown now; the rest waits in ``_tail``.

        A loose body may still become a header (``_body_message``), and then its text before
        the fields is a message of its own, stripped: so both what may be header fields and
        trailing white space are held until later text (or the body's end) decides. What is
        shown is never taken back. The tail is searched apart from the new text when it is
        only white space, so a long run of it is not searched again and again."""
        tail = self._tail
        if self._tail_fields:  # fields held: search them with what follows
            text = tail + text
            m = _MAYBE_FIELDS.search(text)
            cut = m.start() if m else len(text.rstrip())
        elif text.isspace():
            self._tail = ""  # the only reference left is ``tail``: CPython grows it in place
            tail += text
            self._tail = tail
            return ""
        else:
            m = _MAYBE_FIELDS.search(text)
            if m and m.start() == 0:  # "to=..." right after held white space: all of it held
                cut = 0
            else:
                cut = len(tail) + (m.start() if m else len(text.rstrip()))
            text = tail + text
        self._tail = text[cut:]
        self._tail_fields = not self._tail.isspace() and bool(self._tail)
        return text[:cut]

    def _body_invalid(self, token: int, index: int) -> None:
        if self.strict:
            # The reference keeps an undecodable token and everything after it
            # pending, and ends the message with one U+FFFD.
            self._poisoned.append(token)
            self.last_content_delta = None
            return
        self.repairs.append(Repair("invalid_token", index, index + 1,
                                   f"token id {token} is not in the vocabulary; U+FFFD"))
        self._body_bytes(REPLACEMENT.encode(), index)

    def _body_control(self, token: int, index: int) -> None:
        self.repairs.append(Repair("control_token_in_body", index, index + 1,
                                   f"{SPECIAL_TOKEN_NAMES[token]} removed from a body"))
        self.last_content_delta = None

    def _body_message(self, token: int, index: int) -> None:
        if not (self._loose and "to=" in self._tail and self._splits_as_shown(index)):
            self._body_control(token, index)
            return
        # The long header did reach <|message|> after a recipient: read it as a header after
        # all, as if it had never been a body. What was shown of it is the message of its own
        # that its text before the fields becomes.
        del self.repairs[self._loose_repairs :]
        self.state = S.HEADER
        self.header_tokens = self._tokens[self._cursor : index]
        self.next_role = self._loose_role
        self.last_content_delta = None
        self._close_header(token, index)

    def _splits_as_shown(self, index: int) -> bool:
        start = self._cursor
        ht = decode_header(self._tokens[start:index], start, self._token_bytes, self._decode_run)
        res = resolve(ht, self._loose_role, self._default_role, self.tools, with_body=True)
        prose, split = _prose_of(ht, res, start, index)
        return split is not None and prose == self.content.strip()

    def _header_in_body(self, token: int, index: int) -> None:
        if self.parts or self.pending:
            self.repairs.append(Repair("header_inside_body", index, index,
                                       f"{SPECIAL_TOKEN_NAMES[token]} began a message inside a body"))
            self._finish_body(index, None)
        else:
            self.state = S.EXPECT_START
            self._reset_body(None)
            self._skip(index, "empty_message", f"{SPECIAL_TOKEN_NAMES[token]} followed <|message|>")
        if token == START:
            self._open_header(token, index)
        else:
            self._open_implicit(token, index)

    def _close_body(self, token: int, index: int) -> None:
        header = self.header
        assert header is not None
        if not self.strict and header.role is Role.ASSISTANT:
            if token == CALL and header.recipient is None:
                self.repairs.append(Repair("wrong_stop_token", index, index + 1,
                                           "<|call|> ended a message with no recipient"))
            elif token == RETURN and header.recipient is not None:
                self.repairs.append(Repair("wrong_stop_token", index, index + 1,
                                           "<|return|> ended a tool call; read as <|call|>"))
        self._finish_body(index + 1, token)

    def _finish_body(self, end: int, stop_token: int | None) -> None:
        header = self.header
        assert header is not None
        if self._tail:
            self.parts.append(self._tail)
        text = self.content
        if self._poisoned:
            text += REPLACEMENT
        if self.pending:
            tail = bytes(self.pending).decode("utf-8", "replace")
            if not self.strict and tail.count(REPLACEMENT) > self.pending.count(REPLACEMENT.encode()):
                # the tokens of the unfinished character, not the stop token after them
                self.repairs.append(Repair("invalid_utf8", self._pending_at, end - (stop_token is not None),
                                           "the body ended inside a UTF-8 character"))
            text += tail
        self._emit(header, text, end)
        self.stop = STOP_NAMES[stop_token] if stop_token is not None else None
        self.state = S.EXPECT_START
        self._reset_body(None)
        self.last_content_delta = None

    def _reset_body(self, header: Header | None) -> None:
        self.header = header
        self.parts = []
        self.pending = bytearray()
        self._poisoned = []
        self._joined, self._joined_parts = "", 0
        self._loose, self._tail, self._tail_fields = False, "", False

    def content_tokens(self) -> list[int]:
        """The body re-encoded delta by delta (what the reference's state shows)."""
        out: list[int] = []
        for part in self.parts:
            out += self._encode_text(part)
        return out

    @property
    def content(self) -> str:
        """The body text read so far; joins only what arrived since the last call."""
        parts = self.parts
        if self._joined_parts != len(parts):
            joined = self._joined
            self._joined = ""  # lets CPython grow the string in place
            joined += "".join(parts[self._joined_parts :])
            self._joined, self._joined_parts = joined, len(parts)
        return self._joined

    @property
    def open_length(self) -> int:
        """Tokens of the message being read so far (header and body); 0 between messages."""
        return len(self._tokens) - self._cursor if self.state is not S.EXPECT_START else 0

    # -- bookkeeping -----------------------------------------------------------

    def _emit(self, header: Header, text: str, end: int) -> None:
        message = text_message(text_author(header.role, header.name), text, header.channel,
                               header.recipient, header.content_type)
        self._messages.append(message)
        self.spans.append((self._cursor, end))
        self._cursor = end

    def _skip(self, end: int, kind: str, detail: str) -> None:
        if end > self._cursor:
            self.skipped.append((self._cursor, end))
            self.repairs.append(Repair(kind, self._cursor, end, detail))
            self._cursor = end

    def _skip_to(self, index: int) -> None:
        if index > self._cursor:
            self._skip(index, "stray_text", "tokens outside any message")

    # -- results ---------------------------------------------------------------

    @property
    def parsed(self) -> list[Message]:
        """The messages parsed so far: the machine's own list, not a copy (read it, never change
        it), for callers that look at it after every token."""
        return self._messages

    def tokens_in(self, start: int, end: int) -> list[int]:
        """The tokens fed from index ``start`` up to ``end`` (a span's, or a skipped range's)."""
        return self._tokens[start:end]

    def result(self) -> ParseResult:
        """The parse so far (after ``end``, the final one)."""
        return ParseResult(
            messages=list(self._messages),
            spans=list(self.spans),
            skipped=list(self.skipped),
            repairs=sorted(self.repairs, key=lambda r: (r.start, r.end)),
            stop=self.stop,
            complete=not self.open_at_end,
        )


_Action = Callable[[Machine, int, int], None]


def _prose_of(ht: HeaderText, res: Resolution, start: int, index: int) -> tuple[str, int | None]:
    """A header's free text, and the token at which it becomes a message of its own: when it
    is a few words before the recipient and content type (None: it is set aside)."""
    prose = res.leftover.strip()
    if prose and len(prose.split()) >= 3:
        split = ht.token_after(res.leftover_end)
        if res.leftover_end <= res.fields_start and start < split < index:
            return prose, split
    return prose, None


def _compile(table: dict[StreamState, dict[Kind, str]]) -> dict[StreamState, dict[Kind, _Action]]:
    """A table of action names as the methods they name (looked up once, not per token)."""
    return {state: {kind: getattr(Machine, "_" + action) for kind, action in row.items()}
            for state, row in table.items()}


_STRICT_ACTIONS: Final = _compile(STRICT)
_TOLERANT_ACTIONS: Final = _compile(TOLERANT)
