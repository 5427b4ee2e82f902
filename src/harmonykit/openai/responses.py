"""Harmony output -> the Responses API: a whole ``Response``, its output items, or its stream."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Iterable
from typing import Any

from ..encoding import HarmonyEncoding
from .hosted import McpNamespace, namespace_of
from .request import render_responses_request
from .turn import Event, OutputStream, Turn, new_id

# A citation of a browser page, as the model was trained to write it: 【{cursor}†L{a}(-L{b})?】
CITATION = re.compile(r"【(\d+)†L(\d+)(?:-L(\d+))?】")

_INCOMPLETE = {"length": "max_output_tokens", "content_filter": "content_filter"}


class _Items:
    """Turn events -> Responses output items and streaming events (shared by both paths).

    Text grows in a list per open item and is joined once, when the item is done.
    """

    def __init__(self, turn: Turn) -> None:
        self.turn = turn
        self.items: list[dict[str, Any]] = []
        self.seq = 0
        self._open: dict[str, Any] | None = None
        self._key = 0
        self._parts: list[str] = []
        # Set by the agent loop when the gateway runs built-in tools: whether it will run a call
        # (its item then stays open until the result is in), the container python calls run in,
        # and the annotations of an answer's citations.
        self.will_run: Callable[[dict[str, Any]], bool] | None = None
        self.container_id = ""
        self.annotate: Callable[[str], list[dict[str, Any]]] | None = None
        # whether an MCP call waits for the client's approval (its item is then the request for it)
        self.needs_approval: Callable[[dict[str, Any]], bool] | None = None
        # include reasoning.encrypted_content: how a reasoning item's text is sealed for the client
        self.seal: Callable[[str], str] | None = None
        self.pending: dict[str, Any] | None = None
        # the request's namespace tools: a call of NS.TOOL is the client's, returned with its namespace
        self.spaces: set[str] = set()

    def event(self, kind: str, **fields: Any) -> dict[str, Any]:
        ev = {"type": kind, "sequence_number": self.seq, **fields}
        self.seq += 1
        return ev

    def convert(self, events: Iterable[Event]) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for ev in events:
            if ev.op == "open":
                out += self.finish_open()
                out += self._start(ev.kind, ev.key)
            elif ev.op == "builtin":
                out += self._builtin(ev.key)
            else:
                out += self._text(ev.text)
        return out

    def _start(self, kind: str, key: int) -> list[dict[str, Any]]:
        index = len(self.items)
        if kind == "call":
            call = self.turn.calls[key]
            item: dict[str, Any] = {"id": new_id("fc"), "type": "function_call", "call_id": call.id,
                                    "name": call.name, "arguments": "", "status": "in_progress"}
            space, dot, name = call.name.partition(".")
            if dot and space in self.spaces:  # a tool of one of the request's namespaces
                item["name"], item["namespace"] = name, space
        elif kind == "code":
            item = {"id": new_id("ci"), "type": "code_interpreter_call", "code": "",
                    "container_id": self.container_id, "outputs": None, "status": "in_progress"}
        elif kind == "reasoning":
            item = {"id": new_id("rs"), "type": "reasoning", "summary": [],
                    "content": [{"type": "reasoning_text", "text": ""}], "status": "in_progress"}
        else:
            item = {"id": new_id("msg"), "type": "message", "role": "assistant", "status": "in_progress",
                    "content": [{"type": "output_text", "text": "", "annotations": []}]}
        self.items.append(item)
        self._open, self._key, self._parts = item, key, []
        out = [self.event("response.output_item.added", output_index=index, item=_copy(item))]
        if kind == "code":
            out.append(self.event("response.code_interpreter_call.in_progress", item_id=item["id"],
                                  output_index=index))
        elif kind != "call":
            out.append(self.event("response.content_part.added", item_id=item["id"], output_index=index,
                                  content_index=0, part=_copy(item["content"][0])))
        return out

    def _text(self, text: str) -> list[dict[str, Any]]:
        item = self._open
        assert item is not None
        self._parts.append(text)
        index = len(self.items) - 1
        if item["type"] == "function_call":
            return [self.event("response.function_call_arguments.delta", item_id=item["id"],
                               output_index=index, delta=text)]
        if item["type"] == "code_interpreter_call":
            return [self.event("response.code_interpreter_call_code.delta", item_id=item["id"],
                               output_index=index, delta=text)] if text else []
        if item["type"] == "reasoning":
            return [self.event("response.reasoning_text.delta", item_id=item["id"], output_index=index,
                               content_index=0, delta=text)]
        return [self.event("response.output_text.delta", item_id=item["id"], output_index=index,
                           content_index=0, delta=text, logprobs=[])]

    def finish_open(self) -> list[dict[str, Any]]:
        item = self._open
        if item is None:
            return []
        self._open = None
        index = len(self.items) - 1
        item["status"] = "incomplete" if self._key in self.turn.incomplete else "completed"
        text = "".join(self._parts)
        out = []
        if item["type"] == "code_interpreter_call":  # python's code, when no call ended it
            item["code"] = text
            out.append(self.event("response.code_interpreter_call_code.done", item_id=item["id"],
                                  output_index=index, code=text))
        elif item["type"] == "function_call":
            item["arguments"] = text
            out.append(self.event("response.function_call_arguments.done", item_id=item["id"],
                                  output_index=index, name=item["name"], arguments=text))
        else:
            part = item["content"][0]
            part["text"] = text
            if item["type"] == "reasoning" and self.seal is not None:
                item["encrypted_content"] = self.seal(text)
            if item["type"] == "reasoning":
                out.append(self.event("response.reasoning_text.done", item_id=item["id"], output_index=index,
                                      content_index=0, text=text))
            else:
                if self.annotate is not None:
                    for n, note in enumerate(self.annotate(text)):
                        part["annotations"].append(note)
                        out.append(self.event("response.output_text.annotation.added", item_id=item["id"],
                                              output_index=index, content_index=0, annotation_index=n,
                                              annotation=dict(note)))
                out.append(self.event("response.output_text.done", item_id=item["id"], output_index=index,
                                      content_index=0, text=text, logprobs=[]))
            out.append(self.event("response.content_part.done", item_id=item["id"], output_index=index,
                                  content_index=0, part=dict(part)))
        out.append(self.event("response.output_item.done", output_index=index, item=_copy(item)))
        return out

    def _builtin(self, key: int) -> list[dict[str, Any]]:
        """A built-in tool call as the API's own item, where one fits (else only the harmony
        field). One the gateway will run stays open (``pending``) until ``complete`` gives its
        result; python's item is open already, its code streamed."""
        call = self.turn.builtin_calls[key]
        made = builtin_item(call)
        open_code = self._open is not None and self._open["type"] == "code_interpreter_call"
        out: list[dict[str, Any]] = []
        if open_code and made is not None and made["type"] == "code_interpreter_call":
            item = self._open
            assert item is not None
            self._open = None
            index = len(self.items) - 1
            item["code"] = made["code"]
            item["harmony"] = made["harmony"]
            out.append(self.event("response.code_interpreter_call_code.done", item_id=item["id"],
                                  output_index=index, code=item["code"]))
            status = made["status"]
        else:
            out += self.finish_open()
            if made is None and self.will_run is not None and self.will_run(call):
                # A call the tool runs though the item cannot show what it asked (arguments that
                # are not JSON, a browser function that does not exist): the model gets an error.
                made = {"id": new_id("ws"), "type": "web_search_call", "status": "completed",
                        "action": {"type": "search", "query": None}, "harmony": _written(call)}
            if made is None:
                return out
            asks = self.needs_approval if made["type"] == "mcp_call" else None
            if asks is not None and made["status"] == "completed" and asks(call):
                # the response ends asking for the call's approval
                fields = {k: made[k] for k in ("server_label", "name", "arguments", "harmony")}
                return out + self.ready({"id": new_id("mcpr"), "type": "mcp_approval_request", **fields})
            item, status, index = made, made["status"], len(self.items)
            item["status"] = "in_progress"
            self.items.append(item)
            out.append(self.event("response.output_item.added", output_index=index, item=_copy(item)))
            if item["type"] == "mcp_call":
                out += [self.on("response.mcp_call.in_progress", item, index),
                        self.on("response.mcp_call_arguments.delta", item, index, delta=item["arguments"]),
                        self.on("response.mcp_call_arguments.done", item, index, arguments=item["arguments"])]
            if item["type"] == "code_interpreter_call":
                item["container_id"] = self.container_id
                out += [self.on("response.code_interpreter_call.in_progress", item, index),
                        self.on("response.code_interpreter_call_code.delta", item, index, delta=item["code"]),
                        self.on("response.code_interpreter_call_code.done", item, index, code=item["code"])]
        if self.will_run is not None and status == "completed" and self.will_run(call):
            self.pending = item
            if item["type"] == "web_search_call":
                out.append(self.on("response.web_search_call.in_progress", item, index))
            return out
        item["status"] = status
        out.append(self.event("response.output_item.done", output_index=index, item=_copy(item)))
        return out

    def on(self, kind: str, item: dict[str, Any], index: int, **fields: Any) -> dict[str, Any]:
        """An event about an item (its id and output index)."""
        return self.event(kind, item_id=item["id"], output_index=index, **fields)

    def ready(self, item: dict[str, Any]) -> list[dict[str, Any]]:
        """An item made whole (an MCP server's listing, a call run on approval before the first
        step, an approval request), with the events its kind has."""
        index = len(self.items)
        self.items.append(item)
        kind = item["type"]
        out = [self.event("response.output_item.added", output_index=index, item=_copy(item))]
        if kind in ("mcp_list_tools", "mcp_call"):
            out.append(self.on(f"response.{kind}.in_progress", item, index))
            if kind == "mcp_call":
                out.append(self.on("response.mcp_call_arguments.done", item, index,
                                   arguments=item["arguments"]))
            end = "failed" if item.get("error") else "completed"
            out.append(self.on(f"response.{kind}.{end}", item, index))
        out.append(self.event("response.output_item.done", output_index=index, item=_copy(item)))
        return out

    def running(self) -> list[dict[str, Any]]:
        """The pending call's tool starts: ``interpreting`` / ``searching``."""
        item = self.pending
        assert item is not None
        index = self.items.index(item)
        if item["type"] == "code_interpreter_call":
            item["status"] = "interpreting"
            return [self.event("response.code_interpreter_call.interpreting", item_id=item["id"],
                               output_index=index)]
        if item["type"] == "mcp_call":
            item["status"] = "calling"  # its in_progress event went out with the call
            return []
        item["status"] = "searching"
        return [self.event("response.web_search_call.searching", item_id=item["id"], output_index=index)]

    def complete(self, fields: dict[str, Any], failed: bool = False) -> list[dict[str, Any]]:
        """The pending call's tool ended: its item takes ``fields`` (outputs, action, ...) and is done."""
        item, self.pending = self.pending, None
        assert item is not None
        index = self.items.index(item)
        for key, value in fields.items():
            if key == "harmony":
                item["harmony"] = {**item.get("harmony", {}), **value}
            else:
                item[key] = value
        item["status"] = "failed" if failed else "completed"
        kind = item["type"] if item["type"] in ("code_interpreter_call", "mcp_call") else "web_search_call"
        end = "failed" if failed and kind == "mcp_call" else "completed"
        return [self.event(f"response.{kind}.{end}", item_id=item["id"], output_index=index),
                self.event("response.output_item.done", output_index=index, item=_copy(item))]


def builtin_item(call: dict[str, Any]) -> dict[str, Any] | None:
    """``web_search_call`` for browser.search / open / find, ``code_interpreter_call`` for python."""
    recipient, body = call.get("tool") or call["recipient"], call["arguments"]
    status = "incomplete" if call.get("incomplete") else "completed"
    written = _written(call)
    if call.get("mcp"):
        label, name = call["mcp"]
        return {"id": new_id("mcp"), "type": "mcp_call", "server_label": label, "name": name,
                "arguments": body, "output": None, "error": None, "status": status, "harmony": written}
    if recipient == "python":
        return {"id": new_id("ci"), "type": "code_interpreter_call", "code": body, "container_id": "",
                "outputs": None, "status": status, "harmony": written}
    try:
        args = json.loads(body)
    except ValueError:
        return None
    if not isinstance(args, dict):
        return None
    action: dict[str, Any] | None = None
    if recipient == "browser.search" and isinstance(args.get("query"), str):
        action = {"type": "search", "query": args["query"]}
    elif recipient == "browser.open":
        url = args.get("id")
        action = {"type": "open_page", "url": url if isinstance(url, str) and "://" in url else None}
    elif recipient == "browser.find" and isinstance(args.get("pattern"), str):
        action = {"type": "find_in_page", "pattern": args["pattern"], "url": ""}
    if action is None:
        return None
    return {"id": new_id("ws"), "type": "web_search_call", "action": action, "status": status,
            "harmony": written}


def _written(call: dict[str, Any]) -> dict[str, Any]:
    """How the model wrote a call, so that replaying its item as input renders it back exactly."""
    return {k: call.get(k) for k in ("recipient", "channel", "content_type", "arguments")}


def _function_tools(tools: Any) -> list[dict[str, Any]]:
    """The request's tools in the Responses shape (Chat's nested shape accepted): functions,
    and hosted tools as the request gave them."""
    out = []
    for t in tools if isinstance(tools, list) else []:
        if isinstance(t, dict) and t.get("type") == "namespace":
            out.append(dict(t))
            continue
        if namespace_of(t) is not None:  # as given, less the secrets an MCP server is reached with
            out.append({k: v for k, v in t.items() if k not in ("headers", "authorization")})
            continue
        fn = t.get("function") if isinstance(t, dict) and isinstance(t.get("function"), dict) else t
        if isinstance(fn, dict) and isinstance(fn.get("name"), str):
            out.append({"type": "function", "name": fn["name"], "description": fn.get("description"),
                        "parameters": fn.get("parameters"), "strict": fn.get("strict")})
    return out


def _copy(obj: dict[str, Any]) -> dict[str, Any]:
    return {k: ([_copy(v) for v in val] if isinstance(val, list) and k == "content" else val)
            for k, val in obj.items()}


class ResponsesStream(OutputStream):
    """Responses streaming events for an output streamed token by token.

    ``feed`` returns events (``response.created`` and ``response.in_progress``
    first, then items and their deltas); ``close(finish_reason)`` ends the open
    item and returns ``response.completed`` (or ``response.incomplete`` when
    the engine hit its token limit) carrying the whole response, with usage and
    the ``harmony`` extension field. Closing again returns nothing.
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
        mcp: tuple[McpNamespace, ...] = (),
        prelude: list[dict[str, Any]] | None = None,
    ) -> None:
        super().__init__(encoding, render_responses_request, request=request, id=id, model=model,
                         prompt_tokens=prompt_tokens, mcp=mcp)
        self._prelude = prelude or []  # items made before the first step (MCP listings, approved calls)
        self.created_at = created_at if created_at is not None else time.time()
        self._items = _Items(self.turn)
        tools = self.request.get("tools")
        self._items.spaces = {t["name"] for t in tools if isinstance(t, dict) and t.get("type") == "namespace"
                              and isinstance(t.get("name"), str)} if isinstance(tools, list) else set()
        self.steps: list[Turn] = []  # the turns before this one, when the gateway ran tools between
        self._step_prompts = 0  # their prompts' tokens

    @property
    def items(self) -> _Items:
        """The output items and what makes their events (the agent loop drives its tool calls)."""
        return self._items

    @property
    def output_tokens(self) -> int:
        return sum(t.output_tokens for t in self.steps) + self.turn.output_tokens

    def end_step(self, finish_reason: str = "stop") -> list[dict[str, Any]]:
        """The engine's output for this step ended at a built-in call the gateway runs: the
        events it still makes (the call's item stays pending); the response goes on."""
        out = self.feed([])
        events, _ = self.turn.close(finish_reason)
        return out + self._items.convert(events)

    def next_step(self, prompt_tokens: int) -> None:
        """The engine generates again (after a tool's result), from a prompt of ``prompt_tokens``."""
        assert self.turn.closed, "end_step() first"
        self._step_prompts += self.prompt_tokens()
        self.steps.append(self.turn)
        self.turn = Turn(self._encoding, self.turn.names, hosted=self.turn.hosted, mcp=self.turn.mcp)
        self._items.turn = self.turn
        self._prompt_tokens = prompt_tokens

    def extension(self) -> dict[str, Any]:
        """The ``harmony`` field over every step: repairs, notes and built-in calls in order."""
        if not self.steps:
            return self.turn.extension()
        out: dict[str, Any] = {"repairs": []}
        for turn in [*self.steps, self.turn]:
            for key, value in turn.extension().items():
                out.setdefault(key, [])
                out[key] += value
        out["steps"] = len(self.steps) + 1
        return out

    def response(self, status: str, output: list[dict[str, Any]]) -> dict[str, Any]:
        """The ``Response`` object at this point of the stream."""
        tool_choice = self.request.get("tool_choice", "auto")
        out: dict[str, Any] = {
            "id": self.id, "object": "response", "created_at": self.created_at, "model": self.model,
            "status": status, "output": output,
            "parallel_tool_calls": self.request.get("parallel_tool_calls") is not False,
            "tool_choice": tool_choice if isinstance(tool_choice, (str, dict)) else "auto",
            "tools": _function_tools(self.request.get("tools")),
            "error": None, "incomplete_details": None, "instructions": self.request.get("instructions"),
            "metadata": self.request.get("metadata") or {},
        }
        # Echo what the request set, as OpenAI does (a null where it set nothing).
        for key in ("max_output_tokens", "temperature", "top_p", "top_logprobs", "user", "truncation",
                    "previous_response_id"):
            out[key] = self.request.get(key)
        out["background"] = bool(self.request.get("background"))
        conversation = self.request.get("conversation")
        if conversation is not None:
            cid = conversation.get("id") if isinstance(conversation, dict) else conversation
            out["conversation"] = {"id": cid}
        return out

    def feed(self, token_ids: Iterable[int]) -> list[dict[str, Any]]:
        out = []
        if not self.started:
            self.started = True
            out.append(self._items.event("response.created", response=self.response("in_progress", [])))
            out.append(self._items.event("response.in_progress", response=self.response("in_progress", [])))
            for item in self._prelude:
                out += self._items.ready(item)
        return out + self._items.convert(self.turn.feed(token_ids))

    def fail(self, message: str, code: str = "server_error") -> list[dict[str, Any]]:
        """How the stream ends when the engine fails midway: ``response.failed``, carrying
        what was produced so far and the error. Nothing can follow."""
        self.turn.abort()
        response = self.response("failed", [_copy(i) for i in self._items.items])
        response["error"] = {"code": code, "message": message}
        return [self._items.event("response.failed", response=response)]

    def close(self, finish_reason: str = "stop") -> list[dict[str, Any]]:
        if self.turn.closed:
            self.turn.close(finish_reason)  # still checks the value
            return []
        out = self.feed([])
        events, reason = self.turn.close(finish_reason)
        out += self._items.convert(events)
        out += self._items.finish_open()
        status = "incomplete" if reason in _INCOMPLETE else "completed"
        response = self.response(status, [_copy(i) for i in self._items.items])
        if status == "incomplete":
            response["incomplete_details"] = {"reason": _INCOMPLETE[reason]}
        prompt = self._step_prompts + self.prompt_tokens()
        reasoning = sum(t.reasoning_tokens for t in self.steps) + self.turn.reasoning_tokens
        response["usage"] = {
            "input_tokens": prompt, "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
            "output_tokens": self.output_tokens,
            "output_tokens_details": {"reasoning_tokens": reasoning},
            "total_tokens": prompt + self.output_tokens,
        }
        response["harmony"] = self.extension()
        out.append(self._items.event(f"response.{status}", response=response))
        return out


def completion_to_response(
    encoding: HarmonyEncoding,
    tokens: Iterable[int],
    *,
    request: dict[str, Any] | None = None,
    finish_reason: str = "stop",
    id: str | None = None,
    model: str | None = None,
    prompt_tokens: int | None = None,
    created_at: float | None = None,
) -> dict[str, Any]:
    """A whole Responses API ``Response`` for an engine's output: id, status
    (``completed``, or ``incomplete`` with ``incomplete_details``), output items,
    usage (reasoning tokens counted) and the ``harmony`` extension field.

    It is the last event of a ``ResponsesStream`` fed all tokens at once.

    >>> from harmonykit import load_harmony_encoding
    >>> enc = load_harmony_encoding("HarmonyGptOss")
    >>> toks = enc.encode("<|channel|>analysis<|message|>Easy.<|end|><|start|>assistant"
    ...                   "<|channel|>final<|message|>Hi<|return|>", allowed_special="all")
    >>> r = completion_to_response(enc, toks, request={"input": "Say hi"})
    >>> r["status"], [i["type"] for i in r["output"]], r["usage"]["output_tokens_details"]
    ('completed', ['reasoning', 'message'], {'reasoning_tokens': 6})
    """
    stream = ResponsesStream(encoding, request=request, id=id, model=model, prompt_tokens=prompt_tokens,
                             created_at=created_at)
    stream.feed(tokens)
    response: dict[str, Any] = stream.close(finish_reason)[-1]["response"]
    return response


def completion_to_response_output(
    encoding: HarmonyEncoding,
    tokens: Iterable[int],
    *,
    request: dict[str, Any] | None = None,
    finish_reason: str = "stop",
) -> list[dict[str, Any]]:
    """The Responses output items alone (reasoning, message, function_call, built-in calls).

    >>> from harmonykit import load_harmony_encoding
    >>> enc = load_harmony_encoding("HarmonyGptOss")
    >>> toks = enc.encode("<|channel|>final<|message|>Hi<|return|>", allowed_special="all")
    >>> [(i["type"], i["content"][0]["text"]) for i in completion_to_response_output(enc, toks)]
    [('message', 'Hi')]
    """
    output: list[dict[str, Any]] = completion_to_response(
        encoding, tokens, request=request, finish_reason=finish_reason, prompt_tokens=0)["output"]
    return output
