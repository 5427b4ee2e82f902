"""The matcher: a request's grammar over the encoding's token ids, on llguidance.

The llguidance tokenizer is built once per process (about a second) from the
encoding's own tiktoken BPE; a grammar is compiled once per distinct request
shape and each ``HarmonyMatcher`` starts from a copy of the compiled one.
"""

from __future__ import annotations

import functools
from typing import Any

import llguidance
import numpy as np
from llguidance.tiktoken import lltokenizer_from_encoding

from ..cache import PartsCache
from ..encoding import HarmonyEncoding
from ..openai.errors import RequestError
from ..openai.hosted import McpNamespace
from ..tokens import ENDOFTEXT, N_VOCAB
from .lark import harmony_grammar

#: Length of ``allowed_mask()``: one entry per id of the o200k_harmony vocabulary.
MASK_SIZE = 201088


class GrammarError(RequestError):
    """A grammar llguidance cannot compile (e.g. a schema feature it does not support)."""


@functools.lru_cache(maxsize=4)
def lltokenizer(encoding: HarmonyEncoding) -> llguidance.LLTokenizer:
    """The llguidance tokenizer for ``encoding`` (built once per process). Its end-of-sequence
    token is <|endoftext|>, which no Harmony turn holds: <|return|> and <|call|> are tokens
    of the grammar, not llguidance's stop."""
    return lltokenizer_from_encoding(encoding.bpe, n_vocab=N_VOCAB, eos_token=ENDOFTEXT)


def _compile(encoding: HarmonyEncoding, grammar: str) -> llguidance.LLMatcher:
    matcher = llguidance.LLMatcher(lltokenizer(encoding), grammar, log_level=0)  # compiles once
    if matcher.is_error():
        raise GrammarError(None, f"the request's grammar does not compile: {matcher.get_error()}")
    return matcher


#: Compiled grammars by their text (a matcher starts from a copy of one).
COMPILED: PartsCache[llguidance.LLMatcher] = PartsCache(size=128)


class HarmonyMatcher:
    """Which tokens may come next in one assistant turn for ``request``.

    >>> from harmonykit import load_harmony_encoding
    >>> enc = load_harmony_encoding("HarmonyGptOss")
    >>> m = HarmonyMatcher(enc, {"messages": [{"role": "user", "content": "Hi"}]})
    >>> [m.consume(t) for t in enc.encode("<|channel|>final<|message|>Hi<|return|>", allowed_special="all")]
    [True, True, True, True, True]
    >>> m.is_complete(), int(m.allowed_mask().sum())
    (True, 0)
    """

    def __init__(self, encoding: HarmonyEncoding, request: dict[str, Any],
                 mcp: tuple[McpNamespace, ...] = ()) -> None:
        if not isinstance(encoding, HarmonyEncoding):
            raise TypeError(f"encoding must be a HarmonyEncoding, got {type(encoding).__name__}")
        self.grammar = harmony_grammar(request, mcp=mcp)
        compiled = COMPILED.get((id(encoding), self.grammar), lambda: _compile(encoding, self.grammar))
        self._matcher = compiled.deep_copy()
        self._words = np.zeros((N_VOCAB + 31) // 32, dtype=np.int32)

    def consume(self, token_id: int) -> bool:
        """Take ``token_id`` if the grammar allows it; False (and no change) when it does not."""
        if self._matcher.validate_tokens([token_id]) != 1:
            return False
        return bool(self._matcher.consume_token(token_id))

    def fill_bitmask(self, out: np.ndarray[Any, np.dtype[np.int32]]) -> None:
        """The allowed tokens as packed bits (32 ids per int32), as engines apply them."""
        self._matcher.unsafe_compute_mask_ptr(out.ctypes.data, out.nbytes)
        # llguidance's own end of sequence is never part of a Harmony turn
        out.view(np.uint32)[ENDOFTEXT >> 5] &= np.uint32(0xFFFFFFFF ^ (1 << (ENDOFTEXT & 31)))

    def allowed_mask(self) -> np.ndarray[Any, np.dtype[np.bool_]]:
        """One bool per token id (``MASK_SIZE`` long): may it come next?"""
        self.fill_bitmask(self._words)
        bits = np.unpackbits(self._words.view(np.uint8), bitorder="little")
        return bits[:MASK_SIZE].view(np.bool_)

    def is_complete(self) -> bool:
        """The turn has ended (``<|return|>`` or ``<|call|>`` was taken)."""
        return bool(self._matcher.is_accepting() and self._matcher.is_stopped())

    def rollback(self, n: int) -> None:
        """Undo the last ``n`` consumed tokens (speculative decoding)."""
        if not self._matcher.rollback(n):
            raise ValueError(f"cannot roll back {n} tokens: {self._matcher.get_error()}")

    @property
    def error(self) -> str | None:
        return self._matcher.get_error() if self._matcher.is_error() else None
