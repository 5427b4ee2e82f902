"""What the store holds, as plain frozen records (the JSON inside them is the API's own)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

#: A response still being generated, and one that has ended.
ACTIVE = ("queued", "in_progress")
TERMINAL = ("completed", "incomplete", "failed", "cancelled")


@dataclass(frozen=True)
class StoredResponse:
    """A stored response: ``body`` is the ``Response`` object (its ``status`` and ``error`` are
    this record's), ``input`` its own input items (with ids), not its chain's."""

    id: str
    owner: str
    created_at: float
    status: str
    background: bool
    body: dict[str, Any]
    input: list[dict[str, Any]]
    previous_id: str | None = None
    conversation_id: str | None = None
    lease_owner: str | None = None
    lease_until: float | None = None

    @property
    def response(self) -> dict[str, Any]:
        """The ``Response`` as a client sees it now."""
        return {**self.body, "status": self.status}


@dataclass(frozen=True)
class ChainLink:
    """One response of a ``previous_response_id`` chain, as a continuation needs it: its own input
    items, then its output items."""

    id: str
    previous_id: str | None
    status: str
    items: list[dict[str, Any]]


@dataclass(frozen=True)
class Conversation:
    """A conversation (its items are kept apart, in order)."""

    id: str
    owner: str
    created_at: int
    metadata: dict[str, Any] = field(default_factory=dict)

    def object(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": "conversation",
            "created_at": self.created_at,
            "metadata": self.metadata,
        }
