"""HarmonyEncoding: the reference's methods over the BPE, the renderer and the parser."""

from __future__ import annotations

import functools
import re
import threading
from collections.abc import Collection, Iterable, Sequence
from collections.abc import Set as AbstractSet
from typing import Any, Literal

import tiktoken

from .errors import HarmonyError
from .model import (
    Conversation,
    HarmonyEncodingName,
    Message,
    RenderConversationConfig,
    RenderOptions,
    Role,
)
from .parse.machine import HeaderCache, Machine, MachineIO, check_role, check_tools
from .parse.result import ParseResult
from .render import Renderer
from .tokens import (
    N_VOCAB,
    SPECIAL_TOKENS,
    STARTOFTEXT,
    STOP_TOKENS,
    STOP_TOKENS_FOR_ASSISTANT_ACTIONS,
    special_positions,
)
from .vocab import load_bpe, ordinary_encoder


def _disallowed_message(token: str) -> str:
    return (
        "Encountered text corresponding to disallowed special token "
        f"{token!r}.\n"
        "If you want this text to be encoded as a special token, "
        f"pass it to `allowed_special`, e.g. `allowed_special={{'{token}', ...}}`.\n"
        "If you want this text to be encoded as normal text, disable the check for this token "
        f"by passing `disallowed_special=(enc.special_tokens_set - {{'{token}'}})`.\n"
        "To disable this check for all special tokens, pass `disallowed_special=()`.\n"
    )


@functools.lru_cache(maxsize=64)
def _special_regex(tokens: frozenset[str]) -> re.Pattern[str]:
    return re.compile("|".join(re.escape(t) for t in sorted(tokens, key=len, reverse=True)))


_ALL_SPECIAL = frozenset(SPECIAL_TOKENS)
# Every special token has this shape; a match is one only when it is a name in the set.
_SPECIAL_SHAPE = re.compile(r"<\|[a-z_0-9]+\|>")


def _utf8_error(data: bytes) -> str:
    """Rust's Utf8Error text for the first bad sequence in ``data``."""
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as e:
        if e.reason == "unexpected end of data" and e.end == len(data):
            return f"incomplete utf-8 byte sequence from index {e.start}"
        return f"invalid utf-8 sequence of {e.end - e.start} bytes from index {e.start}"
    return "invalid utf-8"  # pragma: no cover - only called on bad data


class HarmonyEncoding:
    """The o200k_harmony encoding: BPE, Harmony renderer and parser.

    >>> enc = load_harmony_encoding(HarmonyEncodingName.HARMONY_GPT_OSS)
    >>> enc.decode_utf8(enc.encode("<|start|>user", allowed_special="all"))
    '<|start|>user'
    """

    def __init__(self, name: str, bpe: tiktoken.Encoding) -> None:
        self._name = name
        self._bpe = bpe
        self._ordinary = ordinary_encoder(bpe)
        self._renderer = Renderer(bpe)
        self._str_cache: dict[int, str] = {}
        self._header_cache: HeaderCache = {}
        self._decode_single = bpe.decode_single_token_bytes
        self._bytes_cache: dict[int, bytes] = {}

    @property
    def name(self) -> str:
        return self._name

    @property
    def bpe(self) -> tiktoken.Encoding:
        """The byte-pair vocabulary underneath (o200k_harmony, a ``tiktoken.Encoding``), for
        tools that build their own tokenizer from it, as guided decoding's llguidance does."""
        return self._bpe

    @functools.cached_property
    def special_tokens_set(self) -> set[str]:
        return set(SPECIAL_TOKENS)

    # -- tokens --------------------------------------------------------------

    def encode(
        self,
        text: str,
        *,
        allowed_special: Literal["all"] | AbstractSet[str] = set(),
        disallowed_special: Literal["all"] | Collection[str] = "all",
    ) -> list[int]:
        """Encode text; special-token text raises unless allowed (tiktoken's rules).

        >>> enc = load_harmony_encoding(HarmonyEncodingName.HARMONY_GPT_OSS)
        >>> enc.encode("<|start|>", disallowed_special=())
        [27, 91, 5236, 91, 29]
        """
        allowed = _ALL_SPECIAL if allowed_special == "all" else frozenset(allowed_special)
        if disallowed_special == "all":
            disallowed = frozenset() if allowed is _ALL_SPECIAL else _ALL_SPECIAL - allowed
        else:
            disallowed = frozenset(disallowed_special)
        if disallowed and "<|" in text:
            m = _special_regex(disallowed).search(text)
            if m:
                raise HarmonyError(_disallowed_message(m.group()))
        try:
            return self._encode_allowing(text, allowed)
        except UnicodeEncodeError:
            text = text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
            return self._encode_allowing(text, allowed)

    def _encode_allowing(self, text: str, allowed: frozenset[str]) -> list[int]:
        # tiktoken's own rule (ordinary text between allowed special tokens is encoded
        # on its own), without the per-call set work that costs ~100x a short encode.
        ordinary = self._ordinary
        if not allowed or "<|" not in text:
            return ordinary(text)
        out: list[int] = []
        pos = 0
        for m in _SPECIAL_SHAPE.finditer(text):
            name = m.group()
            if name not in allowed:
                continue
            if m.start() > pos:
                out += ordinary(text[pos : m.start()])
            out.append(SPECIAL_TOKENS[name])
            pos = m.end()
        if pos < len(text):
            out += ordinary(text[pos:])
        return out

    def decode_bytes(self, tokens: Sequence[int]) -> bytes:
        """The bytes of ``tokens`` (special tokens as their ``<|...|>`` text)."""
        toks = list(tokens)
        try:
            return self._bpe.decode_bytes(toks)
        except (KeyError, OverflowError, TypeError, ValueError):
            bad = next((t for t in toks if not 0 <= t < N_VOCAB), None)
            if bad is None:
                raise
            raise HarmonyError(f"Invalid token for decoding: {bad}") from None

    def decode(self, tokens: Sequence[int], errors: str = "replace") -> str:
        """Decode to text; invalid UTF-8 is replaced (or handled as ``errors`` says)."""
        return self.decode_bytes(tokens).decode("utf-8", errors=errors)

    def decode_utf8(self, tokens: Sequence[int]) -> str:
        """Decode to text; raises HarmonyError on invalid UTF-8 or an unknown id."""
        try:
            data = self.decode_bytes(tokens)
        except HarmonyError as e:
            raise HarmonyError(f"Could not decode tokens: Invalid token error: {e}") from None
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError:
            raise HarmonyError(
                f"Could not decode tokens: Invalid utf-8 sequence: {_utf8_error(data)}"
            ) from None

    def is_special_token(self, token: int) -> bool:
        return STARTOFTEXT <= token < N_VOCAB

    def stop_tokens(self) -> list[int]:
        return list(STOP_TOKENS)

    def stop_tokens_for_assistant_actions(self) -> list[int]:
        return list(STOP_TOKENS_FOR_ASSISTANT_ACTIONS)

    def _token_bytes(self, token: int) -> bytes:
        data = self._bytes_cache.get(token)
        if data is None:
            data = self._bytes_cache[token] = self._decode_single(token)
        return data

    # -- rendering -----------------------------------------------------------

    def render(self, message: Message, render_options: RenderOptions | None = None) -> list[int]:
        """Render one message.

        >>> enc = load_harmony_encoding(HarmonyEncodingName.HARMONY_GPT_OSS)
        >>> enc.decode_utf8(enc.render(Message.from_role_and_content(Role.USER, "Hi")))
        '<|start|>user<|message|>Hi<|end|>'
        """
        out: list[int] = []
        has_tools = render_options.conversation_has_function_tools if render_options else False
        self._renderer.render_message(message, has_tools, out)
        return out

    def render_text_append(self, role: Role, text: str, out: list[int], *, name: str | None = None,
                           channel: str | None = None, recipient: str | None = None,
                           content_type: str | None = None) -> None:
        """Append the tokens of a message of one text part given by its fields: what ``render``
        gives for that message, without building it (a dataset renders millions).

        >>> enc = load_harmony_encoding(HarmonyEncodingName.HARMONY_GPT_OSS)
        >>> out: list[int] = []
        >>> enc.render_text_append(Role.ASSISTANT, "Hi", out, channel="final")
        >>> enc.decode_utf8(out)
        '<|start|>assistant<|channel|>final<|message|>Hi<|end|>'
        """
        self._renderer.render_text(role, name, recipient, channel, content_type, text, out)

    def render_developer_append(self, instructions: str | None, tools: list[str], text: str | None,
                                out: list[int]) -> None:
        """Append the tokens of a developer message given as its fields: a ``DeveloperContent``
        with ``instructions`` and the ``# Tools`` section ``tools`` (as
        ``typescript.section_parts`` gives it; ``[]`` for none), when either is given, then a
        text part ``text``. What rendering that message gives, without building it.

        >>> enc = load_harmony_encoding(HarmonyEncodingName.HARMONY_GPT_OSS)
        >>> out: list[int] = []
        >>> enc.render_developer_append("Be brief.", [], None, out)
        >>> enc.decode_utf8(out)
        '<|start|>developer<|message|># Instructions\\n\\nBe brief.<|end|>'
        """
        self._renderer.render_developer(instructions, tools, text, out)

    def render_conversation(
        self, conversation: Conversation, config: RenderConversationConfig | None = None
    ) -> list[int]:
        """Render a conversation without opening a new turn."""
        out: list[int] = []
        self._renderer.render_conversation(_messages(conversation), config, out)
        return out

    def render_conversation_for_completion(
        self,
        conversation: Conversation,
        next_turn_role: Role,
        config: RenderConversationConfig | None = None,
    ) -> list[int]:
        """Render a conversation and open the next turn (``<|start|>assistant``)."""
        return self._renderer.render_for_completion(_messages(conversation), next_turn_role, config)

    def render_conversation_for_training(
        self, conversation: Conversation, config: RenderConversationConfig | None = None
    ) -> list[int]:
        """Render for training: a final assistant answer ends in ``<|return|>``."""
        return self._renderer.render_for_training(_messages(conversation), config)

    # -- parsing ---------------------------------------------------------------

    @functools.cached_property
    def machine_io(self) -> MachineIO:
        """What the parser's state machine needs of this vocabulary (``parse.machine.MachineIO``)."""
        return MachineIO(self._token_bytes, self._str_cache, self._bpe.decode_bytes, self._ordinary,
                         self._header_cache)

    def machine(self, role: Role | None, *, strict: bool = False,
                tools: Iterable[str] | None = None) -> Machine:
        """The parser's state machine over this vocabulary, sans I/O: ``feed(token)``,
        ``feed_text(run)`` (ordinary tokens at once), ``end()``, then ``result()``.

        >>> from harmonykit import load_harmony_encoding, Role
        >>> enc = load_harmony_encoding("HarmonyGptOss")
        >>> m = enc.machine(Role.ASSISTANT)
        >>> for t in enc.encode("<|channel|>final<|message|>Hi", allowed_special="all"):
        ...     _ = m.feed(t)
        >>> m.end().result().complete
        False
        """
        return Machine(self.machine_io, check_role(role), strict=strict, tools=check_tools(tools))

    def _run(self, machine: Machine, tokens: Iterable[int]) -> None:
        toks, specials = special_positions(tokens)
        # Runs of ordinary text are consumed whole; only special or invalid ids step.
        prev = 0
        for i in specials:
            if i > prev:
                machine.feed_text(toks[prev:i])
            machine.feed(toks[i])
            prev = i + 1
        if prev < len(toks):
            machine.feed_text(toks[prev:])
        machine.end()

    def parse_messages_from_completion_tokens(
        self,
        tokens: Sequence[int],
        role: Role | None = None,
        *,
        strict: bool = True,
    ) -> list[Message]:
        """Parse completion tokens into messages (the reference's API).

        ``strict=False`` is the tolerant parser: it never raises.
        """
        machine = self.machine(role, strict=strict)
        self._run(machine, tokens)
        return machine.parsed

    def parse_completion(
        self,
        tokens: Sequence[int],
        role: Role | None = Role.ASSISTANT,
        *,
        strict: bool = False,
        tools: Iterable[str] | None = None,
    ) -> ParseResult:
        """Parse a completion and account for every token: messages, spans, skipped, repairs.

        >>> enc = load_harmony_encoding(HarmonyEncodingName.HARMONY_GPT_OSS)
        >>> toks = enc.encode("<|channel|>commentary to=Get Weather<|message|>{}<|call|>",
        ...                   allowed_special="all")
        >>> r = enc.parse_completion(toks, tools=["Get Weather"])
        >>> r.messages[0].recipient, r.stop, [x.kind for x in r.repairs]
        ('Get Weather', 'call', ['recipient_with_spaces'])
        """
        machine = self.machine(role, strict=strict, tools=tools)
        self._run(machine, tokens)
        return machine.result()


_lock = threading.Lock()
_encodings: dict[str, HarmonyEncoding] = {}


def load_harmony_encoding(name: str | HarmonyEncodingName) -> HarmonyEncoding:
    """Load an encoding by name; the vocabulary is read offline, once per process.

    >>> load_harmony_encoding(HarmonyEncodingName.HARMONY_GPT_OSS).name
    'HarmonyGptOss'
    """
    key = str(name)
    enc = _encodings.get(key)
    if enc is None:
        if key != HarmonyEncodingName.HARMONY_GPT_OSS.value:
            raise ValueError(f"Invalid HarmonyEncodingName: {key}")
        with _lock:
            enc = _encodings.get(key)
            if enc is None:
                enc = _encodings[key] = HarmonyEncoding(key, load_bpe())
    return enc


def _messages(conversation: Any) -> list[Message]:
    messages = getattr(conversation, "messages", None)
    if not isinstance(messages, list):
        raise TypeError("conversation must be a Conversation (Conversation.from_messages([...])), got "
                        f"{type(conversation).__name__}")
    return messages
