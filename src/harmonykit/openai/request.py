"""Chat Completions and Responses requests -> Harmony conversations and prompt tokens.

Pure functions over plain dicts (the JSON bodies of the two APIs); no HTTP.
"""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..cache import ENTRY_BYTES, LRU, TOKEN_BYTES, PartsCache, compact_key, parts_key
from ..encoding import HarmonyEncoding
from ..model import (
    Author,
    Conversation,
    DeveloperContent,
    Message,
    ReasoningEffort,
    RenderOptions,
    Role,
    SystemContent,
    TextContent,
    ToolDescription,
    ToolNamespaceConfig,
    text_author,
    text_message,
)
from ..render import drop_boundary
from ..tokens import CALL, RETURN, START
from ..typescript import ToolText, namespace_parts, section_parts, tool_text
from .errors import RequestError, shown
from .hosted import ORDER, McpNamespace, check_hosted_tool, namespace_of
from .names import ToolNames, identifier
from .schema import check_json, check_schema

_EFFORTS = {"low": ReasoningEffort.LOW, "medium": ReasoningEffort.MEDIUM, "high": ReasoningEffort.HIGH,
            "minimal": ReasoningEffort.LOW}
_TEXT_PARTS = ("text", "input_text", "output_text")


@dataclass
class Prompt:
    """A rendered request: its tokens (ending in ``<|start|>assistant``), the stop tokens to
    sample with (``<|return|>``, ``<|call|>``), the declared function names and ``names``,
    which maps the identifiers the prompt shows back to them; and ``conversation``, built
    when first read (a server that only sends the tokens never builds it)."""

    tokens: list[int]
    stop_token_ids: list[int] = field(default_factory=lambda: [RETURN, CALL])
    tool_names: list[str] = field(default_factory=list)
    names: ToolNames = field(default_factory=ToolNames)
    request: Request | None = field(default=None, repr=False, compare=False)

    @functools.cached_property
    def conversation(self) -> Conversation:
        assert self.request is not None, "a Prompt made by render_chat_request / render_responses_request"
        return Conversation.from_messages([*self.request.head.messages, *self.request.messages])

    def release(self) -> None:
        """Let go of the conversation a few thousand messages at a time: freeing a request of
        250k messages at once holds the GIL (a server's other streams would stall)."""
        if self.request is not None:
            let_go(self.request.items)
            self.__dict__.pop("conversation", None)
            self.request.__dict__.pop("messages", None)
            self.request = None


def let_go(items: list[Any]) -> None:
    """Empty ``items`` a few thousand at a time, letting other threads run in between."""
    while items:
        del items[-2048:]


def _effort(value: Any, param: str) -> ReasoningEffort:
    if not isinstance(value, str) or value.lower() not in _EFFORTS:
        raise RequestError(param, f"reasoning effort must be one of low, medium, high; got {shown(value)}")
    return _EFFORTS[value.lower()]


def _text(content: Any, param: str, *, allow_none: bool = False) -> str:
    """Text of a message's content: a string, or text parts joined in order."""
    if content is None and allow_none:
        return ""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise RequestError(param, "content must be a string or a list of content parts")
    out = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in _TEXT_PARTS and isinstance(part.get("text"), str):
            out.append(part["text"])
        elif kind in ("image_url", "input_image", "input_audio", "file", "input_file"):
            raise RequestError(f"{param}[{j}]", f"{kind} content is not supported: gpt-oss reads text only")
        elif kind == "refusal" and isinstance(part.get("refusal"), str):
            out.append(part["refusal"])
        else:
            raise RequestError(f"{param}[{j}]", f"unsupported content part {shown(kind)}; use text parts")
    return "".join(out)


class _Tool:
    """One client tool definition, read and checked: its declared name, the tool as the
    developer message declares it (under its identifier), and its TypeScript. Compared by
    identity: a request head is keyed by the very entries ``TOOL_SPECS`` gave it, and holds
    them (so no other entry takes an identity while a key holds it)."""

    __slots__ = ("declared", "description", "text")

    def __init__(self, declared: str, description: ToolDescription, text: ToolText) -> None:
        self.declared, self.description, self.text = declared, description, text


#: Tool definitions read before (checked, named): a new tool set pays only for its new tools.
TOOL_SPECS: PartsCache[_Tool] = PartsCache(size=4096)


def _tool(spec: Any, i: int, nested: bool) -> _Tool:
    """A function tool, rendered under its identifier. Chat nests it under "function",
    Responses does not; either API accepts either shape."""
    return TOOL_SPECS.get((nested, spec), lambda: _read_tool(spec, f"tools[{i}]", nested))


def _read_tool(spec: Any, param: str, nested: bool) -> _Tool:
    if not isinstance(spec, dict) or spec.get("type", "function") != "function":
        kind = spec.get("type") if isinstance(spec, dict) else type(spec).__name__
        raise RequestError(param, f"only function tools are supported, got {shown(kind)}")
    nested = "function" in spec or (nested and "name" not in spec)
    fn = spec.get("function") if nested else spec
    if not isinstance(fn, dict):
        raise RequestError(f"{param}.function", "a function tool needs a 'function' object")
    where = f"{param}.function" if nested else param
    name = fn.get("name")
    if not isinstance(name, str) or not name:
        raise RequestError(f"{where}.name", "a function tool needs a non-empty string name")
    if any(c in name for c in "<>\n") or "<|" in name:
        raise RequestError(f"{where}.name", f"invalid function name {shown(name)}")
    description = fn.get("description") or ""
    if not isinstance(description, str):
        raise RequestError(f"{where}.description", "description must be a string")
    parameters = fn.get("parameters")
    if parameters is not None:
        check_schema(parameters, f"{where}.parameters")
    rendered = identifier(name)
    return _Tool(name, ToolDescription.new(rendered, description, parameters),
                 tool_text(rendered, description, parameters))


def _read_tools(tools: Any, nested: bool) -> tuple[_Tool, ...]:
    """The function tools (Responses' hosted tools are read by ``_hosted``, namespaces by
    ``client_namespaces``)."""
    if tools is None:
        return ()
    if not isinstance(tools, list):
        raise RequestError("tools", "tools must be a list")
    return tuple([_tool(t, i, nested) for i, t in enumerate(tools)
                  if nested or (namespace_of(t) is None and not _is_namespace(t))])


def _is_namespace(spec: Any) -> bool:
    return isinstance(spec, dict) and spec.get("type") == "namespace"


def _recipient(rendered: str) -> str:
    """Where a call goes (and whom its result is from): ``functions.NAME``, or ``NS.TOOL`` (a
    function's identifier never holds a dot)."""
    return rendered if "." in rendered else f"functions.{rendered}"


def client_namespaces(tools: Any) -> tuple[McpNamespace, ...]:
    """A Responses request's ``namespace`` tools (the Codex CLI's), checked: each a namespace of
    function tools, declared as harmony declares namespaces (the model calls ``NS.TOOL``)."""
    out = []
    for i, spec in enumerate(tools if isinstance(tools, list) else []):
        if not _is_namespace(spec):
            continue
        name, description, inner = spec.get("name"), spec.get("description"), spec.get("tools")
        if not isinstance(name, str) or not name or identifier(name) != name:
            raise RequestError(f"tools[{i}].name", "a namespace needs a name of letters, digits, _ or -, "
                                                   f"got {shown(name)}")
        if description is not None and not isinstance(description, str):
            raise RequestError(f"tools[{i}].description", "description must be a string")
        if not isinstance(inner, list):
            raise RequestError(f"tools[{i}].tools", "a namespace needs a list of tools")
        listed = []
        for j, t in enumerate(inner):
            read = _read_tool(t, f"tools[{i}].tools[{j}]", False)
            listed.append((read.declared, t.get("description") or "", t.get("parameters")))
        out.append(McpNamespace(name, description, tuple(listed)))
    return tuple(out)


#: Hosted tools -> their namespaces as harmony declares them (a deployment passes its own texts).
DEFAULT_HOSTED: dict[str, ToolNamespaceConfig] = {"browser": ToolNamespaceConfig.browser(),
                                                  "python": ToolNamespaceConfig.python()}


def _hosted(tools: Any, texts: Mapping[str, ToolNamespaceConfig] | None) -> tuple[ToolNamespaceConfig, ...]:
    """The built-in namespaces a Responses request's hosted tools declare (checked), in
    the system message's order, each as ``texts`` (the deployment's) or harmony gives it."""
    if not isinstance(tools, list):
        return ()
    found = {check_hosted_tool(t, f"tools[{i}]") for i, t in enumerate(tools)
             if namespace_of(t) not in (None, "mcp")}
    return tuple([(texts or DEFAULT_HOSTED).get(ns) or DEFAULT_HOSTED[ns] for ns in ORDER if ns in found])


def _check_tool_choice(tool_choice: Any, names: Sequence[str], hosted: Sequence[str] = ()) -> None:
    """``tool_choice`` against the declared function ``names`` and built-in namespaces (``hosted``)."""
    if isinstance(tool_choice, dict) and namespace_of(tool_choice) is not None:
        if namespace_of(tool_choice) not in hosted:
            raise RequestError("tool_choice", f"tool_choice names {shown(tool_choice.get('type'))}, which is "
                                              "not in tools")
    elif isinstance(tool_choice, dict):
        fn = tool_choice.get("function", tool_choice) if "function" in tool_choice else tool_choice
        param = "tool_choice.function" if "function" in tool_choice else "tool_choice"
        if tool_choice.get("type", "function") != "function":
            raise RequestError("tool_choice.type",
                               f"unsupported tool_choice type {shown(tool_choice.get('type'))}")
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise RequestError(param, "a named tool_choice needs {\"name\": \"...\"} (a function's name)")
        if not names:
            raise RequestError("tool_choice",
                               f"tool_choice names {shown(fn['name'])} but the request declares no tools")
        if fn["name"] not in names:
            raise RequestError(f"{param}.name",
                               f"tool_choice names {shown(fn['name'])}, which is not in tools")
    elif tool_choice not in (None, "auto", "required", "none"):
        raise RequestError("tool_choice", f"unsupported tool_choice {shown(tool_choice)}; use auto, "
                                          "required, none or a named function")
    elif tool_choice == "required" and not names and not hosted:
        raise RequestError("tool_choice", "tool_choice 'required' needs tools")


def _response_format_section(name: Any, description: Any, schema: Any, param: str) -> str:
    # "# Response Formats / ## name / // description / schema", as gpt-oss was trained.
    if not isinstance(name, str) or not name:
        raise RequestError(f"{param}.name", "a json_schema response format needs a name")
    check_schema(schema, f"{param}.schema")
    lines = ["# Response Formats", "", f"## {name}", ""]
    if isinstance(description, str) and description:
        lines.append(f"// {description}")
    lines.append(json.dumps(schema, separators=(",", ":"), ensure_ascii=False))
    return "\n".join(lines)


def _format_from(fmt: Any, param: str, nested: bool) -> str | None:
    if fmt is None:
        return None
    if not isinstance(fmt, dict):
        raise RequestError(param, "must be an object")
    check_json(fmt, param)
    kind = fmt.get("type")
    if kind in (None, "text"):
        return None
    if kind == "json_object":
        return _response_format_section("json_object", None, {"type": "object"}, param)
    if kind == "json_schema":
        spec = fmt.get("json_schema") if nested else fmt
        if not isinstance(spec, dict):
            raise RequestError(f"{param}.json_schema", "must be an object")
        # The schema is optional (as in OpenAI's API): without one, any JSON object.
        return _response_format_section(spec.get("name"), spec.get("description"),
                                        spec.get("schema", {"type": "object"}),
                                        f"{param}.json_schema" if nested else param)
    raise RequestError(f"{param}.type", f"unsupported response format {shown(kind)}")


# A web_search_call action -> (the browser tool, the action's field, the tool's argument).
_BROWSER_ACTIONS = {"search": ("browser.search", "query", "query"),
                    "open_page": ("browser.open", "url", "id"),
                    "find_in_page": ("browser.find", "pattern", "pattern")}


def _str_or_none(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _message(role: Role, text: str, *, name: str | None = None, channel: str | None = None,
             recipient: str | None = None, content_type: str | None = None) -> Message:
    author = _AUTHORS[role] if name is None else text_author(role, name)
    return text_message(author, text, channel, recipient, content_type)


# One author a role, shared by the messages built here (never changed after): a conversation
# of many messages is built faster without one per message.
_AUTHORS = {role: Author(role=role) for role in Role}


#: Rendered conversation messages, by the client's message (or input item) they came from and
#: what else changes them: an agent loop that re-sends its history pays for its new messages
#: only. Bounded by bytes (the gateway's ``--render-cache-mb``); 0 turns it off.
MESSAGE_CACHE_BYTES = 64 << 20


# A message kept as plain values: (role, name, channel, recipient, content type, text), the
# role by its value (an Enum member would keep the tuple in the collector's sight).
_Kept = tuple[str, "str | None", "str | None", "str | None", "str | None", str]
_ROLES = {role.value: role for role in Role}
_VALUES = {role: role.value for role in Role}  # (an Enum's .value is slow to read)
# What one client message became: its serialization (to check a hit; None where the key is
# the message's own strings), whether that holds a null (which a NaN serializes as too), its
# messages, their tokens, the calls it made. Only tuples, bytes and strings: the garbage
# collector stops walking them after one look, so a full cache costs no collection anything
# (Message objects kept here cost ~100 ms a full collection at 64 MB, stalling every stream);
# a hit rebuilds its messages.
_Rendered = tuple["bytes | None", bool, tuple[_Kept, ...], tuple[tuple[int, ...], ...],
                  tuple[tuple[str, str], ...]]

MESSAGE_CACHE: LRU[tuple[Any, ...], _Rendered] = LRU(MESSAGE_CACHE_BYTES)


def _plain(source: dict[str, Any]) -> tuple[tuple[str, str | None], ...] | None:
    """A message whose fields are all strings (or null) as its own key, in its key order: no
    serialization, and a hit is an equal key (most of an agent's history: its tool results,
    its user and answer messages)."""
    for value in source.values():
        if value.__class__ is not str and value is not None:
            return None
    return tuple(source.items())


def _finite(source: dict[str, Any]) -> bool:
    """No NaN or infinity among ``source``'s fields (serialized, they read as null). Only there
    does null pass where NaN is refused (``content``, ``reasoning_content``, ``tool_calls``);
    deeper, both are refused alike, or both ignored."""
    for value in source.values():
        if isinstance(value, float) and not math.isfinite(value):
            return False
    return True


class _Builder:
    """Collects a request's messages into a Harmony conversation, each with its tokens."""

    def __init__(self, encoding: HarmonyEncoding, api: str, cache: bool) -> None:
        self.encoding = encoding
        self._render = encoding.render_text_append
        self.api = api
        self.cache = MESSAGE_CACHE if cache else None
        self.instructions: list[str] = []
        self.items: list[_Kept] = []  # each message as plain values (built as a Message when asked)
        self.tokens: list[int] = []  # every message's, one after another
        self.spans: list[tuple[int, int]] = []  # where each message's are
        self.call_names: dict[str, str] = {}
        self._calls: list[tuple[str, str]] = []
        self.approvals: dict[str, str] = {}  # mcp_approval_request id -> the call's recipient

    def add(self, role: Role, text: str, *, name: str | None = None, channel: str | None = None,
            recipient: str | None = None, content_type: str | None = None) -> None:
        self.items.append((_VALUES[role], name, channel, recipient, content_type, text))
        tokens = self.tokens
        start = len(tokens)
        self._render(role, text, tokens, name=name, channel=channel, recipient=recipient,
                     content_type=content_type)
        self.spans.append((start, len(tokens)))

    def cached(self, source: dict[str, Any], context: Any, build: Callable[..., None],
               *args: Any) -> None:
        """``build(self, *args)`` adds what the client's ``source`` (a message or an input item)
        becomes; when an equal source became it before in the same ``context`` (all else its
        messages depend on), what it became then is added instead: no conversion, no tokens."""
        cache = self.cache
        if cache is None:
            build(self, *args)
            return
        data: bytes | None = None
        plain = _plain(source)
        if plain is not None:
            key: tuple[Any, ...] = (self.api, id(self.encoding), context, plain)
        else:
            data = parts_key(source)  # the client's key order kept
            if data is None:  # not JSON: built (and refused) without the cache
                build(self, *args)
                return
            key = (self.api, id(self.encoding), context, compact_key(data))
        found = cache.get(key)
        if found is not None and (data is None or (found[0] == data and (not found[1] or _finite(source)))):
            self.items += found[2]
            flat, spans = self.tokens, self.spans
            for toks in found[3]:
                start = len(flat)
                flat += toks
                spans.append((start, len(flat)))
            self.call_names.update(found[4])
            self._calls += found[4]
            return
        first, calls = len(self.items), len(self._calls)
        build(self, *args)
        kept = tuple(self.items[first:])
        tokens = tuple(tuple(self.tokens[a:b]) for a, b in self.spans[first:])
        if data is None:  # the key holds the client's strings, which the messages share
            held = sum(len(k) + len(v or "") for k, v in plain or ())
        else:  # the texts are held once (the client's dict goes), and once more serialized
            data = bytes(memoryview(data))  # exactly its length (orjson's output may hold 4 KB)
            held = 2 * len(data)
        entry = (data, data is not None and b"null" in data, kept, tokens, tuple(self._calls[calls:]))
        cache.put(key, entry, ENTRY_BYTES * (1 + len(kept)) + held + TOKEN_BYTES * sum(map(len, tokens)))

    def assistant(self, reasoning: str, content: str, calls: Sequence[tuple[str, str, str]]) -> None:
        if reasoning:
            self.add(Role.ASSISTANT, reasoning, channel="analysis")
        if content:
            # Text next to tool calls is a preamble (commentary); alone it is the answer.
            channel = "commentary" if calls else "final"
            self.add(Role.ASSISTANT, content, channel=channel)
        for call_id, name, arguments in calls:
            self.call(call_id, identifier(name), arguments)  # as the prompt declared it

    def call(self, call_id: str, rendered: str, arguments: str) -> None:
        """A call of ``rendered`` (a function's identifier, or a namespace's ``NS.TOOL``)."""
        self.call_names[call_id] = rendered
        self._calls.append((call_id, rendered))
        self.add(Role.ASSISTANT, arguments, channel="commentary", recipient=_recipient(rendered),
                 content_type="<|constrain|>json")

    def builtin_call(self, item: dict[str, Any], param: str) -> None:
        """A built-in tool call the gateway emitted (``web_search_call``, ``code_interpreter_call``),
        rendered back as the model wrote it: from its ``harmony`` field, else from the item; then
        the result the model read, when the item holds it (the gateway ran the tool)."""
        written = item.get("harmony")
        if isinstance(written, dict) and isinstance(written.get("recipient"), str) \
                and isinstance(written.get("arguments"), str):
            channel = _str_or_none(written.get("channel"))
            self.add(Role.ASSISTANT, written["arguments"], channel=channel,
                     recipient=written["recipient"], content_type=_str_or_none(written.get("content_type")))
            result, tool = written.get("result"), written.get("tool")
            if isinstance(result, str) and isinstance(tool, str) and tool:
                if tool != "python" and not (tool.startswith("browser.") and tool[8:].isidentifier()):
                    raise RequestError(f"{param}.harmony.tool", f"a built-in tool is python or browser.NAME, "
                                                                f"not {shown(tool)}")
                self.add(Role.TOOL, result, name=tool, channel=channel, recipient="assistant")
            return
        if item["type"] == "code_interpreter_call":
            code = item.get("code")
            if not isinstance(code, str):
                raise RequestError(f"{param}.code", "a code_interpreter_call needs its code as a string")
            self.add(Role.ASSISTANT, code, channel="analysis", recipient="python", content_type="code")
            outputs = item.get("outputs")
            if isinstance(outputs, list) and outputs:
                logs = "".join(o["logs"] for o in outputs
                               if isinstance(o, dict) and isinstance(o.get("logs"), str))
                self.add(Role.TOOL, logs, name="python", channel="analysis", recipient="assistant")
            return
        action = item.get("action")
        kind = action.get("type") if isinstance(action, dict) else None
        args = _BROWSER_ACTIONS.get(kind) if isinstance(kind, str) else None
        if args is None or not isinstance(action, dict):
            raise RequestError(f"{param}.action", f"unsupported web_search_call action {shown(kind)}")
        recipient, field, name = args
        self.add(Role.ASSISTANT, json.dumps({name: action.get(field)}), channel="analysis",
                 recipient=recipient, content_type="code")

    def call_name(self, call_id: Any, param: str) -> str:
        """The tool an earlier assistant call with this id called (as the prompt names it)."""
        name = self.call_names.get(call_id) if isinstance(call_id, str) else None
        if name is None:
            raise RequestError(param, f"no earlier assistant tool call has id {shown(call_id)}")
        return name

    def tool_result(self, name: str, output: str) -> None:
        self.add(Role.TOOL, output, name=_recipient(name), channel="commentary", recipient="assistant")


@dataclass
class Developer:
    """What a request's developer message says: its instructions, function tools (each with
    its TypeScript) and response format section; rendered without building the message."""

    instructions: str | None
    tools: tuple[_Tool, ...]
    response_format: str | None
    mcp: tuple[McpNamespace, ...] = ()  # MCP servers' tools, a namespace each, after the functions

    def message(self) -> Message:
        dev = DeveloperContent.new()
        if self.instructions is not None:
            dev = dev.with_instructions(self.instructions)
        if self.tools:
            dev = dev.with_function_tools([t.description for t in self.tools])
        for ns in self.mcp:
            dev = dev.with_tools(ToolNamespaceConfig(name=ns.rendered, description=ns.description, tools=[
                ToolDescription.new(identifier(n), d, s) for n, d, s in ns.tools]))
        parts: list[Any] = []
        if self.instructions is not None or self.tools or self.mcp:
            parts.append(dev)
        if self.response_format:
            parts.append(TextContent(text=self._format_text()))
        return Message.from_role_and_contents(Role.DEVELOPER, parts)

    def render(self, encoding: HarmonyEncoding, out: list[int]) -> None:
        """Append the tokens ``encoding.render(self.message())`` gives."""
        spaces = [namespace_parts("functions", None, [t.text for t in self.tools])] if self.tools else []
        for ns in self.mcp:
            texts = [tool_text(identifier(n), d, s) for n, d, s in ns.tools]
            spaces.append(namespace_parts(ns.rendered, ns.description, texts))
        tools = section_parts(spaces) if spaces else []
        encoding.render_developer_append(self.instructions, tools,
                                         self._format_text() if self.response_format else None, out)

    def _format_text(self) -> str:
        assert self.response_format
        first = self.instructions is not None or self.tools or self.mcp
        return ("\n\n" if first else "") + self.response_format


# Not frozen (never changed after it is made, though): a frozen dataclass takes ~1 µs longer
# to build, and a dataset builds one a record.
@dataclass
class Head:
    """A rendered request head (system and developer message): its tokens and the declared
    names; its messages built when first read. Cached by the request fields it was built from
    (``HEAD_CACHE``), so an agent loop re-sending the same request pays only for its new
    messages; its system message (the same for nearly every request) is cached on its own
    (``SYSTEM_CACHE``), its tools one by one (``TOOL_SPECS``, each with its TypeScript) and
    their text in parts (the renderer keeps each part's tokens)."""

    tokens: tuple[int, ...]
    declared: tuple[str, ...]  # the function names, as the request declared them
    has_tools: bool
    system: Message
    developer: Developer | None

    @functools.cached_property
    def names(self) -> ToolNames:
        # Built when first read (a dataset never does); the names were checked when read.
        return ToolNames.of(self.declared)

    @functools.cached_property
    def messages(self) -> tuple[Message, ...]:
        if self.developer is None:
            return (self.system,)
        return (self.system, self.developer.message())


#: Request heads by all they are made of: the encoding, API, effort, instructions, tool_choice
#: and response format (serialized; checked equal on a hit), and the tools as ``TOOL_SPECS``
#: read them. Second sight: a dataset whose records each have their own head stores none.
HEAD_CACHE: LRU[tuple[Any, ...], tuple[tuple[Any, Any], Head]] = LRU(256, second_sight=True)
# By (encoding, effort, whether tools are declared): a handful of entries.
SYSTEM_CACHE: dict[tuple[Any, ...], tuple[Message, tuple[int, ...]]] = {}
_OPTIONS = {has: RenderOptions(conversation_has_function_tools=has) for has in (False, True)}
_FORMAT_PARAM = {"chat": "response_format", "responses": "text.format"}


def _system(encoding: HarmonyEncoding, effort: ReasoningEffort, has_tools: bool,
            hosted: tuple[ToolNamespaceConfig, ...] = ()) -> tuple[Message, tuple[int, ...]]:
    key = (id(encoding), effort, has_tools, tuple([(ns.name, ns.description) for ns in hosted]))
    found = SYSTEM_CACHE.get(key)
    if found is None:
        content = SystemContent.new().with_reasoning_effort(effort)
        for ns in hosted:
            content = content.with_tools(ns)
        message = Message.from_role_and_content(Role.SYSTEM, content)
        found = SYSTEM_CACHE[key] = (message, tuple(encoding.render(message, _OPTIONS[has_tools])))
    return found


def _head(encoding: HarmonyEncoding, api: str, effort: ReasoningEffort, instructions: list[str],
          tools: Any, tool_choice: Any, fmt: Any,
          hosted_texts: Mapping[str, ToolNamespaceConfig] | None = None,
          mcp: tuple[McpNamespace, ...] = ()) -> Head:
    """The request's head: the system message (with the built-in tools Responses' hosted tools
    ask for), and the developer message with its instructions, tools (``tool_choice: "none"``
    shows none) and response format (``fmt``)."""
    nested = api == "chat"  # where a tool and a response format keep their fields
    entries = _read_tools(tools, nested)
    hosted = () if nested else _hosted(tools, hosted_texts)
    if not nested:
        mcp = client_namespaces(tools) + mcp  # the client's namespaces, then its MCP servers
    extras = (tool_choice, fmt)
    data = b"" if extras == (None, None) else parts_key(extras)  # None: not JSON, not kept
    key = None if data is None else (id(encoding), api, effort, tuple(instructions), compact_key(data),
                                     entries, tuple([(ns.name, ns.description) for ns in hosted]),
                                     repr(mcp) if mcp else None)
    if key is not None:
        found = HEAD_CACHE.get(key)
        if found is not None and found[0] == extras:
            return found[1]
    declared = tuple([e.declared for e in entries])
    if len({e.description.name for e in entries}) < len(entries):
        ToolNames.of(declared)  # two names that render alike: the error says which
    _check_tool_choice(tool_choice, declared, [ns.name for ns in hosted] + (["mcp"] if mcp else []))
    response_format = _format_from(fmt, _FORMAT_PARAM[api], nested)
    listed = () if tool_choice == "none" else entries
    shown_mcp = () if tool_choice == "none" else mcp
    system, tokens = _system(encoding, effort, bool(listed or shown_mcp), hosted)
    if not (instructions or listed or response_format or shown_mcp):
        head = Head(tokens, declared, bool(listed), system, None)
    else:
        developer = Developer("\n\n".join(instructions) if instructions else None, listed, response_format,
                              shown_mcp)
        out = list(tokens)
        developer.render(encoding, out)
        head = Head(tuple(out), declared, bool(listed), system, developer)
    if key is not None:
        HEAD_CACHE.put(key, (extras, head), 1)
    return head


@dataclass
class Request:
    """A request read as Harmony: its (cached) rendered head, then the other messages and
    each one's tokens (the chain-of-thought rule not applied yet)."""

    head: Head
    items: list[_Kept]
    tokens: list[int]
    spans: list[tuple[int, int]]  # each message's tokens: tokens[start + a : start + b]
    start: int = 0

    @functools.cached_property
    def messages(self) -> list[Message]:
        """The messages after the head, built now from the values each was kept as."""
        return [_message(_ROLES[m[0]], m[5], name=m[1], channel=m[2], recipient=m[3], content_type=m[4])
                for m in self.items]

    def roles(self) -> list[str]:
        """The role of each message after the head (``"user"``, ``"assistant"``, ``"tool"``)."""
        return [m[0] for m in self.items]

    def channels(self) -> list[str | None]:
        """The channel of each message after the head."""
        return [m[2] for m in self.items]

    def tokens_of(self, i: int) -> list[int]:
        """The tokens of ``messages[i]``."""
        start, end = self.spans[i]
        return self.tokens[self.start + start : self.start + end]


def _prompt(encoding: HarmonyEncoding, read: Request) -> Prompt:
    head = read.head
    # As render_conversation_for_completion renders it: the chain-of-thought rule over the
    # whole conversation (the head, system and developer, takes no part in it), each message
    # on its own.
    channels = read.channels()
    drop = drop_boundary(read.roles(), channels)
    if drop <= 0 and not read.start:
        # The prompt takes the request's tokens, the head put before them in place: copying
        # an agent's 40k tokens costs ~100 µs, moving them ~4 µs.
        tokens = read.tokens
        tokens[:0] = head.tokens
        read.start = len(head.tokens)
    else:
        tokens = list(head.tokens)
        for i in range(len(read.spans)):
            if i >= drop or channels[i] != "analysis":
                tokens += read.tokens_of(i)
    tokens += next_turn(encoding)
    return Prompt(tokens, tool_names=list(head.declared), names=head.names, request=read)


_NEXT_TURNS: dict[int, list[int]] = {}


def next_turn(encoding: HarmonyEncoding) -> list[int]:
    """``<|start|>assistant``, where the prompt ends."""
    found = _NEXT_TURNS.get(id(encoding))
    if found is None:
        found = _NEXT_TURNS[id(encoding)] = [START, *encoding.encode(Role.ASSISTANT.value)]
    return found


def api_of(body: dict[str, Any]) -> str:
    """``"responses"`` for a body with ``input`` and no ``messages``, else ``"chat"``."""
    return "responses" if "input" in body and "messages" not in body else "chat"


def _check_encoding(encoding: Any) -> None:
    if not isinstance(encoding, HarmonyEncoding):
        raise TypeError("encoding must be a HarmonyEncoding (load_harmony_encoding(...)), "
                        f"got {type(encoding).__name__}")


def render_chat_request(encoding: HarmonyEncoding, request: dict[str, Any]) -> Prompt:
    """Render a Chat Completions request body.

    >>> from harmonykit import load_harmony_encoding
    >>> enc = load_harmony_encoding("HarmonyGptOss")
    >>> p = render_chat_request(enc, {"messages": [{"role": "user", "content": "Hi"}]})
    >>> enc.decode_utf8(p.tokens[-7:])
    '<|start|>user<|message|>Hi<|end|><|start|>assistant'
    """
    return _prompt(encoding, read_chat_request(encoding, request))


def read_chat_request(encoding: HarmonyEncoding, request: dict[str, Any], *,
                      cache: bool = True) -> Request:
    """A Chat Completions body as Harmony (``cache``: use and fill ``MESSAGE_CACHE``)."""
    _check_encoding(encoding)
    if not isinstance(request, dict):
        raise RequestError(None, "the request body must be a JSON object")
    messages = request.get("messages")
    if not isinstance(messages, list) or not messages:
        raise RequestError("messages", "messages must be a non-empty list")
    b = _Builder(encoding, "chat", cache)
    for i, msg in enumerate(messages):
        param = f"messages[{i}]"
        if not isinstance(msg, dict):
            raise RequestError(param, "each message must be an object")
        role = msg.get("role")
        if role in ("system", "developer"):
            b.instructions.append(_text(msg.get("content"), f"{param}.content"))
        elif role == "user":
            b.cached(msg, None, _user, msg, param)
        elif role == "assistant":
            b.cached(msg, None, _chat_assistant, msg, param)
        elif role == "tool":
            name = b.call_name(msg.get("tool_call_id"), f"{param}.tool_call_id")
            b.cached(msg, name, _tool_result, msg.get("content"), f"{param}.content", name)
        else:
            raise RequestError(f"{param}.role", f"unknown role {shown(role)}")
    # vLLM's own server also takes the effort in chat_template_kwargs; the top-level field wins.
    kwargs = request.get("chat_template_kwargs")
    if kwargs is not None and not isinstance(kwargs, dict):
        raise RequestError("chat_template_kwargs", "chat_template_kwargs must be an object")
    if request.get("reasoning_effort") is not None:
        effort = _effort(request["reasoning_effort"], "reasoning_effort")
    elif kwargs and kwargs.get("reasoning_effort") is not None:
        effort = _effort(kwargs["reasoning_effort"], "chat_template_kwargs.reasoning_effort")
    else:
        effort = ReasoningEffort.MEDIUM

    head = _head(encoding, "chat", effort, b.instructions, request.get("tools"), request.get("tool_choice"),
                 request.get("response_format"))
    return Request(head, b.items, b.tokens, b.spans)


# What one client message or input item becomes (``_Builder.cached`` runs them).


def _user(b: _Builder, item: dict[str, Any], param: str) -> None:
    b.add(Role.USER, _text(item.get("content"), f"{param}.content"))


def _tool_result(b: _Builder, output: Any, param: str, name: str) -> None:
    b.tool_result(name, output if isinstance(output, str) else _text(output, param))


def _chat_assistant(b: _Builder, msg: dict[str, Any], param: str) -> None:
    calls = []
    tool_calls = msg.get("tool_calls") or []
    if not isinstance(tool_calls, list):
        raise RequestError(f"{param}.tool_calls", "tool_calls must be a list")
    for j, call in enumerate(tool_calls):
        fn = call.get("function") if isinstance(call, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) \
                or not isinstance(call.get("id"), str):
            raise RequestError(f"{param}.tool_calls[{j}]",
                               "a tool call needs an id and a function with a name")
        arguments = fn.get("arguments", "")
        if not isinstance(arguments, str):
            raise RequestError(f"{param}.tool_calls[{j}].function.arguments",
                               "arguments must be a JSON string")
        calls.append((call["id"], fn["name"], arguments))
    reasoning = msg.get("reasoning_content", msg.get("reasoning")) or ""
    if not isinstance(reasoning, str):
        raise RequestError(f"{param}.reasoning_content", "reasoning must be a string")
    b.assistant(reasoning, _text(msg.get("content"), f"{param}.content", allow_none=True), calls)


def render_responses_request(encoding: HarmonyEncoding, request: dict[str, Any], *,
                             hosted: Mapping[str, ToolNamespaceConfig] | None = None,
                             mcp: Sequence[McpNamespace] = ()) -> Prompt:
    """Render a Responses API request body (``input``, ``instructions``, ``tools``, ...);
    ``hosted``: how this deployment declares the built-in tools (harmony's texts by default);
    ``mcp``: the tools its MCP servers listed (the ``mcp`` tools themselves declare nothing)."""
    return _prompt(encoding, read_responses_request(encoding, request, hosted=hosted, mcp=mcp))


def read_responses_request(encoding: HarmonyEncoding, request: dict[str, Any], *,
                           cache: bool = True,
                           hosted: Mapping[str, ToolNamespaceConfig] | None = None,
                           mcp: Sequence[McpNamespace] = ()) -> Request:
    """A Responses body as Harmony (``cache``: use and fill ``MESSAGE_CACHE``)."""
    _check_encoding(encoding)
    if not isinstance(request, dict):
        raise RequestError(None, "the request body must be a JSON object")
    b = _Builder(encoding, "responses", cache)
    instructions = request.get("instructions")
    if instructions is not None:
        if not isinstance(instructions, str):
            raise RequestError("instructions", "instructions must be a string")
        b.instructions.append(instructions)
    items = request.get("input")
    if isinstance(items, str):
        items = [{"role": "user", "content": items}]
    if not isinstance(items, list) or not items:
        raise RequestError("input", "input must be a string or a non-empty list of items")
    pending_reasoning: list[str] = []
    for i, item in enumerate(items):
        param = f"input[{i}]"
        if not isinstance(item, dict):
            raise RequestError(param, "each input item must be an object")
        kind = item.get("type", "message")
        # The reasoning items before an assistant item become its analysis message.
        if kind == "message":
            role = item.get("role")
            if role in ("system", "developer"):
                b.instructions.append(_text(item.get("content"), f"{param}.content"))
            elif role == "user":
                b.cached(item, None, _user, item, param)
            elif role == "assistant":
                reasoning = "".join(pending_reasoning)
                b.cached(item, reasoning, _responses_assistant, item, param, reasoning)
                pending_reasoning = []
            else:
                raise RequestError(f"{param}.role", f"unknown role {shown(role)}")
        elif kind == "reasoning":
            key = "content" if item.get("content") else "summary"
            parts = item.get(key) or []
            if not isinstance(parts, list):
                raise RequestError(f"{param}.{key}", f"a reasoning item's {key} must be a list of text parts")
            pending_reasoning.append(_text(
                [{"type": "text", "text": p.get("text")} if isinstance(p, dict) else p for p in parts],
                f"{param}.{key}"))
        elif kind in ("function_call", "web_search_call", "code_interpreter_call"):
            reasoning = "".join(pending_reasoning)
            build = _function_call if kind == "function_call" else _builtin_call
            b.cached(item, reasoning, build, item, param, reasoning)
            pending_reasoning = []
        elif kind in ("mcp_call", "mcp_approval_request"):  # not cached: approvals are looked up by id
            _mcp_call(b, item, param, "".join(pending_reasoning))
            pending_reasoning = []
        elif kind == "mcp_approval_response":
            _mcp_approval(b, item, param)
        elif kind == "mcp_list_tools":
            pass  # the listing declares the server's tools (the gateway reads it); nothing to render
        elif kind == "item_reference":
            raise RequestError(f"{param}.type", "an item_reference names an item of a stored response: "
                                                "it needs the gateway's store (this one runs with --store "
                                                "none); send the item itself")
        elif kind == "function_call_output":
            name = b.call_name(item.get("call_id"), f"{param}.call_id")
            b.cached(item, name, _tool_result, item.get("output"), f"{param}.output", name)
        else:
            raise RequestError(f"{param}.type", f"unsupported input item type {shown(kind)}")
    if pending_reasoning:
        b.assistant("".join(pending_reasoning), "", [])
    reasoning_cfg = request.get("reasoning") or {}
    if not isinstance(reasoning_cfg, dict):
        raise RequestError("reasoning", "reasoning must be an object")
    effort = _effort(reasoning_cfg["effort"], "reasoning.effort") \
        if reasoning_cfg.get("effort") is not None else ReasoningEffort.MEDIUM
    text_cfg = request.get("text")
    if text_cfg is not None and not isinstance(text_cfg, dict):
        raise RequestError("text", 'text must be an object, such as {"format": {"type": "json_object"}}')

    head = _head(encoding, "responses", effort, b.instructions, request.get("tools"),
                 request.get("tool_choice"), (text_cfg or {}).get("format"), hosted, tuple(mcp))
    return Request(head, b.items, b.tokens, b.spans)


def _responses_assistant(b: _Builder, item: dict[str, Any], param: str, reasoning: str) -> None:
    b.assistant(reasoning, _text(item.get("content"), f"{param}.content"), [])


def _builtin_call(b: _Builder, item: dict[str, Any], param: str, reasoning: str) -> None:
    b.assistant(reasoning, "", [])
    b.builtin_call(item, param)


def _mcp_call(b: _Builder, item: dict[str, Any], param: str, reasoning: str) -> None:
    """An MCP call (or the approval request of one): the call as the model writes it, then
    (an ``mcp_call``'s) what it returned or the error. A call made after an approval request
    shows only its result: the request showed the call."""
    label, name, arguments = item.get("server_label"), item.get("name"), item.get("arguments", "")
    if not isinstance(label, str) or not isinstance(name, str) or not isinstance(arguments, str):
        raise RequestError(param, f"an {item['type']} needs string server_label, name and arguments")
    recipient = f"{identifier(label)}.{identifier(name)}"
    b.assistant(reasoning, "", [])
    if item["type"] == "mcp_approval_request":
        if isinstance(item.get("id"), str):
            b.approvals[item["id"]] = recipient
    if item["type"] == "mcp_approval_request" or not item.get("approval_request_id"):
        b.add(Role.ASSISTANT, arguments, channel="commentary", recipient=recipient,
              content_type="<|constrain|>json")
    if item["type"] == "mcp_call":
        error = item.get("error")
        text = item.get("output") if error is None else f"Error: {_mcp_error_text(error)}"
        b.add(Role.TOOL, text if isinstance(text, str) else "", name=recipient, channel="commentary",
              recipient="assistant")


def _mcp_error_text(error: Any) -> str:
    if isinstance(error, str):
        return error
    if isinstance(error, dict):
        message = error.get("message")
        if isinstance(message, str):
            return message
        content = error.get("content")
        if isinstance(content, list):
            return "".join(c.get("text", "") for c in content if isinstance(c, dict))
    return json.dumps(error)


def _mcp_approval(b: _Builder, item: dict[str, Any], param: str) -> None:
    """A refusal is the call's result the model reads; an approval shows as the call's result
    once it has run (its ``mcp_call``)."""
    approve, rid = item.get("approve"), item.get("approval_request_id")
    if not isinstance(approve, bool) or not isinstance(rid, str):
        raise RequestError(param, "an mcp_approval_response needs approval_request_id and approve "
                                  "(true or false)")
    recipient = b.approvals.get(rid)
    if recipient is None:
        raise RequestError(f"{param}.approval_request_id",
                           f"no earlier mcp_approval_request has id {shown(rid)}")
    if approve:
        return
    reason = item.get("reason")
    why = f" Reason: {reason}" if isinstance(reason, str) and reason else ""
    text = "The user declined this call." + why
    b.add(Role.TOOL, text, name=recipient, channel="commentary", recipient="assistant")


def _function_call(b: _Builder, item: dict[str, Any], param: str, reasoning: str) -> None:
    call_id, name, arguments = item.get("call_id"), item.get("name"), item.get("arguments", "")
    if not isinstance(call_id, str) or not isinstance(name, str) or not isinstance(arguments, str):
        raise RequestError(param, "a function_call needs string call_id, name and arguments")
    space = item.get("namespace")
    if isinstance(space, str) and space:  # a tool of a namespace: called as NS.TOOL
        b.assistant(reasoning, "", [])
        b.call(call_id, f"{identifier(space)}.{identifier(name)}", arguments)
        return
    b.assistant(reasoning, "", [(call_id, name, arguments)])
