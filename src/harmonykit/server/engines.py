"""One profile per engine: how it is recognised, what its completion endpoint takes and
defaults to, and where its output ids, finish reason, usage and logprobs are.

Read from the engines' source (vLLM 0.32, SGLang 0.5.23, llama.cpp as bundled in
llama-cpp-python 0.3.36) and checked against a real vLLM and llama.cpp server in
tests/real. The gateway builds an engine-neutral ``Job``; the profile turns it
into the engine's request and the engine's answer back into ``Piece``s, so no
``if engine ==`` lives anywhere else.

- vLLM: ``/v1/completions``; ``max_tokens`` defaults to 16; a model name it does not
  serve is a 404; ``token_ids`` with ``return_token_ids``; the stop token is kept in
  them when it is an EOS of the model's generation config (``stop_reason`` null) and
  named in ``stop_reason`` when it came from ``stop_token_ids``; ``logit_bias`` is a
  dict; seeds are int64, ``top_p`` and ``repetition_penalty`` must be above 0; a
  grammar goes in ``structured_outputs`` (0.11+).
- SGLang: ``/v1/completions``; ``max_tokens`` defaults to 16; ``token_ids`` with
  ``return_token_ids``, the matched stop in ``matched_stop``; a grammar in ``ebnf``
  (``--grammar-backend llguidance``).
- llama.cpp server: its OpenAI ``/v1/completions`` returns no ids and drops
  end-of-generation tokens from ``text`` (unless ``--special``), so the native
  ``/completion`` is used: ``tokens`` with ``return_tokens`` (the stop token
  included, so ``tokens_predicted`` is their count), ``stop_type`` (``eos``, ``limit``,
  ``word``), logprobs in ``completion_probabilities``
  with ``n_probs``; ``n_predict`` -1 runs to the context's end. Its grammar support
  cannot hold gpt-oss's control tokens (they are user-defined tokens there), so
  guided decoding is refused for it.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..encoding import HarmonyEncoding
from ..openai.errors import RequestError
from ..tokens import CALL, RETURN

ENGINES = ("vllm", "sglang", "llamacpp")
_INT64 = (-(2**63), 2**63 - 1)


@dataclass(frozen=True)
class Job:
    """What the gateway asks of an engine, in OpenAI's terms: the prompt's ids, the sampling
    parameters (``temperature``, ``top_p``, ``seed``, ``stop``, ``n``, penalties, ``top_k``,
    ``min_p``, ``repetition_penalty``, ``min_tokens``, ``logit_bias``), the output limit,
    how many top logprobs to return per token (None: none), and a grammar (Lark) or None."""

    prompt: list[int]
    sampling: dict[str, Any]
    max_tokens: int | None = None  # None: the client set none (the upstream resolves one)
    logprobs: int | None = None
    grammar: str | None = None


@dataclass
class Piece:
    """Output of one engine event: token ids, their logprob entries (OpenAI Chat's
    ``logprobs.content`` items, when asked), and the finish reason once known. Usage is
    counted from the ids, which are the engine's own count on every engine here."""

    ids: list[int]
    finish_reason: str | None = None
    logprobs: list[dict[str, Any]] = field(default_factory=list)


@dataclass(frozen=True)
class ModelInfo:
    """What the engine serves: its model names and the context length (None: not said)."""

    names: tuple[str, ...]
    context: int | None


@dataclass(frozen=True)
class Profile:
    """One engine's behaviour, as data and small functions."""

    name: str
    path: str  # the completion endpoint (a limit is always sent: vLLM and SGLang default to 16)
    body: Callable[[Job, str, bool], dict[str, Any]]
    read: Callable[[dict[str, Any], HarmonyEncoding, int | None], Piece]  # choice, encoding, top logprobs
    context: Callable[[dict[str, Any]], int | None]
    check: Callable[[Job], None]
    guided: str | None  # why guided decoding cannot work here (None: it can)
    streams_choices: bool = True  # events carry ``choices`` (OpenAI) or are the choice itself
    # Where guided decoding depends on the engine's version (asked at /version): why a version
    # cannot hold a turn to a grammar, and what it needs at the engine's own startup.
    version_problem: Callable[[str], str | None] | None = None
    version_caveat: Callable[[str], str | None] | None = None


# -- shared pieces ---------------------------------------------------------------

def _finish(reason: Any) -> str | None:
    if reason is None:
        return None
    return reason if reason in ("stop", "length", "content_filter") else "stop"


def _ints(value: Any) -> list[int] | None:
    if isinstance(value, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in value):
        return value
    return None


def _entry(encoding: HarmonyEncoding, token: int, logprob: float,
           top: list[tuple[int, float]]) -> dict[str, Any]:
    def one(t: int, lp: float) -> dict[str, Any]:
        raw = encoding.decode_bytes([t])
        return {"token": raw.decode("utf-8", "replace"), "logprob": lp, "bytes": list(raw)}
    return {**one(token, logprob), "top_logprobs": [one(t, lp) for t, lp in top]}


def _openai_logprobs(choice: dict[str, Any], ids: list[int], encoding: HarmonyEncoding,
                     want: int | None) -> list[dict[str, Any]]:
    """Completions-style logprobs (vLLM with ``return_tokens_as_token_ids``, SGLang): tokens
    as ``token_id:N``, aligned with ``ids``."""
    lp = choice.get("logprobs")
    if not isinstance(lp, dict):
        return []
    values = lp.get("token_logprobs") or []
    tops = lp.get("top_logprobs") or []
    out = []
    for i, t in enumerate(ids):
        value = values[i] if i < len(values) and isinstance(values[i], int | float) else -math.inf
        top_raw = tops[i] if i < len(tops) and isinstance(tops[i], dict) else {}
        top = [(_token_id(k, encoding), float(v)) for k, v in top_raw.items() if isinstance(v, int | float)]
        # vLLM puts the sampled token among the top ones as well: OpenAI lists the top ones alone.
        ranked = sorted(((k, v) for k, v in top if k is not None), key=lambda kv: -kv[1])
        out.append(_entry(encoding, t, float(value), ranked[:want] if want is not None else ranked))
    return out


def _token_id(key: str, encoding: HarmonyEncoding) -> int | None:
    if key.startswith("token_id:"):
        try:
            return int(key[9:])
        except ValueError:
            return None
    ids = encoding.encode(key, allowed_special="all")
    return ids[0] if len(ids) == 1 else None


def _accept(job: Job) -> None:
    """Nothing to refuse beyond what the request checks already did."""


def _check_vllm(job: Job) -> None:
    s = job.sampling
    seed = s.get("seed")
    if seed is not None and not _INT64[0] <= seed <= _INT64[1]:
        raise RequestError("seed", f"seed must fit in a signed 64-bit integer for this engine, got {seed}")
    if s.get("top_p") is not None and s["top_p"] <= 0:
        raise RequestError("top_p", "top_p must be above 0 for this engine (vLLM); use temperature 0 "
                                    "for greedy sampling")
    if s.get("repetition_penalty") is not None and s["repetition_penalty"] <= 0:
        raise RequestError("repetition_penalty", "repetition_penalty must be above 0 for this engine")


_OPENAI_SAMPLING = ("temperature", "top_p", "seed", "stop", "n", "frequency_penalty", "presence_penalty",
                    "top_k", "min_p", "repetition_penalty", "min_tokens", "logit_bias")


def _openai_body(job: Job, model: str, stream: bool, grammar_field: Callable[[str], dict[str, Any]]
                 ) -> dict[str, Any]:
    body: dict[str, Any] = {"model": model, "prompt": job.prompt, "max_tokens": job.max_tokens,
                            "stream": stream, "stop_token_ids": [RETURN, CALL], "skip_special_tokens": False,
                            "spaces_between_special_tokens": False, "return_token_ids": True}
    body.update({k: v for k, v in job.sampling.items() if k in _OPENAI_SAMPLING and v is not None})
    if job.logprobs is not None:
        body["logprobs"] = job.logprobs
        body["return_tokens_as_token_ids"] = True
    if job.grammar is not None:
        body.update(grammar_field(job.grammar))
    return body


def _openai_read(choice: dict[str, Any], encoding: HarmonyEncoding, top: int | None) -> Piece:
    ids = _ints(choice.get("token_ids"))
    if ids is None:  # an OpenAI-compatible engine that sends text only
        text = choice.get("text")
        ids = encoding.encode(text, allowed_special="all") if isinstance(text, str) and text else []
    reason = _finish(choice.get("finish_reason"))
    # The stop token named in stop_reason (vLLM) or matched_stop (SGLang) but left out of the ids.
    stop = choice.get("stop_reason", choice.get("matched_stop"))
    if reason == "stop" and stop in (RETURN, CALL) and not (ids and ids[-1] == stop):
        ids = [*ids, stop]
    return Piece(ids, reason, _openai_logprobs(choice, ids, encoding, top))


def _model_context(card: dict[str, Any]) -> int | None:
    value = card.get("max_model_len")
    return value if isinstance(value, int) and value > 0 else None


# -- llama.cpp ---------------------------------------------------------------------

_LLAMA_NAMES = {"temperature": "temperature", "top_p": "top_p", "seed": "seed", "stop": "stop",
                "frequency_penalty": "frequency_penalty", "presence_penalty": "presence_penalty",
                "top_k": "top_k", "min_p": "min_p", "repetition_penalty": "repeat_penalty"}
_LLAMA_FINISH = {"eos": "stop", "word": "stop", "limit": "length"}


def _llama_body(job: Job, model: str, stream: bool) -> dict[str, Any]:
    body: dict[str, Any] = {"prompt": job.prompt, "n_predict": job.max_tokens, "stream": stream,
                            "return_tokens": True, "cache_prompt": True}
    for key, name in _LLAMA_NAMES.items():
        if job.sampling.get(key) is not None:
            body[name] = job.sampling[key]
    if job.sampling.get("logit_bias"):
        body["logit_bias"] = [[int(k), v] for k, v in job.sampling["logit_bias"].items()]
    if job.logprobs is not None:
        body["n_probs"] = max(job.logprobs, 1)  # the sampled token's own logprob comes with its top list
    return body


def _llama_read(event: dict[str, Any], encoding: HarmonyEncoding, top: int | None) -> Piece:
    ids = _ints(event.get("tokens")) or []
    reason = _LLAMA_FINISH.get(event.get("stop_type", ""), "stop") if event.get("stop") else None
    logprobs = []
    probs = event.get("completion_probabilities")
    if isinstance(probs, list):
        for i, p in enumerate(probs[: len(ids)]):
            if not isinstance(p, dict):
                continue
            tops = [(int(q["id"]), float(q["logprob"])) for q in p.get("top_logprobs") or []
                    if isinstance(q, dict) and isinstance(q.get("id"), int)]
            logprobs.append(_entry(encoding, ids[i], float(p.get("logprob", -math.inf)), tops[:top or 0]))
    return Piece(ids, reason, logprobs)


def _llama_context(card: dict[str, Any]) -> int | None:
    meta = card.get("meta")
    value = meta.get("n_ctx") if isinstance(meta, dict) else None  # a slot's context
    return value if isinstance(value, int) and value > 0 else None


def _major_minor(version: str) -> tuple[int, int] | None:
    """``(major, minor)`` of a version string such as ``0.32.0`` (None if it has none)."""
    try:
        major, minor = (int(x) for x in version.split(".")[:2])
    except ValueError:
        return None
    return major, minor


def vllm_guided_problem(version: str) -> str | None:
    """Why a vLLM version cannot hold a whole Harmony turn to a grammar (None: it can)."""
    release = _major_minor(version)
    if release is not None and release < (0, 11):
        return f"vLLM {version} ignores structured_outputs (0.11 and later apply it)"
    return None


def vllm_guided_caveat(version: str) -> str | None:
    """What a vLLM version needs at its own startup for a grammar to hold the whole turn.

    >>> vllm_guided_caveat("0.20.1") is not None, vllm_guided_caveat("0.32.0")
    (True, None)
    """
    release = _major_minor(version)
    if release is not None and (0, 11) <= release < (0, 27):
        return (f"vLLM {version} applies a grammar only once its reasoning parser sees the final channel: "
                "start it without --reasoning-parser, or (0.13+) with "
                "--structured-outputs-config.enable_in_reasoning true")
    return None


PROFILES: dict[str, Profile] = {
    "vllm": Profile(
        "vllm", "/v1/completions",
        lambda job, model, stream: _openai_body(job, model, stream,
                                                lambda g: {"structured_outputs": {"grammar": g}}),
        _openai_read, _model_context, _check_vllm, None,
        version_problem=vllm_guided_problem, version_caveat=vllm_guided_caveat),
    "sglang": Profile(
        "sglang", "/v1/completions",
        lambda job, model, stream: _openai_body(job, model, stream, lambda g: {"ebnf": g}),
        _openai_read, _model_context, _accept, None),
    "llamacpp": Profile(
        "llamacpp", "/completion", _llama_body, _llama_read, _llama_context, _accept,
        "llama.cpp reads gpt-oss's <|channel|>, <|message|>, <|start|>, <|constrain|> and <|end|> as "
        "user-defined text tokens, so its llguidance cannot hold them (it samples unconstrained "
        "with a 200); run guided decoding on vLLM or SGLang", streams_choices=False),
}


def profile_of(models: dict[str, Any], version: dict[str, Any] | None = None) -> Profile:
    """The engine behind a ``/v1/models`` answer (``owned_by``), or its ``/version`` answer.

    >>> profile_of({"data": [{"id": "m", "owned_by": "vllm"}]}).name
    'vllm'
    >>> profile_of({"data": [{"id": "m", "owned_by": "llamacpp"}]}).path
    '/completion'
    """
    cards = models.get("data") if isinstance(models, dict) else None
    for card in cards if isinstance(cards, list) else []:
        owner = str(card.get("owned_by", "")).lower().replace(".", "").replace("-", "") \
            if isinstance(card, dict) else ""
        for name in ENGINES:
            if name in owner:
                return PROFILES[name]
    # vLLM also answers /version; an engine that says nothing speaks OpenAI's completions like it.
    return PROFILES["vllm"]


def model_info(models: dict[str, Any], profile: Profile) -> ModelInfo:
    cards = [c for c in models.get("data") or [] if isinstance(c, dict)] if isinstance(models, dict) else []
    names = tuple(str(c["id"]) for c in cards if isinstance(c.get("id"), str))
    contexts = [profile.context(c) for c in cards]
    return ModelInfo(names, next((c for c in contexts if c is not None), None))

