"""The Responses API's hosted tools as gpt-oss's built-in tools: which request tool is which
namespace, how each is checked, and the recipients the model uses for them.

``{"type": "code_interpreter", "container": ...}`` is ``python``; ``{"type": "web_search"}``
(and the ``web_search_preview`` spellings) is ``browser``. The model also slips into
``functions.python`` / ``functions.browser.search``; those are the built-in tools too when the
request has them and declares no function of that name.

>>> hosted_tools({"tools": [{"type": "web_search"}, {"type": "function", "name": "f"}]})
('browser',)
>>> builtin_recipient("functions.browser.search", ("browser",))
'browser.search'
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .errors import RequestError, shown
from .names import identifier

#: Request tool type -> the built-in namespace it is.
HOSTED: dict[str, str] = {
    "code_interpreter": "python",
    "web_search": "browser",
    "web_search_preview": "browser",
    "web_search_2025_08_26": "browser",
    "web_search_preview_2025_03_11": "browser",
}
#: The order the namespaces are declared in the system message (gpt-oss's server's).
ORDER = ("browser", "python")
#: Fields each hosted tool may carry (OpenAI's); anything else is a 400 naming it.
_FIELDS = {
    "python": {"type", "container"},
    "browser": {"type", "search_context_size", "user_location", "filters", "external_web_access",
                "search_content_types", "image_settings"},
}


def namespace_of(spec: Any) -> str | None:
    """The built-in namespace a request tool is (``mcp`` for an MCP server's), or None for a
    function (or anything else)."""
    if isinstance(spec, dict):
        kind = spec.get("type")
        if kind == "mcp":
            return "mcp"
        if isinstance(kind, str):
            return HOSTED.get(kind)
    return None


def check_hosted_tool(spec: dict[str, Any], param: str) -> str:
    """A hosted tool's namespace, its fields checked."""
    ns = HOSTED[spec["type"]]
    for key in spec:
        if key not in _FIELDS[ns]:
            raise RequestError(f"{param}.{key}", f"unknown field {shown(key)} on a {spec['type']} tool")
    if ns == "python":
        container = spec.get("container", "auto")
        if isinstance(container, dict):
            kind = container.get("type", "auto")
            if kind != "auto":
                raise RequestError(f"{param}.container.type",
                                   f"container type must be 'auto', got {shown(kind)}")
            files = container.get("file_ids") or []
            if files:
                raise RequestError(f"{param}.container.file_ids", "files in a container are not supported: "
                                   "put the data in the conversation, or have the code create it")
        elif not isinstance(container, str) or not container:
            raise RequestError(f"{param}.container", "container must be 'auto', a container id, or "
                                                     '{"type": "auto"}')
    return ns


def hosted_tools(request: dict[str, Any] | None) -> tuple[str, ...]:
    """The built-in namespaces a request's tools ask for, in declaration order."""
    tools = (request or {}).get("tools")
    found = {namespace_of(t) for t in tools} if isinstance(tools, list) else set()
    return tuple(ns for ns in ORDER if ns in found)


def container_of(request: dict[str, Any]) -> str:
    """The container a request's code_interpreter tool names ("auto" when it names none)."""
    for t in request.get("tools") or []:
        if namespace_of(t) == "python":
            c = t.get("container", "auto")
            return c if isinstance(c, str) else "auto"
    return "auto"


def builtin_recipient(recipient: str, hosted: tuple[str, ...] | frozenset[str]) -> str | None:
    """The built-in tool a recipient calls (``python``, ``browser.open``, ...), the slips
    ``functions.python`` / ``functions.browser.x`` included, when the request has it; else None."""
    r = recipient[len("functions."):] if recipient.startswith("functions.") else recipient
    if r == "python" and "python" in hosted:
        return "python"
    if r.startswith("browser.") and "browser" in hosted:
        return r
    return None


@dataclass(frozen=True)
class McpNamespace:
    """An MCP server's tools as the prompt declares them: a namespace of its own, named by
    its ``server_label`` (as gpt-oss reads its built-in tools: ``namespace browser``), each tool
    under its identifier. ``tools``: (name, description, input schema), already checked."""

    label: str
    description: str | None
    tools: tuple[tuple[str, str, dict[str, Any]], ...]

    @property
    def rendered(self) -> str:
        return identifier(self.label)

    def resolve(self, name: str) -> str | None:
        """The MCP tool a rendered name calls."""
        for tool, _, _ in self.tools:
            if identifier(tool) == name or tool == name:
                return tool
        return None


def mcp_recipient(recipient: str, namespaces: tuple[McpNamespace, ...]) -> tuple[str, str] | None:
    """(server_label, tool name) of a recipient ``LABEL.TOOL`` (also ``functions.LABEL.TOOL``,
    a slip), for a server the request has; the tool may be one it does not offer (the call is
    then answered with an error)."""
    r = recipient[len("functions."):] if recipient.startswith("functions.") else recipient
    head, dot, tail = r.partition(".")
    if not dot:
        return None
    for ns in namespaces:
        if head in (ns.rendered, ns.label):
            return ns.label, ns.resolve(tail) or tail
    return None


def mcp_specs(request: dict[str, Any] | None) -> list[tuple[int, dict[str, Any]]]:
    """The request's ``mcp`` tools with their index in ``tools``."""
    tools = (request or {}).get("tools")
    return [(i, t) for i, t in enumerate(tools) if isinstance(t, dict) and t.get("type") == "mcp"] \
        if isinstance(tools, list) else []
