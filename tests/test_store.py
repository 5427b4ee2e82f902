"""The store on its own, on both backends (a SQLite file, a real PostgreSQL): ownership, chains,
ordered appends under concurrency, leases, cancellation, retention."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import time
from typing import Any

import pytest

from harmonykit.store import Conversation, StoredResponse, open_store
from harmonykit.store.sql import instance_id


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def response(rid: str, owner: str = "a", *, status: str = "completed", previous: str | None = None,
             conversation: str | None = None, lease_owner: str | None = None, lease: float = 30,
             background: bool = False) -> StoredResponse:
    return StoredResponse(rid, owner, time.time(), status, background,
                          {"id": rid, "object": "response", "output": [{"id": "o_" + rid, "type": "message"}]},
                          [{"id": "i_" + rid, "type": "message"}], previous, conversation, lease_owner,
                          time.time() + lease if lease_owner else None)


def test_what_one_owner_stores_no_other_sees(store_url: str) -> None:
    async def go() -> None:
        s = open_store(store_url)
        await s.open()
        await s.create_response(response("resp_1"))
        await s.create_conversation(Conversation("conv_1", "a", 1, {"k": "v"}), [{"id": "i1"}])
        assert (await s.get_response("a", "resp_1")) is not None
        for owner in ("b", ""):
            assert await s.get_response(owner, "resp_1") is None
            assert await s.chain(owner, "resp_1") == []
            assert not await s.delete_response(owner, "resp_1")
            assert await s.cancel_response(owner, "resp_1") is None
            assert (await s.events(owner, "resp_1", -1))[0] is None
            assert await s.get_conversation(owner, "conv_1") is None
            assert await s.update_conversation(owner, "conv_1", {"x": "y"}) is None
            assert not await s.add_items(owner, "conv_1", [{"id": "i2"}])
            assert (await s.items(owner, "conv_1"))[0] is None
            assert (await s.get_item(owner, "conv_1", "i1")) == (None, None)
            assert (await s.delete_item(owner, "conv_1", "i1")) == (None, False)
            assert not await s.delete_conversation(owner, "conv_1")
        conv, items, _ = await s.items("a", "conv_1")
        assert conv is not None and conv.metadata == {"k": "v"} and items == [{"id": "i1"}]
        await s.close()
    run(go())


def test_a_chain_comes_oldest_first_and_stops_at_a_missing_link(store_url: str) -> None:
    async def go() -> None:
        s = open_store(store_url)
        await s.open()
        previous = None
        for i in range(5):
            await s.create_response(response(f"resp_{i}", previous=previous))
            previous = f"resp_{i}"
        assert [r.id for r in await s.chain("a", "resp_4")] == [f"resp_{i}" for i in range(5)]
        assert await s.delete_response("a", "resp_2")
        chain = await s.chain("a", "resp_4")
        assert [r.id for r in chain] == ["resp_3", "resp_4"] and chain[0].previous_id == "resp_2"
        await s.close()
    run(go())


def test_concurrent_appends_keep_every_block_whole_and_in_order(store_url: str) -> None:
    """40 writers append blocks of 3 to one conversation at once: every item is there, each block
    contiguous and in its own order, and positions follow the order the writers committed in."""
    async def go() -> None:
        s = open_store(store_url)
        await s.open()
        await s.create_conversation(Conversation("conv_c", "a", 1), [])
        blocks = [[{"id": f"b{w}_{k}", "w": w, "k": k} for k in range(3)] for w in range(40)]
        assert all(await asyncio.gather(*(s.add_items("a", "conv_c", b) for b in blocks)))
        _, items, more = await s.items("a", "conv_c")
        assert not more and len(items) == 120
        for start in range(0, 120, 3):
            block = items[start:start + 3]
            assert [i["k"] for i in block] == [0, 1, 2] and len({i["w"] for i in block}) == 1
        await s.close()
    run(go())


def test_items_page_by_id_both_ways(store_url: str) -> None:
    async def go() -> None:
        s = open_store(store_url)
        await s.open()
        await s.create_conversation(Conversation("conv_p", "a", 1), [{"id": f"i{n}"} for n in range(5)])
        ids = lambda got: [i["id"] for i in got[1]]  # noqa: E731
        assert ids(await s.items("a", "conv_p", limit=2)) == ["i0", "i1"]
        assert (await s.items("a", "conv_p", limit=2))[2] is True
        assert ids(await s.items("a", "conv_p", after="i1", limit=2)) == ["i2", "i3"]
        assert ids(await s.items("a", "conv_p", order="desc", after="i3")) == ["i2", "i1", "i0"]
        assert (await s.items("a", "conv_p", after="i4", limit=2))[1:] == ([], False)
        assert ids(await s.items("a", "conv_p", after="nope")) == []
        # an id sent twice gets a fresh one: every item stays addressable
        assert await s.add_items("a", "conv_p", [{"id": "i0"}])
        _, items, _ = await s.items("a", "conv_p")
        assert len({i["id"] for i in items}) == 6 and items[-1]["id"].startswith("i0_")
        await s.close()
    run(go())


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_a_response_whose_generator_is_gone_is_failed_by_whoever_finds_it(store_url: str) -> None:
    """A lease that ran out, or a gateway process of this host that no longer runs: the response
    is failed with a reason, by a read or by the sweep; a live lease is left alone."""
    async def go() -> None:
        s = open_store(store_url)
        await s.open()
        dead = f"{socket.gethostname()}/{_dead_pid()}/x"
        await s.create_response(response("resp_dead", status="in_progress", lease_owner=dead))
        await s.create_response(response("resp_late", status="in_progress", lease_owner="elsewhere/1/x", lease=-1))
        await s.create_response(response("resp_sweep", status="queued", lease_owner="elsewhere/1/y", lease=-1))
        alive = instance_id()
        await s.create_response(response("resp_live", status="in_progress", lease_owner=alive))
        for rid in ("resp_dead", "resp_late"):
            got = await s.get_response("a", rid)
            assert got is not None and got.status == "failed"
            assert "stopped before it ended" in got.response["error"]["message"]
        assert await s.sweep() == (1, 0)
        assert (await s.get_response("a", "resp_sweep")).status == "failed"  # type: ignore[union-attr]
        assert (await s.get_response("a", "resp_live")).status == "in_progress"  # type: ignore[union-attr]
        # a generator that comes back after being failed cannot overwrite that
        assert not await s.finish_response("resp_late", "elsewhere/1/x", "completed", {"id": "resp_late"})
        await s.close()
    run(go())


def test_cancel_keeps_what_was_made_and_appends_nothing(store_url: str) -> None:
    async def go() -> None:
        s = open_store(store_url)
        await s.open()
        me = instance_id()
        await s.create_conversation(Conversation("conv_x", "a", 1), [])
        await s.create_response(response("resp_bg", status="in_progress", lease_owner=me, background=True,
                                         conversation="conv_x"))
        got = await s.cancel_response("a", "resp_bg")
        assert got is not None and got.status == "cancelled"
        assert await s.cancelled(me) == ["resp_bg"]
        assert not await s.finish_response("resp_bg", me, "completed",
                                           {"id": "resp_bg", "output": ["partial"]}, [{"id": "x"}])
        final = await s.get_response("a", "resp_bg")
        assert final is not None and final.status == "cancelled" and final.body["output"] == ["partial"]
        assert (await s.items("a", "conv_x"))[1] == [] and await s.cancelled(me) == []
        # finished: cancelling again changes nothing
        assert (await s.cancel_response("a", "resp_bg")).status == "cancelled"  # type: ignore[union-attr]
        await s.close()
    run(go())


def test_events_of_a_deleted_response_are_swept_and_a_deleted_one_reads_as_cancelled(store_url: str) -> None:
    async def go() -> None:
        s = open_store(store_url)
        await s.open()
        me = instance_id()
        await s.create_response(response("resp_ev", status="in_progress", lease_owner=me, background=True))
        await s.add_events("resp_ev", [(0, "a"), (1, "b")])
        assert await s.delete_response("a", "resp_ev")
        assert await s.cancelled(me, ["resp_ev"]) == ["resp_ev"]  # its generator stops
        await s.add_events("resp_ev", [(2, "c")])  # written after the delete
        await s.sweep()
        await s.create_response(response("resp_ev"))
        assert (await s.events("a", "resp_ev", -1))[1] == []
        await s.close()
    run(go())


def test_expired_objects_are_gone_and_swept(store_url: str) -> None:
    async def go() -> None:
        s = open_store(store_url, ttl=0.2)
        await s.open()
        await s.create_response(response("resp_old"))
        await s.create_conversation(Conversation("conv_old", "a", 1), [{"id": "i"}])
        await asyncio.sleep(0.3)  # past the ttl: only ever later
        assert await s.get_response("a", "resp_old") is None
        assert await s.get_conversation("a", "conv_old") is None
        assert (await s.sweep())[1] == 2
        await s.close()
    run(go())


def test_a_chat_loops_reasoning_is_kept_per_owner_and_expires(store_url: str) -> None:
    async def go() -> None:
        s = open_store(store_url, ttl=0.3)
        await s.open()
        await s.keep_thought("a", ["call_1", "call_2", "call_1"], "Think.")
        await s.keep_thought("a", ["call_1"], "Think again.")
        assert await s.thoughts("a", ["call_1", "call_2", "call_3"]) == {"call_1": "Think again.",
                                                                         "call_2": "Think."}
        assert await s.thoughts("b", ["call_1", "call_2"]) == {} and await s.thoughts("a", []) == {}
        await asyncio.sleep(0.4)
        assert await s.thoughts("a", ["call_1"]) == {}
        await s.sweep()
        await s.close()
    run(go())


def test_store_urls_are_checked() -> None:
    assert open_store("none") is None
    for bad in ("mysql://x", "sqlite:", "store.db"):
        with pytest.raises(ValueError, match="sqlite:///PATH"):
            open_store(bad)
    with pytest.raises(ValueError, match="name the database file"):
        open_store("sqlite:///")


def test_a_failed_database_is_a_store_error_naming_it(tmp_path: Any) -> None:
    from harmonykit.store import StoreError

    folder = tmp_path / "ro"
    folder.mkdir()
    s = open_store(f"sqlite:///{folder / 'x.db'}")
    os.chmod(folder, 0o500)
    try:
        if os.geteuid() == 0:  # root writes anywhere: make the path a folder instead
            os.chmod(folder, 0o700)
            (folder / "x.db").mkdir()
        with pytest.raises(StoreError, match=r"the store \(sqlite .*x\.db\) failed"):
            run(s.open())
    finally:
        os.chmod(folder, 0o700)


def test_settings_check_the_store_and_never_show_a_password() -> None:
    from harmonykit.server import Settings
    from harmonykit.server.settings import duration

    with pytest.raises(ValueError) as err:
        Settings(upstream=("http://127.0.0.1:1",), store="mysql://admin:hunter2@db1/x")
    assert "hunter2" not in str(err.value) and "db1" in str(err.value)
    env = {"HARMONYKIT_STORE_TTL": "12h", "HARMONYKIT_STORE": "none"}
    s = Settings.from_sources({"upstream": ["http://127.0.0.1:1"]}, env)
    assert s.store_ttl == 43200 and s.store_url == "none"
    with pytest.raises(ValueError, match="not a duration"):
        Settings.from_sources({"upstream": ["http://127.0.0.1:1"]}, {"HARMONYKIT_STORE_TTL": "soon"})
    assert duration("90") == 90 and duration("15m") == 900
