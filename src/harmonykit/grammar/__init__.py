"""Guided decoding: make malformed Harmony impossible at generation time.

``harmony_grammar(request)`` gives the llguidance grammar (Lark syntax) of one
assistant turn for a Chat Completions or Responses request; ``HarmonyMatcher``
runs it over the encoding's token ids (needs the ``grammar`` extra:
llguidance and numpy). Engine adapters live in ``harmonykit.grammar.transformers``
and ``harmonykit.grammar.vllm``, imported only when used.
"""

from .lark import harmony_grammar

__all__ = ["GrammarError", "HarmonyMatcher", "harmony_grammar"]


def __getattr__(name: str) -> object:
    # The matcher needs llguidance; building a grammar does not.
    if name in ("HarmonyMatcher", "GrammarError", "MASK_SIZE"):
        from . import matcher

        return getattr(matcher, name)
    raise AttributeError(name)
