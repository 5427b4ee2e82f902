"""The python tool: a stateful interpreter per container, each in a real sandbox.

A container is one long-lived interpreter (``tools/kernel.py``) under bubblewrap: no
network (a network namespace of its own), none of the gateway's files (only ``/usr`` and
the interpreter, read-only), environment (cleared) or processes (a pid namespace of its
own), a ``/mnt/data`` and ``/tmp`` of its own (size-limited tmpfs), and limits on memory,
processes, file size and wall time. Run as root, each container also gets a user id of its
own, so the process limit is its alone and no two containers can touch each other.

Containers live where they were made. One that another request names but this gateway does
not hold (it expired, the gateway restarted, or another replica made it) is rebuilt by
running its earlier cells again, which the chain's history holds: gateways need no path to
each other, and the state comes back as the cells built it (a cell whose result depends on
time or chance gives a new one). The rebuilt flag says so to the caller.

>>> Sandbox(memory=0).memory
0
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import secrets
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from .kernel import NO_OUTPUT

_KERNEL_SOURCE = Path(__file__).with_name("kernel.py").read_text(encoding="utf-8")
_TERMINATOR = re.compile(rb"\n\x1e(\{[^\x1e]*\})\x1e\n")
IDLE_SECONDS = 20 * 60  # as OpenAI's containers
_ENV = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}  # bwrap's own; the sandbox's is set inside
_UID_BASE = 200_000  # each container's user id when the gateway runs as root


class SandboxError(Exception):
    """The sandbox cannot start here; the message says why and what to do."""


@dataclass(frozen=True)
class Sandbox:
    """How containers are isolated and limited (``--python-*`` options)."""

    timeout: float = 120.0  # seconds a cell may run
    memory: int = 1 << 30  # bytes of address space
    procs: int = 64  # processes (threads count) a container may have
    file_size: int = 100 << 20  # bytes of any one file it writes
    # tmpfs is the machine's memory, not the interpreter's: bounded per container, and containers too
    data_size: int = 128 << 20  # bytes of /mnt/data
    tmp_size: int = 64 << 20  # bytes of /tmp
    output: int = 20_000  # characters of a cell's output the model reads
    interpreter: str = ""  # "" : Debian's /usr/bin/python3, else the gateway's base interpreter
    # "bwrap" (bubblewrap), or "none": no isolation at all, only when asked for by that name
    isolation: str = "bwrap"

    def python(self) -> str:
        if self.interpreter:
            return self.interpreter
        if os.path.exists("/usr/bin/python3"):
            return "/usr/bin/python3"
        return str(Path(sys.base_prefix) / "bin" / "python3")

    def command(self, uid: int | None, commands_fd: int) -> list[str]:
        """The command line that starts one container's interpreter (reading its cells on
        ``commands_fd``)."""
        python = self.python()
        kernel = [python, "-I", "-u", "-c", _KERNEL_SOURCE, str(commands_fd)]
        if self.isolation == "none":
            return kernel
        bwrap = shutil.which("bwrap")
        if bwrap is None:
            raise SandboxError("--python needs bubblewrap (bwrap), which is not installed: apt-get install "
                               "bubblewrap (make test's setup installs it), or run without --python")
        args = [bwrap, "--unshare-all", "--die-with-parent", "--new-session", "--cap-drop", "ALL",
                "--ro-bind", "/usr", "/usr"]
        for link in ("bin", "lib", "lib64", "sbin"):
            target = os.path.realpath(f"/{link}")
            if target.startswith("/usr/") and os.path.exists(target):
                args += ["--symlink", target.lstrip("/"), f"/{link}"]
        prefix = os.path.realpath(sys.base_prefix) if not python.startswith("/usr/") else None
        if prefix and not prefix.startswith("/usr/"):
            args += ["--ro-bind", prefix, prefix]
        args += ["--proc", "/proc", "--dev", "/dev",
                 "--size", str(self.tmp_size), "--tmpfs", "/tmp",
                 "--size", str(self.data_size), "--tmpfs", "/mnt/data",
                 "--chdir", "/mnt/data", "--clearenv",
                 "--setenv", "HOME", "/mnt/data", "--setenv", "PATH", "/usr/local/bin:/usr/bin:/bin",
                 "--setenv", "LANG", "C.UTF-8", "--setenv", "MPLBACKEND", "Agg",
                 "--hostname", "sandbox"]
        if uid is not None:  # the gateway is root: the container runs as a user id of its own
            setpriv = shutil.which("setpriv")
            if setpriv is None:
                raise SandboxError("--python run as root needs setpriv (Debian's util-linux) to give each "
                                   "container a user id of its own")
            args = [setpriv, f"--reuid={uid}", f"--regid={uid}", "--clear-groups", *args,
                    "--uid", "1000", "--gid", "1000"]
        return args + kernel


def check(sandbox: Sandbox) -> None:
    """Start one container and run a cell, or raise ``SandboxError`` saying why it cannot
    (run once at startup: ``--python`` never starts without its sandbox)."""
    if sandbox.isolation not in ("bwrap", "none"):
        raise SandboxError(f"--python-sandbox must be bwrap or none, got {sandbox.isolation!r}")
    read, write = os.pipe()
    uid = _UID_BASE if os.geteuid() == 0 and sandbox.isolation != "none" else None
    try:
        config = _config(sandbox, uid)
        cell = {"code": "print(6 * 7)", "marker": "probe", "timeout": 10}
        os.write(write, (json.dumps(config) + "\n" + json.dumps(cell) + "\n").encode())
        os.close(write)
        write = -1
        try:
            got = subprocess.run(sandbox.command(uid, read), stdin=subprocess.DEVNULL, capture_output=True,
                                 pass_fds=(read,), cwd="/", env=_ENV, timeout=30)
        except (OSError, subprocess.SubprocessError) as e:
            raise SandboxError(f"the python sandbox did not start: {e}") from None
    finally:
        os.close(read)
        if write >= 0:
            os.close(write)
    out = got.stdout.decode("utf-8", "replace")
    if not out.startswith("42\n"):
        why = (got.stderr.decode("utf-8", "replace") or out).strip()[-800:]
        raise SandboxError(f"the python sandbox did not run code (exit {got.returncode}): {why}; bubblewrap "
                           "needs unprivileged user namespaces (sysctl kernel.unprivileged_userns_clone=1, "
                           "and no AppArmor rule denying them to bwrap)")


def _config(sandbox: Sandbox, uid: int | None) -> dict[str, int]:
    """The limits the kernel holds itself to. RLIMIT_NPROC counts every process of a user id:
    a container of its own id counts its own; one sharing the gateway's counts the gateway's too.
    ``reap``: end each cell by killing the processes it left, only ever inside bubblewrap's pid
    namespace (unsandboxed, that would reach the whole machine)."""
    procs = sandbox.procs + (0 if uid is not None else _user_tasks(os.geteuid()))
    return {"memory": sandbox.memory, "procs": procs, "file_size": sandbox.file_size, "cap": sandbox.output,
            "reap": int(sandbox.isolation == "bwrap")}


@dataclass
class CellResult:
    """What one cell gave the model: its output (capped, marked when cut), and what happened."""

    output: str
    timed_out: bool = False
    killed: bool = False  # the interpreter had to be killed: its state is gone
    truncated: bool = False


def _user_tasks(uid: int) -> int:
    """How many processes and threads ``uid`` has now (RLIMIT_NPROC counts them all)."""
    count = 0
    with contextlib.suppress(OSError):
        for pid in os.listdir("/proc"):
            if pid.isdigit():
                with contextlib.suppress(OSError):
                    if os.stat(f"/proc/{pid}").st_uid == uid:
                        count += len(os.listdir(f"/proc/{pid}/task"))
    return count


class Kernel:
    """One running sandboxed interpreter."""

    def __init__(self, sandbox: Sandbox, uid_slot: int) -> None:
        self.sandbox = sandbox
        self.uid = _UID_BASE + uid_slot if os.geteuid() == 0 and sandbox.isolation != "none" else None
        self.proc: asyncio.subprocess.Process | None = None
        self._commands: int | None = None
        self.lock = asyncio.Lock()
        self._over = 0  # bytes of the last cell's output past the cap
        self._kept = bytearray()  # what the running cell printed so far (shown when it has to be killed)

    async def start(self) -> None:
        read, write = os.pipe()
        os.set_inheritable(read, True)
        uid = self.uid
        try:
            self.proc = await asyncio.create_subprocess_exec(
                *self.sandbox.command(uid, read), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT, pass_fds=(read,), start_new_session=True,
                close_fds=True, cwd="/", env=_ENV,
                limit=1 << 20)
        finally:
            os.close(read)
        self._commands = write
        os.write(write, json.dumps(_config(self.sandbox, uid)).encode() + b"\n")

    async def run(self, code: str, timeout: float | None = None) -> CellResult:
        """Run one cell; its output as the model reads it. A caller that goes away (its client
        left) does not stop the cell halfway: the interpreter stays in step for the next."""
        return await asyncio.shield(asyncio.ensure_future(self._run(code, timeout)))

    async def _run(self, code: str, timeout: float | None) -> CellResult:
        async with self.lock:
            if self.proc is None or self.proc.returncode is not None:
                await self.start()
            assert self.proc is not None and self._commands is not None
            limit = self.sandbox.timeout if timeout is None else timeout
            marker = secrets.token_hex(16)
            cmd = json.dumps({"code": code, "marker": marker, "timeout": limit}).encode() + b"\n"
            try:
                await asyncio.get_running_loop().run_in_executor(None, _write_all, self._commands, cmd)
            except OSError:
                return await self._died("")
            try:
                head, tail = await asyncio.wait_for(self._read_cell(marker), limit + 5.0)
            except asyncio.TimeoutError:
                await self.close()
                printed = self._kept.decode("utf-8", "replace")
                return CellResult(printed + f"\n[the cell ran past its {limit:g} s limit and the "
                                  "interpreter had to be killed: all state (variables, imports, files in "
                                  "/mnt/data) is lost; the next cell starts a fresh interpreter]",
                                  timed_out=True, killed=True)
            except _Died as died:
                return await self._died(died.output)
            output = self._mark(head, tail["dropped"] + self._over)
            if tail["timed_out"]:
                output += f"\n[TimeoutError: the cell ran past its {limit:g} s limit and was interrupted; " \
                          "the interpreter and its state are kept]"
            if not output.strip():
                output = NO_OUTPUT
            return CellResult(output, timed_out=bool(tail["timed_out"]),
                              truncated=bool(tail["dropped"] or self._over))

    async def _died(self, output: str) -> CellResult:
        code = self.proc.returncode if self.proc is not None else None
        await self.close()
        why = "it ran out of memory or was killed" if code is None or code < 0 else f"it exited ({code})"
        return CellResult(self._mark(output, 0) + f"\n[the interpreter stopped: {why}; all state is lost and "
                          "the next cell starts a fresh interpreter]", killed=True)

    def _mark(self, text: str, dropped: int) -> str:
        if dropped:
            return text + f"\n[output truncated: {dropped} more characters not shown]"
        return text

    async def _read_cell(self, marker: str) -> tuple[str, dict[str, int]]:
        """Read the interpreter's output until this cell's terminator, keeping the first
        ``output`` characters' worth of it: a 100 MB print costs the gateway reads, not memory."""
        assert self.proc is not None and self.proc.stdout is not None
        cap = self.sandbox.output * 4  # bytes: up to 4 a character
        kept = bytearray()
        window = b""  # the end of what was read: the terminator arrives there
        total = 0
        self._over, self._kept = 0, kept
        while True:
            chunk = await self.proc.stdout.read(1 << 16)
            if not chunk:
                raise _Died(kept.decode("utf-8", "replace"))
            total += len(chunk)
            if len(kept) < cap:
                kept += chunk[: cap - len(kept)]
            data = window + chunk
            for m in _TERMINATOR.finditer(data):
                try:
                    tail = json.loads(m.group(1))
                except ValueError:
                    continue
                if isinstance(tail, dict) and tail.get("marker") == marker:
                    size = total - (len(data) - m.start())  # the cell's own bytes
                    self._over = max(0, size - cap)
                    return bytes(kept[: min(cap, size)]).decode("utf-8", "replace"), tail
            window = data[-4096:]

    async def close(self) -> None:
        proc, self.proc = self.proc, None
        if self._commands is not None:
            with contextlib.suppress(OSError):
                os.close(self._commands)
            self._commands = None
        if proc is not None and proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(proc.wait(), 10)


class _Died(Exception):
    def __init__(self, output: str) -> None:
        self.output = output


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


@dataclass
class Container:
    """A container: its interpreter and the cells it ran (what a rebuild runs again)."""

    id: str
    owner: str
    kernel: Kernel
    cells: list[str] = field(default_factory=list)
    used: float = field(default_factory=time.monotonic)


class Containers:
    """The containers this gateway holds, by (owner, id): one user never reaches another's."""

    def __init__(self, sandbox: Sandbox, idle: float = IDLE_SECONDS, most: int = 32) -> None:
        self.sandbox = sandbox
        self.idle = idle
        self.most = most  # interpreters held at once; past it the least recently used idle one goes
        self.held: dict[tuple[str, str], Container] = {}
        self._slots = 0

    def new_id(self) -> str:
        return "cntr_" + secrets.token_hex(16)

    def holds(self, owner: str, cid: str) -> bool:
        return (owner, cid) in self.held

    async def get(self, owner: str, cid: str, history: list[str]) -> tuple[Container, bool]:
        """The container, made (and rebuilt from ``history``, its earlier cells) when this gateway
        does not hold it; True when it was rebuilt."""
        await self.expire()
        found = self.held.get((owner, cid))
        if found is not None:
            found.used = time.monotonic()
            return found, False
        idle = sorted((c for c in self.held.values() if not c.kernel.lock.locked()), key=lambda c: c.used)
        for c in idle[: max(0, len(self.held) + 1 - self.most)]:  # it can be rebuilt from its chain
            del self.held[(c.owner, c.id)]
            await c.kernel.close()
        self._slots += 1
        container = Container(cid, owner, Kernel(self.sandbox, uid_slot=self._slots % 50_000))
        self.held[(owner, cid)] = container
        for cell in history:
            await container.kernel.run(cell)
            container.cells.append(cell)
        return container, bool(history)

    async def run(self, container: Container, code: str) -> CellResult:
        container.used = time.monotonic()
        result = await container.kernel.run(code)
        if result.killed:
            container.cells = []
        else:
            container.cells.append(code)
        container.used = time.monotonic()
        return result

    async def expire(self) -> None:
        now = time.monotonic()
        for key, c in list(self.held.items()):
            if now - c.used > self.idle and not c.kernel.lock.locked():
                del self.held[key]
                await c.kernel.close()

    async def close(self) -> None:
        held, self.held = self.held, {}
        for c in held.values():
            await c.kernel.close()
