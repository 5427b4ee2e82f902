"""StreamableParser: the reference's incremental API over the parser's state machine."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from ..model import Message, Role, StreamState
from .machine import Machine
from .result import ParseResult, Repair

if TYPE_CHECKING:
    from ..encoding import HarmonyEncoding


class StreamableParser:
    """Parses completion tokens one at a time.

    ``strict=True`` behaves like the reference (and raises ``HarmonyError`` on
    malformed output); ``strict=False`` never raises and records each repair in
    ``repairs``. ``tools`` (declared function names) helps the tolerant mode
    read ambiguous recipients.

    >>> from harmonykit import load_harmony_encoding, HarmonyEncodingName, Role
    >>> enc = load_harmony_encoding(HarmonyEncodingName.HARMONY_GPT_OSS)
    >>> p = StreamableParser(enc, Role.ASSISTANT)
    >>> for t in enc.encode("<|channel|>final<|message|>Hi!", allowed_special="all"):
    ...     _ = p.process(t)
    >>> p.current_channel, p.current_content
    ('final', 'Hi!')
    """

    def __init__(
        self,
        encoding: HarmonyEncoding,
        role: Role | None,
        *,
        strict: bool = True,
        tools: Iterable[str] | None = None,
    ) -> None:
        self._m: Machine = encoding._machine(role, strict=strict, tools=tools)
        self._messages_view: list[Message] = []

    def process(self, token: int) -> StreamableParser:
        self._m.feed(token)
        return self

    def process_eos(self) -> StreamableParser:
        self._m.end()
        return self

    @property
    def current_content(self) -> str:
        m = self._m
        return m.content if m.state is StreamState.CONTENT else ""

    @property
    def current_role(self) -> Role | None:
        m = self._m
        if m.state is StreamState.CONTENT and m.header is not None:
            return m.header.role
        return m.next_role

    @property
    def current_content_type(self) -> str | None:
        h = self._m.header
        return h.content_type if h is not None and self._m.state is StreamState.CONTENT else None

    @property
    def current_recipient(self) -> str | None:
        h = self._m.header
        return h.recipient if h is not None and self._m.state is StreamState.CONTENT else None

    @property
    def current_channel(self) -> str | None:
        h = self._m.header
        return h.channel if h is not None and self._m.state is StreamState.CONTENT else None

    @property
    def last_content_delta(self) -> str | None:
        return self._m.last_delta

    @property
    def messages(self) -> list[Message]:
        """The messages parsed so far (a list that is rebuilt only when a message is added)."""
        msgs = self._m.messages
        if len(self._messages_view) != len(msgs):
            self._messages_view = list(msgs)
        return self._messages_view

    @property
    def tokens(self) -> list[int]:
        return list(self._m.tokens)

    @property
    def repairs(self) -> list[Repair]:
        """Repairs made so far (tolerant mode), in the order they were made."""
        return list(self._m.repairs)

    @property
    def state(self) -> StreamState:
        return self._m.state

    @property
    def state_data(self) -> dict[str, Any]:
        m = self._m
        if m.state is StreamState.HEADER:
            return {"state": "Header", "header_tokens": list(m.header_tokens)}
        if m.state is StreamState.CONTENT and m.header is not None:
            return {
                "state": "Content",
                "header": m.header.to_state(),
                "content_tokens": m.content_tokens(),
            }
        return {"state": "ExpectStart"}

    def result(self) -> ParseResult:
        """Messages, spans, skipped ranges and repairs so far (final after ``process_eos``)."""
        return self._m.result()
