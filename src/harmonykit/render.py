"""Messages -> tokens, token for token what the reference renders.

Each piece of text is BPE-encoded on its own (role, ``:name``, `` to=...``,
channel, content type, each content part), exactly as the reference does:
encoding the joined text would merge tokens across the seams. Text never
becomes a special token: it is encoded with ``encode_ordinary``.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import tiktoken

from .cache import ENTRY_BYTES, LRU, TOKEN_BYTES
from .errors import HarmonyError
from .model import (
    Content,
    DeveloperContent,
    Message,
    RenderConversationConfig,
    Role,
    SystemContent,
    TextContent,
)
from .tokens import CALL, CHANNEL, CONSTRAIN, CONSTRAIN_MARKER, END, MESSAGE, RETURN, START
from .typescript import tools_section
from .vocab import ordinary_encoder

_EFFORT = {"Low": "low", "Medium": "medium", "High": "high"}
_ROLE_DEBUG = {r: r.value.capitalize() for r in Role}
_FUNCTIONS_ROUTING = "Calls to these tools must go to the commentary channel: 'functions'."
_PIECE_CACHE_LIMIT = 4096
# Where a system or developer message's text is cut, each part encoded on its own (and kept):
# at the start of each tool of a ``namespace`` block, so that a new tool set costs only its new
# tools. Each cut provably gives the tokens of the whole (o200k's pre-tokenizer splits the
# text into chunks that BPE never merges across, and no part of its pattern looks behind):
# - after ``//`` and before a space and a letter: the chunk holding the ``/`` is punctuation
#   (``[\r\n/]*`` may follow it, a space may not), and a chunk may begin with one space;
# - after a newline and before a letter: a chunk holding a newline is white space or ends
#   with it, and a chunk's optional first character is never a newline.
# tests/test_render_cache.py checks the cuts against whole encodes.
_SEAM = re.compile(r"\n\n(?://(?= [A-Za-z])|(?=type |namespace ))")  # cut at its end
#: Bytes of system and developer message parts kept encoded (``_SEAM``).
SECTION_CACHE_BYTES = 8 << 20


class Renderer:
    """Renders model objects with one BPE; caches the short header pieces it encodes."""

    def __init__(self, bpe: tiktoken.Encoding) -> None:
        self._encode = ordinary_encoder(bpe)
        self._parts: LRU[str, tuple[int, ...]] = LRU(SECTION_CACHE_BYTES, second_sight=True)
        self._pieces: dict[str, list[int]] = {}
        self._headers: dict[tuple[Role, str | None, str | None, str | None, str | None], list[int]] = {}

    def _piece(self, text: str) -> list[int]:
        # Header pieces (roles, channels, recipients) repeat across messages.
        toks = self._pieces.get(text)
        if toks is None:
            toks = self._encode(text)
            if len(self._pieces) < _PIECE_CACHE_LIMIT:
                self._pieces[text] = toks
        return toks

    def _encode_sections(self, text: str, out: list[int]) -> None:
        """Append ``text``'s tokens, part by part (``_SEAM``); parts met before are not
        encoded again."""
        parts = self._parts
        start = 0
        for seam in [*_SEAM.finditer(text), None]:
            end = seam.end() if seam is not None else len(text)
            part = text[start:end]
            start = end
            toks = parts.get(part)
            if toks is None:
                toks = tuple(self._encode(part))
                parts.put(part, toks, ENTRY_BYTES + 2 * len(part) + TOKEN_BYTES * len(toks))
            out += toks

    def render_message(
        self, message: Message, has_function_tools: bool, out: list[int]
    ) -> None:
        """Append one message's tokens to ``out``."""
        author = message.author
        recipient = message.recipient
        # A message's header (``<|start|>`` to ``<|message|>``) is one of few per dataset.
        key = (author.role, author.name, recipient, message.channel, message.content_type)
        header = self._headers.get(key)
        if header is None:
            header = self._header(*key)
            if len(self._headers) < _PIECE_CACHE_LIMIT:
                self._headers[key] = header
        out += header
        role = author.role
        for content in message.content:
            self._render_content(content, role, has_function_tools, out)
        out.append(CALL if role is Role.ASSISTANT and recipient is not None else END)

    def _header(self, role: Role, name: str | None, recipient: str | None, channel: str | None,
                content_type: str | None) -> list[int]:
        out = [START]
        if role is Role.TOOL:
            if name is None:
                raise HarmonyError("Tools should have a name!")
            out += self._piece(name)
        else:
            out += self._piece(role.value)
            if name is not None:
                out += self._piece(f":{name}")
        if recipient is not None and recipient != "all":
            out += self._piece(f" to={recipient}")
        if channel is not None:
            out.append(CHANNEL)
            out += self._piece(channel)
        if content_type is not None:
            if content_type.startswith(CONSTRAIN_MARKER):
                out += self._piece(" ")
                out.append(CONSTRAIN)
                rest = content_type[len(CONSTRAIN_MARKER) :]
                if rest:
                    out += self._piece(rest)
            else:
                out += self._piece(f" {content_type}")
        out.append(MESSAGE)
        return out

    def _render_content(
        self, content: Content, role: Role, has_function_tools: bool, out: list[int]
    ) -> None:
        if isinstance(content, TextContent):
            out += self._encode(content.text)
        elif isinstance(content, SystemContent):
            if role is not Role.SYSTEM:
                raise HarmonyError(
                    f"SystemContent may only appear in system messages, found in {_ROLE_DEBUG[role]}"
                )
            self._encode_sections(system_text(content, has_function_tools), out)
        elif isinstance(content, DeveloperContent):
            if role is not Role.DEVELOPER:
                raise HarmonyError(
                    "DeveloperContent may only appear in developer messages, "
                    f"found in {_ROLE_DEBUG[role]}"
                )
            self._encode_sections(developer_text(content), out)
        else:
            raise HarmonyError(f"cannot render content of type {type(content).__name__}")

    def render_conversation(
        self, messages: Sequence[Message], config: RenderConversationConfig | None, out: list[int]
    ) -> None:
        """Append a conversation, applying the chain-of-thought rule when ``config`` asks."""
        has_tools = conversation_has_function_tools(messages)
        drop_before = analysis_drop_boundary(messages, config)
        for i, message in enumerate(messages):
            if i < drop_before and message.channel == "analysis":
                continue
            self.render_message(message, has_tools, out)

    def render_for_completion(
        self,
        messages: Sequence[Message],
        next_turn_role: Role,
        config: RenderConversationConfig | None,
    ) -> list[int]:
        out: list[int] = []
        self.render_conversation(messages, config, out)
        out.append(START)
        out += self._piece(next_turn_role.value)
        return out

    def render_for_training(
        self, messages: Sequence[Message], config: RenderConversationConfig | None
    ) -> list[int]:
        out: list[int] = []
        self.render_conversation(messages, config, out)
        if messages and out:
            last = messages[-1]
            if last.author.role is Role.ASSISTANT and last.channel == "final":
                out[-1] = RETURN
        return out


def conversation_has_function_tools(messages: Sequence[Message]) -> bool:
    """True when a developer message declares at least one tool in ``functions``."""
    for message in messages:
        for content in message.content:
            if isinstance(content, DeveloperContent) and content.tools:
                ns = content.tools.get("functions")
                if ns is not None and ns.tools:
                    return True
    return False


def analysis_drop_boundary(
    messages: Sequence[Message], config: RenderConversationConfig | None
) -> int:
    """Index before which ``analysis`` messages are dropped (0: none).

    The chain-of-thought rule: when the last assistant message is on ``final``,
    analysis before the first ``final`` message goes; a turn still calling tools
    keeps its reasoning.
    """
    if config is not None and not config.auto_drop_analysis:
        return 0
    return drop_boundary([m.author.role for m in messages], [m.channel for m in messages])


def drop_boundary(roles: Sequence[Role], channels: Sequence[str | None]) -> int:
    """``analysis_drop_boundary`` of a conversation given as its messages' roles and channels."""
    last_is_final = False
    for role, channel in zip(reversed(roles), reversed(channels), strict=True):
        if role is Role.ASSISTANT:
            last_is_final = channel == "final"
            break
    if not last_is_final:
        return 0
    for i, channel in enumerate(channels):
        if channel == "final":
            return i
    return 0  # pragma: no cover - a final assistant message exists


def system_text(sys: SystemContent, has_function_tools: bool) -> str:
    """The text of a system message's content."""
    sections: list[str] = []
    top: list[str] = []
    if sys.model_identity is not None:
        top.append(sys.model_identity)
    if sys.knowledge_cutoff is not None:
        top.append(f"Knowledge cutoff: {sys.knowledge_cutoff}")
    if sys.conversation_start_date is not None:
        top.append(f"Current date: {sys.conversation_start_date}")
    if top:
        sections.append("\n".join(top))
    if sys.reasoning_effort is not None:
        sections.append(f"Reasoning: {_EFFORT[sys.reasoning_effort.value]}")
    if sys.tools:
        sections.append(tools_section(sys.tools))
    cc = sys.channel_config
    if cc is not None and cc.valid_channels:
        header = f"# Valid channels: {', '.join(cc.valid_channels)}."
        if cc.channel_required:
            header += " Channel must be included for every message."
        if has_function_tools:
            header += "\n" + _FUNCTIONS_ROUTING
        sections.append(header)
    return "\n\n".join(sections)


def developer_text(dev: DeveloperContent) -> str:
    """The text of a developer message's content."""
    sections: list[str] = []
    if dev.instructions is not None:
        sections.append("# Instructions")
        sections.append(dev.instructions)
    if dev.tools:
        sections.append(tools_section(dev.tools))
    return "\n\n".join(sections)
