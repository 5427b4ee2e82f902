"""One Responses turn with the gateway's built-in tools in it.

The loop (``drive``) feeds each step's tokens to the response's stream; when a step ends at
a built-in call the ``Agent`` will run, it runs it (its item's ``interpreting`` / ``searching``
and ``completed`` events sent as they happen), renders the next prompt and generates again,
until an answer, a client function call, ``max_tool_calls`` or the output budget
(``max_output_tokens`` over the whole turn) ends it. A tool that fails, times out or is
called badly gives the model an error to read; the turn goes on.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Protocol

from ..encoding import HarmonyEncoding
from ..model import Author, Message, Role, TextContent
from ..openai.errors import RequestError
from ..openai.hosted import container_of, hosted_tools
from ..openai.names import identifier
from ..openai.request import next_turn
from ..openai.responses import CITATION, ResponsesStream
from ..openai.turn import Note
from ..tools import BrowserTool, Call, Context, PythonTool, Toolbox, ToolResult
from .mcp import McpTurn

log = logging.getLogger("harmonykit.agent")
_CONTAINER_ID = re.compile(r"cntr_[A-Za-z0-9_-]{1,64}")

Emit = Callable[[list[dict[str, Any]], bool], Awaitable[None]]  # events out; True: the last of them


class Step(Protocol):
    """One generation: batches of output token ids, then the engine's finish reason."""

    finish_reason: str

    def __aiter__(self) -> AsyncIterator[list[int]]: ...


Generate = Callable[[list[int], "int | None"], Awaitable[Step]]  # (prompt, max tokens) -> the step


class ContextFull(Exception):
    """The next step's prompt does not fit the engine's context: the turn ends incomplete."""


class Agent:
    """What one response's loop knows: the tools, whose turn it is, the history (to rebuild
    containers and pages held elsewhere), the prompt so far, the limits."""

    def __init__(self, toolbox: Toolbox, encoding: HarmonyEncoding, request: dict[str, Any], owner: str,
                 prompt: list[int], *, chain: str | None = None, mcp: McpTurn | None = None) -> None:
        self.toolbox = toolbox
        self.encoding = encoding
        self.request = request
        self.prompt = list(prompt)
        self.hosted = tuple(ns for ns in hosted_tools(request) if ns in toolbox.enabled)
        self.mcp = mcp if mcp is not None and mcp.servers else None
        self.max_calls = request.get("max_tool_calls")
        self.limit = request.get("max_output_tokens")
        self.calls = 0
        self.chain = chain  # the response or conversation the browser's pages continue from
        history = [i for i in request.get("input") or [] if isinstance(i, dict)] \
            if isinstance(request.get("input"), list) else []
        include = request.get("include")
        self.ctx = Context(owner, history=history,
                           include=tuple(i for i in include if isinstance(i, str))
                           if isinstance(include, list) else ())
        self.ctx.container = self._container(history) if "python" in self.hosted else ""
        self._tail = next_turn(encoding)  # <|start|>assistant, where every prompt ends

    def _container(self, history: list[dict[str, Any]]) -> str:
        """The container python runs in: the one the request names, else the chain's latest."""
        named = container_of(self.request)
        python = self.toolbox.tools["python"]
        assert isinstance(python, PythonTool)
        if named != "auto":
            if not _CONTAINER_ID.fullmatch(named):
                raise RequestError("tools.container", f"{named!r} is not a container id (cntr_ and letters, "
                                                      "digits, _ or -)")
            known = any(i.get("type") == "code_interpreter_call" and i.get("container_id") == named
                        for i in history)
            if not known and not python.containers.holds(self.ctx.owner, named):
                raise RequestError("tools.container", f"no container {named} here or in this conversation: "
                                                      'send "auto" for a new one')
            return named
        for item in reversed(history):
            cid = item.get("container_id")
            if item.get("type") == "code_interpreter_call" and isinstance(cid, str) \
                    and cid.startswith("cntr_"):
                return cid
        return python.containers.new_id()

    def attach(self, out: ResponsesStream) -> None:
        """Let the response's items know which calls run, where python runs, how to cite."""
        items = out.items
        items.will_run = self.will_run
        items.container_id = self.ctx.container
        if "browser" in self.hosted:
            items.annotate = self.annotate
        if self.mcp is not None:
            items.needs_approval = self.mcp.needs_approval

    def will_run(self, call: dict[str, Any]) -> bool:
        if self.max_calls is not None and self.calls >= self.max_calls:
            return False
        if call.get("mcp"):
            return self.mcp is not None and call["mcp"][0] in self.mcp.servers
        tool = call.get("tool") or call["recipient"]
        ns = "python" if tool == "python" else "browser" if tool.startswith("browser.") else ""
        return ns in self.hosted

    def budget(self, out: ResponsesStream) -> int | None:
        """Output tokens left for the next step (None: no limit set)."""
        return None if self.limit is None else self.limit - out.output_tokens

    async def run(self, out: ResponsesStream, emit: Emit) -> list[int]:
        """Run the pending call; returns the next step's prompt."""
        turn = out.turn
        call = turn.builtin_calls[-1]
        before = turn.builtin_messages[-1]
        tool_name = call.get("tool") or call["recipient"]
        if call.get("mcp"):  # the server's namespace as the prompt declares it
            tool_name = f"{identifier(call['mcp'][0])}.{identifier(call['mcp'][1])}"
        await emit(out.items.running(), False)
        result = await self._mcp(call) if call.get("mcp") else \
            await self._run(Call(tool_name, call["arguments"], call.get("channel")))
        notes, self.ctx.notes = self.ctx.notes, []
        for note in notes:
            turn.notes.append(_note(note))
        await emit(out.items.complete(result.fields, failed=result.failed), False)
        self.calls += 1
        messages = turn.parser.messages
        done = messages[: before if before is not None else len(messages)]
        tokens = self.prompt[: len(self.prompt) - len(self._tail)]
        render = self.encoding.render
        for m in done:
            if m.author.role is Role.ASSISTANT:  # the model writing "user" messages does not make them so
                tokens += render(m)
        channel = call.get("channel")
        written = Message(author=Author(role=Role.ASSISTANT), content=[TextContent(text=call["arguments"])],
                          channel=channel, recipient=call["recipient"], content_type=call.get("content_type"))
        tokens += render(written)
        tokens += render(Message(author=Author(role=Role.TOOL, name=tool_name), channel=channel,
                                 content=[TextContent(text=result.text)], recipient="assistant"))
        tokens += self._tail
        self.prompt = tokens
        return tokens

    async def _mcp(self, call: dict[str, Any]) -> ToolResult:
        assert self.mcp is not None and self.toolbox.mcp is not None
        label, name = call["mcp"]
        fields, text, failed = await self.mcp.run(self.toolbox.mcp, label, name, call["arguments"])
        recipient = f"{identifier(label)}.{identifier(name)}"
        return ToolResult(text, {**fields, "harmony": {"result": text, "tool": recipient}}, failed=failed)

    async def _run(self, call: Call) -> ToolResult:
        ns = "python" if call.tool == "python" else "browser"
        tool = self.toolbox.tools[ns]
        try:
            if isinstance(tool, BrowserTool) and self.ctx.browser is None:
                self.ctx.browser = await tool.resume(self.ctx, self.chain)
            return await tool.run(call, self.ctx)
        except asyncio.CancelledError:
            raise
        except Exception as e:  # a tool's own failure: the model reads it, the turn goes on
            log.exception("built-in tool %s failed", call.tool)
            text = f"Error: the {call.tool} tool failed ({type(e).__name__}: {e})"
            return ToolResult(text, {"harmony": {"result": text, "tool": call.tool}}, failed=True)

    def annotate(self, text: str) -> list[dict[str, Any]]:
        """``url_citation`` annotations over the citations of pages the browser showed."""
        session = self.ctx.browser
        if session is None:
            return []
        out = []
        for m in CITATION.finditer(text):
            cursor = int(m.group(1))
            if cursor < len(session.stack):
                page = session.stack[cursor]
                if page.url.startswith(("http://", "https://")) and page.snippets is None:
                    out.append({"type": "url_citation", "start_index": m.start(), "end_index": m.end(),
                                "title": page.title, "url": page.url})
        return out

    def keep(self, *keys: str | None) -> None:
        """After the response: its browser pages kept under its id (and its conversation's)."""
        session = self.ctx.browser
        tool = self.toolbox.tools.get("browser")
        if session is None or not isinstance(tool, BrowserTool):
            return
        for key in keys:
            if key:
                tool.keep(self.ctx.owner, key, session)


def _note(note: dict[str, str]) -> Note:
    return Note(note["kind"], note["detail"], note.get("text", ""))


async def drive(out: ResponsesStream, agent: Agent | None, step: Step, generate: Generate,
                emit: Emit) -> None:
    """The turn: each step streamed into ``out``; built-in calls the agent runs, run; the
    response closed (``emit``-ted with ``last``) when the turn ends."""
    while True:
        async for ids in step:
            events = out.feed(ids)
            if events:
                await emit(events, False)
        finish = step.finish_reason
        if agent is None or out.items.pending is None:
            await emit(out.close(finish), True)
            return
        await emit(out.end_step(finish), False)
        prompt = await agent.run(out, emit)
        left = agent.budget(out)
        if left is not None and left <= 0:
            out.next_step(0)
            await emit(out.close("length"), True)
            return
        try:
            step = await generate(prompt, left)
        except ContextFull:
            out.next_step(0)
            await emit(out.close("length"), True)
            return
        out.next_step(len(prompt))
