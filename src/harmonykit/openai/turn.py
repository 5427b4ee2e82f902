"""One assistant turn, from output tokens to what an OpenAI client sees.

The same ``Turn`` feeds streaming (``ChatCompletionStream``, ``ResponsesStream``)
and the one-shot functions, which run it over all tokens and fold its events:
so the concatenated stream is, by construction, the non-streaming result.

Events are ``("open", kind, key)``, ``("text", kind, key, text)`` and
``("close", kind, key)`` with kind ``reasoning``, ``content`` or ``call``; a call
opens with its name and id in ``Turn.calls[key]``. Rules (see docs/openai.md):

- ``analysis`` is reasoning; ``final`` and recipient-less ``commentary``
  (a preamble) are content; a message to ``functions.NAME`` or to a bare
  function name is a tool call; other recipients (``browser.*``, ``python``)
  are built-in tool calls, reported in the extension field, not as calls;
- text without a channel is held until the end: it is the answer when the
  turn has no ``final`` message, reasoning otherwise;
- a call is shown once its arguments are whole (a complete JSON value, or the
  message ended), so a call cut off by ``max_tokens`` is never shown;
- everything after the first call is the engine running past ``<|call|>``:
  set aside, with a repair.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, ClassVar

from ..encoding import HarmonyEncoding
from ..model import Message, Role, StreamState
from ..parse.header import Header
from ..parse.stream import StreamableParser
from ..tokens import STOP_TOKEN_SET

Event = tuple[Any, ...]
_BUILTIN_PREFIXES = ("browser.", "python", "container.", "functions_builtin.")


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:24]}"


def tool_names(request: dict[str, Any] | None) -> list[str] | None:
    """Declared function names of a Chat or Responses request (Chat nests them under "function")."""
    if not request or not isinstance(request.get("tools"), list):
        return None
    names = []
    for t in request["tools"]:
        if isinstance(t, dict):
            fn = t["function"] if isinstance(t.get("function"), dict) else t
            if isinstance(fn.get("name"), str):
                names.append(fn["name"])
    return names or None


class JsonExtent:
    """Where the first JSON value of a growing text ends (bracket depth, strings aware).

    A body that starts with ``{`` or ``[`` ends at its matching bracket; any other
    body is raw and ends with the message.
    """

    def __init__(self) -> None:
        self.start: int | None = None  # index of the value's first character
        self.end: int | None = None  # index just past the value, once known
        self.raw = False
        self._pos = 0
        self._depth = 0
        self._in_string = False
        self._escape = False

    def feed(self, text: str) -> None:
        """Scan the text so far (the whole body, growing)."""
        i = self._pos
        n = len(text)
        while i < n and self.end is None and not self.raw:
            c = text[i]
            if self.start is None:
                if not c.isspace():
                    self.start = i
                    if c in "{[":
                        self._depth = 1
                    else:
                        self.raw = True
                i += 1
                continue
            if self._in_string:
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
                    self.end = i + 1
            i += 1
        self._pos = i

    def arguments(self, text: str) -> str:
        """The arguments string of a finished body: the JSON value, or the body verbatim."""
        if self.start is None or self.raw or self.end is None:
            return text
        return text[self.start : self.end]


@dataclass
class Call:
    key: int
    name: str
    id: str
    arguments: str = ""


@dataclass
class _Open:
    """A message being mapped."""

    header: Header
    route: str  # reasoning | content | call | builtin | pending | aside
    key: int
    emitted: int = 0  # characters of the body already sent as events
    extent: JsonExtent | None = None
    shown: bool = False  # a call already sent


@dataclass
class Turn:
    """Maps the parser's messages to reasoning, content and tool calls, event by event."""

    encoding: HarmonyEncoding
    tools: list[str] | None = None
    parser: StreamableParser = field(init=False)
    calls: dict[int, Call] = field(default_factory=dict)
    builtin_calls: list[dict[str, Any]] = field(default_factory=list)
    notes: list[dict[str, Any]] = field(default_factory=list)  # what the mapping set aside or moved

    def __post_init__(self) -> None:
        self.parser = StreamableParser(self.encoding, Role.ASSISTANT, strict=False, tools=self.tools)
        self._seen = 0  # parser messages accounted for
        self._open: _Open | None = None
        self._keys = 0
        self._after_call = False
        self._has_final = False
        self._pending: list[str] = []  # bodies of messages without a channel
        self._held: list[tuple[str, int, str]] = []  # text that came after them
        self._last: tuple[str, int] | None = None
        self._events: list[Event] = []
        self._cut = False  # the engine stopped at max_tokens
        self._closed = False

    # -- feeding -------------------------------------------------------------

    def feed(self, token_ids: Iterable[int]) -> list[Event]:
        """Consume output tokens; returns the events they produced."""
        p = self.parser
        for token in token_ids:
            p.process(token)
            op = self._open
            if op is not None and p.header is op.header and p.state is StreamState.CONTENT:
                if p.last_content_delta is not None:
                    self._delta(op, p.last_content_delta)  # the hot path: more of a body
            else:
                self._step(token in STOP_TOKEN_SET)
        return self._take()

    def close(self, engine_finish_reason: str = "stop") -> tuple[list[Event], str]:
        """End of output (``engine_finish_reason``: what the engine reported); returns the last
        events and the finish reason to report."""
        if not self._closed:
            self._closed = True
            self._cut = engine_finish_reason == "length"
            self.parser.process_eos()
            self._step(False, at_end=True)
            if self._pending:
                self._flush_pending("reasoning" if self._has_final else "content")
        if self.calls:
            reason = "tool_calls"
        elif engine_finish_reason in ("length", "content_filter"):
            reason = engine_finish_reason
        else:
            reason = "stop"
        return self._take(), reason

    def extension(self) -> dict[str, Any]:
        """The ``harmony`` extension field: every repair, and what was set aside."""
        out: dict[str, Any] = {"repairs": [r.to_dict() for r in self.parser.result().repairs]}
        if self.notes:
            out["notes"] = list(self.notes)
        if self.builtin_calls:
            out["builtin_tool_calls"] = list(self.builtin_calls)
        return out

    # -- internals -----------------------------------------------------------

    def _take(self) -> list[Event]:
        out, self._events = self._events, []
        return out

    def _step(self, stopped: bool, at_end: bool = False) -> None:
        p = self.parser
        msgs = p._messages
        op = self._open
        if op is not None and (at_end or p.state is not StreamState.CONTENT or p.header is not op.header):
            # The streaming body ended: its message is the next one (unless it was empty and dropped).
            self._open = None
            if len(msgs) > self._seen and _same(msgs[self._seen], op.header):
                self._seen += 1
                self._finish(op, msgs[self._seen - 1].content[0].text, stopped)  # type: ignore[attr-defined]
            else:
                self._finish(op, "", False)
        while len(msgs) > self._seen:  # messages that arrived whole (no <|message|>, prose, ...)
            m = msgs[self._seen]
            self._seen += 1
            whole = self._begin(_header_of(m))
            self._finish(whole, m.content[0].text, stopped)  # type: ignore[attr-defined]
        if p.state is StreamState.CONTENT and p.header is not None and self._open is None and not at_end:
            self._open = self._begin(p.header)
            if p.last_content_delta is not None:
                self._delta(self._open, p.last_content_delta)

    def _route(self, h: Header) -> str:
        if self._after_call or h.role is not Role.ASSISTANT:
            return "aside"
        if h.recipient is not None:
            return "call" if self._is_function(h.recipient) else "builtin"
        if h.channel == "analysis":
            return "reasoning"
        return "pending" if h.channel is None else "content"

    def _is_function(self, recipient: str) -> bool:
        if recipient.startswith("functions.") or (self.tools and recipient in self.tools):
            return True
        return "." not in recipient and not recipient.startswith(_BUILTIN_PREFIXES)

    def _begin(self, h: Header) -> _Open:
        route = self._route(h)
        self._keys += 1
        op = _Open(h, route, self._keys)
        if route == "call":
            op.extent = JsonExtent()
        elif route == "content" and h.channel == "final":
            self._has_final = True
            if self._pending:
                self._flush_pending("reasoning")
        return op

    def _delta(self, op: _Open, text: str) -> None:
        if op.route in ("reasoning", "content"):
            self._text(op.route, op.key, text)
            op.emitted += len(text)
        elif op.route == "call" and not op.shown:
            assert op.extent is not None
            body = self.parser.content
            op.extent.feed(body)
            if op.extent.end is not None:  # the arguments are whole: show the call now
                self._show_call(op, op.extent.arguments(body))

    def _text(self, kind: str, key: int, text: str) -> None:
        if not text and kind != "call":
            return
        if self._pending:
            # Text without a channel came first and is not decided yet: keep the order.
            self._held.append((kind, key, text))
            return
        if self._last != (kind, key):
            self._events.append(("open", kind, key))
            self._last = (kind, key)
        self._events.append(("text", kind, key, text))

    def _show_call(self, op: _Open, arguments: str) -> None:
        name = op.header.recipient or ""
        name = name[len("functions."):] if name.startswith("functions.") else name
        self.calls[op.key] = Call(op.key, name, new_id("call"), arguments)
        self._text("call", op.key, arguments)
        op.shown = True

    def _finish(self, op: _Open, text: str, stopped: bool) -> None:
        if op.route in ("reasoning", "content"):
            self._text(op.route, op.key, text[op.emitted:])
        elif op.route == "pending":
            if text.strip():
                self._pending.append(text)
        elif op.route == "call":
            self._finish_call(op, text, stopped)
        elif op.route == "builtin":
            self.builtin_calls.append({"recipient": op.header.recipient, "channel": op.header.channel,
                                       "content_type": op.header.content_type, "arguments": text})
            self._after_call = True
        elif text:
            self.notes.append({
                "kind": "after_tool_call" if self._after_call else "not_assistant",
                "detail": "output after the first tool call: the engine ran past <|call|>"
                if self._after_call else f"a {op.header.role.value} message in the assistant's output",
                "text": text,
            })

    def _finish_call(self, op: _Open, text: str, stopped: bool) -> None:
        assert op.extent is not None
        op.extent.feed(text)
        if not op.shown:
            if self._cut and not stopped and op.extent.end is None:
                self.notes.append({"kind": "cut_off_tool_call",
                                   "detail": f"call to {op.header.recipient} cut off by max_tokens",
                                   "text": text})
                return
            self._show_call(op, op.extent.arguments(text))
        end = op.extent.end
        if end is not None and text[end:].strip():
            self.notes.append({"kind": "text_after_arguments",
                               "detail": "text after the arguments' JSON value", "text": text[end:]})
        self._after_call = True

    def _flush_pending(self, kind: str) -> None:
        text = "\n\n".join(t.strip() for t in self._pending)
        self._pending = []
        self._keys += 1
        self._text(kind, self._keys, text)
        held, self._held = self._held, []
        for event in held:
            self._text(*event)
        self.notes.append({"kind": "headerless_text", "detail": f"text without a channel shown as {kind}",
                           "text": text})


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
    ) -> None:
        self.request = request or {}
        self.id = id or new_id(self.id_prefix)
        self.model = model or self.request.get("model") or "gpt-oss"
        self.output_tokens = 0
        self.turn = Turn(encoding, tool_names(request))
        self._encoding = encoding
        self._render = render
        self._prompt_tokens = prompt_tokens
        self.started = False

    def events(self, token_ids: Iterable[int]) -> list[Event]:
        ids = list(token_ids)
        self.output_tokens += len(ids)
        return self.turn.feed(ids)

    def prompt_tokens(self) -> int:
        """The request's prompt length (rendered once, when not given)."""
        if self._prompt_tokens is None:
            from .errors import RequestError

            try:
                self._prompt_tokens = len(self._render(self._encoding, self.request).tokens)
            except RequestError:  # usage is informative; the output was served already
                self._prompt_tokens = 0
        return self._prompt_tokens
