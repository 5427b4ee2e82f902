"""The engine client against an engine that closes a pooled keep-alive connection as it is reused
(uvicorn, under vLLM and SGLang, closes idle ones after 5 s; under load the close can meet the next
request). A raw HTTP server on 127.0.0.1 answers the first request on each connection and drops
the connection, unanswered, at the second: the request must be sent again on a fresh connection,
not lost as a 502 (found by the loaded runs of tests/test_server.py: "Can not write request body")."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import harmonykit as hk
from harmonykit.openai import render_chat_request
from harmonykit.server.engines import Job
from harmonykit.server.upstream import Upstream

ENC = hk.load_harmony_encoding(hk.HarmonyEncodingName.HARMONY_GPT_OSS)
ANSWER = ENC.encode("<|channel|>final<|message|>Hi<|return|>", allowed_special="all")


def _reply(path: str) -> dict[str, Any]:
    if path == "/v1/models":
        return {"object": "list", "data": [{"id": "m", "object": "model", "owned_by": "sglang",
                                            "max_model_len": 8192}]}
    return {"id": "c", "object": "text_completion", "model": "m",
            "choices": [{"index": 0, "text": ENC.decode(ANSWER), "token_ids": ANSWER, "finish_reason": "stop",
                         "matched_stop": ANSWER[-1], "logprobs": None}],
            "usage": {"prompt_tokens": 1, "completion_tokens": len(ANSWER), "total_tokens": len(ANSWER) + 1}}


async def _serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, seen: list[tuple[int, str]]) -> None:
    n = 0
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            lines = head.decode("latin-1").split("\r\n")
            path = lines[0].split(" ")[1]
            length = next((int(v) for k, _, v in (h.partition(": ") for h in lines[1:])
                           if k.lower() == "content-length"), 0)
            await reader.readexactly(length)
            n += 1
            seen.append((n, path))
            if n == 2:  # the keep-alive connection is reused: dropped, unanswered
                return
            body = json.dumps(_reply(path)).encode()
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: keep-alive\r\n"
                         b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError):
        return
    finally:
        writer.close()


def test_a_request_on_a_dropped_keep_alive_connection_is_sent_again() -> None:
    seen: list[tuple[int, str]] = []

    async def main() -> list[int]:
        server = await asyncio.start_server(lambda r, w: _serve(r, w, seen), "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        upstream = Upstream((f"http://127.0.0.1:{port}",), timeout=60)
        await upstream.start()
        try:
            prompt = render_chat_request(ENC, {"messages": [{"role": "user", "content": "Hi"}]}).tokens
            out = []
            for _ in range(3):  # each over a connection that has already served a request
                pieces, _ = await upstream.complete(Job(prompt, {}, 100), "m", ENC)
                out.append(pieces[0].ids)
            return out
        finally:
            await upstream.close()
            server.close()
            await server.wait_closed()

    answers = asyncio.run(asyncio.wait_for(main(), 120))
    assert answers == [ANSWER] * 3
    dropped = [path for n, path in seen if n == 2]
    assert dropped and all(p == "/v1/completions" for p in dropped)  # the race happened, and was survived
