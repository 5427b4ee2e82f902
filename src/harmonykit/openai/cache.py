"""A small cache keyed by parts of a request (plain JSON values), for work that depends only
on them: a rendered request head, a compiled grammar's text.

The key is a fast serialization of the parts, key order kept; a hit must also be equal to
them, so a request that only serializes alike (orjson writes NaN as null) is built, and
rejected, afresh. Bounded; least recently used out; thread-safe.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Any, Generic, TypeVar

try:  # optional (the server extra); only makes keys faster
    import orjson
except ImportError:  # pragma: no cover - exercised where orjson is absent
    orjson = None  # type: ignore[assignment]

T = TypeVar("T")


def parts_key(parts: tuple[Any, ...]) -> bytes | None:
    """A fast serialization of ``parts``, in the client's own key order (a rendered schema follows
    it, so ``{a, b}`` and ``{b, a}`` are different heads); None when they are not JSON."""
    try:
        if orjson is not None:  # ~10x faster than json where it is installed
            return orjson.dumps(parts)
        return json.dumps(parts, ensure_ascii=False, allow_nan=False).encode()
    except (TypeError, ValueError):
        return None


class PartsCache(Generic[T]):
    """``get(parts, build)``: what ``build()`` made for equal parts before, else build it now.

    >>> cache: PartsCache[int] = PartsCache(size=2)
    >>> cache.get(("a", [1]), lambda: 1), cache.get(("a", [1]), lambda: 2)
    (1, 1)
    """

    def __init__(self, size: int = 256) -> None:
        self.size = size
        self._items: OrderedDict[bytes, tuple[tuple[Any, ...], T]] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, parts: tuple[Any, ...], build: Callable[[], T]) -> T:
        key = parts_key(parts)
        if key is None:
            return build()  # not JSON: built (and rejected) without the cache
        with self._lock:
            found = self._items.get(key)
            if found is not None and found[0] == parts:
                self._items.move_to_end(key)
                return found[1]
        value = build()
        with self._lock:
            self._items[key] = (parts, value)
            while len(self._items) > self.size:
                self._items.popitem(last=False)
        return value

    def clear(self) -> None:
        with self._lock:
            self._items.clear()
