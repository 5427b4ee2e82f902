"""The gateway's side of stored state: whose objects are whose, a request's history from
``previous_response_id`` or ``conversation``, the leases that vouch for responses being
generated, cancellation from any replica, and background streams that clients follow.

HTTP stays in app.py; SQL stays in store/. A store failure here is a StoreError, which the
gateway answers with the 503 that names the store (``unavailable``).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

from ..openai import RequestError
from ..openai.items import check_id, input_items
from ..store import ACTIVE, TERMINAL, Store, StoredResponse, StoreError
from ..store.sql import instance_id
from .errors import HTTPError

log = logging.getLogger("harmonykit.server")

#: The request key of whose request it is (reasoning is sealed, and kept, for that owner alone).
OWNER = "harmonykit.owner"

#: How often a follower in another process looks for new events of a background stream.
POLL_SECONDS = 0.1


def owner_of(key: str) -> str:
    """Who owns what a request stores: a digest of its API key (the key itself is never kept);
    "" when the gateway runs without keys."""
    return hashlib.sha256(key.encode("latin-1")).hexdigest()[:32] if key else ""


def not_found(kind: str, oid: str) -> HTTPError:
    """The 404 for an unknown id, and for another key's: the same words, nothing more."""
    return HTTPError(404, f"{kind} with id '{oid}' not found.", code="not_found")


def unavailable(e: StoreError) -> HTTPError:
    return HTTPError(503, e.message, code="store_unavailable")


class Live:
    """The events of a response generated in this process, for its followers here (a client
    streaming a background response, or one that came back): no store round trip."""

    def __init__(self) -> None:
        self.events: list[tuple[int, bytes]] = []
        self.done = False
        self._wake = asyncio.Event()

    def add(self, events: list[tuple[int, bytes]], *, done: bool = False) -> None:
        self.events += events
        self.done = self.done or done
        self._wake.set()
        self._wake = asyncio.Event()

    async def follow(self, after: int) -> AsyncIterator[list[bytes]]:
        i = 0
        while True:
            wake = self._wake
            fresh = [data for seq, data in self.events[i:] if seq > after]
            i = len(self.events)
            if fresh:
                yield fresh
            if self.done and i == len(self.events):
                return
            await wake.wait()


class EventWriter:
    """A background stream's events on their way to the store, for followers on other gateways:
    written as they come, a batch at a time, by one task of their own (generation never waits
    for the store), every one of them before the response is stored as ended."""

    def __init__(self, store: Store, rid: str) -> None:
        self.store, self.rid = store, rid
        self.pending: list[tuple[int, str]] = []
        self._task: asyncio.Task[None] | None = None

    def add(self, frames: list[tuple[int, bytes]]) -> None:
        self.pending += [(seq, frame.decode()) for seq, frame in frames]
        if self._task is None or self._task.done():
            self._task = asyncio.ensure_future(self._flush())

    async def _flush(self) -> None:
        while self.pending:
            batch, self.pending = self.pending, []
            await self.store.add_events(self.rid, batch)

    async def drain(self) -> None:
        """Every event written (raises the StoreError of a write that failed)."""
        task, self._task = self._task, None
        if task is not None:
            await task
        await self._flush()


class State:
    """Stored responses and conversations for one gateway process."""

    def __init__(self, store: Store, *, lease: float) -> None:
        self.store = store
        self.lease = lease
        self.instance = instance_id()  # the lease owner this process writes
        self.tasks: dict[str, asyncio.Task[None]] = {}  # background responses generated here
        self.live: dict[str, Live] = {}
        self.begun: set[str] = set()  # responses stored as started, leased to this process
        self._loop: asyncio.Task[None] | None = None

    async def start(self) -> None:
        await self.store.open()
        failed, deleted = await self.store.sweep()
        if failed or deleted:
            log.info(
                "store: %d responses of stopped gateways marked failed, %d expired objects deleted",
                failed,
                deleted,
            )
        self._loop = asyncio.ensure_future(self._keep())

    async def close(self) -> None:
        if self._loop is not None:
            self._loop.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._loop
        for task in list(self.tasks.values()):
            task.cancel()
        await asyncio.gather(*self.tasks.values(), return_exceptions=True)
        await self.store.close()

    async def _keep(self) -> None:
        """Renew this process's leases, stop what another replica cancelled, sweep now and then."""
        renewed = swept = time.monotonic()
        while True:
            await asyncio.sleep(0.25)
            try:
                now = time.monotonic()
                if self.begun and now - renewed >= self.lease / 3:
                    await self.store.renew(self.instance, time.time() + self.lease)
                    renewed = now
                if self.tasks:
                    for rid in await self.store.cancelled(self.instance, list(self.tasks)):
                        task = self.tasks.get(rid)
                        if task is not None:
                            task.cancel()
                if now - swept >= min(self.store.ttl / 10, 300.0):
                    await self.store.sweep()
                    swept = now
            except StoreError as e:  # the database is away: keep trying, say so once a round
                log.warning("store: %s", e.message)

    # -- a request's history ------------------------------------------------------

    async def expand(self, request: dict[str, Any], owner: str) -> dict[str, Any]:
        """The request with its history in front of its input: the chain of
        ``previous_response_id`` (each response's input, then its output), or the items of
        ``conversation``. ``instructions`` and tools stay the request's own."""
        request = await self._references(request, owner)
        previous, conversation = request.get("previous_response_id"), request.get("conversation")
        if previous is None and conversation is None:
            return request
        if previous is not None and conversation is not None:
            raise HTTPError(
                400,
                "Mutually exclusive parameters: Ensure you are only providing one of: "
                "'previous_response_id' or 'conversation'.",
                param="conversation",
                code="mutually_exclusive_parameters",
            )
        history: list[dict[str, Any]] = []
        if previous is not None:
            history = await self._chain_items(check_id(previous, "resp", "previous_response_id"), owner)
        else:
            cid = conversation_id(conversation)
            conv, items, _ = await self.store.items(owner, cid)
            if conv is None:
                raise not_found("Conversation", cid)
            history = items
        new = request.get("input")
        if isinstance(new, str):
            new = [{"role": "user", "content": new}]
        return {**request, "input": history + list(new or [])}

    # -- Chat: the chain of thought of a tool loop -------------------------------------

    async def restore_thoughts(self, request: dict[str, Any], owner: str) -> dict[str, Any]:
        """A Chat request with the reasoning of its current tool loop put back: an assistant message
        after the last user message that has tool calls and no ``reasoning_content`` (key absent or
        null; an empty string says "none") gets what the model reasoned before those calls, when
        this gateway (or a replica on the same store) generated them for this owner. Harmony keeps
        that reasoning until the calls' results are read; most Chat clients drop it. A store that
        fails costs only the restoring: the request goes on as sent."""
        messages = request.get("messages")
        if not isinstance(messages, list):
            return request
        users = [i for i, m in enumerate(messages) if isinstance(m, dict) and m.get("role") == "user"]
        wanted: dict[int, list[str]] = {}
        for i in range(users[-1] + 1 if users else 0, len(messages)):
            m = messages[i]
            if not isinstance(m, dict) or m.get("role") != "assistant":
                continue
            if not isinstance(m.get("tool_calls"), list):
                continue
            if m.get("reasoning_content") is not None or m.get("reasoning") is not None:
                continue  # the client sent it back (or said "none")
            ids = [c["id"] for c in m["tool_calls"] if isinstance(c, dict) and isinstance(c.get("id"), str)]
            if ids:
                wanted[i] = ids
        if not wanted:
            return request
        try:
            found = await self.store.thoughts(owner, [c for ids in wanted.values() for c in ids])
        except StoreError as e:
            log.warning("store: %s (a Chat tool loop's reasoning was not restored)", e.message)
            return request
        out = list(messages)
        for i, ids in wanted.items():
            text = next((found[c] for c in ids if c in found), None)
            if text is not None:
                out[i] = {**messages[i], "reasoning_content": text}
        return {**request, "messages": out}

    async def keep_thoughts(self, request: dict[str, Any], messages: list[dict[str, Any]]) -> None:
        """Chat completions' reasoning before their tool calls, kept by call id for the next step
        (``restore_thoughts``) unless the request said ``store: false``. Best effort: a failing
        store is logged, the answer still goes out."""
        if request.get("store") is False:
            return
        owner = str(request.get(OWNER))
        for message in messages:
            calls, text = message.get("tool_calls"), message.get("reasoning_content")
            if not calls or not isinstance(text, str) or not text:
                continue
            try:
                await self.store.keep_thought(owner, [c["id"] for c in calls if c.get("id")], text)
            except StoreError as e:
                log.warning("store: %s (a Chat tool loop's reasoning was not kept)", e.message)
                return

    async def _references(self, request: dict[str, Any], owner: str) -> dict[str, Any]:
        """``item_reference`` input items replaced by the stored items they name (the owner's)."""
        items = request.get("input")
        if not isinstance(items, list) or not any(
                isinstance(i, dict) and i.get("type") == "item_reference" for i in items):
            return request
        out = []
        for n, item in enumerate(items):
            if isinstance(item, dict) and item.get("type") == "item_reference":
                ref = item.get("id")
                found = await self.store.item(owner, ref) if isinstance(ref, str) and ref else None
                if found is None:
                    raise HTTPError(400, f"no stored item has id {ref!r} (an item_reference names an item of "
                                         "a stored response)", param=f"input[{n}].id", code="item_not_found")
                out.append(found)
            else:
                out.append(item)
        return {**request, "input": out}

    async def _chain_items(self, rid: str, owner: str) -> list[dict[str, Any]]:
        chain = await self.store.chain(owner, rid)
        if not chain or chain[-1].id != rid:
            raise HTTPError(
                400,
                f"Previous response with id '{rid}' not found.",
                param="previous_response_id",
                code="previous_response_not_found",
            )
        if chain[0].previous_id is not None:
            raise HTTPError(
                400,
                f"Previous response with id '{rid}' continues '{chain[0].previous_id}', "
                "which was deleted or has expired: the conversation cannot be rebuilt",
                param="previous_response_id",
                code="previous_response_not_found",
            )
        items: list[dict[str, Any]] = []
        for rec in chain:
            if rec.status in ACTIVE:
                raise HTTPError(
                    400,
                    f"Previous response with id '{rec.id}' is still {rec.status}: wait for "
                    f"it to end (GET /v1/responses/{rec.id})",
                    param="previous_response_id",
                )
            items += rec.items
        return items

    # -- a response's life ------------------------------------------------------------

    def record(
        self, response: dict[str, Any], request: dict[str, Any], own: Any, owner: str
    ) -> StoredResponse:
        """The record of a response about to be generated (``own``: its input as the client sent
        it, without the history in front), leased to this process; nothing stored yet."""
        conversation = request.get("conversation")
        return StoredResponse(
            id=response["id"],
            owner=owner,
            created_at=float(response["created_at"]),
            status=response["status"],
            background=bool(request.get("background")),
            body=response,
            input=input_items({"input": own}),
            previous_id=request.get("previous_response_id"),
            conversation_id=conversation_id(conversation) if conversation is not None else None,
            lease_owner=self.instance,
            lease_until=time.time() + self.lease,
        )

    async def begin(self, record: StoredResponse) -> None:
        """Store a response as it starts (one whose id a client sees before it ends: streamed, or
        in the background), so that it is never left in progress by a gateway that dies."""
        await self.store.create_response(record)
        self.begun.add(record.id)

    async def finish(self, record: StoredResponse, response: dict[str, Any]) -> bool:
        """Store a response as it ended (and append its input and output to its conversation, in
        the same transaction), before its last event goes out. A response never begun (answered
        whole) is stored in one write. False when it was cancelled meanwhile. Raises StoreError."""
        items = (
            record.input + list(response.get("output") or []) if record.conversation_id is not None else None
        )
        if record.id not in self.begun:
            final = replace(
                record, status=response["status"], body=response, lease_owner=None, lease_until=None
            )
            await self.store.create_response(final, items)
            return True
        try:
            return await self.store.finish_response(
                record.id, self.instance, response["status"], response, items
            )
        finally:
            self.begun.discard(record.id)

    async def abandon(self, record: StoredResponse, response: dict[str, Any], why: str) -> None:
        """A response that ends without an answer (the client left, the engine failed): failed, saying
        why, with what it produced (one never begun is not stored at all: no client knows its id).
        A store that fails here is logged: the lease runs out anyway."""
        if record.id not in self.begun:
            return
        failed = {**response, "status": "failed", "error": {"code": "server_error", "message": why}}
        try:
            await self.finish(record, failed)
        except StoreError as e:
            log.warning("store: %s (response %s stays leased until its lease runs out)", e.message, record.id)

    # -- reading -------------------------------------------------------------------------

    async def response(self, owner: str, rid: str) -> StoredResponse:
        rec = await self.store.get_response(owner, check_id(rid, "resp", "response_id"))
        if rec is None:
            raise not_found("Response", rid)
        return rec

    async def events(self, owner: str, rid: str, after: int) -> AsyncIterator[list[bytes]]:
        """A background stream's frames after sequence number ``after``, until it ends: from this
        process's memory when it generates it, else from the store."""
        live = self.live.get(rid)
        if live is not None:
            async for frames in live.follow(after):
                yield frames
            return
        while True:
            try:
                rec, events = await self.store.events(owner, rid, after)
            except StoreError as e:  # the stream has begun: its end is an error event, not a 503
                yield [_error_frame(e.message)]
                return
            if rec is None:
                return
            if events:
                after = events[-1][0]
                yield [data.encode() for _, data in events]
            elif rec.status in TERMINAL and rec.lease_owner is None:
                return  # ended, and its generator wrote its last events and let go
            else:
                await asyncio.sleep(POLL_SECONDS)

    async def cancel(self, owner: str, rid: str) -> StoredResponse:
        rec = await self.store.get_response(owner, check_id(rid, "resp", "response_id"))
        if rec is None:
            raise not_found("Response", rid)
        if not rec.background:
            raise HTTPError(
                400, "Only responses created with background=true can be cancelled.", param="response_id"
            )
        if rec.status in TERMINAL:
            return rec  # cancelling again, or after the end, changes nothing
        rec = await self.store.cancel_response(owner, rid) or rec
        task = self.tasks.get(rid)
        if task is not None:  # generated here: stop now (elsewhere, that replica sees it within 0.25 s)
            task.cancel()
        return rec


def conversation_id(value: Any) -> str:
    """``conversation`` as a request gives it: an id, or ``{"id": ...}``."""
    cid = value.get("id") if isinstance(value, dict) else value
    try:
        return check_id(cid, "conv", "conversation")
    except RequestError as e:
        raise HTTPError(400, e.message, param="conversation") from None


def _error_frame(message: str) -> bytes:
    import orjson

    return (
        b"event: error\ndata: "
        + orjson.dumps({"type": "error", "code": "store_unavailable", "message": message, "param": None})
        + b"\n\n"
    )
