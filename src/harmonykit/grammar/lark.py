"""One assistant turn of Harmony as an llguidance grammar (Lark syntax), built from a request.

Pure text: no llguidance needed to build it, so a server can send it to an engine
that constrains generation itself (vLLM ``structured_outputs``, SGLang).
Special tokens are referenced as tokens (``<|channel|>``), never written as
text, so no text region can hold one.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from ..builtin_tools import BROWSER
from ..cache import PartsCache
from ..openai.errors import RequestError, shown
from ..openai.hosted import ORDER, McpNamespace, namespace_of
from ..openai.names import ToolNames, identifier
from ..openai.request import api_of, client_namespaces
from ..openai.schema import check_schema

# A text region: any text (llguidance's text never holds a special token); its lexemes
# cannot be empty, so an empty body is the terminal left out.
_TEXT = "TEXT?"


@dataclass(frozen=True)
class Turn:
    """What a request allows of one turn: the callable tools (rendered name, schema), whether
    a final answer may end it, and the answer's schema (None: free text)."""

    tools: tuple[tuple[str, dict[str, Any]], ...]
    final: bool
    answer_schema: dict[str, Any] | None
    builtins: tuple[str, ...] = ()  # the built-in namespaces (python, browser) it may call
    mcp: tuple[tuple[str, dict[str, Any]], ...] = ()  # MCP tools: (LABEL.TOOL as rendered, schema)


def turn_of(request: dict[str, Any], mcp: tuple[McpNamespace, ...] = ()) -> Turn:
    """Read tools, ``tool_choice`` and the response format of a Chat or Responses request
    (``mcp``: the tools its MCP servers listed)."""
    if not isinstance(request, dict):
        raise RequestError(None, "the request body must be a JSON object")
    kind = api_of(request)
    raw_tools = request.get("tools") or []
    if not isinstance(raw_tools, list):
        raise RequestError("tools", "tools must be a list")
    declared: list[tuple[str, dict[str, Any]]] = []
    found: set[str] = set()
    for i, spec in enumerate(raw_tools):
        ns = namespace_of(spec) if kind == "responses" else None
        if ns is not None:  # a Responses hosted tool: gpt-oss's built-in python or browser
            found.add(ns)
            continue
        if isinstance(spec, dict) and spec.get("type") == "namespace":  # read below, as MCP servers' are
            continue
        fn = spec.get("function") if isinstance(spec, dict) and "function" in spec else spec
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn["name"]:
            raise RequestError(f"tools[{i}]", "a function tool needs a non-empty string name")
        params = fn.get("parameters")
        where = f"tools[{i}].function.parameters" if isinstance(spec, dict) and "function" in spec \
            else f"tools[{i}].parameters"
        if params is not None:
            check_schema(params, where)
        declared.append((fn["name"], params if isinstance(params, dict) else {"type": "object"}))
    names = ToolNames.of([n for n, _ in declared])
    rendered = dict(zip(names.declared, names.rendered, strict=True))
    tools = [(rendered[n], schema) for n, schema in declared]
    builtins = tuple(ns for ns in ORDER if ns in found)
    spaces = (*client_namespaces(raw_tools), *mcp) if kind == "responses" else mcp
    servers = [(ns.label, f"{ns.rendered}.{identifier(n)}", s or {"type": "object"})
               for ns in spaces for n, _, s in ns.tools]
    choice = request.get("tool_choice", "auto")
    final = True
    if choice == "none":
        tools, builtins, servers = [], (), []
    elif isinstance(choice, dict) and choice.get("type") == "mcp":
        label, name = choice.get("server_label"), choice.get("name")
        servers = [t for t in servers
                   if t[0] == label and (name is None or t[1].endswith("." + identifier(name)))]
        if not servers:
            raise RequestError("tool_choice",
                               f"tool_choice names MCP server {shown(label)}, which offers no such tool")
        tools, builtins, final = [], (), False
    elif choice == "required":
        if not tools and not builtins and not servers:
            raise RequestError("tool_choice", "tool_choice 'required' needs tools")
        final = False
    elif isinstance(choice, dict) and namespace_of(choice) is not None:
        if namespace_of(choice) not in builtins:
            raise RequestError("tool_choice",
                               f"tool_choice names {shown(choice.get('type'))}, which is not in tools")
        tools, builtins, servers, final = [], (str(namespace_of(choice)),), [], False
    elif isinstance(choice, dict):
        fn = choice.get("function", choice)
        name = fn.get("name") if isinstance(fn, dict) else None
        if name not in names.declared:
            raise RequestError("tool_choice", f"tool_choice names {shown(name)}, which is not in tools")
        tools = [(rendered[name], dict(declared)[name])]
        final = False
    elif choice not in (None, "auto"):
        raise RequestError("tool_choice", f"unsupported tool_choice {shown(choice)}")
    return Turn(tuple(tools), final, _answer_schema(request, kind), builtins,
                tuple((recipient, schema) for _, recipient, schema in servers))


def _answer_schema(request: dict[str, Any], kind: str) -> dict[str, Any] | None:
    if kind == "chat":
        fmt, param = request.get("response_format"), "response_format"
    else:
        text = request.get("text")
        fmt, param = (text.get("format") if isinstance(text, dict) else None), "text.format"
    if fmt is None:
        return None
    if not isinstance(fmt, dict):
        raise RequestError(param, "must be an object")
    if fmt.get("type") in (None, "text"):
        return None
    if fmt.get("type") == "json_object":
        return {"type": "object"}
    if fmt.get("type") == "json_schema":
        spec = fmt.get("json_schema") if kind == "chat" else fmt
        schema = spec.get("schema", {"type": "object"}) if isinstance(spec, dict) else None
        check_schema(schema, f"{param}.schema")
        assert isinstance(schema, dict)
        return schema
    raise RequestError(f"{param}.type", f"unsupported response format {shown(fmt.get('type'))}")


def _builtin_rules(ns: str) -> list[str]:
    """Calls of a built-in tool as the model was trained to write them: on ``analysis`` (or
    ``commentary``), the recipient after the channel or before it, content type ``code``;
    python's body is code, each browser function's is JSON held to its parameters."""
    def header(to: str) -> str:
        return (f"(<|channel|> (\"analysis\" | \"commentary\") \" {to}\" | \" {to}\" <|channel|> "
                f"(\"analysis\" | \"commentary\")) \" code\"?")
    if ns == "python":
        return [f"builtin_python: {header('to=python')} <|message|> {_TEXT} <|call|>"]
    fns = BROWSER["tools"]
    rules = ["builtin_browser: " + " | ".join(f"browser_{f['name']}" for f in fns)]
    for f in fns:
        rules.append(f"browser_{f['name']}: {header('to=browser.' + f['name'])} <|message|> "
                     f"%json {json.dumps(f['parameters'])} <|call|>")
    return rules


GRAMMARS: PartsCache[str] = PartsCache()


def harmony_grammar(request: dict[str, Any], mcp: tuple[McpNamespace, ...] = ()) -> str:
    """The llguidance grammar (Lark syntax) that admits exactly the well-formed completions of
    one assistant turn for ``request`` (a Chat Completions or Responses body): an optional
    ``analysis`` message, an optional ``commentary`` preamble (none with a response format),
    then a ``final`` answer ending
    in ``<|return|>`` (its body held to the response format's schema) or a call to a
    declared tool ending in ``<|call|>``, its body held to the tool's parameters.

    >>> g = harmony_grammar({"messages": [], "tools": [{"type": "function", "function": {"name": "f"}}],
    ...                      "tool_choice": "required"})
    >>> "final" in g, 'commentary to=functions.f"' in g
    (False, True)
    """
    if not isinstance(request, dict):
        raise RequestError(None, "the request body must be a JSON object")
    text = request.get("text")
    parts = (request.get("tools"), request.get("tool_choice"), request.get("response_format"),
             text.get("format") if isinstance(text, dict) else text, api_of(request),
             repr(mcp) if mcp else None)
    return GRAMMARS.get(parts, lambda: _grammar(turn_of(request, mcp)))


def _grammar(turn: Turn) -> str:
    answers = (["final"] if turn.final else []) + (["call"] if turn.tools else []) + \
        [f"builtin_{ns}" for ns in turn.builtins] + (["mcp"] if turn.mcp else [])
    if not answers:
        raise RequestError("tool_choice", "the request allows neither an answer nor a call")
    # A preamble is shown as content: with a response format, content must be the JSON alone.
    preamble = "(preamble next)? " if turn.answer_schema is None else ""
    lines = [
        f"start: (analysis next)? {preamble}answer",
        "next: <|start|> \"assistant\"",
        f"analysis: <|channel|> \"analysis\" <|message|> {_TEXT} <|end|>",
        "answer: " + " | ".join(answers),
        # Only the spelling the parser reads with no repair at any tokenization: a bare " json"
        # can be split so that it reads as a recipient.
        "ctype: (\" \" <|constrain|> \"json\")?",
    ]
    if preamble:
        lines.insert(3, f"preamble: <|channel|> \"commentary\" <|message|> {_TEXT} <|end|>")
    if turn.final:
        body = f"%json {json.dumps(turn.answer_schema)}" if turn.answer_schema is not None else _TEXT
        ctype = " ctype" if turn.answer_schema is not None else ""
        lines.append(f"final: <|channel|> \"final\"{ctype} <|message|> {body} <|return|>")
    if turn.tools:
        lines.append("call: " + " | ".join(f"call_{i}" for i in range(len(turn.tools))))
        for i, (name, schema) in enumerate(turn.tools):
            to = f"to=functions.{name}"
            # both header orders: the recipient after the channel, or before it (after the role)
            header = f"(<|channel|> \"commentary {to}\" | \" {to}\" <|channel|> \"commentary\")"
            lines.append(f"call_{i}: {header} ctype <|message|> %json {json.dumps(schema)} <|call|>")
    for ns in turn.builtins:
        lines += _builtin_rules(ns)
    if turn.mcp:  # an MCP server's tool, called as the functions are: commentary, JSON held to its schema
        lines.append("mcp: " + " | ".join(f"mcp_{i}" for i in range(len(turn.mcp))))
        for i, (recipient, schema) in enumerate(turn.mcp):
            to = f"to={recipient}"
            header = f"(<|channel|> \"commentary {to}\" | \" {to}\" <|channel|> \"commentary\")"
            lines.append(f"mcp_{i}: {header} ctype <|message|> %json {json.dumps(schema)} <|call|>")
    lines.append("TEXT: /(.|\\n)+/")
    return "\n".join(lines) + "\n"
