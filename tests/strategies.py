"""Hypothesis strategies: random conversations covering every rendering option."""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

import harmonykit as hk

# Text a user or a model might send, control-token look-alikes included.
_specials = st.sampled_from(
    ["<|start|>", "<|end|>", "<|message|>", "<|channel|>", "<|constrain|>", "<|return|>",
     "<|call|>", "<|endoftext|>", "<|reserved_200014|>", "to=", " ", "\n", "\r\n", "json"]
)
_chars = st.characters(blacklist_categories=("Cs",))
text = st.one_of(
    st.text(_chars, max_size=40),
    st.lists(st.one_of(_specials, st.text(_chars, max_size=8)), max_size=8).map("".join),
)
short = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), min_size=1,
                max_size=12)
names = st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,10}", fullmatch=True)

json_scalars = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=False, allow_infinity=False), st.text(_chars, max_size=10),
)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=3),
                            st.dictionaries(st.text(_chars, max_size=5), inner, max_size=3)),
    max_leaves=6,
)


def _annotate(schema: st.SearchStrategy[dict[str, Any]]) -> st.SearchStrategy[dict[str, Any]]:
    extras = st.fixed_dictionaries(
        {},
        optional={
            "description": text,
            "title": short,
            "default": json_values,
            "nullable": st.booleans(),
            "examples": st.lists(st.one_of(short, json_scalars), max_size=3),
        },
    )
    return st.tuples(schema, extras).map(lambda t: {**t[0], **t[1]})


_leaf = st.one_of(
    st.fixed_dictionaries({"type": st.sampled_from(["string", "number", "integer", "boolean", "null",
                                                    "weird"])}),
    st.fixed_dictionaries({"type": st.just("string"),
                           "enum": st.lists(st.one_of(short, st.integers(), st.floats(allow_nan=False)),
                                            max_size=4)}),
    st.fixed_dictionaries({"type": st.lists(st.sampled_from(["string", "integer", "null", "number"]),
                                            min_size=1, max_size=3)}),
    st.fixed_dictionaries({"enum": st.lists(st.one_of(short, st.integers()), min_size=1, max_size=3)}),
    st.just({}),
)


def _compound(inner: st.SearchStrategy[dict[str, Any]]) -> st.SearchStrategy[dict[str, Any]]:
    props = st.dictionaries(names, inner, max_size=4)
    return st.one_of(
        st.builds(lambda p, r: {"type": "object", "properties": p,
                                "required": [k for k in p if r(k)]},
                  props, st.functions(like=lambda k: True, returns=st.booleans(), pure=True)),
        st.fixed_dictionaries({"type": st.just("array"), "items": inner}),
        st.fixed_dictionaries({"type": st.just("array")}),
        st.fixed_dictionaries({"oneOf": st.lists(inner, max_size=3)}),
        st.fixed_dictionaries({"anyOf": st.lists(inner, max_size=3)}),
    )


schemas = st.recursive(_annotate(_leaf), lambda inner: _annotate(_compound(inner)), max_leaves=8)
object_schemas = st.builds(
    lambda props, desc: {"type": "object", "properties": props, **({"description": desc} if desc else {})},
    st.dictionaries(names, schemas, max_size=5), st.one_of(st.none(), text),
)

tools = st.builds(
    hk.ToolDescription.new, names, text,
    st.one_of(st.none(), object_schemas, schemas),
)


@st.composite
def namespaces(draw: st.DrawFn) -> hk.ToolNamespaceConfig:
    kind = draw(st.sampled_from(["browser", "python", "custom"]))
    if kind == "browser":
        return hk.ToolNamespaceConfig.browser()
    if kind == "python":
        return hk.ToolNamespaceConfig.python()
    return hk.ToolNamespaceConfig(name=draw(names), description=draw(st.one_of(st.none(), text)),
                                  tools=draw(st.lists(tools, max_size=3)))


@st.composite
def system_contents(draw: st.DrawFn) -> hk.SystemContent:
    sys = hk.SystemContent(
        model_identity=draw(st.one_of(st.none(), text)),
        reasoning_effort=draw(st.one_of(st.none(), st.sampled_from(list(hk.ReasoningEffort)))),
        conversation_start_date=draw(st.one_of(st.none(), short)),
        knowledge_cutoff=draw(st.one_of(st.none(), short)),
        channel_config=draw(st.one_of(
            st.none(),
            st.builds(hk.ChannelConfig, valid_channels=st.lists(short, max_size=3),
                      channel_required=st.booleans()))),
    )
    for ns in draw(st.lists(namespaces(), max_size=2)):
        sys = sys.with_tools(ns)
    return sys


@st.composite
def developer_contents(draw: st.DrawFn) -> hk.DeveloperContent:
    dev = hk.DeveloperContent(instructions=draw(st.one_of(st.none(), text)))
    if draw(st.booleans()):
        dev = dev.with_function_tools(draw(st.lists(tools, max_size=3)))
    for ns in draw(st.lists(namespaces(), max_size=1)):
        dev = dev.with_tools(ns)
    return dev


channels = st.one_of(st.none(), st.sampled_from(["analysis", "commentary", "final"]), short)
recipients = st.one_of(st.none(), st.just("all"), st.sampled_from(["functions.get_weather", "browser.search",
                                                                   "python", "assistant"]), short)
content_types = st.one_of(st.none(), st.sampled_from(["<|constrain|>json", "json", "code", "<|constrain|>"]),
                          short)


@st.composite
def chat_messages(draw: st.DrawFn) -> hk.Message:
    role = draw(st.sampled_from([hk.Role.USER, hk.Role.ASSISTANT, hk.Role.TOOL]))
    if role is hk.Role.TOOL:
        author = hk.Author(role=role, name=draw(st.sampled_from(["functions.get_weather", "browser.search",
                                                                 "python"])))
    else:
        author = hk.Author(role=role, name=draw(st.one_of(st.none(), names)))
    parts = [hk.TextContent(text=t) for t in draw(st.lists(text, min_size=1, max_size=3))]
    return hk.Message(author=author, content=parts, channel=draw(channels),
                      recipient=draw(recipients), content_type=draw(content_types))


@st.composite
def conversations(draw: st.DrawFn) -> hk.Conversation:
    msgs: list[hk.Message] = []
    if draw(st.booleans()):
        msgs.append(hk.Message.from_role_and_content(hk.Role.SYSTEM, draw(system_contents())))
    if draw(st.booleans()):
        msgs.append(hk.Message.from_role_and_content(hk.Role.DEVELOPER, draw(developer_contents())))
    msgs += draw(st.lists(chat_messages(), max_size=6))
    return hk.Conversation.from_messages(msgs)


@st.composite
def assistant_turns(draw: st.DrawFn) -> list[hk.Message]:
    """Messages a model could emit in one turn (well-formed)."""
    out = []
    for _ in range(draw(st.integers(min_value=1, max_value=4))):
        channel = draw(st.sampled_from(["analysis", "commentary", "final"]))
        body = draw(st.text(_chars, max_size=30).filter(lambda s: "<|" not in s))
        msg = hk.Message.from_role_and_content(hk.Role.ASSISTANT, body).with_channel(channel)
        if channel != "final" and draw(st.booleans()):
            msg = msg.with_recipient(draw(st.sampled_from(["functions.get_weather", "browser.search",
                                                           "python"])))
        if draw(st.booleans()):
            msg = msg.with_content_type(draw(st.sampled_from(["<|constrain|>json", "json", "code"])))
        out.append(msg)
    return out
