"""The store's SQL, written once for every backend (``?`` placeholders, portable types),
run in worker threads over the backend's DB-API connections.

Each public method is one transaction. Writers that must not interleave take a row
lock first (``UPDATE ... RETURNING`` on the conversation's counter), so concurrent
responses on one conversation append whole blocks of items, in order, with none lost.
"""

from __future__ import annotations

import asyncio
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Protocol, TypeVar

import orjson

from .records import ACTIVE, ChainLink, Conversation, StoredResponse

T = TypeVar("T")
Row = Sequence[Any]

SCHEMA_VERSION = 1


class StoreError(Exception):
    """The store failed or took too long; ``message`` names the store (the gateway's 503)."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class Backend(Protocol):
    """One database: how to connect, and what its SQL differs in."""

    name: str  # shown in errors: the driver and where (never a password)
    placeholder: str  # the driver's parameter marker for "?"
    float_type: str
    begin: str | None  # the statement that opens a write transaction (None: the driver's own)
    workers: int  # connections (threads) a gateway process uses
    errors: tuple[type[BaseException], ...]  # what means "the database failed"

    def connect(self) -> Any: ...

    def prepare(self) -> None:
        """Once, before the first connection (create the file's folder, say)."""


_ACTIVE = "('" + "','".join(ACTIVE) + "')"

_SCHEMA = [
    """CREATE TABLE IF NOT EXISTS hk_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)""",
    """CREATE TABLE IF NOT EXISTS hk_responses (
        id TEXT PRIMARY KEY, owner TEXT NOT NULL, created_at {float} NOT NULL,
        expires_at {float} NOT NULL, status TEXT NOT NULL, background INTEGER NOT NULL,
        previous_id TEXT, conversation_id TEXT, body TEXT NOT NULL, input TEXT NOT NULL,
        output TEXT NOT NULL, error TEXT, lease_owner TEXT, lease_until {float})""",
    """CREATE INDEX IF NOT EXISTS hk_responses_active ON hk_responses (status, lease_until)""",
    """CREATE INDEX IF NOT EXISTS hk_responses_expiry ON hk_responses (expires_at)""",
    """CREATE TABLE IF NOT EXISTS hk_events (
        response_id TEXT NOT NULL, seq INTEGER NOT NULL, data TEXT NOT NULL,
        PRIMARY KEY (response_id, seq))""",
    """CREATE TABLE IF NOT EXISTS hk_conversations (
        id TEXT PRIMARY KEY, owner TEXT NOT NULL, created_at INTEGER NOT NULL,
        expires_at {float} NOT NULL, metadata TEXT NOT NULL, next_pos INTEGER NOT NULL)""",
    """CREATE INDEX IF NOT EXISTS hk_conversations_expiry ON hk_conversations (expires_at)""",
    """CREATE TABLE IF NOT EXISTS hk_items (
        conversation_id TEXT NOT NULL, pos INTEGER NOT NULL, id TEXT NOT NULL, item TEXT NOT NULL,
        PRIMARY KEY (conversation_id, pos))""",
    """CREATE UNIQUE INDEX IF NOT EXISTS hk_items_id ON hk_items (conversation_id, id)""",
    # Which stored response holds an item (its input or output), by the item's id: what an
    # item_reference resolves (the Vercel AI SDK refers to earlier reasoning items so).
    """CREATE TABLE IF NOT EXISTS hk_refs (
        owner TEXT NOT NULL, item_id TEXT NOT NULL, response_id TEXT NOT NULL,
        PRIMARY KEY (owner, item_id))""",
    """CREATE INDEX IF NOT EXISTS hk_refs_response ON hk_refs (response_id)""",
    # The model's reasoning before the tool calls of a Chat completion, by call id: Chat clients
    # seldom send reasoning back, and gpt-oss needs it until the call's result is read.
    """CREATE TABLE IF NOT EXISTS hk_thoughts (
        owner TEXT NOT NULL, call_id TEXT NOT NULL, text TEXT NOT NULL, expires_at {float} NOT NULL,
        PRIMARY KEY (owner, call_id))""",
    """CREATE INDEX IF NOT EXISTS hk_thoughts_expiry ON hk_thoughts (expires_at)""",
]

THOUGHT_TTL = 86400.0  # a tool loop's reasoning is kept a day at most (or the store's TTL, if shorter)

_RESPONSE_COLUMNS = (
    "id, owner, created_at, status, background, body, input, previous_id, conversation_id, "
    "lease_owner, lease_until, error"
)


def instance_id() -> str:
    """This gateway process, as a lease names its owner: host, pid and a random part."""
    return f"{socket.gethostname()}/{os.getpid()}/{uuid.uuid4().hex[:8]}"


def _owner_gone(lease_owner: str | None, lease_until: float | None, now: float) -> bool:
    """Whether a response's generator is gone: its lease ran out, or it is a process of this
    host that no longer runs (a gateway killed and restarted need not wait for its lease)."""
    if lease_owner is None or lease_until is None or lease_until < now:
        return True
    host, _, rest = lease_owner.partition("/")
    pid = rest.partition("/")[0]
    if host != socket.gethostname() or not pid.isdigit():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


_GONE = orjson.dumps(
    {"code": "server_error", "message": "the gateway generating this response stopped before it ended"}
).decode()


class Tx:
    """One transaction's statements, on one connection."""

    def __init__(self, cursor: Any, placeholder: str, float_type: str) -> None:
        self._cursor = cursor
        self._placeholder = placeholder
        self._float = float_type

    def sql(self, statement: str) -> str:
        statement = statement.replace("{float}", self._float)
        return statement if self._placeholder == "?" else statement.replace("?", self._placeholder)

    def run(self, statement: str, args: Sequence[Any] = ()) -> int:
        self._cursor.execute(self.sql(statement), tuple(args))
        return int(self._cursor.rowcount)

    def many(self, statement: str, rows: Iterable[Sequence[Any]]) -> None:
        rows = [tuple(r) for r in rows]
        if rows:
            self._cursor.executemany(self.sql(statement), rows)

    def all(self, statement: str, args: Sequence[Any] = ()) -> list[Row]:
        self._cursor.execute(self.sql(statement), tuple(args))
        return list(self._cursor.fetchall())

    def one(self, statement: str, args: Sequence[Any] = ()) -> Row | None:
        rows = self.all(statement, args)
        return rows[0] if rows else None


def _record(row: Row) -> StoredResponse:
    (
        rid,
        owner,
        created,
        status,
        background,
        body,
        items,
        previous,
        conversation,
        lease_owner,
        lease_until,
        error,
    ) = row
    data = orjson.loads(body)
    if error is not None:
        data["error"] = orjson.loads(error)
    return StoredResponse(
        rid,
        owner,
        float(created),
        status,
        bool(background),
        data,
        orjson.loads(items),
        previous,
        conversation,
        lease_owner,
        float(lease_until) if lease_until is not None else None,
    )


def _settle(future: asyncio.Future[Any], result: Any, error: BaseException | None) -> None:
    if not future.done():  # a late answer after the timeout, or a waiter gone: dropped
        if error is None:
            future.set_result(result)
        else:
            future.set_exception(error)


def _dumps(obj: Any) -> str:
    return orjson.dumps(obj).decode()


class Store:
    """The gateway's state over one :class:`Backend`; every method is async and runs its SQL
    in a worker thread, within ``timeout`` seconds."""

    def __init__(self, backend: Backend, *, ttl: float, timeout: float) -> None:
        self.backend = backend
        self.name = backend.name
        self.ttl = ttl
        self.timeout = timeout
        self._pool = ThreadPoolExecutor(max_workers=backend.workers, thread_name_prefix="harmonykit-store")
        self._local = threading.local()
        self._opened = False

    # -- running SQL -------------------------------------------------------------

    def _connection(self) -> Any:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = self._local.conn = self.backend.connect()
        return conn

    def _transact(self, write: bool, fn: Callable[..., T], *args: Any) -> T:
        try:
            conn = self._connection()
            cursor = conn.cursor()
            try:
                if write and self.backend.begin:  # a read is its own statement's snapshot
                    cursor.execute(self.backend.begin)
                result = fn(Tx(cursor, self.backend.placeholder, self.backend.float_type), *args)
                conn.commit()
                return result
            except BaseException:
                try:
                    conn.rollback()
                except self.backend.errors:
                    self._drop()
                raise
            finally:
                cursor.close()
        except self.backend.errors as e:
            self._drop()  # a broken connection is opened again by the next call
            detail = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise StoreError(f"the store ({self.name}) failed: {detail}") from None

    def _drop(self) -> None:
        conn, self._local.conn = getattr(self._local, "conn", None), None
        if conn is not None:
            try:
                conn.close()
            except Exception:
                pass

    async def _read(self, fn: Callable[..., T], *args: Any) -> T:
        """A call that mostly reads: no write lock taken up front (SQLite's BEGIN IMMEDIATE), so
        readers on other gateway processes never queue behind it."""
        return await self._run(fn, *args, write=False)

    async def _run(self, fn: Callable[..., T], *args: Any, write: bool = True) -> T:
        # One future the worker thread resolves, and one timer: no wrapping task (wait_for's) on
        # the path every stored request takes several times.
        loop = asyncio.get_running_loop()
        done: asyncio.Future[T] = loop.create_future()

        def work() -> None:
            try:
                result = self._transact(write, fn, *args)
            except BaseException as e:
                loop.call_soon_threadsafe(_settle, done, None, e)
            else:
                loop.call_soon_threadsafe(_settle, done, result, None)

        self._pool.submit(work)
        late = StoreError(f"the store ({self.name}) did not answer within {self.timeout:g} s")
        timer = loop.call_later(self.timeout, _settle, done, None, late)
        try:
            return await done
        finally:
            timer.cancel()

    async def open(self) -> None:
        """Create the tables (once; safe from many gateways at once)."""
        if not self._opened:
            await asyncio.get_running_loop().run_in_executor(self._pool, self.backend.prepare)
            await self._run(_create_schema)
            self._opened = True

    async def close(self) -> None:
        def close_all() -> None:
            self._drop()

        futures = [
            asyncio.get_running_loop().run_in_executor(self._pool, close_all)
            for _ in range(self.backend.workers)
        ]
        await asyncio.gather(*futures, return_exceptions=True)
        self._pool.shutdown(wait=False)

    # -- responses ---------------------------------------------------------------

    async def create_response(
        self, record: StoredResponse, conversation_items: list[dict[str, Any]] | None = None
    ) -> None:
        """Insert a response: as it starts (``queued`` / ``in_progress``, leased by its generator), or
        ended, with its input and output appended to its conversation in the same transaction."""
        await self._run(_insert_response, record, record.created_at + self.ttl, conversation_items)

    async def finish_response(
        self,
        rid: str,
        lease_owner: str,
        status: str,
        body: dict[str, Any],
        conversation_items: list[dict[str, Any]] | None = None,
    ) -> bool:
        """End a response this generator holds: its final body, and (one transaction) its input and
        output appended to its conversation. False when it was cancelled or taken over meanwhile."""
        return await self._run(
            _finish_response, rid, lease_owner, status, body, conversation_items, time.time() + self.ttl
        )

    async def start_response(self, rid: str, lease_owner: str) -> None:
        """A background response leaves the queue: ``queued`` -> ``in_progress``."""
        await self._run(_start_response, rid, lease_owner)

    async def get_response(self, owner: str, rid: str) -> StoredResponse | None:
        """The response (None when unknown, expired or another owner's); one whose generator is
        gone is marked ``failed`` first."""
        return await self._read(_get_response, owner, rid, time.time())

    async def chain(self, owner: str, rid: str) -> list[ChainLink]:
        """The response and those it continues, oldest first (stops at a missing link)."""
        return await self._read(_chain, owner, rid, time.time())

    async def item(self, owner: str, item_id: str) -> dict[str, Any] | None:
        """An item of one of the owner's stored responses (its input or output), by its id."""
        return await self._read(_item, owner, item_id, time.time())

    async def keep_thought(self, owner: str, call_ids: Sequence[str], text: str) -> None:
        """The reasoning that led to these tool calls (a Chat completion's), kept for the owner."""
        await self._run(_keep_thought, owner, list(call_ids), text, time.time() + min(self.ttl, THOUGHT_TTL))

    async def thoughts(self, owner: str, call_ids: Sequence[str]) -> dict[str, str]:
        """The kept reasoning of these calls of the owner's, by call id (the ones found)."""
        return await self._read(_thoughts, owner, list(call_ids), time.time())

    async def delete_response(self, owner: str, rid: str) -> bool:
        return await self._run(_delete_response, owner, rid, time.time())

    async def cancel_response(self, owner: str, rid: str) -> StoredResponse | None:
        """Mark an active background response ``cancelled`` (its generator, wherever it runs, sees
        it and stops); a finished one is returned as it is."""
        return await self._run(_cancel_response, owner, rid, time.time())

    async def cancelled(self, lease_owner: str, running: list[str] | None = None) -> list[str]:
        """Responses this generator holds that were cancelled (from any gateway), and those of
        ``running`` that were deleted meanwhile."""
        return await self._read(_cancelled, lease_owner, list(running or ()))

    async def renew(self, lease_owner: str, until: float) -> None:
        await self._run(_renew, lease_owner, until)

    async def sweep(self) -> tuple[int, int]:
        """Mark active responses whose generators are gone ``failed``; delete expired objects.
        Returns (failed, deleted)."""
        return await self._run(_sweep, time.time())

    async def add_events(self, rid: str, events: list[tuple[int, str]]) -> None:
        """A background stream's events (sequence number, JSON), for clients that resume."""
        await self._run(_add_events, rid, events)

    async def events(
        self, owner: str, rid: str, after: int
    ) -> tuple[StoredResponse | None, list[tuple[int, str]]]:
        """The response now, and its stored events numbered above ``after``."""
        return await self._read(_events, owner, rid, after, time.time())

    # -- conversations -----------------------------------------------------------

    async def create_conversation(self, conv: Conversation, items: list[dict[str, Any]]) -> None:
        await self._run(_create_conversation, conv, items, time.time() + self.ttl)

    async def get_conversation(self, owner: str, cid: str) -> Conversation | None:
        return await self._read(_get_conversation, owner, cid, time.time())

    async def update_conversation(
        self, owner: str, cid: str, metadata: dict[str, Any]
    ) -> Conversation | None:
        return await self._run(_update_conversation, owner, cid, metadata, time.time(), self.ttl)

    async def delete_conversation(self, owner: str, cid: str) -> bool:
        return await self._run(_delete_conversation, owner, cid, time.time())

    async def add_items(self, owner: str, cid: str, items: list[dict[str, Any]]) -> bool:
        """Append items (ids set) at the conversation's end; False when it is unknown."""
        return await self._run(_add_items, owner, cid, items, time.time(), self.ttl)

    async def items(
        self, owner: str, cid: str, *, after: str | None = None, limit: int | None = None, order: str = "asc"
    ) -> tuple[Conversation | None, list[dict[str, Any]], bool]:
        """The conversation, its items in ``order`` after the item ``after`` (at most ``limit``),
        and whether more follow. ``after`` unknown: no items."""
        return await self._read(_items, owner, cid, after, limit, order, time.time())

    async def get_item(
        self, owner: str, cid: str, item_id: str
    ) -> tuple[Conversation | None, dict[str, Any] | None]:
        return await self._read(_get_item, owner, cid, item_id, time.time())

    async def delete_item(self, owner: str, cid: str, item_id: str) -> tuple[Conversation | None, bool]:
        return await self._run(_delete_item, owner, cid, item_id, time.time())


# -- the transactions (run in a worker thread) ---------------------------------------


def _create_schema(tx: Tx) -> None:
    for statement in _SCHEMA:
        tx.run(statement)
    if tx.one("SELECT value FROM hk_meta WHERE key = 'schema'") is None:
        tx.run(
            "INSERT INTO hk_meta (key, value) VALUES ('schema', ?) ON CONFLICT (key) DO NOTHING",
            (str(SCHEMA_VERSION),),
        )


def _insert_response(
    tx: Tx, r: StoredResponse, expires: float, items: list[dict[str, Any]] | None = None
) -> None:
    tx.run(
        f"INSERT INTO hk_responses ({_RESPONSE_COLUMNS}, expires_at, output) "
        "VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
        (
            r.id,
            r.owner,
            r.created_at,
            r.status,
            int(r.background),
            _dumps(r.body),
            _dumps(r.input),
            r.previous_id,
            r.conversation_id,
            r.lease_owner,
            r.lease_until,
            None,
            expires,
            _dumps(r.body.get("output") or []),
        ),
    )
    if r.conversation_id is not None and items:
        _append(tx, r.owner, r.conversation_id, items, expires)
    _index(tx, r.owner, r.id, [*r.input, *(r.body.get("output") or [])])


def _index(tx: Tx, owner: str, rid: str, items: list[Any]) -> None:
    """Note which response holds each of these items (by id), for item_reference."""
    ids = {i["id"] for i in items if isinstance(i, dict) and isinstance(i.get("id"), str)}
    if ids:
        tx.many("INSERT INTO hk_refs (owner, item_id, response_id) VALUES (?,?,?) "
                "ON CONFLICT (owner, item_id) DO UPDATE SET response_id = excluded.response_id",
                [(owner, i, rid) for i in sorted(ids)])


def _item(tx: Tx, owner: str, item_id: str, now: float) -> dict[str, Any] | None:
    row = tx.one("SELECT r.input, r.output FROM hk_refs f JOIN hk_responses r ON r.id = f.response_id "
                 "WHERE f.owner = ? AND f.item_id = ? AND r.owner = ? AND r.expires_at > ?",
                 (owner, item_id, owner, now))
    if row is None:
        return None
    for item in [*orjson.loads(row[0]), *orjson.loads(row[1])]:
        if isinstance(item, dict) and item.get("id") == item_id:
            return dict(item)
    return None


def _keep_thought(tx: Tx, owner: str, call_ids: list[str], text: str, expires: float) -> None:
    tx.many("INSERT INTO hk_thoughts (owner, call_id, text, expires_at) VALUES (?,?,?,?) "
            "ON CONFLICT (owner, call_id) DO UPDATE SET text = excluded.text, "
            "expires_at = excluded.expires_at",
            [(owner, c, text, expires) for c in sorted(set(call_ids))])


def _thoughts(tx: Tx, owner: str, call_ids: list[str], now: float) -> dict[str, str]:
    ids = sorted(set(call_ids))[:128]
    if not ids:
        return {}
    marks = ",".join("?" * len(ids))
    rows = tx.all("SELECT call_id, text FROM hk_thoughts WHERE owner = ? AND expires_at > ? "
                  f"AND call_id IN ({marks})", (owner, now, *ids))
    return {r[0]: r[1] for r in rows}


def _finish_response(
    tx: Tx,
    rid: str,
    lease_owner: str,
    status: str,
    body: dict[str, Any],
    items: list[dict[str, Any]] | None,
    expires: float,
) -> bool:
    row = tx.one(
        "SELECT owner, conversation_id, status FROM hk_responses WHERE id = ? AND lease_owner = ?",
        (rid, lease_owner),
    )
    if row is None or row[2] not in (*ACTIVE, "cancelled"):
        return False  # taken over: marked failed by another gateway that found its lease gone
    owner, conversation, now_status = row
    cancelled = now_status == "cancelled"  # cancelled meanwhile: it stays so, with what it produced
    body = {k: v for k, v in body.items() if k != "status"}
    error = None if cancelled else body.pop("error", None)
    body.pop("error", None)
    tx.run(
        "UPDATE hk_responses SET status = ?, body = ?, output = ?, error = ?, lease_owner = NULL, "
        "lease_until = NULL, expires_at = ? WHERE id = ?",
        (
            now_status if cancelled else status,
            _dumps({**body, "error": None}),
            _dumps(body.get("output") or []),
            None if error is None else _dumps(error),
            expires,
            rid,
        ),
    )
    if conversation is not None and items and not cancelled:
        _append(tx, owner, conversation, items, expires)
    _index(tx, owner, rid, body.get("output") or [])
    return not cancelled


def _start_response(tx: Tx, rid: str, lease_owner: str) -> None:
    tx.run(
        "UPDATE hk_responses SET status = 'in_progress' "
        "WHERE id = ? AND lease_owner = ? AND status = 'queued'",
        (rid, lease_owner),
    )


def _fail_if_gone(tx: Tx, rec: StoredResponse, now: float) -> StoredResponse:
    if rec.status in ACTIVE and _owner_gone(rec.lease_owner, rec.lease_until, now):
        tx.run(
            f"UPDATE hk_responses SET status = 'failed', error = ?, lease_owner = NULL, lease_until = NULL "
            f"WHERE id = ? AND status IN {_ACTIVE}",
            (_GONE, rec.id),
        )
        row = tx.one(f"SELECT {_RESPONSE_COLUMNS} FROM hk_responses WHERE id = ?", (rec.id,))
        assert row is not None
        return _record(row)
    return rec


def _get_response(tx: Tx, owner: str, rid: str, now: float) -> StoredResponse | None:
    row = tx.one(
        f"SELECT {_RESPONSE_COLUMNS} FROM hk_responses WHERE id = ? AND owner = ? AND expires_at > ?",
        (rid, owner, now),
    )
    return None if row is None else _fail_if_gone(tx, _record(row), now)


def _chain(tx: Tx, owner: str, rid: str, now: float) -> list[ChainLink]:
    # Only what a continuation needs of each response (its input, its output): never its body.
    # The rows are carried through the recursion (no join back), newest first.
    cols = "id, previous_id, status, input, output, lease_owner, lease_until"
    rows = tx.all(
        f"WITH RECURSIVE chain({cols}, depth) AS ("
        f" SELECT {cols}, 0 FROM hk_responses WHERE id = ? AND owner = ? AND expires_at > ?"
        f" UNION ALL SELECT {', '.join('r.' + c for c in cols.split(', '))}, c.depth + 1 FROM hk_responses r"
        " JOIN chain c ON r.id = c.previous_id WHERE r.owner = ? AND r.expires_at > ?)"
        f" SELECT {cols}, depth FROM chain",
        (rid, owner, now, owner, now),
    )
    rows.sort(key=lambda row: -row[-1])  # oldest first (a CTE's order is not promised)
    links = []
    for link_id, previous, status, items, output, lease_owner, lease_until, _ in rows:
        if status in ACTIVE and _owner_gone(lease_owner, lease_until, now):
            got = _get_response(tx, owner, link_id, now)  # marks it failed
            status = got.status if got is not None else "failed"
        links.append(ChainLink(link_id, previous, status, orjson.loads(items) + orjson.loads(output)))
    return links


def _delete_response(tx: Tx, owner: str, rid: str, now: float) -> bool:
    if (
        tx.run("DELETE FROM hk_responses WHERE id = ? AND owner = ? AND expires_at > ?", (rid, owner, now))
        < 1
    ):
        return False
    tx.run("DELETE FROM hk_events WHERE response_id = ?", (rid,))
    tx.run("DELETE FROM hk_refs WHERE response_id = ?", (rid,))
    return True


def _cancel_response(tx: Tx, owner: str, rid: str, now: float) -> StoredResponse | None:
    rec = _get_response(tx, owner, rid, now)
    if rec is None or not rec.background or rec.status not in ACTIVE:
        return rec
    # The lease stays with its generator: it sees "cancelled", aborts the engine and lets go.
    tx.run(f"UPDATE hk_responses SET status = 'cancelled' WHERE id = ? AND status IN {_ACTIVE}", (rid,))
    return _get_response(tx, owner, rid, now)


def _cancelled(tx: Tx, lease_owner: str, running: list[str]) -> list[str]:
    ids = [
        r[0]
        for r in tx.all(
            "SELECT id FROM hk_responses WHERE lease_owner = ? AND status = 'cancelled'", (lease_owner,)
        )
    ]
    if running:  # deleted while generated: stopped as if cancelled
        marks = ",".join("?" * len(running))
        present = {r[0] for r in tx.all(f"SELECT id FROM hk_responses WHERE id IN ({marks})", running)}
        ids += [rid for rid in running if rid not in present]
    return ids


def _renew(tx: Tx, lease_owner: str, until: float) -> None:
    tx.run(
        f"UPDATE hk_responses SET lease_until = ? WHERE lease_owner = ? AND status IN {_ACTIVE}",
        (until, lease_owner),
    )


def _sweep(tx: Tx, now: float) -> tuple[int, int]:
    failed = 0
    for row in tx.all(f"SELECT id, lease_owner, lease_until FROM hk_responses WHERE status IN {_ACTIVE}"):
        if _owner_gone(row[1], row[2], now):
            failed += tx.run(
                f"UPDATE hk_responses SET status = 'failed', error = ?, lease_owner = NULL, "
                f"lease_until = NULL WHERE id = ? AND status IN {_ACTIVE}",
                (_GONE, row[0]),
            )
    deleted = tx.run(f"DELETE FROM hk_responses WHERE expires_at <= ? AND status NOT IN {_ACTIVE}", (now,))
    # Events whose response is gone: expired, deleted, or written by a generator after a delete.
    tx.run(
        "DELETE FROM hk_events WHERE NOT EXISTS "
        "(SELECT 1 FROM hk_responses r WHERE r.id = hk_events.response_id)"
    )
    tx.run(
        "DELETE FROM hk_refs WHERE NOT EXISTS "
        "(SELECT 1 FROM hk_responses r WHERE r.id = hk_refs.response_id)"
    )
    tx.run(
        "DELETE FROM hk_items WHERE conversation_id IN "
        "(SELECT id FROM hk_conversations WHERE expires_at <= ?)",
        (now,),
    )
    deleted += tx.run("DELETE FROM hk_conversations WHERE expires_at <= ?", (now,))
    tx.run("DELETE FROM hk_thoughts WHERE expires_at <= ?", (now,))
    return failed, deleted


def _add_events(tx: Tx, rid: str, events: list[tuple[int, str]]) -> None:
    tx.many(
        "INSERT INTO hk_events (response_id, seq, data) VALUES (?, ?, ?) ON CONFLICT DO NOTHING",
        [(rid, seq, data) for seq, data in events],
    )


def _events(
    tx: Tx, owner: str, rid: str, after: int, now: float
) -> tuple[StoredResponse | None, list[tuple[int, str]]]:
    rec = _get_response(tx, owner, rid, now)
    if rec is None:
        return None, []
    rows = tx.all(
        "SELECT seq, data FROM hk_events WHERE response_id = ? AND seq > ? ORDER BY seq", (rid, after)
    )
    return rec, [(int(s), d) for s, d in rows]


def _conversation(row: Row | None) -> Conversation | None:
    return None if row is None else Conversation(row[0], row[1], int(row[2]), orjson.loads(row[3]))


def _create_conversation(tx: Tx, conv: Conversation, items: list[dict[str, Any]], expires: float) -> None:
    tx.run(
        "INSERT INTO hk_conversations (id, owner, created_at, expires_at, metadata, next_pos) "
        "VALUES (?, ?, ?, ?, ?, 0)",
        (conv.id, conv.owner, conv.created_at, expires, _dumps(conv.metadata)),
    )
    if items:
        _append(tx, conv.owner, conv.id, items, expires)


def _get_conversation(tx: Tx, owner: str, cid: str, now: float) -> Conversation | None:
    return _conversation(
        tx.one(
            "SELECT id, owner, created_at, metadata FROM hk_conversations "
            "WHERE id = ? AND owner = ? AND expires_at > ?",
            (cid, owner, now),
        )
    )


def _update_conversation(
    tx: Tx, owner: str, cid: str, metadata: dict[str, Any], now: float, ttl: float
) -> Conversation | None:
    tx.run(
        "UPDATE hk_conversations SET metadata = ?, expires_at = ? "
        "WHERE id = ? AND owner = ? AND expires_at > ?",
        (_dumps(metadata), now + ttl, cid, owner, now),
    )
    return _get_conversation(tx, owner, cid, now)


def _delete_conversation(tx: Tx, owner: str, cid: str, now: float) -> bool:
    if (
        tx.run(
            "DELETE FROM hk_conversations WHERE id = ? AND owner = ? AND expires_at > ?", (cid, owner, now)
        )
        < 1
    ):
        return False
    tx.run("DELETE FROM hk_items WHERE conversation_id = ?", (cid,))
    return True


def _append(tx: Tx, owner: str, cid: str, items: list[dict[str, Any]], expires: float) -> bool:
    # The counter's row lock orders concurrent appenders: each gets a block of positions.
    row = tx.one(
        "UPDATE hk_conversations SET next_pos = next_pos + ?, expires_at = ? "
        "WHERE id = ? AND owner = ? RETURNING next_pos",
        (len(items), expires, cid, owner),
    )
    if row is None:
        return False
    start = int(row[0]) - len(items)
    # An id already in the conversation (an output item sent back as input, say) gets a fresh one:
    # every item of a conversation stays addressable by its id.
    ids = [item["id"] for item in items]
    marks = ",".join("?" * len(ids))
    taken = {
        r[0]
        for r in tx.all(f"SELECT id FROM hk_items WHERE conversation_id = ? AND id IN ({marks})", (cid, *ids))
    }
    seen: set[str] = set()
    for i, item in enumerate(items):
        if item["id"] in taken or item["id"] in seen:
            items[i] = {**item, "id": f"{item['id'].partition('_')[0]}_{uuid.uuid4().hex[:24]}"}
        seen.add(items[i]["id"])
    tx.many(
        "INSERT INTO hk_items (conversation_id, pos, id, item) VALUES (?, ?, ?, ?)",
        [(cid, start + i, item["id"], _dumps(item)) for i, item in enumerate(items)],
    )
    return True


def _add_items(tx: Tx, owner: str, cid: str, items: list[dict[str, Any]], now: float, ttl: float) -> bool:
    if _get_conversation(tx, owner, cid, now) is None:
        return False
    return _append(tx, owner, cid, items, now + ttl)


def _items(
    tx: Tx, owner: str, cid: str, after: str | None, limit: int | None, order: str, now: float
) -> tuple[Conversation | None, list[dict[str, Any]], bool]:
    conv = _get_conversation(tx, owner, cid, now)
    if conv is None:
        return None, [], False
    desc = order == "desc"
    where = "conversation_id = ?"
    args: list[Any] = [cid]
    if after is not None:
        mark = tx.one("SELECT pos FROM hk_items WHERE conversation_id = ? AND id = ?", (cid, after))
        if mark is None:
            return conv, [], False
        where += " AND pos < ?" if desc else " AND pos > ?"
        args.append(int(mark[0]))
    statement = f"SELECT item FROM hk_items WHERE {where} ORDER BY pos {'DESC' if desc else 'ASC'}"
    if limit is not None:
        statement += f" LIMIT {int(limit) + 1}"
    rows = tx.all(statement, args)
    more = limit is not None and len(rows) > limit
    return conv, [orjson.loads(r[0]) for r in rows[:limit] if r], more


def _get_item(
    tx: Tx, owner: str, cid: str, item_id: str, now: float
) -> tuple[Conversation | None, dict[str, Any] | None]:
    conv = _get_conversation(tx, owner, cid, now)
    if conv is None:
        return None, None
    row = tx.one("SELECT item FROM hk_items WHERE conversation_id = ? AND id = ?", (cid, item_id))
    return conv, None if row is None else orjson.loads(row[0])


def _delete_item(tx: Tx, owner: str, cid: str, item_id: str, now: float) -> tuple[Conversation | None, bool]:
    conv = _get_conversation(tx, owner, cid, now)
    if conv is None:
        return None, False
    return conv, tx.run("DELETE FROM hk_items WHERE conversation_id = ? AND id = ?", (cid, item_id)) > 0
