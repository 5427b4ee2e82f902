"""StreamableParser: the reference's incremental API, on the parser's state machine itself.

It is the machine (a subclass, not a wrapper) so that ``process`` costs one
call per token: the reference API adds no layer on the hot path.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from ..model import Message, Role, StreamState
from .machine import Machine, check_role, check_tools

if TYPE_CHECKING:
    from ..encoding import HarmonyEncoding


class StreamableParser(Machine):
    """Parses completion tokens one at a time.

    ``strict=True`` behaves like the reference (and raises ``HarmonyError`` on
    malformed output); ``strict=False`` never raises and appends each repair to
    ``repairs`` as it makes it. ``tools`` (declared function names) helps the tolerant mode
    read ambiguous recipients. ``result()`` gives the spans, skipped ranges and
    repairs of everything read so far.

    >>> from harmonykit import load_harmony_encoding, HarmonyEncodingName, Role
    >>> enc = load_harmony_encoding(HarmonyEncodingName.HARMONY_GPT_OSS)
    >>> p = StreamableParser(enc, Role.ASSISTANT)
    >>> for t in enc.encode("<|channel|>final<|message|>Hi!", allowed_special="all"):
    ...     _ = p.process(t)
    >>> p.current_channel, p.current_content, p.last_content_delta
    ('final', 'Hi!', '!')
    """

    #: Consume one token; returns the parser (``process(t).process(u)`` chains).
    process = Machine.feed
    #: Mark the end of the stream: completes a message still open.
    process_eos = Machine.end

    def __init__(
        self,
        encoding: HarmonyEncoding,
        role: Role | None,
        *,
        strict: bool = True,
        tools: Iterable[str] | None = None,
    ) -> None:
        from ..encoding import HarmonyEncoding

        if not isinstance(encoding, HarmonyEncoding):
            raise TypeError("encoding must be a HarmonyEncoding (load_harmony_encoding(...)), "
                            f"got {type(encoding).__name__}")
        super().__init__(encoding.machine_io, check_role(role), strict=strict, tools=check_tools(tools))
        self._messages_view: list[Message] = []

    @property
    def current_content(self) -> str:
        return self.content if self.state is StreamState.CONTENT else ""

    @property
    def current_role(self) -> Role | None:
        if self.state is StreamState.CONTENT and self.header is not None:
            return self.header.role
        return self.next_role

    @property
    def current_content_type(self) -> str | None:
        h = self.header
        return h.content_type if h is not None and self.state is StreamState.CONTENT else None

    @property
    def current_recipient(self) -> str | None:
        h = self.header
        return h.recipient if h is not None and self.state is StreamState.CONTENT else None

    @property
    def current_channel(self) -> str | None:
        h = self.header
        return h.channel if h is not None and self.state is StreamState.CONTENT else None

    @property
    def messages(self) -> list[Message]:
        """The messages parsed so far (a list that is rebuilt only when a message is added)."""
        if len(self._messages_view) != len(self._messages):
            self._messages_view = list(self._messages)
        return self._messages_view

    @property
    def tokens(self) -> list[int]:
        return list(self._tokens)

    @property
    def state_data(self) -> dict[str, Any]:
        if self.state is StreamState.HEADER:
            return {"state": "Header", "header_tokens": list(self.header_tokens)}
        if self.state is StreamState.CONTENT and self.header is not None:
            return {
                "state": "Content",
                "header": self.header.to_state(),
                "content_tokens": self.content_tokens(),
            }
        return {"state": "ExpectStart"}
