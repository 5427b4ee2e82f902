"""One chain's browser: the page stack (cursors), and ``search`` / ``open`` / ``find`` as the
model was trained to read them. Every call gives the text the model reads; bad arguments,
unknown functions and failed fetches are results too, never exceptions.
"""

from __future__ import annotations

import json
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote, unquote

from ...encoding import HarmonyEncoding
from .page import Page, search_page

FUNCTIONS = ("search", "open", "find")
# Each function's arguments and the types the model may give them (its schema says "number").
_ARGS: dict[str, dict[str, tuple[type, ...]]] = {
    "search": {"query": (str,), "topn": (int, float), "top_n": (int, float), "source": (str,)},
    "open": {"id": (int, float, str), "cursor": (int, float), "loc": (int, float),
             "num_lines": (int, float), "view_source": (bool,), "source": (str,)},
    "find": {"pattern": (str,), "cursor": (int, float)},
}
_REQUIRED = {"search": ("query",), "open": (), "find": ("pattern",)}
_ACTIONS = {"search": "search", "find": "find_in_page"}  # the API's name of each (open: open_page)
MAX_RESULTS = 20
VIEW_TOKENS = 1024
_FIND_RESULTS = 50
_FIND_LINES = 4

Search = Callable[[str, int], Awaitable[list[tuple[str, str, str]]]]
Open = Callable[[str], Awaitable[Page]]


class UsageError(Exception):
    """A call the browser cannot do; its message is what the model reads."""


@dataclass
class Outcome:
    """What one call did: the text the model reads, and what the API shows of it."""

    text: str
    action: dict[str, Any]
    sources: list[str] = field(default_factory=list)
    error: bool = False


def _truncate(text: str, limit: int = 1024) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


@dataclass
class BrowserSession:
    """The pages a chain has seen (``stack``: the cursors) and the cached pages by URL."""

    search: Search
    open_url: Open
    encoding: HarmonyEncoding
    stack: list[Page] = field(default_factory=list)
    cache: dict[str, Page] = field(default_factory=dict)

    async def call(self, function: str, body: str) -> Outcome:
        """Run ``browser.<function>`` with the model's JSON ``body``."""
        action: dict[str, Any] = {"type": _ACTIONS.get(function, "open_page")}
        try:
            args = json.loads(body) if body.strip() else {}
        except ValueError:
            args = None
        if not isinstance(args, dict):
            return Outcome(json.dumps({"error": "Invalid function arguments"}), action, error=True)
        if function not in FUNCTIONS:
            return Outcome(json.dumps({"error": f"Unknown function: {function}"}), action, error=True)
        problem = _check(function, args)
        if problem:
            return Outcome(json.dumps({"error": f"Invalid function arguments: {problem}"}), action,
                           error=True)
        try:
            if function == "search":
                action["query"] = args["query"]
                return await self._search(args, action)
            if function == "open":
                return await self._open(args, action)
            return await self._find(args, action)
        except UsageError as e:
            return Outcome(str(e), action, error=True)

    # -- the functions -----------------------------------------------------------

    async def _search(self, args: dict[str, Any], action: dict[str, Any]) -> Outcome:
        query = args["query"]
        topn = int(args.get("topn", args.get("top_n", 10)))
        try:
            rows = await self.search(query, max(1, min(topn, MAX_RESULTS)))
        except Exception as e:  # a backend's failure is the model's to read
            raise UsageError(f"Error during search for `{query}`: {_truncate(str(e))}") from None
        page = search_page(query, rows)
        action["sources"] = [{"type": "url", "url": url} for _, url, _ in rows]
        self.stack.append(page)
        return Outcome(self._show(0, -1), action, [url for _, url, _ in rows])

    async def _open(self, args: dict[str, Any], action: dict[str, Any]) -> Outcome:
        target = args.get("id", -1)
        loc = int(args.get("loc", -1))
        num_lines = int(args.get("num_lines", -1))
        snippet_line: int | None = None
        if isinstance(target, str):
            url, fresh, stay = target, True, False
        else:
            page = self._page(int(args.get("cursor", -1)))
            if int(target) >= 0:
                url = page.links.get(str(int(target)), "")
                if not url:
                    raise UsageError(f"Invalid link id `{int(target)}`.")
                if page.snippets is not None:
                    snippet_line = page.snippets.get(str(int(target)))
                fresh, stay = False, False
            else:
                url, fresh, stay = page.url, False, not args.get("view_source")
        if args.get("view_source"):
            raise UsageError("`view_source` is not supported by this browser.")
        action["url"] = url
        new: Page | None = None
        if stay:
            new = self._page(int(args.get("cursor", -1)))
        else:
            new = self.cache.get(url) if not fresh else None
            if new is None:
                try:
                    new = await self.open_url(url)
                except Exception as e:
                    raise UsageError(f"Error fetching URL `{_truncate(url)}`: {_truncate(str(e))}") from None
                self.cache[url] = new
        self.stack.append(new)
        if loc < 0:
            loc = 0 if snippet_line is None else (snippet_line - 4 if snippet_line > 4 else snippet_line)
        return Outcome(self._show(loc, num_lines), action, [url] if url else [])

    async def _find(self, args: dict[str, Any], action: dict[str, Any]) -> Outcome:
        page = self._page(int(args.get("cursor", -1)))
        action["url"] = page.url
        pattern = str(args["pattern"]).lower()
        action["pattern"] = args["pattern"]
        if page.snippets is not None:
            raise UsageError("Cannot run `find` on search results page or find results page")
        lines = _strip_links("\n".join(page.lines())).split("\n")
        chunks: list[str] = []
        snippets: dict[str, int] = {}
        i = 0
        while i < len(lines):
            if pattern not in lines[i].lower():
                i += 1
                continue
            snippets[str(len(chunks))] = i
            chunks.append(f"# 【{len(chunks)}†match at L{i}】\n" + "\n".join(lines[i : i + _FIND_LINES]))
            if len(chunks) == _FIND_RESULTS:
                break
            i += _FIND_LINES
        text = "\n\n".join(chunks) if chunks else f"No `find` results for pattern: `{pattern}`"
        found = Page(url=f"{page.url}/find?pattern={quote(pattern)}",
                     title=f"Find results for text: `{pattern}` in `{page.title}`", text=text,
                     links={k: page.url for k in snippets}, snippets=snippets)
        self.stack.append(found)
        return Outcome(self._show(0, -1), action, [page.url] if page.url else [])

    # -- showing -------------------------------------------------------------------

    def _page(self, cursor: int) -> Page:
        if not self.stack:
            raise UsageError("No pages to access!")
        if cursor == -1 or cursor == len(self.stack) - 1:
            return self.stack[-1]
        if not 0 <= cursor < len(self.stack):
            raise UsageError(f"Cursor `{cursor}` is out of range. Available cursor indices: "
                             f"[0 - {len(self.stack) - 1}].")
        return self.stack[cursor]

    def _show(self, loc: int, num_lines: int) -> str:
        """The newest page from line ``loc``: ``num_lines`` lines, or as many as fit in about
        ``VIEW_TOKENS`` tokens. A bad ``loc`` takes the page off the stack again."""
        page = self.stack[-1]
        cursor = len(self.stack) - 1
        lines = page.lines()
        total = len(lines)
        if loc >= total:
            self.stack.pop()
            raise UsageError(f"Invalid location parameter: `{loc}`. "
                             f"Cannot exceed page maximum of {total - 1}.")
        end = self._end(loc, num_lines, lines)
        body = "\n".join(f"L{i + loc}: {line}" for i, line in enumerate(lines[loc:end]))
        shown = _truncate(unquote(page.url))
        head = page.title + (f" ({shown})" if shown else "")
        return f"[{cursor}] {head}\n**viewing lines [{loc} - {end - 1}] of {total - 1}**\n\n{body}"

    def _end(self, loc: int, num_lines: int, lines: list[str]) -> int:
        total = len(lines)
        if num_lines > 0:
            return min(loc + num_lines, total)
        text = "\n".join(f"L{i + loc}: {line}" for i, line in enumerate(lines[loc:]))
        if len(text) <= VIEW_TOKENS:
            return total
        # Tokenize only what can matter: no token is longer than ~128 characters.
        tokens = self.encoding.encode(text[: (VIEW_TOKENS + 1) * 128], disallowed_special=())
        if len(tokens) <= VIEW_TOKENS:
            return total
        offset = sum(len(self.encoding.decode([t])) for t in tokens[:VIEW_TOKENS])
        return min(loc + text[:offset].count("\n") + 1, total)


def _check(function: str, args: dict[str, Any]) -> str | None:
    """What is wrong with the arguments (None: nothing)."""
    allowed = _ARGS[function]
    for name in _REQUIRED[function]:
        if name not in args:
            return f"`{name}` is required"
    for name, value in args.items():
        if name not in allowed:
            return f"unknown argument `{name}` (browser.{function} takes {', '.join(allowed)})"
        types = allowed[name]
        if (isinstance(value, bool) and bool not in types) or not isinstance(value, types):
            return f"`{name}` must be {' or '.join(_TYPE_NAMES[t] for t in types if t is not float)}"
        if isinstance(value, float) and (value != value or abs(value) > 2**31):
            return f"`{name}` is out of range"
    return None


_TYPE_NAMES = {str: "a string", int: "a number", float: "a number", bool: "a boolean"}

_PARTIAL_START = re.compile(r"^[^【】]*】")
_PARTIAL_END = re.compile(r"【\d*(?:†(?P<content>[^†】]*)(?:†[^†】]*)?)?$")
_LINK = re.compile(r"【\d+†(?P<content>[^†】]+)(?:†[^†】]+)?】")


def _strip_links(text: str) -> str:
    text = _PARTIAL_START.sub("", text)
    text = _PARTIAL_END.sub(lambda m: m.group("content") or "", text)
    return _LINK.sub(lambda m: m.group("content"), text)

