"""Engine output -> Chat Completions and Responses: wild cases, API types, stream == one-shot."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import pytest
from hypothesis import HealthCheck, given
from hypothesis import strategies as st
from openai.types.chat import ChatCompletion, ChatCompletionChunk
from openai.types.responses import Response, ResponseOutputItem, ResponseStreamEvent
from pydantic import TypeAdapter

import harmonykit as hk
from budget import examples
from harmonykit.openai import (
    ChatCompletionStream,
    ResponsesStream,
    StreamClosed,
    completion_to_chat_choice,
    completion_to_response,
    completion_to_response_output,
    merge_deltas,
)
from test_parse_differential import _ENC, mutated
from test_parse_tolerant import WILD


def _event_classes() -> dict[str, Any]:
    import typing

    out = {}
    for cls in typing.get_args(typing.get_args(ResponseStreamEvent)[0]):
        literal = typing.get_args(cls.model_fields["type"].annotation)
        out[literal[0]] = cls
    return out


EVENT_CLASSES = _event_classes()


def validate_event(event: dict[str, Any]) -> None:
    EVENT_CLASSES[event["type"]].model_validate(event)


def _json_or_raw(expected: Any, arguments: str) -> bool:
    if isinstance(expected, dict) and set(expected) == {"raw"}:
        return arguments == expected["raw"]
    return json.loads(arguments) == expected


def _all_text(choice: dict[str, Any]) -> str:
    m = choice["message"]
    parts = [m["content"] or "", m["reasoning_content"] or ""]
    parts += [c["function"]["arguments"] for c in m.get("tool_calls") or []]
    return "\n".join(parts)


@pytest.mark.parametrize("case", WILD, ids=[c["id"] for c in WILD])
def test_wild_case_meets_its_expectation(enc: hk.HarmonyEncoding, case: dict[str, Any]) -> None:
    tokens = enc.encode(case["text"], allowed_special="all")
    choice = completion_to_chat_choice(enc, tokens, request=case.get("request"),
                                       finish_reason=case["engine_finish_reason"])
    m, ex = choice["message"], case["expect"]
    strip = lambda s: s.strip() if isinstance(s, str) else s  # noqa: E731
    if "content" in ex:
        assert strip(m["content"]) == strip(ex["content"])
    if "reasoning" in ex:
        assert strip(m["reasoning_content"]) == strip(ex["reasoning"])
    if "reasoning_contains" in ex:
        assert ex["reasoning_contains"] in (m["reasoning_content"] or "")
    if "reasoning_excludes" in ex:
        assert ex["reasoning_excludes"] not in (m["reasoning_content"] or "")
    calls = m.get("tool_calls") or []
    if choice["finish_reason"] == "length" and calls:
        # Issue 7 supersedes the older expectation that a cut-off call vanishes: it is returned
        # with its partial arguments, as OpenAI returns it, finish_reason "length", and a note.
        assert "cut_off_tool_call" in [n["kind"] for n in choice["harmony"]["notes"]]
        calls = calls[:-1]
    if "tool_calls" in ex:
        assert [c["function"]["name"] for c in calls] == [c["name"] for c in ex["tool_calls"]]
        for call, want in zip(calls, ex["tool_calls"], strict=True):
            assert _json_or_raw(want["arguments"], call["function"]["arguments"])
            assert call["id"].startswith("call_") and call["type"] == "function"
    if "tool_names" in ex:
        assert [c["function"]["name"] for c in calls] == ex["tool_names"]
    if "finish_reason" in ex:
        assert choice["finish_reason"] == ex["finish_reason"]
    if "any_text_contains" in ex:
        assert ex["any_text_contains"] in _all_text(choice)
    if "recipients_include" in ex:
        builtin = [b["recipient"] for b in choice["harmony"].get("builtin_tool_calls", [])]
        assert set(ex["recipients_include"]) <= set(builtin + [c["function"]["name"] for c in calls])
    # Always: no control token anywhere a user sees, and the choice is a valid ChatCompletion.
    assert "<|" not in _all_text(choice) and all("<|" not in c["function"]["name"] for c in calls)
    ChatCompletion.model_validate({"id": "x", "object": "chat.completion", "created": 0, "model": "m",
                                   "choices": [choice]})


def _in_chunks(stream: Any, tokens: list[int], cuts: list[int], finish: str) -> list[dict[str, Any]]:
    """Everything a stream sends when the tokens arrive in chunks cut at ``cuts``."""
    out: list[dict[str, Any]] = []
    pos = 0
    for cut in [*sorted(set(cuts)), len(tokens)]:
        out += stream.feed(tokens[pos:cut])
        pos = max(pos, cut)
    return out + stream.close(finish)


def _without_ids(message: dict[str, Any]) -> dict[str, Any]:
    out = dict(message)
    out.pop("refusal", None)
    out["tool_calls"] = [{**c, "id": None} for c in out.get("tool_calls") or []]
    return out


SETTINGS = examples(150, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
TOOLS_REQUEST = {"tools": [{"type": "function", "function": {"name": "get_weather"}}],
                 "stream_options": {"include_usage": True}}


@SETTINGS
@given(mutated(_ENC), st.lists(st.integers(0, 200), max_size=5), st.sampled_from(["stop", "length"]))
def test_chat_stream_concatenates_to_the_choice(case: tuple[list[int], hk.Role | None], cuts: list[int],
                                                finish: str) -> None:
    tokens, _ = case
    choice = completion_to_chat_choice(_ENC, tokens, request=TOOLS_REQUEST, finish_reason=finish)
    chunks = _in_chunks(ChatCompletionStream(_ENC, request=TOOLS_REQUEST), tokens, cuts, finish)
    for chunk in chunks:
        ChatCompletionChunk.model_validate(chunk)
    deltas = [c["choices"][0]["delta"] for c in chunks if c["choices"]]
    assert deltas[0]["role"] == "assistant"
    assert _without_ids(merge_deltas(deltas)) == _without_ids(choice["message"])
    last = [c for c in chunks if c["choices"]][-1]["choices"][0]
    assert last["finish_reason"] == choice["finish_reason"]
    assert chunks[-1]["usage"]["completion_tokens"] == len(tokens)
    for c in chunks:
        for tc in (c["choices"][0]["delta"].get("tool_calls") or []) if c["choices"] else []:
            if "id" in tc:  # a call's first delta: index, id, type, name and empty arguments
                assert tc["function"] == {"name": tc["function"]["name"], "arguments": ""}
    text = json.dumps(choice["message"], ensure_ascii=False)
    assert "<|start|>" not in text and "<|channel|>" not in text and "<|message|>" not in text


def _strip_ids(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: v for k, v in i.items() if k not in ("id", "call_id")} for i in items]


@SETTINGS
@given(mutated(_ENC), st.lists(st.integers(0, 200), max_size=5), st.sampled_from(["stop", "length"]))
def test_responses_stream_matches_output(case: tuple[list[int], hk.Role | None], cuts: list[int],
                                         finish: str) -> None:
    tokens, _ = case
    items = completion_to_response_output(_ENC, tokens, request=TOOLS_REQUEST, finish_reason=finish)
    events = _in_chunks(ResponsesStream(_ENC, request=TOOLS_REQUEST), tokens, cuts, finish)
    for ev in events:
        validate_event(ev)
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert events[0]["type"] == "response.created"
    final = events[-1]["response"]
    Response.model_validate(final)
    assert _strip_ids(final["output"]) == _strip_ids(items)
    whole = completion_to_response(_ENC, tokens, request=TOOLS_REQUEST, finish_reason=finish)
    Response.model_validate(whole)
    assert _strip_ids(whole["output"]) == _strip_ids(final["output"]) and whole["usage"] == final["usage"]
    assert (whole["status"] == "incomplete") == (finish == "length")
    # Deltas add up to each item's text.
    for index, item in enumerate(final["output"]):
        deltas = "".join(e["delta"] for e in events if e.get("output_index") == index and "delta" in e)
        if item["type"] == "function_call":
            assert deltas == item["arguments"]
        elif item["type"] in ("message", "reasoning"):
            assert deltas == item["content"][0]["text"]


def test_responses_items(enc: hk.HarmonyEncoding) -> None:
    text = ("<|channel|>analysis<|message|>Need weather.<|end|><|start|>assistant<|channel|>commentary "
            'to=functions.get_weather <|constrain|>json<|message|>{"city":"Paris"}<|call|>')
    items = completion_to_response_output(enc, enc.encode(text, allowed_special="all"), request=TOOLS_REQUEST)
    assert [i["type"] for i in items] == ["reasoning", "function_call"]
    assert items[0]["content"][0]["text"] == "Need weather."
    assert (items[1]["name"], items[1]["arguments"]) == ("get_weather", '{"city":"Paris"}')
    output_item = TypeAdapter(ResponseOutputItem)
    for item in items:
        assert output_item.validate_python(item, strict=True).model_dump(exclude_unset=True) == item
    length = ResponsesStream(enc)
    events = length.feed(enc.encode("<|channel|>final<|message|>partial", allowed_special="all"))
    events += length.close("length")
    assert events[-1]["type"] == "response.incomplete"
    assert events[-1]["response"]["incomplete_details"] == {"reason": "max_output_tokens"}


@pytest.mark.parametrize(
    ("text", "finish", "content", "calls", "reason", "note"),
    [
        # the first complete JSON value when junk trails it
        ('<|channel|>commentary to=functions.f<|message|>{"a": 1} trailing<|call|>', "stop", None,
         [("f", '{"a": 1}')], "tool_calls", "text_after_arguments"),
        # a call cut off by max_tokens is returned as OpenAI returns it: partial, finish_reason length
        ('<|channel|>commentary to=functions.f<|message|>{"a": ', "length", None, [("f", '{"a": ')], "length",
         "cut_off_tool_call"),
        # trailing text is cut only after a value that parses; anything else passes verbatim
        ("<|channel|>commentary to=functions.f<|message|>{'a': '}'}<|call|>", "stop", None,
         [("f", "{'a': '}'}")], "tool_calls", None),
        ('<|channel|>commentary to=functions.f<|message|>{"a": [}]} x<|call|>', "stop", None,
         [("f", '{"a": [}]} x')], "tool_calls", None),
        ("<|channel|>commentary to=functions.f<|message|><|call|>", "stop", None, [("f", "")], "tool_calls",
         "empty_arguments"),
        # declared names, in the rendered or the declared spelling, case and spaces aside
        ("<|channel|>commentary to=functions.Get_Weather<|message|>{}<|call|>", "stop", None,
         [("Get Weather", "{}")], "tool_calls", None),
        ("<|channel|>commentary to=get weather<|message|>{}<|call|>", "stop", None,
         [("Get Weather", "{}")], "tool_calls", None),
        # functions.X for an undeclared X is still returned (the client answers "unknown tool"), noted
        ("<|channel|>commentary to=functions.nope<|message|>{}<|call|>", "stop", None, [("nope", "{}")],
         "tool_calls", "undeclared_tool"),
        # answers with odd headers are answers, never calls
        ('<|channel|>final json<|message|>{"a":1}<|return|>', "stop", '{"a":1}', [], "stop", None),
        ("<|start|>assistantfinal<|message|>Hello<|return|>", "stop", "Hello", [], "stop", None),
        ("<|channel|>final to=assistant<|message|>Hi<|return|>", "stop", "Hi", [], "stop", None),
        # a bare name that is no tool is no call
        ("<|channel|>commentary to=shell<|message|>ls<|call|>", "stop", None, [], "stop", "unknown_recipient"),
        # text after <|end|> with no header is the answer when there is no final message
        ('<|channel|>analysis<|message|>Make JSON.<|end|>{"a": 1}', "stop", '{"a": 1}', [], "stop",
         "headerless_text"),
        # the engine ran past <|call|>: the rest is not the model's
        ("<|channel|>commentary to=functions.f<|message|>{}<|call|><|start|>assistant<|channel|>final"
         "<|message|>It is sunny.<|return|>", "stop", None, [("f", "{}")], "tool_calls", "after_tool_call"),
        # headerless text is the answer when there is no final message
        ("Plain answer.", "stop", "Plain answer.", [], "stop", "headerless_text"),
        # a preamble is content
        ("<|channel|>commentary<|message|>Checking.<|end|><|start|>assistant<|channel|>commentary "
         "to=functions.f<|message|>{}<|call|>", "stop", "Checking.", [("f", "{}")], "tool_calls", None),
        # two answers are joined
        ("<|channel|>final<|message|>A<|end|><|start|>assistant<|channel|>final<|message|>B<|return|>", "stop",
         "A\n\nB", [], "stop", None),
    ],
)
def test_response_rules(enc: hk.HarmonyEncoding, text: str, finish: str, content: str | None,
                        calls: list[tuple[str, str]], reason: str, note: str | None) -> None:
    request = {"tools": [{"type": "function", "function": {"name": n}} for n in ("f", "Get Weather", "x-y")]}
    choice = completion_to_chat_choice(enc, enc.encode(text, allowed_special="all"), request=request,
                                       finish_reason=finish)
    assert choice["message"]["content"] == content
    assert [(c["function"]["name"], c["function"]["arguments"]) for c in choice["message"].get("tool_calls", [])] \
        == calls
    assert choice["finish_reason"] == reason
    if note:
        assert note in [n["kind"] for n in choice["harmony"].get("notes", [])]


def test_repairs_are_visible(enc: hk.HarmonyEncoding) -> None:
    choice = completion_to_chat_choice(
        enc, enc.encode("<|channel|>final<|message|>Answer<|end|><|return|>", allowed_special="all"))
    assert [r["kind"] for r in choice["harmony"]["repairs"]] == ["stray_stop_token"]


def test_openai_package_is_not_imported() -> None:
    code = "import sys, harmonykit.openai; print('openai' in sys.modules)"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    assert proc.stdout.strip() == "False"


def test_headerless_text_keeps_its_place(enc: hk.HarmonyEncoding) -> None:
    text = ("Plain first.<|end|><|start|>assistant<|channel|>analysis<|message|>Think.<|end|>"
            "<|start|>assistant<|channel|>final<|message|>Answer<|return|>")
    tokens = enc.encode(text, allowed_special="all")
    choice = completion_to_chat_choice(enc, tokens)
    assert choice["message"]["reasoning_content"] == "Plain first.\n\nThink."
    assert choice["message"]["content"] == "Answer"
    # Streamed, nothing after the undecided text goes out before it.
    chunks = _in_chunks(ChatCompletionStream(enc), tokens, list(range(len(tokens))), "stop")
    reasoning = [c["choices"][0]["delta"].get("reasoning_content") for c in chunks if c["choices"]]
    assert "".join(r for r in reasoning if r) == "Plain first.\n\nThink."
    assert reasoning.index("Plain first.") < reasoning.index("Think")


NO_TOOLS_CASES = [
    '<|channel|>final json<|message|>{"a":1}<|return|>',
    "<|start|>assistantfinal<|message|>Hello<|return|>",
    "<|channel|>final to=assistant<|message|>Hi<|return|>",
    "<|channel|>commentary to=functions.get_weather<|message|>{}<|call|>",
    "<|channel|>commentary to=get_weather<|message|>{}<|call|>",
    "<|channel|>analysis to=functions.f code<|message|>ls<|call|>",
]


@pytest.mark.parametrize("text", NO_TOOLS_CASES)
def test_no_call_without_declared_tools(enc: hk.HarmonyEncoding, text: str) -> None:
    tokens = enc.encode(text, allowed_special="all")
    for request in (None, {"tools": []}):
        choice = completion_to_chat_choice(enc, tokens, request=request)
        assert "tool_calls" not in choice["message"] and choice["finish_reason"] == "stop"
        response = completion_to_response(enc, tokens, request=request)
        assert "function_call" not in [i["type"] for i in response["output"]]
    # nothing is lost: the body is shown or noted
    body = text.split("<|message|>")[1].split("<|")[0]
    assert body in json.dumps(choice, ensure_ascii=False).replace('\\"', '"')


@SETTINGS
@given(mutated(_ENC), st.sampled_from(["stop", "length"]))
def test_never_a_call_without_tools(case: tuple[list[int], hk.Role | None], finish: str) -> None:
    tokens, _ = case
    choice = completion_to_chat_choice(_ENC, tokens, finish_reason=finish)
    assert "tool_calls" not in choice["message"]
    assert choice["finish_reason"] == ("length" if finish == "length" else "stop")


def test_arguments_stream_as_generated(enc: hk.HarmonyEncoding) -> None:
    text = ('<|channel|>commentary to=functions.f <|constrain|>json<|message|>{"path": "a.py", '
            '"content": "def f():\\n    return 1\\n"}<|call|>')
    tokens = enc.encode(text, allowed_special="all")
    stream = ChatCompletionStream(enc, request=TOOLS_REQUEST | {"tools": [{"type": "function",
                                                                          "function": {"name": "f"}}]})
    fragments = []
    for t in tokens[:-1]:
        for chunk in stream.feed([t]):
            for tc in chunk["choices"][0]["delta"].get("tool_calls") or []:
                fragments.append(tc["function"].get("arguments"))
    assert fragments[0] == "" and len(fragments) > 5  # name first, then piece by piece
    assert json.loads("".join(fragments[1:]))["path"] == "a.py"
    events = ResponsesStream(enc, request={"tools": [{"type": "function", "name": "f"}]}).feed(tokens)
    assert len([e for e in events if e["type"] == "response.function_call_arguments.delta"]) > 5


def test_cut_off_call_is_incomplete(enc: hk.HarmonyEncoding) -> None:
    tokens = enc.encode('<|channel|>commentary to=functions.f<|message|>{"a": "b', allowed_special="all")
    request = {"tools": [{"type": "function", "name": "f"}]}
    response = completion_to_response(enc, tokens, request=request, finish_reason="length")
    Response.model_validate(response)
    assert response["status"] == "incomplete"
    assert response["incomplete_details"] == {"reason": "max_output_tokens"}
    assert [(i["type"], i["status"], i["arguments"]) for i in response["output"]] == \
        [("function_call", "incomplete", '{"a": "b')]
    assert "cut_off_tool_call" in [n["kind"] for n in response["harmony"]["notes"]]


def test_whole_response_and_usage(enc: hk.HarmonyEncoding) -> None:
    text = ("<|channel|>analysis<|message|>Think about it.<|end|><|start|>assistant<|channel|>final"
            "<|message|>Done.<|return|>")
    tokens = enc.encode(text, allowed_special="all")
    request = {"model": "gpt-oss-20b", "input": "Go", "stream_options": {"include_usage": True}}
    response = completion_to_response(enc, tokens, request=request)
    Response.model_validate(response)
    analysis = enc.encode("<|channel|>analysis<|message|>Think about it.<|end|>", allowed_special="all")
    assert response["usage"]["output_tokens_details"]["reasoning_tokens"] == len(analysis)
    assert response["usage"]["output_tokens"] == len(tokens)
    assert response["model"] == "gpt-oss-20b" and response["status"] == "completed"
    assert all(i["status"] == "completed" for i in response["output"])
    chunks = ChatCompletionStream(enc, request={"messages": [], **request}).feed(tokens)
    chunks = ChatCompletionStream(enc, request={"messages": [{"role": "user", "content": "Go"}], **request})
    out = chunks.feed(tokens) + chunks.close()
    assert out[-1]["usage"]["completion_tokens_details"]["reasoning_tokens"] == len(analysis)


def test_builtin_calls_never_vanish(enc: hk.HarmonyEncoding) -> None:
    text = ('<|channel|>analysis<|message|>Search.<|end|><|start|>assistant<|channel|>analysis '
            'to=browser.search code<|message|>{"query": "gpt-oss"}<|call|>')
    tokens = enc.encode(text, allowed_special="all")
    choice = completion_to_chat_choice(enc, tokens)
    assert choice["harmony"]["builtin_tool_calls"][0]["recipient"] == "browser.search"
    response = completion_to_response(enc, tokens)
    Response.model_validate(response)
    assert response["output"][-1]["type"] == "web_search_call"
    assert response["output"][-1]["action"] == {"type": "search", "query": "gpt-oss"}
    python = enc.encode("<|channel|>analysis to=python code<|message|>print(1)<|call|>", allowed_special="all")
    item = completion_to_response(enc, python)["output"][-1]
    assert (item["type"], item["code"]) == ("code_interpreter_call", "print(1)")


def test_stream_lifecycle(enc: hk.HarmonyEncoding) -> None:
    tokens = enc.encode("<|channel|>final<|message|>Hi<|return|>", allowed_special="all")
    for cls in (ChatCompletionStream, ResponsesStream):
        stream = cls(enc)
        stream.feed(tokens)
        assert stream.close()
        assert stream.close() == []  # no second finish chunk
        with pytest.raises(StreamClosed):
            stream.feed(tokens)
        with pytest.raises(ValueError, match="finish_reason must be one of"):
            cls(enc).close("eos")
    with pytest.raises(TypeError, match="token_ids"):
        ChatCompletionStream(enc).feed(5)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"token_ids\[1\]"):
        ResponsesStream(enc).feed([1, "a"])  # type: ignore[list-item]
    with pytest.raises(TypeError, match="encoding"):
        ChatCompletionStream(None)  # type: ignore[arg-type]
    from harmonykit.openai import render_chat_request, render_responses_request

    for render in (render_chat_request, render_responses_request):
        with pytest.raises(TypeError, match="encoding must be a HarmonyEncoding"):
            render(None, {"input": "x", "messages": [{"role": "user", "content": "x"}]})  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="tokens must be a sequence"):
        enc.parse_completion("<|start|>")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"tokens\[1\]"):
        enc.parse_messages_from_completion_tokens([200006, 1.0], None)  # type: ignore[list-item]
    with pytest.raises(TypeError, match="encoding"):
        hk.StreamableParser(None, hk.Role.ASSISTANT)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="token 0"):
        hk.StreamableParser(enc, hk.Role.ASSISTANT).process("a")  # type: ignore[arg-type]


def test_every_note_kind_is_documented() -> None:
    import re
    from pathlib import Path

    from harmonykit.openai import NOTE_KINDS

    doc = (Path(__file__).resolve().parents[1] / "docs" / "openai.md").read_text(encoding="utf-8")
    assert set(re.findall(r"^\| `([a-z_]+)` \|", doc, re.M)) == set(NOTE_KINDS)
    source = (Path(hk.__file__).parent / "openai" / "turn.py").read_text(encoding="utf-8")
    assert set(re.findall(r'Note\(\s*"([a-z_]+)"', source)) <= set(NOTE_KINDS)


def test_ids_and_events_as_the_sdk_spells_them(enc: hk.HarmonyEncoding) -> None:
    from harmonykit.openai import ResponsesStream, completion_to_chat_completion

    toks = enc.encode("<|channel|>commentary to=functions.f<|message|>{}<|call|>", allowed_special="all")
    req = {"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function", "function": {"name": "f"}}]}
    assert completion_to_chat_completion(enc, toks, request=req)["id"].startswith("chatcmpl-")
    stream = ResponsesStream(enc, request={"input": "x", "tools": [{"type": "function", "name": "f"}]})
    events = stream.feed(toks) + stream.close("stop")
    done = [e for e in events if e["type"] == "response.function_call_arguments.done"]
    assert done and done[0]["name"] == "f"


@pytest.mark.parametrize("text", [
    '<|channel|>analysis<|message|>Look it up.<|end|><|start|>assistant<|channel|>analysis to=browser.search code'
    '<|message|>{"query": "harmony format", "topn": 3}<|call|>',
    "<|channel|>analysis to=python code<|message|>print(2 + 2)<|call|>",
    '<|channel|>analysis<|message|>Hm.<|end|><|start|>assistant<|channel|>commentary to=functions.f <|constrain|>json'
    '<|message|>{"a": 1}<|call|>',
    "<|channel|>analysis<|message|>Easy.<|end|><|start|>assistant<|channel|>final<|message|>4<|return|>",
])
def test_replaying_response_output_as_input_renders_it_back(enc: hk.HarmonyEncoding, text: str) -> None:
    """The SDKs send response.output back as the next input: every item kind the gateway emits
    round-trips, rendered as the model wrote it."""
    from harmonykit.openai import completion_to_response, render_responses_request

    tools = [{"type": "function", "name": "f", "parameters": {"type": "object"}}]
    toks = enc.encode(text, allowed_special="all")
    out = completion_to_response(enc, toks, request={"input": "hi", "tools": tools})
    follow = {"input": [{"role": "user", "content": "hi"}, *out["output"]], "tools": tools}
    rendered = enc.decode(render_responses_request(enc, follow).tokens)
    body = text.split("<|message|>")[-1].removesuffix("<|call|>").removesuffix("<|return|>")
    assert body in rendered
    for recipient in ("browser.search", "python"):  # the renderer's own order: recipient, then channel
        if f"to={recipient}" in text:
            assert f"<|start|>assistant to={recipient}<|channel|>analysis code<|message|>{body}<|call|>" in rendered


def _sdk_check_cases() -> list[str]:
    from conftest import CASES

    wild = [json.loads(line)["text"] for line in CASES.read_text(encoding="utf-8").splitlines() if line.strip()]
    return wild + [
        '<|channel|>analysis<|message|>Hm.<|end|><|start|>assistant<|channel|>commentary to=functions.f '
        '<|constrain|>json<|message|>{"a": 1}<|call|>',
        "<|channel|>analysis<|message|>Easy.<|end|><|start|>assistant<|channel|>final<|message|>4<|return|>",
        '<|channel|>analysis to=browser.search code<|message|>{"query": "x"}<|call|>',
        "<|channel|>final<|message|>cut",
    ]


@pytest.mark.parametrize("text", _sdk_check_cases())
def test_every_object_and_event_validates_strictly_against_the_sdk(enc: hk.HarmonyEncoding, text: str) -> None:
    """The newest installed openai SDK's own types, in strict mode: every object and every event."""
    from openai.types.chat import ChatCompletion, ChatCompletionChunk
    from openai.types.responses import Response, ResponseStreamEvent
    from pydantic import TypeAdapter

    from harmonykit.openai import ChatCompletionStream, ResponsesStream, completion_to_chat_completion

    chat = {"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function", "function": {"name": "f"}}],
            "stream_options": {"include_usage": True}}
    responses = {"input": "x", "tools": [{"type": "function", "name": "f", "parameters": {"type": "object"}}]}
    events = TypeAdapter(ResponseStreamEvent)
    toks = enc.encode(text, allowed_special="all")
    for finish in ("stop", "length"):
        ChatCompletion.model_validate(completion_to_chat_completion(enc, toks, request=chat, finish_reason=finish),
                                      strict=True)
        stream = ChatCompletionStream(enc, request=chat)
        for chunk in stream.feed(toks) + stream.close(finish):
            ChatCompletionChunk.model_validate(chunk, strict=True)
        Response.model_validate(completion_to_response(enc, toks, request=responses, finish_reason=finish),
                                strict=True)
        rstream = ResponsesStream(enc, request=responses)
        for event in rstream.feed(toks) + rstream.close(finish):
            events.validate_python(event, strict=True)
