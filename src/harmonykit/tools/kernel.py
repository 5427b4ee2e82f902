"""The interpreter that runs inside the python tool's sandbox (stdlib only, run as ``-c``).

It reads one JSON command a line on the file descriptor its argument names and runs each
cell in one namespace kept across cells, as a notebook does: what the cell prints, then the
value of a last expression. It holds itself to the limits the gateway passes (memory,
processes, file size, time), cuts a cell's printed output at ``cap`` characters (counting
the rest), and ends each cell with a terminator line carrying the gateway's per-cell
marker. Processes a cell starts do not outlive it. Everything here is the sandbox's;
nothing in it is trusted by the gateway.
"""

from __future__ import annotations

import ast
import io
import json
import os
import resource
import signal
import sys
import traceback
from typing import IO, Any

NO_OUTPUT = "[WARN] No output available. Use print() to output anything to stdout to receive the output"


class CellTimeout(BaseException):
    """Raised into a cell that ran out of time (a BaseException: ``except Exception`` in the
    cell does not swallow it)."""


class Capped(io.TextIOBase):
    """A cell's stdout and stderr: the first ``cap`` characters go out, the rest are counted."""

    def __init__(self, out: IO[bytes], cap: int) -> None:
        self.out, self.cap, self.sent, self.dropped = out, cap, 0, 0

    def writable(self) -> bool:
        return True

    def write(self, s: str) -> int:
        if not isinstance(s, str):
            raise TypeError(f"write() argument must be str, not {type(s).__name__}")
        room = self.cap - self.sent
        if room > 0:
            part = s[:room]
            self.out.write(part.encode("utf-8", "replace"))
            self.sent += len(part)
            self.dropped += len(s) - len(part)
        else:
            self.dropped += len(s)
        return len(s)

    def flush(self) -> None:
        self.out.flush()


def _limits(config: dict[str, Any]) -> None:
    for name, value in (("RLIMIT_AS", config["memory"]), ("RLIMIT_NPROC", config["procs"]),
                        ("RLIMIT_FSIZE", config["file_size"]), ("RLIMIT_CORE", 0),
                        ("RLIMIT_NOFILE", 256)):
        if value:
            resource.setrlimit(getattr(resource, name), (value, value))


def _alarm(signum: int, frame: Any) -> None:
    raise CellTimeout()


def _run(code: str, namespace: dict[str, Any]) -> None:
    tree = ast.parse(code, "<cell>", "exec")
    last: ast.Expression | None = None
    if tree.body and isinstance(tree.body[-1], ast.Expr):
        last = ast.Expression(tree.body[-1].value)
        tree.body.pop()
    exec(compile(tree, "<cell>", "exec"), namespace)
    if last is not None:
        value = eval(compile(last, "<cell>", "eval"), namespace)
        if value is not None:
            print(repr(value))


def _reap() -> None:
    """Every other process of the sandbox (pid 1, its init, is spared by the kernel). Only in a
    pid namespace of its own, where this interpreter is pid 2: kill(-1) anywhere else would reach
    every process its user may signal."""
    if os.getpid() != 2:
        return
    try:
        os.kill(-1, signal.SIGKILL)
    except OSError:
        pass
    try:
        while os.waitpid(-1, os.WNOHANG)[0]:
            pass
    except ChildProcessError:
        pass


def main() -> None:
    commands = os.fdopen(int(sys.argv[1]), "rb")
    out = os.fdopen(os.dup(1), "wb", buffering=0)
    config = json.loads(commands.readline())
    _limits(config)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    sys.stdin = io.StringIO("")
    signal.signal(signal.SIGALRM, _alarm)
    namespace: dict[str, Any] = {"__name__": "__main__", "__builtins__": __builtins__}
    while True:
        line = b""
        while not line.endswith(b"\n"):
            chunk = commands.readline()
            if not chunk:
                return
            line += chunk
        cmd = json.loads(line)
        capped = Capped(out, config["cap"])
        sys.stdout = sys.stderr = capped
        timed_out = False
        try:
            signal.setitimer(signal.ITIMER_REAL, cmd["timeout"])
            try:
                _run(cmd["code"], namespace)
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
        except CellTimeout:
            timed_out = True
        except SystemExit:
            print("SystemExit: the interpreter keeps running; exit() only ends the cell")
        except BaseException:
            etype, value, tb = sys.exc_info()
            while tb is not None and tb.tb_frame.f_code.co_filename != "<cell>":
                tb = tb.tb_next
            traceback.print_exception(etype, value, tb, file=capped)
        try:
            sys.stdout.flush()
        except BaseException:
            pass
        sys.stdout, sys.stderr = sys.__stdout__, sys.__stderr__
        if config.get("reap"):
            _reap()
        tail = {"marker": cmd["marker"], "dropped": capped.dropped, "printed": capped.sent,
                "timed_out": timed_out}
        out.write(b"\n\x1e" + json.dumps(tail).encode() + b"\x1e\n")


if __name__ == "__main__":
    main()
