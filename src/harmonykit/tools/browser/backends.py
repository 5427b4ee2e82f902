"""Search backends by name: each turns a query into (title, url, summary) rows, and may serve
pages itself (the local index does: an offline deployment opens what it indexed).

``--browser NAME[=VALUE]`` picks one from ``BACKENDS``: ``searxng=URL`` (a self-hosted
SearXNG's JSON API), ``exa`` and ``youcom`` (keys from ``EXA_API_KEY`` / ``YDC_API_KEY``,
as gpt-oss's reference reads them; ``exa=URL`` points at another base URL), and
``index=PATH`` (a SQLite FTS5 index built by ``harmonykit index``). Adding a backend is one
class and one line in ``BACKENDS``.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..net import Fetched, Fetcher, FetchError

Row = tuple[str, str, str]


class BackendError(Exception):
    """A backend that cannot serve (no key, a bad answer); the message says how to fix it."""


class Backend:
    """One search backend. ``source`` is what the browser's declaration names."""

    name = ""
    source = "web"

    async def search(self, query: str, topn: int, api: Fetcher) -> list[Row]:
        raise NotImplementedError

    def page_html(self, url: str) -> tuple[str, str] | None:
        """(html, title) of a page the backend holds itself, else None (fetched over HTTP)."""
        return None

    def check(self) -> None:
        """Raise ``BackendError`` when the backend cannot work as configured (at startup)."""


def _json(got: Fetched, who: str) -> Any:
    import json

    if got.status != 200:
        raise BackendError(f"{who} answered HTTP {got.status}: {got.text()[:300]}")
    try:
        return json.loads(got.body)
    except ValueError:
        raise BackendError(f"{who} answered something that is not JSON") from None


def _rows(items: Any, title: str, url: str, summary: Callable[[dict[str, Any]], Any]) -> list[Row]:
    out = []
    for r in items if isinstance(items, list) else []:
        if isinstance(r, dict) and isinstance(r.get(url), str):
            text = summary(r)
            if isinstance(text, list):
                text = " ".join(str(t) for t in text)
            out.append((str(r.get(title) or r[url]), r[url], str(text or "")))
    return out


@dataclass
class SearXNG(Backend):
    """A SearXNG instance's ``/search?format=json`` (its settings must enable the json format)."""

    base: str
    name = "searxng"

    async def search(self, query: str, topn: int, api: Fetcher) -> list[Row]:
        got = await api.request("GET", self.base.rstrip("/") + "/search",
                                params={"q": query, "format": "json"})
        data = _json(got, "SearXNG")
        return _rows(data.get("results") if isinstance(data, dict) else None, "title", "url",
                     lambda r: r.get("content"))[:topn]


class _Keyed(Backend):
    """A backend reached with an API key from the environment (``key``), as the reference reads it."""

    key = ""
    who = ""

    def check(self) -> None:
        if not os.environ.get(self.key):
            raise BackendError(f"--browser {self.name} needs a {self.who} API key in the {self.key} "
                               "environment variable")

    def headers(self) -> dict[str, str]:
        self.check()
        return {"x-api-key": os.environ[self.key]}


@dataclass
class Exa(_Keyed):
    """Exa's ``POST /search`` with summaries, as gpt-oss's reference asks it."""

    base: str = "https://api.exa.ai"
    name = "exa"
    key, who = "EXA_API_KEY", "Exa"

    async def search(self, query: str, topn: int, api: Fetcher) -> list[Row]:
        got = await api.request("POST", self.base.rstrip("/") + "/search", headers=self.headers(),
                                json={"query": query, "numResults": topn,
                                      "contents": {"text": True, "summary": True}})
        data = _json(got, "Exa")
        return _rows(data.get("results") if isinstance(data, dict) else None, "title", "url",
                     lambda r: r.get("summary"))[:topn]


@dataclass
class YouCom(_Keyed):
    """You.com's ``GET /v1/search``: web results, then news."""

    base: str = "https://api.ydc-index.io"
    name = "youcom"
    key, who = "YDC_API_KEY", "You.com"

    async def search(self, query: str, topn: int, api: Fetcher) -> list[Row]:
        got = await api.request("GET", self.base.rstrip("/") + "/v1/search", headers=self.headers(),
                                params={"query": query, "count": topn})
        data = _json(got, "You.com")
        results = data.get("results") if isinstance(data, dict) else None
        results = results if isinstance(results, dict) else {}
        return (_rows(results.get("web"), "title", "url", lambda r: r.get("snippets") or r.get("description"))
                + _rows(results.get("news"), "title", "url", lambda r: r.get("description")))[:topn]


@dataclass
class Index(Backend):
    """A local full-text index (``harmonykit index``): searched with FTS5, its pages served
    from the index itself."""

    path: str
    name = "index"
    source = "index"

    def check(self) -> None:
        from ..index import open_index

        open_index(self.path).close()

    async def search(self, query: str, topn: int, api: Fetcher) -> list[Row]:
        from ..index import search

        return await asyncio.to_thread(search, self.path, query, topn)

    def page_html(self, url: str) -> tuple[str, str] | None:
        from ..index import page

        return page(self.path, url)


def _searxng(value: str | None) -> Backend:
    if not value:
        raise BackendError("--browser searxng needs the instance's URL: --browser searxng=http://HOST:PORT")
    return SearXNG(value)


def _index(value: str | None) -> Backend:
    if not value:
        raise BackendError("--browser index needs the index file: --browser index=PATH "
                           "(built with harmonykit index FILES... -o PATH)")
    return Index(value)


BACKENDS: dict[str, Callable[[str | None], Backend]] = {
    "searxng": _searxng,
    "exa": lambda v: Exa(v) if v else Exa(),
    "youcom": lambda v: YouCom(v) if v else YouCom(),
    "index": _index,
}


def backend_from(spec: str) -> Backend:
    """The backend ``--browser NAME[=VALUE]`` names; ``BackendError`` says what is wrong."""
    name, _, value = spec.partition("=")
    make = BACKENDS.get(name.strip())
    if make is None:
        raise BackendError(f"unknown --browser backend {name!r}; use one of {', '.join(BACKENDS)}")
    backend = make(value.strip() or None)
    backend.check()
    return backend


__all__ = ["BACKENDS", "Backend", "BackendError", "FetchError", "Row", "backend_from"]
