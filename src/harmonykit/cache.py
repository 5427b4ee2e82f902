"""Bounded caches for work that depends only on its inputs: rendered messages, request heads,
tool definitions as TypeScript, compiled grammars.

``LRU`` is the one store: least recently used out, bounded by a budget that each entry's
weight is counted against (bytes for the render caches, 1 an entry for small ones), safe to
share between threads. ``PartsCache`` keys one by plain JSON parts, in the client's own key
order. Under ``disabled()`` every cache misses and keeps nothing: what a cold render gives,
for tests and benchmarks to compare against.

>>> lru: LRU[str, int] = LRU(budget=10)
>>> lru.put("a", 1, weight=6); lru.put("b", 2, weight=6)
>>> lru.get("a"), lru.get("b"), lru.used
(None, 2, 6)
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, Generic, TypeVar

try:  # optional (the server extra); only makes keys faster
    import orjson
except ImportError:  # pragma: no cover - exercised where orjson is absent
    orjson = None  # type: ignore[assignment]

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")

_OFF: ContextVar[bool] = ContextVar("harmonykit_caches_off", default=False)
_disabling = 0  # disabled() blocks open anywhere: the context variable is read only then
#: What one token costs in a cached tuple: its slot, and its int object (ids are above 256).
TOKEN_BYTES = 36
#: What an entry costs beyond its contents (its key and value tuples, the dict slot, the order link).
ENTRY_BYTES = 260


@contextmanager
def disabled() -> Iterator[None]:
    """Every cache misses and stores nothing inside this block (in this thread or task)."""
    global _disabling
    token = _OFF.set(True)
    _disabling += 1
    try:
        yield
    finally:
        _disabling -= 1
        _OFF.reset(token)


#: Keys a second-sight cache remembers having seen once (then it forgets them all). It keeps
#: their hashes only: the keys themselves (a record's own system prompt) would be held outside
#: the budget; two keys of one hash at worst store an entry a sight early.
SEEN_KEYS = 4096


class LRU(Generic[K, V]):
    """A map bounded by ``budget``: each entry counts its ``weight``; least recently used out.

    A budget of 0 turns it off (every ``get`` misses, ``put`` keeps nothing); an entry
    heavier than the whole budget is not kept. With ``second_sight``, a value is kept only
    when its key was put once before, recently: what is seen once (a dataset record's own
    system prompt) neither costs a store nor pushes out what repeats (its tools).
    """

    def __init__(self, budget: int, *, second_sight: bool = False) -> None:
        self.budget = budget
        self.used = 0
        self._items: OrderedDict[K, tuple[V, int]] = OrderedDict()
        self._lock = threading.Lock()
        self._seen: set[int] | None = set() if second_sight else None

    def __len__(self) -> int:
        return len(self._items)

    def get(self, key: K) -> V | None:
        if not self.budget or (_disabling and _OFF.get()):
            return None
        # No lock: each OrderedDict call is atomic (the GIL); an entry evicted between the two
        # is simply not moved.
        items = self._items
        found = items.get(key)
        if found is None:
            return None
        try:
            items.move_to_end(key)
        except KeyError:
            pass
        return found[0]

    def put(self, key: K, value: V, weight: int) -> None:
        if weight > self.budget or (_disabling and _OFF.get()):
            return
        seen = self._seen
        if seen is not None:
            h = hash(key)
            if h not in seen:
                if len(seen) >= SEEN_KEYS:
                    seen.clear()
                seen.add(h)
                return
        with self._lock:
            old = self._items.pop(key, None)
            if old is not None:
                self.used -= old[1]
            self._items[key] = (value, weight)
            self.used += weight
            self._trim()

    def resize(self, budget: int) -> None:
        """A new budget (0: off); entries past it go at once."""
        with self._lock:
            self.budget = budget
            self._trim()

    def clear(self) -> None:
        with self._lock:
            self._items.clear()
            self.used = 0
            if self._seen is not None:
                self._seen.clear()

    def _trim(self) -> None:
        items = self._items
        while self.used > self.budget and items:
            _, (_, weight) = items.popitem(last=False)
            self.used -= weight


def parts_key(parts: Any) -> bytes | None:
    """A fast serialization of ``parts``, in the client's own key order (a rendered schema follows
    it, so ``{a, b}`` and ``{b, a}`` are different heads); None when they are not JSON."""
    try:
        if orjson is not None:  # ~10x faster than json where it is installed
            return orjson.dumps(parts)
        return json.dumps(parts, ensure_ascii=False, allow_nan=False).encode()
    except (TypeError, ValueError):
        return None


def compact_key(data: bytes) -> tuple[int, int]:
    """A key for serialized parts that does not keep them (orjson's output can hold 4 KB
    whatever its length): a hit is checked equal to the parts themselves anyway."""
    return hash(data), len(data)


class PartsCache(Generic[V]):
    """``get(parts, build)``: what ``build()`` made for equal parts before, else build it now.

    The key is ``parts_key(parts)``; a hit must also be equal to the parts, so parts that only
    serialize alike (orjson writes NaN as null) are built, and rejected, afresh.

    >>> cache: PartsCache[int] = PartsCache(size=2)
    >>> cache.get(("a", [1]), lambda: 1), cache.get(("a", [1]), lambda: 2)
    (1, 1)
    """

    def __init__(self, size: int = 256) -> None:
        self._lru: LRU[tuple[int, int], tuple[Any, V]] = LRU(size)

    def get(self, parts: Any, build: Callable[[], V]) -> V:
        data = parts_key(parts)
        if data is None:
            return build()  # not JSON: built (and rejected) without the cache
        key = compact_key(data)
        found = self._lru.get(key)
        if found is not None and found[0] == parts:
            return found[1]
        value = build()
        self._lru.put(key, (parts, value), 1)
        return value

    def clear(self) -> None:
        self._lru.clear()
