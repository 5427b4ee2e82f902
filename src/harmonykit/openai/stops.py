"""Where an engine's output really ends: the client's stop strings and the turn's stop token.

Engines cut a stop string out of their ``text`` but keep the token that completed it
in their token ids (vLLM, SGLang), or say nothing of it (llama.cpp); some leave the
turn's stop token out of their ids. ``OutputEnd`` sits between the engine's ids and
the parser: it cuts the output where a stop string starts (the straddling token's
text before the string is re-encoded), holds back tokens that may begin a stop
string until they cannot, and puts back the stop token the turn ended with when the
engine did not return it, read from the last message's header (``<|call|>`` after a
recipient, ``<|return|>`` otherwise), so a call and an answer are told apart on
every engine. Pure: token ids in, token ids out.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..encoding import HarmonyEncoding
from ..tokens import CALL, MESSAGE, RETURN, START, STOP_TOKEN_SET

_HEADER_CAP = 64  # tokens of a header worth reading for its recipient


class OutputEnd:
    """Feed engine ids (and their logprob entries, if any); get the ids the parser should see.

    >>> from harmonykit import load_harmony_encoding
    >>> enc = load_harmony_encoding("HarmonyGptOss")
    >>> end = OutputEnd(enc, ["###"])
    >>> ids = enc.encode("<|channel|>final<|message|>Hi ### there", allowed_special="all")
    >>> out, _ = end.feed(ids)
    >>> tail, _ = end.finish(ended=True)
    >>> enc.decode(out + tail), end.stopped
    ('<|channel|>final<|message|>Hi <|return|>', True)
    """

    def __init__(self, encoding: HarmonyEncoding, stops: Sequence[str] = ()) -> None:
        self.encoding = encoding
        self.stops = [s.encode("utf-8") for s in stops if s]
        self.stopped = False  # a stop string matched: everything after it is dropped
        self._held: list[tuple[int, bytes, Any]] = []
        self._header: list[int] = []  # tokens since the last <|start|>, until <|message|>
        self._in_body = False
        self._last: int | None = None

    def feed(self, ids: Sequence[int], logprobs: Sequence[Any] | None = None) -> tuple[list[int], list[Any]]:
        """The ids (and logprob entries) that can go on now."""
        if self.stopped:
            return [], []
        if not self.stops:
            self._track(ids)
            return list(ids), list(logprobs) if logprobs else []
        out_ids: list[int] = []
        out_lp: list[Any] = []
        for i, t in enumerate(ids):
            if self.stopped:
                break
            lp = logprobs[i] if logprobs and i < len(logprobs) else None
            self._held.append((t, self.encoding.decode_bytes([t]), lp))
            self._scan(out_ids, out_lp)
        self._track(out_ids)
        return out_ids, out_lp

    def finish(self, ended: bool) -> tuple[list[int], list[Any]]:
        """The end of the output: what was held back, then the stop token when the turn ``ended``
        (the engine stopped on its own or at a stop string, not at a length limit) and the
        engine did not return one."""
        out_ids = [t for t, _, _ in self._held] if not self.stopped else []
        out_lp = [lp for _, _, lp in self._held] if not self.stopped else []
        self._held = []
        self._track(out_ids)
        if (ended or self.stopped) and (self._last is None or self._last not in STOP_TOKEN_SET):
            out_ids.append(self.stop_token())
            self._last = out_ids[-1]
        return out_ids, out_lp

    def stop_token(self) -> int:
        """The token that ends the current message: ``<|call|>`` after a recipient."""
        header = self.encoding.decode(self._header) if self._header else ""
        return CALL if " to=" in f" {header}" else RETURN

    def _track(self, ids: Sequence[int]) -> None:
        for t in ids:
            if t == START:
                self._header, self._in_body = [], False
            elif t == MESSAGE:
                self._in_body = True
            elif not self._in_body and len(self._header) < _HEADER_CAP:
                self._header.append(t)
            self._last = t

    def _scan(self, out_ids: list[int], out_lp: list[Any]) -> None:
        data = b"".join(b for _, b, _ in self._held)
        hits = [i for i in (data.find(s) for s in self.stops) if i != -1]
        if hits:
            cut = min(hits)
            pos = 0
            for t, b, lp in self._held:
                if pos + len(b) <= cut:
                    out_ids.append(t)
                    out_lp.append(lp)
                elif pos < cut:  # the token straddles the stop string: keep its text before it
                    out_ids += self.encoding.encode(b[: cut - pos].decode("utf-8", "replace"),
                                                    allowed_special=set())
                pos += len(b)
            self._held = []
            self.stopped = True
            return
        # Keep back the shortest tail of tokens that covers any suffix that begins a stop string.
        keep_from = len(data)
        for s in self.stops:
            for n in range(min(len(s) - 1, len(data)), 0, -1):
                if data.endswith(s[:n]):
                    keep_from = min(keep_from, len(data) - n)
                    break
        pos = 0
        release = 0
        for _, b, _ in self._held:
            if pos + len(b) > keep_from:
                break
            pos += len(b)
            release += 1
        for t, _, lp in self._held[:release]:
            out_ids.append(t)
            out_lp.append(lp)
        del self._held[:release]
