"""One assistant turn, from output tokens to what an OpenAI client sees.

The same ``Turn`` feeds streaming (``ChatCompletionStream``, ``ResponsesStream``)
and the one-shot functions, which run it over all tokens and fold its events:
so the concatenated stream is, by construction, the non-streaming result.

Events (``Event``) are ``open`` / ``text`` of kind ``reasoning``, ``content`` or
``call`` (a call opens with its name and id in ``Turn.calls[key]``), and
``builtin`` (``Turn.builtin_calls[key]``). Rules (see docs/openai.md):

- ``analysis`` is reasoning; ``final`` and recipient-less ``commentary``
  (a preamble) are content;
- a recipient is a tool call only when it names a declared function (with or
  without ``functions.``, in the rendered or the declared spelling), or is
  ``functions.NAME`` while the request declared tools. Nothing else ever
  becomes a call: built-in recipients (``browser.*``, ``python``,
  ``container.*``) are built-in calls; ``functions.NAME`` with no tools
  declared, and bare names that are no tool, are notes, the message shown by
  its channel where it has one that a client reads;
- call arguments stream as they are generated; when the body starts with a
  JSON value that parses, what trails it is cut (a note); any other body
  passes verbatim; a call cut off by ``max_tokens`` is returned with what it
  has, marked incomplete;
- text without a channel (at the start, or after ``<|end|>`` at the end) is
  held for its first ``HEADER_LIMIT`` tokens: when it ends sooner, it is the
  answer when the turn has no ``final`` message, reasoning otherwise; past
  that it streams, as reasoning when a ``final`` came before it, else as the
  answer (the parser reads a header that long with no ``<|message|>`` as a body
  for the same reason: the answer of a model that left out its header must not
  wait for the end);
- everything after the first call is the engine running past ``<|call|>``:
  set aside, with a note.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, ClassVar, NamedTuple

from ..encoding import HarmonyEncoding
from ..model import Message, Role, StreamState, message_text
from ..parse.header import Header, named_nothing
from ..parse.machine import HEADER_LIMIT
from ..parse.stream import StreamableParser
from ..tokens import STOP_TOKEN_SET, as_token_ids
from .errors import StreamClosed
from .hosted import McpNamespace, builtin_recipient, hosted_tools, mcp_recipient
from .names import FUNCTIONS, ToolNames, declared_names

_BUILTIN_PREFIXES = ("browser.", "container.", "functions_builtin.")
#: The finish reasons an engine may report (OpenAI's own).
FINISH_REASONS = ("stop", "length", "tool_calls", "content_filter", "function_call")

#: Every note kind the mapping reports in the ``harmony`` field, with what it means.
NOTE_KINDS: dict[str, str] = {
    "after_tool_call": "output after the first tool call (the engine ran past <|call|>) was set aside",
    "not_assistant": "a message of another role in the assistant's output was set aside",
    "cut_off_tool_call": "a tool call cut off by max_tokens; returned with its partial arguments",
    "text_after_arguments": "text after the arguments' JSON value was cut from them",
    "empty_arguments": "a tool call with an empty body",
    "headerless_text": "text without a channel, shown as the answer or as reasoning",
    "undeclared_tool": "a call to functions.NAME for a NAME the request did not declare",
    "recipient_ignored": "a recipient that is no tool; the message was shown by its channel",
    "unknown_recipient": "a message to a recipient that is no tool, with no channel to show it by",
    "container_rebuilt": "a python container held elsewhere was rebuilt by running its earlier cells again",
    "browser_rebuilt": "a chain's browser pages held elsewhere were rebuilt by running its calls again",
    "ignored_field": "(the gateway) a request field it does not know, ignored (clients send fields "
                     "before SDKs type them)",
}


class Event(NamedTuple):
    """One step of what a client sees: ``op`` is ``open``, ``text`` or ``builtin``."""

    op: str
    kind: str
    key: int
    text: str = ""


@dataclass(frozen=True)
class Note:
    """Something the mapping set aside or moved; ``text`` keeps what it concerned."""

    kind: str
    detail: str
    text: str = ""

    def to_dict(self) -> dict[str, str]:
        return {"kind": self.kind, "detail": self.detail, "text": self.text}


def new_id(prefix: str) -> str:
    """An id as OpenAI spells its kind: ``chatcmpl-...``, ``call_...``, ``resp_...``, ``msg_...``."""
    return f"{prefix}{'-' if prefix == 'chatcmpl' else '_'}{uuid.uuid4().hex[:24]}"


class ArgumentStream:
    """A call body streamed into its arguments: what to send of each delta.

    A body that starts (after white space) with ``{`` or ``[`` is scanned for the
    end of that value (strings and escapes aware); if the value then parses as
    JSON, what trails it is held back. Any other body passes verbatim.

    >>> a = ArgumentStream()
    >>> [a.feed(d) for d in ['{"x": "}', '", "y": [1]}', ' junk']], a.trailing()
    (['{"x": "}', '", "y": [1]}', ''], ' junk')
    """

    def __init__(self) -> None:
        self._parts: list[str] = []
        self._size = 0
        self._sent = 0  # characters sent
        self._start: int | None = None
        self._depth = 0
        self._in_string = False
        self._escape = False
        self._scanning = True  # a JSON value is open, or no character decided yet
        self._cut: int | None = None  # where a valid first JSON value ends

    def feed(self, delta: str) -> str:
        """Consume more of the body; returns the part of it to send now."""
        base = self._size
        self._parts.append(delta)
        self._size += len(delta)
        if self._cut is not None:
            return ""
        if self._scanning:
            end = self._scan(delta, base)
            if end is not None:
                text = "".join(self._parts)
                try:
                    json.loads(text[self._start : end])
                except ValueError:
                    pass  # not JSON after all: verbatim
                else:
                    self._cut = end
                    out = delta[: end - base]
                    self._sent += len(out)
                    return out
        self._sent += len(delta)
        return delta

    def _scan(self, delta: str, base: int) -> int | None:
        """Index just past the first JSON value once it closes in ``delta``."""
        for i, c in enumerate(delta):
            if self._start is None:
                if c.isspace():
                    continue
                if c not in "{[":
                    self._scanning = False
                    return None
                self._start, self._depth = base + i, 1
            elif self._in_string:
                if self._escape:
                    self._escape = False
                elif c == "\\":
                    self._escape = True
                elif c == '"':
                    self._in_string = False
            elif c == '"':
                self._in_string = True
            elif c in "{[":
                self._depth += 1
            elif c in "}]":
                self._depth -= 1
                if self._depth == 0:
                    self._scanning = False
                    return base + i + 1
        return None

    @property
    def empty(self) -> bool:
        return not any(p.strip() for p in self._parts)

    def trailing(self) -> str:
        """What was held back after the JSON value."""
        return "".join(self._parts)[self._cut :] if self._cut is not None else ""


@dataclass
class Call:
    key: int
    name: str
    id: str


@dataclass
class _Open:
    """A message being mapped."""

    header: Header
    route: str  # reasoning | content | call | builtin | pending | aside
    key: int
    emitted: int = 0  # characters of the body already consumed
    args: ArgumentStream | None = None
    note: Note | None = None  # said when the message ends
    tool: str | None = None  # the built-in tool a builtin message calls, when the request has it
    mcp: tuple[str, str] | None = None  # (server_label, tool) of a call to an MCP server's tool


@dataclass
class Turn:
    """Maps the parser's messages to reasoning, content and tool calls, event by event."""

    encoding: HarmonyEncoding
    names: ToolNames = field(default_factory=ToolNames)
    parser: StreamableParser = field(init=False)
    calls: dict[int, Call] = field(default_factory=dict)
    builtin_calls: list[dict[str, Any]] = field(default_factory=list)
    notes: list[Note] = field(default_factory=list)
    incomplete: set[int] = field(default_factory=set)  # keys of items cut off by max_tokens
    # the built-in namespaces the request has (python, browser): calls to them, the model's
    # slips functions.python / functions.browser.x included, are built-in calls; python's code
    # streams (events of kind "code")
    hosted: tuple[str, ...] = ()
    mcp: tuple[McpNamespace, ...] = ()  # the request's MCP servers and their tools
    # the parser message index of each built-in call (None: an empty one the parser dropped)
    builtin_messages: list[int | None] = field(default_factory=list)
    reasoning_tokens: int = 0
    output_tokens: int = 0

    def __post_init__(self) -> None:
        self.parser = StreamableParser(self.encoding, Role.ASSISTANT, strict=False,
                                       tools=self.names.parser_tools() or None)
        self._seen = 0  # parser messages accounted for
        self._open: _Open | None = None
        self._keys = 0
        self._after_call = False
        self._has_final = False
        self._pending: list[tuple[str, int]] = []  # bodies without a channel, and their token counts
        self._held: list[tuple[str, int, str]] = []  # text that came after them
        self._last: tuple[str, int] | None = None
        self._events: list[Event] = []
        self._cut = False  # the engine stopped at max_tokens
        self.closed = False
        self.finish_reason: str | None = None

    # -- feeding -------------------------------------------------------------

    def feed(self, token_ids: Iterable[int]) -> list[Event]:
        """Consume output tokens; returns the events they produced."""
        if self.closed:
            raise StreamClosed("feed() after close(): this output has ended")
        p = self.parser
        ids = as_token_ids(token_ids, "token_ids")
        self.output_tokens += len(ids)
        for token in ids:
            p.process(token)
            op = self._open
            if op is not None and p.header is op.header and p.state is StreamState.CONTENT:
                if p.last_content_delta is not None:
                    self._delta(op, p.last_content_delta)  # the hot path: more of a body
            else:
                self._step(token in STOP_TOKEN_SET)
        return self._take()

    def close(self, engine_finish_reason: str = "stop") -> tuple[list[Event], str]:
        """End of output (``engine_finish_reason``: what the engine reported, one of
        ``FINISH_REASONS``); returns the last events and the finish reason to report.
        Closing again returns no events and the same reason."""
        if engine_finish_reason not in FINISH_REASONS:
            raise ValueError(f"finish_reason must be one of {', '.join(FINISH_REASONS)}; "
                             f"got {engine_finish_reason!r}")
        if self.closed:
            assert self.finish_reason is not None
            return [], self.finish_reason
        self.closed = True
        self._cut = engine_finish_reason == "length"
        self.parser.process_eos()
        self._step(False, at_end=True)
        self._trailing_text()
        if self._pending:
            self._flush_pending("reasoning" if self._has_final else "content")
        if self._cut:
            reason = "length"
        elif self.calls:
            reason = "tool_calls"
        else:
            reason = "content_filter" if engine_finish_reason == "content_filter" else "stop"
        self.finish_reason = reason
        return self._take(), reason

    def abort(self) -> None:
        """The output ends in failure (the engine broke off): nothing more is fed or closed."""
        if not self.closed:
            self.closed, self.finish_reason = True, "error"

    def extension(self) -> dict[str, Any]:
        """The ``harmony`` extension field: every repair (in token order), and what was set aside."""
        out: dict[str, Any] = {"repairs": [r.to_dict() for r in self.parser.result().repairs]}
        if self.notes:
            out["notes"] = [n.to_dict() for n in self.notes]
        if self.builtin_calls:
            out["builtin_tool_calls"] = list(self.builtin_calls)
        return out

    # -- internals -----------------------------------------------------------

    def _take(self) -> list[Event]:
        out, self._events = self._events, []
        return out

    def _step(self, stopped: bool, at_end: bool = False) -> None:
        p = self.parser
        msgs = p.parsed
        op = self._open
        cut = at_end and self._cut and not stopped
        if op is not None and (at_end or p.state is not StreamState.CONTENT or p.header is not op.header):
            # The streaming body ended: its message is the next one (unless it was empty and dropped).
            self._open = None
            if len(msgs) > self._seen and _same(msgs[self._seen], op.header):
                self._seen += 1
                self._finish(op, message_text(msgs[self._seen - 1]), self._span(self._seen - 1), cut)
            else:
                self._finish(op, "", 0, cut)
        while len(msgs) > self._seen:  # messages that arrived whole (no <|message|>, prose, ...)
            m = msgs[self._seen]
            self._seen += 1
            self._finish(self._begin(_header_of(m)), message_text(m), self._span(self._seen - 1), cut)
        if p.state is StreamState.CONTENT and p.header is not None and self._open is None and not at_end:
            self._open = self._begin(p.header)
            if p.last_content_delta is not None:
                self._delta(self._open, p.last_content_delta)

    def _span(self, index: int) -> int:
        start, end = self.parser.spans[index]
        return end - start

    def _route(self, h: Header) -> tuple[str, str, Note | None]:
        """(route, the declared name of a call, a note to add when the message ends)."""
        if self._after_call or h.role is not Role.ASSISTANT:
            return "aside", "", None
        r = h.recipient
        if r is None:
            return self._by_channel(h), "", None
        name = self.names.resolve(r)
        if name is not None:
            return "call", name, None
        if self.hosted and builtin_recipient(r, self.hosted) is not None:
            return "builtin", "", None
        if self.mcp and mcp_recipient(r, self.mcp) is not None:
            return "builtin", "", None
        if r.startswith(_BUILTIN_PREFIXES) or r == "python" or ("." in r and not r.startswith(FUNCTIONS)):
            return "builtin", "", None
        if r.startswith(FUNCTIONS) and not named_nothing(r):
            bare = r[len(FUNCTIONS) :]
            if self.names:  # the client answers "unknown tool" and the model recovers
                return "call", bare, Note("undeclared_tool", f"call to {r}, not declared by the request")
            return "aside", "", Note("undeclared_tool", f"call to {r} with no tools declared; not returned")
        route = self._by_channel(h)
        if route == "content" and h.channel != "final":  # commentary to a name that is no tool
            return "aside", "", Note("unknown_recipient", f"message to {r!r}, which is no tool, set aside")
        return route, "", Note("recipient_ignored", f"recipient {r!r} is no tool; shown as {route}")

    @staticmethod
    def _by_channel(h: Header) -> str:
        if h.channel == "analysis":
            return "reasoning"
        return "pending" if h.channel is None else "content"

    def _begin(self, h: Header) -> _Open:
        route, name, note = self._route(h)
        self._keys += 1
        op = _Open(h, route, self._keys, note=note)
        if route == "call":
            op.args = ArgumentStream()
            self.calls[op.key] = Call(op.key, name, new_id("call"))
            self._text("call", op.key, "")  # the call opens at once: its name is known
        elif route == "content" and h.channel == "final":
            self._has_final = True
            if self._pending:
                self._flush_pending("reasoning")
        elif route == "builtin" and h.recipient is not None:
            op.tool = builtin_recipient(h.recipient, self.hosted)
            op.mcp = mcp_recipient(h.recipient, self.mcp) if self.mcp else None
            if op.tool == "python":
                self._text("code", op.key, "")  # python's code streams as it is written
        return op

    def _delta(self, op: _Open, text: str) -> None:
        if op.route == "pending" and self.parser.open_length >= HEADER_LIMIT:
            self._stream_pending(op)
            return
        op.emitted += len(text)
        if op.route in ("reasoning", "content"):
            self._text(op.route, op.key, text)
        elif op.route == "call":
            assert op.args is not None
            self._text("call", op.key, op.args.feed(text))
        elif op.tool == "python":
            self._text("code", op.key, text)

    def _stream_pending(self, op: _Open) -> None:
        """Text without a channel, too long to hold: shown from here, with what came before it."""
        kind = "reasoning" if self._has_final else "content"
        if self._pending:
            self._flush_pending(kind)
        op.route = kind
        op.note = Note("headerless_text", f"text without a channel shown as {kind}")
        text = self.parser.content
        op.emitted = len(text)
        self._text(kind, op.key, text)

    def _text(self, kind: str, key: int, text: str) -> None:
        if not text and kind not in ("call", "code"):
            return
        if self._pending:
            # Text without a channel came first and is not decided yet: keep the order.
            self._held.append((kind, key, text))
            return
        if self._last != (kind, key):
            self._events.append(Event("open", kind, key))
            self._last = (kind, key)
        if text:
            self._events.append(Event("text", kind, key, text))

    def _finish(self, op: _Open, text: str, ntokens: int, cut: bool) -> None:
        rest = text[op.emitted :]
        if op.note is not None:
            self.notes.append(Note(op.note.kind, op.note.detail, text))
        if op.route in ("reasoning", "content"):
            self._delta(op, rest)
            if op.route == "reasoning":
                self.reasoning_tokens += ntokens
            if cut:
                self.incomplete.add(op.key)
        elif op.route == "pending":
            if text.strip():
                self._pending.append((text, ntokens))
        elif op.route == "call":
            self._finish_call(op, rest, text, cut)
        elif op.route == "builtin":
            self._after_call = True
            if op.tool == "python":
                self._delta(op, rest)
            call: dict[str, Any] = {"recipient": op.header.recipient, "channel": op.header.channel,
                                    "content_type": op.header.content_type, "arguments": text}
            if op.tool is not None and op.tool != op.header.recipient:
                call["tool"] = op.tool
            if op.mcp is not None:
                call["mcp"] = list(op.mcp)
            if cut:
                call["incomplete"] = True
            self.builtin_calls.append(call)
            self.builtin_messages.append(self._seen - 1 if ntokens else None)
            self._events.append(Event("builtin", "builtin", len(self.builtin_calls) - 1))
        elif text and op.note is None:
            after = self._after_call
            self.notes.append(Note(
                "after_tool_call" if after else "not_assistant",
                "output after the first tool call: the engine ran past <|call|>" if after
                else f"a {op.header.role.value} message in the assistant's output", text))

    def _finish_call(self, op: _Open, rest: str, text: str, cut: bool) -> None:
        assert op.args is not None
        self._delta(op, rest)
        name = self.calls[op.key].name
        if op.args.empty:
            self.notes.append(Note("empty_arguments", f"call to {name} with an empty body", text))
        trailing = op.args.trailing()
        if trailing.strip():
            self.notes.append(Note("text_after_arguments", "text after the arguments' JSON value", trailing))
        if cut:
            self.incomplete.add(op.key)
            self.notes.append(Note("cut_off_tool_call", f"call to {name} cut off by max_tokens", text))
        self._after_call = True

    def _trailing_text(self) -> None:
        """Text after the last message with no header (a structured-output engine's answer
        after ``<|end|>``) joins the text without a channel."""
        p = self.parser
        if self._after_call or not p.skipped:
            return
        kinds = {(r.start, r.end): r.kind for r in p.repairs if r.kind in ("stray_text", "stray_stop_token")}
        last_span = p.spans[-1][1] if p.spans else 0
        for start, end in reversed(p.skipped):
            kind = kinds.get((start, end))
            if start < last_span:
                return
            if kind == "stray_stop_token":
                continue
            if kind == "stray_text":
                text = self.encoding.decode([t for t in p.tokens_in(start, end) if 0 <= t < 199998])
                if text.strip():
                    self._pending.append((text, end - start))
            return

    def _flush_pending(self, kind: str) -> None:
        text = "\n\n".join(t.strip() for t, _ in self._pending)
        if kind == "reasoning":
            self.reasoning_tokens += sum(n for _, n in self._pending)
        self._pending = []
        self._keys += 1
        self._text(kind, self._keys, text)
        held, self._held = self._held, []
        for event in held:
            self._text(*event)
        self.notes.append(Note("headerless_text", f"text without a channel shown as {kind}", text))


def _same(message: Message, header: Header) -> bool:
    return (message.channel, message.recipient, message.content_type, message.author.role) == \
        (header.channel, header.recipient, header.content_type, header.role)


def _header_of(m: Message) -> Header:
    return Header(m.author.role, m.author.name, m.recipient, m.channel, m.content_type)


class OutputStream:
    """What the Chat and Responses streams share: the turn, the ids, the token counts."""

    id_prefix: ClassVar[str] = "out"

    def __init__(
        self,
        encoding: HarmonyEncoding,
        render: Callable[[HarmonyEncoding, dict[str, Any]], Any],
        *,
        request: dict[str, Any] | None,
        id: str | None,
        model: str | None,
        prompt_tokens: int | None,
        mcp: tuple[McpNamespace, ...] = (),
    ) -> None:
        if not isinstance(encoding, HarmonyEncoding):
            raise TypeError(f"encoding must be a HarmonyEncoding (load_harmony_encoding(...)), "
                            f"got {type(encoding).__name__}")
        if request is not None and not isinstance(request, dict):
            raise TypeError(f"request must be the request body as a dict, got {type(request).__name__}")
        self.request = request or {}
        self.id = id or new_id(self.id_prefix)
        self.model = model or self.request.get("model") or "gpt-oss"
        self.turn = Turn(encoding, declared_names(request), hosted=hosted_tools(request), mcp=mcp)
        self._encoding = encoding
        self._render = render
        self._prompt_tokens = prompt_tokens
        self.started = False

    @property
    def output_tokens(self) -> int:
        return self.turn.output_tokens

    def prompt_tokens(self) -> int:
        """The request's prompt length (rendered once, when not given)."""
        if self._prompt_tokens is None:
            from .errors import RequestError

            try:
                self._prompt_tokens = len(self._render(self._encoding, self.request).tokens)
            except RequestError:  # usage is informative; the output was served already
                self._prompt_tokens = 0
        return self._prompt_tokens
