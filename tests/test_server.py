"""The gateway for real: uvicorn on 127.0.0.1, the real ``openai`` client (sync and async,
streaming and not, Chat and Responses), a real scripted engine behind it (tests/engine.py)."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import openai
import pytest

import harmonykit as hk
from engine import WILD, Engine, dead_url, free_socket, serving
from harmonykit.openai import completion_to_chat_choice, completion_to_response
from harmonykit.server import Settings, create_app

MODEL = "gpt-oss-20b"


@pytest.fixture(scope="module")
def engine() -> Iterator[tuple[Engine, str]]:
    eng = Engine(seed=1)
    with serving(eng) as url:
        yield eng, url


@pytest.fixture(scope="module")
def gateway(engine: tuple[Engine, str]) -> Iterator[str]:
    with serving(create_app(Settings(upstream=(engine[1],), upstream_timeout=60))) as url:
        yield url


def client(base: str, **kw: Any) -> openai.OpenAI:
    return openai.OpenAI(base_url=base + "/v1", api_key=kw.pop("api_key", "none"), max_retries=0,
                         timeout=kw.pop("timeout", 120), **kw)  # a guard against a hang


def aclient(base: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=base + "/v1", api_key="none", max_retries=0, timeout=120)


def _chat(case_id: str) -> dict[str, Any]:
    case = WILD[case_id]
    return {"model": MODEL, "messages": [{"role": "user", "content": f"case:{case_id}"}],
            **({"tools": case["request"]["tools"]} if case.get("request", {}).get("tools") else {})}


def _shape(message: dict[str, Any]) -> tuple[Any, ...]:
    calls = [(c["function"]["name"], c["function"]["arguments"]) for c in message.get("tool_calls") or []]
    return ((message.get("content") or "").strip(), (message.get("reasoning_content") or "").strip(), calls)


@pytest.mark.parametrize("case_id", sorted(WILD))
def test_wild_cases_through_the_gateway(gateway: str, engine: tuple[Engine, str], case_id: str) -> None:
    """Every wild case answers 200 with what the mapping gives for the engine's output."""
    enc = hk.load_harmony_encoding(hk.HarmonyEncodingName.HARMONY_GPT_OSS)
    case = WILD[case_id]
    body = _chat(case_id)
    expected = completion_to_chat_choice(enc, enc.encode(case["text"], allowed_special="all"), request=body,
                                         finish_reason=case["engine_finish_reason"])
    c = client(gateway)
    got = c.chat.completions.create(**body).model_dump()
    choice = got["choices"][0]
    message = {**choice["message"], "reasoning_content": choice["message"].get("reasoning_content")}
    assert _shape(message) == _shape(expected["message"])
    assert choice["finish_reason"] == expected["finish_reason"]
    # streamed: the same, whatever the chunking
    content, reasoning, calls = [], [], {}
    finish = None
    for chunk in c.chat.completions.create(**body, stream=True):
        if not chunk.choices:
            continue
        d = chunk.choices[0].delta.model_dump()
        content.append(d.get("content") or "")
        reasoning.append(d.get("reasoning_content") or "")
        for tc in d.get("tool_calls") or []:
            entry = calls.setdefault(tc["index"], ["", ""])
            entry[0] += (tc.get("function") or {}).get("name") or ""
            entry[1] += (tc.get("function") or {}).get("arguments") or ""
        finish = chunk.choices[0].finish_reason or finish
    streamed = ("".join(content).strip(), "".join(reasoning).strip(), [tuple(v) for _, v in sorted(calls.items())])
    assert streamed == _shape(expected["message"]) and finish == expected["finish_reason"]
    assert "<|" not in json.dumps(_shape(message))  # the harmony field's details may name tokens


def test_responses_sync_and_async(gateway: str) -> None:
    c = client(gateway)
    r = c.responses.create(model=MODEL, input="load:3")
    assert r.output_text == "answer 3" and r.status == "completed"
    assert r.usage is not None and r.usage.output_tokens_details.reasoning_tokens > 0
    with c.responses.stream(model=MODEL, input="load:4") as stream:
        types = [event.type for event in stream]
        final = stream.get_final_response()
    assert final.output_text == "answer 4" and types[-1] == "response.completed"

    async def go() -> None:
        a = aclient(gateway)
        r = await a.responses.create(model=MODEL, input="load:5")
        assert r.output_text == "answer 5"
        chat = await a.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "load:6"}])
        assert chat.choices[0].message.content == "answer 6"
        stream = await a.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "load:7"}],
                                                 stream=True, stream_options={"include_usage": True})
        parts, usage = [], None
        async for chunk in stream:
            if chunk.choices:
                parts.append(chunk.choices[0].delta.content or "")
            usage = chunk.usage or usage
        assert "".join(parts) == "answer 7" and usage is not None and usage.completion_tokens > 0
        await a.close()

    asyncio.run(go())


def test_tool_call_round_trip(gateway: str) -> None:
    c = client(gateway)
    body = _chat("wild-010")
    r = c.chat.completions.create(**body)
    call = r.choices[0].message.tool_calls[0]  # type: ignore[index]
    assert call.function.name == "exec" and r.choices[0].finish_reason == "tool_calls"
    follow = c.chat.completions.create(**{**body, "messages": [
        *body["messages"], r.choices[0].message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": "file.txt"},
        {"role": "user", "content": "load:1"}]})
    assert follow.choices[0].message.content == "answer 1"


def test_sampling_parameters_reach_the_engine(gateway: str, engine: tuple[Engine, str]) -> None:
    eng, _ = engine
    client(gateway).chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "load:2"}],
                                            temperature=0.3, top_p=0.9, seed=7, max_completion_tokens=50,
                                            stop=["zzz"], extra_body={"top_k": 20})
    sent = eng.requests[-1]
    assert (sent["temperature"], sent["top_p"], sent["seed"], sent["max_tokens"], sent["stop"], sent["top_k"]) \
        == (0.3, 0.9, 7, 50, ["zzz"], 20)
    assert sent["stop_token_ids"] == [200002, 200012] and sent["skip_special_tokens"] is False
    assert all(isinstance(t, int) for t in sent["prompt"]) and sent["model"] == MODEL


def test_max_tokens_cuts_off(gateway: str) -> None:
    r = client(gateway).chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "load:9"}],
                                                max_tokens=5)
    assert r.choices[0].finish_reason == "length"
    resp = client(gateway).responses.create(model=MODEL, input="load:9", max_output_tokens=5)
    assert resp.status == "incomplete" and resp.incomplete_details.reason == "max_output_tokens"  # type: ignore[union-attr]


def test_load_200_concurrent_streams(gateway: str) -> None:
    """200 streams at once: each completes with its own content, none lost or mixed up."""
    async def one(a: openai.AsyncOpenAI, i: int) -> str:
        stream = await a.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": f"load:{i}"}],
                                                 stream=True)
        return "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])

    async def go() -> list[str]:
        a = openai.AsyncOpenAI(base_url=gateway + "/v1", api_key="none", max_retries=0, timeout=60)
        try:
            return await asyncio.wait_for(asyncio.gather(*(one(a, i) for i in range(200))), 90)
        finally:
            await a.close()

    results = asyncio.run(go())  # the 90 s of wait_for guard against a hang; how fast is make bench's
    assert results == [f"answer {i}" for i in range(200)]


def _raw(base: str, path: str, body: bytes | None = None, headers: dict[str, str] | None = None,
         method: str | None = None, timeout: float = 120) -> tuple[int, dict[str, Any] | str]:
    """One request with urllib. ``timeout`` guards against a hang only: a loaded machine may take
    many times as long as an idle one (a 12 MB body takes ~7 s to read and render on 2 idle cores)."""
    req = urllib.request.Request(base + path, data=body, method=method or ("POST" if body is not None else "GET"),
                                 headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            status, raw = r.status, r.read()
    except urllib.error.HTTPError as e:
        status, raw = e.code, e.read()
    try:
        return status, json.loads(raw)
    except ValueError:
        return status, raw.decode()


@pytest.mark.parametrize(("body", "status", "param"), [
    (b"{not json", 400, None),
    (b"[1, 2]", 400, None),
    (json.dumps({"messages": "hi"}).encode(), 400, "messages"),
    (json.dumps({"messages": [{"role": "wizard", "content": "x"}]}).encode(), 400, "messages[0].role"),
    (json.dumps({"messages": [{"role": "user", "content": "x"}], "temperature": "hot"}).encode(), 400, "temperature"),
    (json.dumps({"messages": [{"role": "user", "content": "x"}], "functions": [{"name": "f"}]}).encode(), 400,
     "functions"),  # known, and cannot be honoured (an unknown field is ignored: tests/test_clients.py)
    (json.dumps({"messages": [{"role": "user", "content": "x"}], "stream": "yes"}).encode(), 400, "stream"),
    (json.dumps({"messages": [{"role": "user", "content": "x"}],
                 "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "blob"}}}]}).encode(),
     400, "tools[0].function.parameters.type"),
])
def test_bad_input_is_a_400_naming_the_param(gateway: str, body: bytes, status: int, param: str | None) -> None:
    code, out = _raw(gateway, "/v1/chat/completions", body)
    assert code == status and isinstance(out, dict)
    assert out["error"]["type"] == "invalid_request_error" and out["error"]["param"] == param
    code, out = _raw(gateway, "/v1/responses", json.dumps({"input": "x", "previous_response_id": "r"}).encode())
    assert code == 400 and out["error"]["param"] == "previous_response_id"  # type: ignore[index]


def test_routes(gateway: str) -> None:
    assert _raw(gateway, "/v1/nothing")[0] == 404
    assert _raw(gateway, "/v1/chat/completions", method="GET")[0] == 405
    code, models = _raw(gateway, "/v1/models")
    assert code == 200 and models["data"][0]["id"] == MODEL  # type: ignore[index]
    assert [m.id for m in client(gateway).models.list()] == [MODEL]
    code, health = _raw(gateway, "/health")
    assert code == 200 and health["upstreams"][0]["healthy"] is True  # type: ignore[index]
    code, metrics = _raw(gateway, "/metrics")
    assert code == 200 and isinstance(metrics, str)
    assert 'harmonykit_requests_total{endpoint="/v1/chat/completions",status="200"}' in metrics
    assert "harmonykit_repairs_total" in metrics and "harmonykit_upstream_latency_seconds_bucket" in metrics
    assert 'harmonykit_tokens_total{direction="out"}' in metrics and "harmonykit_streams_open" in metrics


def test_api_key_body_limit_and_concurrency() -> None:
    eng = Engine()
    with serving(eng) as up, serving(create_app(Settings(upstream=(up,), api_key="sekrit", max_body_bytes=2000,
                                                         max_concurrency=1))) as gw:
        with pytest.raises(openai.AuthenticationError):
            client(gw, api_key="wrong").chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x"}])
        code, out = _raw(gw, "/v1/chat/completions", b"{}")
        assert code == 401 and out["error"]["code"] == "invalid_api_key"  # type: ignore[index]
        good = client(gw, api_key="sekrit")
        assert good.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "load:1"}]) \
            .choices[0].message.content == "answer 1"
        with pytest.raises(openai.APIStatusError) as info:
            good.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x" * 5000}])
        assert info.value.status_code == 413
        # one request in flight (a slow stream) fills the gateway: the next gets 429
        eng.delay = 0.05
        stream = good.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "load:2"}],
                                              stream=True)
        next(iter(stream))
        with pytest.raises(openai.RateLimitError):
            good.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "load:3"}])
        assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == "answer 2"


def test_upstream_faults() -> None:
    """Each fault gives its documented status or stream ending, and the gateway keeps serving."""
    eng = Engine()
    with serving(eng) as up, serving(create_app(Settings(upstream=(up,), upstream_timeout=1.0))) as gw:
        c = client(gw)

        def ask(script: str, **kw: Any) -> Any:
            return c.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": script}], **kw)

        for script, status in (("fault:500", 502), ("fault:nonjson", 502), ("fault:slow", 504),
                               ("fault:reject", 400)):
            with pytest.raises(openai.APIStatusError) as info:
                ask(script)
            assert info.value.status_code == status, script
        # mid-stream: the engine breaks off, or goes silent past the timeout: an error, never a success
        for script in ("fault:midway", "fault:silent"):
            stream = ask(script, stream=True)
            reasons = []
            with pytest.raises(openai.APIError):
                for chunk in stream:
                    reasons += [ch.finish_reason for ch in chunk.choices if ch.finish_reason]
            assert reasons == ["error"], script
        with c.responses.stream(model=MODEL, input="fault:midway") as rs:
            types = [e.type for e in rs]
        assert types[-1] == "response.failed"
        assert ask("load:5").choices[0].message.content == "answer 5"
    # the engine is down
    with serving(create_app(Settings(upstream=(dead_url(),)))) as gw:
        with pytest.raises(openai.APIStatusError) as info:
            client(gw).chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x"}])
        assert info.value.status_code == 502
        assert _raw(gw, "/health")[0] == 503
        assert _raw(gw, "/v1/models")[0] == 502


def test_failover_between_upstreams() -> None:
    eng = Engine()
    with serving(eng) as up, serving(create_app(Settings(upstream=(dead_url(), up)))) as gw:
        c = client(gw)
        answers = [c.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": f"load:{i}"}])
                   .choices[0].message.content for i in range(4)]
        assert answers == [f"answer {i}" for i in range(4)]
        code, health = _raw(gw, "/health")
        assert code == 200 and [u["healthy"] for u in health["upstreams"]] == [False, True]  # type: ignore[index]


def test_a_whole_answers_client_disconnect_cancels_the_upstream_request() -> None:
    """Not streaming: the client gives up (its timeout) while the engine is still working."""
    eng = Engine()
    with serving(eng) as up, serving(create_app(Settings(upstream=(up,)))) as gw:
        with pytest.raises(openai.APITimeoutError):
            client(gw, timeout=0.5).chat.completions.create(model=MODEL,
                                                            messages=[{"role": "user", "content": "fault:slow"}])
        deadline = time.monotonic() + 60  # a guard: the loop ends when it happens
        while eng.cancelled < 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert eng.cancelled == 1 and eng.active == 0
        _, health = _raw(gw, "/health")
        assert health["active_requests"] == 0  # type: ignore[index]


def test_client_disconnect_cancels_the_upstream_request() -> None:
    eng = Engine()
    with serving(eng) as up, serving(create_app(Settings(upstream=(up,)))) as gw:
        c = client(gw)
        stream = c.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "fault:hang"}],
                                           stream=True)
        next(iter(stream))
        stream.close()  # the client goes away mid-stream
        deadline = time.monotonic() + 60  # a guard: the loop ends when it happens
        while eng.cancelled < 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert eng.cancelled == 1 and eng.active == 0
        assert c.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "load:1"}]) \
            .choices[0].message.content == "answer 1"


def test_matches_the_mapping_exactly(gateway: str, engine: tuple[Engine, str]) -> None:
    """A Responses answer is the mapping's result for the engine's tokens (ids aside)."""
    eng, _ = engine
    assert eng.token_ids  # the module's engine returns ids (a text-only one re-encodes: counts may differ)
    enc = hk.load_harmony_encoding(hk.HarmonyEncodingName.HARMONY_GPT_OSS)
    case = WILD["wild-002"]
    got = client(gateway).responses.create(model=MODEL, input="case:wild-002").model_dump(exclude_none=True)
    want = completion_to_response(enc, enc.encode(case["text"], allowed_special="all"))
    strip = lambda items: [{k: v for k, v in i.items() if k not in ("id", "call_id")} for i in items]  # noqa: E731
    assert strip(got["output"]) == [{k: v for k, v in i.items() if v is not None}
                                    for i in strip(want["output"])]


def test_serve_command_smoke(tmp_path: Any) -> None:
    """``harmonykit serve`` as a user runs it: flags and environment, a real request, a clean stop."""
    eng = Engine()
    with serving(eng) as up:
        sock = free_socket()
        port = sock.getsockname()[1]
        sock.close()
        env = {**os.environ, "HARMONYKIT_UPSTREAM": up, "HARMONYKIT_API_KEY": "k"}
        proc = subprocess.Popen([sys.executable, "-m", "harmonykit", "serve", "--host", "127.0.0.1",
                                 "--port", str(port)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        try:
            base = f"http://127.0.0.1:{port}"
            deadline = time.monotonic() + 120  # a guard: the loop ends when it is up
            while True:
                try:
                    if _raw(base, "/health")[0] == 200:
                        break
                except OSError:
                    pass
                assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read() if proc.stderr else ""
                time.sleep(0.1)
            r = client(base, api_key="k").chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": "load:11"}])
            assert r.choices[0].message.content == "answer 11"
        finally:
            proc.terminate()
            try:
                _, err = proc.communicate(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                _, err = proc.communicate()
        log = [json.loads(line) for line in err.decode().splitlines() if line.startswith("{")]
        assert any(entry.get("endpoint") == "/v1/chat/completions" and entry["status"] == 200 for entry in log)
        assert all("request" not in entry for entry in log)  # no content without --log-content


def test_serve_without_upstream_says_how_to_fix_it() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HARMONYKIT_")}
    proc = subprocess.run([sys.executable, "-m", "harmonykit", "serve"], env=env, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 2 and "--upstream" in proc.stderr


@pytest.mark.parametrize(("engine", "field"), [("vllm", "structured_outputs"), ("sglang", "ebnf")])
def test_guided_sends_the_grammar_upstream(engine: str, field: str) -> None:
    from harmonykit.grammar import harmony_grammar

    eng = Engine()
    body = {"model": MODEL, "messages": [{"role": "user", "content": "load:1"}],
            "tools": [{"type": "function", "function": {"name": "get weather", "parameters": {"type": "object"}}}]}
    with serving(eng) as up, serving(create_app(Settings(upstream=(up,), guided=engine, engine=engine))) as gw:
        assert client(gw).chat.completions.create(**body).choices[0].message.content == "answer 1"
        sent = eng.requests[-1][field]
        grammar = sent["grammar"] if engine == "vllm" else sent
        assert grammar == harmony_grammar(body) and "to=functions.get_weather" in grammar
        code, out = _raw(gw, "/v1/chat/completions", json.dumps({**body, "tool_choice": "required",
                                                                  "tools": []}).encode())
        assert code == 400 and out["error"]["param"] == "tool_choice"  # type: ignore[index]


def test_guided_llamacpp_is_refused_with_the_reason() -> None:
    with pytest.raises(ValueError, match="user-defined"):
        Settings(upstream=("http://127.0.0.1:1",), guided="llamacpp")


def _nested(depth: int) -> str:
    return "[" * depth + "1" + "]" * depth


@pytest.mark.parametrize("field", ["temperature", "tool_choice", "reasoning_effort", "role"])
def test_deeply_nested_values_are_a_short_400(field: str, engine: tuple[Engine, str], caplog: pytest.LogCaptureFixture) -> None:
    deep = _nested(900)
    message = f'{{"role": {deep}, "content": "x"}}' if field == "role" else '{"role": "user", "content": "x"}'
    extra = "" if field == "role" else f', "{field}": {deep}'
    body = f'{{"model": "m", "messages": [{message}]{extra}}}'.encode()
    with serving(create_app(Settings(upstream=(engine[1],), log_content=True))) as gw, \
            caplog.at_level(logging.INFO, "harmonykit.server"):
        code, out = _raw(gw, "/v1/chat/completions", body)
    assert code == 400 and len(out["error"]["message"]) < 300  # type: ignore[index]
    lines = [r for r in caplog.records if r.getMessage().startswith('{"id"')]
    assert len(lines) == 1 and '"status":400' in lines[0].getMessage()


def test_a_huge_value_is_not_repeated_back(gateway: str) -> None:
    body = json.dumps({"model": MODEL, "messages": [{"role": "x" * 1_000_000, "content": "hi"}]}).encode()
    code, out = _raw(gateway, "/v1/chat/completions", body)
    assert code == 400 and len(json.dumps(out)) < 1000


def test_one_log_line_even_when_the_body_cannot_be_logged(engine: tuple[Engine, str],
                                                          caplog: pytest.LogCaptureFixture) -> None:
    head = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "load:2"}]})[:-1]
    body = head + ', "metadata": {"k": ' + _nested(300) + "}}"
    with serving(create_app(Settings(upstream=(engine[1],), log_content=True))) as gw, \
            caplog.at_level(logging.INFO, "harmonykit.server"):
        code, _ = _raw(gw, "/v1/chat/completions", body.encode())
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith('{"id"')]
    assert len(lines) == 1 and f'"status":{code}' in lines[0]


def test_health_answers_from_state_and_shows_engines_only_with_the_key() -> None:
    eng = Engine()
    with serving(eng) as up, serving(create_app(Settings(upstream=(up,), api_key="k", health_interval=60))) as gw:
        served = len(eng.requests)
        models_before = eng.models_served
        for _ in range(50):
            code, out = _raw(gw, "/health")
            assert code == 200 and out == {"status": "ok"}
        assert eng.models_served == models_before and len(eng.requests) == served  # no engine calls
        code, out = _raw(gw, "/health", headers={"Authorization": "Bearer k"})
        assert code == 200 and out["upstreams"][0]["url"] == up  # type: ignore[index]


@pytest.mark.parametrize(("key", "why"), [("", "empty"), ("clé", "ASCII"), ("a\nb", "ASCII")])
def test_keys_that_cannot_work_are_refused_at_startup(key: str, why: str) -> None:
    with pytest.raises(ValueError, match=why):
        Settings(upstream=("http://127.0.0.1:1",), api_key=key)
    with pytest.raises(ValueError, match=why):
        Settings.from_sources({"upstream": ["http://127.0.0.1:1"]}, {"HARMONYKIT_API_KEY": key})


def test_idle_request_bodies_hold_no_slot_and_time_out() -> None:
    """Four sockets that promise a body and send nothing, against --max-concurrency 2."""
    import socket as socketlib

    eng = Engine()
    with serving(eng) as up, serving(create_app(Settings(upstream=(up,), max_concurrency=2, body_timeout=1.5))) as gw:
        port = int(gw.rsplit(":", 1)[1])
        idle = []
        for _ in range(4):
            s = socketlib.create_connection(("127.0.0.1", port), timeout=10)
            s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                      b"Content-Length: 100000\r\n\r\n")
            idle.append(s)
        try:
            time.sleep(0.3)
            answer = client(gw).chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "load:3"}])
            assert answer.choices[0].message.content == "answer 3"  # not a 429
            for s in idle:
                s.settimeout(60)  # a guard against a hang: the 408 comes after body_timeout
                head = s.recv(200)
                assert head.startswith(b"HTTP/1.1 408"), head
        finally:
            for s in idle:
                s.close()


@pytest.mark.parametrize(("messages", "context"), [
    # one 12 MB message with no white space, in a context it could fit: rendered, then sent
    ([{"role": "user", "content": "x" * 12_000_000}], 10_000_000),
    # 250k short messages (2M tokens): rendered, then refused as past the context
    ([{"role": "user", "content": f"question {i}"} for i in range(250_000)], 1_000_000),
], ids=["one-huge-message", "250k-short-messages"])
def test_a_large_render_does_not_stall_other_streams(messages: list[dict[str, str]], context: int,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """A large request is rendered off the event loop: while its render runs, another stream gets
    its chunks. Told by order, not time: the other stream's engine pauses after PAUSE tokens until
    the render has begun, and the render waits, in its thread, until that stream has shown more
    than PAUSE words, which it can only do if the gateway's loop is free (a render on the loop
    would wait for ever; the guard ends that wait, and the test fails). How long the other
    stream's longest gap is, is make bench's to measure."""
    import threading

    from harmonykit.server import app as app_module

    pause = 200
    eng = Engine(chunk=1)
    eng.delay, eng.context, eng.pause_at = 0.003, context, pause
    words_seen = 0
    words_during: list[int] = []
    past_the_pause = threading.Event()
    on_loop: list[bool] = []
    real = app_module._RENDER["chat"]

    def render(encoding: hk.HarmonyEncoding, request: dict[str, Any]) -> Any:
        if request["messages"][0]["content"] == "long:20000":
            return real(encoding, request)  # the other stream's own request
        try:
            asyncio.get_running_loop()
            on_loop.append(True)
        except RuntimeError:
            on_loop.append(False)
        eng.resume.set()
        past_the_pause.wait(60)
        words_during.append(words_seen)
        return real(encoding, request)

    monkeypatch.setitem(app_module._RENDER, "chat", render)
    big = json.dumps({"model": MODEL, "messages": messages, "max_tokens": 1}).encode()
    done = threading.Event()
    with serving(eng) as up, serving(create_app(Settings(upstream=(up,), max_body_bytes=64 * 1024 * 1024))) as gw:
        def stream() -> None:
            nonlocal words_seen
            with client(gw, timeout=120).chat.completions.create(
                    model=MODEL, stream=True, messages=[{"role": "user", "content": "long:20000"}]) as s:
                for chunk in s:
                    words_seen += sum((c.delta.content or "").count("word") for c in chunk.choices)
                    if words_seen > pause:
                        past_the_pause.set()
                    if done.is_set():
                        break

        reader = threading.Thread(target=stream)
        reader.start()
        try:
            while words_seen == 0 and reader.is_alive():  # the other stream is under way
                time.sleep(0.01)
            code, _ = _raw(gw, "/v1/chat/completions", big, timeout=600)
        finally:
            done.set()
            eng.resume.set()
            reader.join(60)
    assert not reader.is_alive()
    assert code in (200, 400)
    assert on_loop == [False], "the large request was rendered on the event loop"
    assert words_during and words_during[0] > pause, "the other stream stalled while the render ran"


def test_a_body_far_past_the_context_is_refused_before_any_work(engine: tuple[Engine, str],
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    from harmonykit.server import app as app_module

    rendered: list[int] = []
    real = app_module._RENDER["chat"]
    monkeypatch.setitem(app_module._RENDER, "chat", lambda enc, req: rendered.append(1) or real(enc, req))
    big = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "x" * 2_000_000}]}).encode()
    with serving(create_app(Settings(upstream=(engine[1],)))) as gw:
        _raw(gw, "/health")
        sent = len(engine[0].requests)
        code, out = _raw(gw, "/v1/chat/completions", big, timeout=600)
    assert code == 400 and out["error"]["code"] == "context_length_exceeded"  # type: ignore[index]
    assert out["error"]["param"] == "messages"  # type: ignore[index]
    assert rendered == [] and len(engine[0].requests) == sent  # neither rendered nor sent


def test_an_endless_engine_line_is_cut_off(engine: tuple[Engine, str]) -> None:
    with serving(create_app(Settings(upstream=(engine[1],)))) as gw:
        reasons = []
        with pytest.raises(openai.APIError):
            for chunk in client(gw).chat.completions.create(model=MODEL, stream=True,
                                                            messages=[{"role": "user", "content": "fault:bigline"}]):
                reasons += [c.finish_reason for c in chunk.choices if c.finish_reason]
        assert reasons == ["error"]


def test_slow_headers_are_cut_off_and_others_are_served() -> None:
    """Sockets that open and send half a request head (or nothing), against the gateway's own
    protocol, with --max-concurrency 2: they are closed, and other clients are served."""
    import socket as socketlib

    from harmonykit.server.http import uvicorn_options

    with serving(Engine()) as up:
        settings = Settings(upstream=(up,), max_concurrency=2, header_timeout=1.0)
        with serving(create_app(settings), **uvicorn_options(settings.header_timeout)) as gw:
            port = int(gw.rsplit(":", 1)[1])
            slow = [socketlib.create_connection(("127.0.0.1", port), timeout=10) for _ in range(20)]
            try:
                for s in slow[:10]:
                    s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n")  # and never the rest
                answer = client(gw).chat.completions.create(model=MODEL,
                                                            messages=[{"role": "user", "content": "load:4"}])
                assert answer.choices[0].message.content == "answer 4"
                for s in slow:
                    s.settimeout(60)  # a guard against a hang: the gateway closes them after header_timeout
                    assert s.recv(100) == b""  # closed by the gateway
            finally:
                for s in slow:
                    s.close()


def test_a_headerless_answer_streams_before_its_end() -> None:
    """Point 10 of #15: an answer with no header (no <|channel|>, no <|message|>) is shown as it
    is generated, from the HEADER_LIMIT-th token on, not all at once at its end. The engine holds
    its last chunk until the client has seen text: text that came only at the end never comes."""
    import threading

    eng = Engine(chunk=1, split_frames=False)
    eng.gate = threading.Event()
    with serving(eng) as up, serving(create_app(Settings(upstream=(up,)))) as gw:
        stream = client(gw, timeout=120).chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "headerless:400"}], stream=True, max_tokens=2000)
        parts, before_the_end = [], None
        for chunk in stream:
            text = chunk.choices[0].delta.content if chunk.choices else None
            if text:
                if before_the_end is None:
                    before_the_end = not eng.sent_last
                    eng.gate.set()
                parts.append(text)
    assert before_the_end, "the headerless answer was shown only at its end"
    assert "".join(parts).startswith("word0. word1.") and "".join(parts).endswith("word399.")
    assert len(parts) > 1


def test_a_stream_closed_before_it_is_read_stops_the_engine() -> None:
    """A client that leaves before the first batch leaves the engine's stream unread: closing it
    must still close the connection (an unstarted generator's own cleanup never runs), or the
    engine generates on. This failed before EngineStream."""
    from harmonykit.openai import render_chat_request
    from harmonykit.server.engines import Job
    from harmonykit.server.upstream import Upstream

    eng = Engine()
    enc = hk.load_harmony_encoding(hk.HarmonyEncodingName.HARMONY_GPT_OSS)
    prompt = render_chat_request(enc, {"messages": [{"role": "user", "content": "fault:hang"}]}).tokens

    async def main() -> int:
        upstream = Upstream((up,), timeout=10)
        await upstream.start()
        try:
            stream = await upstream.stream(Job(prompt, {}, 100), MODEL, enc)
            await stream.aclose()  # never read
            deadline = time.monotonic() + 60  # a guard: the loop ends when it happens
            while eng.cancelled < 1 and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            return eng.cancelled
        finally:
            await upstream.close()

    with serving(eng) as up:
        assert asyncio.run(main()) == 1 and eng.active == 0


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize(("stop", "content"), [
    (["###"], "Hello "),
    (["lo ##"], "Hel"),  # ends inside a token: its text before the string is kept
    ("there", "Hello ### "),  # a string, not a list, as the API allows
    (["zzz", "# t"], "Hello ##"),
    (["never"], "Hello ### there"),
], ids=["token", "straddling", "string", "second-of-two", "no-match"])
def test_stop_strings_end_the_answer(gateway: str, engine: tuple[Engine, str], stream: bool,
                                     stop: list[str] | str, content: str) -> None:
    """The engine (as SGLang) stops at a stop string, cuts it from its text but keeps the token that
    completed it in its ids: the gateway, which reads ids, must cut the answer there itself."""
    body: dict[str, Any] = {"model": MODEL, "messages": [{"role": "user", "content": "say:Hello ### there"}],
                            "stop": stop, "max_tokens": 100}
    if stream:
        parts, reasons = [], []
        for chunk in client(gateway).chat.completions.create(**body, stream=True):
            for c in chunk.choices:
                parts.append(c.delta.content or "")
                reasons += [c.finish_reason] if c.finish_reason else []
        got, reason = "".join(parts), reasons
        assert reason == ["stop"]
    else:
        r = client(gateway).chat.completions.create(**body)
        got = r.choices[0].message.content or ""
        assert r.choices[0].finish_reason == "stop"
        assert r.choices[0].message.reasoning_content == "Think."  # type: ignore[attr-defined]
    assert got == content
    assert engine[0].requests[-1]["stop"] == ([stop] if isinstance(stop, str) else stop)  # asked of the engine too
