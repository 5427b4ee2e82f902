"""A ``transformers`` logits processor that keeps ``generate`` inside the Harmony grammar.

    proc = HarmonyLogitsProcessor(encoding, request)
    model.generate(input_ids=prompt, logits_processor=[proc], eos_token_id=[200002, 200012])

Imports torch and transformers; the rest of harmonykit never does.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from transformers import LogitsProcessor

from ..encoding import HarmonyEncoding
from .matcher import HarmonyMatcher


class HarmonyLogitsProcessor(LogitsProcessor):
    """Masks every token the grammar does not allow next, row by row of the batch.

    The first call sees the prompts (``prompt_length`` tokens, by default the whole
    ``input_ids`` of that call); every later call consumes the tokens generated since.
    A row whose turn is complete may only repeat its stop token (``generate`` pads it).
    """

    def __init__(self, encoding: HarmonyEncoding, request: dict[str, Any], *,
                 prompt_length: int | None = None) -> None:
        self.encoding = encoding
        self.request = request
        self.prompt_length = prompt_length
        self.matchers: list[HarmonyMatcher] = []
        self._seen: list[int] = []

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        batch, length = input_ids.shape
        if not self.matchers:
            start = self.prompt_length if self.prompt_length is not None else length
            self.matchers = [HarmonyMatcher(self.encoding, self.request) for _ in range(batch)]
            self._seen = [start] * batch
        for row, matcher in enumerate(self.matchers):
            for token in input_ids[row, self._seen[row] :].tolist():
                if not matcher.is_complete():
                    matcher.consume(int(token))
            self._seen[row] = length
            if matcher.is_complete():
                last = int(input_ids[row, -1])
                keep = scores[row, last].clone()
                scores[row, :] = float("-inf")
                scores[row, last] = keep
                continue
            mask = matcher.allowed_mask()
            vocab = scores.shape[-1]
            allowed = np.zeros(vocab, dtype=bool)
            allowed[: min(vocab, mask.size)] = mask[:vocab]
            scores[row, ~torch.from_numpy(allowed).to(scores.device)] = float("-inf")
        return scores
