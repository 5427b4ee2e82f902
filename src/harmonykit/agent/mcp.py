"""What a Responses turn with ``mcp`` tools needs before its first step: each server's tools
(the chain's own listing when it holds one, else listed now), and the calls the client has
just approved, run.

A listing decides the prompt (each server a namespace of its tools), so it comes before the
prompt is rendered; the items it makes (``mcp_list_tools``, and an ``mcp_call`` per approved
call) open the response. A server that cannot be listed is an ``mcp_list_tools`` item with
its ``error``, and declares nothing: the turn goes on without it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from ..openai.errors import RequestError, shown
from ..openai.hosted import McpNamespace, mcp_specs
from ..openai.names import identifier
from ..openai.turn import new_id
from ..tools.mcp import Mcp, McpError, McpServer

DESCRIPTION_LIMIT = 2000  # characters of a server's tool description shown to the model


@dataclass
class McpTurn:
    """One response's MCP servers: by label, their declared tools, and the items made first."""

    servers: dict[str, McpServer] = field(default_factory=dict)
    tools: dict[str, dict[str, dict[str, Any]]] = field(default_factory=dict)  # label -> name -> tool
    namespaces: tuple[McpNamespace, ...] = ()
    prelude: list[dict[str, Any]] = field(default_factory=list)

    def tool(self, label: str, name: str) -> dict[str, Any] | None:
        """The listed tool a call names, when its server allows it."""
        server = self.servers.get(label)
        tool = self.tools.get(label, {}).get(name)
        return tool if server is not None and tool is not None and server.allows(tool) else None

    def needs_approval(self, call: dict[str, Any]) -> bool:
        label, name = call["mcp"]
        tool = self.tool(label, name)
        return tool is not None and self.servers[label].needs_approval(tool)

    async def run(self, mcp: Mcp, label: str, name: str, body: str) -> tuple[dict[str, Any], str, bool]:
        """Call a tool: (the item's fields, the text the model reads, whether it failed). A tool
        the server does not offer or allow, or arguments that are no JSON object, never reach it."""
        tool = self.tool(label, name)
        if tool is None:
            offered = (
                ", ".join(
                    sorted(n for n, t in self.tools.get(label, {}).items() if self.servers[label].allows(t))
                )
                or "none"
            )
            return _refused(
                -32602, f"the MCP server {label} offers no tool {name!r} here (its tools: {offered})"
            )
        try:
            arguments = json.loads(body) if body.strip() else {}
        except ValueError:
            arguments = None
        if not isinstance(arguments, dict):
            return _refused(-32602, f"the arguments of {label}.{name} must be a JSON object")
        try:
            output, is_error = await mcp.call(self.servers[label], name, arguments)
        except McpError as e:
            return _refused(-32000, e.message)
        if is_error:
            return (
                {
                    "error": {
                        "type": "mcp_tool_execution_error",
                        "content": [{"type": "text", "text": output}],
                    }
                },
                f"Error: {output}",
                True,
            )
        return {"output": output}, output, False


def _refused(code: int, text: str) -> tuple[dict[str, Any], str, bool]:
    """A call that did not run or failed before the tool answered: the item's protocol error,
    and what the model reads."""
    return {"error": {"type": "mcp_protocol_error", "code": code, "message": text}}, f"Error: {text}", True


def _listed(history: list[dict[str, Any]], label: str) -> dict[str, Any] | None:
    for item in reversed(history):
        if (
            item.get("type") == "mcp_list_tools"
            and item.get("server_label") == label
            and not item.get("error")
        ):
            found: dict[str, Any] = item
            return found
    return None


async def prepare(mcp: Mcp, request: dict[str, Any], own: Any, chain: str) -> McpTurn:
    """Read the request's ``mcp`` tools (a bad one, or a server the rules forbid, is a
    ``RequestError`` before any connection), list what needs listing, run approved calls."""
    turn = McpTurn()
    for i, spec in mcp_specs(request):
        server = McpServer.read(spec, f"tools[{i}]")
        if server.label in turn.servers:
            raise RequestError(
                f"tools[{i}].server_label", f"two mcp tools are labelled {shown(server.label)}"
            )
        mcp.check(server, f"tools[{i}]")
        turn.servers[server.label] = server
    history = (
        [i for i in request.get("input") or [] if isinstance(i, dict)]
        if isinstance(request.get("input"), list)
        else []
    )
    spaces = []
    for label, server in turn.servers.items():
        held = _listed(history, label)
        if held is not None:  # the chain holds its listing: reused, as OpenAI does
            tools = [
                t for t in held.get("tools") or [] if isinstance(t, dict) and isinstance(t.get("name"), str)
            ]
        else:
            item: dict[str, Any] = {
                "id": new_id("mcpl"),
                "type": "mcp_list_tools",
                "server_label": label,
                "tools": [],
                "error": None,
            }
            try:
                tools, refused = await mcp.list_tools(server, chain)
                item["tools"] = tools
                if refused:
                    item["error"] = None
                    item["harmony"] = {
                        "refused_tools": refused[:50],
                        "detail": f"{len(refused)} tools refused: not MCP names, or schemas the "
                        "prompt cannot show safely",
                    }
            except McpError as e:
                tools, item["error"] = [], e.message
            turn.prelude.append(item)
        turn.tools[label] = {t["name"]: t for t in tools}
        shown_tools = tuple(
            (
                t["name"],
                (t.get("description") or "")[:DESCRIPTION_LIMIT],
                t.get("input_schema") or {"type": "object"},
            )
            for t in tools
            if server.allows(t)
        )
        if shown_tools:
            spaces.append(McpNamespace(label, server.description, shown_tools))
    turn.namespaces = tuple(spaces)
    await _approved(mcp, turn, history, own)
    return turn


async def _approved(mcp: Mcp, turn: McpTurn, history: list[dict[str, Any]], own: Any) -> None:
    """Run the calls the request's own ``mcp_approval_response`` items approve (each once: a
    call already made for that approval is not made again)."""
    requests = {i.get("id"): i for i in history if i.get("type") == "mcp_approval_request"}
    done = {i.get("approval_request_id") for i in history if i.get("type") == "mcp_call"}
    for n, answer in enumerate(own if isinstance(own, list) else []):
        if not isinstance(answer, dict) or answer.get("type") != "mcp_approval_response":
            continue
        rid = answer.get("approval_request_id")
        asked = requests.get(rid)
        if asked is None:
            raise RequestError(
                f"input[{n}].approval_request_id", f"no earlier mcp_approval_request has id {shown(rid)}"
            )
        if answer.get("approve") is not True or rid in done:
            continue
        label, name = asked.get("server_label"), asked.get("name")
        if not isinstance(label, str) or not isinstance(name, str) or label not in turn.servers:
            raise RequestError(
                f"input[{n}]",
                f"the approved call is to MCP server {shown(label)}, which the "
                "request's tools do not include",
            )
        fields, text, failed = await turn.run(mcp, label, name, asked.get("arguments") or "")
        recipient = f"{identifier(label)}.{identifier(name)}"
        turn.prelude.append(
            {
                "id": new_id("mcp"),
                "type": "mcp_call",
                "server_label": label,
                "name": name,
                "arguments": asked.get("arguments") or "",
                "approval_request_id": rid,
                "output": None,
                "error": None,
                **fields,
                "status": "failed" if failed else "completed",
                "harmony": {"result": text, "tool": recipient},
            }
        )
        done.add(rid)
