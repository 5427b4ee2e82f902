"""harmonykit: render and parse OpenAI's Harmony format, a drop-in for ``openai_harmony``.

>>> import harmonykit as openai_harmony
>>> enc = openai_harmony.load_harmony_encoding(openai_harmony.HarmonyEncodingName.HARMONY_GPT_OSS)
>>> convo = openai_harmony.Conversation.from_messages(
...     [openai_harmony.Message.from_role_and_content(openai_harmony.Role.USER, "Hi")])
>>> enc.decode_utf8(enc.render_conversation_for_completion(convo, openai_harmony.Role.ASSISTANT))
'<|start|>user<|message|>Hi<|end|><|start|>assistant'
"""

from .encoding import HarmonyEncoding, load_harmony_encoding
from .errors import HarmonyError, VocabularyError
from .model import (
    Author,
    ChannelConfig,
    Content,
    Conversation,
    DeveloperContent,
    HarmonyEncodingName,
    Message,
    ReasoningEffort,
    RenderConversationConfig,
    RenderOptions,
    Role,
    StreamState,
    SystemContent,
    TextContent,
    ToolDescription,
    ToolNamespaceConfig,
)
from .parse.result import REPAIR_KINDS, ParseResult, Repair
from .parse.stream import StreamableParser

__version__ = "0.1.0"

__all__ = [
    "REPAIR_KINDS",
    "Author",
    "ChannelConfig",
    "Content",
    "Conversation",
    "DeveloperContent",
    "HarmonyEncoding",
    "HarmonyEncodingName",
    "HarmonyError",
    "Message",
    "ParseResult",
    "ReasoningEffort",
    "RenderConversationConfig",
    "RenderOptions",
    "Repair",
    "Role",
    "StreamState",
    "StreamableParser",
    "SystemContent",
    "TextContent",
    "ToolDescription",
    "ToolNamespaceConfig",
    "VocabularyError",
    "load_harmony_encoding",
]
