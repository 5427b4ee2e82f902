"""Declared tool names: what the prompt shows the model, and what the model's recipients mean.

gpt-oss writes broken headers for tool names that are not identifiers
(``Get Intersection Layout``, ``github.create_issue``): the spaces and dots end
up in the header grammar. The mapping therefore renders every function under
an identifier (``[A-Za-z0-9_-]``, other characters become ``_``) and maps a
call back to the name the request declared. The core renderer is untouched.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from .errors import RequestError, shown

_NOT_IDENT = re.compile(r"[^A-Za-z0-9_-]")
_LOOSE = re.compile(r"[^a-z0-9]")
FUNCTIONS = "functions."


@functools.lru_cache(maxsize=4096)
def identifier(name: str) -> str:
    """The name as the prompt shows it: characters outside ``[A-Za-z0-9_-]`` become ``_``.

    >>> identifier("Get Intersection Layout"), identifier("github.create_issue")
    ('Get_Intersection_Layout', 'github_create_issue')
    """
    return _NOT_IDENT.sub("_", name)


def _loose(name: str) -> str:
    return _LOOSE.sub("", name.lower())


@dataclass(frozen=True)
class ToolNames:
    """The function names a request declared, in order, and their rendered identifiers.

    >>> names = ToolNames.of(["Get Weather", "search"])
    >>> names.rendered, names.resolve("functions.Get_Weather"), names.resolve("get weather")
    (('Get_Weather', 'search'), 'Get Weather', 'Get Weather')
    >>> names.resolve("browser.search") is None
    True
    """

    declared: tuple[str, ...] = ()
    rendered: tuple[str, ...] = ()
    _exact: dict[str, str] = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def of(cls, declared: Iterable[str], param: str = "tools", *, strict: bool = True) -> ToolNames:
        """Names in declaration order; two that render alike are a ``RequestError`` (with
        ``strict=False``, the first of them is kept)."""
        declared = tuple(declared)
        exact = dict(zip(map(identifier, declared), declared, strict=True))
        if len(exact) == len(declared):  # no two render alike (nearly always)
            rendered = tuple(exact)
            for name in declared:
                exact.setdefault(name, name)
            return cls(declared, rendered, exact)
        kept: list[str] = []
        exact = {}
        for i, name in enumerate(declared):
            ident = identifier(name)
            if ident in exact:
                if not strict:
                    continue
                other = exact[ident]
                what = "is declared twice" if other == name else \
                    f"and {shown(other)} both render as {shown(ident)}"
                raise RequestError(f"{param}[{i}]",
                                   f"function name {shown(name)} {what}; names must be unique")
            exact[ident] = name
            kept.append(name)
        names, rendered = tuple(kept), tuple(exact)  # exact holds the identifiers, in order
        for name in names:
            exact.setdefault(name, name)
        return cls(names, rendered, exact)

    def __bool__(self) -> bool:
        return bool(self.declared)

    def parser_tools(self) -> list[str]:
        """What the parser is told: both spellings, so recipients with spaces read whole."""
        return list(dict.fromkeys(self.rendered + self.declared))

    def resolve(self, recipient: str) -> str | None:
        """The declared name a recipient means (with or without ``functions.``, the rendered
        identifier, or the name with other spaces, punctuation and case), else None."""
        bare = recipient[len(FUNCTIONS) :] if recipient.startswith(FUNCTIONS) else recipient
        hit = self._exact.get(bare)
        if hit is None and bare:
            hit = self._loose_names.get(_loose(bare))
        return hit

    @functools.cached_property
    def _loose_names(self) -> dict[str, str | None]:
        # Built when a recipient is not a name as declared: most requests never need it.
        loose: dict[str, str | None] = {}
        for name in self.declared:
            key = _loose(name)
            loose[key] = name if loose.get(key, name) == name else None  # ambiguous: no match
        return loose


def declared_names(request: dict[str, Any] | None) -> ToolNames:
    """The function names of a Chat or Responses request (either tool shape), leniently:
    the output side maps whatever the request declared; ``render_*_request`` checks it."""
    tools = request.get("tools") if isinstance(request, dict) else None
    names: list[str] = []
    for t in tools if isinstance(tools, list) else []:
        if isinstance(t, dict) and t.get("type") == "namespace":  # its tools are NS.TOOL
            inner = t.get("tools")
            for fn in inner if isinstance(inner, list) and isinstance(t.get("name"), str) else []:
                if isinstance(fn, dict) and isinstance(fn.get("name"), str):
                    names.append(f"{t['name']}.{fn['name']}")
            continue
        fn = t.get("function") if isinstance(t, dict) and isinstance(t.get("function"), dict) else t
        if isinstance(fn, dict) and isinstance(fn.get("name"), str) and fn["name"]:
            names.append(fn["name"])
    return ToolNames.of(names, strict=False)
