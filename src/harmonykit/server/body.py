"""Reading a large JSON request body without holding the GIL for all of it.

``orjson.loads`` of a body with 250k messages takes ~80 ms and holds the GIL throughout:
every other stream stalls that long. ``loads_in_pieces`` (run in a worker thread) reads the
top-level object key by key and the conversation (``messages`` / ``input``) item by item,
each with the standard library's C scanner, so the event loop runs between items. It
accepts exactly what ``orjson.loads`` accepts: anything it is unsure of (NaN, a lone
surrogate escape, JSON it cannot read) is handed to ``orjson.loads``, whose answer or error
is the one given.
"""

from __future__ import annotations

import json
import re
from json.decoder import scanstring  # type: ignore[attr-defined]
from typing import Any

import orjson

#: Bodies from this size are read in pieces (below it, one orjson call is the faster).
PIECES_FROM = 1 << 20
_SPACE = re.compile(r"[ \t\n\r]*")
# What the two read differently: a lone surrogate escape, NaN and the infinities (orjson
# refuses them), integers past 64 bits (orjson reads a float), exponents of three digits
# (orjson refuses what overflows). Anywhere, strings included: such a body goes to orjson.
_ORJSON_ONLY = re.compile(r"\\u[dD][89a-fA-F]|NaN|Infinity|\d{19}|[eE][+-]?\d{3}")
_CONVERSATION = ("messages", "input")


class _Unsure(Exception):
    pass


def loads_in_pieces(data: bytes) -> Any:
    """``orjson.loads(data)``, letting the GIL go between the conversation's items."""
    try:
        text = data.decode("utf-8")
        if _ORJSON_ONLY.search(text) is None:
            return _object(text)
    except (UnicodeDecodeError, ValueError, _Unsure):
        pass
    return orjson.loads(data)


def _object(text: str) -> dict[str, Any]:
    decode = json.JSONDecoder().raw_decode
    out: dict[str, Any] = {}
    i = _SPACE.match(text, 0).end()  # type: ignore[union-attr]
    if text[i : i + 1] != "{":
        raise _Unsure
    i = _SPACE.match(text, i + 1).end()  # type: ignore[union-attr]
    if text[i : i + 1] == "}":
        return _end(text, i + 1, out)
    while True:
        if text[i : i + 1] != '"':
            raise _Unsure
        key, i = scanstring(text, i + 1)
        i = _SPACE.match(text, i).end()  # type: ignore[union-attr]
        if text[i : i + 1] != ":":
            raise _Unsure
        i = _SPACE.match(text, i + 1).end()  # type: ignore[union-attr]
        if key in _CONVERSATION and text[i : i + 1] == "[":
            value, i = _array(text, i, decode)
        else:
            value, i = decode(text, i)
        out[key] = value
        i = _SPACE.match(text, i).end()  # type: ignore[union-attr]
        if text[i : i + 1] == "}":
            return _end(text, i + 1, out)
        if text[i : i + 1] != ",":
            raise _Unsure
        i = _SPACE.match(text, i + 1).end()  # type: ignore[union-attr]


def _array(text: str, i: int, decode: Any) -> tuple[list[Any], int]:
    items: list[Any] = []
    i = _SPACE.match(text, i + 1).end()  # type: ignore[union-attr]
    if text[i : i + 1] == "]":
        return items, i + 1
    while True:
        item, i = decode(text, i)  # one item: the GIL may go to the event loop after it
        items.append(item)
        i = _SPACE.match(text, i).end()  # type: ignore[union-attr]
        if text[i : i + 1] == "]":
            return items, i + 1
        if text[i : i + 1] != ",":
            raise _Unsure
        i = _SPACE.match(text, i + 1).end()  # type: ignore[union-attr]


def _end(text: str, i: int, out: dict[str, Any]) -> dict[str, Any]:
    if _SPACE.match(text, i).end() != len(text):  # type: ignore[union-attr]
        raise _Unsure
    return out
