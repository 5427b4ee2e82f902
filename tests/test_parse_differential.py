"""Differential parsing against the reference, on valid completions and mutations of them."""

from __future__ import annotations

import json
from typing import Any

import openai_harmony
from hypothesis import HealthCheck, given
from hypothesis import strategies as st

import harmonykit as hk
from budget import examples
from harmonykit.parse.header import has_control_text, parse_reference  # noqa: F401
from strategies import assistant_turns

SETTINGS = examples(400, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
SPECIALS = [200006, 200007, 200008, 200005, 200003, 200002, 200012, 199999, 200014, 201088]


def _dicts(messages: list[Any]) -> list[dict[str, Any]]:
    return [json.loads(m.to_json()) for m in messages]


def run_ref(ref: Any, tokens: list[int], role: Any, strict: bool) -> tuple[str, Any]:
    r = None if role is None else openai_harmony.Role(role.value)
    try:
        return "ok", _dicts(ref.parse_messages_from_completion_tokens(tokens, r, strict=strict))
    except openai_harmony.HarmonyError as e:
        return "error", str(e)


def run_ours(enc: hk.HarmonyEncoding, tokens: list[int], role: Any, strict: bool) -> tuple[str, Any]:
    try:
        return "ok", _dicts(enc.parse_messages_from_completion_tokens(tokens, role, strict=strict))
    except hk.HarmonyError as e:
        return "error", str(e)


@st.composite
def completions(draw: st.DrawFn, enc: hk.HarmonyEncoding) -> tuple[list[int], hk.Role | None]:
    """A well-formed completion the way an engine returns it."""
    msgs = draw(assistant_turns())
    tokens = enc.render_conversation(hk.Conversation.from_messages(msgs))
    if msgs[-1].channel == "final" and draw(st.booleans()):
        tokens[-1] = 200002  # generation ends in <|return|>
    if draw(st.booleans()):
        tokens = tokens[:-1]  # engines strip the stop token
    if draw(st.booleans()):
        return tokens[2:], hk.Role.ASSISTANT  # the prompt ended in <|start|>assistant
    return tokens, None


_ENC = hk.load_harmony_encoding(hk.HarmonyEncodingName.HARMONY_GPT_OSS)


@SETTINGS
@given(completions(_ENC))
def test_valid_completions_match_reference(ref: Any, case: tuple[list[int], hk.Role | None]) -> None:
    tokens, role = case
    expected = run_ref(ref, tokens, role, True)
    assert expected[0] == "ok"
    assert run_ref(ref, tokens, role, False) == expected
    expected = ("ok", _constrain_as_content_type(expected[1]))  # docs/compatibility.md
    assert run_ours(_ENC, tokens, role, True) == expected
    # Tolerant mode is the reference's lenient mode on well-formed output.
    assert run_ours(_ENC, tokens, role, False) == expected
    result = _ENC.parse_completion(tokens, role)
    assert _dicts(result.messages) == expected[1]
    assert result.skipped == []


@st.composite
def mutated(draw: st.DrawFn, enc: hk.HarmonyEncoding) -> tuple[list[int], hk.Role | None]:
    tokens, role = draw(completions(enc))
    tokens = list(tokens)
    for _ in range(draw(st.integers(min_value=1, max_value=4))):
        op = draw(st.sampled_from(["insert", "delete", "dup", "swap", "truncate", "random"]))
        pos = draw(st.integers(min_value=0, max_value=len(tokens)))
        if op == "insert":
            tokens.insert(pos, draw(st.sampled_from(SPECIALS)))
        elif op == "random":
            tokens.insert(pos, draw(st.one_of(st.integers(0, 201088), st.integers(201089, 2**31))))
        elif tokens and op == "delete":
            del tokens[min(pos, len(tokens) - 1)]
        elif tokens and op == "dup":
            p = min(pos, len(tokens) - 1)
            tokens.insert(p, tokens[p])
        elif len(tokens) > 1 and op == "swap":
            p = min(pos, len(tokens) - 2)
            tokens[p], tokens[p + 1] = tokens[p + 1], tokens[p]
        elif op == "truncate":
            tokens = tokens[:pos]
    return tokens, role


def _constrain_as_content_type(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for m in messages:
        m = dict(m)
        if (m.get("recipient") or "").startswith("<|constrain|>") and "content_type" not in m:
            m["content_type"] = m.pop("recipient")
        out.append(m)
    return out


def _reference_garbage(messages: list[dict[str, Any]]) -> bool:
    """The reference returned control tokens inside header fields (our strict mode raises)."""
    for m in messages:
        ct = m.get("content_type") or ""
        ct = ct[len("<|constrain|>"):] if ct.startswith("<|constrain|>") else ct
        for value in (m.get("name"), m.get("recipient"), m.get("channel"), ct):
            if value and "<|" in value:
                return True
    return False


@SETTINGS
@given(mutated(_ENC))
def test_mutations_strict_agrees_with_reference(ref: Any, case: tuple[list[int], hk.Role | None]) -> None:
    tokens, role = case
    expected = run_ref(ref, tokens, role, True)
    ours = run_ours(_ENC, tokens, role, True)
    if expected[0] == "ok" and ours[0] == "ok" and ours != expected:
        # Only where the reference put <|constrain|>TYPE in the recipient: we read a content type.
        assert ours[1] == _constrain_as_content_type(expected[1]), (ours, expected)
    elif expected[0] == "ok" and ours[0] == "error":
        assert _reference_garbage(expected[1]), (ours, expected)
        assert "control token" in ours[1]
    elif expected[0] == ours[0] == "error" and ours[1] != expected[1]:
        # We stop at garbage in a header that the reference only trips over later.
        assert ours[1].startswith("control token"), (ours, expected)
    else:
        assert ours == expected


@SETTINGS
@given(mutated(_ENC))
def test_mutations_tolerant_never_raises_and_tiles(case: tuple[list[int], hk.Role | None]) -> None:
    tokens, role = case
    result = _ENC.parse_completion(tokens, role)
    assert result.spans == sorted(result.spans) and result.skipped == sorted(result.skipped)  # in order
    ranges = sorted(result.spans + result.skipped)
    pos = 0
    for start, end in ranges:
        assert start == pos and end > start, (ranges, len(tokens))
        pos = end
    assert pos == len(tokens)
    assert len(result.spans) == len(result.messages)
    for start, end in result.skipped:
        assert any(r.start == start and r.end == end for r in result.repairs)
    for m in result.messages:
        for field in (m.author.name, m.recipient, m.channel):
            assert not field or "<|" not in field
        ct = m.content_type or ""
        assert "<|" not in ct.removeprefix("<|constrain|>")
