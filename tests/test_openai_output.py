"""Engine output -> Chat Completions and Responses: wild cases, API types, stream == one-shot."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from openai.types.chat import ChatCompletion, ChatCompletionChunk
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import TypeAdapter

import harmonykit as hk
from harmonykit.openai import (
    ChatCompletionStream,
    ResponsesStream,
    completion_to_chat_choice,
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


SETTINGS = settings(max_examples=150, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
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
    # Deltas add up to each item's text.
    for index, item in enumerate(final["output"]):
        deltas = "".join(e["delta"] for e in events if e.get("output_index") == index and "delta" in e)
        text = item["arguments"] if item["type"] == "function_call" else item["content"][0]["text"]
        assert deltas == text


def test_responses_items(enc: hk.HarmonyEncoding) -> None:
    text = ("<|channel|>analysis<|message|>Need weather.<|end|><|start|>assistant<|channel|>commentary "
            'to=functions.get_weather <|constrain|>json<|message|>{"city":"Paris"}<|call|>')
    items = completion_to_response_output(enc, enc.encode(text, allowed_special="all"))
    assert [i["type"] for i in items] == ["reasoning", "function_call"]
    assert items[0]["content"][0]["text"] == "Need weather."
    assert (items[1]["name"], items[1]["arguments"]) == ("get_weather", '{"city":"Paris"}')
    for item in items:
        TypeAdapter(Any).validate_python(item)
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
        # a call cut off by max_tokens is not a call
        ('<|channel|>commentary to=functions.f<|message|>{"a": ', "length", None, [], "length",
         "cut_off_tool_call"),
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
    choice = completion_to_chat_choice(enc, enc.encode(text, allowed_special="all"), finish_reason=finish)
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
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
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
