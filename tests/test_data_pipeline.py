"""The file pipeline behind `harmonykit data`: however a JSONL file is cut into chunks (spans of
a file, or blocks read from a stream), every line comes once, numbered as a text reader numbers
it; rejects keep their line numbers across chunks and workers."""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given
from hypothesis import strategies as st

from budget import examples
from harmonykit.data import pipeline

GOOD = json.dumps({"messages": [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"}]})


def _expected(data: bytes) -> list[tuple[int, Any]]:
    """What reading the file as text gives: universal newlines, blank lines skipped, a BOM dropped."""
    text = io.TextIOWrapper(io.BytesIO(data), encoding="utf-8-sig", errors="replace")
    out: list[tuple[int, Any]] = []
    for n, line in enumerate(text, 1):
        if line.strip(" \t\n\r\x0b\x0c"):
            try:
                out.append((n, json.loads(line)))
            except json.JSONDecodeError:
                out.append((n, "reject"))
    return out


def _read(path: Path, fmt: str = "jsonl", stream: bool = False) -> list[tuple[int, Any]]:
    chunks = list(pipeline._jsonl_chunks(str(path)) if stream else pipeline.read_chunks(str(path), fmt))
    out, before = [], 0
    for chunk in chunks:
        done = pipeline.Done()
        for n, record in pipeline._records(chunk, done):
            out.append((n + before, "reject" if isinstance(record, pipeline.Reject) else record))
        before += done.lines
    return out


LINE = st.one_of(st.just(GOOD), st.just('{"a": 1}'), st.just("[1, 2]"), st.just("{broken"), st.just(""),
                 st.just("   "), st.just('"caf\u00e9 \u2028 line"'), st.just("x" * 40))
END = st.sampled_from(["\n", "\r\n", "\r"])


@st.composite
def files(draw: st.DrawFn) -> bytes:
    lines = draw(st.lists(st.tuples(LINE, END), max_size=12))
    data = "".join(a + b for a, b in lines)
    if lines and draw(st.booleans()):
        data = data.rstrip("\r\n")  # no line break at the end
    return (b"\xef\xbb\xbf" if draw(st.booleans()) else b"") + data.encode()


@examples(150, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(files(), st.sampled_from([1, 2, 3, 5, 16, 64, 1 << 19]), st.booleans())
def test_any_cut_gives_every_line_once_numbered_as_text(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                      data: bytes, size: int, stream: bool) -> None:
    monkeypatch.setattr(pipeline, "CHUNK_BYTES", size)
    path = tmp_path / "in.jsonl"
    path.write_bytes(data)
    assert _read(path, stream=stream) == _expected(data)


def test_a_line_longer_than_a_chunk(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pipeline, "CHUNK_BYTES", 7)
    long = json.dumps({"text": "y" * 100})
    data = f"{GOOD}\n{long}\n\n{long}".encode()
    path = tmp_path / "in.jsonl"
    path.write_bytes(data)
    assert _read(path) == _read(path, stream=True) == _expected(data)
    assert [n for n, _ in _read(path)] == [1, 2, 4]


def test_not_utf8_reads_as_replacement_characters(tmp_path: Path) -> None:
    path = tmp_path / "in.jsonl"
    path.write_bytes(b'{"t": "a\xffb"}\n')
    assert _read(path) == [(1, {"t": "a\ufffdb"})]


def _cli(args: list[str], stdin: bytes | None = None) -> Any:
    import subprocess

    return subprocess.run([sys.executable, "-m", "harmonykit", *args], capture_output=True, input=stdin,
                          timeout=300)


def test_rejects_keep_their_line_numbers_across_chunks_and_workers(tmp_path: Path) -> None:
    # Bad lines every so often in a file of many chunks: each reject names its own line.
    lines = []
    for i in range(1, 3001):
        lines.append("{broken" if i % 500 == 0 else "" if i % 777 == 0 else GOOD)
    src = tmp_path / "in.jsonl"
    src.write_text("\r\n".join(lines) + "\r\n", encoding="utf-8")
    bad = [i for i in range(1, 3001) if i % 500 == 0]
    for workers, stdin in ((2, False), (1, False), (2, True)):
        out = tmp_path / f"out{workers}{stdin}.jsonl"
        args = ["data", "render", "-" if stdin else str(src), "-o", str(out), "--workers", str(workers)]
        proc = _cli(args, stdin=src.read_bytes() if stdin else None)
        assert proc.returncode == 0, proc.stderr
        rejects = (tmp_path / f"{out.name}.rejects.jsonl").read_text(encoding="utf-8").splitlines()
        assert [json.loads(r)["line"] for r in rejects] == bad
        summary = json.loads(proc.stderr.decode().strip().splitlines()[-1])
        assert summary["written"] == 3000 - len(bad) - 3000 // 777
        assert out.read_bytes().count(b"\n") == summary["written"]


def test_strict_stops_at_the_first_bad_line_of_a_later_chunk(tmp_path: Path) -> None:
    lines = [GOOD] * 2000 + ["{broken"] + [GOOD] * 10
    src = tmp_path / "in.jsonl"
    src.write_text("\n".join(lines) + "\n", encoding="utf-8")
    out = tmp_path / "out.jsonl"
    proc = _cli(["data", "render", str(src), "-o", str(out), "--workers", "2", "--strict"])
    assert proc.returncode == 1 and b"line 2001: not JSON" in proc.stderr
    assert out.read_bytes().count(b"\n") == 2000  # everything before it, nothing after


@pytest.mark.parametrize("case", ["input is a folder", "output folder missing", "parquet output folder missing"])
def test_bad_paths_are_named_without_a_traceback(tmp_path: Path, case: str) -> None:
    src = tmp_path / "in.jsonl"
    src.write_text(GOOD + "\n", encoding="utf-8")
    args = {"input is a folder": [str(tmp_path), "-o", str(tmp_path / "o.jsonl")],
            "output folder missing": [str(src), "-o", str(tmp_path / "no" / "o.jsonl")],
            "parquet output folder missing": [str(src), "-o", str(tmp_path / "no" / "o.parquet")]}[case]
    proc = _cli(["data", "render", *args])
    err = proc.stderr.decode()
    assert proc.returncode == 2 and "Traceback" not in err, err
    assert err.startswith("harmonykit: error: ") and (str(tmp_path) in err)


def test_parquet_out_with_no_good_rows_is_still_a_parquet_file(tmp_path: Path) -> None:
    import pyarrow.parquet as pq

    src = tmp_path / "in.jsonl"
    src.write_text("{broken\n", encoding="utf-8")
    out = tmp_path / "o.parquet"
    proc = _cli(["data", "render", str(src), "-o", str(out), "--workers", "2"])
    assert proc.returncode == 0
    table = pq.read_table(out)
    assert table.num_rows == 0 and table.column_names == ["input_ids", "labels", "assistant_mask"]


def test_progress_on_a_terminal_and_none_when_piped(tmp_path: Path) -> None:
    import os
    import pty
    import subprocess

    src = tmp_path / "in.jsonl"
    src.write_text((GOOD + "\n") * 50, encoding="utf-8")
    args = [sys.executable, "-m", "harmonykit", "data", "render", str(src), "-o", str(tmp_path / "o.jsonl")]
    import select

    master, slave = pty.openpty()
    proc = None
    try:
        proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=slave)
        os.close(slave)
        seen = b""
        while True:
            if not select.select([master], [], [], 120)[0]:  # a guard against a hang, not a bound
                raise AssertionError("the CLI wrote nothing to its terminal for 120 s")
            try:
                piece = os.read(master, 4096)
            except OSError:  # the child closed the terminal
                break
            if not piece:
                break
            seen += piece
        assert proc.wait(timeout=120) == 0
    finally:
        if proc is not None and proc.poll() is None:  # the test failed with the CLI still running
            proc.kill()
            proc.wait(30)
        os.close(master)
    text = seen.decode()
    assert "\r50 records" in text and "records/s" in text and "tokens/s" in text, text
    piped = _cli(["data", "render", str(src), "-o", str(tmp_path / "p.jsonl")]).stderr.decode()
    assert "records/s" not in piped.replace("records_per_second", "") and "\r" not in piped


def _peak_rss_mb(args: list[str]) -> float:
    """The largest resident size (MB) of the CLI and the workers it starts."""
    import subprocess

    probe = ("import resource, subprocess, sys; subprocess.run(sys.argv[1:], check=True, capture_output=True, "
             "timeout=280); "
             "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)")
    out = subprocess.run([sys.executable, "-c", probe, sys.executable, "-m", "harmonykit", *args],
                         capture_output=True, text=True, timeout=300, check=True)
    return int(out.stdout) / 1024


@pytest.mark.parametrize("workers", [1, 2])
def test_memory_stays_flat_as_the_file_grows(tmp_path: Path, workers: int) -> None:
    record = json.dumps({"messages": [{"role": "user", "content": "Tell me a story. " * 40},
                                      {"role": "assistant", "content": "Once upon a time. " * 40}]})
    peaks = []
    for n in (500, 10_000):  # 0.7 MB, then 14 MB of JSONL, rendered to ~30 MB
        src = tmp_path / f"in{n}.jsonl"
        src.write_text((record + "\n") * n, encoding="utf-8")
        peaks.append(_peak_rss_mb(["data", "render", str(src), "-o", str(tmp_path / f"o{n}.jsonl"),
                                   "--workers", str(workers)]))
    assert peaks[1] - peaks[0] < 25, f"peak resident size grew from {peaks[0]:.0f} MB to {peaks[1]:.0f} MB"


class _Counting(io.BytesIO):
    read_bytes = 0

    def read(self, size: int | None = -1) -> bytes:
        data = super().read(size)
        _Counting.read_bytes += len(data)
        return data

    def readline(self, size: int | None = -1) -> bytes:
        data = super().readline(size)
        _Counting.read_bytes += len(data)
        return data


def test_a_huge_line_is_read_once_not_once_per_span() -> None:
    """Spans inside a line that began before them stop at their own end: reading the file is
    linear however long its lines (it was quadratic: each span read the rest of the line)."""
    data = (json.dumps({"t": "x" * 300_000}) + "\n" + GOOD + "\n") * 3
    spans = [pipeline.Span("-", s, min(s + 1000, len(data))) for s in range(0, len(data), 1000)]
    _Counting.read_bytes = 0
    pieces = [span.read_from(_Counting(data.encode())) for span in spans]
    assert b"".join(pieces) == data.encode()
    assert _Counting.read_bytes < 2.5 * len(data)


_DO_CHUNK = pipeline.do_chunk  # the real one: the test below patches the module's name


def _dies_on_its_second_chunk(job: pipeline.Job, chunk: pipeline.Chunk) -> pipeline.Done:
    import os

    if isinstance(chunk.data, pipeline.Span) and chunk.data.start > 0:
        os._exit(9)  # as the out-of-memory killer would end it
    # Not pipeline.do_chunk: patched, that is this function (a recursion that raced the death).
    return _DO_CHUNK(job, chunk)


def test_a_worker_that_dies_ends_the_run_with_an_error_not_a_hang(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    import signal

    src = tmp_path / "in.jsonl"
    src.write_text((GOOD + "\n") * 2000, encoding="utf-8")
    monkeypatch.setattr(pipeline, "CHUNK_BYTES", 1 << 16)
    monkeypatch.setattr(pipeline, "do_chunk", _dies_on_its_second_chunk)  # the forked workers see it

    def hung(*_: Any) -> None:
        raise TimeoutError("the run hung after its worker died")

    previous = signal.signal(signal.SIGALRM, hung)
    signal.alarm(120)
    try:
        with pytest.raises(pipeline.WorkerDied, match="worker process died"):
            for _ in pipeline.run(pipeline.Job("render"), pipeline.read_chunks(str(src), "jsonl"), 2):
                pass
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


@pytest.mark.parametrize(("flag", "value", "says"), [("--workers", "0", "must be at least 1, got 0"),
                                                     ("--max-tokens", "-5", "must be at least 1, got -5"),
                                                     ("--workers", "two", "expected a whole number")])
def test_counts_given_on_the_command_line_are_checked(tmp_path: Path, flag: str, value: str, says: str) -> None:
    src = tmp_path / "in.jsonl"
    src.write_text(GOOD + "\n", encoding="utf-8")
    proc = _cli(["data", "render", str(src), "-o", str(tmp_path / "o.jsonl"), flag, value])
    assert proc.returncode == 2 and f"argument {flag}: {says}" in proc.stderr.decode()
