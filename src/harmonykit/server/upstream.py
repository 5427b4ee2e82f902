"""The engines behind the gateway: OpenAI-compatible ``/v1/completions`` (vLLM, SGLang,
llama.cpp server), load-balanced with health checks and failover.

aiohttp is the client: under 200 concurrent streams it kept up where httpx fell
behind (measured in benchmarks/gateway.py; see encode/httpx#3215).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass, replace
from typing import Any

import aiohttp
import orjson

from ..encoding import HarmonyEncoding
from .engines import (
    PROFILES,
    Job,
    ModelInfo,
    Piece,
    Profile,
    model_info,
    profile_of,
)

log = logging.getLogger("harmonykit.server")


# What one engine answer may hold: a stream line (one event), and a whole non-streamed body.
MAX_EVENT_BYTES = 8 * 1024 * 1024
MAX_BODY_BYTES = 64 * 1024 * 1024


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
    profile: Profile | None = None  # known once detected (or forced with --engine)
    info: ModelInfo | None = None
    version: str | None = None
    problem: str | None = None  # why it cannot serve this gateway's settings (--guided)
    warned: bool = False


class GuidedUnsupported(Exception):
    """--guided was asked of an engine that cannot constrain a Harmony turn (said at startup)."""


class ContextExceeded(Exception):
    """The prompt does not fit the engine's context: a 400 before the engine is called."""

    def __init__(self, prompt: int, context: int) -> None:
        super().__init__(f"This model's maximum context length is {context} tokens; the prompt is "
                         f"{prompt} tokens, which leaves no room for output. Shorten the conversation.")
        self.message = str(self)


class EngineStream:
    """An engine's opened stream, read with ``async for`` in batches. ``aclose()`` closes its
    connection, which tells the engine to stop generating, whether it was read or not: a client
    that leaves before the first batch leaves a generator never started, and closing one of those
    runs none of its code."""

    def __init__(self, batches: AsyncGenerator[list[Piece], None], resp: aiohttp.ClientResponse) -> None:
        self._batches = batches
        self._resp = resp

    def __aiter__(self) -> AsyncGenerator[list[Piece], None]:
        return self._batches

    async def aclose(self) -> None:
        try:
            await self._batches.aclose()
        finally:
            self._resp.close()  # nothing left to do once read to its end (it went back to the pool)


class Upstream:
    """A pool of engines: round robin over the healthy ones, failover on connection errors,
    a background health check that brings engines back. Each engine is recognised once
    (``/v1/models``, ``/version``) and spoken to as its profile says."""

    def __init__(self, urls: tuple[str, ...], *, timeout: float, health_interval: float = 5.0,
                 engine: str | None = None, model: str | None = None, max_tokens_default: int = 4096,
                 guided: bool = False) -> None:
        self.engines = [Engine(u.rstrip("/"), profile=PROFILES[engine] if engine else None)
                        for u in urls]
        self.forced = engine is not None
        self.timeout = timeout
        self.health_interval = health_interval
        self.model = model
        self.max_tokens_default = max_tokens_default
        self.guided = guided
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
        """Ask every engine whether it answers (and what it is, the first time); returns their states."""
        async def one(engine: Engine) -> None:
            try:
                await self.detect(engine, refresh=True)
                engine.healthy, engine.problem = True, None
            except (UpstreamError, UpstreamRejected):
                engine.healthy = False
            except GuidedUnsupported as e:
                engine.healthy, engine.problem = False, str(e)
            engine.checked = time.time()

        await asyncio.gather(*(one(e) for e in self.engines))
        return self.states()

    def states(self) -> list[dict[str, Any]]:
        """Each engine's state as the background checks and the last requests left it (no I/O)."""
        return [{"url": e.url, "healthy": e.healthy, "engine": e.profile.name if e.profile else None,
                 **({"version": e.version} if e.version else {}),
                 **({"problem": e.problem} if e.problem else {})} for e in self.engines]

    async def detect(self, engine: Engine, *, refresh: bool = False) -> Profile:
        """What ``engine`` is and serves: its profile, model names and context length."""
        if engine.profile is not None and engine.info is not None and not refresh:
            return engine.profile
        timeout = aiohttp.ClientTimeout(total=min(self.timeout, 10.0))
        models = await self._get(engine, "/v1/models", timeout)
        if not isinstance(models, dict):
            raise UpstreamError(502, f"the engine at {engine.url} listed models that are not an object")
        if not self.forced and engine.profile is None:
            version = None
            if not any(isinstance(c, dict) and c.get("owned_by") for c in models.get("data") or []):
                with contextlib.suppress(UpstreamError, UpstreamRejected):
                    version = await self._get(engine, "/version", timeout)
            engine.profile = profile_of(models, version if isinstance(version, dict) else None)
        assert engine.profile is not None
        profile = engine.profile
        if (profile.version_problem or profile.version_caveat) and engine.version is None:
            with contextlib.suppress(UpstreamError, UpstreamRejected):
                v = await self._get(engine, "/version", timeout)
                engine.version = str(v.get("version")) if isinstance(v, dict) else None
        engine.info = model_info(models, profile)
        if self.guided:
            version = engine.version
            problem = profile.guided or (
                profile.version_problem(version) if profile.version_problem and version else None)
            if problem:
                raise GuidedUnsupported(f"--guided cannot work with the engine at {engine.url}: {problem}")
            caveat = profile.version_caveat(version) if profile.version_caveat and version else None
            if caveat and not engine.warned:
                engine.warned = True
                log.warning("%s", orjson.dumps({"upstream": engine.url, "warning": caveat}).decode())
        return engine.profile

    async def _get(self, engine: Engine, path: str, timeout: aiohttp.ClientTimeout) -> Any:
        try:
            async with self.session.get(engine.url + path, timeout=timeout) as r:
                if r.status >= 400:
                    raise UpstreamRejected(r.status, f"{path} answered {r.status}")
                return _json(await r.read(), engine)
        except asyncio.TimeoutError as e:
            raise UpstreamError(504, f"the engine at {engine.url} did not answer {path}",
                                "upstream_timeout") from e
        except (aiohttp.ClientError, OSError) as e:
            raise UpstreamError(502, f"the engine at {engine.url} did not answer {path}: {e}",
                                "upstream_unavailable") from e

    def served_model(self, engine: Engine, requested: str | None) -> str:
        """The model name to send: --upstream-model, else the client's when the engine serves it,
        else the engine's first."""
        if self.model:
            return self.model
        names = engine.info.names if engine.info else ()
        if requested and (requested in names or not names):
            return requested
        return names[0] if names else (requested or "default")

    def limit(self, engine: Engine, job: Job) -> Job:
        """The job with a limit that the engine will use: the client's, else the room the context
        leaves, else --max-tokens-default. A prompt that fills the context is refused here."""
        context = engine.info.context if engine.info else None
        if context is not None and len(job.prompt) >= context:
            raise ContextExceeded(len(job.prompt), context)
        if job.max_tokens is not None:
            return job
        room = context - len(job.prompt) if context is not None else self.max_tokens_default
        return replace(job, max_tokens=room)

    async def _open(self, job: Job, model: str | None, stream: bool
                    ) -> tuple[aiohttp.ClientResponse, Engine, Profile]:
        """Send to the first engine that answers; connection failures move on to the next."""
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=min(self.timeout, 10.0),
                                        sock_read=self.timeout)
        last: Exception | None = None
        for engine in self._order():
            try:
                profile = await self.detect(engine)
            except (UpstreamError, UpstreamRejected, GuidedUnsupported) as e:
                engine.healthy = False
                last = e
                continue
            profile.check(job)
            body = profile.body(self.limit(engine, job), self.served_model(engine, model), stream)
            data = orjson.dumps(body)
            try:
                resp = await self._post(engine.url + profile.path, data, timeout)
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
                if resp.status == 404 and engine.info is not None:
                    engine.info = None  # the served names may have changed: ask again next time
                raise UpstreamRejected(resp.status, _engine_message(text))
            return resp, engine, profile
        raise UpstreamError(502, f"no engine answered ({len(self.engines)} tried): {last}",
                            "upstream_unavailable")

    async def _post(self, url: str, data: bytes, timeout: aiohttp.ClientTimeout) -> aiohttp.ClientResponse:
        """POST ``data``; once more on a fresh connection when the connection was dropped before
        the engine answered. A pooled keep-alive connection that the engine closes (uvicorn, under
        vLLM and SGLang, closes idle ones after 5 s) as it is reused loses the request unread:
        the engine never saw it. A connection refused is no such race: the caller moves on."""
        headers = {"Content-Type": "application/json"}
        try:
            return await self.session.post(url, data=data, timeout=timeout, headers=headers)
        except aiohttp.ClientConnectorError:
            raise
        except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError):
            return await self.session.post(url, data=data, timeout=timeout, headers=headers)

    async def models(self) -> dict[str, Any]:
        last: Exception | None = None
        for engine in self._order():
            try:
                data = await self._get(engine, "/v1/models", aiohttp.ClientTimeout(total=self.timeout))
            except UpstreamError as e:
                last = e
                continue
            if not isinstance(data, dict):
                raise UpstreamError(502, f"the engine at {engine.url} listed models that are not an object")
            return data
        raise UpstreamError(502, f"no engine answered ({len(self.engines)} tried): {last}",
                            "upstream_unavailable")

    async def complete(self, job: Job, model: str | None,
                       encoding: HarmonyEncoding) -> tuple[list[Piece], dict[str, Any]]:
        """A whole completion: one ``Piece`` per choice, and the engine's response."""
        resp, engine, profile = await self._open(job, model, stream=False)
        async with resp:
            data = _json(await self._read(resp, engine), engine)
        if not isinstance(data, dict):
            raise UpstreamError(502, f"the engine at {engine.url} sent something that is not an object")
        choices = data.get("choices") if profile.streams_choices else [data]
        if not isinstance(choices, list) or not choices:
            raise UpstreamError(502, f"the engine at {engine.url} sent no choices")
        pieces = []
        for choice in sorted(choices, key=lambda c: c.get("index", 0) if isinstance(c, dict) else 0):
            if not isinstance(choice, dict):
                raise UpstreamError(502, f"the engine at {engine.url} sent a choice that is not an object")
            pieces.append(profile.read(choice, encoding, job.logprobs))
        return pieces, data

    async def stream(self, job: Job, model: str | None, encoding: HarmonyEncoding) -> EngineStream:
        """The completion as it is generated, in batches: the pieces of the events one network
        read brought. Awaiting this opens the request, so a failing engine fails here."""
        resp, engine, profile = await self._open(job, model, stream=True)
        return EngineStream(self._batches(resp, engine, profile, encoding, job.logprobs), resp)

    async def _batches(self, resp: aiohttp.ClientResponse, engine: Engine, profile: Profile,
                       encoding: HarmonyEncoding, top: int | None) -> AsyncGenerator[list[Piece], None]:
        finished = False
        try:
            async for events in _sse(resp, engine, self.timeout):
                batch: list[Piece] = []
                done = False
                for data in events:
                    if data == b"[DONE]":
                        done = True
                        break
                    finished = self._event(data, engine, profile, encoding, top, batch) or finished
                if batch:
                    yield batch
                if done or (finished and not profile.streams_choices):
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
    def _event(data: bytes, engine: Engine, profile: Profile, encoding: HarmonyEncoding, top: int | None,
               batch: list[Piece]) -> bool:
        """One event's pieces into ``batch``; True when it finished the output."""
        finished = False
        event = _json(data, engine)
        if isinstance(event, dict) and isinstance(event.get("error"), dict | str):
            err = event["error"]
            msg = err.get("message") if isinstance(err, dict) else err
            raise UpstreamError(502, f"the engine reported an error mid-stream: {msg}")
        if not isinstance(event, dict):
            return False
        choices = event.get("choices") if profile.streams_choices else [event]
        for choice in choices if isinstance(choices, list) else []:
            if not isinstance(choice, dict):
                continue
            piece = profile.read(choice, encoding, top)
            batch.append(piece)
            finished = finished or piece.finish_reason is not None
        return finished

    async def _read(self, resp: aiohttp.ClientResponse, engine: Engine) -> bytes:
        try:
            chunks, size = [], 0
            async for chunk in resp.content.iter_any():
                size += len(chunk)
                if size > MAX_BODY_BYTES:
                    raise UpstreamError(502, f"the engine at {engine.url} sent an answer over "
                                             f"{MAX_BODY_BYTES} bytes")
                chunks.append(chunk)
            return b"".join(chunks)
        except asyncio.TimeoutError as e:
            raise UpstreamError(504, f"the engine at {engine.url} did not answer within {self.timeout:g} s",
                                "upstream_timeout") from e
        except (aiohttp.ClientError, OSError) as e:
            raise UpstreamError(502, f"the engine at {engine.url} broke off: {e}") from e


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
            if len(buf) > MAX_EVENT_BYTES and buf.find(b"\n", len(buf) - len(chunk)) == -1:
                raise UpstreamError(502, f"the engine at {engine.url} sent a stream line over "
                                         f"{MAX_EVENT_BYTES} bytes")
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
