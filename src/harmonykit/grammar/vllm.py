"""A vLLM v1 logits processor: requests that carry a Harmony request in their extra arguments
are held to its grammar; others pass untouched.

    vllm serve openai/gpt-oss-20b --logits-processors harmonykit.grammar.vllm:HarmonyVLLMLogitsProcessor
    # then per request: SamplingParams(extra_args={"harmony_request": {...the Chat/Responses body...}})
    # (over HTTP: "vllm_xargs": {"harmony_request": "<the body as a JSON string>"})

Written to vLLM's ``LogitsProcessor`` interface (``update_state(batch_update)``,
``apply(logits)``, ``is_argmax_invariant()``); imports vLLM when it is installed.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import torch

from .. import HarmonyEncodingName, load_harmony_encoding
from .matcher import HarmonyMatcher

try:  # pragma: no cover - vLLM is not installed where the tests run
    from vllm.v1.sample.logits_processor import LogitsProcessor as _Base
    from vllm.v1.sample.logits_processor import MoveDirectionality
except ImportError:
    _Base = object
    MoveDirectionality = None

EXTRA_ARG = "harmony_request"


def _request_of(params: Any) -> dict[str, Any] | None:
    extra = getattr(params, "extra_args", None) or {}
    raw = extra.get(EXTRA_ARG)
    if isinstance(raw, str):  # over HTTP vLLM passes vllm_xargs values as strings
        raw = json.loads(raw)
    return raw if isinstance(raw, dict) else None


class HarmonyVLLMLogitsProcessor(_Base):  # type: ignore[misc]
    """Per-request Harmony grammars over vLLM's persistent batch."""

    def __init__(self, vllm_config: Any, device: torch.device, is_pin_memory: bool) -> None:
        self.device = device
        self.encoding = load_harmony_encoding(HarmonyEncodingName.HARMONY_GPT_OSS)
        # batch index -> (matcher, the request's output token list (vLLM appends to it), consumed)
        self.rows: dict[int, list[Any]] = {}

    def is_argmax_invariant(self) -> bool:
        return False  # masking changes which token is most likely

    def update_state(self, batch_update: Any | None) -> None:
        if batch_update is None:
            return
        for index in batch_update.removed:
            self.rows.pop(index, None)
        for added in batch_update.added:
            # vLLM >= 0.11: (index, params, prompt ids, output ids); earlier: (prompt, index, params, output)
            index, params, _prompt, output = added if isinstance(added[0], int) else \
                (added[1], added[2], added[0], added[3])
            request = _request_of(params)
            if request is None:
                self.rows.pop(index, None)
            else:
                self.rows[index] = [HarmonyMatcher(self.encoding, request), output, 0]
        for source, target, direction in batch_update.moved:
            swap = (MoveDirectionality is not None and direction == MoveDirectionality.SWAP) or \
                getattr(direction, "name", "") == "SWAP"
            a, b = self.rows.pop(source, None), self.rows.pop(target, None)
            if a is not None:
                self.rows[target] = a
            if swap and b is not None:
                self.rows[source] = b

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        if not self.rows:
            return logits
        vocab = logits.shape[-1]
        for index, row in self.rows.items():
            matcher, output, consumed = row
            for token in output[consumed:]:
                if not matcher.is_complete():
                    matcher.consume(int(token))
            row[2] = len(output)
            if matcher.is_complete():
                continue  # the stop token ended the request; vLLM stops it
            allowed = np.zeros(vocab, dtype=bool)
            mask = matcher.allowed_mask()
            allowed[: min(vocab, mask.size)] = mask[:vocab]
            logits[index, ~torch.from_numpy(allowed).to(logits.device)] = float("-inf")
        return logits
