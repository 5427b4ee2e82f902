"""Harmony output -> the Responses API: output items, or a stream of Responses events."""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

from ..encoding import HarmonyEncoding
from .request import render_responses_request
from .turn import Event, OutputStream, Turn, new_id, tool_names


class _Items:
    """Turn events -> Responses output items and streaming events (shared by both paths)."""

    def __init__(self, turn: Turn) -> None:
        self.turn = turn
        self.items: list[dict[str, Any]] = []
        self.seq = 0
        self._open: dict[str, Any] | None = None

    def _event(self, kind: str, **fields: Any) -> dict[str, Any]:
        ev = {"type": kind, "sequence_number": self.seq, **fields}
        self.seq += 1
        return ev

    def convert(self, events: Iterable[Event]) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for ev in events:
            if ev[0] == "open":
                out += self.finish_open()
                out += self._start(ev[1], ev[2])
            else:
                out += self._text(ev[3])
        return out

    def _start(self, kind: str, key: int) -> list[dict[str, Any]]:
        index = len(self.items)
        if kind == "call":
            call = self.turn.calls[key]
            item: dict[str, Any] = {"id": new_id("fc"), "type": "function_call", "call_id": call.id,
                                    "name": call.name, "arguments": "", "status": "in_progress"}
        elif kind == "reasoning":
            item = {"id": new_id("rs"), "type": "reasoning", "summary": [],
                    "content": [{"type": "reasoning_text", "text": ""}], "status": "in_progress"}
        else:
            item = {"id": new_id("msg"), "type": "message", "role": "assistant", "status": "in_progress",
                    "content": [{"type": "output_text", "text": "", "annotations": []}]}
        self.items.append(item)
        self._open = item
        out = [self._event("response.output_item.added", output_index=index, item=_copy(item, empty=True))]
        if kind != "call":
            out.append(self._event("response.content_part.added", item_id=item["id"], output_index=index,
                                   content_index=0, part=_copy(item["content"][0], empty=True)))
        return out

    def _text(self, text: str) -> list[dict[str, Any]]:
        item = self._open
        assert item is not None
        index = len(self.items) - 1
        if item["type"] == "function_call":
            item["arguments"] += text
            return [self._event("response.function_call_arguments.delta", item_id=item["id"],
                                output_index=index, delta=text)]
        item["content"][0]["text"] += text
        if item["type"] == "reasoning":
            return [self._event("response.reasoning_text.delta", item_id=item["id"], output_index=index,
                                content_index=0, delta=text)]
        return [self._event("response.output_text.delta", item_id=item["id"], output_index=index,
                            content_index=0, delta=text, logprobs=[])]

    def finish_open(self) -> list[dict[str, Any]]:
        item = self._open
        if item is None:
            return []
        self._open = None
        index = len(self.items) - 1
        item["status"] = "completed"
        out = []
        if item["type"] == "function_call":
            out.append(self._event("response.function_call_arguments.done", item_id=item["id"],
                                   output_index=index, arguments=item["arguments"]))
        else:
            part = item["content"][0]
            if item["type"] == "reasoning":
                out.append(self._event("response.reasoning_text.done", item_id=item["id"], output_index=index,
                                       content_index=0, text=part["text"]))
            else:
                out.append(self._event("response.output_text.done", item_id=item["id"], output_index=index,
                                       content_index=0, text=part["text"], logprobs=[]))
            out.append(self._event("response.content_part.done", item_id=item["id"], output_index=index,
                                   content_index=0, part=dict(part)))
        out.append(self._event("response.output_item.done", output_index=index, item=_copy(item)))
        return out


def _function_tools(tools: Any) -> list[dict[str, Any]]:
    """The request's function tools in the Responses shape (Chat's nested shape accepted)."""
    out = []
    for t in tools if isinstance(tools, list) else []:
        fn = t.get("function") if isinstance(t, dict) and isinstance(t.get("function"), dict) else t
        if isinstance(fn, dict) and isinstance(fn.get("name"), str):
            out.append({"type": "function", "name": fn["name"], "description": fn.get("description"),
                        "parameters": fn.get("parameters"), "strict": fn.get("strict")})
    return out


def _copy(obj: dict[str, Any], empty: bool = False) -> dict[str, Any]:
    out = {k: ([_copy(v, empty) for v in val] if isinstance(val, list) and k == "content" else val)
           for k, val in obj.items()}
    if empty:
        if "text" in out:
            out["text"] = ""
        if "arguments" in out:
            out["arguments"] = ""
    return out


def completion_to_response_output(
    encoding: HarmonyEncoding,
    tokens: Iterable[int],
    *,
    request: dict[str, Any] | None = None,
    finish_reason: str = "stop",
) -> list[dict[str, Any]]:
    """Responses API output items (reasoning, message, function_call) for an output.

    >>> from harmonykit import load_harmony_encoding
    >>> enc = load_harmony_encoding("HarmonyGptOss")
    >>> toks = enc.encode("<|channel|>final<|message|>Hi<|return|>", allowed_special="all")
    >>> [(i["type"], i["content"][0]["text"]) for i in completion_to_response_output(enc, toks)]
    [('message', 'Hi')]
    """
    turn = Turn(encoding, tool_names(request))
    items = _Items(turn)
    items.convert(turn.feed(tokens))
    events, _ = turn.close(finish_reason)
    items.convert(events)
    items.finish_open()
    return items.items


class ResponsesStream(OutputStream):
    """Responses streaming events for an output streamed token by token.

    ``feed`` returns events (``response.created`` and ``response.in_progress``
    first, then items and their deltas); ``close(finish_reason)`` ends the open
    item and returns ``response.completed`` (or ``response.incomplete`` when
    the engine hit its token limit) carrying the whole response, with the
    ``harmony`` extension field.
    """

    id_prefix = "resp"

    def __init__(
        self,
        encoding: HarmonyEncoding,
        *,
        request: dict[str, Any] | None = None,
        id: str | None = None,
        model: str | None = None,
        created_at: float | None = None,
        prompt_tokens: int | None = None,
    ) -> None:
        super().__init__(encoding, render_responses_request, request=request, id=id, model=model,
                         prompt_tokens=prompt_tokens)
        self.created_at = created_at if created_at is not None else time.time()
        self._items = _Items(self.turn)

    def response(self, status: str, output: list[dict[str, Any]]) -> dict[str, Any]:
        """The ``Response`` object at this point of the stream."""
        tool_choice = self.request.get("tool_choice", "auto")
        out: dict[str, Any] = {
            "id": self.id, "object": "response", "created_at": self.created_at, "model": self.model,
            "status": status, "output": output, "parallel_tool_calls": False,
            "tool_choice": tool_choice if isinstance(tool_choice, (str, dict)) else "auto",
            "tools": _function_tools(self.request.get("tools")),
            "error": None, "incomplete_details": None, "instructions": self.request.get("instructions"),
            "metadata": {},
        }
        if status == "incomplete":
            out["incomplete_details"] = {"reason": "max_output_tokens"}
        return out

    def feed(self, token_ids: Iterable[int]) -> list[dict[str, Any]]:
        out = []
        if not self.started:
            self.started = True
            out.append(self._items._event("response.created", response=self.response("in_progress", [])))
            out.append(self._items._event("response.in_progress", response=self.response("in_progress", [])))
        return out + self._items.convert(self.events(token_ids))

    def close(self, finish_reason: str = "stop") -> list[dict[str, Any]]:
        out = self.feed([])
        events, reason = self.turn.close(finish_reason)
        out += self._items.convert(events)
        out += self._items.finish_open()
        status = "incomplete" if reason == "length" else "completed"
        response = self.response(status, [dict(i) for i in self._items.items])
        prompt = self.prompt_tokens()
        response["usage"] = {
            "input_tokens": prompt, "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
            "output_tokens": self.output_tokens, "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": prompt + self.output_tokens,
        }
        response["harmony"] = self.turn.extension()
        out.append(self._items._event(f"response.{status}", response=response))
        return out
