"""The gateway in front of real engines: vLLM 0.32 (CPU build) and llama.cpp's server
(xllamacpp), both serving a tiny random-weight gpt-oss made offline (tests/real).

A random model writes noise. ``logit_bias`` pushes it to write Harmony's control
tokens where they do not belong; guided decoding holds it to valid Harmony. Every
answer is checked against what the engine itself generated for the same request and
seed (asked directly on its completion endpoint): no control-token text in any
field, nothing the model wrote lost, no error; under guidance, no repair.

These tests start real processes; one that will not start fails the test (never a
skip). Every process is stopped, also when a test fails.
"""

from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import Iterator
from typing import Annotated, Any

import httpx
import jsonschema
import openai
import pytest
from pydantic import Field

import harmonykit as hk
from engine import serving
from harmonykit.openai import render_chat_request
from harmonykit.server import Settings, create_app
from harmonykit.server.engines import Profile, profile_of
from harmonykit.tokens import CALL, CHANNEL, CONSTRAIN, END, MESSAGE, RETURN, START
from real.servers import LOGS, SERVED, llama_server

pytestmark = pytest.mark.real_engines

ENC = hk.load_harmony_encoding(hk.HarmonyEncodingName.HARMONY_GPT_OSS)
CLIENT_MODEL = "gpt-4o"  # a name no engine here serves: the gateway sends the served one
# Control tokens where they do not belong: about one token in six is one of them.
NOISE = {**{str(t): 9 for t in (CHANNEL, MESSAGE, START, CONSTRAIN, END)}, str(RETURN): 5, str(CALL): 5}
# Under a grammar only admitted tokens are sampled: these make text regions end soon.
TERSE = {str(t): 12 for t in (END, RETURN, CALL, CONSTRAIN)} | {str(ENC.encode('"')[0]): 6,
                                                                 str(ENC.encode('"}')[0]): 8}
WEATHER = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"],
           "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
                                           "parameters": WEATHER}}]


# -- engines and gateways ----------------------------------------------------------

@pytest.fixture(scope="module")
def llama() -> Iterator[str]:
    with llama_server(special=False) as url:
        yield url


@pytest.fixture(scope="module")
def llama_special() -> Iterator[str]:
    with llama_server(special=True) as url:
        yield url


def _gateway(upstream: str, **settings: Any) -> Iterator[str]:
    with serving(create_app(Settings(upstream=(upstream,), upstream_timeout=120, **settings))) as url:
        yield url


@pytest.fixture(scope="module")
def gw_vllm(vllm: str) -> Iterator[str]:
    yield from _gateway(vllm)


@pytest.fixture(scope="module")
def gw_guided(vllm: str) -> Iterator[str]:
    yield from _gateway(vllm, guided="vllm")


@pytest.fixture(scope="module")
def gw_llama(llama: str) -> Iterator[str]:
    yield from _gateway(llama)


@pytest.fixture(scope="module")
def gw_llama_special(llama_special: str) -> Iterator[str]:
    yield from _gateway(llama_special)


TARGETS = {"vllm": ("gw_vllm", "vllm"), "llama": ("gw_llama", "llama"),
           "llama-special": ("gw_llama_special", "llama_special")}


@pytest.fixture(params=sorted(TARGETS))
def target(request: pytest.FixtureRequest) -> tuple[str, str]:
    """(the gateway, the engine behind it): vLLM, llama.cpp, llama.cpp with --special."""
    gw, up = TARGETS[request.param]
    return request.getfixturevalue(gw), request.getfixturevalue(up)


def client(base: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=base + "/v1", api_key="none", max_retries=0, timeout=120)


# -- what the engine wrote ------------------------------------------------------------

def engine_ids(url: str, body: dict[str, Any]) -> list[int]:
    """The ids the engine generates for ``body`` (a Chat request) when asked directly."""
    prompt = render_chat_request(ENC, body).tokens
    limit = body.get("max_tokens", 1024 - len(prompt))
    if _profile(url).path == "/completion":
        r = httpx.post(url + "/completion", json={
            "prompt": prompt, "n_predict": limit, "seed": body["seed"], "return_tokens": True,
            "logit_bias": [[int(k), v] for k, v in body.get("logit_bias", {}).items()]}, timeout=120)
        return list(r.json()["tokens"])
    r = httpx.post(url + "/v1/completions", json={
        "model": SERVED, "prompt": prompt, "max_tokens": limit, "seed": body["seed"], "return_token_ids": True,
        "skip_special_tokens": False, "stop_token_ids": [RETURN, CALL], "logit_bias": body.get("logit_bias")},
        timeout=120)
    return list(r.json()["choices"][0]["token_ids"])


def _profile(url: str) -> Profile:
    """Which engine this is, as the gateway recognises it (the request below is written here)."""
    with urllib.request.urlopen(url + "/v1/models", timeout=5) as r:
        return profile_of(json.loads(r.read()))


def visible(obj: Any) -> str:
    """An object's JSON without the ``harmony`` extension (whose repair notes name tokens)."""
    def strip(o: Any) -> Any:
        if isinstance(o, dict):
            return {k: strip(v) for k, v in o.items() if k != "harmony"}
        return [strip(v) for v in o] if isinstance(o, list) else o
    return json.dumps(strip(obj.model_dump()))


def wrote_text(ids: list[int]) -> bool:
    return any(t < 199998 and ENC.decode([t]).strip() for t in ids)


def assert_clean(fields: list[str | None]) -> None:
    for f in fields:
        assert f is None or "<|" not in f, f"control-token text reached the client: {f!r}"


def chat_fields(m: Any) -> tuple[list[str | None], bool]:
    calls = m.tool_calls or []
    fields = [m.content, getattr(m, "reasoning_content", None)]
    fields += [c.function.name for c in calls] + [c.function.arguments for c in calls]
    return fields, bool(m.content or getattr(m, "reasoning_content", None) or calls)


def streamed(chunks: Any) -> tuple[list[str | None], bool, str | None]:
    content, reasoning, calls, finish = [], [], [], None
    for ch in chunks:
        for c in ch.choices:
            d = c.delta
            content.append(d.content or "")
            reasoning.append(getattr(d, "reasoning_content", None) or "")
            for tc in d.tool_calls or []:
                calls.append((tc.function.name or "") + (tc.function.arguments or ""))
            finish = c.finish_reason or finish
    fields = ["".join(content), "".join(reasoning), *calls]
    return fields, any(fields), finish


def _noise(seed: int, **extra: Any) -> dict[str, Any]:
    return {"model": CLIENT_MODEL, "messages": [{"role": "user", "content": f"Say something {seed}."}],
            "max_tokens": 48, "seed": seed, "logit_bias": NOISE, **extra}


# -- tests ----------------------------------------------------------------------------

def test_engines_are_recognised(gw_vllm: str, gw_llama: str, gw_llama_special: str) -> None:
    vllm_state = httpx.get(gw_vllm + "/health").json()["upstreams"][0]
    assert (vllm_state["engine"], vllm_state["version"]) == ("vllm", "0.32.0")
    for gw in (gw_llama, gw_llama_special):
        assert httpx.get(gw + "/health").json()["upstreams"][0]["engine"] == "llamacpp"


def test_noise_chat_never_leaks_control_tokens_nor_loses_text(target: tuple[str, str]) -> None:
    gw, up = target
    leaked_engine_side = 0
    for seed in range(12):
        body = _noise(seed, **({"tools": TOOLS} if seed % 3 == 0 else {}))
        ids = engine_ids(up, body)
        leaked_engine_side += any(t in (CHANNEL, MESSAGE, START, CONSTRAIN) for t in ids)
        r = client(gw).chat.completions.create(**body)
        fields, nonempty = chat_fields(r.choices[0].message)
        assert_clean(fields)
        assert nonempty or not wrote_text(ids), f"seed {seed}: the model wrote text, the answer is empty"
        s_fields, s_nonempty, finish = streamed(client(gw).chat.completions.create(**body, stream=True))
        assert_clean(s_fields)
        assert s_nonempty or not wrote_text(ids)
        assert finish == r.choices[0].finish_reason
        assert r.model == CLIENT_MODEL
    assert leaked_engine_side >= 6  # the noise really put control tokens in the output


def test_noise_responses(target: tuple[str, str]) -> None:
    gw, _ = target
    c = client(gw)
    for seed in range(4):
        kw = {"model": CLIENT_MODEL, "input": f"Say something {seed}.", "max_output_tokens": 48,
              "extra_body": {"seed": seed, "logit_bias": NOISE}, **({"tools": [
                  {"type": "function", "name": "get_weather", "parameters": WEATHER}]} if seed % 2 else {})}
        r = c.responses.create(**kw)
        assert r.max_output_tokens == 48
        assert_clean([visible(r)])
        events = list(c.responses.create(**kw, stream=True))
        assert events[-1].type in ("response.completed", "response.incomplete")
        assert_clean([visible(e) for e in events])


def test_no_max_tokens_runs_to_the_context_not_16(target: tuple[str, str]) -> None:
    gw, _ = target
    body = {"model": CLIENT_MODEL, "messages": [{"role": "user", "content": "Go on."}], "seed": 5,
            "logit_bias": {str(RETURN): -100, str(CALL): -100}}
    r = client(gw).chat.completions.create(**body)
    room = 1024 - r.usage.prompt_tokens
    assert r.choices[0].finish_reason == "length" and r.usage.completion_tokens == room


@pytest.mark.parametrize("stream", [False, True])
def test_stop_strings_never_reach_the_client(target: tuple[str, str], stream: bool) -> None:
    gw, up = target
    stops = ["e", "a"]
    hit = 0
    for seed in range(4):
        body = {"model": CLIENT_MODEL, "messages": [{"role": "user", "content": "Talk."}], "seed": seed,
                "max_tokens": 40, "stop": stops}
        written = ENC.decode(engine_ids(up, {k: v for k, v in body.items() if k != "stop"}))
        hit += any(s in written for s in stops)
        if stream:
            fields, _, finish = streamed(client(gw).chat.completions.create(**body, stream=True))
        else:
            r = client(gw).chat.completions.create(**body)
            fields, finish = chat_fields(r.choices[0].message)[0], r.choices[0].finish_reason
        assert not any(s in (f or "") for f in fields for s in stops), fields
        if any(s in written for s in stops):
            assert finish == "stop"
        r2 = client(gw).responses.create(model=CLIENT_MODEL, input="Talk.", max_output_tokens=40,
                                         extra_body={"seed": seed, "stop": stops})
        assert not any(s in r2.output_text for s in stops)
    assert hit >= 3


def test_prompt_over_the_context_is_a_400_before_the_engine(gw_vllm: str) -> None:
    with pytest.raises(openai.BadRequestError) as e:
        client(gw_vllm).chat.completions.create(model=CLIENT_MODEL,
                                                messages=[{"role": "user", "content": "word " * 1200}])
    assert e.value.code == "context_length_exceeded"


def test_tool_choice_required_without_guided(gw_vllm: str, gw_llama: str) -> None:
    """smolagents' default: on vLLM that one request is held to its grammar (no --guided), so the
    model calls a tool; llama.cpp cannot hold gpt-oss's turn to one: a 400 saying why."""
    body = {"model": CLIENT_MODEL, "messages": [{"role": "user", "content": "Weather in Oslo?"}], "tools": TOOLS,
            "tool_choice": "required", "max_tokens": 200, "seed": 0, "logit_bias": TERSE}
    r = client(gw_vllm).chat.completions.create(**body)
    assert r.choices[0].message.tool_calls or r.choices[0].finish_reason == "length"
    if r.choices[0].message.tool_calls:
        json.loads(r.choices[0].message.tool_calls[0].function.arguments)
    with pytest.raises(openai.BadRequestError, match="guided"):
        client(gw_llama).chat.completions.create(**body)


def test_usage_is_the_engines_count(target: tuple[str, str]) -> None:
    gw, up = target
    for seed in range(3):
        body = _noise(seed)
        ids = engine_ids(up, body)
        r = client(gw).chat.completions.create(**body)
        assert r.usage.completion_tokens == len(ids)


def test_logprobs_pass_through(target: tuple[str, str]) -> None:
    gw, _ = target
    r = client(gw).chat.completions.create(model=CLIENT_MODEL, messages=[{"role": "user", "content": "Hi"}],
                                           max_tokens=12, seed=1, logprobs=True, top_logprobs=2)
    assert r.choices[0].logprobs is not None
    assert all(len(e.top_logprobs) <= 2 and e.logprob <= 0 for e in r.choices[0].logprobs.content or [])


@pytest.mark.parametrize("stream", [False, True])
def test_logprobs_are_the_answers_tokens(gw_guided: str, stream: bool) -> None:
    body = {"model": CLIENT_MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 60, "seed": 2,
            "logprobs": True, "top_logprobs": 2, "logit_bias": TERSE}
    if stream:
        chunks = list(client(gw_guided).chat.completions.create(**body, stream=True))
        entries = [e for ch in chunks for c in ch.choices if c.logprobs for e in c.logprobs.content or []]
        content = "".join(c.delta.content or "" for ch in chunks for c in ch.choices)
    else:
        r = client(gw_guided).chat.completions.create(**body)
        entries, content = r.choices[0].logprobs.content, r.choices[0].message.content or ""
    assert content and "".join(e.token for e in entries) == content
    assert all(len(e.top_logprobs) == 2 for e in entries)


@pytest.mark.parametrize("stream", [False, True])
def test_guided_output_needs_no_repair(gw_guided: str, stream: bool) -> None:
    c = client(gw_guided)
    cases: list[dict[str, Any]] = [
        {"tools": TOOLS, "tool_choice": "required"},
        {"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "get_weather"}}},
        {"response_format": {"type": "json_schema", "json_schema": {"name": "w", "schema": WEATHER}}},
        {},
    ]
    for i, extra in enumerate(cases):
        body = {"model": CLIENT_MODEL, "messages": [{"role": "user", "content": "Weather in Oslo?"}],
                "max_tokens": 200, "seed": i, "logit_bias": TERSE, **extra}
        if stream:
            chunks = list(c.chat.completions.create(**body, stream=True))
            harmony = next(ch.choices[0].model_extra.get("harmony") for ch in chunks if ch.choices
                       and ch.choices[0].finish_reason)
            fields, _, finish = streamed(chunks)
            content = fields[0]
            args = "".join(fields[2:])
        else:
            r = c.chat.completions.create(**body)
            m, finish = r.choices[0].message, r.choices[0].finish_reason
            harmony = r.choices[0].model_extra["harmony"]
            content = m.content
            args = m.tool_calls[0].function.arguments if m.tool_calls else ""
        if finish == "length":
            assert "tool_choice" in extra, f"case {i} was cut off: {harmony}"
            continue
        assert harmony["repairs"] == [] and not harmony.get("notes"), (i, harmony)
        if "tool_choice" in extra:
            assert finish == "tool_calls"
            jsonschema.validate(json.loads(args.removeprefix("get_weather")), WEATHER)
        elif "response_format" in extra:
            jsonschema.validate(json.loads(content or ""), WEATHER)


@pytest.mark.parametrize("stream", [True, False])
def test_disconnect_cancels_the_engine_request(gw_vllm: str, vllm: str, stream: bool) -> None:
    """The client leaves once vLLM has the request ("Added request" in its log); vLLM logs
    "Aborted request" only for a request still running when it is aborted, so the generation
    must outlast the abort: sampled freely it could end early on a stop token."""
    import socket

    log = EngineLog(vllm)
    added, aborted = log.count("Added request"), log.count("Aborted request")
    body = json.dumps({"model": CLIENT_MODEL, "messages": [{"role": "user", "content": "Go."}], "stream": stream,
                       "max_tokens": 900, **LONG}).encode()
    host, port = gw_vllm.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
        log.wait("Added request", added, "the request never reached the engine")
    log.wait("Aborted request", aborted, "the engine was never told the client left")


# Exactly 900 tokens (7 s on a quiet machine): min_tokens holds off every stop token, the random
# model's <|endoftext|> among them, and the seed fixes the rest. A generation that cannot end
# before the test aborts it.
LONG = {"min_tokens": 900, "seed": 0, "logit_bias": {str(RETURN): -100, str(CALL): -100}}


class EngineLog:
    """What a real engine wrote to its log, counted and waited for (a guard, never a timing)."""

    def __init__(self, url: str) -> None:
        self.path = LOGS[url]

    def count(self, what: str) -> int:
        return self.path.read_text(errors="replace").count(what)

    def wait(self, what: str, before: int, why: str) -> None:
        deadline = time.monotonic() + 60  # a guard: the loop ends when it happens
        while self.count(what) == before:
            assert time.monotonic() < deadline, f"{why}; the engine's log ends:\n" + \
                "\n".join(self.path.read_text(errors="replace").splitlines()[-15:])
            time.sleep(0.05)


def test_stored_responses_over_vllm(gw_vllm: str, vllm: str) -> None:
    """Over the real vLLM: a chain through previous_response_id, read back; a background response
    cancelled while vLLM generates it, which aborts vLLM's request."""
    # The SDK's own retries (2): a pooled connection idle past uvicorn's keep-alive (5 s, while the
    # test waits on vLLM's log under load) may be closed as it is reused, and clients retry that.
    c = openai.OpenAI(base_url=gw_vllm + "/v1", api_key="none", max_retries=2, timeout=300)
    r1 = c.responses.create(model=CLIENT_MODEL, input="Hi", max_output_tokens=20)
    r2 = c.responses.create(model=CLIENT_MODEL, input="Again", previous_response_id=r1.id, max_output_tokens=20)
    got = c.responses.retrieve(r2.id)
    assert got.previous_response_id == r1.id and got.status in ("completed", "incomplete")
    assert [i.type for i in c.responses.input_items.list(r2.id)] == ["message"]
    log = EngineLog(vllm)
    added, aborted = log.count("Added request"), log.count("Aborted request")
    bg = c.responses.create(model=CLIENT_MODEL, input="Go.", background=True, max_output_tokens=900, extra_body=LONG)
    log.wait("Added request", added, "the background response never reached the engine")
    assert c.responses.cancel(bg.id).status == "cancelled"
    log.wait("Aborted request", aborted, "the engine was never told the response was cancelled")
    assert c.responses.retrieve(bg.id).status == "cancelled"


@pytest.fixture(scope="module")
def vllm_with_processor() -> Iterator[str]:
    """A vLLM of its own with harmonykit's logits processor loaded (the session's vLLM stays as
    the gateway tests expect it; with the processor loaded there, the disconnect test failed in
    two full runs out of two, passing alone: left for a later look)."""
    from real.servers import vllm_server

    with vllm_server("--logits-processors", "harmonykit.grammar.vllm:HarmonyVLLMLogitsProcessor") as url:
        yield url


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_vllm_logits_processor_holds_vllm_to_the_grammar(vllm_with_processor: str, seed: int) -> None:
    """The shipped HarmonyVLLMLogitsProcessor, loaded by the real vLLM (--logits-processors) and
    asked for per request (vllm_xargs): the random model, pushed towards control tokens, writes
    only what the request's grammar admits, and a required call parses strictly."""
    from harmonykit.grammar.matcher import HarmonyMatcher

    req = {"messages": [{"role": "user", "content": "Weather in Oslo?"}], "tools": TOOLS, "tool_choice": "required"}
    prompt = render_chat_request(ENC, req).tokens
    r = httpx.post(vllm_with_processor + "/v1/completions", json={
        "model": SERVED, "prompt": prompt, "max_tokens": 200, "seed": seed, "return_token_ids": True,
        "skip_special_tokens": False, "stop_token_ids": [RETURN, CALL], "logit_bias": {**NOISE, **TERSE},
        "vllm_xargs": {"harmony_request": json.dumps(req)}}, timeout=120)
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    ids = list(choice["token_ids"])
    if ids[-1] not in (RETURN, CALL) and choice.get("stop_reason") in (RETURN, CALL):
        ids.append(choice["stop_reason"])  # vLLM names a stop_token_ids token instead of returning it
    matcher = HarmonyMatcher(ENC, req)
    for t in ids:
        assert matcher.consume(t), f"token {t} is outside the grammar: {ENC.decode(ids)!r}"
    if choice["finish_reason"] == "length":
        return  # cut off: every token was still admitted
    assert matcher.is_complete() and ids[-1] == CALL
    messages = ENC.parse_messages_from_completion_tokens(ids, hk.Role.ASSISTANT, strict=True)
    assert messages[-1].recipient == "functions.get_weather"
    jsonschema.validate(json.loads(messages[-1].content[0].text), WEATHER)  # type: ignore[union-attr]
    # without vllm_xargs the same request is untouched: the noise shows
    free = httpx.post(vllm_with_processor + "/v1/completions", json={
        "model": SERVED, "prompt": prompt, "max_tokens": 48, "seed": seed, "return_token_ids": True,
        "skip_special_tokens": False, "logit_bias": NOISE}, timeout=120).json()["choices"][0]["token_ids"]
    assert not all(HarmonyMatcher(ENC, req).consume(t) for t in free)


@pytest.fixture(scope="module")
def gw_tools(vllm: str) -> Iterator[str]:
    yield from _gateway(vllm, guided="vllm", python=True, python_timeout=10, store="none")


def test_the_agent_loop_runs_on_vllm(gw_tools: str) -> None:
    """The real vLLM, held by the grammar to a python call (tool_choice code_interpreter): the
    gateway runs the random model's code in the sandbox, feeds the result back, and the turn
    ends (max_tool_calls 1 stops a second call; the output budget bounds the rest)."""
    c = client(gw_tools)
    with c.responses.stream(model=CLIENT_MODEL, input="Compute.", max_output_tokens=300, max_tool_calls=1,
                            tools=[{"type": "code_interpreter", "container": {"type": "auto"}}],
                            tool_choice={"type": "code_interpreter"}, include=["code_interpreter_call.outputs"],
                            extra_body={"seed": 0, "logit_bias": TERSE}) as stream:
        kinds = [e.type for e in stream]
        final = stream.get_final_response()
    assert "response.code_interpreter_call.interpreting" in kinds
    assert "response.code_interpreter_call.completed" in kinds
    assert final.status in ("completed", "incomplete")
    call = next(i for i in final.output if i.type == "code_interpreter_call")
    assert call.status == "completed" and call.outputs and call.outputs[0].logs  # the sandbox ran it
    assert (final.model_extra or {})["harmony"].get("steps", 1) >= 2  # the engine generated again after it


@pytest.fixture(scope="module")
def mcp_echo() -> Iterator[tuple[list[str], str]]:
    from mcp.server.mcpserver import MCPServer

    calls: list[str] = []
    server = MCPServer("echo")

    # a short string: the grammar (llguidance, from the schema) ends the random model's argument soon
    @server.tool()
    def echo(text: Annotated[str, Field(max_length=8)]) -> str:
        """Say the text back."""
        calls.append(text)
        return f"echo: {text}"

    with serving(server.streamable_http_app()) as url:
        yield calls, url + "/mcp"


@pytest.fixture(scope="module")
def gw_mcp(vllm: str) -> Iterator[str]:
    yield from _gateway(vllm, guided="vllm", mcp=True, fetch_allow=("127.0.0.1/32",), store="none")


def test_an_mcp_call_runs_on_vllm(gw_mcp: str, mcp_echo: tuple[list[str], str]) -> None:
    """The real vLLM held by the grammar to a call of the MCP server's tool (tool_choice mcp):
    the gateway calls the real MCP server with the random model's arguments (held to the tool's
    schema), feeds the result back, and the engine generates again until the turn ends."""
    calls, url = mcp_echo
    c = client(gw_mcp)
    events = list(c.responses.create(model=CLIENT_MODEL, input="Echo.", max_output_tokens=300, max_tool_calls=1,
                                     tools=[{"type": "mcp", "server_label": "echo", "server_url": url,
                                             "require_approval": "never"}],
                                     tool_choice={"type": "mcp", "server_label": "echo"}, stream=True,
                                     extra_body={"seed": 0, "logit_bias": TERSE}))
    kinds = [e.type for e in events]
    final = events[-1].response
    assert final.status in ("completed", "incomplete"), (final.status, final.error)
    assert "response.mcp_list_tools.completed" in kinds and "response.mcp_call.completed" in kinds, \
        (final.status, [(i.type, getattr(i, "status", None)) for i in final.output], final.model_extra)
    call = next(i for i in final.output if i.type == "mcp_call")
    assert call.output == f"echo: {json.loads(call.arguments)['text']}" and calls
    assert (final.model_extra or {})["harmony"].get("steps", 1) >= 2


def test_smolagents_tool_calling_agent_with_its_defaults(gw_vllm: str) -> None:
    """smolagents' ToolCallingAgent with its defaults (tool_choice "required" on every step; only
    its long system prompt shortened) against the real vLLM behind a gateway started without
    --guided: each step is held to its grammar, so every step is a tool call, and the run ends."""
    from smolagents import OpenAIServerModel, ToolCallingAgent, tool

    @tool
    def weather(city: str) -> str:
        """The weather in a city.

        Args:
            city: The city.
        """
        return f"sunny in {city}"

    model = OpenAIServerModel(model_id=CLIENT_MODEL, api_base=gw_vllm + "/v1", api_key="none",
                              client_kwargs={"max_retries": 0, "timeout": 300}, max_tokens=200,
                              extra_body={"seed": 0, "logit_bias": TERSE})
    agent = ToolCallingAgent(tools=[weather], model=model, max_steps=2, verbosity_level=0)
    # its own prompt is longer than the tiny model's 1024-token context: the one thing changed
    agent.prompt_templates["system_prompt"] = "Use the tools to answer."
    agent.run("Weather in Oslo?")
    calls = [c for step in agent.memory.steps for c in (getattr(step, "tool_calls", None) or [])]
    errors = [str(step.error) for step in agent.memory.steps if getattr(step, "error", None)]
    assert calls, errors
    assert not [e for e in errors if "400" in e or "BadRequest" in e], errors
