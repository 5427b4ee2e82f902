"""The engines behind the gateway: OpenAI-compatible ``/v1/completions`` (vLLM, SGLang,
llama.cpp server), load-balanced with health checks and failover.

aiohttp is the client: under 200 concurrent streams it kept up where httpx fell
behind (measured in benchmarks/gateway.py; see encode/httpx#3215).
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass
from typing import Any

import aiohttp
import orjson

from ..encoding import HarmonyEncoding
from ..tokens import CALL, RETURN, STOP_TOKEN_SET


class UpstreamError(Exception):
    """The engine failed us: ``status`` is what the client gets (502, or 504 on a timeout)."""

    def __init__(self, status: int, message: str, code: str = "upstream_error") -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code


class UpstreamRejected(Exception):
    """The engine refused the request itself (a 4xx, such as a prompt over its context length)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass
class Engine:
    url: str
    healthy: bool = True
    checked: float = 0.0


@dataclass
class Piece:
    """Output of one upstream event: token ids, and the finish reason once known."""

    ids: list[int]
    finish_reason: str | None = None


class TextIds:
    """Engine text back to token ids, when the engine sends no ids: special tokens written as
    text are split at chunk boundaries (``<|chan`` + ``nel|>``), so a possible partial one is
    held back until the next chunk."""

    def __init__(self, encoding: HarmonyEncoding) -> None:
        self.encoding = encoding
        self.pending = ""

    def feed(self, text: str, final: bool = False) -> list[int]:
        text = self.pending + text
        cut = len(text)
        if not final:
            start = text.rfind("<|")
            if start != -1 and text.find("|>", start) == -1:
                cut = start
            elif text.endswith("<"):
                cut = len(text) - 1
        self.pending = text[cut:]
        return self.encoding.encode(text[:cut], allowed_special="all") if cut else []


#: How each engine is asked to hold generation to a grammar (llguidance's Lark syntax).
GUIDED_ENGINES = ("vllm", "sglang", "llamacpp")


def guided_fields(engine: str, grammar: str) -> dict[str, Any]:
    """The ``/v1/completions`` fields that make ``engine`` constrain generation to ``grammar``.

    vLLM (>= 0.10.2, ``--structured-outputs-config.backend guidance``): ``structured_outputs``;
    SGLang (``--grammar-backend llguidance``): ``ebnf``; llama.cpp server built with
    llguidance: ``grammar`` with the ``%llguidance {}`` prefix.

    >>> sorted(guided_fields("vllm", "start: x"))
    ['structured_outputs']
    """
    if engine == "vllm":
        return {"structured_outputs": {"grammar": grammar}}
    if engine == "sglang":
        return {"ebnf": grammar}
    if engine == "llamacpp":
        return {"grammar": "%llguidance {}\n" + grammar}
    raise ValueError(f"unknown engine {engine!r} for guided decoding; use one of {', '.join(GUIDED_ENGINES)}")


def _choice_ids(choice: dict[str, Any]) -> list[int] | None:
    for key in ("token_ids", "tokens", "output_ids"):
        ids = choice.get(key)
        if isinstance(ids, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in ids):
            return ids
    return None


def _stop_token(choice: dict[str, Any], ids: list[int]) -> list[int]:
    # vLLM names the stop token that ended the output in ``stop_reason`` and leaves it out of
    # the output: put it back so the parser sees <|call|> or <|return|>.
    stop = choice.get("stop_reason")
    if stop in (RETURN, CALL) and not (ids and ids[-1] in STOP_TOKEN_SET):
        return [*ids, stop]
    return ids


class Upstream:
    """A pool of engines: round robin over the healthy ones, failover on connection errors,
    a background health check that brings engines back."""

    def __init__(self, urls: tuple[str, ...], *, timeout: float, health_interval: float = 5.0) -> None:
        self.engines = [Engine(u.rstrip("/")) for u in urls]
        self.timeout = timeout
        self.health_interval = health_interval
        self._rr = itertools.count()
        self._session: aiohttp.ClientSession | None = None
        self._health_task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        if self._session is None:
            connector = aiohttp.TCPConnector(limit=0, ttl_dns_cache=300)
            self._session = aiohttp.ClientSession(connector=connector)
            self._health_task = asyncio.create_task(self._health_loop())

    async def close(self) -> None:
        if self._health_task is not None:
            self._health_task.cancel()
            await asyncio.gather(self._health_task, return_exceptions=True)
            self._health_task = None
        if self._session is not None:
            await self._session.close()
            self._session = None

    @property
    def session(self) -> aiohttp.ClientSession:
        assert self._session is not None, "Upstream.start() was not awaited"
        return self._session

    def _order(self) -> list[Engine]:
        """Engines to try, healthy ones first, rotating so load spreads."""
        k = next(self._rr) % len(self.engines)
        ring = self.engines[k:] + self.engines[:k]
        return [e for e in ring if e.healthy] + [e for e in ring if not e.healthy]

    async def _health_loop(self) -> None:
        while True:
            await asyncio.sleep(self.health_interval)
            await self.check()

    async def check(self) -> list[dict[str, Any]]:
        """Ask every engine whether it answers; returns their states."""
        async def one(engine: Engine) -> None:
            try:
                timeout = aiohttp.ClientTimeout(total=min(self.timeout, 5.0))
                async with self.session.get(f"{engine.url}/v1/models", timeout=timeout) as r:
                    engine.healthy = r.status < 500
            except (aiohttp.ClientError, asyncio.TimeoutError, OSError):
                engine.healthy = False
            engine.checked = time.time()

        await asyncio.gather(*(one(e) for e in self.engines))
        return [{"url": e.url, "healthy": e.healthy} for e in self.engines]

    async def _open(self, path: str, body: dict[str, Any] | None) -> tuple[aiohttp.ClientResponse, Engine]:
        """Send to the first engine that answers; connection failures move on to the next."""
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=min(self.timeout, 10.0),
                                        sock_read=self.timeout)
        last: Exception | None = None
        for engine in self._order():
            try:
                if body is None:
                    resp = await self.session.get(engine.url + path, timeout=timeout)
                else:
                    resp = await self.session.post(engine.url + path, data=orjson.dumps(body),
                                                   timeout=timeout,
                                                   headers={"Content-Type": "application/json"})
            except asyncio.TimeoutError as e:
                raise UpstreamError(504, f"the engine at {engine.url} did not answer within "
                                         f"{self.timeout:g} s", "upstream_timeout") from e
            except (aiohttp.ClientError, OSError) as e:
                engine.healthy = False
                last = e
                continue
            engine.healthy = True
            if resp.status >= 500:
                text = (await resp.text(errors="replace"))[:300]
                resp.release()
                raise UpstreamError(502, f"the engine answered {resp.status}: {text}")
            if resp.status >= 400:
                text = (await resp.text(errors="replace"))[:1000]
                resp.release()
                raise UpstreamRejected(resp.status, _engine_message(text))
            return resp, engine
        raise UpstreamError(502, f"no engine answered ({len(self.engines)} tried): {last}",
                            "upstream_unavailable")

    async def models(self) -> dict[str, Any]:
        resp, engine = await self._open("/v1/models", None)
        async with resp:
            data = _json(await self._read(resp, engine), engine)
        if not isinstance(data, dict):
            raise UpstreamError(502, f"the engine at {engine.url} listed models that are not an object")
        return data

    async def complete(self, body: dict[str, Any],
                       encoding: HarmonyEncoding) -> tuple[list[Piece], dict[str, Any]]:
        """A whole completion: one ``Piece`` per choice, and the engine's response."""
        resp, engine = await self._open("/v1/completions", {**body, "stream": False})
        async with resp:
            data = _json(await self._read(resp, engine), engine)
        choices = data.get("choices") if isinstance(data, dict) else None
        if not isinstance(choices, list) or not choices:
            raise UpstreamError(502, f"the engine at {engine.url} sent no choices")
        pieces = []
        for choice in sorted(choices, key=lambda c: c.get("index", 0) if isinstance(c, dict) else 0):
            if not isinstance(choice, dict):
                raise UpstreamError(502, f"the engine at {engine.url} sent a choice that is not an object")
            ids = _choice_ids(choice)
            if ids is None:
                text = choice.get("text")
                if not isinstance(text, str):
                    raise UpstreamError(502, f"the engine at {engine.url} sent a choice with no text or ids")
                ids = TextIds(encoding).feed(text, final=True)
            pieces.append(Piece(_stop_token(choice, ids), _finish(choice)))
        return pieces, data

    async def stream(self, body: dict[str, Any],
                     encoding: HarmonyEncoding) -> AsyncGenerator[list[Piece], None]:
        """The completion as it is generated, in batches: the pieces of the events one network
        read brought. Awaiting this opens the request, so a failing engine fails here."""
        resp, engine = await self._open("/v1/completions", {**body, "stream": True})
        return self._batches(resp, engine, encoding)

    async def _batches(self, resp: aiohttp.ClientResponse, engine: Engine,
                       encoding: HarmonyEncoding) -> AsyncGenerator[list[Piece], None]:
        text_ids = TextIds(encoding)
        finished = False
        try:
            async for events in _sse(resp, engine, self.timeout):
                batch: list[Piece] = []
                done = False
                for data in events:
                    if data == b"[DONE]":
                        done = True
                        break
                    finished = self._event(data, engine, text_ids, batch) or finished
                if batch:
                    yield batch
                if done:
                    finished = True
                    break
            if not finished:
                raise UpstreamError(502, f"the engine at {engine.url} closed the stream before it finished")
        finally:
            # Read to its end, the connection goes back to the pool; cut short (the client left,
            # an error), it is closed, which tells the engine to stop generating.
            if finished and resp.content.at_eof():
                resp.release()
            else:
                resp.close()

    @staticmethod
    def _event(data: bytes, engine: Engine, text_ids: TextIds, batch: list[Piece]) -> bool:
        """One event's pieces into ``batch``; True when it finished the output."""
        finished = False
        event = _json(data, engine)
        if isinstance(event, dict) and isinstance(event.get("error"), dict | str):
            err = event["error"]
            msg = err.get("message") if isinstance(err, dict) else err
            raise UpstreamError(502, f"the engine reported an error mid-stream: {msg}")
        choices = event.get("choices") if isinstance(event, dict) else None
        for choice in choices if isinstance(choices, list) else []:
            if not isinstance(choice, dict):
                continue
            ids = _choice_ids(choice)
            reason = _finish(choice)
            if ids is None:
                text = choice.get("text")
                ids = text_ids.feed(text if isinstance(text, str) else "", final=reason is not None)
            batch.append(Piece(_stop_token(choice, ids) if reason else ids, reason))
            finished = finished or reason is not None
        return finished

    async def _read(self, resp: aiohttp.ClientResponse, engine: Engine) -> bytes:
        try:
            return await resp.read()
        except asyncio.TimeoutError as e:
            raise UpstreamError(504, f"the engine at {engine.url} did not answer within {self.timeout:g} s",
                                "upstream_timeout") from e
        except (aiohttp.ClientError, OSError) as e:
            raise UpstreamError(502, f"the engine at {engine.url} broke off: {e}") from e


def _finish(choice: dict[str, Any]) -> str | None:
    reason = choice.get("finish_reason")
    if reason is None:
        return None
    return reason if reason in ("stop", "length", "content_filter") else "stop"


def _engine_message(text: str) -> str:
    try:
        data = orjson.loads(text)
    except orjson.JSONDecodeError:
        return text
    err = data.get("error") if isinstance(data, dict) else None
    if isinstance(err, dict) and isinstance(err.get("message"), str):
        return str(err["message"])
    if isinstance(data, dict) and isinstance(data.get("message"), str):
        return str(data["message"])
    return text


def _json(data: bytes, engine: Engine) -> Any:
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        raise UpstreamError(502, f"the engine at {engine.url} sent something that is not JSON: "
                                 f"{data[:100]!r}") from None


async def _sse(resp: aiohttp.ClientResponse, engine: Engine, timeout: float) -> AsyncIterator[list[bytes]]:
    """The ``data:`` payloads of a server-sent event stream (events split anywhere), as lists:
    the events each network read completed."""
    buf = b""
    data: list[bytes] = []
    try:
        async for chunk in resp.content.iter_any():
            buf += chunk
            pos = 0
            events: list[bytes] = []
            while (nl := buf.find(b"\n", pos)) != -1:
                line, pos = buf[pos:nl].rstrip(b"\r"), nl + 1
                if not line:
                    if data:
                        events.append(b"\n".join(data))
                        data = []
                elif line.startswith(b"data:"):
                    data.append(line[5:].lstrip(b" "))
            buf = buf[pos:]
            if events:
                yield events
    except asyncio.TimeoutError as e:
        raise UpstreamError(504, f"the engine at {engine.url} went silent for {timeout:g} s",
                            "upstream_timeout") from e
    except (aiohttp.ClientError, OSError) as e:
        raise UpstreamError(502, f"the engine at {engine.url} broke off the stream: {e}") from e
    if data:
        yield [b"\n".join(data)]
