"""A real PostgreSQL server for the tests (Debian's ``postgresql`` package): ``initdb`` in a
temporary folder, run as an unprivileged user when the tests run as root (PostgreSQL refuses
root), started on 127.0.0.1 and a free port; stopped, and its folder removed, on exit."""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path


def _bin(name: str) -> str:
    found = shutil.which(name) or next(iter(sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"), reverse=True)),
                                       None)
    if found is None:
        raise RuntimeError(f"PostgreSQL's {name} is not installed: apt-get install postgresql "
                           "(make engines does, where it can)")
    return found


def _as_user() -> tuple[list[str], int | None]:
    if os.geteuid() != 0:
        return [], None
    user = pwd.getpwnam("nobody")
    return ["setpriv", f"--reuid={user.pw_uid}", f"--regid={user.pw_gid}", "--clear-groups", "--"], user.pw_uid


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Postgres:
    """One running server: ``url`` for the store, ``stop()`` / ``start()`` for fault tests."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.data = folder / "data"
        self.port = _port()
        self.url = f"postgresql://postgres@127.0.0.1:{self.port}/postgres"
        self.prefix, self.uid = _as_user()

    def _run(self, *cmd: str, timeout: float = 120) -> None:
        done = subprocess.run([*self.prefix, *cmd], capture_output=True, text=True, timeout=timeout, cwd="/")
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd[:2])} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}"
                               + self._log_tail())

    def _log_tail(self) -> str:
        log = self.folder / "server.log"
        return "\n" + log.read_text(errors="replace")[-2000:] if log.exists() else ""

    def init(self) -> None:
        if self.uid is not None:
            os.chown(self.folder, self.uid, -1)
        self._run(_bin("initdb"), "-D", str(self.data), "-U", "postgres", "--auth=trust", "-E", "UTF8",
                  "--no-sync")

    def start(self) -> None:
        opts = (f"-c listen_addresses=127.0.0.1 -p {self.port} -k {self.folder} -c fsync=off "
                "-c max_connections=200 -c shared_buffers=32MB")
        self._run(_bin("pg_ctl"), "-D", str(self.data), "-l", str(self.folder / "server.log"), "-o", opts,
                  "-w", "-t", "60", "start")
        deadline = time.monotonic() + 30
        while True:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", self.port), timeout=1):
                return
            if time.monotonic() > deadline:
                raise RuntimeError("PostgreSQL did not listen" + self._log_tail())
            time.sleep(0.1)

    def stop(self, mode: str = "fast") -> None:
        self._run(_bin("pg_ctl"), "-D", str(self.data), "-m", mode, "-w", "-t", "60", "stop")


@contextlib.contextmanager
def postgres_server() -> Iterator[Postgres]:
    folder = Path(tempfile.mkdtemp(prefix="harmonykit-pg-"))
    server = Postgres(folder)
    try:
        server.init()
        server.start()
        yield server
    finally:
        with contextlib.suppress(Exception):
            server.stop("immediate")
        shutil.rmtree(folder, ignore_errors=True)
