"""Large requests without stalling the event loop: every other stream keeps its pace while
one client sends megabytes (a 12 MB message, 250k messages).

A large request is read and rendered in a worker thread, and three things that would hold
the GIL for a long time at once are avoided:

- the parse: ``orjson.loads`` of 250k messages holds it ~80 ms. ``loads_in_pieces`` reads
  the top-level object key by key and the conversation (``messages`` / ``input``) item by
  item with the standard library's C scanner, so the event loop runs between items. It
  accepts exactly what ``orjson.loads`` accepts: what it is unsure of (NaN, a lone
  surrogate escape, an integer past 64 bits, JSON it cannot read) goes to ``orjson.loads``,
  whose answer or error is the one given;
- the collector: millions of live objects made each full collection take half a second.
  Under ``young_only()`` only the youngest objects are collected, as often as ever;
- freeing: ``render_tokens`` lets the conversation go a few thousand objects at a time.
"""

from __future__ import annotations

import gc
import json
import math
import re
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from json.decoder import scanstring  # type: ignore[attr-defined]
from typing import Any

import orjson

from ..encoding import HarmonyEncoding
from ..openai.request import let_go

#: Bodies from this size are large: read and rendered in a worker thread (a thread hop costs
#: more than rendering a smaller one on the loop).
LARGE = 64 * 1024
#: Bodies from this size are read in pieces (below it, one orjson call is the faster).
PIECES_FROM = 1 << 20
_SPACE = re.compile(r"[ \t\n\r]*")
#: Fewer objects than this: one orjson call holds the GIL only briefly (a long string is fast).
PIECES_OBJECTS = 10_000
# A lone surrogate escape: the standard library reads it, orjson refuses it.
_SURROGATE = re.compile(r"\\u[dD][89a-fA-F]")
_CONVERSATION = ("messages", "input")


class _Unsure(Exception):
    pass


def loads_in_pieces(data: bytes) -> Any:
    """``orjson.loads(data)``, letting the GIL go between the conversation's items."""
    # Only literal scans of the whole body (memchr-fast): a regex over megabytes held the GIL
    # for longer than the parse it was to spare.
    if data.count(b"{") >= PIECES_OBJECTS:
        try:
            text = data.decode("utf-8")
            if b"\\u" not in data or _SURROGATE.search(text) is None:
                return _object(text)
        except (UnicodeDecodeError, ValueError, _Unsure):
            pass
    return orjson.loads(data)


def _constant(name: str) -> Any:
    raise _Unsure(name)  # NaN, Infinity: orjson refuses them


def _integer(digits: str) -> int:
    if len(digits.lstrip("-")) > 18:
        raise _Unsure(digits)  # past 64 bits orjson reads a float (or refuses)
    return int(digits)


def _number(digits: str) -> float:
    value = float(digits)
    if not math.isfinite(value):
        raise _Unsure(digits)  # orjson refuses what overflows
    return value


_decode = json.JSONDecoder(parse_constant=_constant, parse_int=_integer, parse_float=_number).raw_decode


def _skip(text: str, i: int) -> int:
    """Past the white space at ``i``."""
    return _SPACE.match(text, i).end()  # type: ignore[union-attr]  # matches, if emptily


def _object(text: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    i = _skip(text, 0)
    if text[i : i + 1] != "{":
        raise _Unsure
    i = _skip(text, i + 1)
    if text[i : i + 1] == "}":
        return _end(text, i + 1, out)
    while True:
        if text[i : i + 1] != '"':
            raise _Unsure
        key, i = scanstring(text, i + 1)
        i = _skip(text, i)
        if text[i : i + 1] != ":":
            raise _Unsure
        i = _skip(text, i + 1)
        if key in _CONVERSATION and text[i : i + 1] == "[":
            value, i = _array(text, i)
        else:
            value, i = _decode(text, i)
        out[key] = value
        i = _skip(text, i)
        if text[i : i + 1] == "}":
            return _end(text, i + 1, out)
        if text[i : i + 1] != ",":
            raise _Unsure
        i = _skip(text, i + 1)


def _array(text: str, i: int) -> tuple[list[Any], int]:
    items: list[Any] = []
    i = _skip(text, i + 1)
    if text[i : i + 1] == "]":
        return items, i + 1
    while True:
        item, i = _decode(text, i)  # one item: the GIL may go to the event loop after it
        items.append(item)
        i = _skip(text, i)
        if text[i : i + 1] == "]":
            return items, i + 1
        if text[i : i + 1] != ",":
            raise _Unsure
        i = _skip(text, i + 1)


def _end(text: str, i: int, out: dict[str, Any]) -> dict[str, Any]:
    if _skip(text, i) != len(text):
        raise _Unsure
    return out


_lock = threading.Lock()
_young_only = 0
_thresholds = gc.get_threshold()


@contextmanager
def young_only() -> Iterator[None]:
    """Only the youngest generation is collected inside (in any thread, until the last such
    block ends): the objects of a large request, alive until it is rendered, are then not
    walked again and again by full collections."""
    global _young_only, _thresholds
    with _lock:
        if _young_only == 0:
            _thresholds = gc.get_threshold()
            gc.set_threshold(_thresholds[0], 1 << 30, 1 << 30)
        _young_only += 1
    try:
        yield
    finally:
        with _lock:
            _young_only -= 1
            if _young_only == 0:
                gc.set_threshold(*_thresholds)


def render_tokens(render: Callable[[HarmonyEncoding, dict[str, Any]], Any], encoding: HarmonyEncoding,
                  request: dict[str, Any], keep: bool) -> list[int]:
    """The request's prompt tokens. Unless ``keep`` (the request is logged), its conversation
    goes from it, and the rendered messages go, a few thousand objects at a time."""
    prompt = render(encoding, request)
    if not keep:
        prompt.release()
        for key in _CONVERSATION:
            items = request.pop(key, None)
            if isinstance(items, list):
                let_go(items)
    tokens: list[int] = prompt.tokens
    return tokens
