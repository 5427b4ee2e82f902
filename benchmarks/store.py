"""`make bench`, the store part (issue 22): what stored state costs the gateway.

Processes, each on 127.0.0.1: the scripted engine (benchmarks/gateway.py's), ``harmonykit
serve`` in front of it on a SQLite store holding 100k responses, and, for the last part, a
real PostgreSQL (tests/real/postgres.py) with two gateways on it. Reported, as ratios from
the same run:

- a 40-turn chain's next step through ``previous_response_id`` against the same conversation
  sent whole (both stored, as by default): the gateway's CPU per request and the p50 latency
  (target: the chain costs no more);
- the p50 a stored response adds over the same request unstored, on SQLite (target: < 1 ms);
- a Chat tool loop's two steps with the reasoning kept and restored by the gateway (the client
  sends none back) against the same steps with ``store: false`` and the reasoning sent back by
  the client: the p50 each step adds (target: < 1 ms);
- 2 gateways x 50 concurrent chains on one PostgreSQL, each chain a conversation whose steps
  alternate between the gateways: every item there and in order, no error; responses/s.

Run alone: ``python benchmarks/store.py``.
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT.parent / "tests"))

from gateway import _free_port, _start, _stop  # noqa: E402


def _cpu(pid: int) -> float:
    """Seconds of CPU the process's threads (the store's included) have run, to the nanosecond
    (/proc's schedstat; the stat file counts 10 ms ticks, too coarse for one request)."""
    return sum(int((task / "schedstat").read_text().split()[0])
               for task in Path(f"/proc/{pid}/task").iterdir() if (task / "schedstat").exists()) / 1e9

MODEL = "gpt-oss-20b"
STORED = 100_000
TURNS = 40
STEPS = 200


async def _fill(url: str, n: int) -> None:
    """n stored responses of 4 chains' worth of items each, straight through the store."""
    from harmonykit.store import StoredResponse, open_store

    store = open_store(url)
    assert store is not None
    await store.open()
    item = [{"id": "msg_x", "type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]}]
    now = time.time()
    for start in range(0, n, 2000):
        await asyncio.gather(*(store.create_response(StoredResponse(
            f"resp_fill{i:08d}", "", now, "completed", False, {"id": f"resp_fill{i:08d}", "output": []}, item))
            for i in range(start, min(n, start + 2000))))
    await store.close()


async def _post(session: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> tuple[float, dict[str, Any]]:
    t0 = time.perf_counter()
    async with session.post(url + "/v1/responses", json=body) as r:
        data = await r.json()
        assert r.status == 200, data
    return time.perf_counter() - t0, data


async def _chain_against_whole(gateway: str, gw_pid: int) -> None:
    async with aiohttp.ClientSession() as session:
        previous, whole = None, []
        for i in range(TURNS):
            new = [{"role": "user", "content": f"say:turn {i} " + "words " * 40}]
            _, r = await _post(session, gateway, {"model": MODEL, "input": new, "previous_response_id": previous})
            previous = r["id"]
            whole += new + r["output"]
        step = [{"role": "user", "content": "say:next"}]
        chain_t, whole_t, chain_cpu, whole_cpu = [], [], 0.0, 0.0
        plain_stored, plain_unstored = [], []
        for _ in range(STEPS):  # interleaved, so that both see the same machine
            c0 = _cpu(gw_pid)
            t, _ = await _post(session, gateway, {"model": MODEL, "input": step, "previous_response_id": previous})
            chain_cpu += _cpu(gw_pid) - c0
            chain_t.append(t)
            c0 = _cpu(gw_pid)
            t, _ = await _post(session, gateway, {"model": MODEL, "input": whole + step})
            whole_cpu += _cpu(gw_pid) - c0
            whole_t.append(t)
            t, _ = await _post(session, gateway, {"model": MODEL, "input": step})
            plain_stored.append(t)
            t, _ = await _post(session, gateway, {"model": MODEL, "input": step, "store": False})
            plain_unstored.append(t)
    p50 = statistics.median
    print(f"  {TURNS}-turn chain's next step, {STORED:,} responses stored (SQLite), {STEPS} steps each:")
    print(f"    through previous_response_id: p50 {p50(chain_t) * 1e3:.2f} ms, gateway CPU "
          f"{chain_cpu / STEPS * 1e3:.2f} ms a request")
    print(f"    the conversation sent whole:  p50 {p50(whole_t) * 1e3:.2f} ms, gateway CPU "
          f"{whole_cpu / STEPS * 1e3:.2f} ms a request")
    print(f"    ratio chain / whole: p50 {p50(chain_t) / p50(whole_t):.2f}x, CPU "
          f"{chain_cpu / max(whole_cpu, 1e-9):.2f}x (target: <= 1)")
    added = p50(plain_stored) - p50(plain_unstored)
    print(f"  p50 added by storing a response (SQLite): {added * 1e3:.2f} ms "
          f"({p50(plain_stored) * 1e3:.2f} stored vs {p50(plain_unstored) * 1e3:.2f} unstored; target < 1 ms)")


async def _chat_loop(gateway: str) -> None:
    """A Chat tool loop's steps when the gateway keeps and restores the reasoning, against the
    same steps where the client carries it (store: false, reasoning_content sent back)."""
    tools = [{"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}]

    async def step(session: aiohttp.ClientSession, messages: list[dict[str, Any]],
                   **extra: Any) -> tuple[float, dict[str, Any]]:
        t0 = time.perf_counter()
        async with session.post(gateway + "/v1/chat/completions",
                                json={"model": MODEL, "messages": messages, "tools": tools, **extra}) as r:
            data = await r.json()
            assert r.status == 200, data
        return time.perf_counter() - t0, data["choices"][0]["message"]

    firsts: dict[bool, list[float]] = {True: [], False: []}
    seconds: dict[bool, list[float]] = {True: [], False: []}
    async with aiohttp.ClientSession() as session:
        for i in range(STEPS):
            for kept in (True, False):  # interleaved, so that both see the same machine
                user = {"role": "user", "content": f'call:lookup:{{"q": "{i}"}}'}
                t, message = await step(session, [user], **({} if kept else {"store": False}))
                firsts[kept].append(t)
                call = message["tool_calls"][0]
                assistant = {"role": "assistant", "content": None, "tool_calls": [call]}
                if not kept:
                    assistant["reasoning_content"] = message["reasoning_content"]
                t, answer = await step(session, [user, assistant,
                                                 {"role": "tool", "tool_call_id": call["id"], "content": "ok"}])
                assert answer["content"] == "tool said ok"
                seconds[kept].append(t)
    p50 = statistics.median
    print(f"  a Chat tool loop ({STEPS} loops each), reasoning kept and restored by the gateway vs carried "
          f"by the client: step one p50 {p50(firsts[True]) * 1e3:.2f} vs {p50(firsts[False]) * 1e3:.2f} ms "
          f"(+{(p50(firsts[True]) - p50(firsts[False])) * 1e3:.2f} ms), step two {p50(seconds[True]) * 1e3:.2f} vs "
          f"{p50(seconds[False]) * 1e3:.2f} ms (+{(p50(seconds[True]) - p50(seconds[False])) * 1e3:.2f} ms; "
          "target < 1 ms each)")


async def _two_gateways(a: str, b: str, chains: int = 50, steps: int = 10) -> None:
    errors: list[str] = []
    async with aiohttp.ClientSession() as session:
        convs = []
        for _ in range(chains):
            async with session.post(a + "/v1/conversations", json={}) as r:
                convs.append((await r.json())["id"])

        async def chain(k: int) -> None:
            for s in range(steps):
                base = a if s % 2 == 0 else b
                body = {"model": MODEL, "input": f"say:c{k}s{s}", "conversation": convs[k]}
                async with session.post(base + "/v1/responses", json=body) as r:
                    if r.status != 200:
                        errors.append(f"{r.status} {await r.text()}")

        t0 = time.perf_counter()
        await asyncio.gather(*(chain(k) for k in range(chains)))
        wall = time.perf_counter() - t0
        lost = reordered = 0
        for k, cid in enumerate(convs):
            async with session.get(b + f"/v1/conversations/{cid}/items?order=asc&limit=100") as r:
                items = (await r.json())["data"]
            users = [i["content"][0]["text"] for i in items if i.get("role") == "user"]
            answers = [i["content"][0]["text"] for i in items if i.get("role") == "assistant"]
            expected = [f"say:c{k}s{s}" for s in range(steps)]
            lost += steps - len(set(users) & set(expected)) + steps - len(answers)
            reordered += users != expected or answers != [u.removeprefix("say:") for u in expected]
    total = chains * steps
    print(f"  2 gateways x {chains} concurrent chains x {steps} steps on one PostgreSQL: {total} responses in "
          f"{wall:.1f} s ({total / wall:.0f} responses/s); lost items {lost}, reordered chains {reordered}, "
          f"errors {len(errors)}" + (f" (first: {errors[0][:200]})" if errors else ""))


def main() -> None:
    from real.postgres import postgres_server

    print("\nStore (stored responses and conversations):")
    folder = Path(tempfile.mkdtemp(prefix="harmonykit-bench-store-"))
    url = f"sqlite:///{folder / 'store.db'}"
    t0 = time.perf_counter()
    asyncio.run(_fill(url, STORED))
    print(f"  ({STORED:,} responses stored in {time.perf_counter() - t0:.1f} s)")
    e_port = _free_port()
    engine = f"http://127.0.0.1:{e_port}"
    eng = _start([str(ROOT / "gateway.py"), "--app", "engine", str(e_port)], engine + "/v1/models")
    try:
        g_port = _free_port()
        gateway = f"http://127.0.0.1:{g_port}"
        gw = _start(["-m", "harmonykit", "serve", "--upstream", engine, "--port", str(g_port), "--store", url],
                    gateway + "/health")
        try:
            asyncio.run(_chain_against_whole(gateway, gw.pid))
            asyncio.run(_chat_loop(gateway))
        finally:
            _stop(gw)
        with postgres_server() as pg:
            ports = [_free_port(), _free_port()]
            gws = [_start(["-m", "harmonykit", "serve", "--upstream", engine, "--port", str(p), "--store", pg.url],
                          f"http://127.0.0.1:{p}/health") for p in ports]
            try:
                asyncio.run(_two_gateways(*(f"http://127.0.0.1:{p}" for p in ports)))
            finally:
                for g in gws:
                    _stop(g)
    finally:
        _stop(eng)


if __name__ == "__main__":
    main()
