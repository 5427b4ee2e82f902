"""Items as the stateful APIs keep and list them: a request's input made into stored items
(ids, statuses and content parts as the SDK's ``ResponseItem`` / ``ConversationItem``
types have them), ids checked, lists paged. Pure: the store keeps what these return.

>>> [listed_item(i)["content"] for i in input_items({"input": "Hi"})]
[[{'type': 'input_text', 'text': 'Hi'}]]
"""

from __future__ import annotations

import re
from typing import Any

from .errors import RequestError, shown
from .turn import new_id

_PREFIX = {
    "message": "msg",
    "reasoning": "rs",
    "function_call": "fc",
    "function_call_output": "fco",
    "web_search_call": "ws",
    "code_interpreter_call": "ci",
}
_ID = re.compile(r"[A-Za-z0-9_-]{1,128}")

#: What OpenAI calls each object, for messages such as "Response with id 'x' not found."
KINDS = {"resp": "Response", "conv": "Conversation", "item": "Item"}


def check_id(value: Any, prefix: str, param: str) -> str:
    """A well-formed id of its kind (``resp_...``, ``conv_...``); else a 400 naming ``param``."""
    if not isinstance(value, str) or not value.startswith(prefix + "_") or not _ID.fullmatch(value):
        raise RequestError(
            param,
            f"Invalid '{param}': {shown(value)}. Expected an ID that begins with "
            f"'{prefix}_' and holds only letters, digits, '_' and '-'.",
        )
    return value


def check_item_id(value: Any, param: str) -> str:
    if not isinstance(value, str) or not _ID.fullmatch(value):
        raise RequestError(param, f"Invalid '{param}': {shown(value)}. Expected an item ID.")
    return value


def _parts(content: Any, kind: str) -> Any:
    if isinstance(content, str):
        return [{"type": kind, "text": content}]
    return content


def stored_item(item: Any) -> dict[str, Any]:
    """One input item as it is kept: the client's, with ``type``, an ``id`` and a ``status``
    added, and nothing else changed (a message's string content stays a string: rendered again
    in a chain, it takes the render cache's fastest path, as the client's own would)."""
    if not isinstance(item, dict):
        return {
            "id": new_id("msg"),
            "type": "message",
            "role": "user",
            "content": item,
            "status": "completed",
        }
    out = dict(item)
    kind = out.setdefault("type", "message")
    if not isinstance(out.get("id"), str) or not out["id"]:
        out["id"] = new_id(_PREFIX.get(kind, "item"))
    if kind != "reasoning" or "status" in out:
        out.setdefault("status", "completed")
    return out


def listed_item(item: dict[str, Any]) -> dict[str, Any]:
    """A kept item as the API lists it (the SDK's ``ResponseItem`` / ``ConversationItem``): a
    message's text as content parts, output text with its annotations. A copy."""
    if item.get("type") != "message":
        return item
    part = "output_text" if item.get("role") == "assistant" else "input_text"
    content = _parts(item.get("content"), part)
    if part == "output_text" and isinstance(content, list):
        content = [
            {**p, "annotations": p.get("annotations", [])}
            if isinstance(p, dict) and p.get("type") == "output_text"
            else p
            for p in content
        ]
    return {**item, "content": content}


def input_items(request: dict[str, Any]) -> list[dict[str, Any]]:
    """The request's own ``input`` as stored items."""
    items = request.get("input")
    if isinstance(items, str):
        items = [{"role": "user", "content": items}]
    return [stored_item(i) for i in items or []]


def page(items: list[dict[str, Any]], *, after: str | None, limit: int, order: str) -> dict[str, Any]:
    """A ``list`` object of ``items`` in ``order`` after the item ``after``, at most ``limit``."""
    seq = items if order == "asc" else items[::-1]
    if after is not None:
        ids = [i.get("id") for i in seq]
        seq = seq[ids.index(after) + 1 :] if after in ids else []
    return list_object(seq[:limit], len(seq) > limit)


def list_object(data: list[dict[str, Any]], has_more: bool) -> dict[str, Any]:
    """A ``list`` object of kept items, each as the API lists it."""
    data = [listed_item(i) for i in data]
    return {
        "object": "list",
        "data": data,
        "first_id": data[0]["id"] if data else "",
        "last_id": data[-1]["id"] if data else "",
        "has_more": has_more,
    }


def list_query(query: dict[str, list[str]], *, default_order: str) -> tuple[str | None, int, str]:
    """``after``, ``limit`` (1 to 100, default 20) and ``order`` (asc / desc) of a list request."""

    def one(name: str) -> str | None:
        values = query.get(name)
        return values[-1] if values else None

    after = one("after")
    if after is not None:
        check_item_id(after, "after")
    raw = one("limit")
    if raw is None:
        limit = 20
    elif raw.isdigit() and 1 <= int(raw) <= 100:
        limit = int(raw)
    else:
        raise RequestError("limit", f"Invalid 'limit': {shown(raw)}. Expected an integer from 1 to 100.")
    order = one("order") or default_order
    if order not in ("asc", "desc"):
        raise RequestError("order", f"Invalid 'order': {shown(order)}. Expected 'asc' or 'desc'.")
    return after, limit, order


def check_metadata(metadata: Any, param: str = "metadata") -> dict[str, str]:
    """OpenAI's metadata rule: at most 16 pairs, keys up to 64 characters, string values up to 512."""
    if metadata is None:
        return {}
    if not isinstance(metadata, dict):
        raise RequestError(param, f"'{param}' must be an object of strings")
    if len(metadata) > 16:
        raise RequestError(param, f"'{param}' holds {len(metadata)} pairs; at most 16 are allowed")
    for k, v in metadata.items():
        if len(k) > 64:
            raise RequestError(param, f"'{param}' key {shown(k)} is longer than 64 characters")
        if not isinstance(v, str) or len(v) > 512:
            raise RequestError(param, f"'{param}.{k}' must be a string of at most 512 characters")
    return dict(metadata)
