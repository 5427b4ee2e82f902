"""PostgreSQL (``psycopg`` 3, the ``store-postgres`` extra): ``postgresql://USER@HOST:PORT/DB``,
for gateways on many machines sharing one database.

psycopg is PostgreSQL's standard Python driver (Django's and SQLAlchemy's); its plain
synchronous connections run in the store's worker threads, one each, so the SQL is the
same code as SQLite's. A connection that breaks (the server restarted) is opened again on
the next call; each statement is bounded by ``statement_timeout``.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

import psycopg


class PostgresBackend:
    placeholder = "%s"
    float_type = "DOUBLE PRECISION"
    begin = None  # psycopg opens the transaction itself
    workers = 8
    errors: tuple[type[BaseException], ...] = (psycopg.Error,)

    def __init__(self, url: str) -> None:
        self.url = "postgresql://" + url.split("://", 1)[1]
        parts = urlsplit(self.url)
        where = f"{parts.hostname or 'localhost'}:{parts.port or 5432}{parts.path or ''}"
        self.name = f"postgresql {where}"  # never the password

    def prepare(self) -> None:
        pass

    def connect(self) -> Any:
        return psycopg.connect(
            self.url, connect_timeout=5, options="-c statement_timeout=10000", application_name="harmonykit"
        )
