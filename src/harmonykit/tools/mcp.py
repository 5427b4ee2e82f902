"""MCP servers as tools: the Responses API's ``mcp`` tool, reached with the official ``mcp`` SDK.

``McpServer`` is one request's ``{"type": "mcp", ...}`` read and checked; ``Mcp`` lists a
server's tools (cached per server and chain) and calls them, over streamable HTTP (or SSE for
a URL ending in ``/sse``), every connection under the browser's address rules
(``tools/net.py``: the transport resolves and checks each request's host itself and connects
to the checked address, so a DNS answer cannot change between the check and the connection).

What a server sends — tool names, descriptions, schemas, results — is untrusted: names that are
not MCP names (1 to 128 of ``A-Z a-z 0-9 _ - .``) are refused, the rest is rendered only through
the TypeScript renderer and the prompt renderer (text, never control tokens), and results are
capped. Headers and ``authorization`` go to their server only: they are held in memory for the
request, never stored, logged, echoed or shown to the model.

>>> McpServer.read({"type": "mcp", "server_label": "docs", "server_url": "https://mcp.example/mcp",
...                 "require_approval": "never"}, "tools[0]").label
'docs'
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
import time
from dataclasses import dataclass, field
from typing import Any

from ..openai.errors import RequestError, shown
from .net import Fetcher, FetchError

_LABEL = re.compile(r"[A-Za-z][A-Za-z0-9_-]{0,63}")
_TOOL_NAME = re.compile(r"[A-Za-z0-9_.-]{1,128}")
_HEADER = re.compile(r"[A-Za-z0-9!#$%&'*+.^_`|~-]{1,128}")
_FIELDS = {
    "type",
    "server_label",
    "server_url",
    "server_description",
    "headers",
    "authorization",
    "allowed_tools",
    "require_approval",
    "connector_id",
    "allowed_callers",
    "defer_loading",
}
MAX_OUTPUT = 100_000  # characters of a tool's result the model reads (and the item holds)
MAX_EVENT = 32 << 20  # bytes of one message from a server (larger: an error); the result is then capped
LIST_TIMEOUT = 20.0
CALL_TIMEOUT = 60.0
LISTING_TTL = 600.0  # seconds a server's listing is reused


class McpError(Exception):
    """A server that could not be reached or answered wrongly; ``message`` says which and why."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


def _names(value: Any, param: str) -> frozenset[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise RequestError(param, "tool_names must be a list of tool names")
    return frozenset(value)


@dataclass(frozen=True)
class Filter:
    """``allowed_tools`` or one side of ``require_approval``: tool names and/or read-only tools."""

    names: frozenset[str] | None = None
    read_only: bool | None = None

    @classmethod
    def read(cls, value: Any, param: str) -> Filter:
        if isinstance(value, list):
            return cls(_names(value, param))
        if not isinstance(value, dict):
            raise RequestError(
                param, 'must be a list of tool names or {"tool_names": [...], "read_only": ...}'
            )
        for key in value:
            if key not in ("tool_names", "read_only"):
                raise RequestError(f"{param}.{key}", f"unknown field {shown(key)}")
        names = (
            _names(value["tool_names"], f"{param}.tool_names")
            if value.get("tool_names") is not None
            else None
        )
        read_only = value.get("read_only")
        if read_only is not None and not isinstance(read_only, bool):
            raise RequestError(f"{param}.read_only", "read_only must be true or false")
        return cls(names, read_only)

    def matches(self, tool: dict[str, Any]) -> bool:
        if self.names is not None and tool["name"] not in self.names:
            return False
        if self.read_only is not None:
            hint = bool((tool.get("annotations") or {}).get("readOnlyHint"))
            if hint is not self.read_only:
                return False
        return True


@dataclass(frozen=True)
class McpServer:
    """One request's MCP server. ``headers`` (``authorization`` included) are secrets."""

    label: str
    url: str
    description: str | None = None
    headers: tuple[tuple[str, str], ...] = field(default=(), repr=False)
    allowed: Filter | None = None
    approval: str = "always"  # always | never | filter
    always: Filter | None = None
    never: Filter | None = None

    @classmethod
    def read(cls, spec: dict[str, Any], param: str) -> McpServer:
        for key in spec:
            if key not in _FIELDS:
                raise RequestError(f"{param}.{key}", f"unknown field {shown(key)} on an mcp tool")
        if spec.get("connector_id") is not None:
            raise RequestError(
                f"{param}.connector_id", "OpenAI's connectors are not served here: give server_url"
            )
        label = spec.get("server_label")
        if not isinstance(label, str) or not _LABEL.fullmatch(label):
            raise RequestError(
                f"{param}.server_label",
                "server_label must be 1 to 64 letters, digits, _ or -, starting with a letter",
            )
        url = spec.get("server_url")
        if not isinstance(url, str) or not url.startswith(("http://", "https://")):
            raise RequestError(f"{param}.server_url", "server_url must be an http(s) URL")
        description = spec.get("server_description")
        if description is not None and not isinstance(description, str):
            raise RequestError(f"{param}.server_description", "server_description must be a string")
        headers = spec.get("headers") or {}
        if not isinstance(headers, dict) or not all(
            isinstance(k, str)
            and _HEADER.fullmatch(k)
            and isinstance(v, str)
            and "\n" not in v
            and "\r" not in v
            for k, v in headers.items()
        ):
            raise RequestError(
                f"{param}.headers", "headers must be an object of header names to string values"
            )
        pairs = [(k, v) for k, v in headers.items()]
        auth = spec.get("authorization")
        if auth is not None:
            if not isinstance(auth, str) or "\n" in auth or "\r" in auth:
                raise RequestError(f"{param}.authorization", "authorization must be a token string")
            pairs.append(("Authorization", f"Bearer {auth}"))
        allowed = (
            Filter.read(spec["allowed_tools"], f"{param}.allowed_tools")
            if spec.get("allowed_tools") is not None
            else None
        )
        approval = spec.get("require_approval", "always")
        always = never = None
        if isinstance(approval, dict):
            for key in approval:
                if key not in ("always", "never"):
                    raise RequestError(f"{param}.require_approval.{key}", f"unknown field {shown(key)}")
            always = (
                Filter.read(approval["always"], f"{param}.require_approval.always")
                if approval.get("always") is not None
                else None
            )
            never = (
                Filter.read(approval["never"], f"{param}.require_approval.never")
                if approval.get("never") is not None
                else None
            )
            approval = "filter"
        elif approval not in ("always", "never"):
            raise RequestError(
                f"{param}.require_approval",
                'require_approval must be "always", "never" or {"always": {...}, "never": {...}}',
            )
        return cls(label, url, description, tuple(pairs), allowed, approval, always, never)

    def allows(self, tool: dict[str, Any]) -> bool:
        return self.allowed is None or self.allowed.matches(tool)

    def needs_approval(self, tool: dict[str, Any]) -> bool:
        """OpenAI's rule: approval unless ``never`` (or the ``never`` filter matches and
        ``always`` does not)."""
        if self.approval == "never":
            return False
        if self.approval == "always":
            return True
        if self.always is not None and self.always.matches(tool):
            return True
        return not (self.never is not None and self.never.matches(tool))

    @property
    def key(self) -> str:
        """Which server and credentials a listing belongs to (a digest: no secret in it)."""
        return hashlib.sha256(json.dumps([self.url, sorted(self.headers)]).encode()).hexdigest()


_PROPERTY = re.compile(r"[A-Za-z0-9_$.-]{1,128}")
_ONE_LINE = ("description", "title")  # shown as // comments, one line each: a newline would end one


def safe_schema(value: Any) -> Any:
    """A server's input schema as the TypeScript renderer can show it without the schema
    writing the prompt: comments kept on one line, string defaults and examples that would
    break their quotes dropped; ``ValueError`` for property names that are no plain names."""
    if isinstance(value, list):
        return [safe_schema(v) for v in value]
    if not isinstance(value, dict):
        return value
    out: dict[str, Any] = {}
    for key, v in value.items():
        if key == "properties" and isinstance(v, dict):
            for name in v:
                if not isinstance(name, str) or not _PROPERTY.fullmatch(name):
                    raise ValueError(f"property name {str(name)[:40]!r}")
            out[key] = {name: safe_schema(s) for name, s in v.items()}
        elif key in _ONE_LINE and isinstance(v, str):
            out[key] = " ".join(v.split())
        elif key == "examples" and isinstance(v, list):
            out[key] = [e for e in v if not (isinstance(e, str) and any(c in e for c in '"\\\n\r'))]
        elif key == "default" and isinstance(v, str) and any(c in v for c in '"\\\n\r'):
            continue
        else:
            out[key] = safe_schema(v)
    return out


def checked_tools(raw: list[Any]) -> tuple[list[dict[str, Any]], list[str]]:
    """A server's listing as the API items hold it (name, description, input_schema,
    annotations), and the names refused (not MCP names, or schemas that are no JSON Schema)."""
    from ..openai.schema import check_schema

    tools, refused = [], []
    for t in raw:
        name = getattr(t, "name", None)
        schema = getattr(t, "input_schema", None) or {"type": "object"}
        description = getattr(t, "description", None)
        if not isinstance(name, str) or not _TOOL_NAME.fullmatch(name):
            refused.append(
                name[:80] + ("..." if len(name) > 80 else "") if isinstance(name, str) else repr(name)
            )
            continue
        try:
            check_schema(schema, "input_schema")
            schema = safe_schema(schema)
        except (RequestError, ValueError):
            refused.append(name)
            continue
        annotations = getattr(t, "annotations", None)
        dump = getattr(annotations, "model_dump", None)
        tools.append(
            {
                "name": name,
                "description": description if isinstance(description, str) else None,
                "input_schema": schema,
                "annotations": dump(exclude_none=True, by_alias=True) if dump is not None else None,
            }
        )
    return tools, refused


class Mcp:
    """Lists and calls MCP servers' tools under the address rules; listings cached."""

    def __init__(
        self, fetcher: Fetcher, servers: tuple[str, ...] = (), timeout: float = CALL_TIMEOUT
    ) -> None:
        self.fetcher = fetcher
        self.servers = servers  # the only server URLs (prefixes) allowed, when the operator listed some
        self.timeout = timeout  # seconds a call may take
        self._listings: dict[tuple[str, str], tuple[float, list[dict[str, Any]], list[str]]] = {}

    def check(self, server: McpServer, param: str) -> None:
        """Refuse, before any connection, a server URL the rules or the operator's list forbid."""
        if self.servers and not any(server.url.startswith(s) for s in self.servers):
            raise RequestError(
                f"{param}.server_url",
                "this gateway reaches only the MCP servers its operator listed (--mcp-server)",
            )
        try:
            self.fetcher.check_url(server.url)
        except FetchError as e:
            raise RequestError(
                f"{param}.server_url", f"the MCP server cannot be reached: {e.message}"
            ) from None

    async def list_tools(self, server: McpServer, chain: str) -> tuple[list[dict[str, Any]], list[str]]:
        key = (server.key, chain)
        found = self._listings.get(key)
        if found is not None and time.monotonic() - found[0] < LISTING_TTL:
            return found[1], found[2]
        raw = await self._session(server, LIST_TIMEOUT, lambda c: c.list_tools())
        tools, refused = checked_tools(list(raw.tools))
        self._listings[key] = (time.monotonic(), tools, refused)
        if len(self._listings) > 4096:
            del self._listings[next(iter(self._listings))]
        return tools, refused

    async def call(self, server: McpServer, name: str, arguments: dict[str, Any]) -> tuple[str, bool]:
        """(the result as text, whether it is an error)."""
        result = await self._session(server, self.timeout, lambda c: c.call_tool(name, arguments))
        parts = []
        for part in getattr(result, "content", None) or []:
            text = getattr(part, "text", None)
            parts.append(
                text if isinstance(text, str) else json.dumps(part.model_dump(mode="json", exclude_none=True))
            )
        if not parts and getattr(result, "structured_content", None) is not None:
            parts.append(json.dumps(result.structured_content))
        text = "\n".join(parts)
        if len(text) > MAX_OUTPUT:
            text = (
                text[:MAX_OUTPUT]
                + f"\n[output truncated: {len(text) - MAX_OUTPUT} more characters not shown]"
            )
        return text, bool(getattr(result, "is_error", False))

    async def _session(self, server: McpServer, timeout: float, act: Any) -> Any:
        from mcp import Client
        from mcp.client.sse import sse_client
        from mcp.client.streamable_http import streamable_http_client

        def client_factory(
            headers: dict[str, str] | None = None, timeout: Any = None, auth: Any = None
        ) -> Any:
            return _client(self.fetcher, dict(server.headers) | (headers or {}), timeout)

        if server.url.rstrip("/").endswith("/sse"):
            transport = sse_client(
                server.url, timeout=timeout, sse_read_timeout=timeout, httpx_client_factory=client_factory
            )
        else:
            transport = streamable_http_client(
                server.url, http_client=client_factory(), max_sse_event_size=MAX_EVENT
            )

        async def session() -> Any:
            async with Client(transport, mode="legacy") as client:
                return await act(client)

        try:
            return await asyncio.wait_for(session(), timeout)
        except (TimeoutError, asyncio.TimeoutError):
            raise McpError(f"MCP server {server.label} did not answer within {timeout:g} s") from None
        except McpError:
            raise
        except BaseException as e:  # the SDK's task groups wrap failures: show the first cause
            if isinstance(e, (KeyboardInterrupt, SystemExit, asyncio.CancelledError)):
                raise
            raise McpError(f"MCP server {server.label} failed: {_cause(e)}") from None


def _cause(e: BaseException) -> str:
    while getattr(e, "exceptions", None):  # an exception group (the SDK's task groups)
        e = e.exceptions[0]  # type: ignore[attr-defined]
    text = str(e).strip() or type(e).__name__
    return text[:500]


def _client(fetcher: Fetcher, headers: dict[str, str], timeout: Any) -> Any:
    """An httpx2 client whose every request goes to an address the rules allow, checked as it
    is made (redirects and the SSE endpoint's message URL included)."""
    import httpx2

    class Checked(httpx2.AsyncHTTPTransport):
        async def handle_async_request(self, request: Any) -> Any:
            host = request.url.host
            try:
                fetcher.check_url(str(request.url))
                addrs = await fetcher.resolve(
                    host, request.url.port or (443 if request.url.scheme == "https" else 80)
                )
            except FetchError as e:
                raise httpx2.ConnectError(e.message, request=request) from None
            ip = str(addrs[0])
            if ip != host.strip("[]"):
                request.url = request.url.copy_with(host=ip)
                request.extensions = {**request.extensions, "sni_hostname": host}
            return await super().handle_async_request(request)

    return httpx2.AsyncClient(
        headers=headers,
        transport=Checked(trust_env=False),
        timeout=timeout or httpx2.Timeout(30.0, read=300.0),
        follow_redirects=False,
    )
