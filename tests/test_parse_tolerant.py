"""Tolerant mode on malformed output: each failure class, and the wild cases, at the message level."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from hypothesis import HealthCheck, given
from hypothesis import strategies as st

import harmonykit as hk
from budget import examples
from conftest import CASES
from test_parse_differential import _ENC, mutated

WILD = [json.loads(line) for line in CASES.read_text(encoding="utf-8").splitlines() if line.strip()]


def parse(enc: hk.HarmonyEncoding, text: str, tools: list[str] | None = None,
          role: hk.Role | None = hk.Role.ASSISTANT) -> hk.ParseResult:
    return enc.parse_completion(enc.encode(text, allowed_special="all"), role, tools=tools)


def shape(result: hk.ParseResult) -> list[tuple[str | None, str | None, str | None, str]]:
    return [(m.channel, m.recipient, m.content_type, m.content[0].text) for m in result.messages]  # type: ignore[union-attr]


def assert_accounted(result: hk.ParseResult, n: int) -> None:
    pos = 0
    for start, end in sorted(result.spans + result.skipped):
        assert start == pos and end > start
        pos = end
    assert pos == n
    for start, end in result.skipped:
        assert any((r.start, r.end) == (start, end) for r in result.repairs)
    assert all(r.kind in hk.REPAIR_KINDS for r in result.repairs)


# (text, tools, expected messages, repair kinds that must be reported)
CLASSES: list[tuple[str, list[str] | None, list[tuple[Any, ...]], set[str]]] = [
    # header with no <|message|>: its text becomes the body, channel kept
    ('<|channel|>analysis<|message|>x<|end|><|start|>assistant<|channel|>final {"a": 1}<|return|>', None,
     [("analysis", None, None, "x"), ("final", None, None, '{"a": 1}')], {"missing_message_token"}),
    # prose in place of a header (prefilled role, nothing else)
    ("Just an answer, no markup.", None, [(None, None, None, "Just an answer, no markup.")],
     {"missing_message_token"}),
    # recipient with spaces, with and without declared tools
    ("<|channel|>commentary to=Get Intersection Layout<|message|>{}<|call|>", ["Get Intersection Layout"],
     [("commentary", "Get Intersection Layout", None, "{}")], {"recipient_with_spaces"}),
    ("<|channel|>commentary to=Get Intersection Layout<|message|>{}<|call|>", None,
     [("commentary", "Get Intersection Layout", None, "{}")], {"recipient_with_spaces"}),
    # unknown header words
    ("<|channel|>final ––commentary<|message|>Hi<|return|>", None,
     [("final", None, None, "Hi")], {"unknown_header_word"}),
    ("<|start|>assistant ––commentary<|message|>Hi<|end|>", None,
     [("commentary", None, None, "Hi")], {"channel_repaired", "doubled_start"}),
    # recipient given twice, channel given twice
    ("<|start|>assistant to=functions.f<|channel|>commentary to=functions.f<|message|>{}<|call|>", ["f"],
     [("commentary", "functions.f", None, "{}")], {"duplicate_recipient", "doubled_start"}),
    ("<|channel|>analysis<|channel|>final<|message|>Hi<|return|>", None,
     [("final", None, None, "Hi")], {"duplicate_channel"}),
    # control tokens leaking into recipient / channel / content type
    ("<|channel|>commentary to=functions.f<|channel|>commentary <|constrain|>json<|message|>{}<|call|>", ["f"],
     [("commentary", "functions.f", "<|constrain|>json", "{}")], {"duplicate_channel"}),
    ("<|channel|>final<|reserved_200014|><|message|>Hi<|return|>", None,
     [("final", None, None, "Hi")], {"control_token_in_header"}),
    ("<|channel|>final <|constrain|>json<|message|>{}<|return|>", None,
     [("final", None, "<|constrain|>json", "{}")], set()),
    # content type glued to the name
    ("<|channel|>commentary to=functions.shelljson<|message|>{}<|call|>", ["shell"],
     [("commentary", "functions.shell", "json", "{}")], {"content_type_glued"}),
    # empty channel
    ("<|channel|><|message|>Hi<|return|>", None, [("final", None, None, "Hi")], {"empty_channel"}),
    # junk channel headers before the real message (llama.cpp #27720): noise is set aside,
    # free text after an empty channel keeps no channel
    ("<|channel|>commentary 2?<|end|><|start|>assistant<|channel|>final<|message|>Hi<|return|>", None,
     [("final", None, None, "Hi")], {"empty_message"}),
    ("<|channel|>??<|end|><|start|>assistant<|channel|>final<|message|>Hi<|return|>", None,
     [("final", None, None, "Hi")], {"empty_message"}),
    ("<|channel|>final 4<|return|>", None, [("final", None, None, "4")], {"missing_message_token"}),
    ("<|channel|> some free text<|end|><|start|>assistant<|channel|>final<|message|>Hi<|return|>", None,
     [(None, None, None, "some free text"), ("final", None, None, "Hi")], {"empty_channel"}),
    # missing <|start|> between messages
    ("<|channel|>analysis<|message|>a<|end|><|channel|>final<|message|>b<|return|>", None,
     [("analysis", None, None, "a"), ("final", None, None, "b")], {"missing_start"}),
    # the engine dropped <|start|>assistant<|channel|> (vLLM "Unexpected token 12606")
    ("<|channel|>analysis<|message|>a<|end|>commentary to=functions.f <|constrain|>json<|message|>{}<|call|>",
     ["f"], [("analysis", None, None, "a"), ("commentary", "functions.f", "<|constrain|>json", "{}")],
     {"missing_channel_marker"}),
    # doubled <|start|>, doubled role word
    ("<|channel|>analysis<|message|>a<|end|><|start|><|start|>assistant<|channel|>final<|message|>b<|return|>",
     None, [("analysis", None, None, "a"), ("final", None, None, "b")], {"doubled_start"}),
    ("<|channel|>analysis<|message|>a<|end|><|start|>assistantassistant<|channel|>final<|message|>b<|return|>",
     None, [("analysis", None, None, "a"), ("final", None, None, "b")], {"doubled_role"}),
    # stray text before, between, after messages
    ("<|channel|>analysis<|message|>a<|end|> 364 <|start|>assistant<|channel|>final<|message|>b<|return|> bye",
     None, [("analysis", None, None, "a"), ("final", None, None, "b")], {"stray_text"}),
    ("<|start|>junk<|start|>assistant<|channel|>final<|message|>b<|return|>", None,
     [(None, None, None, "junk"), ("final", None, None, "b")], {"missing_message_token"}),
    # stop tokens in each other's place, doubled or stray
    ("<|channel|>final<|message|>b<|end|><|return|><|call|>", None, [("final", None, None, "b")],
     {"stray_stop_token"}),
    ("<|channel|>commentary to=functions.f<|message|>{}<|return|>", ["f"],
     [("commentary", "functions.f", None, "{}")], {"wrong_stop_token"}),
    ("<|channel|>final<|message|>b<|call|>", None, [("final", None, None, "b")], {"wrong_stop_token"}),
    # a new header inside a body
    ("<|channel|>analysis<|message|>think<|start|>assistant<|channel|>final<|message|>b<|return|>", None,
     [("analysis", None, None, "think"), ("final", None, None, "b")], {"header_inside_body"}),
    ("<|channel|>final<|message|><|channel|>commentary to=functions.X<|message|>{}<|call|>", ["X"],
     [("commentary", "functions.X", None, "{}")], {"empty_message", "missing_start"}),
    # tool calls on the analysis channel, with content type code (kept as the model wrote them)
    ("<|channel|>analysis to=functions.f code<|message|>ls<|call|>", ["f"],
     [("analysis", "functions.f", "code", "ls")], set()),
    # control tokens inside a body are dropped, not shown
    ("<|channel|>final<|message|>a<|constrain|>b<|endoftext|>c<|return|>", None,
     [("final", None, None, "abc")], {"control_token_in_body"}),
    # mangled channel names: junk, repeats, case, a doubled channel word
    ("<|channel|>final?final?<|message|>Hi<|return|>", None, [("final", None, None, "Hi")], {"channel_repaired"}),
    ("<|channel|>––commentary<|message|>Hi<|end|>", None, [("commentary", None, None, "Hi")], {"channel_repaired"}),
    ("<|channel|>Final.<|message|>Hi<|return|>", None, [("final", None, None, "Hi")], {"channel_repaired"}),
    ("<|channel|>analysisanalysis<|message|>Hi<|end|>", None, [("analysis", None, None, "Hi")], {"channel_repaired"}),
    ("<|channel|>final final<|message|>Hi<|return|>", None, [("final", None, None, "Hi")], {"channel_repaired"}),
    # recipients that name nothing are dropped, never kept as a call
    ("<|channel|>commentary to=functions.<|message|>{}<|call|>", ["f"], [("commentary", None, None, "{}")],
     {"bad_recipient"}),
    ("<|channel|>commentary to=<|message|>{}<|call|>", None, [("commentary", None, None, "{}")], {"bad_recipient"}),
    # a role glued to the channel after a doubled <|start|>
    ("<|start|>assistantfinal<|message|>Hello<|return|>", None, [("final", None, None, "Hello")],
     {"glued_channel", "doubled_start"}),
    # a control token's text never reaches a field or a body
    ("<|channel|>commentary to=functions.f<|constrain|><|message|>{}<|call|>", ["f"],
     [("commentary", "functions.f", None, "{}")], {"unknown_header_word"}),
    ("<|end|><|start|><|constrain|>final<|end|>", None, [], {"stray_stop_token", "unknown_header_word"}),
    # stripped special tokens
    ("analysisthinking hardassistantfinalThe answer", None,
     [("analysis", None, None, "thinking hard"), ("final", None, None, "The answer")], {"stripped_markup"}),
    ('analysisNeed weather.assistantcommentary to=functions.get_weather json{"city": "Paris"}', None,
     [("analysis", None, None, "Need weather."),
      ("commentary", "functions.get_weather", "json", '{"city": "Paris"}')], {"stripped_markup"}),
]


@pytest.mark.parametrize(("text", "tools", "expected", "kinds"), CLASSES)
def test_failure_classes(enc: hk.HarmonyEncoding, text: str, tools: list[str] | None,
                         expected: list[tuple[Any, ...]], kinds: set[str]) -> None:
    result = parse(enc, text, tools)
    assert shape(result) == expected
    assert kinds <= {r.kind for r in result.repairs}
    assert_accounted(result, len(enc.encode(text, allowed_special="all")))


@pytest.mark.parametrize(
    ("text", "stop", "complete"),
    [
        ("<|channel|>final<|message|>Hi<|return|>", "return", True),
        ("<|channel|>final<|message|>Hi", None, False),
        ("<|channel|>fin", None, False),
        ("<|channel|>commentary to=functions.f<|message|>{}<|call|>", "call", True),
        ("<|channel|>final<|message|>Hi<|end|>", "end", True),
        ("", None, True),
    ],
)
def test_stop_and_complete(enc: hk.HarmonyEncoding, text: str, stop: str | None, complete: bool) -> None:
    result = parse(enc, text)
    assert (result.stop, result.complete) == (stop, complete)


def _streamed(enc: hk.HarmonyEncoding, tokens: list[int]) -> Any:
    p = hk.StreamableParser(enc, hk.Role.ASSISTANT, strict=False)
    for t in tokens:
        p.process(t)
    return p.process_eos().result()


# 🦜 is three tokens (b"\xf0\x9f", b"\xa6", b"\x9c"): a cut can fall inside the character.
_SPLIT_CHAR = "🦜"


def test_truncation_anywhere(enc: hk.HarmonyEncoding) -> None:
    """An output cut after any token: every token accounted for, each message recovered is the
    start of the message the whole output gives (a character cut in two ends it in U+FFFD, with
    an invalid_utf8 repair), and only a cut between messages is complete."""
    assert len(enc.encode(_SPLIT_CHAR)) == 3
    text = (f"<|channel|>analysis<|message|>Think {_SPLIT_CHAR}.<|end|><|start|>assistant<|channel|>final"
            f"<|message|>Héllo {_SPLIT_CHAR}")
    tokens = enc.encode(text, allowed_special="all")
    full = enc.parse_completion(tokens)
    assert [(m.channel, m.content[0].text) for m in full.messages] == [  # type: ignore[union-attr]
        ("analysis", f"Think {_SPLIT_CHAR}."), ("final", f"Héllo {_SPLIT_CHAR}")]
    between = {0, tokens.index(200007) + 1}
    for n in range(len(tokens) + 1):
        result = enc.parse_completion(tokens[:n])
        assert_accounted(result, n)
        assert result.complete == (n in between), n
        assert len(result.messages) <= len(full.messages)
        for got, whole in zip(result.messages, full.messages, strict=False):
            assert got.channel == whole.channel
            shown, kept = got.content[0].text, whole.content[0].text  # type: ignore[union-attr]
            if shown.endswith("\ufffd"):
                assert kept.startswith(shown[:-1]) and not kept.startswith(shown), (n, shown)
                assert "invalid_utf8" in {r.kind for r in result.repairs}, n
            else:
                assert kept.startswith(shown), (n, shown)
    head = enc.encode("<|channel|>final<|message|>", allowed_special="all")
    # A character cut short inside a body: U+FFFD where it was, a repair naming its token, and
    # the text after it kept (batch and stream alike).
    bad = head + enc.encode(_SPLIT_CHAR)[:1] + enc.encode("ok") + [200002]
    for result in (enc.parse_completion(bad), _streamed(enc, bad)):
        assert result.messages[0].content[0].text == "\ufffdok"  # type: ignore[union-attr]
        assert [(r.kind, r.start, r.end) for r in result.repairs] == [("invalid_utf8", len(head), len(head) + 1)]
    # A body that ends inside a character: one U+FFFD for the bytes that came, with a repair.
    result = enc.parse_completion(head + enc.encode(_SPLIT_CHAR)[:1])
    assert result.messages[0].content[0].text == "\ufffd"  # type: ignore[union-attr]
    assert [r.kind for r in result.repairs] == ["invalid_utf8"]


@pytest.mark.parametrize("ids", [[-1], [2**40], [201089, 5], [200008, 9999999, 200007]])
def test_any_ints_never_raise(enc: hk.HarmonyEncoding, ids: list[int]) -> None:
    for role in (hk.Role.ASSISTANT, None):
        result = enc.parse_completion(ids, role)
        assert_accounted(result, len(ids))


@pytest.mark.parametrize("case", WILD, ids=[c["id"] for c in WILD])
def test_wild_outputs_parse_cleanly(enc: hk.HarmonyEncoding, case: dict[str, Any]) -> None:
    tools = [t["function"]["name"] for t in case.get("request", {}).get("tools", [])] or None
    tokens = enc.encode(case["text"], allowed_special="all")
    result = enc.parse_completion(tokens, tools=tools)
    assert_accounted(result, len(tokens))
    for m in result.messages:
        text = m.content[0].text  # type: ignore[union-attr]
        assert "<|" not in text
        for field in (m.author.name, m.recipient, m.channel):
            assert not field or "<|" not in field
    # Every word of the output is somewhere a caller can see it.
    expect = case["expect"]
    if "any_text_contains" in expect:
        assert any(expect["any_text_contains"] in m.content[0].text for m in result.messages)  # type: ignore[union-attr]
    for recipient in expect.get("recipients_include", []):
        assert recipient in [m.recipient for m in result.messages]
    if expect.get("reasoning"):
        assert expect["reasoning"] in [m.content[0].text for m in result.messages if m.channel == "analysis"]  # type: ignore[union-attr]
    for call in expect.get("tool_calls", []):
        names = [m.recipient for m in result.messages]
        assert call["name"] in names or f"functions.{call['name']}" in names


WILD_MESSAGES = {
    "wild-012": [("analysis", None, None, "The user greets. Respond."), ("final", None, None, "Hi there!")],
    "wild-018": [("analysis", None, None, "need most recent U.S. CPI release and its MoM value. As of Jan "
                  "2026, the most recent CPI release would be for December 2025. According to BLS: CPI "
                  "increased 0.3 percent on a seasonally adjusted basis in December. Provide citations. Need "
                  "to open the page to capture snippet. Let's open"),
                 ("analysis", "browser.open", "code", '{"id": 0}')],
    "wild-019": [("commentary", None, None, "edit file with content."),
                 ("commentary", "functions.write", "<|constrain|>json", '{"path":"notes.txt","content":"hello"}')],
    "wild-022": [("analysis", None, None, "Think."), ("final", None, None, "Answer")],
    "wild-027": [("commentary", "functions.shell", "json", '{"command":["ls","-la"]}')],
}


@pytest.mark.parametrize("case_id", sorted(WILD_MESSAGES))
def test_wild_messages(enc: hk.HarmonyEncoding, case_id: str) -> None:
    case = next(c for c in WILD if c["id"] == case_id)
    tools = [t["function"]["name"] for t in case.get("request", {}).get("tools", [])] or None
    assert shape(parse(enc, case["text"], tools)) == WILD_MESSAGES[case_id]


def test_every_repair_kind_is_documented() -> None:
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[1] / "docs" / "parsing.md").read_text(encoding="utf-8")
    documented = set(re.findall(r"^\| `([a-z_0-9]+)` \|", doc, re.M))
    assert documented == set(hk.REPAIR_KINDS)


def test_recovery_rules_are_registered_data() -> None:
    """The header rules run from one list, each named once with the repair kinds it may
    report (the reading asserts it reports no other); a rule with an undocumented kind is
    refused when it registers."""
    from harmonykit.parse import rules

    names = [r.name for r in rules.RULES]
    assert len(names) == len(set(names)) and names[0] == "role" and names[-1] == "stray_markers"
    assert all(set(r.kinds) <= set(hk.REPAIR_KINDS) for r in rules.RULES)
    with pytest.raises(ValueError, match="undocumented repair kinds"):
        rules.rule("made_up_kind")
    assert len(rules.RULES) == len(names)
    header_kinds = {k for r in rules.RULES for k in r.kinds}
    assert {"unknown_role", "recipient_with_spaces", "self_recipient", "content_type_glued"} <= header_kinds


def _text_from_span(enc: hk.HarmonyEncoding, tokens: list[int], result: hk.ParseResult) -> None:
    """Every character of a message's text comes from a token inside its span (whitespace
    and U+FFFD aside: repairs join words and replace bad bytes)."""
    for m, (a, b) in zip(result.messages, result.spans, strict=True):
        source = iter(c for c in enc.decode([t for t in tokens[a:b] if 0 <= t < 199998]) if not c.isspace())
        text = m.content[0].text  # type: ignore[union-attr]
        assert all(c in source for c in text if not c.isspace() and c != "\ufffd"), (text, (a, b))


def _no_control_text(result: hk.ParseResult) -> None:
    for m in result.messages:
        for value in (m.author.name, m.recipient, m.channel, m.content_type, m.content[0].text):  # type: ignore[union-attr]
            rest = (value or "").removeprefix("<|constrain|>")
            assert not re.search(r"<\|[a-z_0-9]+\|>", rest), value


@pytest.mark.parametrize("case", WILD, ids=[c["id"] for c in WILD])
def test_wild_text_comes_from_its_span(enc: hk.HarmonyEncoding, case: dict[str, Any]) -> None:
    tokens = enc.encode(case["text"], allowed_special="all")
    result = enc.parse_completion(tokens)
    _text_from_span(enc, tokens, result)
    _no_control_text(result)


@pytest.mark.parametrize("text", [
    "<|channel|>analysis I'll check the weather now.\nto=functions.get_weather<|message|>{}<|call|>",
    "<|channel|>analysis need to check the docs.\n to=browser.open code<|message|>{}<|call|>",
    "analysisUser says hi. Probably greeting.assistantfinalHello!",
])
def test_prose_split_inside_a_token(enc: hk.HarmonyEncoding, text: str) -> None:
    tokens = enc.encode(text, allowed_special="all")
    result = enc.parse_completion(tokens)
    assert len(result.messages) == 2
    _text_from_span(enc, tokens, result)


@examples(300, suppress_health_check=[HealthCheck.too_slow])
@given(mutated(_ENC), st.sampled_from([None, ["get_weather"]]))
def test_mutations_text_from_span_and_no_markup(case: tuple[list[int], hk.Role | None],
                                               tools: list[str] | None) -> None:
    tokens, role = case
    result = _ENC.parse_completion(tokens, role, tools=tools)
    _text_from_span(_ENC, tokens, result)
    _no_control_text(result)
    assert [(r.start, r.end) for r in result.repairs] == sorted((r.start, r.end) for r in result.repairs)


def _cold(result: Any) -> Any:
    return [m.to_dict() for m in result.messages], result.spans, result.skipped, \
        [(r.kind, r.start, r.end, r.detail) for r in result.repairs], result.stop, result.complete


@examples(200, suppress_health_check=[HealthCheck.too_slow])
@given(mutated(_ENC), st.sampled_from([None, ["get_weather"]]))
def test_the_header_cache_changes_nothing(case: tuple[list[int], hk.Role | None], tools: list[str] | None) -> None:
    """Headers read well are kept per encoding: a parse with them kept (after a strict parse of
    the same tokens, then a tolerant one) equals a parse with none kept."""
    tokens, role = case
    cache = _ENC._header_cache
    saved = dict(cache)
    try:
        cache.clear()
        cold = _cold(_ENC.parse_completion(tokens, role, tools=tools))
        try:
            _ENC.parse_messages_from_completion_tokens(tokens, role)  # fills the strict entries
        except hk.HarmonyError:
            pass
        _ENC.parse_completion(tokens, role, tools=tools)
        assert _cold(_ENC.parse_completion(tokens, role, tools=tools)) == cold
    finally:
        cache.clear()
        cache.update(saved)


def test_a_header_strict_accepts_is_still_repaired_when_tolerant() -> None:
    tokens = _ENC.encode("<|channel|>final?<|message|>Hi<|end|>", allowed_special="all")
    assert _ENC.parse_messages_from_completion_tokens(tokens, hk.Role.ASSISTANT)[0].channel == "final?"
    for _ in range(2):  # the strict reading is kept for strict parses only
        result = _ENC.parse_completion(tokens)
        assert result.messages[0].channel == "final" and [r.kind for r in result.repairs] == ["channel_repaired"]


@pytest.mark.parametrize("text", [
    "<|channel|>final <|constrain|><|constrain|>final<|message|>x<|return|>",
    "<|constrain|><|constrain|>final<|message|>x<|return|>",
    "<|constrain|>final<|message|>x<|return|>",
    "<|channel|>analysis <|constrain|> commentary<|message|>x<|end|>",
])
def test_a_channel_name_after_constrain_is_no_content_type(enc: hk.HarmonyEncoding, text: str) -> None:
    """No control-token text in any field: ``<|constrain|>final`` is a channel name after junk."""
    result = enc.parse_completion(enc.encode(text, allowed_special="all"))
    assert [m.content_type for m in result.messages] == [None]
    assert result.messages[0].channel in ("final", "analysis")


@pytest.mark.parametrize(("text", "expected"), [
    # read at the end of the stream (the header never reached <|message|>)
    ('analysisLet me think. assistantcommentary to=functions.get_weather json{"city": "Paris"}',
     [("analysis", None, "Let me think.", (0, 6)),
      ("commentary", "functions.get_weather", '{"city": "Paris"}', (6, 20))]),
    # read once the header passes HEADER_LIMIT: the answer streams, the reasoning is emitted before it
    ("analysisLet me think. assistantfinal" + " word" * 80,
     [("analysis", None, "Let me think.", (0, 6)), ("final", None, "word" + " word" * 79, (6, 87))]),
    # a token that straddles the markup (".ass") stays with the message its first bytes belong to
    ("analysisThinking it over.assistantfinalThe answer is 4.",
     [("analysis", None, "Thinking it over.", (0, 5)), ("final", None, "The answer is 4.", (5, 13))]),
], ids=["at-the-end", "past-the-bound", "straddling-token"])
def test_stripped_markup_splits_at_the_right_token(enc: hk.HarmonyEncoding, text: str,
                                                   expected: list[tuple[Any, ...]]) -> None:
    """Markup with its special tokens stripped ("analysis...assistantfinal..."): each message's span
    ends at the token after its body, the role word that follows included; batch and stream agree."""
    tokens = enc.encode(text)
    result = enc.parse_completion(tokens, hk.Role.ASSISTANT)
    got = [(m.channel, m.recipient, m.content[0].text, span)  # type: ignore[union-attr]
           for m, span in zip(result.messages, result.spans, strict=True)]
    assert got == expected
    assert result.skipped == [] and [r.kind for r in result.repairs] == ["stripped_markup"]
    p = hk.StreamableParser(enc, hk.Role.ASSISTANT, strict=False)
    for t in tokens:
        p.process(t)
    p.process_eos()
    assert p.result() == result
