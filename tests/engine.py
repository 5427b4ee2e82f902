"""A stand-in for SGLang (no CPU build of it installs here): a scripted engine that speaks
``/v1/completions`` as SGLang 0.5.23's source does (``serving_completions.py``,
``protocol.py``): ``owned_by: "sglang"`` and ``max_model_len`` in ``/v1/models``,
``max_tokens`` 16 when none is sent, ``token_ids`` with ``return_token_ids`` (the
matched stop token kept in them and named in ``matched_stop``), and ``stop`` strings as
its scheduler and detokenizer treat them (``schedule_batch.py``, ``detokenizer_manager.py``):
generation ends at the token whose text completes one, ``matched_stop`` names it, ``text``
is cut where it begins (streamed text is sent as decoded, the last chunk cut back), and
``token_ids`` keep every token, the completing one included. And servers to run it (and
the gateway) for real: uvicorn on 127.0.0.1, a free port, a thread.

The script is chosen by the last user message of the prompt it receives:
``case:ID`` replays a wild case; ``load:N`` answers ``answer N`` token by token;
``headerless:N`` answers N words with no header; ``say:TEXT`` answers TEXT on the final
channel (``say:`` with a stop string in it tests ``stop``); ``call:NAME:ARGS`` calls the
function NAME, then, when the prompt ends with its result, answers ``tool said RESULT``;
``agent:STEP ||| STEP ...`` plays the model of an agent loop: step N (N built-in tool results
after the last user message) writes STEP, with ``<<call>>``-style markers for special tokens
and ``<<result>>`` for the last tool result it read; ``fault:KIND`` misbehaves (``500``, ``nonjson``, ``midway``, ``slow``, ``silent``, ``hang``,
``reject``). Its streams split SSE frames mid-JSON.
"""

from __future__ import annotations

import asyncio
import json
import random
import re
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import uvicorn

import harmonykit as hk
from conftest import CASES

ENC = hk.load_harmony_encoding(hk.HarmonyEncodingName.HARMONY_GPT_OSS)
WILD = {c["id"]: c for c in (json.loads(line) for line in CASES.read_text(encoding="utf-8").splitlines()
                              if line.strip())}
STOPS = {200002, 200012}
_USER = re.compile(r"<\|start\|>user<\|message\|>(.*?)<\|end\|>", re.S)
# A tool's result as the last message before the assistant's turn.
# A tool's result message (python, browser.*, an MCP server's LABEL.TOOL, functions.*).
_BUILTIN_RESULT = re.compile(r"<\|start\|>(?!user|system|developer|assistant)[^<\s]+ to=assistant"
                             r"(?:<\|channel\|>\w+)?<\|message\|>((?:(?!<\|end\|>).)*)<\|end\|>", re.S)
_TOOL_RESULT = re.compile(r"<\|start\|>functions\.[^ <]+ to=assistant<\|channel\|>commentary<\|message\|>"
                          r"((?:(?!<\|end\|>).)*)<\|end\|><\|start\|>assistant$", re.S)


def prompt_of(req: dict[str, Any]) -> str:
    return ENC.decode(req["prompt"])


class Engine:
    """The ASGI app of the scripted engine; counts what it served and what was cancelled."""

    def __init__(self, *, token_ids: bool = True, seed: int = 0, chunk: int | None = None,
                 split_frames: bool = True) -> None:
        self.token_ids = token_ids
        self.context = 8192
        self.models_served = 0
        self.chunk = chunk  # tokens per streamed chunk (None: 1 to 3 at random)
        self.split_frames = split_frames
        self.rng = random.Random(seed)
        self.requests: list[dict[str, Any]] = []
        self.cancelled = 0
        self.active = 0
        self.delay = 0.0  # seconds between streamed chunks
        # When set: the last chunk of a stream waits until the test opens the gate (or 60 s pass),
        # so a test can tell text streamed before the end from text sent at it, by order, not time.
        self.gate: threading.Event | None = None
        self.sent_last = False  # a stream's last chunk has gone out
        # When set: a stream's chunk number ``pause_at`` waits until ``resume`` is set (or 60 s pass).
        self.pause_at: int | None = None
        self.resume = threading.Event()

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        if scope["path"] == "/v1/models":
            self.models_served += 1
            await _json(send, 200, {"object": "list", "data": [{"id": "gpt-oss-20b", "object": "model",
                                                               "owned_by": "sglang",
                                                               "max_model_len": self.context}]})
            return
        req = json.loads(await read_body(receive))
        self.requests.append(req)
        prompt = ENC.decode(req["prompt"])
        users = _USER.findall(prompt)
        script = users[-1] if users else ""
        self.active += 1
        try:
            await self._serve(script, req, receive, send)
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        finally:
            self.active -= 1

    async def _serve(self, script: str, req: dict[str, Any], receive: Any, send: Any) -> None:
        kind, _, arg = script.partition(":")
        if kind == "fault":
            if arg == "500":
                await _json(send, 500, {"error": {"message": "CUDA out of memory"}})
                return
            if arg == "nonjson":
                await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/html")]})
                await send({"type": "http.response.body", "body": b"<html>gateway error</html>"})
                return
            if arg == "reject":
                await _json(send, 400, {"error": {"message": "This model's maximum context length is 8 tokens"}})
                return
            if arg == "slow":  # like vLLM's and SGLang's routes, a client that leaves aborts the request
                gone = asyncio.ensure_future(_gone(receive))
                done, _ = await asyncio.wait({gone}, timeout=8)
                if done:
                    raise asyncio.CancelledError
                gone.cancel()
            text, finish = "<|channel|>final<|message|>partial answer that never", "stop"
        elif kind == "case":
            case = WILD[arg]
            text, finish = case["text"], case["engine_finish_reason"]
        elif kind == "long":
            text, finish = "<|channel|>analysis<|message|>Think.<|end|><|start|>assistant<|channel|>final" \
                           "<|message|>" + " word" * int(arg) + "<|return|>", "stop"
        elif kind == "headerless":  # an answer with no header at all: words straight after <|start|>assistant
            text, finish = "".join(f" word{i}." for i in range(int(arg))) + "<|return|>", "stop"
        elif kind == "say":
            text, finish = f"<|channel|>analysis<|message|>Think.<|end|><|start|>assistant" \
                           f"<|channel|>final<|message|>{arg}<|return|>", "stop"
        elif kind == "call":  # call:NAME:ARGS calls the tool; once its result is in the prompt, answers
            name, _, args = arg.partition(":")
            result = _TOOL_RESULT.findall(prompt_of(req))
            if result:
                text = f"<|channel|>analysis<|message|>The tool answered.<|end|><|start|>assistant" \
                       f"<|channel|>final<|message|>tool said {result[-1]}<|return|>"
            else:
                text = f"<|channel|>analysis<|message|>Call {name}.<|end|><|start|>assistant" \
                       f"<|channel|>commentary to=functions.{name} <|constrain|>json<|message|>{args or '{}'}<|call|>"
            finish = "stop"
        elif kind == "agent":
            after = prompt_of(req).rsplit("<|start|>user<|message|>", 1)[-1]
            results = _BUILTIN_RESULT.findall(after)
            steps = arg.split(" ||| ")
            text = re.sub(r"<<(call|end|start|channel|message|return|constrain)>>", r"<|\1|>",
                          steps[min(len(results), len(steps) - 1)])
            text = text.replace("<<result>>", results[-1] if results else "")
            finish = "stop"
        elif kind == "load":
            text, finish = f"<|channel|>analysis<|message|>Think {arg}.<|end|><|start|>assistant" \
                           f"<|channel|>final<|message|>answer {arg}<|return|>", "stop"
        else:
            text, finish = "<|channel|>final<|message|>Hello!<|return|>", "stop"
        ids = ENC.encode(text, allowed_special="all")
        stop_reason = None
        if finish == "stop" and ids and ids[-1] in STOPS:  # kept in the ids, named in matched_stop
            stop_reason = ids[-1]
        limit = req.get("max_tokens", 16)  # SGLang's default
        if len(ids) > limit:
            ids, finish, stop_reason = ids[:limit], "length", None
        ids, matched = _stop_at_strings(ids, req.get("stop"))
        if matched is not None:
            finish, stop_reason = "stop", matched
        full_text = _trim(ENC.decode(ids), matched)
        if not req.get("stream"):
            choice: dict[str, Any] = {"index": 0, "text": full_text, "finish_reason": finish,
                                      "matched_stop": stop_reason, "logprobs": None}
            if self.token_ids and req.get("return_token_ids"):
                choice["token_ids"] = ids
            await _json(send, 200, {"id": "cmpl-1", "object": "text_completion", "created": int(time.time()),
                                    "model": req["model"], "choices": [choice],
                                    "usage": {"prompt_tokens": len(req["prompt"]), "completion_tokens": len(ids),
                                              "total_tokens": len(req["prompt"]) + len(ids)}})
            return
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"text/event-stream")]})
        if kind == "fault" and arg == "bigline":  # a line that never ends
            for _ in range(20):
                await send({"type": "http.response.body", "body": b"x" * 1_000_000, "more_body": True})
            while (await receive())["type"] != "http.disconnect":
                pass
            return
        chunks = self._chunks(ids)
        if matched is not None:  # the detokenizer's last chunk: the text so far cut at the stop string
            sent = "".join(text for text, _ in chunks[:-1])
            chunks[-1] = (full_text[len(sent):], chunks[-1][1])
        for i, piece in enumerate(chunks):
            if kind == "fault" and arg == "midway" and i == len(chunks) // 2:
                raise ConnectionResetError  # uvicorn drops the connection
            if kind == "fault" and arg in ("silent", "hang") and i == 1:
                if arg == "silent":
                    await asyncio.sleep(8)
                else:
                    while (await receive())["type"] != "http.disconnect":
                        pass
                    raise asyncio.CancelledError
            last = i == len(chunks) - 1
            if i == self.pause_at:  # paused: a client that leaves meanwhile aborts the request
                resumed = asyncio.ensure_future(asyncio.to_thread(self.resume.wait, 60))
                gone = asyncio.ensure_future(_gone(receive))
                done, _ = await asyncio.wait({resumed, gone}, return_when=asyncio.FIRST_COMPLETED)
                gone.cancel()
                if gone in done:
                    raise asyncio.CancelledError
            if last and self.gate is not None:
                await asyncio.to_thread(self.gate.wait, 60)
            choice = {"index": 0, "text": piece[0], "logprobs": None,
                      "finish_reason": finish if last else None, "matched_stop": stop_reason if last else None}
            if self.token_ids and req.get("return_token_ids"):
                choice["token_ids"] = piece[1]
            frame = b"data: " + json.dumps({"id": "cmpl-1", "object": "text_completion", "model": req["model"],
                                            "choices": [choice]}).encode() + b"\n\n"
            cut = self.rng.randrange(1, len(frame)) if self.split_frames else len(frame)
            for part in (frame[:cut], frame[cut:]):  # SSE frames split anywhere
                if part:
                    await send({"type": "http.response.body", "body": part, "more_body": True})
            self.sent_last = self.sent_last or last
            if self.delay:
                await asyncio.sleep(self.delay)
            else:
                await asyncio.sleep(0)
        await send({"type": "http.response.body", "body": b"data: [DONE]\n\n", "more_body": False})

    def _chunks(self, ids: list[int]) -> list[tuple[str, list[int]]]:
        """The output in pieces: by token groups with ids; text-only, cut at any character."""
        if not ids:
            return [("", [])]
        if self.token_ids:
            out, i = [], 0
            while i < len(ids):
                n = self.chunk or self.rng.randint(1, 3)
                out.append((ENC.decode(ids[i : i + n]), ids[i : i + n]))
                i += n
            return out
        text = ENC.decode(ids)
        cuts = sorted({self.rng.randrange(1, len(text) + 1) for _ in range(max(1, len(text) // 4))} | {len(text)})
        pieces, prev = [], 0
        for c in cuts:
            pieces.append((text[prev:c], []))
            prev = c
        return pieces


def _stop_at_strings(ids: list[int], stop: Any) -> tuple[list[int], str | None]:
    """Where SGLang's scheduler ends a generation at a stop string: at the first token whose
    decoded output holds one (``Req.check_finished``). The ids keep that token."""
    stops = [stop] if isinstance(stop, str) else [s for s in stop or [] if s]
    if not stops:
        return ids, None
    for n in range(1, len(ids) + 1):
        text = ENC.decode(ids[:n])
        hits = [s for s in stops if s in text]
        if hits:
            return ids[:n], min(hits, key=text.find)
    return ids, None


def _trim(text: str, matched: str | None) -> str:
    """The detokenizer's ``trim_matched_stop`` for a string: the text before it."""
    if matched is None:
        return text
    pos = text.find(matched)
    return text[:pos] if pos != -1 else text


async def read_body(receive: Any) -> bytes:
    """An ASGI request's whole body."""
    body = b""
    while True:
        m = await receive()
        body += m.get("body", b"")
        if not m.get("more_body"):
            return body


async def _gone(receive: Any) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


async def _json(send: Any, status: int, body: Any) -> None:
    data = json.dumps(body).encode()
    await send({"type": "http.response.start", "status": status, "headers": [(b"content-type", b"application/json")]})
    await send({"type": "http.response.body", "body": data})


def free_socket(host: str = "127.0.0.1") -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, 0))
    return sock


@contextmanager
def serving(app: Any, *, bind: str = "127.0.0.1", **config: Any) -> Iterator[str]:
    """Serve ``app`` with uvicorn on ``bind`` (a loopback address; a free port) in a thread;
    yields its base URL. Stopped on exit, also when the test fails."""
    sock = free_socket(bind)
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="critical", lifespan="auto", timeout_graceful_shutdown=1,
                                           **config))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 15
        while not server.started:
            if time.monotonic() > deadline or not thread.is_alive():
                raise RuntimeError("the test server did not start")
            time.sleep(0.01)
        yield f"http://{bind}:{port}"
    finally:
        server.should_exit = True
        thread.join(15)
        sock.close()


@contextmanager
def scripted(seed: int) -> Iterator[tuple[Engine, str]]:
    """The scripted engine, served (what a module's ``engine`` fixture yields)."""
    eng = Engine(seed=seed)
    with serving(eng) as url:
        yield eng, url


def dead_url() -> str:
    """A loopback URL where nothing listens."""
    sock = free_socket()
    port = sock.getsockname()[1]
    sock.close()
    return f"http://127.0.0.1:{port}"
