"""Messages -> tokens, token for token what the reference renders.

Each piece of text is BPE-encoded on its own (role, ``:name``, `` to=...``,
channel, content type, each content part), exactly as the reference does:
encoding the joined text would merge tokens across the seams. Text never
becomes a special token: it is encoded with ``encode_ordinary``.
"""

from __future__ import annotations

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
from .typescript import tools_section_parts
from .vocab import ordinary_encoder

_EFFORT = {"Low": "low", "Medium": "medium", "High": "high"}
_ROLE_DEBUG = {r: r.value.capitalize() for r in Role}
_FUNCTIONS_ROUTING = "Calls to these tools must go to the commentary channel: 'functions'."
_PIECE_CACHE_LIMIT = 4096
# System and developer messages are encoded in parts (``system_parts``, ``developer_parts``),
# each part kept, so that a new tool set costs only its new tools. Each cut provably gives the
# tokens of the whole: o200k's pre-tokenizer splits text into chunks that BPE never merges
# across, each matched from where the last one ended, and no part of its pattern looks behind;
# a cut where a chunk of the whole ends therefore gives both sides the same chunks. The cuts:
# - after a newline, before ``#``: only white space and punctuation chunks hold a newline; the
#   white space ones end at a run's last newline (``\s*[\r\n]+``), and a punctuation chunk
#   (`` ?[^\s\p{L}\p{N}]+[\r\n/]*``) goes on over newlines and ``/`` only;
# - after an ASCII letter or digit, before `` {`` or ``;``: letter and digit chunks take
#   neither a space nor punctuation after their letters or digits (only ``'s`` and its kin).
# tests/test_render_cache.py checks the cuts against whole encodes.
#: Bytes of system and developer message parts kept encoded.
SECTION_CACHE_BYTES = 8 << 20


def end_token(role: Role, recipient: str | None) -> int:
    """The token a rendered message ends with: ``<|call|>`` for an assistant's tool call."""
    return CALL if role is Role.ASSISTANT and recipient is not None else END


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

    def _encode_parts(self, parts: list[str], out: list[int]) -> None:
        """Append the tokens of the text ``parts`` make, part by part (cut where the tokens
        of the whole do not change); parts met before are not encoded again."""
        kept = self._parts
        for part in parts:
            toks = kept.get(part)
            if toks is None:
                toks = tuple(self._encode(part))
                kept.put(part, toks, ENTRY_BYTES + 2 * len(part) + TOKEN_BYTES * len(toks))
            out += toks

    def render_message(
        self, message: Message, has_function_tools: bool, out: list[int]
    ) -> None:
        """Append one message's tokens to ``out``."""
        author = message.author
        role, recipient = author.role, message.recipient
        out += self.header(role, author.name, recipient, message.channel, message.content_type)
        for content in message.content:
            self._render_content(content, role, has_function_tools, out)
        out.append(end_token(role, recipient))

    def render_text(self, role: Role, name: str | None, recipient: str | None, channel: str | None,
                    content_type: str | None, text: str, out: list[int]) -> None:
        """Append the tokens of a message of one text part, given as its fields: what
        ``render_message`` appends for it, without building the message."""
        header = self._headers.get((role, name, recipient, channel, content_type))
        out += header if header is not None else self.header(role, name, recipient, channel, content_type)
        out += self._encode(text)
        out.append(end_token(role, recipient))

    def render_developer(self, instructions: str | None, tools: list[str], text: str | None,
                         out: list[int]) -> None:
        """Append the tokens of a developer message given as its fields: a DeveloperContent of
        ``instructions`` and a ``# Tools`` section in parts (``typescript.section_parts``), when
        either is given, then a text part ``text``."""
        out += self.header(Role.DEVELOPER, None, None, None, None)
        if instructions is not None or tools:
            self._encode_parts(developer_parts(instructions, tools), out)
        if text is not None:
            out += self._encode(text)
        out.append(END)

    def header(self, role: Role, name: str | None, recipient: str | None, channel: str | None,
               content_type: str | None) -> list[int]:
        """A message's header, ``<|start|>`` to ``<|message|>`` (one of few per dataset: kept)."""
        key = (role, name, recipient, channel, content_type)
        header = self._headers.get(key)
        if header is None:
            header = self._header(*key)
            if len(self._headers) < _PIECE_CACHE_LIMIT:
                self._headers[key] = header
        return header

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
            self._encode_parts(system_parts(content, has_function_tools), out)
        elif isinstance(content, DeveloperContent):
            if role is not Role.DEVELOPER:
                raise HarmonyError(
                    "DeveloperContent may only appear in developer messages, "
                    f"found in {_ROLE_DEBUG[role]}"
                )
            tools = tools_section_parts(content.tools) if content.tools else []
            self._encode_parts(developer_parts(content.instructions, tools), out)
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


def drop_boundary(roles: Sequence[str], channels: Sequence[str | None]) -> int:
    """``analysis_drop_boundary`` of a conversation given as its messages' roles (``Role`` or
    its value) and channels."""
    last_is_final = False
    for role, channel in zip(reversed(roles), reversed(channels), strict=True):
        if role == "assistant":
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
    return "".join(system_parts(sys, has_function_tools))


def system_parts(sys: SystemContent, has_function_tools: bool) -> list[str]:
    """``system_text`` in the parts it is encoded by (see ``_joined``)."""
    sections: list[list[str]] = []
    top: list[str] = []
    if sys.model_identity is not None:
        top.append(sys.model_identity)
    if sys.knowledge_cutoff is not None:
        top.append(f"Knowledge cutoff: {sys.knowledge_cutoff}")
    if sys.conversation_start_date is not None:
        top.append(f"Current date: {sys.conversation_start_date}")
    if top:
        sections.append(["\n".join(top)])
    if sys.reasoning_effort is not None:
        sections.append([f"Reasoning: {_EFFORT[sys.reasoning_effort.value]}"])
    if sys.tools:
        sections.append(tools_section_parts(sys.tools))
    cc = sys.channel_config
    if cc is not None and cc.valid_channels:
        header = f"# Valid channels: {', '.join(cc.valid_channels)}."
        if cc.channel_required:
            header += " Channel must be included for every message."
        if has_function_tools:
            header += "\n" + _FUNCTIONS_ROUTING
        sections.append([header])
    return _joined(sections)


def developer_text(dev: DeveloperContent) -> str:
    """The text of a developer message's content."""
    return "".join(developer_parts(dev.instructions, tools_section_parts(dev.tools) if dev.tools else []))


def developer_parts(instructions: str | None, tools: list[str]) -> list[str]:
    """The text of a developer message's content in the parts it is encoded by (see
    ``_joined``): its instructions, then its ``# Tools`` section given in parts (or none)."""
    sections: list[list[str]] = []
    if instructions is not None:
        sections.append(["# Instructions\n\n" + instructions])
    if tools:
        sections.append(tools)
    return _joined(sections)


def _joined(sections: list[list[str]]) -> list[str]:
    """Sections, each in parts, joined by a blank line: cut after it where the next section
    starts with ``#`` (a safe cut), else one part."""
    parts: list[str] = []
    for section in sections:
        if not parts:
            parts += section
        elif section[0].startswith("#"):
            parts[-1] += "\n\n"
            parts += section
        else:
            parts[-1] += "\n\n" + section[0]
            parts += section[1:]
    return parts
