"""The reference's parsing behaviours, case by case (strict and lenient)."""

from __future__ import annotations

from typing import Any

import pytest

import harmonykit as hk
from conftest import GOLDEN

M, R = hk.Message, hk.Role


def parse(enc: hk.HarmonyEncoding, text: str, role: hk.Role | None, strict: bool = True) -> list[hk.Message]:
    return enc.parse_messages_from_completion_tokens(enc.encode(text, allowed_special="all"), role,
                                                     strict=strict)


def stream(enc: hk.HarmonyEncoding, text: str, role: hk.Role | None, strict: bool = True) -> list[hk.Message]:
    p = hk.StreamableParser(enc, role, strict=strict)
    for t in enc.encode(text, allowed_special="all"):
        p.process(t)
    p.process_eos()
    return p.messages


CALL = M.from_role_and_content(R.ASSISTANT, '{"location": "Tokyo"}').with_channel("commentary") \
    .with_recipient("functions.get_weather").with_content_type("<|constrain|>json")
LATLON = M.from_role_and_content(R.ASSISTANT, '{"latitude":48.8566,"longitude":2.3522}') \
    .with_channel("commentary").with_recipient("functions.get_weather").with_content_type("<|constrain|>json")

WELL_FORMED = [
    ('<|start|>assistant to=functions.get_weather<|channel|>commentary <|constrain|>json'
     '<|message|>{"location": "Tokyo"}<|call|>', None, [CALL]),
    ('<|start|>assistant to=functions.get_weather<|channel|>commentary<|constrain|>json'
     '<|message|>{"location": "Tokyo"}<|call|>', None, [CALL]),
    ('<|start|>assistant<|channel|>commentary to=functions.get_weather<|constrain|>json'
     '<|message|>{"latitude":48.8566,"longitude":2.3522}<|call|>', None, [LATLON]),
    ("<|start|>browser.search to=assistant<|channel|>commentary<|message|>{}<|end|>", None,
     [M.from_author_and_content(hk.Author.new(R.TOOL, "browser.search"), "{}").with_channel("commentary")
      .with_recipient("assistant")]),
    ("<|start|>tool to=x<|message|>{}<|end|>", None,
     [M.from_author_and_content(hk.Author.new(R.TOOL, "tool"), "{}").with_recipient("x")]),
    ("<|channel|>final<|message|>x", R.ASSISTANT, [M.from_role_and_content(R.ASSISTANT, "x").with_channel("final")]),
]


@pytest.mark.parametrize(("text", "role", "expected"), WELL_FORMED)
@pytest.mark.parametrize("strict", [True, False])
def test_well_formed(enc: hk.HarmonyEncoding, text: str, role: hk.Role | None, expected: list[hk.Message],
                     strict: bool) -> None:
    assert parse(enc, text, role, strict) == expected
    assert stream(enc, text, role, strict) == expected


def test_strict_keeps_control_tokens_in_bodies_as_text(enc: hk.HarmonyEncoding) -> None:
    # As the reference does; tolerant mode reads <|start|> there as a new message.
    text = "<|channel|>final<|message|>a<|start|>b<|end|>"
    assert parse(enc, text, R.ASSISTANT) == [M.from_role_and_content(R.ASSISTANT, "a<|start|>b")
                                              .with_channel("final")]
    tolerant = enc.parse_completion(enc.encode(text, allowed_special="all"))
    assert [m.content[0].text for m in tolerant.messages] == ["a", "b"]
    assert "header_inside_body" in [r.kind for r in tolerant.repairs]


STRICT_ERRORS = [
    ("I must refuse<|end|><|start|>assistant<|channel|>final<|message|>x<|return|>", R.ASSISTANT,
     'unexpected tokens remaining in message header: Some("I")', 8),
    ("<|channel|>commentary to=Get Intersection Layout<|message|>{}<|call|>", R.ASSISTANT,
     'unexpected tokens remaining in message header: Some("to=Get")', 8),
    ("The task: count", R.ASSISTANT, "Unexpected EOS while waiting for message header to complete", 4),
    ("<|start|>foo<|message|>x<|end|>", None, "Unknown role: foo", 2),
    ("<|channel|><|message|>x<|end|>", R.ASSISTANT,
     "channel marker present but no channel value found in header", 1),
    ("x<|start|>", None, "Unexpected token 87 while expecting start token 200006", 0),
    ("<|start|><|message|>x<|end|>", None, "message header did not contain a role", 1),
    ("<|channel|>final<|message|>a<|end|><|return|>", R.ASSISTANT,
     "Unexpected token 200002 while expecting start token 200006", 5),
    # Garbage the reference returns silently (recipient "<|channel|>final"): strict raises.
    ("<|channel|>analysis<|channel|>final<|message|>x<|end|>", R.ASSISTANT,
     "control token <|channel|> inside the message header", 2),
    ("<|start|>assistant<|end|>x<|start|>assistant<|channel|>final<|message|>y<|end|>", None,
     "Unknown role: assistant<|end|>x<|start|>assistant", 8),
]


@pytest.mark.parametrize(("text", "role", "error", "index"), STRICT_ERRORS)
def test_strict_errors(enc: hk.HarmonyEncoding, text: str, role: hk.Role | None, error: str,
                       index: int) -> None:
    with pytest.raises(hk.HarmonyError) as info:
        parse(enc, text, role)
    assert str(info.value).startswith(error)
    assert info.value.token_index == index
    with pytest.raises(hk.HarmonyError, match="^" + error[:20].replace("(", r"\(")):
        stream(enc, text, role)


LENIENT = [
    ("I must refuse<|end|><|start|>assistant<|channel|>analysis<|message|>We must refuse<|end|>",
     [M.from_role_and_content(R.ASSISTANT, "I must refuse"),
      M.from_role_and_content(R.ASSISTANT, "We must refuse").with_channel("analysis")]),
    ("<|channel|>analysis I must refuse<|end|>",
     [M.from_role_and_content(R.ASSISTANT, "I must refuse").with_channel("analysis")]),
    ("... Let's use the tool.<|end|><|start|>assistant to=functions.get_weather<|channel|>commentary json"
     '<|message|>{"location": "Tokyo"}<|call|>',
     [M.from_role_and_content(R.ASSISTANT, "... Let's use the tool."),
      M.from_role_and_content(R.ASSISTANT, '{"location": "Tokyo"}').with_channel("commentary")
      .with_recipient("functions.get_weather").with_content_type("json")]),
]


@pytest.mark.parametrize(("text", "expected"), LENIENT)
def test_lenient_missing_message_token(enc: hk.HarmonyEncoding, text: str, expected: list[hk.Message]) -> None:
    assert parse(enc, text, R.ASSISTANT, strict=False) == expected
    assert stream(enc, text, R.ASSISTANT, strict=False) == expected


def test_golden_completions(enc: hk.HarmonyEncoding) -> None:
    reasoning = [int(x) for x in (GOLDEN / "test_simple_reasoning_response.txt").read_text().split()]
    assert parse_tokens(enc, reasoning) == [
        M.from_role_and_content(R.ASSISTANT, 'User asks: "What is 2 + 2?" Simple arithmetic. Provide answer.')
        .with_channel("analysis"),
        M.from_role_and_content(R.ASSISTANT, "2 + 2 = 4.").with_channel("final"),
    ]
    call = [int(x) for x in (GOLDEN / "test_simple_tool_call.txt").read_text().split()]
    assert parse_tokens(enc, call)[1] == (
        M.from_role_and_content(R.ASSISTANT, '{"location": "Tokyo"}').with_channel("analysis")
        .with_recipient("lookup_weather").with_content_type("code"))
    text = (GOLDEN / "test_streamable_parser.txt").read_text().rstrip()
    assert len(stream(enc, text, R.ASSISTANT)) == 3


def parse_tokens(enc: hk.HarmonyEncoding, tokens: list[int]) -> list[hk.Message]:
    return enc.parse_messages_from_completion_tokens(tokens, role=R.ASSISTANT)


def test_tool_response_round_trip(enc: hk.HarmonyEncoding) -> None:
    msg = M.from_author_and_content(hk.Author.new(R.TOOL, "browser.search"), '{"result": "https://openai.com/"}') \
        .with_channel("commentary").with_recipient("assistant")
    tokens = enc.render(msg)[:-1]
    assert enc.parse_messages_from_completion_tokens(tokens, None) == [msg]
    assert enc.decode_utf8(tokens) == (GOLDEN / "test_tool_response_parsing.txt").read_text().rstrip()


PREFIX = "<|start|>assistant<|message|>"


@pytest.mark.parametrize(
    ("middle", "suffix", "expected"),
    [
        ([9552, 9552], "worked<|end|>", " \ufffd \ufffdworked"),
        ([9552, "XY"], "<|end|>", " \ufffdXY"),
        ([9552, " interesting"], "<|end|>", " \ufffd interesting"),
    ],
)
def test_invalid_utf8_in_body(enc: hk.HarmonyEncoding, middle: list[int | str], suffix: str,
                              expected: str) -> None:
    ids = [t for m in middle for t in ([m] if isinstance(m, int) else enc.encode(m))]
    tokens = enc.encode(PREFIX, allowed_special="all") + ids + enc.encode(suffix, allowed_special="all")
    for strict in (True, False):
        p = hk.StreamableParser(enc, None, strict=strict)
        for t in tokens:
            p.process(t)
        assert p.messages == [M.from_role_and_content(R.ASSISTANT, expected)]
        assert enc.parse_messages_from_completion_tokens(tokens, None, strict=strict) == p.messages


def _with_deltas(enc: hk.HarmonyEncoding, tokens: list[int]) -> tuple[hk.StreamableParser, list[str]]:
    p = hk.StreamableParser(enc, None)
    deltas = []
    for t in tokens:
        p.process(t)
        if p.last_content_delta is not None:
            deltas.append(p.last_content_delta)
    return p, deltas


def test_deltas_add_up_without_eos(enc: hk.HarmonyEncoding) -> None:
    tokens = enc.encode(PREFIX, allowed_special="all") + [9552] + enc.encode(" interesting story")
    p, deltas = _with_deltas(enc, tokens)
    assert p.current_content == "".join(deltas) == " \ufffd interesting story"
    p.process(enc.encode("Y")[0])
    assert p.last_content_delta == "Y"
    assert p.current_content == " \ufffd interesting storyY"


def test_tricky_utf8_streams_whole(enc: hk.HarmonyEncoding) -> None:
    text = ("Hello Müller, Γειά σου, Привет, שלום, مرحبا, नमस्ते, こんにちは, 안녕하세요, 你好. "
            "naïve vs naïve. Some emojis: 😊👋🏾👨‍👩‍👧‍👦🇺🇸.")
    tokens = enc.encode(PREFIX, allowed_special="all") + enc.encode(text) + [200007]
    p, deltas = _with_deltas(enc, tokens)
    assert p.messages == [M.from_role_and_content(R.ASSISTANT, text)]
    assert "".join(deltas) == text


def test_stream_properties_follow_reference(enc: hk.HarmonyEncoding, ref: object) -> None:
    import openai_harmony

    text = "<|channel|>commentary to=functions.f <|constrain|>json<|message|>{\"a\": \"é\"}<|call|><|start|>"
    tokens = enc.encode(text, allowed_special="all")
    ours = hk.StreamableParser(enc, R.ASSISTANT)
    theirs = openai_harmony.StreamableParser(ref, openai_harmony.Role.ASSISTANT)  # type: ignore[arg-type]
    for t in tokens:
        ours.process(t)
        theirs.process(t)
        for attr in ("current_content", "current_channel", "current_recipient", "current_content_type",
                     "last_content_delta", "tokens", "state_data"):
            assert getattr(ours, attr) == getattr(theirs, attr), attr
        assert ours.state.value == theirs.state.value
        assert (ours.current_role and ours.current_role.value) == (theirs.current_role and theirs.current_role.value)
        assert [m.to_dict() for m in ours.messages] == [m.to_dict() for m in theirs.messages]


def test_constrained_output_without_recipient(enc: hk.HarmonyEncoding) -> None:
    # 0.0.8 returns recipient "<|constrain|>json" here; we read the content type, as later
    # reference versions do (docs/compatibility.md).
    text = '<|start|>assistant<|channel|>final <|constrain|>json<|message|>{"result":true}<|return|>'
    expected = [M.from_role_and_content(R.ASSISTANT, '{"result":true}').with_channel("final")
                .with_content_type("<|constrain|>json")]
    for strict in (True, False):
        assert stream(enc, text, None, strict) == expected
        assert parse(enc, text, None, strict) == expected


def _escapes_in_error(parse: Any, chars: list[str]) -> str:
    header = "assistant " + " ".join("x" + c for c in chars) + " r ct"
    text = "<|start|>" + header + "<|message|>x<|end|>"
    with pytest.raises(Exception) as info:
        parse(text)
    return str(info.value).splitlines()[0]


def test_rust_escaping_matches_reference(enc: hk.HarmonyEncoding, ref: Any) -> None:
    """Strict errors print leftover header words as Rust's {:?} does: grapheme-extending marks
    (U+09BE), format characters, unassigned code points, characters newer than this Python."""
    import random

    rng = random.Random(7)
    pool = [0x9BE, 0xB3E, 0x1D165, 0xCF3, 0x1FA75, 0x2B739, 0x11F00, 0x200D, 0xAD, 0x301, 0xE0001, 0x10FFFF]
    pool += [rng.randrange(0x80, 0x110000) for _ in range(1500)]
    chars = [chr(c) for c in pool if not 0xD800 <= c <= 0xDFFF and chr(c) not in "\x85\xa0\u1680\u2028\u2029"
             and not 0x2000 <= c <= 0x200A and chr(c) not in "\u202f\u205f\u3000"]

    def ours(text: str) -> None:
        enc.parse_messages_from_completion_tokens(enc.encode(text, allowed_special="all"), None)

    def theirs(text: str) -> None:
        ref.parse_messages_from_completion_tokens(ref.encode(text, allowed_special="all"), None)

    assert _escapes_in_error(ours, chars) == _escapes_in_error(theirs, chars)
