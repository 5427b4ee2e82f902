"""Node clients nobody here wrote, run as their users run them against the gateway (issue 25):
the Codex CLI's own binary (``codex exec``, its default configuration but for the provider) and
the Vercel AI SDK's tool loops. The model's choices come from the scripted stand-in engine; the
clients, the gateway, its store and Codex's own sandbox are real. ``make engines``
(tests/real/setup.py) installs them: Node and npm from Debian's packages when missing, the
clients at the exact versions of ``NODE_CLIENTS``. A client that is not there fails its test.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from engine import Engine, prompt_of, scripted, serving
from harmonykit.server import Settings, create_app
from harmonykit.tools.index import build
from real.setup import ROOT

NODE = ROOT / "node" / "node_modules"
HERE = Path(__file__).resolve().parent
KEY = "sk-node-clients"
REASONED = "<|channel|>analysis<|message|>Call {}.<|end|>"


def _installed(path: Path) -> Path:
    if not path.exists() or not shutil.which("node"):
        pytest.fail(f"{path} is missing: run `make engines` (tests/real/setup.py installs the Node clients)")
    return path


@pytest.fixture(scope="module")
def engine() -> Iterator[tuple[Engine, str]]:
    with scripted(25) as served:
        served[0].context = 131072  # gpt-oss's: Codex's prompt is some 8k tokens before any MCP server
        yield served


@pytest.fixture(scope="module")
def gw(engine: tuple[Engine, str], tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A gateway as a user starts one for these clients: a key, the default SQLite store, and a
    browser (Codex offers ``web_search`` on every request; an index answers it offline)."""
    folder = tmp_path_factory.mktemp("node-clients")
    (folder / "page.html").write_text("<html><title>Tea</title><body><p>Green tea steeps at 80 C.</p></body></html>")
    build([str(folder / "page.html")], str(folder / "docs.db"), base_url="https://docs.example/")
    settings = Settings(upstream=(engine[1],), store=f"sqlite:///{folder / 'store.db'}", api_key=(KEY,),
                        browser=f"index={folder / 'docs.db'}")
    with serving(create_app(settings)) as url:
        yield url


def _env(**extra: str) -> dict[str, str]:
    keep = {k: os.environ[k] for k in ("PATH", "HOME", "LANG", "TERM") if k in os.environ}
    return {**keep, "HARMONYKIT_API_KEY": KEY, **extra}


# -- the Vercel AI SDK -------------------------------------------------------------------------

def _ai_sdk(tmp_path: Path, gw: str, *args: str) -> dict[str, Any]:
    """tests/clients/ai_sdk.mjs beside the installed packages (Node resolves ``ai`` from there)."""
    (tmp_path / "node_modules").symlink_to(_installed(NODE))
    script = tmp_path / "ai_sdk.mjs"
    shutil.copy(HERE / "clients" / "ai_sdk.mjs", script)
    run = subprocess.run(["node", str(script), gw + "/v1", *args], capture_output=True, text=True, timeout=120,
                         env=_env(), cwd=tmp_path)
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


@pytest.mark.parametrize("how", ["generate", "stream"])
@pytest.mark.parametrize("api,storing", [("responses", "store"), ("responses", "nostore"), ("responses", "force"),
                                         ("chat", "store")])
def test_the_ai_sdk_runs_its_tool_loop(gw: str, engine: tuple[Engine, str], tmp_path: Path,
                                       api: str, storing: str, how: str) -> None:
    """Step one calls the tool, step two answers from its result, and the second step's prompt
    holds the first step's reasoning: through Responses stored, the SDK refers to it by id
    (``item_reference``); with ``store: false`` it sends back the sealed copy the gateway gave;
    through Chat it sends none, and the gateway restores what it kept under the call's id."""
    who = f"{api}-{storing}-{how}"
    before = len(engine[0].requests)
    out = _ai_sdk(tmp_path, gw, api, storing, how, f'call:lookup:{{"q": "{who}"}}')
    assert (out["text"], out["steps"], out["calls"]) == (f"tool said found {who}", 2, [who]), out
    assert out["warnings"] == []  # the SDK drops reasoning it cannot send back, and warns when it does
    if how == "stream":
        assert out["streamed"] == out["text"]
    prompts = [prompt_of(r) for r in engine[0].requests[before:]]
    assert len(prompts) == 2 and f"<|message|>found {who}<|end|>" in prompts[1]
    assert REASONED.format("lookup") in prompts[1], prompts[1][-600:]


# -- the Codex CLI -------------------------------------------------------------------------------

@pytest.fixture
def codex_home(gw: str) -> Iterator[Path]:
    """Codex's configuration as docs/clients.md gives it, and what keeps it off the network (its
    update check, analytics and plugin sync look up github.com and chatgpt.com: tests send
    traffic to loopback only). Not under /tmp: Codex will not put its sandbox's helper binaries
    in a temporary folder, and its shell tool then fails."""
    parent = Path.home() / ".cache" / "harmonykit"
    parent.mkdir(parents=True, exist_ok=True)
    home = Path(tempfile.mkdtemp(prefix="codex-home-", dir=parent))
    (home / "config.toml").write_text(
        'model = "gpt-oss-20b"\nmodel_provider = "harmonykit"\ncheck_for_update_on_startup = false\n\n'
        '[model_providers.harmonykit]\n'
        f'name = "harmonykit"\nbase_url = "{gw}/v1"\nenv_key = "HARMONYKIT_API_KEY"\nwire_api = "responses"\n\n'
        '[analytics]\nenabled = false\n\n[features]\nplugins = false\nremote_plugin = false\n')
    try:
        yield home
    finally:
        shutil.rmtree(home, ignore_errors=True)


def _codex(home: Path, work: Path, prompt: str, *, resume: bool = False,
           traced: Path | None = None) -> list[dict[str, Any]]:
    codex = _installed(NODE / ".bin" / "codex")
    how = ["exec", "--json", "--skip-git-repo-check", *(["resume", "--last"] if resume else [])]
    # traced: every connection and datagram Codex and its children make, written there by strace
    spy = ["strace", "-f", "-qq", "-e", "trace=connect,sendto,sendmsg,sendmmsg", "-o", str(traced)] if traced else []
    run = subprocess.run([*spy, str(codex), *how, prompt], capture_output=True,
                         text=True, timeout=180, env=_env(CODEX_HOME=str(home)), cwd=work,
                         stdin=subprocess.DEVNULL)
    events = [json.loads(line) for line in run.stdout.splitlines() if line.startswith("{")]
    assert run.returncode == 0, (run.stderr[-3000:], events[-5:])
    assert not [e for e in events if e["type"] in ("error", "turn.failed")], events
    return events


def _said(events: list[dict[str, Any]]) -> list[str]:
    return [e["item"]["text"] for e in events if e["type"] == "item.completed"
            and e["item"]["type"] == "agent_message"]


def test_codex_answers(gw: str, engine: tuple[Engine, str], codex_home: Path, tmp_path: Path) -> None:
    """Codex's first request as it always sends it: ``client_metadata``, ``namespace`` tools (its
    sub-agents), ``web_search``, ``store: false`` with encrypted reasoning — answered."""
    before = len(engine[0].requests)
    events = _codex(codex_home, tmp_path, "say:Hello from the gateway")
    assert _said(events) == ["Hello from the gateway"]
    prompt = prompt_of(engine[0].requests[before])
    assert "namespace multi_agent_v1 {" in prompt and "namespace browser {" in prompt
    assert "type exec_command = (_: {" in prompt


def test_codex_talks_to_the_gateway_alone(gw: str, codex_home: Path, tmp_path: Path) -> None:
    """Configured as docs/clients.md gives it for a machine that reaches nothing else, Codex
    connects to the gateway on loopback and nowhere else: no other address, no DNS query."""
    trace = tmp_path / "trace"
    assert _said(_codex(codex_home, tmp_path, "say:only you", traced=trace)) == ["only you"]
    seen = trace.read_text()
    v4 = set(re.findall(r'inet_addr\("([^"]+)"\)', seen))
    v6 = set(re.findall(r'inet_pton\(AF_INET6, "([^"]+)"', seen))
    assert v4 and all(a.startswith("127.") for a in v4) and v6 <= {"::1"}, (v4, v6)
    assert "htons(53)" not in seen  # no name looked up


def test_codex_runs_a_shell_command_and_reads_its_output(gw: str, engine: tuple[Engine, str],
                                                        codex_home: Path, tmp_path: Path) -> None:
    """The model calls Codex's shell tool; Codex runs the command in its own sandbox and sends the
    output back; the model answers from it, its reasoning kept across the steps (``store:
    false``: the sealed copy came back)."""
    before = len(engine[0].requests)
    events = _codex(codex_home, tmp_path, 'call:exec_command:{"cmd": "echo shell-says-$((6*7))"}')
    ran = [e["item"] for e in events if e["type"] == "item.completed" and e["item"]["type"] == "command_execution"]
    assert len(ran) == 1 and ran[0]["exit_code"] == 0 and "shell-says-42" in ran[0]["aggregated_output"], ran
    assert "shell-says-42" in _said(events)[-1]
    second = prompt_of(engine[0].requests[-1])
    assert len(engine[0].requests) - before == 2 and REASONED.format("exec_command") in second
    assert "<|start|>functions.exec_command to=assistant<|channel|>commentary<|message|>" in second



def test_codex_searches_with_the_gateways_browser_and_goes_on(gw: str, engine: tuple[Engine, str],
                                                              codex_home: Path, tmp_path: Path) -> None:
    """Codex's own ``web_search`` tool, run at the gateway by gpt-oss's browser over its index:
    Codex shows the search; the next turn (``exec resume``) sends the whole history back, the
    search and the sealed reasoning included, and is answered."""
    search = ('agent:<<channel>>analysis<<message>>Search it.<<end>><<start>>assistant<<channel>>analysis '
              'to=browser.search <<constrain>>json<<message>>{"query": "green tea"}<<call>> ||| '
              "<<channel>>final<<message>>read: <<result>><<return>>")
    events = _codex(codex_home, tmp_path, search)
    searched = [e["item"] for e in events if e["type"] == "item.completed" and e["item"]["type"] == "web_search"]
    assert [s["query"] for s in searched] == ["green tea"], events
    assert "Green tea steeps at 80 C." in _said(events)[-1]
    before = len(engine[0].requests)
    again = _codex(codex_home, tmp_path, "say:and the second turn", resume=True)
    assert _said(again) == ["and the second turn"]
    prompt = prompt_of(engine[0].requests[before])
    assert "<|message|>Search it.<|end|>" not in prompt  # an ended turn's reasoning is dropped (harmony)
    assert "to=browser.search" in prompt and "green tea" in prompt and "Green tea steeps" in prompt


def test_codex_calls_its_own_mcp_server_through_a_namespace(gw: str, engine: tuple[Engine, str],
                                                           codex_home: Path, tmp_path: Path) -> None:
    """An MCP server in Codex's config arrives as a ``namespace`` tool (``mcp__notes``): the model's
    ``to=mcp__notes.add`` goes back to Codex as that namespace's ``add``, Codex calls its server,
    and the result renders back under the same name."""
    calls = tmp_path / "calls.log"
    with (codex_home / "config.toml").open("a") as config:
        config.write(f'\n[mcp_servers.notes]\ncommand = "{sys.executable}"\n'
                     f'args = ["{HERE / "clients" / "notes_mcp.py"}", "{calls}"]\n'
                     # required: Codex waits for the server before its first request (an optional
                     # one still starting is left out of it: a race on a loaded machine)
                     'default_tools_approval_mode = "approve"\nrequired = true\nstartup_timeout_sec = 60\n')
    before = len(engine[0].requests)
    events = _codex(codex_home, tmp_path, 'agent:<<channel>>commentary to=mcp__notes.add <<constrain>>json'
                                          '<<message>>{"a": 20, "b": 22}<<call>> ||| '
                                          "<<channel>>final<<message>>sum: <<result>><<return>>")
    ran = [e["item"] for e in events if e["type"] == "item.completed" and e["item"]["type"] == "mcp_tool_call"]
    assert len(ran) == 1 and (ran[0]["server"], ran[0]["tool"], ran[0]["status"]) == ("notes", "add", "completed")
    assert calls.read_text() == "add 20 22\n" and "42" in _said(events)[-1]
    first, second = (prompt_of(r) for r in engine[0].requests[before:])
    assert "namespace mcp__notes {" in first and "type add = (_: {" in first
    assert "<|start|>mcp__notes.add to=assistant<|channel|>commentary<|message|>" in second
