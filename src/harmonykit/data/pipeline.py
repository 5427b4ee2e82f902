"""Files of records through ``render_example`` / ``parse_example``: JSONL or Parquet in and out,
streamed (memory stays flat however large the file), in worker processes, every bad
record set aside with its line or row number, never dropped silently.

A generator pipeline: ``read_chunks`` -> ``run`` (``do_chunk`` in workers, bounded in
flight) -> ``Writer``. The CLI only wires files, progress and the summary around it.
"""

from __future__ import annotations

import json
import multiprocessing
import os
from array import array
from collections import Counter, deque
from collections.abc import Iterable, Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field, fields
from typing import Any, BinaryIO

import orjson

from .. import HarmonyEncodingName, load_harmony_encoding
from ..encoding import HarmonyEncoding
from ..errors import HarmonyError
from ..openai.errors import RequestError
from .batch import _plain_value, error_text
from .examples import IGNORE, parse_example, render_example

CHUNK = 256  # Parquet rows a worker takes at once
CHUNK_BYTES = 1 << 19  # JSONL a worker takes at once (about 350 chat records with tools)


@dataclass
class Reject:
    """A record that could not be used: where it was, why, and the record itself."""

    line: int
    error: str
    record: Any = None

    def to_dict(self) -> dict[str, Any]:
        return {"line": self.line, "error": self.error, "record": self.record}


@dataclass(frozen=True)
class Job:
    """What is done to every record: ``render`` or ``parse``, with its options."""

    kind: str
    out_format: str = "jsonl"
    train_on: str = "last_turn"
    cot: str = "inference"
    tools: tuple[str, ...] | None = None
    max_tokens: int | None = None
    strict: bool = False  # a chunk stops at its first reject


@dataclass
class Chunk:
    """A piece of the input: a ``Span`` of a JSONL file, whole JSONL lines (read from a stream),
    an Arrow record batch, or the ``Reject`` a broken file ends with. The worker that takes it
    reads, splits and decodes it, so the process that hands chunks out does almost nothing."""

    first: int  # the row number of its first record; JSONL lines are numbered from 1 in each
    data: Any  # Span | bytes | pyarrow.RecordBatch | Reject


@dataclass(frozen=True)
class Span:
    """The JSONL lines that start in ``[start, end)`` of a file (a line belongs to the span it
    starts in, so spans cut anywhere still give each line once)."""

    path: str
    start: int
    end: int

    def read(self) -> bytes:
        with open(self.path, "rb") as f:
            return self.read_from(f)

    def read_from(self, f: BinaryIO) -> bytes:
        """The span's lines from the open file ``f``. Reads its own bytes, plus the rest of its
        last line: a line longer than many spans is read once in all, by the span it starts in
        (the others find no line start and stop at their end)."""
        if self.start == 0:
            begin, data = 0, f.read(self.end)
        else:
            f.seek(self.start - 1)
            head = f.read(self.end - self.start + 1)
            cut = head.find(b"\n")  # the line in progress at start-1 is the previous span's
            if cut == -1:
                return b""
            begin, data = self.start + cut, head[cut + 1 :]
        if not data:
            return b""
        if not data.endswith(b"\n"):
            data += f.readline()  # the last line runs past the end
        return data.removeprefix(BOM) if begin == 0 else data


@dataclass
class Counts:
    """What a run counts. Each chunk's (``Done``) add up to the run's (``Summary``)."""

    records: int = 0
    written: int = 0
    tokens: int = 0
    trained: int = 0
    too_long: int = 0
    rejected: int = 0
    repairs: Counter[str] = field(default_factory=Counter)

    def add(self, other: Counts) -> None:
        for f in fields(Counts):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))


@dataclass
class Done(Counts):
    """A chunk's results, whole: its output already serialized by the worker (JSONL text or an
    Arrow table), its counts, its rejects. The process that writes the file only moves these,
    a few per second, so it takes almost nothing from the workers' cores."""

    lines: int = 0  # a JSONL chunk's lines: ``run`` numbers the next chunk's rejects after them
    rejects: list[Reject] = field(default_factory=list)
    text: bytes = b""  # JSONL output
    table: Any = None  # a pyarrow.Table, Parquet output
    stopped: bool = False  # strict and a reject: the chunk's later records were not read


@dataclass
class Summary(Counts):
    """A run's counts, as the command line reports them."""

    def to_dict(self) -> dict[str, Any]:
        return {"records": self.records, "written": self.written, "tokens": self.tokens,
                "trained_tokens": self.trained, "rejected": self.rejected,
                "dropped_too_long": self.too_long, "repairs": dict(sorted(self.repairs.items()))}


def file_format(path: str, given: str | None) -> str:
    if given:
        return given
    if path.endswith((".parquet", ".pq")):
        return "parquet"
    return "jsonl"


def read_chunks(path: str, fmt: str) -> Iterator[Chunk]:
    """The file in chunks of about ``CHUNK_BYTES`` of JSONL or ``CHUNK`` Parquet rows, streamed;
    a Parquet file that breaks off ends with a reject naming its last good row."""
    if fmt == "jsonl":
        if path != "-" and os.path.isfile(path):
            size = os.path.getsize(path)
            for start in range(0, size, CHUNK_BYTES):
                yield Chunk(1, Span(path, start, min(start + CHUNK_BYTES, size)))
        else:  # a stream, read here
            yield from _jsonl_chunks(path)
        return
    import pyarrow.parquet as pq

    try:
        pf = pq.ParquetFile(path)
    except Exception as e:  # pyarrow raises several kinds for a broken file
        yield Chunk(0, Reject(0, f"cannot read {path} as Parquet: {error_text(e)}"))
        return
    n = 1
    try:
        for batch in pf.iter_batches(batch_size=CHUNK):
            yield Chunk(n, batch)
            n += batch.num_rows
    except Exception as e:
        yield Chunk(n, Reject(n, f"the Parquet file breaks off after row {n - 1}: {error_text(e)}"))


def _jsonl_chunks(path: str) -> Iterator[Chunk]:
    import sys

    f: BinaryIO = open(path, "rb") if path != "-" else sys.stdin.buffer
    parts: list[bytes] = []  # a line not ended yet (one longer than a block is read on)
    first = True  # a file saved by some editors starts with a BOM
    try:
        while block := f.read(CHUNK_BYTES):
            cut = block.rfind(b"\n") + 1  # whole lines only: a record is never split
            parts.append(block[:cut] if cut else block)
            if cut:
                data = b"".join(parts)
                parts = [block[cut:]] if cut < len(block) else []
                yield Chunk(1, data.removeprefix(BOM) if first else data)
                first = False
        if parts:
            data = b"".join(parts)
            yield Chunk(1, data.removeprefix(BOM) if first else data)
    finally:
        if f is not sys.stdin.buffer:
            f.close()


BOM = b"\xef\xbb\xbf"


def _records(chunk: Chunk, done: Done) -> Iterator[tuple[int, Any]]:
    """A chunk's ``(line or row number, record or Reject)``; blank lines are not records."""
    data = chunk.data
    if isinstance(data, Span):
        data = data.read()
    if isinstance(data, Reject):
        yield data.line, data
    elif isinstance(data, bytes):
        # splitlines ends a line where a file read as text would: \n, \r\n or a lone \r
        lines = data.splitlines()
        done.lines = len(lines)
        for n, line in enumerate(lines, chunk.first):
            if line.strip():
                yield n, _record(n, line)
    else:
        for n, row in enumerate(data.to_pylist(), chunk.first):
            yield n, {k: _plain_value(v) for k, v in row.items() if v is not None}


# -- the work (top-level: worker processes import it) -------------------------------------


def _record(n: int, line: bytes) -> Any:
    try:
        return orjson.loads(line)  # 2-3x json's speed
    except orjson.JSONDecodeError:
        pass
    # json decides what orjson refuses: its verdict and message; it also reads NaN, and
    # bytes that are not UTF-8 read as U+FFFD, as everywhere else in harmonykit
    text = line.decode("utf-8", "replace")
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        return Reject(n, f"not JSON: {e.msg} at column {e.colno}", text)


def _render(enc: HarmonyEncoding, job: Job, record: Any, done: Done) -> dict[str, Any] | None:
    try:
        row = render_example(enc, record, train_on=job.train_on, cot=job.cot)
    except (RequestError, HarmonyError, ValueError, TypeError) as e:
        raise _Rejected(error_text(e)) from None
    labels = row["labels"]
    if job.max_tokens and len(labels) > job.max_tokens:
        done.too_long += 1
        return None
    done.tokens += len(labels)
    done.trained += len(labels) - labels.count(IGNORE)
    return row


def _parse(enc: HarmonyEncoding, job: Job, record: Any, done: Done) -> dict[str, Any] | None:
    completion = record.get("completion") if isinstance(record, dict) else record
    row_tools = record.get("tools") if isinstance(record, dict) else None
    if not isinstance(completion, (str, list)):
        raise _Rejected("completion: expected text or a list of token ids")
    try:
        row = parse_example(enc, completion, tools=row_tools or job.tools)
    except (HarmonyError, TypeError, ValueError) as e:
        raise _Rejected(f"completion: {error_text(e)}") from None
    done.repairs.update(r["kind"] for r in row["repairs"])
    # spans and skipped ranges tile the completion: where the last ends is its length
    done.tokens += max([end for _, end in row["spans"]] + [end for _, end in row["skipped"]], default=0)
    if job.out_format == "parquet":  # nested, ragged: as JSON text in a fixed schema
        row = {k: json.dumps(v, ensure_ascii=False) if k in _PARSE_JSON_COLUMNS else v
               for k, v in row.items()}
    return row


def _line(row: dict[str, Any]) -> bytes:
    try:  # ~10x json's speed on token id lists
        return orjson.dumps(row, option=orjson.OPT_APPEND_NEWLINE)
    except TypeError:  # what orjson refuses (a lone surrogate): json writes it escaped
        return (json.dumps(row) + "\n").encode()


class WorkerDied(RuntimeError):
    """A worker process ended without finishing its chunk."""


class _Rejected(Exception):
    """A record the job cannot use; its message is the reject's one-line error."""


_JOBS = {"render": _render, "parse": _parse}
_PARSE_JSON_COLUMNS = ("messages", "spans", "skipped", "repairs")


def schema(job: Job) -> Any:
    """The Parquet schema of the job's rows: fixed, so every chunk's table is alike."""
    import pyarrow as pa

    if job.kind == "render":
        ids = pa.list_(pa.int64())
        return pa.schema([("input_ids", ids), ("labels", ids), ("assistant_mask", ids)])
    return pa.schema([("messages", pa.string()), ("spans", pa.string()), ("skipped", pa.string()),
                      ("repairs", pa.string()), ("stop", pa.string()), ("complete", pa.bool_())])


def do_chunk(job: Job, chunk: Chunk) -> Done:
    """One chunk through the job, in a worker or in this process."""
    enc = load_harmony_encoding(HarmonyEncodingName.HARMONY_GPT_OSS)
    work = _JOBS[job.kind]
    done = Done()
    rows: list[dict[str, Any]] = []
    for n, record in _records(chunk, done):
        done.records += 1
        try:
            if isinstance(record, Reject):
                raise _Rejected(record.error)
            row = work(enc, job, record, done)
        except _Rejected as e:
            done.rejects.append(record if isinstance(record, Reject) else Reject(n, str(e), record))
            if job.strict:
                done.stopped = True
                break
            continue
        if row is not None:
            rows.append(row)
    done.written, done.rejected = len(rows), len(done.rejects)
    if job.out_format == "jsonl":
        done.text = b"".join([_line(row) for row in rows])
    elif rows:
        done.table = _table(rows, job)
    return done


def _table(rows: list[dict[str, Any]], job: Job) -> Any:
    """Rows as an Arrow table of the job's schema. Token id lists go in as one flat buffer per
    column (a tenth of ``Table.from_pylist``'s time, which was more than the rendering's)."""
    import pyarrow as pa

    sch = schema(job)
    if job.kind != "render":
        return pa.Table.from_pylist(rows, schema=sch)
    ends = array("i", [0])  # the three columns of a row have one length
    for row in rows:
        ends.append(ends[-1] + len(row["input_ids"]))
    offsets = pa.Array.from_buffers(pa.int32(), len(ends), [None, pa.py_buffer(ends)])
    columns = []
    for name in sch.names:
        flat = array("q")
        for row in rows:
            flat.extend(row[name])
        values = pa.Array.from_buffers(pa.int64(), len(flat), [None, pa.py_buffer(flat)])
        columns.append(pa.ListArray.from_arrays(offsets, values))
    return pa.Table.from_arrays(columns, schema=sch)


def run(job: Job, chunks: Iterable[Chunk], workers: int) -> Iterator[Done]:
    """Each chunk's results, in input order, rejects numbered by their line in the file. With
    several workers, at most a few chunks per worker are in flight, so memory does not grow
    with the file."""
    before = 0  # JSONL lines in the chunks before this one
    for done in _run(job, chunks, workers):
        for reject in done.rejects:
            reject.line += before
        before += done.lines
        yield done


def _run(job: Job, chunks: Iterable[Chunk], workers: int) -> Iterator[Done]:
    if workers <= 1:
        for chunk in chunks:
            yield do_chunk(job, chunk)
        return
    _keep_freed_memory()
    ctx = multiprocessing.get_context("spawn" if os.name == "nt" else "fork")
    # Each worker loads the vocabulary itself, all at once: measured against loading it here
    # before the fork (shared pages) and against gc.freeze(), that gave the steadiest and
    # fastest runs on 2 cores (3.1-3.2 s for 40k records, against 3.2-3.6 s and 3.2-4.1 s).
    # concurrent.futures, not multiprocessing.Pool: a worker that dies (the system's
    # out-of-memory killer, a crash in native code) ends the run with an error, not a hang.
    with ProcessPoolExecutor(workers, mp_context=ctx) as pool:
        pending: deque[Future[Done]] = deque()
        try:
            for chunk in chunks:
                pending.append(pool.submit(do_chunk, job, chunk))
                if len(pending) >= workers * 4:
                    yield pending.popleft().result()
            while pending:
                yield pending.popleft().result()
        except BrokenProcessPool:
            raise WorkerDied("a worker process died (killed for memory, or crashed); "
                             "the output holds the records before its chunk") from None
        finally:
            for future in pending:
                future.cancel()


def _keep_freed_memory() -> None:
    """Keep freed memory in the process (glibc only; elsewhere nothing to do).

    Every chunk moves a megabyte or two between processes; glibc gives such blocks back
    to the system when they are freed and faults them in again on the next chunk. With
    two workers that was ~160k page faults and ~0.5 s of system time a 40k-record file,
    a tenth of the second worker's gain. Set before the workers fork, they inherit it.
    """
    try:
        import ctypes

        libc = ctypes.CDLL(None)
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # not glibc
        return
    m_trim_threshold, m_mmap_threshold = -1, -3
    mallopt(m_mmap_threshold, 64 << 20)
    mallopt(m_trim_threshold, 256 << 20)


class Writer:
    """JSONL text or Arrow tables out, written as they come (Parquet in row groups of about
    ``4 * CHUNK`` rows)."""

    def __init__(self, path: str, job: Job) -> None:
        self.path, self.job = path, job
        self._tables: list[Any] = []
        self._buffered = 0
        self._file: BinaryIO | None = None
        self._parquet: Any = None
        if job.out_format == "jsonl":
            self._file = open(path, "wb")
        else:
            import pyarrow.parquet as pq

            # zstd without dictionaries: smaller than the default (snappy with dictionaries) on
            # token ids, and written in 60% of its time (the writing process is the one that
            # does not run in parallel)
            self._parquet = pq.ParquetWriter(path, schema(job), compression="zstd", use_dictionary=False)

    def write(self, done: Done) -> None:
        if self._file is not None:
            self._file.write(done.text)
        elif done.table is not None:
            self._tables.append(done.table)
            self._buffered += done.table.num_rows
            if self._buffered >= 4 * CHUNK:
                self._flush()

    def _flush(self) -> None:
        if self._tables:
            import pyarrow as pa

            self._parquet.write_table(pa.concat_tables(self._tables))
        self._tables, self._buffered = [], 0

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
        else:  # with no rows at all, still a valid file with the job's schema
            self._flush()
            self._parquet.close()
