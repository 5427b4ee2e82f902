"""What real clients send that the gateway used to refuse (issue 25): fields it does not know,
``tool_choice`` forcing a call without --guided, and the small things OpenAI does that clients
lean on. Against the gateway on uvicorn with the scripted stand-in engine.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

import harmonykit as hk
from engine import Engine, scripted, serving
from harmonykit.server import Settings, create_app

ENC = hk.load_harmony_encoding(hk.HarmonyEncodingName.HARMONY_GPT_OSS)
TOOLS = [{"type": "function", "name": "lookup", "parameters": {"type": "object", "properties": {
    "q": {"type": "string"}}, "required": ["q"]}}]


@pytest.fixture(scope="module")
def engine() -> Iterator[tuple[Engine, str]]:
    with scripted(11) as served:
        yield served


@pytest.fixture(scope="module")
def gw(engine: tuple[Engine, str]) -> Iterator[str]:
    with serving(create_app(Settings(upstream=(engine[1],), store="none", log_content=True))) as url:
        yield url


def post(base: str, path: str, body: Any) -> httpx.Response:
    return httpx.post(base + path, json=body, timeout=60)


def test_fields_nobody_typed_yet_are_ignored_noted_and_logged_once(gw: str,
                                                                  caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level("INFO", logger="harmonykit.server"):
        for _ in range(3):
            r = post(gw, "/v1/responses", {"input": "say:hi", "client_metadata": {"x": 1}})
            assert r.status_code == 200, r.text
        chat = post(gw, "/v1/chat/completions", {"messages": [{"role": "user", "content": "say:hi"}],
                                                 "future_field": True})
    assert r.json()["output"][-1]["content"][0]["text"] == "hi"
    notes = r.json()["harmony"]["notes"]
    assert notes[0]["kind"] == "ignored_field" and "client_metadata" in notes[0]["detail"]
    assert chat.status_code == 200 and chat.json()["choices"][0]["harmony"]["notes"][0]["kind"] == "ignored_field"
    logged = [rec.getMessage() for rec in caplog.records if "ignored_field" in rec.getMessage()]
    assert len(logged) == 2  # client_metadata once, future_field once


def test_known_fields_that_cannot_be_honoured_stay_400s(gw: str) -> None:
    r = post(gw, "/v1/responses", {"input": "hi", "prompt": {"id": "pmpt_1"}})
    assert r.status_code == 400 and r.json()["error"]["param"] == "prompt"
    r = post(gw, "/v1/responses", {"input": "hi", "include": ["message.output_text.logprobs", "nonsense.field"]})
    assert r.status_code == 400 and r.json()["error"]["param"] == "include[1]"


def test_parallel_tool_calls_is_echoed(gw: str) -> None:
    c = openai.OpenAI(base_url=gw + "/v1", api_key="none", max_retries=0)
    assert c.responses.create(model="m", input="say:x").parallel_tool_calls is True
    assert c.responses.create(model="m", input="say:x", parallel_tool_calls=False).parallel_tool_calls is False


def test_one_model_by_id(gw: str) -> None:
    c = openai.OpenAI(base_url=gw + "/v1", api_key="none", max_retries=0)
    listed = c.models.list().data[0]
    assert c.models.retrieve(listed.id).id == listed.id
    with pytest.raises(openai.NotFoundError) as e:
        c.models.retrieve("org/no-such-model")
    assert e.value.code == "model_not_found"


def test_log_content_logs_refused_requests_and_unknown_urls(gw: str, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level("INFO", logger="harmonykit.server"):
        assert post(gw, "/v1/responses", {"input": 5, "marker": "refused-1"}).status_code == 400
        assert httpx.get(gw + "/v1/nowhere/at/all", timeout=30).status_code == 404
    lines = [json.loads(rec.getMessage()) for rec in caplog.records if rec.getMessage().startswith("{")]
    refused = next(line for line in lines if line.get("status") == 400)
    assert refused["request"]["marker"] == "refused-1"
    unknown = next(line for line in lines if line.get("path") == "/v1/nowhere/at/all")
    assert unknown["status"] == 404 and unknown["endpoint"] == "(unknown)"


def test_tool_choice_required_holds_one_request_to_its_grammar_without_guided(
        engine: tuple[Engine, str], gw: str) -> None:
    """smolagents' default: the SGLang stand-in is sent that request's grammar (no --guided)."""
    from harmonykit.grammar import harmony_grammar

    eng, _ = engine
    body = {"model": "m", "input": "say:x", "tools": TOOLS, "tool_choice": "required"}
    r = post(gw, "/v1/responses", body)
    assert r.status_code == 200, r.text
    assert eng.requests[-1]["ebnf"] == harmony_grammar(body)
    plain = post(gw, "/v1/responses", {**body, "tool_choice": "auto"})
    assert plain.status_code == 200 and "ebnf" not in eng.requests[-1]


def test_tool_choice_required_on_an_engine_that_cannot_is_a_400_saying_why(engine: tuple[Engine, str]) -> None:
    with serving(create_app(Settings(upstream=(engine[1],), store="none", engine="llamacpp"))) as url:
        r = post(url, "/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}],
                                               "tools": [{"type": "function", "function": TOOLS[0]}],
                                               "tool_choice": "required"})
    message = r.json()["error"]["message"]
    assert r.status_code == 400 and "guided" in message and "llama" in message.lower()


def test_item_references_resolve_from_the_store(engine: tuple[Engine, str], store_url: str) -> None:
    """The Vercel AI SDK's second step refers to the first step's reasoning by id: the engine
    sees that reasoning in the prompt; an id that is no stored item of this key is a 400."""
    eng, up = engine
    with serving(create_app(Settings(upstream=(up,), store=store_url, api_key=("key-a", "key-b")))) as url:
        a = openai.OpenAI(base_url=url + "/v1", api_key="key-a", max_retries=0)
        user = {"role": "user", "content": 'call:lookup:{"q": "x"}'}
        first = a.responses.create(model="m", input=[user], tools=TOOLS)
        reasoning = next(i for i in first.output if i.type == "reasoning")
        call = next(i for i in first.output if i.type == "function_call")
        second = [user, {"type": "item_reference", "id": reasoning.id},
                  {"type": "function_call", "call_id": call.call_id, "name": "lookup", "arguments": call.arguments},
                  {"type": "function_call_output", "call_id": call.call_id, "output": "found"}]
        r = a.responses.create(model="m", input=second, tools=TOOLS)
        assert r.output_text == "tool said found"
        prompt = ENC.decode(eng.requests[-1]["prompt"])
        assert "<|channel|>analysis<|message|>Call lookup.<|end|>" in prompt
        for key, ref in (("key-a", "rs_nosuchitem"), ("key-b", reasoning.id)):
            bad = httpx.post(url + "/v1/responses", headers={"Authorization": f"Bearer {key}"}, timeout=30,
                             json={"model": "m", "tools": TOOLS, "input": [user, {"type": "item_reference", "id": ref}]})
            assert bad.status_code == 400 and bad.json()["error"]["code"] == "item_not_found"


def test_item_references_without_a_store_say_what_to_send(gw: str) -> None:
    r = post(gw, "/v1/responses", {"input": [{"role": "user", "content": "hi"},
                                             {"type": "item_reference", "id": "rs_1"}]})
    assert r.status_code == 400 and "--store none" in r.json()["error"]["message"]


def test_namespace_tools_both_ways(gw: str, engine: tuple[Engine, str]) -> None:
    """The Codex CLI's namespace tools: declared as a harmony namespace, the model's NS.TOOL
    call returned as a function_call with its namespace, streamed too, and rendered back."""
    from openai.types.responses import ResponseStreamEvent
    from pydantic import TypeAdapter

    crm = {"type": "namespace", "name": "crm", "description": "The CRM.", "tools": [
        {"type": "function", "name": "lookup", "description": "Find a customer.",
         "parameters": {"type": "object", "properties": {"q": {"type": "string"}}}}]}
    script = ('agent:<<channel>>commentary to=crm.lookup <<constrain>>json<<message>>{"q": "bob"}<<call>> ||| '
              "<<channel>>final<<message>>read: <<result>><<return>>")
    c = openai.OpenAI(base_url=gw + "/v1", api_key="none", max_retries=0)
    events = [TypeAdapter(ResponseStreamEvent).validate_python(e.model_dump(mode="json"))
              for e in c.responses.create(model="m", input=script, tools=[crm], stream=True)]
    call = events[-1].response.output[-1]
    assert (call.type, call.name, call.namespace) == ("function_call", "lookup", "crm")
    prompt = ENC.decode(engine[0].requests[-1]["prompt"])
    assert "namespace crm {" in prompt and "type lookup = (_: {" in prompt
    again = c.responses.create(model="m", tools=[crm], input=[
        {"role": "user", "content": script}, call.model_dump(exclude_none=True),
        {"type": "function_call_output", "call_id": call.call_id, "output": "bob!"}])
    assert again.output_text == "read: bob!"
    assert "<|start|>crm.lookup to=assistant<|channel|>commentary<|message|>bob!<|end|>" in \
        ENC.decode(engine[0].requests[-1]["prompt"])


def test_encrypted_reasoning_keeps_the_chain_of_thought_without_a_store(
        engine: tuple[Engine, str], tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """store: false with include reasoning.encrypted_content (the Vercel AI SDK, Codex): the
    reasoning comes back sealed, is opened when sent back, and the engine sees it; an altered
    blob, or one sent with another key, is a 400."""
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path))
    eng, up = engine
    with serving(create_app(Settings(upstream=(up,), store="none", api_key=("key-a", "key-b")))) as url:
        a = openai.OpenAI(base_url=url + "/v1", api_key="key-a", max_retries=0)
        user = {"role": "user", "content": 'call:lookup:{"q": "x"}'}
        for stream in (False, True):
            body: dict[str, Any] = {"model": "m", "input": [user], "tools": TOOLS, "store": False,
                                    "include": ["reasoning.encrypted_content"]}
            first = list(a.responses.create(**body, stream=True))[-1].response if stream else \
                a.responses.create(**body)
            reasoning = next(i for i in first.output if i.type == "reasoning")
            assert reasoning.encrypted_content and "Call lookup" not in reasoning.encrypted_content
            call = next(i for i in first.output if i.type == "function_call")
            sent_back = {"type": "reasoning", "id": reasoning.id, "summary": [],
                         "encrypted_content": reasoning.encrypted_content}
            second = [user, sent_back, call.model_dump(exclude_none=True),
                      {"type": "function_call_output", "call_id": call.call_id, "output": "found"}]
            r = a.responses.create(model="m", input=second, tools=TOOLS, store=False)
            assert r.output_text == "tool said found"
            assert "<|channel|>analysis<|message|>Call lookup.<|end|>" in ENC.decode(eng.requests[-1]["prompt"])
        altered = {**sent_back, "encrypted_content": sent_back["encrypted_content"][:-4] + "AAAA"}
        for key, item in (("key-a", altered), ("key-b", sent_back)):
            bad = httpx.post(url + "/v1/responses", headers={"Authorization": f"Bearer {key}"}, timeout=30,
                             json={"model": "m", "tools": TOOLS, "input": [user, item]})
            assert bad.status_code == 400 and "encrypted_content" in bad.json()["error"]["param"], bad.text
    key_file = tmp_path / "harmonykit" / "state.key"
    assert key_file.exists() and oct(key_file.stat().st_mode & 0o777) == "0o600"


def test_store_false_seals_reasoning_unasked(gw: str) -> None:
    """With ``store: false`` the client holds the chain of thought or nobody does: reasoning comes
    sealed even when ``include`` does not ask (the Vercel AI SDK asks only for model names it knows
    reason); stored responses carry none unasked."""
    body = {"model": "m", "input": 'call:lookup:{"q": "x"}', "tools": TOOLS}
    for store, sealed in ((False, True), (True, False)):
        for stream in (False, True):
            if stream:
                with httpx.stream("POST", gw + "/v1/responses", json={**body, "store": store, "stream": True},
                                  timeout=60) as r:
                    frames = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]
                out = frames[-1]["response"]["output"]
            else:
                out = post(gw, "/v1/responses", {**body, "store": store}).json()["output"]
            reasoning = next(i for i in out if i["type"] == "reasoning")
            assert bool(reasoning.get("encrypted_content")) is sealed, (store, stream, reasoning)


def test_replicas_sharing_a_state_key_open_each_others_reasoning(engine: tuple[Engine, str]) -> None:
    import base64

    key = base64.b64encode(bytes(range(32))).decode()
    user = {"role": "user", "content": 'call:lookup:{"q": "x"}'}
    body = {"model": "m", "input": [user], "tools": TOOLS, "store": False, "include": ["reasoning.encrypted_content"]}
    with serving(create_app(Settings(upstream=(engine[1],), store="none", state_key=key))) as a, \
            serving(create_app(Settings(upstream=(engine[1],), store="none", state_key=key))) as b:
        first = post(a, "/v1/responses", body).json()
        reasoning = next(i for i in first["output"] if i["type"] == "reasoning")
        item = {"type": "reasoning", "summary": [], "encrypted_content": reasoning["encrypted_content"]}
        assert post(b, "/v1/responses", {"model": "m", "input": [user, item]}).status_code == 200
    with pytest.raises(ValueError, match="--state-key"):
        Settings(upstream=(engine[1],), store="none", state_key="c2hvcnQ=")


# -- Python agent frameworks in their previous_response_id modes --------------------------------

@pytest.fixture(scope="module")
def stored(engine: tuple[Engine, str], tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    store = f"sqlite:///{tmp_path_factory.mktemp('clients') / 'store.db'}"
    with serving(create_app(Settings(upstream=(engine[1],), store=store, api_key=("fw-key", "other-key")))) as url:
        yield url


class _Sent:
    """What a framework sent the gateway (an httpx event hook on the client it is given)."""

    def __init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []

    def __call__(self, request: httpx.Request) -> None:
        if request.url.path.endswith("/responses"):
            self.bodies.append(json.loads(request.read()))

    async def hook(self, request: httpx.Request) -> None:
        self(request)


def _continued(engine: Engine, since: int, sent: _Sent, *, result: str) -> None:
    """A framework's tool loop: the second request continues the first by ``previous_response_id``,
    sending only what is new (the tool's output); the engine saw the whole chain anyway — the first
    step's reasoning and the tool's result."""
    first, second = sent.bodies[-2:]
    assert "previous_response_id" not in first and second.get("previous_response_id", "").startswith("resp_")
    assert [i.get("type") for i in second["input"]] == ["function_call_output"], second["input"]
    prompts = engine.requests[since:]
    assert len(prompts) == 2
    last = ENC.decode(prompts[-1]["prompt"])
    assert "<|channel|>analysis<|message|>Call lookup.<|end|>" in last and f"<|message|>{result}<|end|>" in last


def test_pydantic_ai_chains_by_previous_response_id(stored: str, engine: tuple[Engine, str]) -> None:
    from pydantic_ai import Agent
    from pydantic_ai.models.openai import OpenAIResponsesModel, OpenAIResponsesModelSettings
    from pydantic_ai.providers.openai import OpenAIProvider

    sent = _Sent()
    client = openai.AsyncOpenAI(base_url=stored + "/v1", api_key="fw-key", max_retries=0,
                                http_client=httpx.AsyncClient(event_hooks={"request": [sent.hook]}))
    model = OpenAIResponsesModel("gpt-oss", provider=OpenAIProvider(openai_client=client))
    agent = Agent(model, model_settings=OpenAIResponsesModelSettings(openai_previous_response_id="auto"))

    @agent.tool_plain
    def lookup(q: str) -> str:
        """Find a customer."""
        return f"found {q}"

    since = len(engine[0].requests)
    run = agent.run_sync('call:lookup:{"q": "pydantic"}')
    assert run.output == "tool said found pydantic"
    _continued(engine[0], since, sent, result="found pydantic")
    again = agent.run_sync("say:and then?", message_history=run.all_messages())
    assert again.output == "and then?" and sent.bodies[-1]["previous_response_id"] == run.all_messages()[-1].provider_response_id


def test_langchain_chains_by_previous_response_id(stored: str, engine: tuple[Engine, str]) -> None:
    from langchain_core.messages import HumanMessage, ToolMessage
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI

    @tool
    def lookup(q: str) -> str:
        """Find a customer."""
        return f"found {q}"

    sent = _Sent()
    llm = ChatOpenAI(model="gpt-oss", base_url=stored + "/v1", api_key="fw-key", max_retries=0,  # type: ignore[arg-type]
                     http_client=httpx.Client(event_hooks={"request": [sent]}),
                     use_responses_api=True, use_previous_response_id=True).bind_tools([lookup])
    since = len(engine[0].requests)
    history: list[Any] = [HumanMessage('call:lookup:{"q": "langchain"}')]
    step = llm.invoke(history)
    history.append(step)
    for call in step.tool_calls:
        history.append(ToolMessage(lookup.invoke(call["args"]), tool_call_id=call["id"]))
    answer = llm.invoke(history)
    assert answer.text == "tool said found langchain"
    _continued(engine[0], since, sent, result="found langchain")


CHAT_TOOLS = [{"type": "function", "function": TOOLS[0]}]


def _chat_step(url: str, messages: list[dict[str, Any]], *, key: str = "fw-key", stream: bool = False,
               **extra: Any) -> dict[str, Any]:
    from harmonykit.openai.chat import merge_deltas

    headers = {"Authorization": f"Bearer {key}"}
    body = {"model": "m", "messages": messages, "tools": CHAT_TOOLS, **extra}
    if not stream:
        r = httpx.post(url + "/v1/chat/completions", json=body, headers=headers, timeout=60)
        assert r.status_code == 200, r.text
        return r.json()["choices"][0]["message"]  # type: ignore[no-any-return]
    with httpx.stream("POST", url + "/v1/chat/completions", json={**body, "stream": True}, headers=headers,
                      timeout=60) as r:
        chunks = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]
    return merge_deltas(c["choices"][0]["delta"] for c in chunks if c.get("choices"))


@pytest.mark.parametrize("stream", [False, True])
def test_chat_tool_loops_keep_their_reasoning_when_the_client_drops_it(
        stored: str, engine: tuple[Engine, str], stream: bool) -> None:
    """Chat clients (the Vercel AI SDK's, LangChain's) send the tool call back without the
    reasoning before it: the gateway restores it from the store by the call's id, for the key that
    made it. Reasoning the client sends back wins; an explicit empty one stays empty; a request
    with ``store: false`` keeps nothing."""
    user = {"role": "user", "content": f'call:lookup:{{"q": "chat-{stream}"}}'}

    def loop(first_extra: dict[str, Any], assistant_extra: dict[str, Any], key: str = "fw-key") -> str:
        got = _chat_step(stored, [user], stream=stream, **first_extra)
        assert got["reasoning_content"] == "Call lookup." and got["tool_calls"], got
        call = got["tool_calls"][0]
        assistant = {"role": "assistant", "content": None, "tool_calls": [call], **assistant_extra}
        answer = _chat_step(stored, [user, assistant, {"role": "tool", "tool_call_id": call["id"], "content": "ok"}],
                            key=key, stream=stream)
        assert answer["content"] == "tool said ok"
        return ENC.decode(engine[0].requests[-1]["prompt"])

    kept = "<|channel|>analysis<|message|>Call lookup.<|end|>"
    assert kept in loop({}, {})
    assert kept in loop({}, {"reasoning_content": None})
    assert "<|message|>Mine.<|end|>" in loop({}, {"reasoning_content": "Mine."})
    assert kept not in loop({}, {"reasoning_content": ""})
    assert kept not in loop({}, {}, key="other-key")
    assert kept not in loop({"store": False}, {})
