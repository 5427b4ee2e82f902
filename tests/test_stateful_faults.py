"""Stored state under faults, for real: a gateway process SIGKILLed mid-stream and restarted,
two gateways on one PostgreSQL (a chain alternating between them, a background response
polled and cancelled through the other), the database stopped mid-request; and the Agents
SDK running a multi-turn agent with tools over previous_response_id and over its
Conversations session."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from engine import Engine, free_socket, serving
from harmonykit.server import Settings, create_app
from real.postgres import postgres_server
from test_stateful import MODEL, client, stopped_mid_generation, wait_until_done


@pytest.fixture
def engine() -> Iterator[tuple[Engine, str]]:
    eng = Engine(seed=5)
    with serving(eng) as url:
        yield eng, url


@contextlib.contextmanager
def gateway_process(upstream: str, store: str) -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    """``harmonykit serve`` in a process of its own (its own group), killed on exit whatever happens."""
    sock = free_socket()
    port = sock.getsockname()[1]
    sock.close()
    proc = subprocess.Popen([sys.executable, "-m", "harmonykit", "serve", "--host", "127.0.0.1", "--port", str(port),
                             "--upstream", upstream, "--store", store], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        for _ in range(1200):  # a guard: the loop ends when it is up
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(base + "/health", timeout=5).status_code == 200:
                    break
            assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else ""
            time.sleep(0.1)
        yield proc, base
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(30)
        if proc.stderr:
            proc.stderr.close()


def test_a_gateway_killed_mid_stream_leaves_no_response_in_progress(engine: tuple[Engine, str], store_url: str) -> None:
    eng, up = engine
    eng.pause_at, eng.resume = 2, threading.Event()
    try:
        with gateway_process(up, store_url) as (proc, base):
            stream = client(base).responses.create(model=MODEL, input="long:30", stream=True)
            first = next(iter(stream))
            rid = first.response.id
            assert client(base).responses.retrieve(rid).status == "in_progress"
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(30)
            with contextlib.suppress(Exception):
                stream.close()
        with gateway_process(up, store_url) as (_, base):  # restarted: whoever finds it marks it
            found = client(base).responses.retrieve(rid)
            assert found.status == "failed" and found.error is not None
            assert "stopped before it ended" in found.error.message
            assert client(base).responses.create(model=MODEL, input="say:alive").output_text == "alive"
    finally:
        eng.resume.set()
        eng.pause_at = None


def test_two_gateways_on_one_postgresql(engine: tuple[Engine, str], postgres: Any) -> None:
    """A chain alternating between two gateways, and a background response created on one,
    polled and cancelled through the other (which stops the engine's request on the first)."""
    eng, up = engine
    url = postgres.url
    with serving(create_app(Settings(upstream=(up,), store=url))) as a_url, \
            serving(create_app(Settings(upstream=(up,), store=url))) as b_url:
        a, b = client(a_url), client(b_url)
        previous = None
        for i in range(6):
            r = (a if i % 2 == 0 else b).responses.create(model=MODEL, input=f"say:turn{i}",
                                                          previous_response_id=previous)
            previous = r.id
            assert r.output_text == f"turn{i}"
        prompt = eng.requests[-1]["prompt"]
        from test_stateful import ENC

        text = ENC.decode(prompt)
        assert [text.index(f"say:turn{i}") for i in range(6)] == sorted(text.index(f"say:turn{i}") for i in range(6))
        bg = a.responses.create(model=MODEL, input="say:polled", background=True)
        assert wait_until_done(b, bg.id).output_text == "polled"
        events = list(b.responses.retrieve(bg.id, stream=True))  # from the store: b never had it live
        assert events[-1].type == "response.completed" and events[-1].response.output_text == "polled"
        start = lambda: a.responses.create(model=MODEL, input="long:50", background=True)  # noqa: E731
        with stopped_mid_generation(eng, start) as bg:  # cancelled through b: a aborts the engine's request
            followed: list[Any] = []
            follower = threading.Thread(target=lambda: followed.extend(b.responses.retrieve(bg.id, stream=True)))
            follower.start()  # b follows it from the store while a generates it
            assert b.responses.cancel(bg.id).status == "cancelled"
            follower.join(120)
            assert not follower.is_alive() and followed and followed[0].type == "response.created"
        assert a.responses.retrieve(bg.id).status == "cancelled"
        with stopped_mid_generation(eng, start) as bg:  # deleted through b: a sees it gone and stops
            assert b.responses.delete(bg.id) is None
        with pytest.raises(openai.NotFoundError):
            a.responses.retrieve(bg.id)


def test_the_database_stopped_mid_request_is_a_503_naming_it(engine: tuple[Engine, str]) -> None:
    eng, up = engine
    with postgres_server() as pg, serving(create_app(Settings(upstream=(up,), store=pg.url, store_timeout=20))) as gw:
        c = client(gw)
        r = c.responses.create(model=MODEL, input="say:before")
        eng.pause_at, eng.resume = 2, threading.Event()
        try:
            stream = c.responses.create(model=MODEL, input="long:20", stream=True, previous_response_id=r.id)
            events = iter(stream)
            next(events)
            pg.stop()
            eng.resume.set()
            rest = list(events)
        finally:
            eng.resume.set()
            eng.pause_at = None
        # the answer streamed, but it was never stored: no "completed" claims it was; the stream
        # ends with an error event naming the store
        assert all(e.type != "response.completed" for e in rest)
        assert rest[-1].type == "error" and f"the store (postgresql 127.0.0.1:{pg.port}/postgres)" in rest[-1].message
        for call in (lambda: c.responses.retrieve(r.id),
                     lambda: c.responses.create(model=MODEL, input="say:x", previous_response_id=r.id),
                     lambda: c.conversations.create()):
            with pytest.raises(openai.InternalServerError, match="postgresql") as err:
                call()
            assert err.value.status_code == 503
        pg.start()  # back: the next call connects again
        assert c.responses.retrieve(r.id).output_text == "before"


def test_a_slow_database_is_a_503_and_blocks_no_one_else(engine: tuple[Engine, str], postgres: Any) -> None:
    """Another session holds the responses table locked: a stored response waits for its store
    call's bound (10 s here) and is a 503 naming the store, while a chat request (no store),
    sent once the stored one is seen waiting on the lock, is served meanwhile: the event loop
    never waits on the database."""
    import psycopg

    _, up = engine
    name = "slow" + str(os.getpid())
    with psycopg.connect(postgres.url, autocommit=True) as admin:
        admin.execute(f"DROP DATABASE IF EXISTS {name}")
        admin.execute(f"CREATE DATABASE {name}")
    url = postgres.url.rsplit("/", 1)[0] + "/" + name
    with serving(create_app(Settings(upstream=(up,), store=url, store_timeout=10))) as gw:
        c = client(gw)
        c.responses.create(model=MODEL, input="say:warm")  # the tables exist
        with psycopg.connect(url) as locker:
            locker.execute("LOCK TABLE hk_responses IN ACCESS EXCLUSIVE MODE")
            result: dict[str, Any] = {}

            def stored() -> None:
                try:
                    c.responses.create(model=MODEL, input="say:blocked")
                except openai.APIStatusError as e:
                    result["error"] = e
            t = threading.Thread(target=stored)
            t.start()
            with psycopg.connect(url, autocommit=True) as watch:
                for _ in range(1200):  # a guard: until the stored request waits on the lock
                    if watch.execute("SELECT count(*) FROM pg_locks WHERE NOT granted").fetchone()[0]:  # type: ignore[index]
                        break
                    time.sleep(0.05)
            chat = c.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "say:free"}])
            assert chat.choices[0].message.content == "free" and t.is_alive()  # served while the other waits
            t.join(120)
            locker.rollback()
        err = result["error"]
        assert err.status_code == 503 and f"the store (postgresql 127.0.0.1:{postgres.port}/{name}) did not answer " \
            "within 10 s" in err.message
        assert c.responses.create(model=MODEL, input="say:after").output_text == "after"


# -- the OpenAI Agents SDK -------------------------------------------------------------------


def _agent(base: str) -> tuple[Any, Any]:
    from agents import Agent, OpenAIResponsesModel, function_tool, set_tracing_disabled

    set_tracing_disabled(True)
    calls: list[str] = []

    @function_tool
    def lookup(q: str) -> str:
        """Look a thing up."""
        calls.append(q)
        return f"found {q}"

    oai = openai.AsyncOpenAI(base_url=base + "/v1", api_key="none", max_retries=0, timeout=120)
    agent = Agent(name="helper", instructions="Use the tool.", tools=[lookup],
                  model=OpenAIResponsesModel(model=MODEL, openai_client=oai))
    return agent, (oai, calls)


def test_the_agents_sdk_over_previous_response_id(gw_for_agents: str) -> None:
    from agents import Runner

    agent, (oai, calls) = _agent(gw_for_agents)

    async def go() -> None:
        first = await Runner.run(agent, 'call:lookup:{"q": "oslo"}')
        assert first.final_output == 'tool said found oslo' and calls == ["oslo"]
        second = await Runner.run(agent, 'call:lookup:{"q": "bergen"}', previous_response_id=first.last_response_id)
        assert second.final_output == 'tool said found bergen' and calls == ["oslo", "bergen"]
        stored = await oai.responses.retrieve(second.last_response_id)
        assert stored.previous_response_id is not None
        await oai.close()
    asyncio.run(go())


def test_the_agents_sdk_with_its_conversations_session(gw_for_agents: str) -> None:
    from agents import OpenAIConversationsSession, Runner

    agent, (oai, _) = _agent(gw_for_agents)

    async def go() -> None:
        session = OpenAIConversationsSession(openai_client=oai)
        first = await Runner.run(agent, 'call:lookup:{"q": "rome"}', session=session)
        second = await Runner.run(agent, "say:and now?", session=session)
        assert first.final_output == 'tool said found rome' and second.final_output == "and now?"
        items = await session.get_items()
        kinds = [i.get("type", "message") for i in items]
        assert kinds.count("function_call") == 1 and kinds.count("function_call_output") == 1
        texts = [str(i.get("content")) for i in items]
        assert any("rome" in t for t in texts) and any("and now?" in t for t in texts)
        await oai.close()
    asyncio.run(go())


@pytest.fixture
def gw_for_agents(engine: tuple[Engine, str], store_url: str) -> Iterator[str]:
    with serving(create_app(Settings(upstream=(engine[1],), store=store_url))) as url:
        yield url
