"""A request's top-level fields: which are known, and the sampling parameters an engine gets.

Pure: ``check_fields`` rejects what OpenAI would reject (unknown fields, wrong
types, values out of range) with a ``RequestError`` naming the field;
``sampling`` gives the fields of an OpenAI-compatible ``/v1/completions``
request (vLLM, SGLang, llama.cpp server) that carry the client's sampling.
"""

from __future__ import annotations

from typing import Any

from .errors import RequestError, shown

_COMMON = frozenset({
    "model", "stream", "stream_options", "temperature", "top_p", "tools", "tool_choice",
    "parallel_tool_calls", "user", "metadata", "store", "service_tier", "top_logprobs",
    "prompt_cache_key", "safety_identifier", "seed",
    # engine extensions that vLLM and SGLang understand, passed through (in Responses too)
    "top_k", "min_p", "repetition_penalty", "min_tokens", "logit_bias", "stop", "frequency_penalty",
    "presence_penalty",
})
# Fields of the newest openai SDK that a gateway accepts and has nothing to do with (caching and
# moderation options, OpenAI-side context management): accepted, so SDKs that send them work.
_ACCEPTED = frozenset({"prompt_cache_retention", "prompt_cache_options", "moderation"})
# vLLM's own server's extensions, so clients written for it work here too: honoured where they
# mean something for a Harmony turn (chat_template_kwargs' reasoning_effort, include_reasoning),
# accepted otherwise.
VLLM_EXTENSIONS = frozenset({
    "chat_template_kwargs", "include_reasoning", "skip_special_tokens", "spaces_between_special_tokens",
    "add_generation_prompt", "continue_final_message", "echo", "chat_template", "documents",
    "mm_processor_kwargs", "priority", "request_id", "return_tokens_as_token_ids", "return_token_ids",
    "cache_salt", "kv_transfer_params", "vllm_xargs", "ignore_eos", "stop_token_ids",
    "include_stop_str_in_output", "truncate_prompt_tokens", "length_penalty", "use_beam_search",
    "prompt_logprobs", "allowed_token_ids", "bad_words", "thinking_token_budget", "repetition_detection",
})
CHAT_FIELDS = _ACCEPTED | VLLM_EXTENSIONS | _COMMON | {
    "messages", "logprobs", "max_tokens",
    "max_completion_tokens", "n", "response_format", "reasoning_effort", "modalities",
    "prediction", "audio", "web_search_options", "verbosity", "functions", "function_call",
}
RESPONSES_FIELDS = _ACCEPTED | VLLM_EXTENSIONS | _COMMON | {
    "context_management", "access_programs", "background_options", "image",
    "input", "instructions", "max_output_tokens", "text", "reasoning", "include", "truncation",
    "background", "previous_response_id", "conversation", "prompt", "max_tool_calls",
}
# Known, but they need a store (a gateway run with --store none has none).
_STATEFUL = {
    "previous_response_id": "needs stored responses; send the whole conversation in input",
    "conversation": "needs stored conversations; send the whole conversation in input",
    "background": "background responses need stored responses",
}
# Known, but they need features a gateway in front of an engine has not.
_UNSUPPORTED = {
    "prompt": "stored prompt templates are not supported",
    "functions": "the deprecated functions field is not supported; use tools",
    "function_call": "the deprecated function_call field is not supported; use tool_choice",
    "audio": "gpt-oss has no audio output",
    "prediction": "predicted outputs are not supported",
}

_NUMBERS: dict[str, tuple[float, float]] = {
    "temperature": (0.0, 2.0), "top_p": (0.0, 1.0), "frequency_penalty": (-2.0, 2.0),
    "presence_penalty": (-2.0, 2.0), "min_p": (0.0, 1.0), "repetition_penalty": (0.0, 100.0),
}
_INTS: dict[str, tuple[int, int]] = {
    "max_tokens": (1, 2**31), "max_completion_tokens": (1, 2**31), "max_output_tokens": (1, 2**31),
    "n": (1, 128), "top_k": (-1, 2**31), "min_tokens": (0, 2**31), "seed": (-(2**63), 2**64 - 1),
    "top_logprobs": (0, 20),
}
_BOOLS = ("stream", "parallel_tool_calls", "store", "logprobs", "include_reasoning", "background")


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _check_bias(bias: Any) -> None:
    if not isinstance(bias, dict):
        raise RequestError("logit_bias", "logit_bias must be an object of token ids to numbers")
    for k, v in bias.items():
        if not (k.isdigit() and int(k) < 201088):
            raise RequestError("logit_bias",
                               f"logit_bias keys must be token ids (0 to 201087), got {shown(k)}")
        if not _number(v) or not -100 <= v <= 100:
            raise RequestError("logit_bias",
                               f"logit_bias values must be numbers from -100 to 100, got {shown(v)}")


def check_fields(request: Any, kind: str, *, stateful: bool = False) -> list[str]:
    """Reject wrong types, out-of-range values and known fields that cannot be honoured
    (``kind``: chat or responses; ``stateful``: a store is there for ``previous_response_id``,
    ``conversation``, ``background``). Returns the fields it does not know, which are ignored:
    clients send fields before the SDKs type them (the Codex CLI's ``client_metadata``).

    >>> check_fields({"messages": [], "temperature": 3}, "chat")
    Traceback (most recent call last):
    harmonykit.openai.errors.RequestError: temperature: temperature must be a number from 0 to 2, got 3
    >>> check_fields({"input": "hi", "client_metadata": {}}, "responses")
    ['client_metadata']
    """
    if not isinstance(request, dict):
        raise RequestError(None, "the request body must be a JSON object")
    known = CHAT_FIELDS if kind == "chat" else RESPONSES_FIELDS
    ignored = []
    for key, value in request.items():
        if key not in known:
            ignored.append(key)
            continue
        if key in _UNSUPPORTED and value not in (None, False):
            raise RequestError(key, f"{key} {_UNSUPPORTED[key]}")
        if key in _STATEFUL and not stateful and value not in (None, False):
            raise RequestError(key, f"{key} {_STATEFUL[key]} (this gateway runs with --store none)")
        if value is None:
            continue
        if key in _NUMBERS:
            lo, hi = _NUMBERS[key]
            if not _number(value) or not lo <= value <= hi:
                raise RequestError(key, f"{key} must be a number from {lo:g} to {hi:g}, got {shown(value)}")
        elif key in _INTS:
            lo_i, hi_i = _INTS[key]
            if not isinstance(value, int) or isinstance(value, bool) or not lo_i <= value <= hi_i:
                raise RequestError(key, f"{key} must be an integer from {lo_i} to {hi_i}, got {shown(value)}")
        elif key in _BOOLS and not isinstance(value, bool):
            raise RequestError(key, f"{key} must be true or false, got {shown(value)}")
        elif key == "logit_bias":
            _check_bias(value)
    if kind == "chat" and not isinstance(request.get("messages"), list):
        raise RequestError("messages", "messages must be a non-empty list")
    if kind == "responses" and not isinstance(request.get("input"), (str, list)):
        raise RequestError("input", "input must be a string or a list of items")
    for key in ("model", "user", "prompt_cache_key", "safety_identifier"):
        if request.get(key) is not None and not isinstance(request[key], str):
            raise RequestError(key, f"{key} must be a string")
    opts = request.get("stream_options")
    usage = opts.get("include_usage", False) if isinstance(opts, dict) else None
    if opts is not None and not isinstance(usage, bool):
        raise RequestError("stream_options",
                           'stream_options must be an object such as {"include_usage": true}')
    stop = request.get("stop")
    if stop is not None:
        stops = [stop] if isinstance(stop, str) else stop
        if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops) or len(stops) > 4:
            raise RequestError("stop", "stop must be a string or a list of at most 4 non-empty strings")
    if request.get("truncation") not in (None, "auto", "disabled"):
        raise RequestError("truncation",
                           f"truncation must be 'auto' or 'disabled', got {shown(request['truncation'])}")
    if (request.get("n") or 1) > 1 and request.get("stream"):
        raise RequestError("n", "n > 1 is supported without streaming only")
    include = request.get("include")
    if kind == "responses" and include is not None:
        if not isinstance(include, list):
            raise RequestError("include", "include must be a list")
        for i, value in enumerate(include):
            if value not in INCLUDES:
                raise RequestError(f"include[{i}]", f"unknown include value {shown(value)}; use one of "
                                                    f"{', '.join(sorted(INCLUDES))}")
    return ignored


#: The ``include`` values of the Responses API (the SDK's ``ResponseIncludable``).
INCLUDES = frozenset({
    "code_interpreter_call.outputs", "computer_call_output.output.image_url", "file_search_call.results",
    "message.input_image.image_url", "message.output_text.logprobs", "reasoning.encrypted_content",
    "web_search_call.action.sources", "web_search_call.results",
})


def sampling(request: dict[str, Any], kind: str) -> dict[str, Any]:
    """The request's sampling parameters, by their OpenAI names (and the engine extensions
    ``top_k``, ``min_p``, ``repetition_penalty``, ``min_tokens``), without the output limit
    (``output_limit``) or logprobs (``logprobs_wanted``)."""
    out: dict[str, Any] = {}
    for key in ("temperature", "top_p", "seed", "frequency_penalty", "presence_penalty", "top_k", "min_p",
                "repetition_penalty", "min_tokens", "stop", "n", "logit_bias"):
        if request.get(key) is not None:
            out[key] = request[key]
    if isinstance(out.get("stop"), str):
        out["stop"] = [out["stop"]]
    return out


def output_limit(request: dict[str, Any], kind: str) -> int | None:
    """The client's output limit: ``max_completion_tokens`` / ``max_tokens`` (Chat),
    ``max_output_tokens`` (Responses); None when it set none."""
    if kind == "responses":
        limit = request.get("max_output_tokens")
    else:
        limit = request.get("max_completion_tokens", request.get("max_tokens"))
    return limit if isinstance(limit, int) else None


def logprobs_wanted(request: dict[str, Any], kind: str) -> int | None:
    """How many top logprobs per token the client asked for (0: only the sampled token's);
    None when it asked for none. Chat: ``logprobs`` with ``top_logprobs``; Responses:
    ``top_logprobs`` or ``include: ["message.output_text.logprobs"]``."""
    top = request.get("top_logprobs")
    if kind == "chat":
        if request.get("logprobs"):
            return int(top or 0)
        if top:
            raise RequestError("top_logprobs", "top_logprobs needs logprobs: true")
        return None
    include = request.get("include") or []
    if top or (isinstance(include, list) and "message.output_text.logprobs" in include):
        return int(top or 0)
    return None
