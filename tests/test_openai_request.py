"""Chat Completions and Responses requests -> Harmony prompts."""

from __future__ import annotations

from typing import Any

import openai_harmony as oh
import pytest
from hypothesis import HealthCheck, given
from hypothesis import strategies as st

import harmonykit as hk
from budget import examples
from harmonykit.openai import (
    RequestError,
    completion_to_chat_choice,
    render_chat_request,
    render_responses_request,
)
from reference_mapping import reference_prompt as reference_of
from reference_mapping import rendered_name
from test_parse_differential import _ENC

WEATHER = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
CHAT = {
    "model": "gpt-oss-20b",
    "reasoning_effort": "high",
    "messages": [
        {"role": "system", "content": "Be brief."},
        {"role": "developer", "content": [{"type": "text", "text": "Use metric "}, {"type": "text", "text": "units."}]},
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "reasoning_content": "Need the tool.", "content": None,
         "tool_calls": [{"id": "call_1", "type": "function",
                         "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": '{"temp": 21}'},
    ],
    "tools": [{"type": "function", "function": {"name": "get_weather", "description": "Weather now.",
                                                "parameters": WEATHER}}],
}


def reference_prompt(ref: Any) -> list[int]:
    M, R = oh.Message, oh.Role
    convo = oh.Conversation.from_messages([
        M.from_role_and_content(R.SYSTEM, oh.SystemContent.new().with_reasoning_effort(oh.ReasoningEffort.HIGH)),
        M.from_role_and_content(R.DEVELOPER, oh.DeveloperContent.new().with_instructions(
            "Be brief.\n\nUse metric units.").with_function_tools(
            [oh.ToolDescription.new("get_weather", "Weather now.", WEATHER)])),
        M.from_role_and_content(R.USER, "Weather in Paris?"),
        M.from_role_and_content(R.ASSISTANT, "Need the tool.").with_channel("analysis"),
        M.from_role_and_content(R.ASSISTANT, '{"city":"Paris"}').with_channel("commentary")
        .with_recipient("functions.get_weather").with_content_type("<|constrain|>json"),
        M.from_author_and_content(oh.Author.new(R.TOOL, "functions.get_weather"), '{"temp": 21}')
        .with_channel("commentary").with_recipient("assistant"),
    ])
    return list(ref.render_conversation_for_completion(convo, R.ASSISTANT))


def test_chat_request_renders_like_the_reference(enc: hk.HarmonyEncoding, ref: Any) -> None:
    prompt = render_chat_request(enc, CHAT)
    assert prompt.tokens == reference_prompt(ref)
    assert prompt.stop_token_ids == [200002, 200012]
    assert enc.decode_utf8(prompt.tokens[-2:]) == "<|start|>assistant"
    assert prompt.tool_names == ["get_weather"]


def test_responses_request_renders_like_the_reference(enc: hk.HarmonyEncoding, ref: Any) -> None:
    request = {
        "instructions": "Be brief.",
        "reasoning": {"effort": "high"},
        "input": [
            {"role": "developer", "content": [{"type": "input_text", "text": "Use metric units."}]},
            {"role": "user", "content": "Weather in Paris?"},
            {"type": "reasoning", "id": "rs_1", "summary": [],
             "content": [{"type": "reasoning_text", "text": "Need the tool."}]},
            {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": '{"city":"Paris"}'},
            {"type": "function_call_output", "call_id": "call_1", "output": '{"temp": 21}'},
        ],
        "tools": [{"type": "function", "name": "get_weather", "description": "Weather now.", "parameters": WEATHER}],
    }
    assert render_responses_request(enc, request).tokens == reference_prompt(ref)


def test_chain_of_thought_rule(enc: hk.HarmonyEncoding) -> None:
    request = {"messages": [
        {"role": "user", "content": "2+2?"},
        {"role": "assistant", "reasoning_content": "Simple.", "content": "4"},
        {"role": "user", "content": "3+3?"},
    ]}
    text = enc.decode_utf8(render_chat_request(enc, request).tokens)
    assert "Simple." not in text and "<|channel|>final<|message|>4<|end|>" in text
    ongoing = {"messages": CHAT["messages"]}
    assert "Need the tool." in enc.decode_utf8(render_chat_request(enc, ongoing).tokens)


def test_response_format_and_tool_choice(enc: hk.HarmonyEncoding) -> None:
    request = {**CHAT, "tool_choice": "none", "response_format": {
        "type": "json_schema", "json_schema": {"name": "weather", "description": "A report.", "schema": WEATHER}}}
    text = enc.decode_utf8(render_chat_request(enc, request).tokens)
    assert "namespace functions" not in text and "'functions'" not in text
    assert ("# Response Formats\n\n## weather\n\n// A report.\n"
            '{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}<|end|>') in text
    responses = {"input": "hi", "text": {"format": {"type": "json_schema", "name": "w", "schema": WEATHER}}}
    assert "## w\n\n{" in enc.decode_utf8(render_responses_request(enc, responses).tokens)


def test_effort_and_defaults(enc: hk.HarmonyEncoding) -> None:
    text = enc.decode_utf8(render_chat_request(enc, {"messages": [{"role": "user", "content": "x"}]}).tokens)
    assert "Reasoning: medium" in text and "<|start|>developer" not in text
    low = render_responses_request(enc, {"input": "x", "reasoning": {"effort": "low"}})
    assert "Reasoning: low" in enc.decode_utf8(low.tokens)


U = [{"role": "user", "content": "x"}]


def fn(name: str, parameters: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "parameters": parameters or {"type": "object"}}}


DEEP: dict[str, Any] = {"type": "object"}
for _ in range(400):
    DEEP = {"type": "object", "properties": {"a": DEEP}}
CYCLE: dict[str, Any] = {"type": "object", "properties": {}}
CYCLE["properties"]["self"] = CYCLE


@pytest.mark.parametrize(
    ("request_body", "param", "fragment"),
    [
        ({"messages": []}, "messages", "non-empty"),
        ({"messages": [{"role": "wizard", "content": "x"}]}, "messages[0].role", "unknown role"),
        ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
         "messages[0].content[0]", "image_url"),
        ({"messages": [{"role": "tool", "tool_call_id": "nope", "content": "x"}]}, "messages[0].tool_call_id",
         "no earlier assistant tool call"),
        ({"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function"}]}, "tools[0].function",
         "needs a 'function' object"),
        ({"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function", "function": {}}]},
         "tools[0].function.name", "non-empty string name"),
        ({"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "retrieval"}]}, "tools[0]",
         "only function tools"),
        ({"messages": [{"role": "user", "content": "x"}], "reasoning_effort": "max"}, "reasoning_effort",
         "low, medium, high"),
        ({"messages": [{"role": "user", "content": "x"}], "tools": CHAT["tools"],
          "tool_choice": {"type": "function", "function": {"name": "other"}}}, "tool_choice.function.name",
         "not in tools"),
        ({"messages": [{"role": "user", "content": "x"}],
          "response_format": {"type": "json_schema", "json_schema": {"schema": {}}}},
         "response_format.json_schema.name", "needs a name"),
        # a named tool_choice with no tools, or not shaped as one
        ({"messages": U, "tool_choice": {"type": "function", "function": {"name": "f"}}}, "tool_choice",
         "declares no tools"),
        ({"messages": U, "tools": CHAT["tools"], "tool_choice": {"type": "function", "function": "f"}},
         "tool_choice.function", "named tool_choice"),
        ({"messages": U, "tool_choice": "required"}, "tool_choice", "needs tools"),
        ({"messages": U, "tool_choice": "sometimes"}, "tool_choice", "unsupported"),
        # schemas that are not JSON Schema
        ({"messages": U, "tools": [fn("f", {"type": "object", "properties": []})]},
         "tools[0].function.parameters.properties", "object of schemas"),
        ({"messages": U, "tools": [fn("f", {"type": "object", "properties": {"a": {"type": "text"}}})]},
         "tools[0].function.parameters.properties.a.type", "unknown type"),
        ({"messages": U, "tools": [fn("f", {"type": "object", "required": "a"})]},
         "tools[0].function.parameters.required", "list of property names"),
        ({"messages": U, "tools": [fn("f", {"type": "object", "required": [1]})]},
         "tools[0].function.parameters.required", "list of property names"),
        ({"messages": U, "tools": [fn("f", {"type": "number", "default": float("nan")})]},
         "tools[0].function.parameters.default", "not a JSON number"),
        ({"messages": U, "tools": [fn("f", {"type": "number", "default": float("inf")})]},
         "tools[0].function.parameters.default", "not a JSON number"),
        ({"messages": U, "tools": [fn("f", DEEP)]}, None, "nested deeper"),
        ({"messages": U, "tools": [fn("f", CYCLE)]}, None, "refers to itself"),
        ({"messages": U, "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {
            "type": "object", "default": {1, 2}}}}}, "response_format.json_schema.schema.default", "not a JSON value"),
        ({"messages": U, "response_format": {"type": "json_object", "extra": b"x"}}, "response_format.extra",
         "not a JSON value"),
        # duplicate names, and names that collide once rendered as identifiers
        ({"messages": U, "tools": [fn("f"), fn("f")]}, "tools[1]", "declared twice"),
        ({"messages": U, "tools": [fn("get weather"), fn("get_weather")]}, "tools[1]", "both render as"),
        # non-string content where text is required
        ({"messages": [{"role": "user", "content": 5}]}, "messages[0].content", "string or a list"),
        ({"messages": [{"role": "user", "content": None}]}, "messages[0].content", "string or a list"),
        ({"messages": [{"role": "system", "content": {"text": "x"}}, *U]}, "messages[0].content",
         "string or a list"),
        ({"messages": [{"role": "assistant", "content": "x", "tool_calls": {"id": "a"}}]},
         "messages[0].tool_calls", "must be a list"),
    ],
)
def test_bad_chat_requests(enc: hk.HarmonyEncoding, request_body: dict[str, Any], param: str,
                           fragment: str) -> None:
    with pytest.raises(RequestError) as info:
        render_chat_request(enc, request_body)
    assert (param is None or info.value.param == param) and fragment in info.value.message, info.value
    assert info.value.to_dict()["error"]["type"] == "invalid_request_error"


@pytest.mark.parametrize(
    ("request_body", "param"),
    [
        ({"input": []}, "input"),
        ({"input": [{"type": "function_call_output", "call_id": "x", "output": "y"}]}, "input[0].call_id"),
        ({"input": [{"type": "web_search_call"}]}, "input[0].action"),
        ({"input": [{"type": "image_generation_call"}]}, "input[0].type"),
        ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
         "input[0].content[0]"),
        ({"input": "x", "instructions": 3}, "instructions"),
        ({"input": [{"type": "reasoning", "content": 5}]}, "input[0].content"),
        ({"input": "x", "text": "x"}, "text"),
        ({"input": "x", "text": {"format": {"type": "json_schema", "name": "n", "schema": {"type": "bogus"}}}},
         "text.format.schema.type"),
        ({"input": "x", "tool_choice": {"type": "function", "name": "f"}}, "tool_choice"),
        ({"input": "x", "tools": [{"type": "function", "name": "f", "parameters": {"properties": 1}}]},
         "tools[0].parameters.properties"),
    ],
)
def test_bad_responses_requests(enc: hk.HarmonyEncoding, request_body: dict[str, Any], param: str) -> None:
    with pytest.raises(RequestError) as info:
        render_responses_request(enc, request_body)
    assert info.value.param == param


@pytest.mark.parametrize(
    "completion",
    [
        "<|channel|>analysis<|message|>Think.<|end|><|start|>assistant<|channel|>final<|message|>Answer.<|return|>",
        "<|channel|>analysis<|message|>Need it.<|end|><|start|>assistant to=functions.get_weather<|channel|>"
        'commentary <|constrain|>json<|message|>{"city":"Paris"}<|call|>',
    ],
)
def test_round_trip(enc: hk.HarmonyEncoding, completion: str) -> None:
    """A request ending in a choice we produced renders to the tokens the model generated."""
    request = {"messages": [{"role": "user", "content": "Weather in Paris?"}], "tools": CHAT["tools"]}
    prompt = render_chat_request(enc, request)
    generated = enc.encode(completion, allowed_special="all")
    choice = completion_to_chat_choice(enc, generated, request=request)
    followup = {**request, "messages": [*request["messages"], choice["message"]]}
    rendered = render_chat_request(enc, followup).tokens
    expected = prompt.tokens + [200007 if t == 200002 else t for t in generated] + [200006, 173781]
    if choice["message"]["content"]:  # a finished turn: its reasoning is dropped (the CoT rule)
        dropped = enc.encode("<|channel|>analysis<|message|>Think.<|end|><|start|>assistant", allowed_special="all")
        expected = prompt.tokens + [200007 if t == 200002 else t for t in generated[len(dropped):]] + [200006, 173781]
    assert rendered == expected


def test_tool_names_render_as_identifiers(enc: hk.HarmonyEncoding) -> None:
    tools = [fn("Get Intersection Layout"), fn("github.create_issue")]
    request = {"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": None, "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "github.create_issue", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "ok"}], "tools": tools}
    prompt = render_chat_request(enc, request)
    text = enc.decode_utf8(prompt.tokens)
    assert "type Get_Intersection_Layout = " in text and "type github_create_issue = " in text
    assert "to=functions.github_create_issue" in text and "<|start|>functions.github_create_issue to=assistant" in text
    assert prompt.tool_names == ["Get Intersection Layout", "github.create_issue"]
    # calls come back under the declared names
    out = enc.encode("<|channel|>commentary to=functions.Get_Intersection_Layout <|constrain|>json<|message|>{}"
                     "<|call|>", allowed_special="all")
    choice = completion_to_chat_choice(enc, out, request=request)
    assert choice["message"]["tool_calls"][0]["function"]["name"] == "Get Intersection Layout"


def test_chat_shaped_tools_in_both_apis(enc: hk.HarmonyEncoding) -> None:
    chat = render_chat_request(enc, {"messages": [{"role": "user", "content": "x"}],
                                     "tools": [{"type": "function", "name": "f", "parameters": WEATHER}]})
    responses = render_responses_request(enc, {"input": "x", "tools": CHAT["tools"]})
    assert "type get_weather = " in enc.decode_utf8(responses.tokens)
    assert "type f = " in enc.decode_utf8(chat.tokens)


_names = st.sampled_from(["get_weather", "Get Weather", "lookup"])
_chat_messages = st.lists(st.one_of(
    st.builds(lambda t: {"role": "user", "content": t}, st.text(max_size=20)),
    st.builds(lambda t: {"role": "system", "content": t}, st.text(max_size=20)),
    st.builds(lambda r, c: {"role": "assistant", "reasoning_content": r, "content": c},
              st.text(max_size=10), st.text(min_size=1, max_size=10)),
    st.builds(lambda n, a, pre: {"role": "assistant", "content": pre, "tool_calls": [  # pre: a preamble, or none
        {"id": "c1", "type": "function", "function": {"name": n, "arguments": a}}]}, _names, st.text(max_size=10),
              st.one_of(st.none(), st.text(min_size=1, max_size=10))),
), min_size=1, max_size=6)


@examples(150, suppress_health_check=[HealthCheck.too_slow])
@given(_chat_messages, st.lists(_names, unique=True, max_size=2), st.sampled_from([None, "low", "high"]),
       st.booleans())
def test_cached_head_renders_like_the_whole_conversation(ref: Any, messages: list[dict[str, Any]], tools: list[str],
                                                         effort: str | None, with_format: bool) -> None:
    """Cold, then from the caches: the tokens the reference renders for the conversation that the
    request stands for, built by hand with the reference's own classes (tests/reference_mapping.py)."""
    from harmonykit.openai.request import HEAD_CACHE

    request: dict[str, Any] = {"messages": messages, "tools": [fn(n) for n in tools]}
    if effort:
        request["reasoning_effort"] = effort
    if with_format:
        request["response_format"] = {"type": "json_object"}
    called = {m["tool_calls"][0]["function"]["name"] for m in messages if m.get("tool_calls")}
    messages += [{"role": "tool", "tool_call_id": "c1", "content": "ok"}] if called else []
    expected = reference_of(ref, request)
    for _ in range(2):  # cold, then from the cache
        prompt = render_chat_request(_ENC, request)
        assert prompt.tokens == expected
        assert prompt.tokens == _ENC.render_conversation_for_completion(prompt.conversation, hk.Role.ASSISTANT)
    HEAD_CACHE.clear()
    assert render_chat_request(_ENC, request).tokens == expected


def test_cache_does_not_hide_errors(enc: hk.HarmonyEncoding) -> None:
    good = {"messages": U, "tools": [fn("f")]}
    render_chat_request(enc, good)
    with pytest.raises(RequestError):
        render_chat_request(enc, {**good, "tool_choice": {"type": "function", "function": {"name": "g"}}})
    with pytest.raises(RequestError):
        render_chat_request(enc, {"messages": U, "tools": [fn("f", {"type": "number", "default": float("nan")})]})


def test_the_head_cache_keeps_each_requests_own_key_order(enc: hk.HarmonyEncoding) -> None:
    """One tenant's {a, b} must not render another tenant's {b, a} (the schema follows key order)."""
    from harmonykit.openai.request import HEAD_CACHE

    def request(order: list[str]) -> dict[str, Any]:
        props = {k: {"type": "string"} for k in order}
        return {"messages": [{"role": "user", "content": "x"}],
                "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object",
                                                                                       "properties": props}}}]}

    HEAD_CACHE.clear()
    cold = render_chat_request(enc, request(["b", "a"])).tokens
    render_chat_request(enc, request(["a", "b"]))
    assert render_chat_request(enc, request(["b", "a"])).tokens == cold
    HEAD_CACHE.clear()
    render_chat_request(enc, request(["a", "b"]))
    assert render_chat_request(enc, request(["b", "a"])).tokens == cold


@pytest.mark.parametrize(("kind", "module", "cls"), [
    ("chat", "openai.types.chat.completion_create_params", "CompletionCreateParamsBase"),
    ("responses", "openai.types.responses.response_create_params", "ResponseCreateParamsBase"),
])
def test_every_field_of_the_installed_sdk_is_known(kind: str, module: str, cls: str) -> None:
    """Read from the installed openai SDK: this fails the day it adds a field we do not know."""
    import importlib

    from harmonykit.openai.params import check_fields

    fields = set(getattr(importlib.import_module(module), cls).__annotations__)
    body: dict[str, Any] = {k: None for k in fields}
    body.update({"messages": []} if kind == "chat" else {"input": "x"})
    check_fields(body, kind)  # no "unrecognized request argument"


def test_vllm_extensions_are_accepted_and_honoured(enc: hk.HarmonyEncoding) -> None:
    from harmonykit.openai import completion_to_chat_choice
    from harmonykit.openai.params import check_fields

    base = {"messages": [{"role": "user", "content": "x"}]}
    via_kwargs = {**base, "chat_template_kwargs": {"reasoning_effort": "high"}, "include_reasoning": False,
                  "skip_special_tokens": False, "add_generation_prompt": True}
    check_fields(via_kwargs, "chat")
    assert render_chat_request(enc, via_kwargs).tokens == render_chat_request(
        enc, {**base, "reasoning_effort": "high"}).tokens
    out = enc.encode("<|channel|>analysis<|message|>think<|end|><|start|>assistant<|channel|>final<|message|>4"
                     "<|return|>", allowed_special="all")
    assert completion_to_chat_choice(enc, out, request=via_kwargs)["message"]["reasoning_content"] is None
    assert completion_to_chat_choice(enc, out, request=base)["message"]["reasoning_content"] == "think"


def test_a_json_schema_format_without_a_schema_is_any_object(enc: hk.HarmonyEncoding) -> None:
    req = {"messages": [{"role": "user", "content": "x"}],
           "response_format": {"type": "json_schema", "json_schema": {"name": "answer"}}}
    assert "## answer" in enc.decode(render_chat_request(enc, req).tokens)


# Requests whose heads vary as datasets' do: instructions, tools with odd names, descriptions
# and schemas, a response format; rendered (twice: the second time from the caches) exactly as
# the reference renders the conversation they read as.
_odd = st.text(st.sampled_from(list("ab Z9_-.'/{};\n#é日 ")), min_size=1, max_size=8)
_props = st.dictionaries(st.sampled_from(["q", "n", "x y", "日"]), st.fixed_dictionaries(
    {"type": st.sampled_from(["string", "number", "boolean"])},
    optional={"description": _odd, "enum": st.just(["a", "b"])}), max_size=3)
_specs = st.builds(
    lambda name, desc, props, nested: (
        {"type": "function", "function": {"name": name, "description": desc,
                                          "parameters": {"type": "object", "properties": props}}}
        if nested else {"type": "function", "name": name, "description": desc, "parameters": None}),
    _odd.filter(lambda s: s.strip() and not any(c in s for c in "<>\n")), _odd, _props, st.booleans())


@examples(120, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_odd, max_size=2), st.lists(_specs, max_size=3), st.sampled_from([None, "none", "auto"]),
       st.booleans())
def test_varied_heads_render_as_the_reference_renders_them(ref: Any, instructions: list[str], tools: list[Any],
                                                           choice: str | None, with_format: bool) -> None:
    request: dict[str, Any] = {"messages": [*({"role": "system", "content": t} for t in instructions),
                                            {"role": "user", "content": "Go."}], "tools": tools}
    if choice:
        request["tool_choice"] = choice
    if with_format:
        request["response_format"] = {"type": "json_object"}
    names = [rendered_name(t["function"]["name"] if "function" in t else t["name"]) for t in tools]
    if len(set(names)) < len(names):  # names that render alike: refused, cold and cached, naming them
        for _ in range(2):
            with pytest.raises(RequestError) as refused:
                render_chat_request(_ENC, request)
            assert refused.value.param is not None and refused.value.param.startswith("tools")
        return
    expected = reference_of(ref, request)
    assert render_chat_request(_ENC, request).tokens == expected
    assert render_chat_request(_ENC, request).tokens == expected
