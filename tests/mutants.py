"""`make mutants`: one-line bugs in the core and the gateway, each run against the tests that cover
it; a mutant the tests do not catch survives, and the run fails.

The mutants are data (``MUTANTS``): where (a file and the exact text of the line, found once),
what it becomes, and which test files cover it. Each runs in a copy of the checkout (the working
tree is never touched), with the derandomized hypothesis profile (``CI=true``) and without the
real engines: the fast suite must catch every one. A mutant whose text is no longer found is
reported as stale (the list must follow the code), and fails the run too.

    python tests/mutants.py            # all of them
    python tests/mutants.py stops-     # those whose name starts so
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Mutant:
    name: str  # area-what: the area is the first word (parser, render, mapping, stops, cache, gateway,
    # store, state)
    path: str  # under src/harmonykit
    line: str  # the exact text of one line (stripped), found once in the file
    becomes: str
    tests: tuple[str, ...]  # test files (under tests/) that cover it


PARSE = ("test_parse_stream.py", "test_parse_tolerant.py", "test_parse_differential.py", "test_parse_reference.py")
TOOLS = ("test_tools.py",)
MCP = ("test_mcp.py",)
CLIENTS = ("test_clients.py",)
MAPPING = ("test_openai_request.py", "test_openai_output.py", "test_render_cache.py", "test_data.py")

MUTANTS = [
    # -- the parser ----------------------------------------------------------------------------------
    Mutant("parser-shows-held-white-space", "parse/machine.py",
           "cut = len(tail) + (m.start() if m else len(text.rstrip()))",
           "cut = len(tail) + (m.start() if m else len(text))", PARSE),
    Mutant("parser-stripped-markup-boundary", "parse/machine.py",
           "cut = end if k == len(pieces) - 1 else max(ht.token_after(e), self._cursor + 1)",
           "cut = end if k == len(pieces) - 1 else max(ht.token_after(e) + 1, self._cursor + 1)", PARSE),
    Mutant("parser-past-bound-boundary", "parse/machine.py",
           "max(ht.token_after(e), self._cursor + 1))",
           "max(ht.token_after(e) - 1, self._cursor + 1))", PARSE),
    Mutant("parser-header-limit", "parse/machine.py",
           "HEADER_LIMIT: Final = 64", "HEADER_LIMIT: Final = 640", (*PARSE, "test_server.py")),
    Mutant("parser-shows-held-white-space-after-fields", "parse/machine.py",
           "cut = m.start() if m else len(text.rstrip())", "cut = m.start() if m else len(text)", PARSE),
    Mutant("parser-utf8-repair-blames-the-next-token", "parse/machine.py",
           "self.repairs.append(Repair(\"invalid_utf8\", self._pending_at if e.start < held else index,",
           "self.repairs.append(Repair(\"invalid_utf8\", index,", PARSE),
    Mutant("parser-no-utf8-repair", "parse/machine.py",
           'if not self.strict:', "if False:", PARSE),
    Mutant("parser-stop-token-ignored", "parse/machine.py",
           "self.stop = STOP_NAMES[stop_token] if stop_token is not None else None",
           "self.stop = None", PARSE),
    Mutant("parser-call-after-answer-unrepaired", "parse/machine.py",
           "if token == CALL and header.recipient is None:", "if False:", PARSE),
    Mutant("parser-sound-header-lets-constrain-pass", "parse/header.py",
           "return has_control_text(header) is None and ct != CONSTRAIN_MARKER \\",
           "return has_control_text(header) is None \\", PARSE),
    Mutant("parser-batch-skips-pending-bytes", "parse/machine.py",
           "text = (bytes(self.pending) + data).decode(\"utf-8\")", "text = data.decode(\"utf-8\")", PARSE),
    Mutant("parser-header-cache-ignores-tools", "parse/machine.py",
           "key = (tuple(self.header_tokens), self.next_role, self.tools, self.strict)",
           "key = (tuple(self.header_tokens), self.next_role, self.strict)", (*PARSE, "test_openai_output.py")),
    # -- rendering -----------------------------------------------------------------------------------
    Mutant("render-call-ends-in-end", "render.py",
           "return CALL if role is Role.ASSISTANT and recipient is not None else END",
           "return END", ("test_render_golden.py", "test_render_differential.py")),
    Mutant("render-chain-of-thought-kept", "render.py",
           "last_is_final = channel == \"final\"", "last_is_final = False",
           ("test_render_golden.py", "test_render_differential.py", "test_data.py")),
    Mutant("render-optional-parameter-marked-required", "typescript.py",
           'mark = "" if required else "?"', 'mark = ""', ("test_render_golden.py", "test_render_differential.py")),
    Mutant("render-enum-joined-wrongly", "typescript.py",
           'return " | ".join(names)', 'return "|".join(names)',
           ("test_render_golden.py", "test_render_differential.py")),
    # -- the OpenAI mapping --------------------------------------------------------------------------
    Mutant("mapping-instructions-joined-by-one-newline", "openai/request.py",
           'developer = Developer("\\n\\n".join(instructions) if instructions else None, listed, response_format,',
           'developer = Developer("\\n".join(instructions) if instructions else None, listed, response_format,',
           MAPPING),
    Mutant("mapping-preamble-as-final", "openai/request.py",
           'channel = "commentary" if calls else "final"', 'channel = "final"', MAPPING),
    Mutant("mapping-tool-result-to-nobody", "openai/request.py",
           'self.add(Role.TOOL, output, name=_recipient(name), channel="commentary", recipient="assistant")',
           'self.add(Role.TOOL, output, name=_recipient(name), channel="commentary")', MAPPING),
    Mutant("mapping-tool-choice-none-shows-tools", "openai/request.py",
           'listed = () if tool_choice == "none" else entries', "listed = entries", MAPPING),
    Mutant("mapping-call-finish-reason", "openai/turn.py",
           'reason = "tool_calls"', 'reason = "stop"', ("test_openai_output.py", "test_server.py")),
    Mutant("mapping-default-effort-low", "openai/request.py",
           "        effort = ReasoningEffort.MEDIUM", "        effort = ReasoningEffort.LOW", MAPPING),
    Mutant("mapping-incomplete-item-marked-completed", "openai/responses.py",
           'item["status"] = "incomplete" if self._key in self.turn.incomplete else "completed"',
           'item["status"] = "completed"', ("test_openai_output.py",)),
    Mutant("mapping-stream-deltas-lose-reasoning", "openai/chat.py",
           'reasoning.append(d["reasoning_content"])', "pass", ("test_openai_output.py", "test_server.py")),
    # -- stop strings ----------------------------------------------------------------------------------
    Mutant("stops-whole-path-ignores-stop", "server/app.py",
           'end = OutputEnd(self.encoding, job.sampling.get("stop") or ())\n            ids, lps',
           'end = OutputEnd(self.encoding, ())\n            ids, lps', ("test_server.py", "test_stops.py")),
    Mutant("stops-stream-path-ignores-stop", "server/app.py",
           'end = OutputEnd(self.encoding, job.sampling.get("stop") or ())\n            pump',
           'end = OutputEnd(self.encoding, ())\n            pump', ("test_server.py", "test_stops.py")),
    Mutant("stops-straddling-token-keeps-a-byte-more", "openai/stops.py",
           'out_ids += self.encoding.encode(b[: cut - pos].decode("utf-8", "replace"),',
           'out_ids += self.encoding.encode(b[: cut - pos + 1].decode("utf-8", "replace"),',
           ("test_stops.py", "test_server.py")),
    Mutant("stops-holds-back-too-little", "openai/stops.py",
           "for n in range(min(len(s) - 1, len(data)), 0, -1):",
           "for n in range(min(len(s) - 2, len(data)), 0, -1):", ("test_stops.py", "test_server.py")),
    Mutant("stops-call-ends-in-return", "openai/stops.py",
           'return CALL if " to=" in f" {header}" else RETURN', "return RETURN", ("test_stops.py", "test_server.py")),
    Mutant("stops-no-stop-token-put-back", "openai/stops.py",
           "if (ended or self.stopped) and (self._last is None or self._last not in STOP_TOKEN_SET):",
           "if self.stopped and (self._last is None or self._last not in STOP_TOKEN_SET):",
           ("test_stops.py", "test_server.py", "test_engines.py")),
    # -- the render caches -----------------------------------------------------------------------------
    Mutant("cache-head-key-loses-effort", "openai/request.py",
           "key = None if data is None else (id(encoding), api, effort, tuple(instructions), compact_key(data),",
           "key = None if data is None else (id(encoding), api, tuple(instructions), compact_key(data),",
           MAPPING),
    Mutant("cache-head-key-loses-instructions", "openai/request.py",
           "key = None if data is None else (id(encoding), api, effort, tuple(instructions), compact_key(data),",
           "key = None if data is None else (id(encoding), api, effort, compact_key(data),", MAPPING),
    Mutant("cache-system-key-loses-tools", "openai/request.py",
           "key = (id(encoding), effort, has_tools, tuple([(ns.name, ns.description) for ns in hosted]))",
           "key = (id(encoding), effort, tuple([(ns.name, ns.description) for ns in hosted]))", MAPPING),
    Mutant("cache-message-key-loses-context", "openai/request.py",
           "key = (self.api, id(self.encoding), context, compact_key(data))",
           "key = (self.api, id(self.encoding), compact_key(data))", MAPPING),
    Mutant("cache-plain-message-key-loses-context", "openai/request.py",
           "key: tuple[Any, ...] = (self.api, id(self.encoding), context, plain)",
           "key: tuple[Any, ...] = (self.api, id(self.encoding), plain)", MAPPING),
    Mutant("cache-hit-skips-the-equality-check", "openai/request.py",
           "if found is not None and (data is None or (found[0] == data and (not found[1] or _finite(source)))):",
           "if found is not None:", MAPPING),
    Mutant("cache-lru-never-evicts", "cache.py",
           "while self.used > self.budget and items:", "while False:", ("test_render_cache.py",)),
    # -- the gateway -----------------------------------------------------------------------------------
    Mutant("gateway-renders-large-requests-on-the-loop", "server/app.py",
           "tokens = await asyncio.to_thread(render_tokens, render, self.encoding, request,",
           "tokens = render_tokens(render, self.encoding, request,", ("test_server.py",)),
    Mutant("gateway-loses-a-request-on-a-dropped-connection", "server/upstream.py",
           "except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError):", "except ():",
           ("test_upstream.py",)),
    Mutant("gateway-no-early-refusal", "server/app.py",
           "if contexts and size > max(contexts) * _BYTES_PER_TOKEN_BOUND:", "if False:", ("test_server.py",)),
]
STATE = ("test_store.py", "test_stateful.py", "test_stateful_faults.py")
MUTANTS += [
    # -- the store and stored state (issue 22) -----------------------------------------------------------
    Mutant("store-a-response-read-by-any-owner", "store/sql.py",
           'f"SELECT {_RESPONSE_COLUMNS} FROM hk_responses WHERE id = ? AND owner = ? AND expires_at > ?",',
           'f"SELECT {_RESPONSE_COLUMNS} FROM hk_responses WHERE id = ? AND (owner = ? OR 1 = 1) AND expires_at > ?",',
           STATE),
    Mutant("store-appends-share-positions", "store/sql.py",
           '"UPDATE hk_conversations SET next_pos = next_pos + ?, expires_at = ? "',
           '"UPDATE hk_conversations SET next_pos = next_pos + 0 * ?, expires_at = ? "', STATE),
    Mutant("store-finish-overwrites-a-cancel", "store/sql.py",
           'cancelled = now_status == "cancelled"  # cancelled meanwhile: it stays so, with what it produced',
           "cancelled = False", STATE),
    Mutant("store-an-expired-lease-still-vouches", "store/sql.py",
           "if lease_owner is None or lease_until is None or lease_until < now:",
           "if lease_owner is None or lease_until is None:", STATE),
    Mutant("store-items-ignore-order", "store/sql.py", 'desc = order == "desc"', "desc = False", STATE),
    Mutant("state-chain-drops-its-items", "server/state.py", "items += rec.items", "pass", STATE),
    Mutant("store-chain-drops-inputs", "store/sql.py",
           "links.append(ChainLink(link_id, previous, status, orjson.loads(items) + orjson.loads(output)))",
           "links.append(ChainLink(link_id, previous, status, orjson.loads(output)))", STATE),
    Mutant("state-remote-cancel-ignored", "server/state.py",
           "for rid in await self.store.cancelled(self.instance, list(self.tasks)):", "for rid in []:", STATE),
    Mutant("gateway-every-key-one-owner", "server/app.py", "return owner_of(key)", 'return owner_of("")', STATE),
    # -- the built-in tools and the agent loop ----------------------------------------------------------
    Mutant("tools-ssrf-ignores-embedded-ipv4", "tools/net.py", "inner = _embedded_v4(ip)", "inner = None", TOOLS),
    Mutant("tools-ssrf-allows-everything", "tools/net.py",
           "if any(candidate.version == net.version and candidate in net for net in allow):", "if True:", TOOLS),
    Mutant("tools-ssrf-trusts-dns", "tools/net.py", "why = refused(addr, self.allow)", "why = None", TOOLS),
    Mutant("tools-ssrf-redirect-unchecked", "tools/net.py", "self.check_url(url)", "pass", TOOLS),
    Mutant("tools-kernel-output-uncapped", "tools/kernel.py", "room = self.cap - self.sent", "room = 10 ** 12",
           TOOLS),
    Mutant("tools-kernel-no-cell-timeout", "tools/kernel.py",
           'signal.setitimer(signal.ITIMER_REAL, cmd["timeout"])', "pass", TOOLS),
    Mutant("tools-containers-shared-by-keys", "tools/python.py", "return (owner, cid) in self.held",
           "return any(i == cid for _, i in self.held)", TOOLS),
    Mutant("tools-page-links-all-same-domain", "tools/browser/page.py",
           '_replace(a, f"【{link_id}†{text}】" if domain == here else f"【{link_id}†{text}†{domain}】")',
           '_replace(a, f"【{link_id}†{text}】")', TOOLS),
    Mutant("tools-browser-cursor-off-by-one", "tools/browser/session.py",
           "if not 0 <= cursor < len(self.stack):", "if not 0 <= cursor <= len(self.stack):", TOOLS),
    Mutant("tools-search-unescaped", "tools/browser/page.py",
           'f"{_html.escape(summary)}</li>" for title, url, summary in results)',
           'f"{summary}</li>" for title, url, summary in results)', TOOLS),
    Mutant("agent-max-tool-calls-ignored", "agent/loop.py",
           "if self.max_calls is not None and self.calls >= self.max_calls:", "if False:", TOOLS),
    Mutant("agent-renders-what-the-model-wrote-as-a-user", "agent/loop.py",
           "if m.author.role is Role.ASSISTANT:", "if True:", TOOLS),
    Mutant("agent-result-on-no-channel", "agent/loop.py",
           "tokens += render(Message(author=Author(role=Role.TOOL, name=tool_name), channel=channel,",
           "tokens += render(Message(author=Author(role=Role.TOOL, name=tool_name), channel=None,", TOOLS),
    Mutant("agent-budget-per-step", "agent/loop.py",
           "return None if self.limit is None else self.limit - out.output_tokens",
           "return self.limit", TOOLS),
    Mutant("mcp-approval-ignored", "openai/responses.py",
           'asks = self.needs_approval if made["type"] == "mcp_call" else None', "asks = None", MCP),
    Mutant("mcp-secrets-echoed", "openai/responses.py",
           'out.append({k: v for k, v in t.items() if k not in ("headers", "authorization")})',
           "out.append(dict(t))", MCP),
    Mutant("mcp-server-url-unchecked", "tools/mcp.py", "self.fetcher.check_url(server.url)", "pass", MCP),
    Mutant("mcp-disallowed-tool-runs", "agent/mcp.py",
           "return tool if server is not None and tool is not None and server.allows(tool) else None",
           "return tool", MCP),
    Mutant("mcp-listing-not-reused", "agent/mcp.py", "held = _listed(history, label)", "held = None", MCP),
    Mutant("mcp-approval-runs-twice", "agent/mcp.py",
           'if answer.get("approve") is not True or rid in done:', 'if answer.get("approve") is not True:', MCP),
    Mutant("mcp-unsafe-schema", "tools/mcp.py", "schema = safe_schema(schema)", "pass", MCP),
    Mutant("mcp-logs-credentials", "server/app.py", "return _redacted(body) if isinstance(body, dict) else body",
           "return body", MCP),
    Mutant("clients-unknown-fields-refused", "openai/params.py", "ignored.append(key)",
           "raise RequestError(key, f'unrecognized request argument supplied: {key}')", CLIENTS),
    Mutant("clients-forced-call-needs-guided", "server/app.py", "_check_tool_choice(self._grammar_problem())",
           '_check_tool_choice("no grammar without --guided")', CLIENTS),
    Mutant("clients-item-reference-any-owner", "store/sql.py",
           '"WHERE f.owner = ? AND f.item_id = ? AND r.owner = ? AND r.expires_at > ?",',
           '"WHERE ? IS NOT NULL AND f.item_id = ? AND ? IS NOT NULL AND r.expires_at > ?",', CLIENTS),
    Mutant("clients-namespace-call-unsplit", "openai/responses.py",
           "if dot and space in self.spaces:  # a tool of one of the request's namespaces", "if False:", CLIENTS),
    Mutant("clients-namespace-result-as-function", "openai/request.py",
           'return rendered if "." in rendered else f"functions.{rendered}"', 'return f"functions.{rendered}"',
           CLIENTS),
    Mutant("clients-encrypted-reasoning-not-restored", "server/app.py",
           'item["content"] = [{"type": "reasoning_text", "text": text}]', "pass", CLIENTS),
    Mutant("clients-store-false-unsealed", "server/app.py",
           'if not asked and request.get("store") is not False:', "if not asked:",
           (*CLIENTS, "test_node_clients.py")),
    Mutant("clients-chat-reasoning-not-restored", "server/state.py",
           'out[i] = {**messages[i], "reasoning_content": text}', "pass", (*CLIENTS, "test_node_clients.py")),
    Mutant("clients-chat-reasoning-any-owner", "store/sql.py",
           '"SELECT call_id, text FROM hk_thoughts WHERE owner = ? AND expires_at > ? "',
           '"SELECT call_id, text FROM hk_thoughts WHERE ? IS NOT NULL AND expires_at > ? "',
           (*CLIENTS, "test_store.py")),
    Mutant("clients-chat-reasoning-never-expires", "store/sql.py",
           '"SELECT call_id, text FROM hk_thoughts WHERE owner = ? AND expires_at > ? "',
           '"SELECT call_id, text FROM hk_thoughts WHERE owner = ? AND ? IS NOT NULL "', ("test_store.py",)),
    Mutant("clients-context-error-names-messages", "server/app.py",
           'param = _PROMPT["chat" if "messages" in request else "responses"]', 'param = "messages"',
           ("test_stateful.py",)),
    Mutant("clients-include-unchecked", "openai/params.py", "if value not in INCLUDES:", "if False:", CLIENTS),
    Mutant("mapping-chain-drops-tool-results", "openai/request.py",
           "self.add(Role.TOOL, result, name=tool, channel=channel, recipient=\"assistant\")", "pass",
           ("test_tools.py",)),
]


def _copy() -> Path:
    """The checkout's tracked files (as they are in the working tree, edits included) in a
    temporary folder: the working tree itself is never mutated."""
    where = Path(tempfile.mkdtemp(prefix="harmonykit-mutants-"))
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                            capture_output=True, check=True, timeout=60).stdout.decode().split("\0")
    for name in filter(None, listed):
        source, target = ROOT / name, where / name
        if source.is_file():
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)
    return where


def _run(copy: Path, tests: tuple[str, ...]) -> tuple[bool, str]:
    """Whether the tests pass in the copy, and the end of what pytest printed."""
    env = {**os.environ, "PYTHONPATH": str(copy / "src"), "CI": "true",
           "HARMONYKIT_SHARED": str(ROOT.parent / "shared")}
    cmd = [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", "-m", "not real_engines",
           "--no-header", "-o", "addopts=", *[f"tests/{t}" for t in tests]]
    try:
        proc = subprocess.run(cmd, cwd=copy, env=env, capture_output=True, text=True, timeout=1800)
    except subprocess.TimeoutExpired:
        return False, "timed out"
    lines = (proc.stdout + proc.stderr).strip().splitlines()
    failed = [line for line in lines if line.startswith(("FAILED", "ERROR"))]
    return proc.returncode == 0, " / ".join([*failed[:3], lines[-1]]) if lines else ""


def _mutate(copy: Path, m: Mutant) -> str | None:
    """Apply ``m`` in the copy; the original text, or None when it is not found exactly once."""
    path = copy / "src" / "harmonykit" / m.path
    text = path.read_text(encoding="utf-8")
    if text.count(m.line) != 1:
        return None
    path.write_text(text.replace(m.line, m.becomes), encoding="utf-8")
    return text


def main(argv: list[str]) -> int:
    chosen = [m for m in MUTANTS if not argv or any(m.name.startswith(a) for a in argv)]
    copy = _copy()
    try:
        check = subprocess.run([sys.executable, "-c", "import harmonykit; print(harmonykit.__file__)"],
                               env={**os.environ, "PYTHONPATH": str(copy / "src")}, capture_output=True,
                               text=True, timeout=120)
        if not check.stdout.startswith(str(copy)):
            print(f"mutants: harmonykit is not imported from the copy ({check.stdout.strip()})", file=sys.stderr)
            return 2
        files = tuple(sorted({t for m in chosen for t in m.tests}))
        ok, last = _run(copy, files)
        if not ok:
            print(f"mutants: the tests fail without any mutant: {last}", file=sys.stderr)
            return 2
        rows = []
        for m in chosen:
            t0 = time.monotonic()
            original = _mutate(copy, m)
            if original is None:
                rows.append((m, "STALE", "its line is not found exactly once", 0.0))
                continue
            try:
                passed, last = _run(copy, m.tests)
            finally:
                (copy / "src" / "harmonykit" / m.path).write_text(original, encoding="utf-8")
            rows.append((m, "SURVIVED" if passed else "killed", last, time.monotonic() - t0))
            print(f"  {rows[-1][1]:<8} {m.name:<48} {rows[-1][3]:5.0f} s  {last[:70]}", flush=True)
    finally:
        shutil.rmtree(copy, ignore_errors=True)
    print("\n| mutant | where | result |\n|---|---|---|")
    for m, result, _, _ in rows:
        print(f"| {m.name} | `{m.path}` | {result} |")
    bad = [m.name for m, result, _, _ in rows if result != "killed"]
    print(f"\n{len(rows) - len(bad)} of {len(rows)} killed" + (f"; not killed: {', '.join(bad)}" if bad else ""))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
