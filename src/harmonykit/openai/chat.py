"""Harmony output -> Chat Completions: one choice, or a stream of ``chat.completion.chunk``s."""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from typing import Any

from ..encoding import HarmonyEncoding
from .names import declared_names
from .request import render_chat_request
from .turn import Event, OutputStream, Turn, new_id

_FIELDS = {"reasoning": "reasoning_content", "content": "content"}


class _Deltas:
    """Turn events -> Chat ``delta`` objects (shared by the stream and the one-shot choice)."""

    def __init__(self, turn: Turn, request: dict[str, Any] | None = None) -> None:
        self.turn = turn
        # vLLM's include_reasoning: false leaves reasoning out of the answer.
        self.reasoning = (request or {}).get("include_reasoning") is not False
        self.kinds: set[str] = set()
        self.call_index: dict[int, int] = {}

    def convert(self, events: Iterable[Event]) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for ev in events:
            kind, key = ev.kind, ev.key
            if ev.op == "builtin" or kind == "code" or (kind == "reasoning" and not self.reasoning):
                continue  # Chat has no item for built-in tools: they are in the harmony field
            if ev.op == "open":
                if kind == "call":
                    call = self.turn.calls[key]
                    self.call_index[key] = index = len(self.call_index)
                    out.append({"tool_calls": [{"index": index, "id": call.id, "type": "function",
                                                "function": {"name": call.name, "arguments": ""}}]})
                elif kind in self.kinds:
                    out.append({_FIELDS[kind]: "\n\n"})  # a second message of the same kind
                self.kinds.add(kind)
            elif kind == "call":
                index = self.call_index[key]
                out.append({"tool_calls": [{"index": index, "function": {"arguments": ev.text}}]})
            else:
                out.append({_FIELDS[kind]: ev.text})
        return out


def merge_deltas(deltas: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """Concatenate Chat deltas into a message, as a client does."""
    content: list[str] = []
    reasoning: list[str] = []
    calls: dict[int, tuple[dict[str, Any], list[str], list[str]]] = {}  # call, name and argument pieces
    for d in deltas:
        if d.get("content"):
            content.append(d["content"])
        if d.get("reasoning_content"):
            reasoning.append(d["reasoning_content"])
        for tc in d.get("tool_calls") or []:
            call, name, arguments = calls.setdefault(tc["index"], ({"id": None, "type": "function"}, [], []))
            if tc.get("id"):
                call["id"] = tc["id"]
            fn = tc.get("function") or {}
            name.append(fn.get("name") or "")
            arguments.append(fn.get("arguments") or "")
    message: dict[str, Any] = {"role": "assistant", "content": "".join(content) or None,
                               "reasoning_content": "".join(reasoning) or None}
    if calls:
        message["tool_calls"] = [
            {**call, "function": {"name": "".join(name), "arguments": "".join(arguments)}}
            for call, name, arguments in (calls[i] for i in sorted(calls))]
    return message


def completion_to_chat_choice(
    encoding: HarmonyEncoding,
    tokens: Iterable[int],
    *,
    request: dict[str, Any] | None = None,
    finish_reason: str = "stop",
    index: int = 0,
) -> dict[str, Any]:
    """One Chat Completions choice from an engine's output tokens.

    ``finish_reason`` is what the engine reported (``"stop"`` or ``"length"``; see
    ``FINISH_REASONS``); the stop token may or may not end ``tokens``. Repairs and
    notes are in ``choice["harmony"]`` (see docs/openai.md).

    >>> from harmonykit import load_harmony_encoding
    >>> enc = load_harmony_encoding("HarmonyGptOss")
    >>> toks = enc.encode("<|channel|>analysis<|message|>Easy.<|end|><|start|>assistant"
    ...                   "<|channel|>final<|message|>4<|return|>", allowed_special="all")
    >>> c = completion_to_chat_choice(enc, toks)
    >>> c["message"]["content"], c["message"]["reasoning_content"], c["finish_reason"]
    ('4', 'Easy.', 'stop')
    """
    return _choice(encoding, tokens, request, finish_reason, index)[0]


def _choice(encoding: HarmonyEncoding, tokens: Iterable[int], request: dict[str, Any] | None,
            finish_reason: str, index: int) -> tuple[dict[str, Any], Turn]:
    if not isinstance(encoding, HarmonyEncoding):
        raise TypeError(f"encoding must be a HarmonyEncoding, got {type(encoding).__name__}")
    turn = Turn(encoding, declared_names(request))
    deltas = _Deltas(turn, request)
    out = deltas.convert(turn.feed(tokens))
    events, reason = turn.close(finish_reason)
    out += deltas.convert(events)
    choice = {"index": index, "message": {**merge_deltas(out), "refusal": None}, "finish_reason": reason,
              "logprobs": None, "harmony": turn.extension()}
    return choice, turn


def completion_to_chat_completion(
    encoding: HarmonyEncoding,
    outputs: Iterable[int] | Sequence[tuple[Sequence[int], str]],
    *,
    request: dict[str, Any] | None = None,
    finish_reason: str = "stop",
    id: str | None = None,
    model: str | None = None,
    created: int | None = None,
    prompt_tokens: int | None = None,
) -> dict[str, Any]:
    """A whole ``chat.completion`` object: choices, usage (reasoning tokens counted).

    ``outputs`` is one output's token ids, or ``(token ids, finish_reason)`` per choice
    (``n`` > 1). ``prompt_tokens`` is rendered from ``request`` when not given.

    >>> from harmonykit import load_harmony_encoding
    >>> enc = load_harmony_encoding("HarmonyGptOss")
    >>> toks = enc.encode("<|channel|>final<|message|>4<|return|>", allowed_special="all")
    >>> c = completion_to_chat_completion(enc, toks, request={"messages": [{"role": "user", "content": ""}]})
    >>> c["object"], c["choices"][0]["message"]["content"], c["usage"]["completion_tokens"]
    ('chat.completion', '4', 5)
    """
    items: list[Any] = list(outputs)
    runs: list[tuple[list[int], str]] = [(list(t), r) for t, r in items] \
        if items and isinstance(items[0], tuple) else [(items, finish_reason)]
    choices, completion, reasoning = [], 0, 0
    for index, (tokens, reason) in enumerate(runs):
        choice, turn = _choice(encoding, tokens, request, reason, index)
        choices.append(choice)
        completion += len(tokens)
        reasoning += turn.reasoning_tokens
    if prompt_tokens is None:
        prompt_tokens = len(render_chat_request(encoding, request).tokens) if request else 0
    return {"id": id or new_id("chatcmpl"), "object": "chat.completion",
            "created": created if created is not None else int(time.time()),
            "model": model or (request or {}).get("model") or "gpt-oss", "choices": choices,
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion,
                      "total_tokens": prompt_tokens + completion,
                      "completion_tokens_details": {"reasoning_tokens": reasoning}}}


def content_logprobs(encoding: HarmonyEncoding, tokens: Sequence[int],
                     entries: Sequence[dict[str, Any] | None],
                     request: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """The logprob entries of the tokens whose text is the answer (``content``), in order:
    what a Chat choice's ``logprobs.content`` holds (``entries[i]`` belongs to ``tokens[i]``)."""
    stream = ChatCompletionStream(encoding, request=request, prompt_tokens=0)
    return [entry for chunk in stream.feed_logprobs(tokens, entries) if chunk["choices"]
            for entry in (chunk["choices"][0].get("logprobs") or {}).get("content") or []]


class ChatCompletionStream(OutputStream):
    """``chat.completion.chunk`` payloads for an output streamed token by token.

    ``feed(token_ids)`` returns the chunks those tokens produce (the first one
    carries the role); ``close(finish_reason)`` the last ones: a chunk with the
    finish reason and the ``harmony`` extension, then usage when the request
    asked for it (``stream_options.include_usage``). Concatenating the deltas
    gives exactly ``completion_to_chat_choice``'s message.
    """

    id_prefix = "chatcmpl"

    def __init__(
        self,
        encoding: HarmonyEncoding,
        *,
        request: dict[str, Any] | None = None,
        id: str | None = None,
        model: str | None = None,
        created: int | None = None,
        prompt_tokens: int | None = None,
    ) -> None:
        super().__init__(encoding, render_chat_request, request=request, id=id, model=model,
                         prompt_tokens=prompt_tokens)
        self.created = created if created is not None else int(time.time())
        self._deltas = _Deltas(self.turn, request)

    def _chunk(self, delta: dict[str, Any], finish_reason: str | None = None) -> dict[str, Any]:
        return {"id": self.id, "object": "chat.completion.chunk", "created": self.created,
                "model": self.model,
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason, "logprobs": None}]}

    def feed(self, token_ids: Iterable[int]) -> list[dict[str, Any]]:
        chunks = []
        if not self.started:
            self.started = True
            chunks.append(self._chunk({"role": "assistant", "content": ""}))
        return chunks + [self._chunk(d) for d in self._deltas.convert(self.turn.feed(token_ids))]

    def feed_logprobs(self, token_ids: Sequence[int], entries: Sequence[dict[str, Any] | None]
                      ) -> list[dict[str, Any]]:
        """``feed``, token by token, with each token's logprob entry (``entries[i]``, a Chat
        ``logprobs.content`` item) on the chunk where that token's answer text appears.
        Reasoning and call tokens carry none, as OpenAI's answers show only the answer's."""
        chunks: list[dict[str, Any]] = []
        for i, token in enumerate(token_ids):
            got = self.feed([token])
            entry = entries[i] if i < len(entries) else None
            if entry is not None:
                for chunk in got:
                    if chunk["choices"] and chunk["choices"][0]["delta"].get("content"):
                        chunk["choices"][0]["logprobs"] = {"content": [entry], "refusal": None}
                        break
            chunks += got
        return chunks

    def fail(self, message: str, code: str = "upstream_error") -> list[dict[str, Any]]:
        """How the stream ends when the engine fails midway: a last chunk whose
        ``finish_reason`` is ``"error"`` (never a success), then an ``{"error": ...}`` payload,
        which the ``openai`` client raises as an ``APIError``. Nothing can follow."""
        self.turn.abort()
        return [self._chunk({}, "error"),
                {"error": {"message": message, "type": "api_error", "param": None, "code": code}}]

    def close(self, finish_reason: str = "stop") -> list[dict[str, Any]]:
        """The last chunks; closing again returns none (there is one finish chunk)."""
        if self.turn.closed:
            self.turn.close(finish_reason)  # still checks the value
            return []
        chunks = self.feed([])
        events, reason = self.turn.close(finish_reason)
        chunks += [self._chunk(d) for d in self._deltas.convert(events)]
        last = self._chunk({}, reason)
        last["choices"][0]["harmony"] = self.turn.extension()
        chunks.append(last)
        if (self.request.get("stream_options") or {}).get("include_usage"):
            prompt = self.prompt_tokens()
            chunks.append({"id": self.id, "object": "chat.completion.chunk", "created": self.created,
                           "model": self.model, "choices": [],
                           "usage": {"prompt_tokens": prompt, "completion_tokens": self.output_tokens,
                                     "total_tokens": prompt + self.output_tokens,
                                     "completion_tokens_details": {
                                         "reasoning_tokens": self.turn.reasoning_tokens}}})
        return chunks
