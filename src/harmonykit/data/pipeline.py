"""Files of records through ``render_example`` / ``parse_example``: JSONL or Parquet in and out,
streamed (memory stays flat however large the file), in worker processes, every bad
record set aside with its line or row number, never dropped silently.

A generator pipeline: ``read_records`` -> ``run`` (workers, bounded in flight) -> writers.
The CLI only wires files, progress and the summary around it.
"""

from __future__ import annotations

import gc
import json
import multiprocessing
import os
from array import array
from collections import Counter, deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, TextIO

from .. import HarmonyEncodingName, load_harmony_encoding
from ..errors import HarmonyError
from ..openai.errors import RequestError
from .batch import _plain_value, error_text
from .examples import parse_example, render_example

CHUNK = 256  # records a worker takes at once


@dataclass
class Reject:
    """A record that could not be used: where it was, why, and the record itself."""

    line: int
    error: str
    record: Any = None

    def to_dict(self) -> dict[str, Any]:
        return {"line": self.line, "error": self.error, "record": self.record}


@dataclass
class Summary:
    records: int = 0
    written: int = 0
    tokens: int = 0
    trained_tokens: int = 0
    rejected: int = 0
    too_long: int = 0
    repairs: Counter[str] = field(default_factory=Counter)

    def to_dict(self) -> dict[str, Any]:
        return {"records": self.records, "written": self.written, "tokens": self.tokens,
                "trained_tokens": self.trained_tokens, "rejected": self.rejected,
                "dropped_too_long": self.too_long, "repairs": dict(sorted(self.repairs.items()))}


def file_format(path: str, given: str | None) -> str:
    if given:
        return given
    if path.endswith((".parquet", ".pq")):
        return "parquet"
    return "jsonl"


class Line(str):
    """A JSONL line not parsed yet: the worker that takes it parses it (the reading process
    only reads, so it is not what limits the workers)."""


def _good(chunk: list[tuple[int, Any]], out: list[Any]) -> Iterator[tuple[int, Any]]:
    """The chunk's records that are JSON; the others go to ``out`` as rejects, in their place."""
    for n, item in chunk:
        record = _record(n, item)
        if isinstance(record, Reject):
            out.append(record)
        else:
            yield n, record


def _record(n: int, item: Any) -> Any:
    if not isinstance(item, Line):
        return item
    try:
        return json.loads(item)
    except json.JSONDecodeError as e:
        return Reject(n, f"not JSON: {e.msg} at column {e.colno}", item.rstrip("\n"))


def read_records(path: str, fmt: str) -> Iterator[tuple[int, Any]]:
    """``(line or row number, record)``: a JSONL line comes as a ``Line`` its worker parses."""
    if fmt == "jsonl":
        stream = open(path, encoding="utf-8", errors="replace") if path != "-" else None
        import sys

        f: TextIO = stream if stream is not None else sys.stdin
        try:
            for n, line in enumerate(f, 1):
                if line.strip():
                    yield n, Line(line)
        finally:
            if stream is not None:
                stream.close()
        return
    import pyarrow.parquet as pq

    try:
        pf = pq.ParquetFile(path)
    except Exception as e:  # pyarrow raises several kinds for a broken file
        yield 0, Reject(0, f"cannot read {path} as Parquet: {error_text(e)}")
        return
    n = 0
    try:
        for batch in pf.iter_batches(batch_size=CHUNK):
            for row in batch.to_pylist():
                n += 1
                yield n, {k: _plain_value(v) for k, v in row.items() if v is not None}
    except Exception as e:
        yield n + 1, Reject(n + 1, f"the Parquet file breaks off after row {n}: {error_text(e)}")


# -- the jobs (top-level: worker processes import them) ---------------------------------


@dataclass
class Rendered:
    """A rendered record and its counts: its JSONL line when the output is JSONL (written by
    the worker, so the process that writes the file only moves text), else its columns as
    compact arrays (cheap to send between processes)."""

    line: int
    tokens: int
    trained: int
    columns: dict[str, array[int]] | None = None
    text: str | None = None

    def row(self) -> dict[str, list[int]]:
        assert self.columns is not None
        return {k: v.tolist() for k, v in self.columns.items()}


def _render_chunk(chunk: list[tuple[int, Any]], train_on: str, cot: str, jsonl: bool = False) -> list[Any]:
    enc = load_harmony_encoding(HarmonyEncodingName.HARMONY_GPT_OSS)
    out: list[Any] = []
    for n, record in _good(chunk, out):
        try:
            ex = render_example(enc, record, train_on=train_on, cot=cot)
        except (RequestError, HarmonyError, ValueError, TypeError) as e:
            out.append(Reject(n, error_text(e), record))
            continue
        labels = ex["labels"]
        counts = (len(labels), len(labels) - labels.count(-100))
        if jsonl:
            out.append(Rendered(n, *counts, text=json.dumps(ex, separators=(", ", ": ")) + "\n"))
        else:
            out.append(Rendered(n, *counts, columns={k: array("i", v) for k, v in ex.items()}))
    return out


def _parse_chunk(chunk: list[tuple[int, Any]], tools: list[str] | None) -> list[Any]:
    enc = load_harmony_encoding(HarmonyEncodingName.HARMONY_GPT_OSS)
    out: list[Any] = []
    for n, record in _good(chunk, out):
        completion = record.get("completion") if isinstance(record, dict) else record
        row_tools = record.get("tools") if isinstance(record, dict) else None
        if not isinstance(completion, (str, list)):
            out.append(Reject(n, "completion: expected text or a list of token ids", record))
            continue
        try:
            out.append((n, parse_example(enc, completion, tools=row_tools or tools)))
        except (HarmonyError, TypeError, ValueError) as e:
            out.append(Reject(n, f"completion: {error_text(e)}", record))
    return out


def _chunks(items: Iterable[tuple[int, Any]], size: int) -> Iterator[list[tuple[int, Any]]]:
    chunk: list[tuple[int, Any]] = []
    for item in items:
        chunk.append(item)
        if len(chunk) == size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def run(job: str, items: Iterable[tuple[int, Any]], workers: int, **options: Any) -> Iterator[Any]:
    """Results in input order: ``Rendered`` (render), ``(line, row dict)`` (parse) or ``Reject``.
    With several workers, at most
    a few chunks per worker are in flight, so memory does not grow with the file."""
    fn = _render_chunk if job == "render" else _parse_chunk
    args = (options["train_on"], options["cot"], options.get("jsonl", False)) if job == "render" \
        else (options.get("tools"),)
    if workers <= 1:
        for chunk in _chunks(items, CHUNK):
            yield from fn(chunk, *args)
        return
    ctx = multiprocessing.get_context("spawn" if os.name == "nt" else "fork")
    # Objects that exist now are left out of collections while the workers live: a forked
    # worker's collector would otherwise touch (and so copy) every page of them.
    gc.freeze()
    try:
        yield from _pooled(ctx, fn, args, items, workers)
    finally:
        gc.unfreeze()


def _pooled(ctx: Any, fn: Any, args: tuple[Any, ...], items: Iterable[tuple[int, Any]],
            workers: int) -> Iterator[Any]:
    # All work in the workers: this process only reads and writes (its pool threads share
    # its interpreter lock, so work done here would stall them).
    with ctx.Pool(workers) as pool:
        pending: deque[Any] = deque()
        for chunk in _chunks(items, CHUNK):
            pending.append(pool.apply_async(fn, (chunk, *args)))
            if len(pending) >= workers * 4:
                yield from pending.popleft().get()
        while pending:
            yield from pending.popleft().get()


class Writer:
    """JSONL or Parquet rows out, written as they come (Parquet in row groups)."""

    def __init__(self, path: str, fmt: str) -> None:
        self.path, self.fmt = path, fmt
        self._rows: list[dict[str, Any]] = []
        self._parquet: Any = None
        self._file: TextIO | None = open(path, "w", encoding="utf-8") if fmt == "jsonl" else None

    def write_text(self, text: str) -> None:
        """A row already serialized as a JSONL line (by a worker)."""
        assert self._file is not None
        self._file.write(text)

    def write(self, row: dict[str, Any]) -> None:
        if self._file is not None:
            self._file.write(json.dumps(row, ensure_ascii=False) + "\n")
            return
        self._rows.append(row)
        if len(self._rows) >= 4 * CHUNK:
            self._flush()

    def _flush(self) -> None:
        if not self._rows:
            return
        import pyarrow as pa
        import pyarrow.parquet as pq

        table = pa.Table.from_pylist(self._rows)
        if self._parquet is None:
            self._parquet = pq.ParquetWriter(self.path, table.schema)
        self._parquet.write_table(table.cast(self._parquet.schema))
        self._rows = []

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            return
        self._flush()
        if self._parquet is None:  # no rows at all: still a valid, empty file
            import pyarrow as pa
            import pyarrow.parquet as pq

            pq.write_table(pa.table({}), self.path)
        else:
            self._parquet.close()
