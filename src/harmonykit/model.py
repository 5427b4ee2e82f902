"""The conversation model: the same pydantic classes, fields and builders as openai_harmony.

JSON written by one library loads in the other (``to_dict``/``from_dict`` shapes
are the reference's).

>>> m = Message.from_role_and_content(Role.USER, "hi")
>>> m.to_dict()["content"]
[{'type': 'text', 'text': 'hi'}]
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from enum import Enum
from typing import Any

from pydantic import BaseModel, Field, SerializeAsAny


class Role(str, Enum):
    """The role of a message's author."""

    USER = "user"
    ASSISTANT = "assistant"
    SYSTEM = "system"
    DEVELOPER = "developer"
    TOOL = "tool"

    @classmethod
    def _missing_(cls, value: object) -> Role:
        raise ValueError(f"Unknown role: {value!r}")


class ReasoningEffort(str, Enum):
    LOW = "Low"
    MEDIUM = "Medium"
    HIGH = "High"


class StreamState(Enum):
    __hash__ = object.__hash__  # members are singletons; the parser looks its table up by state

    EXPECT_START = "ExpectStart"
    HEADER = "Header"
    CONTENT = "Content"


class HarmonyEncodingName(str, Enum):
    HARMONY_GPT_OSS = "HarmonyGptOss"

    def __str__(self) -> str:
        return str(self.value)


class Author(BaseModel):
    role: Role
    name: str | None = None

    @classmethod
    def new(cls, role: Role, name: str) -> Author:
        return cls(role=role, name=name)


class Content(BaseModel):
    """Base of the content variants (text, system, developer)."""

    def to_dict(self) -> dict[str, Any]:
        raise NotImplementedError


class TextContent(Content):
    text: str

    def to_dict(self) -> dict[str, Any]:
        return {"type": "text", "text": self.text}


class ToolDescription(BaseModel):
    name: str
    description: str
    parameters: dict[str, Any] | None = None

    @classmethod
    def new(
        cls, name: str, description: str, parameters: dict[str, Any] | None = None
    ) -> ToolDescription:
        return cls(name=name, description=description, parameters=parameters)


class ChannelConfig(BaseModel):
    valid_channels: list[str]
    channel_required: bool

    @classmethod
    def require_channels(cls, channels: list[str]) -> ChannelConfig:
        return cls(valid_channels=channels, channel_required=True)


class ToolNamespaceConfig(BaseModel):
    name: str
    description: str | None = None
    tools: list[ToolDescription]

    @staticmethod
    def browser() -> ToolNamespaceConfig:
        """The built-in browser tool, as gpt-oss was trained on it."""
        from .builtin_tools import BROWSER

        return ToolNamespaceConfig.model_validate(BROWSER)

    @staticmethod
    def python() -> ToolNamespaceConfig:
        """The built-in python tool, as gpt-oss was trained on it."""
        from .builtin_tools import PYTHON

        return ToolNamespaceConfig.model_validate(PYTHON)


def _default_channels() -> ChannelConfig:
    return ChannelConfig.require_channels(["analysis", "commentary", "final"])


class SystemContent(Content):
    model_identity: str | None = "You are ChatGPT, a large language model trained by OpenAI."
    reasoning_effort: ReasoningEffort | None = ReasoningEffort.MEDIUM
    conversation_start_date: str | None = None
    knowledge_cutoff: str | None = "2024-06"
    channel_config: ChannelConfig | None = Field(default_factory=_default_channels)
    tools: dict[str, ToolNamespaceConfig] | None = None

    @classmethod
    def new(cls) -> SystemContent:
        return cls()

    def with_model_identity(self, model_identity: str) -> SystemContent:
        self.model_identity = model_identity
        return self

    def with_reasoning_effort(self, reasoning_effort: ReasoningEffort) -> SystemContent:
        self.reasoning_effort = reasoning_effort
        return self

    def with_conversation_start_date(self, conversation_start_date: str) -> SystemContent:
        self.conversation_start_date = conversation_start_date
        return self

    def with_knowledge_cutoff(self, knowledge_cutoff: str) -> SystemContent:
        self.knowledge_cutoff = knowledge_cutoff
        return self

    def with_channel_config(self, channel_config: ChannelConfig) -> SystemContent:
        self.channel_config = channel_config
        return self

    def with_required_channels(self, channels: list[str]) -> SystemContent:
        self.channel_config = ChannelConfig.require_channels(channels)
        return self

    def with_tools(self, ns_config: ToolNamespaceConfig) -> SystemContent:
        if self.tools is None:
            self.tools = {}
        self.tools[ns_config.name] = ns_config
        return self

    def with_browser_tool(self) -> SystemContent:
        return self.with_tools(ToolNamespaceConfig.browser())

    def with_python_tool(self) -> SystemContent:
        return self.with_tools(ToolNamespaceConfig.python())

    def to_dict(self) -> dict[str, Any]:
        out = self.model_dump(exclude_none=True)
        out["type"] = "system_content"
        return out

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> SystemContent:
        return cls(**raw)


class DeveloperContent(Content):
    instructions: str | None = None
    tools: dict[str, ToolNamespaceConfig] | None = None

    @classmethod
    def new(cls) -> DeveloperContent:
        return cls()

    def with_instructions(self, instructions: str) -> DeveloperContent:
        self.instructions = instructions
        return self

    def with_tools(self, ns_config: ToolNamespaceConfig) -> DeveloperContent:
        if self.tools is None:
            self.tools = {}
        self.tools[ns_config.name] = ns_config
        return self

    def with_function_tools(self, tools: Sequence[ToolDescription]) -> DeveloperContent:
        return self.with_tools(
            ToolNamespaceConfig(name="functions", description=None, tools=list(tools))
        )

    def to_dict(self) -> dict[str, Any]:
        out = self.model_dump(exclude_none=True)
        out["type"] = "developer_content"
        return out

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> DeveloperContent:
        return cls(**raw)


def _content_from_dict(raw: dict[str, Any]) -> Content:
    kind = raw.get("type")
    if kind == "text":
        return TextContent(**raw)
    if kind == "system_content":
        return SystemContent(**raw)
    if kind == "developer_content":
        return DeveloperContent(**raw)
    raise ValueError(f"Unknown content variant: {raw}")


class Message(BaseModel):
    author: Author
    # SerializeAsAny: model_dump keeps each content's own fields (0.0.8 dumps {}).
    content: list[SerializeAsAny[Content]] = Field(default_factory=list)
    channel: str | None = None
    recipient: str | None = None
    content_type: str | None = None

    @classmethod
    def from_author_and_content(cls, author: Author, content: str | Content) -> Message:
        if isinstance(content, str):
            content = TextContent(text=content)
        return cls(author=author, content=[content])

    @classmethod
    def from_role_and_content(cls, role: Role, content: str | Content) -> Message:
        return cls.from_author_and_content(Author(role=role), content)

    @classmethod
    def from_role_and_contents(cls, role: Role, contents: Sequence[Content]) -> Message:
        return cls(author=Author(role=role), content=list(contents))

    def adding_content(self, content: str | Content) -> Message:
        if isinstance(content, str):
            content = TextContent(text=content)
        self.content.append(content)
        return self

    def with_channel(self, channel: str) -> Message:
        self.channel = channel
        return self

    def with_recipient(self, recipient: str) -> Message:
        self.recipient = recipient
        return self

    def with_content_type(self, content_type: str) -> Message:
        self.content_type = content_type
        return self

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "role": self.author.role,
            "name": self.author.name,
            "content": [c.to_dict() for c in self.content],
        }
        if self.channel is not None:
            out["channel"] = self.channel
        if self.recipient is not None:
            out["recipient"] = self.recipient
        if self.content_type is not None:
            out["content_type"] = self.content_type
        return out

    def to_json(self) -> str:
        return json.dumps(self.to_dict())

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Message:
        author = Author(role=Role(data["role"]), name=data.get("name"))
        raw_content = data["content"]
        # A lone text content may be written as a plain string.
        if isinstance(raw_content, str):
            raw_content = [{"type": "text", "text": raw_content}]
        msg = cls(author=author, content=[_content_from_dict(r) for r in raw_content])
        msg.channel = data.get("channel")
        msg.recipient = data.get("recipient")
        msg.content_type = data.get("content_type")
        return msg

    @classmethod
    def from_json(cls, payload: str) -> Message:
        return cls.from_dict(json.loads(payload))


class Conversation(BaseModel):
    messages: list[Message] = Field(default_factory=list)

    @classmethod
    def from_messages(cls, messages: Sequence[Message]) -> Conversation:
        return cls(messages=list(messages))

    def __iter__(self) -> Iterator[Message]:  # type: ignore[override]
        return iter(self.messages)

    def to_dict(self) -> dict[str, Any]:
        return {"messages": [m.to_dict() for m in self.messages]}

    def to_json(self) -> str:
        return json.dumps(self.to_dict())

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Conversation:
        return cls(messages=[Message.from_dict(m) for m in data["messages"]])

    @classmethod
    def from_json(cls, payload: str) -> Conversation:
        return cls.from_dict(json.loads(payload))


class RenderConversationConfig(BaseModel):
    auto_drop_analysis: bool = True


class RenderOptions(BaseModel):
    conversation_has_function_tools: bool = False


# -- trusted construction -------------------------------------------------------
# The parser and the request mapping build millions of text messages from values
# they have already checked; pydantic's validation is most of their cost there
# (4.4 µs a message against 1.8 µs). These fill in the instance as validation
# would; _check_trusted proves that on import and falls back to validation if a
# pydantic release lays instances out differently.

_new = object.__new__
_set = object.__setattr__
_TEXT_FIELDS = frozenset({"text"})
_MESSAGE_FIELDS = frozenset({"author", "content", "channel", "recipient", "content_type"})
_AUTHOR_FIELDS = frozenset({"role", "name"})


def _fill(obj: BaseModel, values: dict[str, Any], fields: frozenset[str]) -> None:
    _set(obj, "__dict__", values)
    _set(obj, "__pydantic_fields_set__", set(fields))
    _set(obj, "__pydantic_extra__", None)
    _set(obj, "__pydantic_private__", None)


def _trusted_author(role: Role, name: str | None) -> Author:
    author = _new(Author)
    _fill(author, {"role": role, "name": name}, _AUTHOR_FIELDS)
    return author


def _trusted_message(author: Author, text: str, channel: str | None, recipient: str | None,
                     content_type: str | None) -> Message:
    content = _new(TextContent)
    _fill(content, {"text": text}, _TEXT_FIELDS)
    message = _new(Message)
    _fill(message, {"author": author, "content": [content], "channel": channel, "recipient": recipient,
                    "content_type": content_type}, _MESSAGE_FIELDS)
    return message


def _validated_author(role: Role, name: str | None) -> Author:
    return Author(role=role, name=name)


def _validated_message(author: Author, text: str, channel: str | None, recipient: str | None,
                       content_type: str | None) -> Message:
    return Message(author=author, content=[TextContent(text=text)], channel=channel, recipient=recipient,
                   content_type=content_type)


def _check_trusted() -> bool:
    try:
        args = ("hi", "final", "functions.f", "<|constrain|>json")
        fast = _trusted_message(_trusted_author(Role.TOOL, "x"), *args)
        slow = _validated_message(_validated_author(Role.TOOL, "x"), *args)
        return (fast == slow and fast.model_dump() == slow.model_dump()
                and fast.model_fields_set == slow.model_fields_set and repr(fast) == repr(slow)
                and fast.model_copy(deep=True) == slow)
    except Exception:  # any change in pydantic's layout: use validation
        return False


text_author, text_message = ((_trusted_author, _trusted_message) if _check_trusted()
                             else (_validated_author, _validated_message))
"""``text_author(role, name)`` and ``text_message(author, text, channel, recipient,
content_type)``: an Author and a one-text Message from already-checked values."""


def message_text(message: Message) -> str:
    """A message's text: its text parts, joined (other parts have none)."""
    return "".join(getattr(c, "text", "") for c in message.content)
