"""Where the gateway keeps state: stored responses (with their input items and, for
background ones, their stream's events) and conversations (with their items).

One small interface, :class:`Store`, over SQL kept in one layer (``store/sql.py``) and
one module per database, chosen by the URL's scheme from :data:`BACKENDS`:

- ``sqlite:///PATH`` (the default, a file under the user's data directory; WAL, so
  gateways on one machine share it): Python's own ``sqlite3``;
- ``postgresql://USER@HOST:PORT/DB`` for gateways on many machines: ``psycopg`` 3
  (the ``store-postgres`` extra);
- ``none``: nothing is stored.

The database is only ever called from worker threads: a store call never blocks the
event loop, and one that fails or takes too long is a :class:`StoreError` naming the
store (the gateway answers 503), never a hung request.

>>> import tempfile, asyncio
>>> store = open_store(f"sqlite:///{tempfile.mkdtemp()}/state.db")
>>> asyncio.run(store.open()); store.name.startswith("sqlite")
True
"""

from __future__ import annotations

import importlib
import os
from pathlib import Path

from .records import ACTIVE, TERMINAL, ChainLink, Conversation, StoredResponse
from .sql import Store, StoreError

__all__ = [
    "ACTIVE",
    "BACKENDS",
    "TERMINAL",
    "ChainLink",
    "Conversation",
    "Store",
    "StoreError",
    "StoredResponse",
    "check_store_url",
    "default_store_url",
    "open_store",
]

#: URL scheme -> "module:class" of its backend (adding a database is one module and one line).
BACKENDS: dict[str, str] = {
    "sqlite": "harmonykit.store.sqlite:SQLiteBackend",
    "postgresql": "harmonykit.store.postgres:PostgresBackend",
    "postgres": "harmonykit.store.postgres:PostgresBackend",
}


def data_dir() -> Path:
    """The user's data directory for harmonykit: $XDG_DATA_HOME/harmonykit (~/.local/share/...)."""
    return Path(os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share") / "harmonykit"


def default_store_url() -> str:
    """``sqlite:///`` a file under the user's data directory (``data_dir()``)."""
    return f"sqlite:///{data_dir() / 'store.db'}"


def check_store_url(url: str) -> str | None:
    """The backend's scheme for ``url`` (None for ``none``), or a ValueError saying what to give."""
    if url.strip().lower() == "none":
        return None
    scheme = url.partition(":")[0].lower()
    if scheme not in BACKENDS or "://" not in url:
        # never a password in a message
        shown = url.split("://")[0] + "://...@" + url.split("@")[-1] if "@" in url else url
        raise ValueError(f"store {shown!r}: give sqlite:///PATH, postgresql://USER@HOST:PORT/DB or none")
    return scheme


def open_store(url: str, *, ttl: float = 30 * 86400.0, timeout: float = 10.0) -> Store | None:
    """The store at ``url`` (None for ``none``); ``ttl``: seconds an object is kept after its last
    change; ``timeout``: seconds a store call may take before it is a :class:`StoreError`."""
    scheme = check_store_url(url)
    if scheme is None:
        return None
    module, _, name = BACKENDS[scheme].partition(":")
    try:
        backend = getattr(importlib.import_module(module), name)(url)
    except ImportError as e:
        raise ValueError(
            f"store {url!r} needs a driver that is not installed ({e.name}): "
            f"pip install 'harmonykit[store-{scheme.removesuffix('ql')}]'"
        ) from None
    return Store(backend, ttl=ttl, timeout=timeout)
