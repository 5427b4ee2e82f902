"""gpt-oss's built-in tools as the gateway runs them: ``python`` (a sandboxed, stateful
interpreter per container) and ``browser`` (search, open, find over real pages).

Each tool is one class behind one small interface (``Tool``): how the system message
declares it, and running one call into a ``ToolResult`` (the text the model reads, and the
fields its Responses item shows). ``TOOLS`` is the registry by namespace; ``Toolbox`` is
what one gateway enabled. Nothing here knows HTTP routes or the store: the agent loop
(``harmonykit.agent``) drives it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from ..builtin_tools import PYTHON
from ..encoding import HarmonyEncoding
from ..model import ToolNamespaceConfig
from .browser.backends import Backend, BackendError, backend_from
from .browser.page import Page, from_html
from .browser.session import BrowserSession
from .mcp import Mcp
from .net import Fetcher, FetchError, parse_allow
from .python import Containers, Sandbox, SandboxError, check

__all__ = ["TOOLS", "BackendError", "BrowserTool", "Call", "Context", "PythonTool", "SandboxError",
           "Tool", "ToolResult", "Toolbox"]

SESSION_IDLE = 20 * 60.0  # seconds a chain's browser pages are kept here after their last use
SESSIONS = 4096  # chains whose pages are kept at most (the oldest go first: they can be rebuilt)


@dataclass(frozen=True)
class Call:
    """One built-in call: the tool (``python``, ``browser.search``, ...), the model's body,
    and the channel it used (the result goes back on it)."""

    tool: str
    body: str
    channel: str | None


@dataclass
class Context:
    """What one response's calls share: whose they are, the container python runs in, the
    chain's history (for rebuilding state held elsewhere), what the request includes."""

    owner: str
    container: str = ""
    history: list[dict[str, Any]] = field(default_factory=list)
    include: tuple[str, ...] = ()
    browser: BrowserSession | None = None
    notes: list[dict[str, str]] = field(default_factory=list)


@dataclass
class ToolResult:
    """What a call gave: ``text`` for the model, ``fields`` for its API item, and whether it
    failed (the model still reads ``text``, which says why)."""

    text: str
    fields: dict[str, Any]
    failed: bool = False


class Tool:
    """One built-in tool: its namespace, its declaration, and running a call."""

    namespace = ""

    def declaration(self) -> ToolNamespaceConfig:
        raise NotImplementedError

    async def run(self, call: Call, ctx: Context) -> ToolResult:
        raise NotImplementedError

    async def close(self) -> None:
        return None


def python_description(timeout: float) -> str:
    """harmony's python text, with what is true here: stateful, this timeout, no internet."""
    text = str(PYTHON["description"]).replace("time out after 120.0 seconds",
                                              f"time out after {float(timeout):.1f} seconds")
    return text.replace("Internet access for this session is UNKNOWN. Depends on the cluster.",
                        "Internet access for this session is disabled.")


class PythonTool(Tool):
    """``python``: each call a cell of its container's interpreter."""

    namespace = "python"

    def __init__(self, sandbox: Sandbox) -> None:
        self.sandbox = sandbox
        self.containers = Containers(sandbox)

    def declaration(self) -> ToolNamespaceConfig:
        return ToolNamespaceConfig(name="python", description=python_description(self.sandbox.timeout),
                                   tools=[])

    async def run(self, call: Call, ctx: Context) -> ToolResult:
        cells = [item["code"] for item in ctx.history
                 if item.get("type") == "code_interpreter_call" and item.get("container_id") == ctx.container
                 and isinstance(item.get("code"), str) and _ran(item)]
        container, rebuilt = await self.containers.get(ctx.owner, ctx.container, cells)
        if rebuilt:
            ctx.notes.append({"kind": "container_rebuilt", "text": "",
                              "detail": f"container {ctx.container} was not held by this gateway; rebuilt by "
                                        f"running its {len(cells)} earlier cells again"})
        result = await self.containers.run(container, call.body)
        outputs = [{"type": "logs", "logs": result.output}] \
            if "code_interpreter_call.outputs" in ctx.include else None
        return ToolResult(result.output, {"outputs": outputs, "container_id": ctx.container,
                                          "harmony": {"result": result.output, "tool": "python"}},
                          failed=result.killed)

    async def close(self) -> None:
        await self.containers.close()


def _ran(item: dict[str, Any]) -> bool:
    h = item.get("harmony")
    return (isinstance(h, dict) and isinstance(h.get("result"), str)) or bool(item.get("outputs"))


class BrowserTool(Tool):
    """``browser``: search, open and find; pages over HTTP (``net.Fetcher``) or from the backend."""

    namespace = "browser"

    def __init__(self, backend: Backend, encoding: HarmonyEncoding, allow: tuple[Any, ...] = ()) -> None:
        self.backend = backend
        self.encoding = encoding
        self.pages = Fetcher(allow=allow)
        # The backend's own API is the operator's choice of endpoint: any address, same limits.
        self.api = Fetcher(allow=parse_allow(["0.0.0.0/0", "::/0"]))
        self.sessions: dict[tuple[str, str], tuple[BrowserSession, float]] = {}

    def declaration(self) -> ToolNamespaceConfig:
        return ToolNamespaceConfig.browser()

    def session(self) -> BrowserSession:
        return BrowserSession(self._search, self.open_page, self.encoding)

    async def _search(self, query: str, topn: int) -> list[tuple[str, str, str]]:
        return await self.backend.search(query, topn, self.api)

    async def open_page(self, url: str) -> Page:
        """A page by URL: from the backend when it holds it, else fetched under the address rules."""
        held = self.backend.page_html(url)
        if held is not None:
            return from_html(held[0], url, held[1])
        got = await self.pages.request("GET", url)
        if got.status >= 400:
            raise FetchError(f"HTTP {got.status}")
        kind = got.content_type.split(";")[0].strip().lower()
        if kind and not (kind.startswith("text/") or kind in ("application/xhtml+xml", "application/xml")):
            raise FetchError(f"cannot show a page of type {kind}")
        text = got.text()
        if kind in ("text/plain", "text/markdown", "text/csv"):
            from html import escape

            text = f"<html><body><pre>{escape(text)}</pre></body></html>"
        return from_html(text, got.url)

    async def resume(self, ctx: Context, key: str | None) -> BrowserSession:
        """The chain's browser: kept here, else rebuilt by running its earlier calls again."""
        now = time.monotonic()
        for k, (_, used) in list(self.sessions.items()):
            if now - used > SESSION_IDLE:
                del self.sessions[k]
        found = self.sessions.get((ctx.owner, key)) if key else None
        if found is not None:
            return found[0]
        session = self.session()
        calls = [item.get("harmony") for item in ctx.history if item.get("type") == "web_search_call"]
        replay = [h for h in calls if isinstance(h, dict) and isinstance(h.get("tool"), str)
                  and isinstance(h.get("arguments"), str) and h["tool"].startswith("browser.")]
        for h in replay:
            await session.call(h["tool"][len("browser."):], h["arguments"])
        if replay:
            ctx.notes.append({"kind": "browser_rebuilt", "detail": f"the chain's pages were not held by this "
                              f"gateway; rebuilt by running its {len(replay)} earlier browser calls again",
                              "text": ""})
        return session

    def keep(self, owner: str, key: str, session: BrowserSession) -> None:
        self.sessions.pop((owner, key), None)
        self.sessions[(owner, key)] = (session, time.monotonic())
        while len(self.sessions) > SESSIONS:
            del self.sessions[next(iter(self.sessions))]

    async def run(self, call: Call, ctx: Context) -> ToolResult:
        session = ctx.browser
        assert session is not None, "resume() the chain's browser first"
        outcome = await session.call(call.tool.partition(".")[2], call.body)
        action = dict(outcome.action)
        sources = action.pop("sources", None)
        if sources is not None and "web_search_call.action.sources" in ctx.include:
            action["sources"] = sources
        if action["type"] == "find_in_page":
            action.setdefault("url", "")
            action.setdefault("pattern", "")
        return ToolResult(outcome.text, {"action": action,
                                         "harmony": {"result": outcome.text, "tool": call.tool}},
                          failed=outcome.error)

    async def close(self) -> None:
        await self.pages.close()
        await self.api.close()


#: The built-in tools by namespace (adding one: a class above and a line here).
TOOLS: dict[str, type[Tool]] = {"python": PythonTool, "browser": BrowserTool}
OPTIONS = {"python": "--python", "browser": "--browser", "mcp": "--mcp"}


class Toolbox:
    """The built-in tools one gateway runs (``python`` when a sandbox is given, ``browser``
    when a backend is), checked at startup."""

    def __init__(self, encoding: HarmonyEncoding, *, sandbox: Sandbox | None = None,
                 browser: str | None = None, fetch_allow: tuple[str, ...] = (),
                 mcp: bool = False, mcp_servers: tuple[str, ...] = (), mcp_timeout: float = 60.0) -> None:
        self.tools: dict[str, Tool] = {}
        # MCP servers, reached under the same address rules as the browser's pages
        self.mcp: Mcp | None = None
        if mcp:
            try:
                import mcp as _sdk  # noqa: F401
            except ImportError:
                raise BackendError("--mcp needs the mcp extra: pip install 'harmonykit[mcp]'") from None
            self.mcp = Mcp(Fetcher(allow=parse_allow(fetch_allow)), mcp_servers, mcp_timeout)
        if sandbox is not None:
            check(sandbox)
            self.tools["python"] = PythonTool(sandbox)
        if browser is not None:
            try:
                import html2text  # noqa: F401
                import lxml.html  # noqa: F401
            except ImportError as e:
                raise BackendError(f"the browser needs the tools extra: pip install 'harmonykit[tools]' "
                                   f"({e.name} is missing)") from None
            self.tools["browser"] = BrowserTool(backend_from(browser), encoding, parse_allow(fetch_allow))

    @property
    def enabled(self) -> tuple[str, ...]:
        return tuple(self.tools) + (("mcp",) if self.mcp is not None else ())

    def declarations(self) -> dict[str, ToolNamespaceConfig]:
        return {ns: tool.declaration() for ns, tool in self.tools.items()}

    async def close(self) -> None:
        for tool in self.tools.values():
            await tool.close()
        if self.mcp is not None:
            await self.mcp.fetcher.close()
