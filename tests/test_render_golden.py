"""Golden renderings: every scenario of the reference's test data, token for token."""

from __future__ import annotations

import openai_harmony
import pytest

import harmonykit
from conftest import GOLDEN
from scenarios import SCENARIOS, render


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_golden_file(enc: harmonykit.HarmonyEncoding, name: str) -> None:
    expected_text = (GOLDEN / name).read_text(encoding="utf-8").rstrip()
    tokens = render(harmonykit, enc, SCENARIOS[name])
    assert enc.decode_utf8(tokens) == expected_text
    assert tokens == enc.encode(expected_text, allowed_special="all")


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_scenario_matches_reference(enc: harmonykit.HarmonyEncoding, ref: object, name: str) -> None:
    assert render(harmonykit, enc, SCENARIOS[name]) == render(openai_harmony, ref, SCENARIOS[name])


def test_every_rendering_golden_file_has_a_scenario() -> None:
    parse_fixtures = {
        "test_simple_reasoning_response.txt", "test_simple_tool_call.txt",
        "test_streamable_parser.txt", "test_tool_response_parsing.txt",
    }
    on_disk = {p.name for p in GOLDEN.glob("*.txt")} - parse_fixtures
    assert on_disk <= set(SCENARIOS), on_disk - set(SCENARIOS)


def test_render_matches_render_conversation(enc: harmonykit.HarmonyEncoding) -> None:
    msg = harmonykit.Message.from_role_and_content(harmonykit.Role.USER, "Hello")
    convo = harmonykit.Conversation.from_messages([msg])
    assert enc.render(msg) == enc.render_conversation(convo)
    completion = enc.render_conversation_for_completion(convo, harmonykit.Role.ASSISTANT)
    assert completion[: len(enc.render(msg))] == enc.render(msg)


def test_training_render_ends_final_answer_with_return(enc: harmonykit.HarmonyEncoding) -> None:
    M, R = harmonykit.Message, harmonykit.Role
    convo = harmonykit.Conversation.from_messages(
        [M.from_role_and_content(R.USER, "hi"), M.from_role_and_content(R.ASSISTANT, "hello").with_channel("final")])
    training = enc.render_conversation_for_training(convo)
    regular = enc.render_conversation(convo)
    assert training[:-1] == regular[:-1]
    assert (regular[-1], training[-1]) == (200007, 200002)
    user_only = harmonykit.Conversation.from_messages([M.from_role_and_content(R.USER, "hi")])
    assert enc.render_conversation_for_training(user_only) == enc.render_conversation(user_only)


def test_constrain_content_type_renders_as_special_token(enc: harmonykit.HarmonyEncoding) -> None:
    text = ('<|start|>assistant to=functions.get_weather<|channel|>commentary'
            ' <|constrain|>json<|message|>{"location": "Tokyo"}<|call|>')
    tokens = enc.encode(text, allowed_special="all")
    msg = (harmonykit.Message.from_role_and_content(harmonykit.Role.ASSISTANT, '{"location": "Tokyo"}')
           .with_channel("commentary").with_recipient("functions.get_weather")
           .with_content_type("<|constrain|>json"))
    assert enc.render_conversation(harmonykit.Conversation.from_messages([msg])) == tokens


@pytest.mark.parametrize(
    ("message", "error"),
    [
        (harmonykit.Message.from_author_and_content(harmonykit.Author(role=harmonykit.Role.TOOL), "x"),
         "Tools should have a name!"),
        (harmonykit.Message.from_role_and_content(harmonykit.Role.USER, harmonykit.SystemContent.new()),
         "SystemContent may only appear in system messages, found in User"),
        (harmonykit.Message.from_role_and_content(harmonykit.Role.USER, harmonykit.DeveloperContent.new()),
         "DeveloperContent may only appear in developer messages, found in User"),
    ],
)
def test_render_errors_match_reference(enc: harmonykit.HarmonyEncoding, message: harmonykit.Message,
                                       error: str) -> None:
    with pytest.raises(RuntimeError, match=error):
        enc.render(message)
    with pytest.raises(RuntimeError, match=error):
        openai_harmony.load_harmony_encoding("HarmonyGptOss").render(
            openai_harmony.Message.from_json(message.to_json())
            if hasattr(openai_harmony.Message, "from_json")
            else openai_harmony.Message.from_dict(message.to_dict()))
