"""The routes of stored state: ``/v1/responses/{id}`` (retrieve, stream again, delete, cancel,
input items) and the Conversations API. Thin: read the path, query and body; call the
state (server/state.py) and the store; answer as OpenAI does."""

from __future__ import annotations

import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs

import orjson

from ..openai import RequestError
from ..openai.items import (
    check_id,
    check_item_id,
    check_metadata,
    list_object,
    list_query,
    listed_item,
    page,
    stored_item,
)
from ..openai.request import read_responses_request
from ..openai.turn import new_id
from ..store import ACTIVE, Conversation
from .errors import HTTPError
from .state import not_found

if TYPE_CHECKING:
    from ..encoding import HarmonyEncoding
    from .state import State

Scope = dict[str, Any]
Message = dict[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
Route = Callable[[Scope, Receive, Send, dict[str, Any]], Awaitable[int]]

#: What ``include`` may name (the SDK's ``ResponseIncludable``): accepted; what is stored is shown whole.
INCLUDABLE = frozenset(
    {
        "file_search_call.results",
        "web_search_call.results",
        "web_search_call.action.sources",
        "message.input_image.image_url",
        "computer_call_output.output.image_url",
        "code_interpreter_call.outputs",
        "reasoning.encrypted_content",
        "message.output_text.logprobs",
    }
)
MAX_ITEMS_AT_ONCE = 20  # OpenAI's limit on items in one create call


def pattern(template: str) -> re.Pattern[str]:
    """``/v1/responses/{response_id}`` -> a regex with a named group per id."""
    return re.compile(re.sub(r"\{(\w+)\}", r"(?P<\1>[^/]+)", template))


async def json_response(send: Send, status: int, body: Any) -> None:
    data = orjson.dumps(body)
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())],
        }
    )
    await send({"type": "http.response.body", "body": data})


def _query(scope: Scope) -> dict[str, list[str]]:
    raw = parse_qs(scope.get("query_string", b"").decode("latin-1"), keep_blank_values=True)
    # include=a&include=b and include[]=a&include[]=b (the SDK's) alike
    return {k.removesuffix("[]"): v for k, v in raw.items()}


def _include(query: dict[str, list[str]]) -> list[str]:
    values = [v for raw in query.get("include", []) for v in raw.split(",") if v]
    for v in values:
        if v not in INCLUDABLE:
            raise RequestError(
                "include",
                f"Invalid 'include' value {v!r}. Supported values are: "
                + ", ".join(sorted(INCLUDABLE))
                + ".",
            )
    return values


def _flag(query: dict[str, list[str]], name: str) -> bool:
    value = (query.get(name) or ["false"])[-1].lower()
    if value not in ("true", "false", "1", "0"):
        raise RequestError(name, f"Invalid '{name}': {value!r}. Expected true or false.")
    return value in ("true", "1")


def _items_of(body: dict[str, Any], encoding: HarmonyEncoding, *, required: bool) -> list[dict[str, Any]]:
    """``items`` of a create call, checked as input items are (what cannot be rendered is refused now,
    not when a response uses the conversation)."""
    items = body.get("items")
    if items is None and not required:
        return []
    if not isinstance(items, list) or (required and not items):
        raise RequestError("items", "items must be a non-empty list of input items")
    if len(items) > MAX_ITEMS_AT_ONCE:
        raise RequestError(
            "items", f"items holds {len(items)} items; at most {MAX_ITEMS_AT_ONCE} can be added at a time"
        )
    if items:
        try:
            read_responses_request(encoding, {"input": items}, cache=False)
        except RequestError as e:
            param = (e.param or "items").replace("input", "items", 1)
            raise RequestError(param, e.message.replace("input", "items", 1)) from None
    return [stored_item(i) for i in items]


class StatefulRoutes:
    """The stored-state routes, as a part of the gateway (which gives these attributes)."""

    state: State | None
    encoding: HarmonyEncoding

    if TYPE_CHECKING:

        def _authorize(self, scope: Scope) -> str: ...
        async def _read_body(self, scope: Scope, receive: Receive) -> bytes: ...
        async def _follow(self, send: Send, receive: Receive, frames: AsyncIterator[list[bytes]]) -> int: ...

    def stateful_routes(self) -> dict[tuple[str, str], Route]:
        r = "/v1/responses/{response_id}"
        c = "/v1/conversations/{conversation_id}"
        return {
            ("GET", r): self._retrieve,
            ("DELETE", r): self._delete,
            ("POST", r + "/cancel"): self._cancel,
            ("GET", r + "/input_items"): self._input_items,
            ("POST", "/v1/conversations"): self._create_conversation,
            ("GET", c): self._conversation,
            ("POST", c): self._update_conversation,
            ("DELETE", c): self._delete_conversation,
            ("POST", c + "/items"): self._add_items,
            ("GET", c + "/items"): self._list_items,
            ("GET", c + "/items/{item_id}"): self._item,
            ("DELETE", c + "/items/{item_id}"): self._delete_item,
        }

    def _stateful(self, scope: Scope) -> tuple[State, str]:
        owner = self._authorize(scope)
        if self.state is None:
            raise HTTPError(
                400,
                "stored responses and conversations are off on this gateway (--store none); "
                "send the whole conversation in input",
                code="store_disabled",
            )
        return self.state, owner

    async def _body(self, scope: Scope, receive: Receive) -> dict[str, Any]:
        data = await self._read_body(scope, receive)
        try:
            body = orjson.loads(data) if data.strip() else {}
        except orjson.JSONDecodeError as e:
            raise HTTPError(400, f"the body is not valid JSON: {e}", code="invalid_json") from None
        if not isinstance(body, dict):
            raise HTTPError(400, "the request body must be a JSON object")
        return body

    # -- /v1/responses/{id} --------------------------------------------------------

    async def _retrieve(self, scope: Scope, receive: Receive, send: Send, info: dict[str, Any]) -> int:
        state, owner = self._stateful(scope)
        query = _query(scope)
        _include(query)
        rid = scope["path_params"]["response_id"]
        rec = await state.response(owner, rid)
        if not _flag(query, "stream"):
            await json_response(send, 200, rec.response)
            return 200
        if not rec.background:
            raise HTTPError(
                400, "Only responses created with background=true can be streamed again.", param="stream"
            )
        raw = (query.get("starting_after") or ["-1"])[-1]
        if not raw.lstrip("-").isdigit():
            raise RequestError("starting_after", f"Invalid 'starting_after': {raw!r}. Expected an integer.")
        return await self._follow(send, receive, state.events(owner, rid, int(raw)))

    async def _delete(self, scope: Scope, receive: Receive, send: Send, info: dict[str, Any]) -> int:
        state, owner = self._stateful(scope)
        rid = check_id(scope["path_params"]["response_id"], "resp", "response_id")
        rec = await state.store.get_response(owner, rid)
        if rec is not None and rec.background and rec.status in ACTIVE:
            await state.cancel(owner, rid)  # deleted while generated: stopped, wherever it runs
        deleted = await state.store.delete_response(owner, rid)
        if not deleted:
            raise not_found("Response", rid)
        await json_response(send, 200, {"id": rid, "object": "response", "deleted": True})
        return 200

    async def _cancel(self, scope: Scope, receive: Receive, send: Send, info: dict[str, Any]) -> int:
        state, owner = self._stateful(scope)
        rec = await state.cancel(owner, scope["path_params"]["response_id"])
        await json_response(send, 200, rec.response)
        return 200

    async def _input_items(self, scope: Scope, receive: Receive, send: Send, info: dict[str, Any]) -> int:
        state, owner = self._stateful(scope)
        query = _query(scope)
        _include(query)
        after, limit, order = list_query(query, default_order="desc")
        rec = await state.response(owner, scope["path_params"]["response_id"])
        await json_response(send, 200, page(rec.input, after=after, limit=limit, order=order))
        return 200

    # -- /v1/conversations ---------------------------------------------------------------

    async def _conv(self, state: State, owner: str, cid: str) -> Conversation:
        cid = check_id(cid, "conv", "conversation_id")
        conv = await state.store.get_conversation(owner, cid)
        if conv is None:
            raise not_found("Conversation", cid)
        return conv

    async def _create_conversation(
        self, scope: Scope, receive: Receive, send: Send, info: dict[str, Any]
    ) -> int:
        state, owner = self._stateful(scope)
        body = await self._body(scope, receive)
        for key in body:
            if key not in ("items", "metadata"):
                raise RequestError(key, f"unrecognized request argument supplied: {key}")
        conv = Conversation(new_id("conv"), owner, int(time.time()), check_metadata(body.get("metadata")))
        items = _items_of(body, self.encoding, required=False)
        await state.store.create_conversation(conv, items)
        await json_response(send, 200, conv.object())
        return 200

    async def _conversation(self, scope: Scope, receive: Receive, send: Send, info: dict[str, Any]) -> int:
        state, owner = self._stateful(scope)
        conv = await self._conv(state, owner, scope["path_params"]["conversation_id"])
        await json_response(send, 200, conv.object())
        return 200

    async def _update_conversation(
        self, scope: Scope, receive: Receive, send: Send, info: dict[str, Any]
    ) -> int:
        state, owner = self._stateful(scope)
        body = await self._body(scope, receive)
        if "metadata" not in body:
            raise RequestError("metadata", "metadata is required: the conversation's new metadata")
        metadata = check_metadata(body["metadata"])
        cid = check_id(scope["path_params"]["conversation_id"], "conv", "conversation_id")
        conv = await state.store.update_conversation(owner, cid, metadata)
        if conv is None:
            raise not_found("Conversation", cid)
        await json_response(send, 200, conv.object())
        return 200

    async def _delete_conversation(
        self, scope: Scope, receive: Receive, send: Send, info: dict[str, Any]
    ) -> int:
        state, owner = self._stateful(scope)
        cid = check_id(scope["path_params"]["conversation_id"], "conv", "conversation_id")
        deleted = await state.store.delete_conversation(owner, cid)
        if not deleted:
            raise not_found("Conversation", cid)
        await json_response(send, 200, {"id": cid, "object": "conversation.deleted", "deleted": True})
        return 200

    async def _add_items(self, scope: Scope, receive: Receive, send: Send, info: dict[str, Any]) -> int:
        state, owner = self._stateful(scope)
        _include(_query(scope))
        cid = check_id(scope["path_params"]["conversation_id"], "conv", "conversation_id")
        items = _items_of(await self._body(scope, receive), self.encoding, required=True)
        added = await state.store.add_items(owner, cid, items)
        if not added:
            raise not_found("Conversation", cid)
        await json_response(send, 200, list_object(items, False))
        return 200

    async def _list_items(self, scope: Scope, receive: Receive, send: Send, info: dict[str, Any]) -> int:
        state, owner = self._stateful(scope)
        query = _query(scope)
        _include(query)
        after, limit, order = list_query(query, default_order="desc")
        cid = check_id(scope["path_params"]["conversation_id"], "conv", "conversation_id")
        conv, items, more = await state.store.items(owner, cid, after=after, limit=limit, order=order)
        if conv is None:
            raise not_found("Conversation", cid)
        await json_response(send, 200, list_object(items, more))
        return 200

    async def _item(self, scope: Scope, receive: Receive, send: Send, info: dict[str, Any]) -> int:
        state, owner = self._stateful(scope)
        _include(_query(scope))
        cid = check_id(scope["path_params"]["conversation_id"], "conv", "conversation_id")
        item_id = check_item_id(scope["path_params"]["item_id"], "item_id")
        conv, item = await state.store.get_item(owner, cid, item_id)
        if conv is None:
            raise not_found("Conversation", cid)
        if item is None:
            raise not_found("Item", item_id)
        await json_response(send, 200, listed_item(item))
        return 200

    async def _delete_item(self, scope: Scope, receive: Receive, send: Send, info: dict[str, Any]) -> int:
        state, owner = self._stateful(scope)
        cid = check_id(scope["path_params"]["conversation_id"], "conv", "conversation_id")
        item_id = check_item_id(scope["path_params"]["item_id"], "item_id")
        conv, deleted = await state.store.delete_item(owner, cid, item_id)
        if conv is None:
            raise not_found("Conversation", cid)
        if not deleted:
            raise not_found("Item", item_id)
        await json_response(send, 200, conv.object())
        return 200
