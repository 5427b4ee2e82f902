"""harmonykit is a drop-in for openai_harmony 0.0.8: names, signatures, JSON shapes, errors."""

from __future__ import annotations

import inspect
import json

import openai_harmony as oh
import pytest
from hypothesis import given
from hypothesis import strategies as st

import harmonykit as hk
from budget import examples
from strategies import conversations, text

PUBLIC = sorted(set(oh.__all__) | {"ChannelConfig", "ToolNamespaceConfig", "RenderConversationConfig",
                                   "RenderOptions", "ReasoningEffort"})


@pytest.mark.parametrize("name", PUBLIC)
def test_every_public_name_exists(name: str) -> None:
    assert hasattr(hk, name)


def _params(obj: object) -> list[tuple[str, object, object]]:
    sig = inspect.signature(obj)  # type: ignore[arg-type]
    return [(p.name, p.kind, p.default) for p in sig.parameters.values()]


METHODS = [
    (cls, meth)
    for cls in ["HarmonyEncoding", "StreamableParser", "Message", "Conversation", "SystemContent",
                "DeveloperContent", "ToolDescription", "ChannelConfig", "ToolNamespaceConfig", "Author"]
    for meth in dir(getattr(oh, cls))
    if not meth.startswith("_") and callable(getattr(getattr(oh, cls), meth, None))
    and not meth.startswith("model_") and meth not in {"copy", "dict", "json", "parse_obj", "parse_raw",
                                                      "parse_file", "from_orm", "construct", "schema",
                                                      "schema_json", "validate", "update_forward_refs"}
]


@pytest.mark.parametrize(("cls", "meth"), METHODS)
def test_same_signatures(cls: str, meth: str) -> None:
    ours = getattr(getattr(hk, cls), meth)
    theirs = getattr(getattr(oh, cls), meth)
    assert [p[:2] for p in _params(ours)] == [p[:2] for p in _params(theirs)]
    assert [p[2] for p in _params(ours)] == [p[2] for p in _params(theirs)]


def test_streamable_parser_constructor() -> None:
    assert [p[:2] for p in _params(hk.StreamableParser)][:3] == [p[:2] for p in _params(oh.StreamableParser)]


def test_enum_values() -> None:
    for name in ("Role", "ReasoningEffort", "StreamState", "HarmonyEncodingName"):
        assert [(e.name, e.value) for e in getattr(hk, name)] == [(e.name, e.value) for e in getattr(oh, name)]
    with pytest.raises(ValueError, match="Unknown role: 'nobody'"):
        hk.Role("nobody")
    assert str(hk.HarmonyEncodingName.HARMONY_GPT_OSS) == "HarmonyGptOss"


@examples(100)
@given(conversations())
def test_json_written_by_one_loads_in_the_other(convo: hk.Conversation) -> None:
    # Both write the same JSON, and read any such JSON back into the same conversation.
    # (Both drop None fields on writing, so those come back as defaults, alike.)
    ours = convo.to_json()
    theirs = oh.Conversation.from_json(ours)
    assert hk.Conversation.from_json(ours).to_json() == theirs.to_json()
    assert json.loads(hk.Conversation.from_json(theirs.to_json()).to_json()) == json.loads(theirs.to_json())
    for m in convo.messages:
        assert hk.Message.from_dict(json.loads(m.to_json())).to_dict() == \
            oh.Message.from_dict(json.loads(m.to_json())).to_dict()


def test_builtin_tool_configs_match() -> None:
    assert hk.ToolNamespaceConfig.browser().model_dump() == oh.ToolNamespaceConfig.browser().model_dump()
    assert hk.ToolNamespaceConfig.python().model_dump() == oh.ToolNamespaceConfig.python().model_dump()
    assert hk.SystemContent.new().to_dict() == oh.SystemContent.new().to_dict()
    assert hk.DeveloperContent.new().with_instructions("x").to_dict() == \
        oh.DeveloperContent.new().with_instructions("x").to_dict()


def test_validation_errors_are_pydantic(enc: hk.HarmonyEncoding) -> None:
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="Input should be a valid dictionary or instance of Message"):
        enc.render_conversation_for_completion(
            hk.Conversation.from_messages([hk.SystemContent.new()]), hk.Role.ASSISTANT)  # type: ignore[list-item]


def _outcome(fn):  # type: ignore[no-untyped-def]
    try:
        return "ok", fn()
    except Exception as e:
        return type(e).__name__, str(e)


@examples(300)
@given(text, st.sampled_from([set(), "all", {"<|start|>"}, {"<|end|>", "<|message|>"}]),
       st.sampled_from(["all", (), {"<|start|>"}, {"<|reserved_200014|>"}]))
def test_encode_matches_reference(enc: hk.HarmonyEncoding, ref: oh.HarmonyEncoding, s: str, allowed: object,
                                  disallowed: object) -> None:
    ours = _outcome(lambda: enc.encode(s, allowed_special=allowed, disallowed_special=disallowed))  # type: ignore[arg-type]
    theirs = _outcome(lambda: ref.encode(s, allowed_special=allowed, disallowed_special=disallowed))  # type: ignore[arg-type]
    assert ours == theirs


@examples(300)
@given(st.lists(st.one_of(st.integers(0, 201088), st.sampled_from([9552, 132990, 201089, 99999999])),
                max_size=8))
def test_decode_matches_reference(enc: hk.HarmonyEncoding, ref: oh.HarmonyEncoding, ids: list[int]) -> None:
    assert _outcome(lambda: enc.decode_utf8(ids)) == _outcome(lambda: ref.decode_utf8(ids))
    assert _outcome(lambda: enc.decode(ids)) == _outcome(lambda: ref.decode(ids))
    assert enc.is_special_token(ids[0]) == ref.is_special_token(ids[0]) if ids and ids[0] < 2**32 else True


def test_decode_errors(enc: hk.HarmonyEncoding) -> None:
    with pytest.raises(hk.HarmonyError, match="Invalid token for decoding: 99999999"):
        enc.decode_utf8([99999999])
    with pytest.raises(hk.HarmonyError, match="Invalid utf-8"):
        enc.decode_utf8([132990, 9552])
    assert "Chicken" in enc.decode([132990, 9552])
    assert enc.decode_bytes([24912]) == b"hello"
    with pytest.raises(hk.HarmonyError, match="Encountered text corresponding to disallowed special token"):
        enc.encode("<|start|>")


def test_model_dump_keeps_content() -> None:
    message = hk.Message.from_role_and_content(hk.Role.ASSISTANT, "hello")
    assert json.loads(message.model_dump_json())["content"] == [{"text": "hello"}]


def test_trusted_construction_is_what_validation_builds() -> None:
    """The parser and the mapping build messages without validation; the result must be the
    validated one in every observable way (and this pydantic must allow the fast path)."""
    from harmonykit import model

    assert model._check_trusted(), "pydantic lays instances out differently: the fast path is off"
    for role, name, channel, recipient, ctype in [(hk.Role.ASSISTANT, None, "final", None, None),
                                                  (hk.Role.TOOL, "functions.f", "commentary", "assistant", None),
                                                  (hk.Role.ASSISTANT, None, "commentary", "functions.f", "json")]:
        fast = model.text_message(model.text_author(role, name), "hi", channel, recipient, ctype)
        slow = hk.Message(author=hk.Author(role=role, name=name), content=[hk.TextContent(text="hi")],
                          channel=channel, recipient=recipient, content_type=ctype)
        assert fast == slow and repr(fast) == repr(slow) and fast.to_dict() == slow.to_dict()
        assert fast.model_dump(exclude_unset=True) == slow.model_dump(exclude_unset=True)
        fast.author.name = "changed"  # each message owns its author and content
        fast.content.append(hk.TextContent(text="more"))
        assert slow.author.name == name and len(slow.content) == 1


@pytest.mark.parametrize("method", ["render_conversation", "render_conversation_for_completion",
                                    "render_conversation_for_training"])
def test_a_missing_conversation_is_a_type_error_naming_it(enc: hk.HarmonyEncoding, method: str) -> None:
    args: tuple[object, ...] = (None, hk.Role.ASSISTANT) if method.endswith("completion") else (None,)
    with pytest.raises(TypeError, match="conversation must be a Conversation"):
        getattr(enc, method)(*args)
