"""harmonykit inside ``vllm serve``: vLLM's own Chat Completions and Responses endpoints read
gpt-oss output with harmonykit's tolerant parser.

Loaded by vLLM itself, in each of its processes, through the ``vllm.general_plugins``
entry point that harmonykit declares (``pip install 'harmonykit[vllm]'`` in vLLM's
environment; nothing else to do). Importing harmonykit never imports this module.

vLLM 0.32 reads gpt-oss output in one place, ``vllm/parser/harmony.py``, through
``harmony_utils.get_streamable_parser_for_assistant()``: an ``openai_harmony``
``StreamableParser`` that raises on malformed output (vLLM then answers with the raw
text, control tokens and all, or with nothing). ``register`` points that name at a
parser with the same face over harmonykit's tolerant one, shaped as vLLM's code reads
it (``_SegmentType.from_channel_and_recipient``): a body with no channel and no
recipient, or a channel the model made up, is shown as the answer (``channel`` reads
``"final"``), a call with no channel reads ``"commentary"``, and messages are
``openai_harmony.Message`` objects.

Off with ``HARMONYKIT_VLLM=0``. On a vLLM version not in ``SUPPORTED`` it logs one
warning and changes nothing. Repairs are logged once per repaired output and
counted in ``harmonykit_vllm_repairs_total{kind}`` on vLLM's metrics.
"""

from __future__ import annotations

import logging
import os
from collections import Counter
from typing import Any

from . import HarmonyEncodingName, load_harmony_encoding
from .encoding import HarmonyEncoding
from .model import Role, StreamState
from .parse.stream import StreamableParser

#: vLLM versions (major.minor) whose gpt-oss reading this plugin replaces, tested against.
SUPPORTED = ("0.32",)

# A child of vLLM's own logger, so its handlers show these lines in vLLM's log.
log = logging.getLogger("vllm.harmonykit")
_ENCODING: HarmonyEncoding | None = None
_COUNTER: Any = None


def supported(version: str) -> bool:
    """Whether the plugin acts on this vLLM version.

    >>> supported("0.32.0"), supported("0.32.1+cpu"), supported("0.31.2")
    (True, True, False)
    """
    return ".".join(version.split("+")[0].split(".")[:2]) in SUPPORTED


def register() -> None:
    """The entry point vLLM calls in each of its processes."""
    if os.environ.get("HARMONYKIT_VLLM", "1").strip().lower() in ("0", "false", "no", "off"):
        log.info("harmonykit: the vLLM plugin is off (HARMONYKIT_VLLM=0)")
        return
    import vllm

    version = getattr(vllm, "__version__", "unknown")
    if not supported(version):
        log.warning("harmonykit: the vLLM plugin supports vLLM %s; this is vLLM %s, so it changes "
                    "nothing (gpt-oss output is read by vLLM's own parser)", ", ".join(SUPPORTED), version)
        return
    import vllm.parser.harmony as harmony

    harmony.get_streamable_parser_for_assistant = tolerant_parser_for_assistant
    _flush_with_tail(harmony)
    log.info("harmonykit: vLLM %s reads gpt-oss output with harmonykit's tolerant parser", version)


def tolerant_parser_for_assistant() -> VLLMParser:
    """What vLLM's ``get_streamable_parser_for_assistant()`` returns once the plugin is on."""
    global _ENCODING
    if _ENCODING is None:
        _ENCODING = load_harmony_encoding(HarmonyEncodingName.HARMONY_GPT_OSS)
    return VLLMParser(_ENCODING)


def _flush_with_tail(harmony: Any) -> None:
    """vLLM's ``HarmonyParser.flush`` streams no text of the messages the end completes: put the
    text decided at the end (``VLLMParser.tail``) in front of its segments."""
    original = harmony.HarmonyParser.flush
    if getattr(original, "_harmonykit", False):
        return

    def flush(self: Any) -> list[Any]:
        parser = self._parser
        segments = original(self)
        tail = parser.tail if isinstance(parser, VLLMParser) else []
        return [harmony.Segment(channel=c, recipient=r, delta=t) for c, r, t in tail] + list(segments)

    flush._harmonykit = True  # type: ignore[attr-defined]
    harmony.HarmonyParser.flush = flush


class VLLMParser:
    """``openai_harmony.StreamableParser``'s face over harmonykit's tolerant parser, as vLLM 0.32
    reads it. Never raises on model output.

    vLLM streams only ``last_content_delta`` and skips the token on which a message completes.
    A tolerant reading can decide a message's text only when it completes (a header with no
    ``<|message|>`` whose text becomes the body): that text is shown as the delta of the
    completing token, under the message's channel, and the message itself one token later;
    at the end of the output it is left in ``tail`` for vLLM's ``flush``.

    >>> from harmonykit import load_harmony_encoding
    >>> enc = load_harmony_encoding("HarmonyGptOss")
    >>> p = VLLMParser(enc)
    >>> for t in enc.encode("Hi<|channel|><|message|> there", allowed_special="all"):
    ...     _ = p.process(t)
    >>> p.current_channel, p.process_eos().messages[-1].channel
    ('final', 'final')
    """

    def __init__(self, encoding: HarmonyEncoding) -> None:
        self._p = StreamableParser(encoding, Role.ASSISTANT, strict=False)
        self._out: list[Any] = []
        self._exposed = 0  # messages vLLM may see
        self._shown: list[str] = []  # the open body's deltas shown so far (joined once, at its end)
        # what vLLM reads after a token: channel, recipient, delta
        self._face: tuple[str | None, str | None, str | None] = (None, None, None)
        self._ended = False
        self.tail: list[tuple[str | None, str | None, str]] = []  # text decided at the end, unshown

    def process(self, token: int) -> VLLMParser:
        p = self._p
        before = len(p.messages)
        self._exposed = before
        p.process(token)
        late = self._late(p.messages[before:])
        if late:
            self._face = late[0]
            return self  # the messages show one token later, after their text
        self._exposed = len(p.messages)
        if p.state is StreamState.CONTENT:
            delta = p.last_content_delta
            if delta:
                self._shown.append(delta)
            self._face = (_channel(p.current_channel, p.current_recipient), p.current_recipient, delta)
        else:
            self._face = (None, None, None)
        return self

    def process_eos(self) -> VLLMParser:
        p = self._p
        before = len(p.messages)
        p.process_eos()
        self.tail += self._late(p.messages[before:])
        self._exposed = len(p.messages)
        self._face = (None, None, None)
        if not self._ended:
            self._ended = True
            _report(p.repairs)
        return self

    def _late(self, completed: list[Any]) -> list[tuple[str | None, str | None, str]]:
        """The text of ``completed`` messages that no delta has shown."""
        out = []
        for m in completed:
            text = "".join(c.text for c in m.content if hasattr(c, "text"))
            shown = "".join(self._shown)
            rest = text[len(shown):] if text.startswith(shown) else text
            self._shown = []
            if rest:
                out.append((_channel(m.channel, m.recipient), m.recipient, rest))
        if len(out) > 1:  # shown together, under the first one's channel
            out = [(out[0][0], out[0][1], "".join(t for _, _, t in out))]
        return out

    @property
    def messages(self) -> list[Any]:
        # vLLM sets ``recipient`` on the messages it polls: the same objects each time.
        if len(self._out) < self._exposed:
            from openai_harmony import Message

            for m in self._p.messages[len(self._out):self._exposed]:
                raw = m.to_dict()
                raw["channel"] = _channel(raw.get("channel"), raw.get("recipient"))
                self._out.append(Message.from_dict(raw))
        return self._out if len(self._out) == self._exposed else self._out[: self._exposed]

    @property
    def current_channel(self) -> str | None:
        return self._face[0]

    @property
    def current_recipient(self) -> str | None:
        return self._face[1]

    @property
    def last_content_delta(self) -> str | None:
        return self._face[2]

    @property
    def current_content(self) -> str:
        return self._p.current_content

    @property
    def current_role(self) -> Any:
        return self._p.current_role

    @property
    def current_content_type(self) -> str | None:
        return self._p.current_content_type

    @property
    def state(self) -> Any:
        return self._p.state

    @property
    def tokens(self) -> list[int]:
        return self._p.tokens


_KNOWN = ("analysis", "commentary", "final")


def _channel(channel: str | None, recipient: str | None) -> str | None:
    """The channel vLLM should see (it shows only these three): text with no channel, or a
    channel the model made up, is the answer; a call with none is commentary."""
    if channel in _KNOWN:
        return channel
    return "commentary" if recipient else "final"


def _report(repairs: list[Any]) -> None:
    if not repairs:
        return
    kinds = Counter(r.kind for r in repairs)
    log.info("harmonykit: repaired gpt-oss output: %s",
             ", ".join(f"{k} x{n}" for k, n in sorted(kinds.items())))
    counter = _counter()
    if counter is not None:
        for kind, n in kinds.items():
            counter.labels(kind).inc(n)


def _counter() -> Any:
    global _COUNTER
    if _COUNTER is None:
        try:
            from prometheus_client import Counter as PromCounter

            _COUNTER = PromCounter("harmonykit_vllm_repairs", "gpt-oss output repairs made by harmonykit",
                                   ["kind"])
        except Exception:  # no prometheus_client, or the name is taken: logging alone
            _COUNTER = False
    return _COUNTER or None
