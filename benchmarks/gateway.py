"""`make bench`, the gateway part: harmonykit serve against the same local engine, called directly.

Processes: a scripted engine (tests/engine.py, one token per SSE chunk) and
`harmonykit serve` in front of it, each in its own process on 127.0.0.1. This
process drives the load with aiohttp. Reported:

- gateway CPU per streamed token (the gateway process's user+system time over
  the tokens it streamed), and the tokens/s one core would carry at that cost;
- p50/p99 added latency (gateway minus direct, time to last byte) with 1 and
  100 concurrent streams, and the wall time of 200 concurrent streams;
- the choices behind the server extra: aiohttp vs httpx as the upstream client
  under 200 concurrent streams, a plain ASGI app vs Starlette on uvicorn;
- a cached request head against a cold render;
- stalls: the longest gap in one stream while the gateway reads and renders a large request
  (one 12 MB message; 250k short ones), and how soon a body far past the context is refused
  (tests/test_server.py checks that these happen; how fast is measured here).

Run alone: ``python benchmarks/gateway.py``.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
TOKENS = 200  # answer tokens per request ("long:200" plus the reasoning)


def _free_port() -> int:
    from engine import free_socket

    s = free_socket()
    port: int = s.getsockname()[1]
    s.close()
    return port


def _wait(url: str, proc: subprocess.Popen[bytes]) -> None:
    import urllib.request

    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{url} exited with status {proc.returncode}")
        try:
            urllib.request.urlopen(url, timeout=1).read()
            return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"{url} did not start")


def _cpu(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run_engine(port: int, app: str) -> None:
    """Child process: the scripted engine, or a hello app for the framework comparison."""
    import uvicorn

    if app in ("engine", "slow-engine"):
        from engine import Engine

        target: Any = Engine(chunk=1, split_frames=False)
        target.context = 131072  # gpt-oss's: the agent loop's 40k-token prompt fits
        # For the stalls: a token every 3 ms, and a context that both large requests are rendered for
        # (it is past what a byte count rules out) and then refused by (they never reach the engine,
        # a stand-in in one thread, whose own parse of a huge prompt would stall its streams).
        if app == "slow-engine":
            target.delay, target.context = 0.003, 1_000_000
    elif app == "raw":
        async def target(scope: Any, receive: Any, send: Any) -> None:
            if scope["type"] != "http":
                return
            await receive()
            await send({"type": "http.response.start", "status": 200,
                        "headers": [(b"content-type", b"application/json")]})
            await send({"type": "http.response.body", "body": b'{"ok":true}'})
    else:
        from starlette.applications import Starlette
        from starlette.requests import Request
        from starlette.responses import JSONResponse
        from starlette.routing import Route

        async def hello(request: Request) -> JSONResponse:
            await request.body()
            return JSONResponse({"ok": True})

        target = Starlette(routes=[Route("/v1/models", hello, methods=["GET", "POST"])])
    uvicorn.run(target, host="127.0.0.1", port=port, log_level="critical")


def _start(args: list[str], health: str) -> subprocess.Popen[bytes]:
    # Logs go to a file: a pipe nobody reads fills up and blocks the server's event loop.
    log = tempfile.TemporaryFile()
    proc = subprocess.Popen([sys.executable, *args], stdout=subprocess.DEVNULL, stderr=log,
                            env={**os.environ, "PYTHONPATH": str(ROOT / "tests")})
    _wait(health, proc)
    return proc


def _stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


async def _read(session: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> tuple[float, float]:
    """(time to the first byte of the body, time to the last)."""
    t = time.perf_counter()
    first = None
    async with session.post(url, json=body) as r:
        assert r.status == 200, await r.text()
        async for _ in r.content.iter_any():
            first = first or time.perf_counter() - t
    return first or 0.0, time.perf_counter() - t


async def _chat_stream(session: aiohttp.ClientSession, base: str, i: int) -> tuple[float, float]:
    body = {"model": "gpt-oss-20b", "stream": True,
            "messages": [{"role": "user", "content": f"long:{TOKENS}"}]}
    return await _read(session, base + "/v1/chat/completions", body)


async def _direct_stream(session: aiohttp.ClientSession, base: str, prompt: list[int]) -> tuple[float, float]:
    body = {"model": "gpt-oss-20b", "stream": True, "prompt": prompt, "return_token_ids": True}
    return await _read(session, base + "/v1/completions", body)


async def _rounds(fn: Any, concurrency: int, total: int) -> list[tuple[float, float]]:
    times: list[tuple[float, float]] = []
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        for start in range(0, total, concurrency):
            n = min(concurrency, total - start)
            times += await asyncio.gather(*(fn(session, i) for i in range(n)))
    return times


def _pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p / 100 * len(xs)))]


async def _client_compare(engine: str, prompt: list[int], n: int = 200) -> None:
    import httpx

    body = {"model": "gpt-oss-20b", "stream": True, "prompt": prompt, "return_token_ids": True}

    async def with_aiohttp() -> tuple[float, int]:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0),
                                         timeout=aiohttp.ClientTimeout(total=30)) as s:
            async def one() -> bool:
                try:
                    async with s.post(engine + "/v1/completions", json=body) as r:
                        async for _ in r.content.iter_any():
                            pass
                    return True
                except (aiohttp.ClientError, asyncio.TimeoutError):
                    return False
            t = time.perf_counter()
            ok = await asyncio.gather(*(one() for _ in range(n)))
            return time.perf_counter() - t, n - sum(ok)

    async def with_httpx() -> tuple[float, int]:
        limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
        async with httpx.AsyncClient(limits=limits, timeout=30) as c:
            async def one() -> bool:
                try:
                    async with c.stream("POST", engine + "/v1/completions", json=body) as r:
                        async for _ in r.aiter_bytes():
                            pass
                    return True
                except httpx.HTTPError:
                    return False
            t = time.perf_counter()
            ok = await asyncio.gather(*(one() for _ in range(n)))
            return time.perf_counter() - t, n - sum(ok)

    for name, fn in (("aiohttp", with_aiohttp), ("httpx", with_httpx)):
        wall, failed = await fn()
        print(f"  {name:<8} {n} concurrent streams from the engine: {wall * 1e3:7.0f} ms, {failed} failed")


async def _hello(base: str, n: int = 3000, concurrency: int = 50) -> float:
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=concurrency)) as s:
        async def one() -> None:
            async with s.post(base + "/v1/models", data=b'{"a": 1}') as r:
                await r.read()
        await asyncio.gather(*(one() for _ in range(100)))
        t = time.perf_counter()
        for _ in range(0, n, concurrency):
            await asyncio.gather(*(one() for _ in range(concurrency)))
        return n / (time.perf_counter() - t)


async def _agent_loop(enc: Any, engine: str, gateway: str, steps: int = 60) -> None:
    """#17: a 40-turn agent's next steps, one at a time (each re-sends the history and one new
    message), through the gateway and straight to the engine with the same prompt."""
    from workloads import agent_request

    from harmonykit.openai import render_chat_request

    request = agent_request(40)
    bodies = [{**request, "max_tokens": 16,
               "messages": [*request["messages"], {"role": "user", "content": f"Step {k}: go on."}]}
              for k in range(steps)]
    prompts = [render_chat_request(enc, b).tokens for b in bodies]
    g, d = [], []
    async with aiohttp.ClientSession() as session:
        await _read(session, gateway + "/v1/chat/completions", {**request, "max_tokens": 16})  # the last step
        for body, prompt in zip(bodies, prompts, strict=True):
            d.append((await _read(session, engine + "/v1/completions",
                                  {"model": "gpt-oss-20b", "prompt": prompt, "max_tokens": 16,
                                   "return_token_ids": True}))[1])
            g.append((await _read(session, gateway + "/v1/chat/completions", body))[1])
    # Each step's own difference (the engine's time varies from step to step; a difference of
    # two p99s taken apart can even come out below zero).
    added = [x - y for x, y in zip(g, d, strict=True)]
    print(f"\nAgent loop through the gateway (40 turns, {len(prompts[0])} prompt tokens, one new message "
          f"a step, {steps} steps): added latency p50 {_pct(added, 50) * 1e3:.2f} ms, "
          f"p99 {_pct(added, 99) * 1e3:.2f} ms, step by step (direct p50 {_pct(d, 50) * 1e3:.1f} ms)")


def main() -> None:
    import harmonykit as hk
    from harmonykit.cache import disabled
    from harmonykit.openai import render_chat_request

    enc = hk.load_harmony_encoding(hk.HarmonyEncodingName.HARMONY_GPT_OSS)
    print("\nGateway (harmonykit serve, each process on 127.0.0.1; one token per engine chunk):")
    e_port, g_port = _free_port(), _free_port()
    engine = f"http://127.0.0.1:{e_port}"
    gateway = f"http://127.0.0.1:{g_port}"
    eng = _start([__file__, "--app", "engine", str(e_port)], engine + "/v1/models")
    gw = _start(["-m", "harmonykit", "serve", "--upstream", engine, "--port", str(g_port),
                 "--max-concurrency", "1000"], gateway + "/health")
    try:
        request = {"model": "gpt-oss-20b", "messages": [{"role": "user", "content": f"long:{TOKENS}"}]}
        prompt = render_chat_request(enc, request).tokens
        answer = "<|channel|>analysis<|message|>Think.<|end|><|start|>assistant<|channel|>final<|message|>"
        streamed = len(enc.encode(answer + " word" * TOKENS, allowed_special="all"))

        async def via_gateway(s: aiohttp.ClientSession, i: int) -> tuple[float, float]:
            return await _chat_stream(s, gateway, i)

        async def direct(s: aiohttp.ClientSession, i: int) -> tuple[float, float]:
            return await _direct_stream(s, engine, prompt)

        asyncio.run(_rounds(via_gateway, 20, 40))  # warm up
        for concurrency, total in ((1, 40), (100, 300)):
            d = asyncio.run(_rounds(direct, concurrency, total))
            cpu0 = _cpu(gw.pid)
            t0 = time.perf_counter()
            g = asyncio.run(_rounds(via_gateway, concurrency, total))
            wall = time.perf_counter() - t0
            cpu = _cpu(gw.pid) - cpu0
            per_token = cpu / (total * streamed)
            for what, k in (("first byte", 0), ("whole stream", 1)):
                gk, dk = [x[k] for x in g], [x[k] for x in d]
                p50, p99 = _pct(gk, 50) - _pct(dk, 50), _pct(gk, 99) - _pct(dk, 99)
                print(f"  {concurrency:>3} concurrent, {what:<12} added latency p50 {p50 * 1e3:6.2f} ms, "
                      f"p99 {p99 * 1e3:6.2f} ms   (direct p50 {_pct(dk, 50) * 1e3:6.1f} ms)")
            print(f"  {'':>3}             gateway CPU {per_token * 1e6:5.1f} us per streamed token "
                  f"(one core: {1 / per_token / 1e3:5.1f}k tokens/s); through it: "
                  f"{total * streamed / wall / 1e3:5.1f}k tokens/s ({streamed} tokens a stream)")
        t0 = time.perf_counter()
        results = asyncio.run(_rounds(via_gateway, 200, 200))
        print(f"  200 concurrent streams through the gateway: {len(results)} complete in "
              f"{(time.perf_counter() - t0) * 1e3:.0f} ms (the test's guard against a hang: 90 s)")
        _refused_early(gateway)
        asyncio.run(_agent_loop(enc, engine, gateway))
        print("\nUpstream HTTP client (the same engine, streams read to the end):")
        asyncio.run(_client_compare(engine, prompt))
    finally:
        _stop(gw)
        _stop(eng)

    print("\nASGI framework (uvicorn, one POST with a JSON answer, 50 at once):")
    for app in ("raw", "starlette"):
        port = _free_port()
        proc = _start([__file__, "--app", app, str(port)], f"http://127.0.0.1:{port}/v1/models")
        try:
            print(f"  {app:<10} {asyncio.run(_hello(f'http://127.0.0.1:{port}')):8.0f} requests/s")
        finally:
            _stop(proc)

    tools = [{"type": "function", "function": {"name": f"tool_{i}", "description": "Does a thing. " * 10,
              "parameters": {"type": "object", "required": ["a"],
                             "properties": {"a": {"type": "string"}, "b": {"type": "integer"}}}}}
             for i in range(20)]
    req = {"messages": [{"role": "system", "content": "You are helpful. " * 50},
                        {"role": "user", "content": "Hi"}], "tools": tools}

    def cold() -> None:
        with disabled():
            render_chat_request(enc, req)

    n = 200
    t = time.perf_counter()
    for _ in range(n):
        cold()
    c = (time.perf_counter() - t) / n
    t = time.perf_counter()
    for _ in range(n):
        render_chat_request(enc, req)
    w = (time.perf_counter() - t) / n
    print(f"\nRequest rendering, 20 tools: cold {c * 1e6:.0f} us, cached head {w * 1e6:.0f} us "
          f"({c / w:.1f}x faster)")
    _stalls()


def _refused_early(gateway: str) -> None:
    import json
    import urllib.error
    import urllib.request

    big = json.dumps({"model": "m", "messages": [{"role": "user", "content": "x" * 2_000_000}]}).encode()
    req = urllib.request.Request(gateway + "/v1/chat/completions", data=big,
                                 headers={"Content-Type": "application/json"})
    t0 = time.monotonic()
    try:
        urllib.request.urlopen(req, timeout=60).read()
        code = 200
    except urllib.error.HTTPError as e:
        code = e.code
    print(f"  a 2 MB body far past the engine's context refused in {(time.monotonic() - t0) * 1e3:.1f} ms "
          f"(status {code}; target < 1000 ms)")


def _stalls() -> None:
    """The gateway (harmonykit serve) and a stand-in engine, each in its own process, one stream of
    one token every 3 ms, and a large request sent beside it: the stream's longest gap meanwhile."""
    import json
    import threading
    import urllib.error
    import urllib.request

    import openai

    def post(base: str, body: bytes) -> int:
        req = urllib.request.Request(base + "/v1/chat/completions", data=body,
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=120) as r:
                r.read()
                return int(r.status)
        except urllib.error.HTTPError as e:
            return int(e.code)

    def stream(base: str, times: list[float], done: threading.Event) -> None:
        c = openai.OpenAI(base_url=base + "/v1", api_key="none", max_retries=0, timeout=120)
        with c.chat.completions.create(model="m", stream=True,
                                       messages=[{"role": "user", "content": "long:20000"}]) as s:
            for _ in s:
                times.append(time.monotonic())
                if done.is_set():
                    break

    print("\nStalls (harmonykit serve and a stand-in engine in their own processes; one token every 3 ms):")
    e_port, g_port = _free_port(), _free_port()
    engine, gateway = f"http://127.0.0.1:{e_port}", f"http://127.0.0.1:{g_port}"
    eng = _start([__file__, "--app", "slow-engine", str(e_port)], engine + "/v1/models")
    gw = _start(["-m", "harmonykit", "serve", "--upstream", engine, "--port", str(g_port),
                 "--max-body-bytes", str(64 << 20)], gateway + "/health")
    try:
        for name, messages in (("one 12 MB message", [{"role": "user", "content": "x" * 12_000_000}]),
                               ("250k short messages",
                                [{"role": "user", "content": f"question {i}"} for i in range(250_000)])):
            big = json.dumps({"model": "m", "messages": messages, "max_tokens": 1}).encode()
            times: list[float] = []
            done = threading.Event()
            reader = threading.Thread(target=stream, args=(gateway, times, done))
            reader.start()
            time.sleep(0.5)
            t0 = time.monotonic()
            code = post(gateway, big)
            t1 = time.monotonic()
            done.set()
            reader.join(60)
            during = [b - a for a, b in itertools.pairwise(times) if b >= t0 and a <= t1]
            print(f"  {name:<22} handled in {(t1 - t0) * 1e3:6.0f} ms (status {code}); longest gap in the "
                  f"other stream {max(during, default=0) * 1e3:4.0f} ms ({len(during)} chunks meanwhile; "
                  "target < 100 ms)")
    finally:
        _stop(gw)
        _stop(eng)


if __name__ == "__main__":
    if len(sys.argv) == 2 and sys.argv[1] == "--stalls":  # this part alone
        _stalls()
    elif len(sys.argv) == 4 and sys.argv[1] == "--app":
        run_engine(int(sys.argv[3]), sys.argv[2])
    else:
        main()
