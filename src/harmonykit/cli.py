"""The ``harmonykit`` command: parse, render and inspect Harmony completions.

    harmonykit parse completion.txt            # JSON: messages, spans, skipped, repairs, stop, complete
    harmonykit parse --strict completion.txt   # exits 1 with the reference's error and token index
    harmonykit render conversation.json        # the prompt text, or --tokens for ids
    harmonykit render request.json             # a Chat Completions or Responses body, as a server would
    harmonykit inspect completion.txt          # a coloured, human-readable view with repairs marked
    harmonykit serve --upstream URL            # an OpenAI-compatible gateway in front of an engine
    harmonykit data render IN -o OUT           # chat records -> input_ids, labels, assistant_mask
    harmonykit data parse IN -o OUT            # rollouts -> messages, repairs, stop, complete
    harmonykit index docs/*.html -o docs.db     # a local search index for --browser index=docs.db

Input shapes are documented with examples in docs/cli.md.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from typing import Any, TextIO

from . import (
    Conversation,
    HarmonyEncoding,
    HarmonyEncodingName,
    HarmonyError,
    ParseResult,
    RenderConversationConfig,
    Role,
    __version__,
    load_harmony_encoding,
)
from .model import message_text


class CLIError(Exception):
    """A problem with the command's input: printed as one line, exit status 2."""


def _read(path: str) -> str:
    if path == "-":
        return sys.stdin.read()
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except OSError as e:
        raise CLIError(f"cannot read {path}: {e.strerror}") from None
    except UnicodeDecodeError as e:
        raise CLIError(f"{path} is not UTF-8 text ({e.reason} at byte {e.start})") from None


def _tokens(enc: HarmonyEncoding, raw: str, as_ids: bool, path: str) -> list[int]:
    if not as_ids:
        # The newline that editors and `echo` end a file with is not part of the completion.
        if raw.endswith("\n"):
            raw = raw[:-2] if raw.endswith("\r\n") else raw[:-1]
        return enc.encode(raw, allowed_special="all")
    try:
        ids = json.loads(raw)
    except json.JSONDecodeError as e:
        raise CLIError(f"{path}: not a JSON list of token ids ({e.msg} at line {e.lineno})") from None
    if not isinstance(ids, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in ids):
        raise CLIError(f"{path}: expected a JSON list of integers, e.g. [200005, 17196]")
    return ids


def _role(value: str) -> Role | None:
    if value == "none":
        return None
    try:
        return Role(value)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"unknown role {value!r}: use one of {', '.join(r.value for r in Role)} or none"
        ) from None


def _parse(enc: HarmonyEncoding, args: argparse.Namespace) -> ParseResult:
    tokens = _tokens(enc, _read(args.file), args.tokens, args.file)
    return enc.parse_completion(tokens, args.role, strict=args.strict, tools=args.tool or None)


def cmd_parse(args: argparse.Namespace, out: TextIO) -> int:
    enc = _encoding()
    result = _parse(enc, args)
    json.dump(result.to_dict(), out, indent=2 if args.pretty else None, ensure_ascii=False)
    out.write("\n")
    return 0


_CHAT_KEYS = frozenset({"model", "tools", "tool_choice", "response_format", "reasoning_effort", "stream",
                        "temperature", "top_p", "max_tokens", "max_completion_tokens", "stop", "seed", "n"})


def request_kind(body: Any) -> str:
    """What a JSON body to render is: ``chat``, ``responses`` or ``conversation``.

    >>> request_kind({"input": "Hi"}), request_kind({"messages": [{"role": "system", "content": "Hi"}]})
    ('responses', 'chat')
    >>> request_kind({"messages": [{"role": "user", "content": [{"type": "text", "text": "Hi"}]}]})
    'conversation'
    """
    from .openai.request import api_of

    if not isinstance(body, dict):
        return "conversation"
    if api_of(body) == "responses":
        return "responses"
    if _CHAT_KEYS & body.keys():
        return "chat"
    for m in body.get("messages") or []:
        if not isinstance(m, dict):
            continue
        if {"tool_calls", "tool_call_id", "reasoning_content"} & m.keys():
            return "chat"
        if m.get("role") in ("system", "developer") and not _harmony_content(m.get("content")):
            return "chat"
    return "conversation"


def _harmony_content(content: Any) -> bool:
    return isinstance(content, list) and any(
        isinstance(c, dict) and c.get("type") in ("system_content", "developer_content") for c in content)


def cmd_render(args: argparse.Namespace, out: TextIO) -> int:
    enc = _encoding()
    raw = _read(args.file)
    try:
        body = json.loads(raw)
    except json.JSONDecodeError as e:
        raise CLIError(f"{args.file}: not JSON ({e.msg} at line {e.lineno})") from None
    kind = args.kind or request_kind(body)
    if kind != "conversation":
        tokens = _render_request(enc, body, kind, args.file)
        out.write(json.dumps(tokens) if args.tokens else enc.decode_utf8(tokens))
        out.write("\n")
        return 0
    try:
        convo = Conversation.from_json(raw)
    except (KeyError, TypeError, ValueError) as e:
        raise CLIError(f"{args.file}: not a conversation ({_first_line(e)}); expected "
                       '{"messages": [{"role": "user", "content": "..."}]}') from None
    config = RenderConversationConfig(auto_drop_analysis=not args.keep_analysis)
    if args.mode == "completion":
        tokens = enc.render_conversation_for_completion(convo, args.next_role, config)
    elif args.mode == "training":
        tokens = enc.render_conversation_for_training(convo, config)
    else:
        tokens = enc.render_conversation(convo, config)
    out.write(json.dumps(tokens) if args.tokens else enc.decode_utf8(tokens))
    out.write("\n")
    return 0


_STYLES = {"role": "1;36", "meta": "2", "repair": "1;33", "skip": "1;31", "body": "0", "title": "1"}


def cmd_inspect(args: argparse.Namespace, out: TextIO) -> int:
    enc = _encoding()
    tokens = _tokens(enc, _read(args.file), args.tokens, args.file)
    result = enc.parse_completion(tokens, args.role, tools=args.tool or None)
    tty = out.isatty() and not os.environ.get("NO_COLOR")
    color = args.color == "always" or (args.color == "auto" and tty)

    def paint(style: str, text: str) -> str:
        return f"\x1b[{_STYLES[style]}m{text}\x1b[0m" if color else text

    blocks: list[tuple[int, str]] = []
    for i, (msg, (start, end)) in enumerate(zip(result.messages, result.spans, strict=True)):
        head = [paint("role", msg.author.name or msg.author.role.value)]
        if msg.channel is not None:
            head.append(f"channel={msg.channel}")
        if msg.recipient is not None:
            head.append(f"to={msg.recipient}")
        if msg.content_type is not None:
            head.append(f"type={msg.content_type}")
        lines = [f"{paint('title', f'#{i}')} {' '.join(head)} {paint('meta', f'[tokens {start}-{end})')}"]
        body = message_text(msg)
        lines += ["    " + paint("body", line) for line in (body.splitlines() or [""])]
        for r in result.repairs:
            if start <= r.start < end and (r.start, r.end) not in result.skipped:
                lines.append("    " + paint("repair", f"! {r.kind} [{r.start}-{r.end}): {r.detail}"))
        blocks.append((start, "\n".join(lines)))
    for start, end in result.skipped:
        kinds = [r for r in result.repairs if (r.start, r.end) == (start, end)]
        text = enc.decode(tokens[start:end]) if all(0 <= t < 201089 for t in tokens[start:end]) else "?"
        label = kinds[0].kind if kinds else "skipped"
        blocks.append((start, paint("skip", f"✗ {label} [tokens {start}-{end})") + f" {text!r}"))
    for _, block in sorted(blocks, key=lambda b: b[0]):
        out.write(block + "\n")
    state = "complete" if result.complete else "cut off (no stop token)"
    summary = f"{len(result.messages)} messages, {len(result.repairs)} repairs, stop={result.stop}, {state}"
    out.write(paint("meta", summary) + "\n")
    return 0


def _render_request(enc: HarmonyEncoding, body: Any, kind: str, path: str) -> list[int]:
    from .openai import RequestError, render_chat_request, render_responses_request

    render = render_chat_request if kind == "chat" else render_responses_request
    try:
        return render(enc, body).tokens
    except RequestError as e:
        where = f" at {e.param}" if e.param else ""
        raise CLIError(f"{path}: not a valid {kind} request{where}: {e.message}") from None


def cmd_data(args: argparse.Namespace, out: TextIO) -> int:
    try:
        from .data import pipeline
    except ImportError as e:  # pragma: no cover - the data extra is missing
        raise CLIError("harmonykit data needs the data extra: pip install 'harmonykit[data]' "
                       f"({e.name} is missing)") from None
    if args.input != "-" and not os.path.exists(args.input):
        raise CLIError(f"cannot read {args.input}: no such file")
    try:
        return _data(args, pipeline)
    except pipeline.WorkerDied as e:
        raise CLIError(str(e)) from None
    except BrokenPipeError:
        raise
    except OSError as e:  # a folder given as a file, no permission, a full disk, ...
        raise CLIError(f"{e.filename or args.output}: {e.strerror or e}") from None


def _data(args: argparse.Namespace, pipeline: Any) -> int:
    import time

    in_fmt = pipeline.file_format(args.input, args.format)
    out_fmt = pipeline.file_format(args.output, args.format)
    if args.job == "render":
        job = pipeline.Job("render", out_fmt, train_on=args.train_on, cot=args.cot,
                           max_tokens=args.max_tokens, strict=args.strict)
    else:
        tools = tuple(args.tool) if args.tool else None
        job = pipeline.Job("parse", out_fmt, tools=tools, strict=args.strict)
    summary = pipeline.Summary()
    writer = pipeline.Writer(args.output, job)
    rejects_path = args.output + ".rejects.jsonl"
    rejects: TextIO | None = None
    tty = sys.stderr.isatty()
    started = last = time.monotonic()
    status = 0
    try:
        for done in pipeline.run(job, pipeline.read_chunks(args.input, in_fmt), args.workers):
            summary.add(done)
            writer.write(done)
            if done.rejects:
                if rejects is None:
                    rejects = open(rejects_path, "w", encoding="utf-8")
                rejects.writelines(json.dumps(r.to_dict(), ensure_ascii=False, default=str) + "\n"
                                   for r in done.rejects)
            if done.stopped:
                first = done.rejects[0]
                print(f"harmonykit: error: line {first.line}: {first.error}", file=sys.stderr)
                status = 1
                break
            now = time.monotonic()
            if tty and now - last > 0.2:
                last = now
                _progress(summary, now - started)
    finally:
        writer.close()
        if rejects is not None:
            rejects.close()
    if tty:  # the last state stays on the terminal, however short the run
        _progress(summary, time.monotonic() - started)
        print(file=sys.stderr)
    seconds = max(time.monotonic() - started, 1e-9)
    report = summary.to_dict() | {"seconds": round(seconds, 3),
                                  "records_per_second": round(summary.records / seconds)}
    if rejects is not None:
        report["rejects"] = rejects_path
    print(json.dumps(report), file=sys.stderr)
    return status


def _progress(summary: Any, seconds: float) -> None:
    seconds = max(seconds, 1e-9)
    print(f"\r{summary.records:,} records  {summary.records / seconds:,.0f} records/s  "
          f"{summary.tokens / seconds:,.0f} tokens/s", end="", file=sys.stderr, flush=True)


def duration(raw: str) -> float:
    """--store-ttl's type: seconds from 90, 15m, 12h or 30d (the server's own reading)."""
    from .server.settings import duration as read

    return read(raw)


def cmd_serve(args: argparse.Namespace, out: TextIO) -> int:
    try:
        import uvicorn

        from .server import Settings, create_app
        from .server.http import uvicorn_options
    except ImportError as e:
        raise CLIError(f"harmonykit serve needs the server extra: pip install 'harmonykit[server]' "
                       f"({e.name} is missing)") from None
    try:
        settings = Settings.from_sources(vars(args))
        app = create_app(settings)  # opens nothing yet: a store's driver missing is said here
    except ValueError as e:
        raise CLIError(str(e)) from None
    import logging

    logging.basicConfig(level=logging.INFO, format="%(message)s")
    logging.getLogger("harmonykit.server").setLevel(logging.INFO)
    uvicorn.run(app, host=settings.host, port=settings.port, log_level="warning",
                loop="auto", lifespan="on", timeout_graceful_shutdown=5,
                **uvicorn_options(settings.header_timeout))
    return 0


def cmd_index(args: argparse.Namespace, out: TextIO) -> int:
    from .tools.index import IndexFileError, build

    try:
        count = build(args.files, args.output, base_url=args.base_url)
    except ImportError as e:
        raise CLIError(f"harmonykit index needs the tools extra: pip install 'harmonykit[tools]' "
                       f"({e.name} is missing)") from None
    except (IndexFileError, OSError) as e:
        raise CLIError(str(e)) from None
    print(f"indexed {count} files into {args.output}", file=out)
    return 0


def _first_line(e: BaseException) -> str:
    return str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__


def _encoding() -> HarmonyEncoding:
    return load_harmony_encoding(HarmonyEncodingName.HARMONY_GPT_OSS)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="harmonykit",
        description="Render and parse OpenAI's Harmony format (gpt-oss).",
    )
    parser.add_argument("--version", action="version", version=f"harmonykit {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def completion_args(p: argparse.ArgumentParser) -> None:
        p.add_argument("file", nargs="?", default="-",
                       help="completion text with <|...|> special tokens (default: stdin); one "
                            "final newline, as editors and echo add, is not part of it")
        p.add_argument("--tokens", action="store_true", help="the input is a JSON list of token ids")
        p.add_argument("--role", type=_role, default=Role.ASSISTANT,
                       help="role already rendered before the completion (default: assistant; "
                            "'none' when the output starts with <|start|>)")
        p.add_argument("--tool", action="append", metavar="NAME",
                       help="a declared function name (repeatable); helps read malformed recipients")

    p = sub.add_parser("parse", help="parse a completion into JSON",
                       description="Parse a completion; print messages, spans, skipped ranges, "
                                   "repairs, stop and complete as JSON.")
    completion_args(p)
    p.add_argument("--strict", action="store_true",
                   help="fail like the reference on malformed output (exit status 1)")
    p.add_argument("--pretty", action="store_true", help="indent the JSON")
    p.set_defaults(func=cmd_parse)

    p = sub.add_parser("render", help="render a conversation or an API request to Harmony",
                       description="Render a conversation (the Conversation.to_json shape), or a Chat "
                                   "Completions or Responses request body as the gateway renders it "
                                   "(tools, response format, reasoning effort). The shape is told by its "
                                   "keys; --chat or --responses says it outright.")
    p.add_argument("file", nargs="?", default="-", help="JSON (default: stdin)")
    kind = p.add_mutually_exclusive_group()
    kind.add_argument("--chat", dest="kind", action="store_const", const="chat",
                      help="the input is a Chat Completions request body")
    kind.add_argument("--responses", dest="kind", action="store_const", const="responses",
                      help="the input is a Responses request body")
    kind.add_argument("--conversation", dest="kind", action="store_const", const="conversation",
                      help="the input is a Conversation (to_json shape)")
    p.add_argument("--tokens", action="store_true", help="print token ids instead of text")
    p.add_argument("--mode", choices=["completion", "conversation", "training"], default="completion",
                   help="completion (default): open the next turn; conversation: as is; "
                        "training: a final answer ends in <|return|>")
    p.add_argument("--next-role", type=_role, default=Role.ASSISTANT,
                   help="role of the turn to open in completion mode (default: assistant)")
    p.add_argument("--keep-analysis", action="store_true",
                   help="keep earlier analysis messages (no chain-of-thought dropping)")
    p.set_defaults(func=cmd_render)

    p = sub.add_parser("inspect", help="show a completion for people, repairs highlighted",
                       description="Show each message with its header and body, and every repair.")
    completion_args(p)
    p.add_argument("--color", choices=["auto", "always", "never"], default="auto",
                   help="colour the output (default: when writing to a terminal)")
    p.set_defaults(func=cmd_inspect)

    p = sub.add_parser(
        "serve", help="an OpenAI-compatible gateway in front of vLLM, SGLang or llama.cpp server",
        description="Serve /v1/chat/completions and /v1/responses (streaming and not), /v1/models, /health "
                    "and /metrics. Requests are rendered here and sent to the engines' /v1/completions as "
                    "token ids; their output is parsed by the tolerant parser, so malformed model output is "
                    "never an error. Every option can also be set by the environment variable named in "
                    "brackets; a flag wins over the variable.")
    env = "HARMONYKIT_"
    p.add_argument("--upstream", action="append", metavar="URL",
                   help=f"an engine's base URL, e.g. http://127.0.0.1:8001 (repeatable: load-balanced, "
                        f"with health checks and failover) [{env}UPSTREAM, comma-separated]")
    p.add_argument("--upstream-model", metavar="NAME",
                   help=f"the model name to send upstream (default: the request's model when the engine "
                        f"serves it, else the engine's first) [{env}UPSTREAM_MODEL]")
    p.add_argument("--host", help=f"address to listen on (default 127.0.0.1) [{env}HOST]")
    p.add_argument("--port", type=int, help=f"port to listen on (default 8000) [{env}PORT]")
    p.add_argument("--api-key", metavar="KEY", action="append",
                   help=f"require 'Authorization: Bearer KEY' (default: none); repeatable: each key sees "
                        f"only the responses and conversations it stored [{env}API_KEY]")
    p.add_argument("--api-keys-file", metavar="PATH",
                   help=f"accept the keys in this file too, one a line (# comments) [{env}API_KEYS_FILE]")
    p.add_argument("--store", metavar="URL",
                   help=f"where stored responses and conversations are kept: sqlite:///PATH (default: a file "
                        f"under the user's data directory), postgresql://USER@HOST:PORT/DB, or none "
                        f"[{env}STORE]")
    p.add_argument("--store-ttl", type=duration, metavar="DURATION",
                   help=f"how long a stored object is kept after its last change, e.g. 12h, 30d (default "
                        f"30d) [{env}STORE_TTL]")
    p.add_argument("--upstream-timeout", type=float, metavar="SECONDS",
                   help=f"give up on an engine silent this long: 504 (default 600) [{env}UPSTREAM_TIMEOUT]")
    p.add_argument("--max-concurrency", type=int, metavar="N",
                   help=f"requests served at once; more get 429 (default 512) [{env}MAX_CONCURRENCY]")
    p.add_argument("--header-timeout", type=float, metavar="SECONDS",
                   help=f"a request's headers must arrive within this, else the connection is closed "
                        f"(default 10) [{env}HEADER_TIMEOUT]")
    p.add_argument("--body-timeout", type=float, metavar="SECONDS",
                   help=f"each piece of a request body must arrive within this, else 408 (default 30) "
                        f"[{env}BODY_TIMEOUT]")
    p.add_argument("--max-body-bytes", type=int, metavar="N",
                   help=f"larger request bodies get 413 (default 16 MiB) [{env}MAX_BODY_BYTES]")
    p.add_argument("--guided", choices=["vllm", "sglang", "llamacpp"],
                   help="ask the engine to hold generation to the request's Harmony grammar, so malformed "
                        "output cannot happen (vLLM 0.11+ or SGLang; llama.cpp is refused, see "
                        f"docs/grammar.md) [{env}GUIDED]")
    p.add_argument("--engine", choices=["vllm", "sglang", "llamacpp"],
                   help=f"the engine behind --upstream (default: recognised from its /v1/models) "
                        f"[{env}ENGINE]")
    p.add_argument("--max-tokens-default", type=int, metavar="N",
                   help="the output limit sent when the client gives none and the engine does not say its "
                        f"context length (default 4096) [{env}MAX_TOKENS_DEFAULT]")
    p.add_argument("--render-cache-mb", type=int, metavar="MB",
                   help="megabytes of rendered conversation messages kept, so that an agent loop re-sending "
                        f"its history pays for its new messages only; 0 turns it off (default 64) "
                        f"[{env}RENDER_CACHE_MB]")
    p.add_argument("--log-content", action="store_true",
                   help=f"log request bodies too (default: metadata only) [{env}LOG_CONTENT=1]")
    tools = p.add_argument_group("built-in tools", "gpt-oss's python and browser, run by the gateway "
                                 "(Responses' code_interpreter and web_search tools); off unless enabled")
    tools.add_argument("--python", action="store_true",
                       help="run the python tool, each container a stateful interpreter in a bubblewrap "
                            f"sandbox (refused at startup when the sandbox cannot start) [{env}PYTHON=1]")
    tools.add_argument("--python-timeout", type=float, metavar="SECONDS",
                       help=f"seconds a cell may run (default 120) [{env}PYTHON_TIMEOUT]")
    tools.add_argument("--python-memory-mb", type=int, metavar="MB",
                       help=f"memory of a container's interpreter (default 1024) [{env}PYTHON_MEMORY_MB]")
    tools.add_argument("--python-procs", type=int, metavar="N",
                       help=f"processes and threads a container may have (default 64) [{env}PYTHON_PROCS]")
    tools.add_argument("--python-sandbox", choices=["bwrap", "none"],
                       help="bwrap (default), or none: no isolation at all, the code runs as the gateway's "
                            f"user with its files and network [{env}PYTHON_SANDBOX]")
    tools.add_argument("--browser", metavar="BACKEND",
                       help="run the browser tool over a search backend: searxng=URL, exa (EXA_API_KEY), "
                            f"youcom (YDC_API_KEY) or index=PATH (harmonykit index) [{env}BROWSER]")
    tools.add_argument("--fetch-allow", action="append", metavar="CIDR",
                       help="an address range the browser may open although it is loopback, private, "
                            "link-local or metadata (refused by default); repeatable "
                            f"[{env}FETCH_ALLOW, comma-separated]")
    tools.add_argument("--mcp", action="store_true",
                       help="serve Responses' mcp tools: reach the MCP servers requests name (under the "
                            f"--fetch-allow address rules) and run their tools, with approvals [{env}MCP=1]")
    tools.add_argument("--mcp-server", action="append", metavar="URL",
                       help="the only MCP server URLs (prefixes) requests may name; repeatable "
                            f"[{env}MCP_SERVER, comma-separated]")
    p.add_argument("--state-key", metavar="BASE64",
                   help="the key reasoning.encrypted_content is sealed with (32 bytes, base64; give every "
                        "replica the same); default: one made once and kept in the data directory "
                        f"[{env}STATE_KEY]")
    tools.add_argument("--mcp-timeout", type=float, metavar="SECONDS",
                       help=f"seconds an MCP tool call may take (default 60) [{env}MCP_TIMEOUT]")
    p.set_defaults(func=cmd_serve)

    p = sub.add_parser("index", help="build a local search index for the browser tool (--browser index=PATH)",
                       description="Index HTML (or any text) files into a SQLite FTS5 file the browser "
                                   "tool searches and opens pages from, with no network.")
    p.add_argument("files", nargs="+", metavar="FILE", help="HTML or text files")
    p.add_argument("-o", "--output", required=True, metavar="PATH", help="the index file (replaced)")
    p.add_argument("--base-url", metavar="URL",
                   help="each page's URL is this plus its path under the files' common folder "
                        "(default: its file:// URI)")
    p.set_defaults(func=cmd_index)

    data = sub.add_parser("data", help="datasets: render chat records for fine-tuning, parse rollouts",
                          description="Run render_example or parse_example over a file, streamed.")
    jobs = data.add_subparsers(dest="job", required=True, metavar="JOB")
    for job, text in (("render", "chat records (Chat Completions or Responses shape, with their answer) to "
                                 "input_ids, labels and assistant_mask"),
                      ("parse", "rollouts ({'completion': ids or text, 'tools': [...]}) to messages, "
                                "repairs, stop and complete")):
        about = (". Bad records never stop the run and never vanish: each goes to OUT.rejects.jsonl with "
                 "its line or row number and the field at fault. A summary (JSON) ends the run on "
                 "standard error; a progress line shows on a terminal.")
        p = jobs.add_parser(job, help=text, description=text.capitalize() + about)
        p.add_argument("input", metavar="IN", help="JSONL or Parquet (by extension, or --format); - stdin")
        p.add_argument("-o", "--output", required=True, metavar="OUT", help="JSONL or Parquet (by extension)")
        p.add_argument("--format", choices=["jsonl", "parquet"], help="the format of IN and OUT, whatever "
                                                                     "their extensions")
        p.add_argument("--workers", type=_at_least_one, default=os.cpu_count() or 1, metavar="N",
                       help="worker processes (default: the cores)")
        p.add_argument("--strict", action="store_true", help="stop at the first bad record, exit status 1")
        if job == "render":
            p.add_argument("--train-on", choices=["last_turn", "all_assistant"], default="last_turn",
                           help="which assistant messages carry loss (default: after the last user message)")
            p.add_argument("--cot", choices=["inference", "reference"], default="inference",
                           help="inference: as the model sees and writes it (default); reference: the "
                                "reference's render_conversation_for_training exactly")
            p.add_argument("--max-tokens", type=_at_least_one, metavar="N",
                           help="drop (and count) longer examples")
        else:
            p.add_argument("--tool", action="append", metavar="NAME", help="a declared function name")
        p.set_defaults(func=cmd_data)
    return parser


def _at_least_one(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def main(argv: Sequence[str] | None = None, out: TextIO | None = None) -> int:
    """Run the command line; returns the exit status."""
    out = out or sys.stdout
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        status: int = args.func(args, out)
        return status
    except HarmonyError as e:
        where = f" (at token {e.token_index})" if e.token_index is not None else ""
        print(f"harmonykit: error: {_first_line(e)}{where}", file=sys.stderr)
        return 1
    except CLIError as e:
        print(f"harmonykit: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return 0


def _entry() -> Any:  # pragma: no cover - console script
    sys.exit(main())


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
