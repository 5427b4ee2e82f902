"""A Chat Completions request as the reference's own objects, written out by hand.

The oracle for the request mapping: it follows the rules docs/openai.md states ("Requests"),
with ``openai_harmony``'s classes and none of harmonykit's code, so a test that renders its
conversation with the reference checks harmonykit's mapping against something other than
itself. It covers what the tests send: system and developer texts, user messages,
assistant reasoning, content and tool calls, tool results, function tools in either
shape, ``tool_choice``, ``reasoning_effort`` and ``response_format``.
"""

from __future__ import annotations

import json
import re
from typing import Any

import openai_harmony as oh

_EFFORTS = {"low": oh.ReasoningEffort.LOW, "medium": oh.ReasoningEffort.MEDIUM, "high": oh.ReasoningEffort.HIGH,
            "minimal": oh.ReasoningEffort.LOW}


def rendered_name(name: str) -> str:
    """A function's name as the prompt shows it: each character outside [A-Za-z0-9_-] is "_"."""
    return re.sub(r"[^A-Za-z0-9_-]", "_", name)


def _function(tool: dict[str, Any]) -> dict[str, Any]:
    fn: dict[str, Any] = tool["function"] if "function" in tool else tool
    return fn


def _format_section(fmt: dict[str, Any] | None) -> str | None:
    if not fmt or fmt.get("type") in (None, "text"):
        return None
    if fmt["type"] == "json_object":
        name, description, schema = "json_object", None, {"type": "object"}
    else:
        spec = fmt["json_schema"]
        name, description, schema = spec["name"], spec.get("description"), spec.get("schema", {"type": "object"})
    lines = ["# Response Formats", "", f"## {name}", ""]
    if description:
        lines.append(f"// {description}")
    lines.append(json.dumps(schema, separators=(",", ":"), ensure_ascii=False))
    return "\n".join(lines)


def _text(content: Any) -> str:
    if isinstance(content, list):
        return "".join(part["text"] for part in content)
    return str(content)


def reference_messages(request: dict[str, Any]) -> list[oh.Message]:
    """The messages of the conversation the request stands for (system and developer first)."""
    effort = request.get("reasoning_effort") or (request.get("chat_template_kwargs") or {}).get("reasoning_effort")
    system = oh.SystemContent.new().with_reasoning_effort(_EFFORTS[effort or "medium"])
    out = [oh.Message.from_role_and_content(oh.Role.SYSTEM, system)]
    instructions = [_text(m["content"]) for m in request["messages"] if m["role"] in ("system", "developer")]
    tools = [] if request.get("tool_choice") == "none" else [_function(t) for t in request.get("tools") or []]
    section = _format_section(request.get("response_format"))
    if instructions or tools or section:
        parts: list[Any] = []
        if instructions or tools:
            dev = oh.DeveloperContent.new()
            if instructions:
                dev = dev.with_instructions("\n\n".join(instructions))
            if tools:
                dev = dev.with_function_tools([
                    oh.ToolDescription.new(rendered_name(fn["name"]), fn.get("description") or "",
                                           fn.get("parameters")) for fn in tools])
            parts.append(dev)
        if section:
            parts.append(oh.TextContent(text=("\n\n" if instructions or tools else "") + section))
        out.append(oh.Message.from_role_and_contents(oh.Role.DEVELOPER, parts))
    called: dict[str, str] = {}
    for m in request["messages"]:
        if m["role"] == "user":
            out.append(oh.Message.from_role_and_content(oh.Role.USER, _text(m["content"])))
        elif m["role"] == "assistant":
            calls = m.get("tool_calls") or []
            reasoning = m.get("reasoning_content") or m.get("reasoning")
            if reasoning:
                out.append(oh.Message.from_role_and_content(oh.Role.ASSISTANT, reasoning).with_channel("analysis"))
            if m.get("content"):
                channel = "commentary" if calls else "final"
                out.append(oh.Message.from_role_and_content(oh.Role.ASSISTANT, _text(m["content"]))
                           .with_channel(channel))
            for call in calls:
                name = rendered_name(call["function"]["name"])
                called[call["id"]] = name
                out.append(oh.Message.from_role_and_content(oh.Role.ASSISTANT, call["function"]["arguments"])
                           .with_channel("commentary").with_recipient(f"functions.{name}")
                           .with_content_type("<|constrain|>json"))
        elif m["role"] == "tool":
            name = called[m["tool_call_id"]]
            out.append(oh.Message.from_author_and_content(oh.Author.new(oh.Role.TOOL, f"functions.{name}"),
                                                          _text(m["content"]))
                       .with_channel("commentary").with_recipient("assistant"))
    return out


def reference_prompt(ref: Any, request: dict[str, Any]) -> list[int]:
    """The tokens the reference renders for the request's next assistant turn."""
    convo = oh.Conversation.from_messages(reference_messages(request))
    tokens: list[int] = ref.render_conversation_for_completion(convo, oh.Role.ASSISTANT)
    return tokens
