"""The render caches change nothing but speed: any sequence of requests renders, token for
token, what a cold render gives; memory stays under its bound; a repeated agent loop pays for
its new messages only."""

from __future__ import annotations

import copy
import json
import random
from typing import Any

import pytest
from hypothesis import HealthCheck, given
from hypothesis import strategies as st

import harmonykit as hk
from budget import examples
from harmonykit import cache
from harmonykit.data import render_example
from harmonykit.openai import render_chat_request, render_responses_request
from harmonykit.openai.request import HEAD_CACHE, MESSAGE_CACHE
from harmonykit.render import developer_parts
from harmonykit.server import Settings
from harmonykit.typescript import namespace_parts, section_parts, tool_text
from test_parse_differential import _ENC

SETTINGS = examples(150, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def cold(render: Any, request: dict[str, Any]) -> list[int]:
    with cache.disabled():
        tokens: list[int] = render(_ENC, request).tokens
        return tokens


# -- the seams: text cut in parts encodes as the whole -------------------------------------------

_PIECES = ["\n\n// ", "\n\ntype ", "\n\nnamespace ", "\n", "\n\n", " ", "  ", "//", "/", ";", "{", "}", "=>",
           "any", "Gets", "x", "é", "日本", "'s", "123", "\t", "\r\n", "// ", ",", "?", "😊", "type", "A", "#", "_"]
_texts = st.lists(st.sampled_from(_PIECES), max_size=12).map("".join)
_schemas = st.one_of(st.none(), st.builds(
    lambda keys, desc: {"type": "object", "properties": {k: {"type": "string", "description": desc} for k in keys}},
    st.lists(st.sampled_from(["a", "b_1", "x y"]), unique=True, max_size=2), _texts))
_tool_texts = st.lists(st.builds(tool_text, _texts.filter(bool), _texts, _schemas), max_size=3)


def _encoded_in_parts(parts: list[str]) -> list[int]:
    return [t for part in parts for t in _ENC.encode(part)]


@SETTINGS
@given(_texts.filter(bool), st.one_of(st.none(), _texts), _tool_texts, st.one_of(st.none(), _texts))
def test_text_cut_in_parts_encodes_as_the_whole(name: str, description: str | None, tools: list[Any],
                                                instructions: str | None) -> None:
    """Any namespace name, descriptions, schemas and instructions: the cuts never change a token."""
    namespace = namespace_parts(name, description, tools)
    parts = developer_parts(instructions, section_parts([namespace, namespace_parts("functions", None, tools)]))
    assert _encoded_in_parts(parts) == _ENC.encode("".join(parts))


def test_a_tool_section_is_cut_at_each_tool() -> None:
    a, b, c = tool_text("a", "Gets the weather", None), tool_text("b", "Two\nlines", None), tool_text("c", "", None)
    parts = developer_parts("Be brief.", section_parts([namespace_parts("functions", None, [a, b, c])]))
    assert parts == ["# Instructions\n\nBe brief.\n\n", "# Tools\n\n## functions\n\nnamespace functions",
                     " {\n\n// Gets the weather\ntype a = () => any", ";\n\n// Two\n// lines\ntype b = () => any",
                     ";\n\ntype c = () => any", ";\n\n} // namespace functions"]
    # a namespace whose name ends in neither a letter nor a digit is not cut before its " {"
    assert namespace_parts("f_", None, [c])[:1] == ["## f_\n\nnamespace f_ {\n\ntype c = () => any"]


# -- any sequence of requests renders as cold ----------------------------------------------------

def _tool(name: str, order: list[str]) -> dict[str, Any]:
    props = {k: {"type": "string", "description": f"The {k}."} for k in order}
    return {"type": "function", "function": {"name": name, "description": f"Does {name}.",
                                             "parameters": {"type": "object", "properties": props}}}


_words = st.text(alphabet="ab \n.", min_size=1, max_size=12)


@st.composite
def agent_loops(draw: st.DrawFn) -> list[dict[str, Any]]:
    """Chat requests as an agent sends them: each the last one plus new messages, sometimes with
    an earlier message edited, keys reordered, the tools or their key order changed."""
    tools = [_tool("f", ["a", "b"]), _tool("g", ["q"])]
    messages: list[dict[str, Any]] = [{"role": "system", "content": draw(_words)},
                                      {"role": "user", "content": draw(_words)}]
    requests = []
    calls = 0
    for _ in range(draw(st.integers(1, 6))):
        step = draw(st.sampled_from(["call", "answer", "user", "edit", "reorder", "tools", "repeat"]))
        if step == "call":
            calls += 1
            name = draw(st.sampled_from(["f", "g"]))
            messages.append({"role": "assistant", "content": None, "reasoning_content": draw(_words),
                             "tool_calls": [{"id": f"c{calls}", "type": "function",
                                             "function": {"name": name, "arguments": '{"a": 1}'}}]})
            messages.append({"role": "tool", "tool_call_id": f"c{calls}", "content": draw(_words)})
        elif step == "answer":  # moves the chain-of-thought rule
            messages.append({"role": "assistant", "reasoning_content": draw(_words), "content": draw(_words)})
        elif step == "user":
            messages.append({"role": "user", "content": draw(_words)})
        elif step == "edit":
            i = draw(st.integers(1, len(messages) - 1))
            if messages[i]["role"] in ("user", "tool"):
                messages[i] = {**messages[i], "content": draw(_words)}
            elif messages[i]["role"] == "assistant":
                messages[i] = {**messages[i], "reasoning_content": draw(_words)}
        elif step == "reorder":  # the same message, its keys in another order
            i = draw(st.integers(0, len(messages) - 1))
            messages[i] = dict(reversed(list(messages[i].items())))
        elif step == "tools":
            tools = [_tool("f", draw(st.permutations(["a", "b", "c"]))), *draw(st.sampled_from([[], tools[1:]]))]
        requests.append({"messages": copy.deepcopy(messages), "tools": copy.deepcopy(tools)})
    return requests


def _as_responses(request: dict[str, Any]) -> dict[str, Any]:
    items: list[dict[str, Any]] = []
    for m in request["messages"]:
        if m["role"] == "assistant":
            if m.get("reasoning_content"):
                items.append({"type": "reasoning", "summary": [{"type": "summary_text",
                                                                "text": m["reasoning_content"]}]})
            for call in m.get("tool_calls") or []:
                items.append({"type": "function_call", "call_id": call["id"], "name": call["function"]["name"],
                              "arguments": call["function"]["arguments"]})
            if m.get("content"):
                items.append({"role": "assistant", "content": m["content"]})
        elif m["role"] == "tool":
            items.append({"type": "function_call_output", "call_id": m["tool_call_id"], "output": m["content"]})
        else:
            items.append({"role": m["role"], "content": m["content"]})
    return {"input": items, "tools": [t["function"] | {"type": "function"} for t in request["tools"]]}


@SETTINGS
@given(agent_loops(), st.booleans())
def test_any_sequence_of_requests_renders_as_cold(requests: list[dict[str, Any]], responses: bool) -> None:
    render = render_responses_request if responses else render_chat_request
    for request in requests:
        if responses:
            request = _as_responses(request)
        assert render(_ENC, request).tokens == cold(render, request)


def test_a_mutated_message_is_rendered_afresh() -> None:
    message = {"role": "user", "content": "first"}
    request = {"messages": [message]}
    render_chat_request(_ENC, request)
    message["content"] = "second"  # the same dict, changed in place
    assert render_chat_request(_ENC, request).tokens == cold(render_chat_request, request)


def test_a_value_that_only_serializes_alike_is_not_a_hit() -> None:
    """orjson writes NaN as null: an assistant message with content null is valid, with NaN not."""
    good = {"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": None,
                                                          "reasoning_content": "r"}]}
    render_chat_request(_ENC, good)
    bad = {"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": float("nan"),
                                                         "reasoning_content": "r"}]}
    with pytest.raises(hk.openai.RequestError):
        render_chat_request(_ENC, bad)


def test_a_message_of_strings_is_keyed_by_its_strings_and_no_other_is() -> None:
    """A message whose fields are all strings (or null) is its own key; one field of another
    type (a number, a list, a name that is not a string) takes the serialized key, and a value
    that differs only in type is not a hit."""
    MESSAGE_CACHE.clear()
    base = [{"role": "system", "content": "s"}]
    for message in ({"role": "user", "content": "1"}, {"role": "user", "content": 1},
                    {"role": "user", "content": "x", "name": None}, {"role": "user", "content": "x", "name": 7},
                    {"role": "user", "content": [{"type": "text", "text": "1"}]}):
        request = {"messages": [*base, message]}
        for _ in range(2):
            try:
                tokens = render_chat_request(_ENC, request).tokens
            except hk.openai.RequestError as e:
                with pytest.raises(hk.openai.RequestError) as refused:
                    cold(render_chat_request, request)
                assert str(refused.value) == str(e)
            else:
                assert tokens == cold(render_chat_request, request)


def test_the_prompt_leaves_each_messages_tokens_in_reach() -> None:
    """The prompt takes the request's tokens (the head put before them in place): each
    message's tokens are still where the request says, and the conversation reads whole."""
    request = agent_request(3)
    for _ in range(2):
        prompt = render_chat_request(_ENC, request)
        read = prompt.request
        assert read is not None
        for i, message in enumerate(read.messages):
            assert read.tokens_of(i) == _ENC.render(message)
        assert prompt.tokens == _ENC.render_conversation_for_completion(prompt.conversation, hk.Role.ASSISTANT)


# -- an agent loop pays for its new messages only -------------------------------------------------

def agent_request(turns: int, seed: int = 0) -> dict[str, Any]:
    rng = random.Random(seed)
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You are an agent."},
                                      {"role": "user", "content": "Go."}]
    for i in range(turns):
        messages.append({"role": "assistant", "content": None, "reasoning_content": f"Step {i}.",
                         "tool_calls": [{"id": f"c{i}", "type": "function",
                                         "function": {"name": "f", "arguments": json.dumps({"a": i})}}]})
        messages.append({"role": "tool", "tool_call_id": f"c{i}",
                         "content": " ".join(f"row {rng.random():.6f}" for _ in range(300))})
    return {"messages": messages, "tools": [_tool("f", ["a"])]}


def test_a_repeated_agent_loop_tokenizes_only_its_new_messages(monkeypatch: pytest.MonkeyPatch) -> None:
    MESSAGE_CACHE.clear()
    HEAD_CACHE.clear()
    request = agent_request(40)
    render_chat_request(_ENC, request)  # the head is kept from its second sight on
    render_chat_request(_ENC, request)
    encoded: list[str] = []
    real = _ENC._renderer._encode
    monkeypatch.setattr(_ENC._renderer, "_encode", lambda text: encoded.append(text) or real(text))
    request["messages"].append({"role": "user", "content": "And now?"})
    tokens = render_chat_request(_ENC, request).tokens
    assert encoded == ["And now?"]
    monkeypatch.undo()
    assert tokens == cold(render_chat_request, request)


# -- memory ----------------------------------------------------------------------------------------

def test_memory_stays_under_the_bound() -> None:
    lru: cache.LRU[int, bytes] = cache.LRU(budget=10_000)
    for i in range(5_000):
        lru.put(i, b"x", weight=random.Random(i).randint(1, 3000))
        assert lru.used <= lru.budget
    lru.put(-1, b"x", weight=20_000)  # heavier than the whole budget: not kept
    assert lru.get(-1) is None and lru.used <= lru.budget
    lru.resize(0)
    assert len(lru) == 0 and lru.used == 0
    lru.put(1, b"x", weight=1)
    assert lru.get(1) is None


def test_the_message_cache_stays_under_its_bound_on_distinct_conversations() -> None:
    MESSAGE_CACHE.resize(1 << 20)
    try:
        for i in range(3_000):
            render_chat_request(_ENC, {"messages": [{"role": "user", "content": f"question {i} " * 20},
                                                    {"role": "assistant", "content": f"answer {i} " * 20}]})
            assert MESSAGE_CACHE.used <= MESSAGE_CACHE.budget
        assert len(MESSAGE_CACHE) > 100  # it kept what fits
    finally:
        MESSAGE_CACHE.resize(64 << 20)


def test_what_the_cache_counts_is_what_it_holds() -> None:
    """Entries are weighed as they really weigh (traced memory), so the bound is a real one."""
    import gc
    import tracemalloc

    MESSAGE_CACHE.clear()
    render_chat_request(_ENC, {"messages": [{"role": "user", "content": "warm up"}]})
    MESSAGE_CACHE.clear()
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for i in range(1_500):
            render_chat_request(_ENC, {"messages": [
                {"role": "user", "content": f"Question {i}: what is the weather in city {i % 977}?"},
                {"role": "assistant", "reasoning_content": f"Look up city {i}.", "content": f"It is {i}."},
                {"role": "user", "content": f"And tomorrow, {i}? " * (i % 30)}]})
        gc.collect()
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert 0.7 * MESSAGE_CACHE.used < held < 1.2 * MESSAGE_CACHE.used, (held, MESSAGE_CACHE.used)


def test_render_cache_setting() -> None:
    from harmonykit.server import create_app

    base = {"upstream": ("http://127.0.0.1:9",)}
    assert Settings(**base).render_cache_mb == 64  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="render_cache_mb"):
        Settings(**base, render_cache_mb=-1)  # type: ignore[arg-type]
    assert Settings.from_sources({"upstream": ["http://127.0.0.1:9"]},
                                 {"HARMONYKIT_RENDER_CACHE_MB": "0"}).render_cache_mb == 0
    try:
        create_app(Settings(**base, render_cache_mb=0))  # type: ignore[arg-type]
        assert MESSAGE_CACHE.budget == 0
        render_chat_request(_ENC, {"messages": [{"role": "user", "content": "off"}]})
        assert len(MESSAGE_CACHE) == 0
    finally:
        MESSAGE_CACHE.resize(64 << 20)


# -- request heads: every field of the head varies across a sequence, the cache never cleared ------

_HEAD_TOOLS = [_tool("f", ["a"]), _tool("g", ["b", "c"]), _tool("f", ["c"])]  # two spellings of f
_HEAD_FIELDS: dict[str, list[Any]] = {
    "effort": [None, "low", "medium", "high"],
    "effort_in": ["top", "kwargs"],  # Chat: reasoning_effort, or vLLM's chat_template_kwargs
    "tools": [[], [0], [1], [0, 1], [2], [2, 1]],
    "tool_choice": [None, "auto", "none", "f"],
    "format": [None, "text", "json_object", "schema_a", "schema_b"],
    "system": [None, "Be brief.", "Be thorough."],
    "developer": [None, "Answer in French.", "Answer in German."],
}
_FORMATS = {"text": {"type": "text"}, "json_object": {"type": "json_object"},
            "schema_a": {"name": "a", "schema": {"type": "object", "properties": {"x": {"type": "string"}}}},
            "schema_b": {"name": "a", "schema": {"type": "object", "properties": {"y": {"type": "integer"}}}}}


def _head_request(head: dict[str, Any], responses: bool) -> dict[str, Any]:
    """A one-question request whose head is ``head`` (a draw of _HEAD_FIELDS), in either API."""
    tools = [_HEAD_TOOLS[i] for i in head["tools"]]
    texts = [t for t in (head["system"], head["developer"]) if t]
    fmt = _FORMATS.get(head["format"] or "")
    choice = head["tool_choice"]
    if responses:
        request: dict[str, Any] = {"input": [{"role": "user", "content": "Why?"}],
                                   "tools": [t["function"] | {"type": "function"} for t in tools]}
        if texts:
            request["instructions"] = "\n\n".join(texts)
        if head["effort"]:
            request["reasoning"] = {"effort": head["effort"]}
        if fmt:
            request["text"] = {"format": fmt if "name" not in fmt else {"type": "json_schema", **fmt}}
        if choice:
            request["tool_choice"] = {"type": "function", "name": "f"} if choice == "f" else choice
        return request
    messages = [{"role": role, "content": t} for role, t in (("system", head["system"]),
                                                            ("developer", head["developer"])) if t]
    request = {"messages": [*messages, {"role": "user", "content": "Why?"}], "tools": tools}
    if head["effort"]:
        if head["effort_in"] == "top":
            request["reasoning_effort"] = head["effort"]
        else:
            request["chat_template_kwargs"] = {"reasoning_effort": head["effort"]}
    if fmt:
        request["response_format"] = fmt if "name" not in fmt else {"type": "json_schema", "json_schema": fmt}
    if choice:
        request["tool_choice"] = {"type": "function", "function": {"name": "f"}} if choice == "f" else choice
    return request


def _tokens_or_error(render: Any, request: dict[str, Any]) -> Any:
    try:
        return render(_ENC, request).tokens
    except hk.openai.RequestError as e:
        return ("refused", e.param, str(e))


_heads = st.fixed_dictionaries({k: st.sampled_from(v) for k, v in _HEAD_FIELDS.items()})


@SETTINGS
@given(st.lists(_heads, min_size=2, max_size=12), st.booleans(), st.booleans())
def test_heads_varying_in_every_field_render_as_cold(heads: list[dict[str, Any]], responses: bool,
                                                     repeat: bool) -> None:
    """Requests whose heads differ in one field or many (effort, tools, tool_choice, response
    format, instructions, developer text), each seen more than once so the caches fill and hit:
    each renders what a cold render gives (or the same refusal), and so does a dataset record."""
    render = render_responses_request if responses else render_chat_request
    sequence = [h for h in heads for _ in range(2 if repeat else 1)]
    for head in sequence:
        request = _head_request(head, responses)
        expected = _tokens_or_error(lambda enc, r: _cold_head(render, r), request)
        assert _tokens_or_error(render, request) == expected, head
        if not isinstance(expected, tuple):
            example = render_example(_ENC, _answered(request, responses))["input_ids"]
            with cache.disabled():
                assert example == render_example(_ENC, _answered(request, responses))["input_ids"], head


def _cold_head(render: Any, request: dict[str, Any]) -> Any:
    return type("Cold", (), {"tokens": cold(render, request)})


def _answered(request: dict[str, Any], responses: bool) -> dict[str, Any]:
    """The request as a dataset record: its question answered."""
    if responses:
        return {**request, "input": [*request["input"], {"role": "assistant", "content": "Because."}]}
    return {**request, "messages": [*request["messages"], {"role": "assistant", "reasoning_content": "Think.",
                                                           "content": "Because."}]}


def test_the_effort_is_part_of_a_heads_key() -> None:
    """Two low requests (the head is stored on its second sight), then a high one: it says high."""
    for effort in ("low", "low", "high", "high"):
        request = {"messages": [{"role": "user", "content": "Why?"}], "reasoning_effort": effort}
        text = _ENC.decode(render_chat_request(_ENC, request).tokens)
        assert f"Reasoning: {effort}" in text
        record = {"messages": [*request["messages"], {"role": "assistant", "content": "Because."}],
                  "reasoning_effort": effort}
        assert f"Reasoning: {effort}" in _ENC.decode(render_example(_ENC, record)["input_ids"])


def test_a_message_is_cached_with_what_it_depends_on() -> None:
    """The same client message can render differently by what came before it: a tool result names
    the function its call id called; a Responses assistant item carries the reasoning items before
    it. Each renders as cold, whichever came first."""
    tools = [_tool("f", ["a"]), _tool("g", ["a"])]
    results = ({"role": "tool", "tool_call_id": "c1", "content": "ok"},  # keyed by its strings
               {"role": "tool", "tool_call_id": "c1", "content": [{"type": "text", "text": "ok"}]})  # serialized
    for result, name in ((r, n) for r in results for n in ("f", "g", "f")):
        call = {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": name, "arguments": "{}"}}]}
        request = {"messages": [{"role": "user", "content": "Go."}, call, dict(result)], "tools": tools}
        tokens = render_chat_request(_ENC, request).tokens
        assert tokens == cold(render_chat_request, request)
        assert f"<|start|>functions.{name} to=assistant" in _ENC.decode(tokens)
    answer = {"role": "assistant", "content": "Done."}
    for thought in ("First.", "Second.", "First."):
        request = {"input": [{"role": "user", "content": "Go."},
                             {"type": "reasoning", "summary": [{"type": "summary_text", "text": thought}]},
                             dict(answer), {"role": "user", "content": "And?"},
                             {"type": "function_call", "call_id": "c2", "name": "f", "arguments": "{}"}]}
        tokens = render_responses_request(_ENC, request).tokens
        assert tokens == cold(render_responses_request, request)


def test_a_hit_is_checked_against_the_message_itself(monkeypatch: pytest.MonkeyPatch) -> None:
    """A serialized message is keyed by its hash and length, and a hit is compared with the message:
    messages whose keys collide (every key alike here) never take each other's tokens, and one that
    only serializes alike (orjson writes NaN as null) is refused afresh, not served from the cache."""
    from harmonykit.openai import request as request_module

    monkeypatch.setattr(request_module, "compact_key", lambda data: (0, 0))
    MESSAGE_CACHE.clear()
    for text in ("one", "two", "one"):  # content as parts: not a message of strings, so serialized
        request = {"messages": [{"role": "user", "content": [{"type": "text", "text": text}]}]}
        assert render_chat_request(_ENC, request).tokens == cold(render_chat_request, request)
    calls: list[Any] = []  # a list field: serialized; null and NaN serialize alike
    good = {"role": "assistant", "content": None, "reasoning_content": "r", "tool_calls": calls}
    render_chat_request(_ENC, {"messages": [{"role": "user", "content": "x"}, good]})
    bad = {**good, "content": float("nan")}
    with pytest.raises(hk.openai.RequestError):
        render_chat_request(_ENC, {"messages": [{"role": "user", "content": "x"}, bad]})
