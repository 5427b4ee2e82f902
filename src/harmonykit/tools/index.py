"""A local full-text index for the browser (``--browser index=PATH``): SQLite FTS5 over pages.

``harmonykit index FILES... -o PATH`` builds it; the browser searches it and opens its pages
from it, with no network: a private or offline deployment searches its own documents.

>>> import tempfile, pathlib
>>> d = pathlib.Path(tempfile.mkdtemp())
>>> _ = (d / "a.html").write_text("<title>Tea</title><p>Green tea is steeped at 80 C.</p>")
>>> build([str(d / "a.html")], str(d / "i.db"), base_url="https://docs.example/")
1
>>> [(t, u) for t, u, _ in search(str(d / "i.db"), "steeped tea", 5)]
[('Tea', 'https://docs.example/a.html')]
"""

from __future__ import annotations

import html as _html
import os
import re
import sqlite3
from collections.abc import Iterable
from pathlib import Path

SCHEMA_VERSION = "1"
_WORD = re.compile(r"\w+", re.UNICODE)


class IndexFileError(Exception):
    """An index that cannot be read or built; the message names the file."""


def open_index(path: str) -> sqlite3.Connection:
    """The index at ``path``, read-only; a missing or foreign file is an error naming it."""
    if not os.path.isfile(path):
        raise IndexFileError(f"no index at {path}: build one with harmonykit index FILES... -o {path}")
    try:
        db = sqlite3.connect(f"file:{path}?mode=ro", uri=True, check_same_thread=False)
        row = db.execute("SELECT value FROM hk_index_meta WHERE key = 'version'").fetchone()
    except sqlite3.Error as e:
        raise IndexFileError(f"{path} is not a harmonykit index ({e})") from None
    if row is None or row[0] != SCHEMA_VERSION:
        db.close()
        raise IndexFileError(f"{path} is an index of another version; build it again with harmonykit index")
    return db


def _document(path: Path) -> tuple[str, str, str]:
    """(title, html, plain text) of one file: HTML as it is, any other text as preformatted."""
    from .browser.page import from_html

    raw = path.read_text(encoding="utf-8", errors="replace")
    if path.suffix.lower() in (".html", ".htm", ".xhtml"):
        html = raw
    else:
        html = f"<html><head><title>{_html.escape(path.name)}</title></head><body><pre>" \
               f"{_html.escape(raw)}</pre></body></html>"
    page = from_html(html, "")
    title = page.title or path.name
    return title, html, page.text.removeprefix("\nURL: \n")


def build(files: Iterable[str], out: str, *, base_url: str | None = None) -> int:
    """Index ``files`` (HTML, or any text) into ``out``, replacing it; returns how many.
    Each page's URL is ``base_url`` + its path relative to the files' common folder, or its
    ``file://`` URI when no ``base_url`` is given."""
    paths = [Path(f).resolve() for f in files]
    for p in paths:
        if not p.is_file():
            raise IndexFileError(f"{p} is not a file")
    root = Path(os.path.commonpath([str(p.parent) for p in paths])) if paths else Path(".")
    tmp = out + ".tmp"
    if os.path.exists(tmp):
        os.remove(tmp)
    db = sqlite3.connect(tmp)
    try:
        db.execute("CREATE TABLE hk_index_meta (key TEXT PRIMARY KEY, value TEXT)")
        db.execute("INSERT INTO hk_index_meta VALUES ('version', ?)", (SCHEMA_VERSION,))
        db.execute("CREATE VIRTUAL TABLE hk_pages USING fts5(url UNINDEXED, title, body, html UNINDEXED)")
        for p in paths:
            title, html, text = _document(p)
            url = base_url.rstrip("/") + "/" + p.relative_to(root).as_posix() if base_url else p.as_uri()
            db.execute("INSERT INTO hk_pages (url, title, body, html) VALUES (?, ?, ?, ?)",
                       (url, title, text, html))
        db.commit()
    finally:
        db.close()
    os.replace(tmp, out)
    return len(paths)


def _match(query: str) -> str | None:
    """The model's query as an FTS5 expression that cannot be a syntax error: its words, any."""
    words = _WORD.findall(query)
    return " OR ".join('"' + w.replace('"', '""') + '"' for w in words) if words else None


def search(path: str, query: str, topn: int) -> list[tuple[str, str, str]]:
    """(title, url, summary) of the best ``topn`` pages for ``query`` (BM25)."""
    expr = _match(query)
    if expr is None:
        return []
    db = open_index(path)
    try:
        rows = db.execute("SELECT title, url, snippet(hk_pages, 2, '', '', '...', 32) FROM hk_pages "
                          "WHERE hk_pages MATCH ? ORDER BY rank LIMIT ?", (expr, topn)).fetchall()
    finally:
        db.close()
    return [(t, u, " ".join(s.split())) for t, u, s in rows]


def page(path: str, url: str) -> tuple[str, str] | None:
    """(html, title) of the indexed page at ``url``, else None."""
    db = open_index(path)
    try:
        row = db.execute("SELECT html, title FROM hk_pages WHERE url = ?", (url,)).fetchone()
    finally:
        db.close()
    return (row[0], row[1]) if row else None
