"""SQLite (Python's own ``sqlite3``): ``sqlite:///PATH``, the default store.

WAL journal, so readers never wait for the writer and several gateway processes on
one machine share the file; ``BEGIN IMMEDIATE`` takes the write lock up front (no
deadlock between two upgrading readers), and a busy database is waited for, up to the
store's timeout, rather than failed at once.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any


class SQLiteBackend:
    placeholder = "?"
    float_type = "REAL"
    begin = "BEGIN IMMEDIATE"
    workers = 1  # SQLite has one writer at a time: one connection a process, no lock convoy
    errors: tuple[type[BaseException], ...] = (sqlite3.Error,)

    def __init__(self, url: str) -> None:
        path = url.split("://", 1)[1]
        if path.startswith("/"):  # sqlite:///relative is "relative", sqlite:////abs is "/abs"
            path = path[1:]
        if not path:
            raise ValueError(f"store {url!r}: name the database file, e.g. sqlite:///var/harmonykit.db")
        self.path = Path(path) if path == ":memory:" else Path(path).expanduser()
        self.name = f"sqlite {self.path}"

    def prepare(self) -> None:
        if str(self.path) != ":memory:":
            self.path.parent.mkdir(parents=True, exist_ok=True)

    def connect(self) -> Any:
        conn = sqlite3.connect(str(self.path), timeout=5.0, isolation_level=None, check_same_thread=False)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=NORMAL")  # durable across a process crash; WAL keeps it fast
        conn.execute("PRAGMA busy_timeout=5000")
        return conn
