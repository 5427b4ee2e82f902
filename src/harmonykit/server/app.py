"""The gateway: an ASGI app that renders requests itself, sends engines token ids, parses
their output with the tolerant parser and answers as OpenAI would. Malformed model output
is never an error; a broken engine is a 502 (504 when too slow), never a fake success.

A plain ASGI callable: five routes need no framework, and the hot path (one SSE
event per engine chunk) goes straight to ``send``.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
import re
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import replace
from functools import partial
from typing import Any

import orjson

from .. import HarmonyEncodingName, load_harmony_encoding
from ..agent import Agent, drive
from ..agent.loop import ContextFull
from ..agent.mcp import McpTurn
from ..agent.mcp import prepare as prepare_mcp
from ..encoding import HarmonyEncoding
from ..errors import HarmonyError
from ..grammar import harmony_grammar
from ..openai import (
    ChatCompletionStream,
    RequestError,
    ResponsesStream,
    completion_to_chat_completion,
    completion_to_response,
    render_chat_request,
    render_responses_request,
)
from ..openai.chat import content_logprobs, merge_deltas
from ..openai.hosted import HOSTED, McpNamespace, hosted_tools, mcp_specs
from ..openai.params import check_fields, logprobs_wanted, output_limit, sampling
from ..openai.request import MESSAGE_CACHE
from ..openai.stops import OutputEnd
from ..openai.turn import new_id
from ..store import StoredResponse, StoreError, open_store
from ..tools import OPTIONS, BackendError, SandboxError, Toolbox
from ..tools.index import IndexFileError
from .engines import Job
from .errors import HTTPError
from .large import LARGE, PIECES_FROM, loads_in_pieces, render_tokens, young_only
from .metrics import Metrics
from .sealed import Sealer, SealError, state_key
from .settings import Settings
from .state import OWNER, EventWriter, Live, State, owner_of, unavailable
from .stateful import Receive, Route, Scope, Send, StatefulRoutes, json_response
from .stateful import pattern as _pattern
from .upstream import ContextExceeded, EngineStream, Upstream, UpstreamError, UpstreamRejected

Emit = Callable[[list[dict[str, Any]], bool], Awaitable[None]]  # events out; True: the last of them
# Input items (history included) past which a request is rendered off the event loop, as a large
# body is: a conversation or chain grown long in the store never stalls other streams.
LONG_HISTORY = 1000
CLIENT_LEFT = "the client disconnected before the response ended; generation was stopped"

log = logging.getLogger("harmonykit.server")

_BYTES_PER_TOKEN_BOUND = 64
_SSE_HEADERS = [(b"content-type", b"text/event-stream; charset=utf-8"), (b"cache-control", b"no-store"),
                (b"x-accel-buffering", b"no")]
def sse(data: Any, event: str | None = None) -> bytes:
    """One server-sent event (``data:`` JSON, or raw bytes such as ``[DONE]``)."""
    payload = data if isinstance(data, bytes) else orjson.dumps(data)
    head = b"event: " + event.encode() + b"\n" if event else b""
    return head + b"data: " + payload + b"\n\n"


class Gateway(StatefulRoutes):
    """The ASGI app. ``upstream`` may be injected (tests); by default it is built from settings."""

    def __init__(self, settings: Settings, *, encoding: HarmonyEncoding | None = None,
                 upstream: Upstream | None = None) -> None:
        self.settings = settings
        self.encoding = encoding or load_harmony_encoding(HarmonyEncodingName.HARMONY_GPT_OSS)
        self.upstream = upstream or Upstream(
            settings.upstream, timeout=settings.upstream_timeout, health_interval=settings.health_interval,
            engine=settings.engine, model=settings.upstream_model,
            max_tokens_default=settings.max_tokens_default, guided=settings.guided is not None)
        MESSAGE_CACHE.resize(settings.render_cache_mb << 20)  # one cache a process
        self.metrics = Metrics()
        self.active = 0
        self._started = False
        self._ignored_seen: set[str] = set()  # unknown request fields already logged
        self._seal: Sealer | None = None  # made when a request first asks for encrypted reasoning
        try:
            self.toolbox = Toolbox(self.encoding, sandbox=settings.sandbox, browser=settings.browser,
                                   fetch_allow=settings.fetch_allow, mcp=settings.mcp,
                                   mcp_servers=settings.mcp_server, mcp_timeout=settings.mcp_timeout)
        except (SandboxError, BackendError, IndexFileError) as e:
            if isinstance(e, SandboxError):
                raise ValueError(f"--python: {e}") from None
            raise ValueError(str(e) if str(e).startswith("--") else f"--browser: {e}") from None
        hosted = self.toolbox.declarations()
        # Looked up in _RENDER at each call (a test observes renders there); Responses with this
        # deployment's declarations of the built-in tools, and a request's MCP servers' tools.
        self._render: dict[str, Callable[..., Any]] = {
            "chat": lambda enc, req, mcp=(): _RENDER["chat"](enc, req),
            "responses": lambda enc, req, mcp=(): _RENDER["responses"](enc, req, hosted=hosted, mcp=mcp)}
        store = open_store(settings.store_url, ttl=settings.store_ttl, timeout=settings.store_timeout)
        self.state = State(store, lease=settings.store_lease) if store is not None else None
        self._routes: dict[tuple[str, str], Route] = {
            ("POST", "/v1/chat/completions"): self._chat,
            ("POST", "/v1/responses"): self._responses,
            ("GET", "/v1/models"): self._models,
            ("GET", "/health"): self._health,
            ("GET", "/metrics"): self._metrics,
        }
        # Paths with ids in them: (method, template) -> handler; the template is what metrics and
        # logs name (never an id).
        self._templates: list[tuple[str, str, re.Pattern[str], Route]] = [
            (method, template, _pattern(template), handler) for (method, template), handler in
            self.stateful_routes().items()]
        # a model id may hold slashes (vLLM serves "openai/gpt-oss-20b")
        self._templates.append(("GET", "/v1/models/{model}", re.compile(r"/v1/models/(?P<model>.+)"),
                                self._model))

    # -- ASGI ----------------------------------------------------------------

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        await self.start()
        method, path = scope["method"], scope["path"].rstrip("/") or "/"
        route = self._routes.get((method, path))
        endpoint = path
        allowed = [m for m, p in self._routes if p == path]
        if route is None and path.startswith("/v1/"):
            for m, template, pattern, handler in self._templates:
                match = pattern.fullmatch(path)
                if match is not None:
                    allowed.append(m)
                    if m == method:
                        route, endpoint = handler, template
                        scope["path_params"] = match.groupdict()
        info: dict[str, Any] = {"id": uuid.uuid4().hex[:16], "endpoint": endpoint}
        t0 = time.perf_counter()
        try:
            if route is None:
                raise HTTPError(405 if allowed else 404, f"{method} {path} is not served here" + (
                    f"; use {', '.join(allowed)}" if allowed else ""), code="unknown_url")
            status = await route(scope, receive, send, info)
        except RequestError as e:  # a malformed id or query, from the stateful routes
            status, error = 400, HTTPError(400, e.message, param=e.param)
            info["error"] = e.message
            await _json_response(send, 400, error.body())
        except (HTTPError, StoreError) as e:  # a store that fails before the answer starts: 503 naming it
            error = e if isinstance(e, HTTPError) else unavailable(e)
            status = error.status
            info["error"] = error.message
            await _json_response(send, error.status, error.body())
        except Exception as e:  # a bug of ours: still an OpenAI-shaped answer, and a log line
            log.exception("internal error on %s", path)
            status = 500
            info["error"] = f"internal error: {type(e).__name__}"
            with contextlib.suppress(Exception):
                await _json_response(send, 500, HTTPError(500, "internal error in harmonykit").body())
        if endpoint.startswith("/v1/") and route is not None:  # known endpoints only: labels stay few
            self.metrics.requests.labels(endpoint, str(status)).inc()
            info["status"] = status
            info["ms"] = round((time.perf_counter() - t0) * 1000, 2)
            log.info("%s", _log_line(info))
        elif route is None:  # an unknown URL: a log line (no metric label: they would be endless)
            info.update(endpoint="(unknown)", method=method, path=path[:200], status=status)
            log.info("%s", _log_line(info))

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                try:
                    await self.start()
                except StoreError as e:  # a store that cannot be opened stops the gateway, saying so
                    await send({"type": "lifespan.startup.failed", "message": e.message})
                    return
                # Know the engines before the first request; one that cannot do what the settings
                # ask (--guided on llama.cpp or an old vLLM) stops the gateway here, saying why.
                states = await self.upstream.check()
                problems = [e.problem for e in self.upstream.engines if e.problem]
                if problems:
                    await send({"type": "lifespan.startup.failed", "message": "; ".join(problems)})
                    return
                for st in states:
                    log.info("%s", orjson.dumps({"upstream": st}).decode())
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                if self.state is not None:
                    await self.state.close()
                await self.toolbox.close()
                await self.upstream.close()
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def start(self) -> None:
        if not self._started:
            self._started = True
            await self.upstream.start()
            if self.state is not None:
                await self.state.start()

    # -- plain routes ----------------------------------------------------------

    async def _models(self, scope: Scope, receive: Receive, send: Send, info: dict[str, Any]) -> int:
        self._authorize(scope)
        try:
            data = await self.upstream.models()
        except (UpstreamError, UpstreamRejected) as e:
            raise HTTPError(502, e.message, code="upstream_error") from None
        await _json_response(send, 200, data)
        return 200

    async def _model(self, scope: Scope, receive: Receive, send: Send, info: dict[str, Any]) -> int:
        """One model, as ``/v1/models`` lists it; a model no engine serves is OpenAI's 404."""
        self._authorize(scope)
        name = scope["path_params"]["model"]
        try:
            data = await self.upstream.models()
        except (UpstreamError, UpstreamRejected) as e:
            raise HTTPError(502, e.message, code="upstream_error") from None
        for model in data.get("data") or [] if isinstance(data, dict) else []:
            if isinstance(model, dict) and model.get("id") == name:
                await _json_response(send, 200, model)
                return 200
        raise HTTPError(404, f"The model '{name[:200]}' does not exist", param="model",
                        code="model_not_found")

    async def _health(self, scope: Scope, receive: Receive, send: Send, info: dict[str, Any]) -> int:
        # From the background checks' state: a health probe never calls the engines itself, and
        # shows their addresses only to a client with the key (when one is set).
        engines = self.upstream.states()
        ok = any(e["healthy"] for e in engines)
        status = 200 if ok else 503
        body: dict[str, Any] = {"status": "ok" if ok else "unavailable"}
        if self._authorized(scope):
            body.update(upstreams=engines, active_requests=self.active)
        await _json_response(send, status, body)
        return status

    async def _metrics(self, scope: Scope, receive: Receive, send: Send, info: dict[str, Any]) -> int:
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", self.metrics.content_type.encode())]})
        await send({"type": "http.response.body", "body": self.metrics.render()})
        return 200

    # -- the API -----------------------------------------------------------------

    async def _chat(self, scope: Scope, receive: Receive, send: Send, info: dict[str, Any]) -> int:
        return await self._api(scope, receive, send, info, "chat")

    async def _responses(self, scope: Scope, receive: Receive, send: Send, info: dict[str, Any]) -> int:
        return await self._api(scope, receive, send, info, "responses")

    async def _api(self, scope: Scope, receive: Receive, send: Send, info: dict[str, Any], kind: str) -> int:
        owner = self._authorize(scope)
        # The body is read before a slot is taken, with a deadline: a client that sends nothing
        # holds no slot, and not for long.
        data = await self._read_body(scope, receive)
        if self.settings.log_content:  # what came, as it came: a refused request is logged too
            info["request"] = _loggable(data)
        if self.active >= self.settings.max_concurrency:
            raise HTTPError(429, f"the gateway is serving its maximum of {self.settings.max_concurrency} "
                                 "requests; retry shortly", code="concurrency_limit")
        self.active += 1
        try:
            self._bound(len(data), kind)
            try:
                request, tokens, own, mcp = await self._prepare(data, kind, owner)
                spaces = mcp.namespaces if mcp else ()
                grammar = harmony_grammar(request, mcp=spaces) if self.settings.guided else None
                if grammar is None and _forces_a_call(request):
                    # one request held to its grammar, on an engine that can do that without --guided
                    _check_tool_choice(self._grammar_problem())
                    grammar = harmony_grammar(request, mcp=spaces)
                job = Job(tokens, sampling(request, kind), output_limit(request, kind),
                          logprobs_wanted(request, kind), grammar)
            except RequestError as e:
                raise HTTPError(400, e.message, param=e.param) from None
            except HarmonyError as e:  # text the tokenizer cannot take (a run of mixed whitespace)
                raise HTTPError(400, str(e), param="messages" if kind == "chat" else "input") from None
            info["prompt_tokens"] = len(job.prompt)
            self.metrics.tokens.labels("in").inc(len(job.prompt))
            agent = self._agent(request, owner, job, mcp) if kind == "responses" else None
            record = None
            if kind == "responses" and self.state is not None and request.get("store") is not False:
                info["response_id"] = rid = new_id("resp")
                if request.get("background"):
                    return await self._background(send, receive, request, job, info, owner, rid, own, agent)
                snapshot = self._responses_stream(request, job, rid, agent).response("in_progress", [])
                record = self.state.record(snapshot, request, own, owner)
                if request.get("stream"):  # its id is out before it ends: stored from the start
                    await self.state.begin(record)
            elif request.get("background"):
                raise HTTPError(400, "background responses are stored responses: send store true (the "
                                     "default) with background", param="store")
            if request.get("stream"):
                return await self._stream(send, receive, request, job, kind, info, record, agent)
            if agent is not None:
                return await self._whole_turn(send, receive, request, job, info, record, agent)
            return await self._whole(send, receive, request, job, kind, info, record)
        finally:
            self.active -= 1

    def _agent(self, request: dict[str, Any], owner: str, job: Job, mcp: McpTurn | None) -> Agent | None:
        """The loop that runs this response's built-in calls, when it asks for tools this gateway runs."""
        if not hosted_tools(request) and not (mcp and mcp.servers):
            return None
        try:
            return Agent(self.toolbox, self.encoding, request, owner, job.prompt, chain=_chain(request),
                         mcp=mcp)
        except RequestError as e:
            raise HTTPError(400, e.message, param=e.param) from None

    def _grammar_problem(self) -> str | None:
        """Why the engines cannot hold one request to a grammar (None: every one can)."""
        for e in self.upstream.engines:
            p = e.profile
            if p is None:
                return f"the engine at {e.url} cannot be shown to do (it is not recognised yet)"
            why = p.guided or (p.version_problem(e.version) if p.version_problem and e.version else None)
            if why:
                return f"the engine at {e.url} cannot do ({why})"
        return None

    def _check_hosted(self, request: dict[str, Any]) -> None:
        """A hosted tool this deployment does not run is a 400 naming the option that enables it."""
        tools = request.get("tools")
        for i, t in enumerate(tools if isinstance(tools, list) else []):
            kind = t.get("type") if isinstance(t, dict) else None
            ns = "mcp" if kind == "mcp" else HOSTED.get(kind) if isinstance(kind, str) else None
            if ns is not None and ns not in self.toolbox.enabled:
                what = "MCP servers" if ns == "mcp" else f"gpt-oss's {ns} tool"
                raise RequestError(f"tools[{i}]", f"the {t['type']} tool needs the gateway started with "
                                                  f"{OPTIONS[ns]} (this gateway does not run {what}), or "
                                                  "send the request without it")

    async def _prepare(self, data: bytes, kind: str,
                       owner: str) -> tuple[dict[str, Any], list[int], Any, McpTurn | None]:
        """The request, checked, with its stored history in front (previous_response_id,
        conversation); its prompt tokens; its own input, as it came; and its MCP servers' tools
        (listed, approved calls run: the prompt declares them). A large one is read and
        rendered off the event loop (server/large.py): one client's megabytes never stall
        everyone's streams."""
        stateful = self.state is not None
        if len(data) < LARGE:
            request = self._opened(self._known(_parse(data), kind, stateful), owner)
            own = request.get("input")
            request = await self._history(request, kind, owner)
            request, mcp = await self._mcp(request, kind, own)
            spaces = mcp.namespaces if mcp else ()
            if kind == "responses" and len(request["input"]) > LONG_HISTORY:  # a long stored history
                return (*await asyncio.to_thread(self._render_truncated, request, kind, spaces), own, mcp)
            return (*self._render_truncated(request, kind, spaces), own, mcp)
        with young_only():
            request = await asyncio.to_thread(_parse, data, loads_in_pieces) if len(data) >= PIECES_FROM \
                else _parse(data)
            del data
            request = self._opened(self._known(request, kind, stateful), owner)
            own = request.get("input")
            request = await self._history(request, kind, owner)
            request, mcp = await self._mcp(request, kind, own)
            spaces = mcp.namespaces if mcp else ()
            render = partial(self._render[kind], mcp=spaces)
            tokens = await asyncio.to_thread(render_tokens, render, self.encoding, request,
                                             self.settings.log_content)
        return (*self._truncate(request, kind, tokens, spaces), own, mcp)

    async def _history(self, request: dict[str, Any], kind: str, owner: str) -> dict[str, Any]:
        """What the store adds to a request: a response's chain or conversation in front of its
        input (its hosted tools checked first); a Chat tool loop's reasoning the client left out."""
        if kind == "responses":
            self._check_hosted(request)
        if self.state is None:
            return request
        if kind == "responses":
            return await self.state.expand(request, owner)
        return await self.state.restore_thoughts(request, owner)

    def _known(self, request: Any, kind: str, stateful: bool) -> dict[str, Any]:
        """The request checked, less the fields this gateway does not know: those are ignored, each
        logged once a process and noted in the answer's ``harmony`` field (``IGNORED``)."""
        ignored = check_fields(request, kind, stateful=stateful)
        if not ignored:
            return request  # type: ignore[no-any-return]
        for name in ignored:
            if name not in self._ignored_seen and len(self._ignored_seen) < 1000:
                self._ignored_seen.add(name)
                log.info("%s", orjson.dumps({"ignored_field": name[:200], "endpoint": kind}).decode())
        return {**{k: v for k, v in request.items() if k not in ignored}, IGNORED: ignored}

    def _sealer(self) -> Sealer:
        if self._seal is None:
            from ..store import data_dir

            self._seal = Sealer(state_key(self.settings.state_key, data_dir()))
        return self._seal

    def _opened(self, request: dict[str, Any], owner: str) -> dict[str, Any]:
        """Reasoning items sent back with their ``encrypted_content``, opened (the model's chain of
        thought restored); a blob that fails its check is a 400. The owner is kept with the request,
        for sealing the new ones."""
        request[OWNER] = owner
        items = request.get("input")
        if not isinstance(items, list) or not any(isinstance(i, dict) and i.get("type") == "reasoning"
                                                  and i.get("encrypted_content") for i in items):
            return request
        out = []
        for n, item in enumerate(items):
            if isinstance(item, dict) and item.get("type") == "reasoning" and item.get("encrypted_content"):
                try:
                    text = self._sealer().open(item["encrypted_content"], owner)
                except SealError as e:
                    raise RequestError(f"input[{n}].encrypted_content", str(e)) from None
                item = {k: v for k, v in item.items() if k != "encrypted_content"}
                item["content"] = [{"type": "reasoning_text", "text": text}]
            out.append(item)
        return {**request, "input": out}

    def _seal_hook(self, request: dict[str, Any]) -> Callable[[str], str] | None:
        """How reasoning is sealed for the client: when ``include`` asks, and whenever ``store`` is
        false — then the client holds the chain of thought or nobody does, and clients that do not
        know gpt-oss reasons (the Vercel AI SDK by model name) would drop it mid tool call."""
        include = request.get("include")
        asked = isinstance(include, list) and "reasoning.encrypted_content" in include
        if not asked and request.get("store") is not False:
            return None
        sealer, owner = self._sealer(), str(request.get(OWNER) or "")
        return lambda text: sealer.seal(text, owner)

    async def _mcp(self, request: dict[str, Any], kind: str,
                   own: Any) -> tuple[dict[str, Any], McpTurn | None]:
        """The request's MCP servers listed and its approved calls run; the request with those
        calls in its input (the prompt shows their results)."""
        if kind != "responses" or self.toolbox.mcp is None or not mcp_specs(request):
            return request, None
        mcp = await prepare_mcp(self.toolbox.mcp, request, own, _chain(request) or "")
        calls = [i for i in mcp.prelude if i["type"] == "mcp_call"]
        if calls:
            request = {**request, "input": [*request["input"], *calls]}
        return request, mcp

    def _render_truncated(self, request: dict[str, Any], kind: str,
                          mcp: tuple[McpNamespace, ...] = ()) -> tuple[dict[str, Any], list[int]]:
        return self._truncate(request, kind, self._render[kind](self.encoding, request, mcp=mcp).tokens, mcp)

    def _truncate(self, request: dict[str, Any], kind: str, tokens: list[int],
                  mcp: tuple[McpNamespace, ...] = ()) -> tuple[dict[str, Any], list[int]]:
        """``truncation: "auto"``: the oldest input items dropped, as few as make the prompt fit the
        engine's context with room for the output limit (found by bisection: a few renders, each
        mostly from the render cache). ``"disabled"`` (the default) leaves the 400 to the engine check."""
        context = self._context()
        if kind != "responses" or request.get("truncation") != "auto" or context is None:
            return request, tokens
        room = context - min(output_limit(request, kind) or 1, context // 2)
        items = request["input"] if isinstance(request.get("input"), list) else None
        if len(tokens) <= room or not items or len(items) < 2:
            return request, tokens

        def render(drop: int) -> tuple[list[Any], list[int]] | None:
            start = drop  # past an output whose call was dropped, reasoning whose answer was
            while start < len(items) and isinstance(items[start], dict) and \
                    items[start].get("type") in ("function_call_output", "reasoning"):
                start += 1
            if start == len(items):
                return None
            kept = items[start:]
            return kept, self._render[kind](self.encoding, {**request, "input": kept}, mcp=mcp).tokens

        lo, hi = 1, len(items) - 1  # the newest item always stays
        best: tuple[list[Any], list[int]] | None = None
        while lo <= hi:
            mid = (lo + hi) // 2
            got = render(mid)
            if got is not None and len(got[1]) <= room:
                best, hi = got, mid - 1
            else:
                lo = mid + 1
        if best is None:
            return request, tokens  # even the newest item alone does not fit: the engine check says so
        return {**request, "input": best[0]}, best[1]

    def _context(self) -> int | None:
        contexts = [e.info.context for e in self.upstream.engines if e.info and e.info.context]
        return min(contexts) if contexts else None

    def _responses_stream(self, request: dict[str, Any], job: Job, rid: str | None,
                          agent: Agent | None = None, created_at: float | None = None) -> ResponsesStream:
        mcp = agent.mcp if agent is not None else None
        out = ResponsesStream(self.encoding, request=request, id=rid, model=request.get("model") or "gpt-oss",
                              prompt_tokens=len(job.prompt), created_at=created_at,
                              mcp=mcp.namespaces if mcp else (), prelude=list(mcp.prelude) if mcp else None)
        if agent is not None:
            agent.attach(out)
        out.items.seal = self._seal_hook(request)
        return out

    async def _whole(self, send: Send, receive: Receive, request: dict[str, Any], job: Job,
                     kind: str, info: dict[str, Any], record: StoredResponse | None = None) -> int:
        t0 = time.perf_counter()
        call = asyncio.ensure_future(self._call(self.upstream.complete(job, request.get("model"),
                                                                       self.encoding), request))
        watch = asyncio.ensure_future(_disconnected(receive))
        try:
            await asyncio.wait({call, watch}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            watch.cancel()
        if not call.done():  # the client went away: cancelling closes the engine's connection (an abort)
            call.cancel()
            with contextlib.suppress(asyncio.CancelledError, HTTPError):
                await call
            info["error"] = "client disconnected"
            await self._abandon(record, None, CLIENT_LEFT)
            return 499
        try:
            pieces, _ = call.result()
        except HTTPError as e:
            await self._abandon(record, None, e.message)
            raise
        self._latency(info, t0)
        client_model = request.get("model") or "gpt-oss"
        runs = []
        for p in pieces:
            end = OutputEnd(self.encoding, job.sampling.get("stop") or ())
            ids, lps = end.feed(p.ids, p.logprobs)
            tail, tail_lps = end.finish(ended=p.finish_reason != "length")
            runs.append((ids + tail, lps + tail_lps, p.finish_reason or "stop"))
        if kind == "chat":
            out = completion_to_chat_completion(
                self.encoding, [(ids, reason) for ids, _, reason in runs], request=request,
                model=client_model, prompt_tokens=len(job.prompt))
            if job.logprobs is not None:
                for choice, (ids, lps, _) in zip(out["choices"], runs, strict=True):
                    choice["logprobs"] = {"content": content_logprobs(self.encoding, ids, lps, request),
                                          "refusal": None}
            harmony = [c["harmony"] for c in out["choices"]]
        else:
            ids, lps, reason = runs[0]
            out = completion_to_response(self.encoding, ids, request=request, model=client_model,
                                         finish_reason=reason, prompt_tokens=len(job.prompt),
                                         id=record.id if record else None,
                                         created_at=record.created_at if record else None)
            harmony = [out["harmony"]]
            seal = self._seal_hook(request)
            if seal is not None:
                for item in out["output"]:
                    if item["type"] == "reasoning":
                        item["encrypted_content"] = seal(item["content"][0]["text"])
        completion = sum(len(p.ids) for p in pieces)
        if kind == "chat" and self.state is not None:  # before the client can send the next step
            await self.state.keep_thoughts(request, [c["message"] for c in out["choices"]])
        _note_ignored(request, harmony)
        self._count(info, completion, harmony)
        if record is not None:
            await self._finish(record, out)  # stored before the client sees it
        await _json_response(send, 200, out)
        return 200

    async def _stream(self, send: Send, receive: Receive, request: dict[str, Any], job: Job, kind: str,
                      info: dict[str, Any], record: StoredResponse | None = None,
                      agent: Agent | None = None) -> int:
        # Opened before the response starts: an engine that is down is a 502, not a broken stream.
        batches = await self._open(request, job, info, record)
        client_model = request.get("model") or "gpt-oss"
        out: ChatCompletionStream | ResponsesStream
        if kind == "chat":
            out = ChatCompletionStream(self.encoding, request=request, model=client_model,
                                       prompt_tokens=len(job.prompt))
        else:
            out = self._responses_stream(request, job, record.id if record else None, agent,
                                         record.created_at if record else None)
        # Chat: each choice's reasoning and tool-call deltas, to keep that reasoning for the next step
        keeps = kind == "chat" and self.state is not None
        said: dict[int, list[dict[str, Any]]] = {}

        async def emit(events: list[dict[str, Any]], last: bool) -> None:
            if keeps:
                for e in events:
                    for c in e.get("choices") or ():
                        delta = c.get("delta") or {}
                        if delta.get("reasoning_content") or delta.get("tool_calls"):
                            said.setdefault(c.get("index", 0), []).append(delta)
                if last and self.state is not None:
                    messages = [merge_deltas(d) for d in said.values()]
                    await self.state.keep_thoughts(request, messages)
            if last:
                _note_ignored(request, _harmony_of(events))
            body = b"".join([_frame(e, kind) for e in events])
            if last:
                if agent is not None:
                    agent.keep(events[-1]["response"]["id"], _conversation_id(request))
                if record is not None:
                    try:
                        await self._finish(record, events[-1]["response"])
                    except HTTPError as e:  # not stored: the client is told, not shown an end
                        body = b"".join([_frame(ev, kind) for ev in events[:-1]]) + _error_frame(e)
                if kind == "chat":
                    body += sse(b"[DONE]")
            await send({"type": "http.response.body", "more_body": True, "body": body})

        self.metrics.streams_open.inc()
        watch = asyncio.ensure_future(_disconnected(receive))
        try:  # from here on, however it ends, the engine's stream is closed (an abort, if running)
            await send({"type": "http.response.start", "status": 200, "headers": _SSE_HEADERS})
            # The opening events (Chat's role chunk, response.created) go out at once, as OpenAI's do.
            await send({"type": "http.response.body", "more_body": True,
                        "body": b"".join([_frame(e, kind) for e in out.feed([])])})
            end = OutputEnd(self.encoding, job.sampling.get("stop") or ())
            pump = asyncio.ensure_future(self._pump(emit, batches, out, end, info) if agent is None or
                                         not isinstance(out, ResponsesStream) else
                                         self._turn(emit, batches, out, job, request, info, agent))
            done, _ = await asyncio.wait({pump, watch}, return_when=asyncio.FIRST_COMPLETED)
            if pump not in done:  # the client went away: stop generating upstream
                info["error"] = "client disconnected"
                pump.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await pump
                await self._abandon(record, out, CLIENT_LEFT)
                return 499
            pump.result()
            await send({"type": "http.response.body", "body": b"", "more_body": False})
            return 200
        finally:
            watch.cancel()
            self.metrics.streams_open.dec()
            with contextlib.suppress(Exception):
                await batches.aclose()

    async def _pump(self, emit: Emit, batches: EngineStream, out: ChatCompletionStream | ResponsesStream,
                    end: OutputEnd, info: dict[str, Any]) -> None:
        """The engine's stream through the parser into events, ``emit``-ted a batch a network read;
        the last batch (``last``) ends the response."""
        finish = "stop"
        try:
            async for batch in batches:  # what one network read brought: one write out
                ids: list[int] = []
                lps: list[dict[str, Any]] = []
                for piece in batch:
                    got, got_lps = end.feed(piece.ids, piece.logprobs)
                    ids += got
                    lps += got_lps
                    if piece.finish_reason is not None:
                        finish = piece.finish_reason
                events = _feed(out, ids, lps) if ids else []
                if events:
                    await emit(events, False)
        except UpstreamError as e:
            info["error"] = e.message
            await emit(out.fail(e.message), True)
            self._count(info, out.output_tokens, [out.turn.extension()])
            return
        rest, rest_lps = end.finish(ended=finish != "length")
        await emit(_feed(out, rest, rest_lps) + out.close(finish), True)
        self._count(info, out.output_tokens, [out.turn.extension()])

    async def _open(self, request: dict[str, Any], job: Job, info: dict[str, Any],
                    record: StoredResponse | None) -> EngineStream:
        """The engine's stream for the first step (a failure: the stored response abandoned, the
        HTTP error raised)."""
        t0 = time.perf_counter()
        try:
            batches: EngineStream = await self._call(self.upstream.stream(job, request.get("model"),
                                                                          self.encoding), request)
        except HTTPError as e:
            await self._abandon(record, None, e.message)
            raise
        self._latency(info, t0)
        return batches

    async def _turn(self, emit: Emit, batches: EngineStream, out: ResponsesStream, job: Job,
                    request: dict[str, Any], info: dict[str, Any], agent: Agent) -> None:
        """A turn with built-in tools: the agent loop over this gateway's engines, each step's
        engine stream closed when the next opens (or the turn ends)."""
        streams = [batches]
        model = request.get("model")
        # A forced tool_choice holds the first step; after a tool's result the model is free again
        # (else a forced call would loop until the limits).
        spaces = agent.mcp.namespaces if agent.mcp is not None else ()
        grammar = harmony_grammar({**request, "tool_choice": "auto"}, mcp=spaces) if job.grammar is not None \
            else None

        async def generate(prompt: list[int], limit: int | None) -> _EngineStep:
            next_job = replace(job, prompt=prompt, max_tokens=limit, grammar=grammar)
            with contextlib.suppress(Exception):
                await streams[-1].aclose()
            try:
                got = await self.upstream.stream(next_job, model, self.encoding)
            except ContextExceeded:
                raise ContextFull() from None
            except UpstreamRejected as e:  # the engine's own context check, in its words
                if "context" in e.message.lower() or "too long" in e.message.lower():
                    raise ContextFull() from None
                raise
            streams.append(got)
            self.metrics.tokens.labels("in").inc(len(prompt))
            return _EngineStep(got, OutputEnd(self.encoding, job.sampling.get("stop") or ()))

        try:
            first = _EngineStep(batches, OutputEnd(self.encoding, job.sampling.get("stop") or ()))
            await drive(out, agent, first, generate, emit)
        except (UpstreamError, UpstreamRejected, RequestError) as e:  # a later step's engine call failed
            info["error"] = e.message
            await emit(out.fail(e.message), True)
        finally:
            for stream in streams[1:]:
                with contextlib.suppress(Exception):
                    await stream.aclose()
        self._count(info, out.output_tokens, [out.extension()])

    async def _whole_turn(self, send: Send, receive: Receive, request: dict[str, Any], job: Job,
                          info: dict[str, Any], record: StoredResponse | None, agent: Agent) -> int:
        """A non-streamed response with built-in tools: the same loop, answered when it ends."""
        batches = await self._open(request, job, info, record)
        out = self._responses_stream(request, job, record.id if record else None, agent,
                                     record.created_at if record else None)
        final: list[dict[str, Any]] = []

        async def emit(events: list[dict[str, Any]], last: bool) -> None:
            if last:
                _note_ignored(request, _harmony_of(events))
                final.append(events[-1]["response"])

        out.feed([])
        turn = asyncio.ensure_future(self._turn(emit, batches, out, job, request, info, agent))
        watch = asyncio.ensure_future(_disconnected(receive))
        try:
            await asyncio.wait({turn, watch}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            watch.cancel()
            if not turn.done():  # the client went away: the tools and the engine are stopped
                turn.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await turn
                info["error"] = "client disconnected"
                await self._abandon(record, out, CLIENT_LEFT)
                with contextlib.suppress(Exception):
                    await batches.aclose()
                return 499  # noqa: B012 - the answer has nowhere to go
            with contextlib.suppress(Exception):
                await batches.aclose()
        turn.result()
        response = final[-1]
        if response["status"] == "failed":
            await self._abandon(record, None, response["error"]["message"])
            raise HTTPError(502, response["error"]["message"], code="upstream_error")
        agent.keep(response["id"], _conversation_id(request))
        if record is not None:
            await self._finish(record, response)
        await _json_response(send, 200, response)
        return 200

    # -- stored responses ------------------------------------------------------------

    async def _finish(self, record: StoredResponse, response: dict[str, Any]) -> None:
        assert self.state is not None
        try:
            await self.state.finish(record, response)
        except StoreError as e:
            raise unavailable(e) from None

    async def _abandon(self, record: StoredResponse | None,
                       out: ResponsesStream | ChatCompletionStream | None, why: str) -> None:
        if record is None or self.state is None:
            return
        response = out.fail(why)[-1]["response"] if isinstance(out, ResponsesStream) else \
            {**record.body, "status": "failed", "error": {"code": "server_error", "message": why}}
        await self.state.abandon(record, response, why)

    async def _background(self, send: Send, receive: Receive, request: dict[str, Any], job: Job,
                          info: dict[str, Any], owner: str, rid: str, own: Any,
                          agent: Agent | None = None) -> int:
        """``background: true``: stored ``queued`` and answered at once; generated by a task of the
        gateway's own that outlives the client (and is cancelled from any replica); with
        ``stream: true`` the client follows its events, and may come back for them."""
        assert self.state is not None
        state = self.state
        # Background responses outlive their requests: they count against --max-concurrency too.
        if len(state.tasks) + self.active > self.settings.max_concurrency:
            raise HTTPError(429, f"the gateway is generating its maximum of {self.settings.max_concurrency} "
                                 "responses; retry shortly", code="concurrency_limit")
        snapshot = self._responses_stream(request, job, rid, agent).response("queued", [])
        record = state.record(snapshot, request, own, owner)
        await state.begin(record)
        live = state.live[rid] = Live()
        state.tasks[rid] = asyncio.ensure_future(self._generate(record, request, job, live, dict(info),
                                                                agent))
        info["background"] = True
        if not request.get("stream"):
            await _json_response(send, 200, record.response)
            return 200
        return await self._follow(send, receive, live.follow(-1))

    async def _generate(self, record: StoredResponse, request: dict[str, Any], job: Job, live: Live,
                        info: dict[str, Any], agent: Agent | None = None) -> None:
        """A background response's generation, whoever is watching: its events kept (in memory for
        followers here, in the store for every other), the response stored before its last event
        is published."""
        assert self.state is not None
        state = self.state
        out = self._responses_stream(request, job, record.id, agent, record.created_at)
        # Kept whether or not its creator streams: any client may stream it again, from any replica.
        writer = EventWriter(state.store, record.id)

        async def emit(events: list[dict[str, Any]], last: bool) -> None:
            if last:
                _note_ignored(request, _harmony_of(events))
            frames = [(e["sequence_number"], _frame(e, "responses")) for e in events]
            writer.add(frames)
            if last:
                await writer.drain()
                if agent is not None:
                    agent.keep(record.id, _conversation_id(request))
                await state.finish(record, events[-1]["response"])
            live.add(frames, done=last)

        batches: EngineStream | None = None
        try:
            try:
                batches = await self._call(self.upstream.stream(job, request.get("model"), self.encoding),
                                           request)
            except HTTPError as e:
                await emit(out.feed([]) + out.fail(e.message), True)
                return
            await state.store.start_response(record.id, state.instance)
            await emit(out.feed([]), False)
            if agent is not None:
                await self._turn(emit, batches, out, job, request, info, agent)
            else:
                await self._pump(emit, batches, out, OutputEnd(self.encoding, job.sampling.get("stop") or ()),
                                 info)
        except asyncio.CancelledError:  # cancelled (the store keeps that), or the gateway shutting down
            with contextlib.suppress(StoreError):
                await writer.drain()
                await state.finish(record, out.fail("the gateway shut down before the response ended")[-1]
                                   ["response"])
        except StoreError as e:
            log.warning("store: %s (background response %s)", e.message, record.id)
            with contextlib.suppress(StoreError):
                await state.finish(record, out.fail(e.message)[-1]["response"])
        except Exception as e:  # a bug of ours: the response still ends, failed, and it is logged
            log.exception("internal error in background response %s", record.id)
            with contextlib.suppress(StoreError):
                await state.finish(record, out.fail(f"internal error in harmonykit: {type(e).__name__}")[-1]
                                   ["response"])
        finally:
            live.add([], done=True)
            state.tasks.pop(record.id, None)
            state.live.pop(record.id, None)
            if batches is not None:
                with contextlib.suppress(Exception):
                    await batches.aclose()

    async def _follow(self, send: Send, receive: Receive, frames: AsyncIterator[list[bytes]]) -> int:
        """Stream stored or live events to a client until the response ends or the client leaves
        (leaving never stops a background response)."""
        self.metrics.streams_open.inc()
        watch = asyncio.ensure_future(_disconnected(receive))
        try:
            await send({"type": "http.response.start", "status": 200, "headers": _SSE_HEADERS})

            async def pump() -> None:
                async for batch in frames:
                    await send({"type": "http.response.body", "more_body": True, "body": b"".join(batch)})

            task = asyncio.ensure_future(pump())
            done, _ = await asyncio.wait({task, watch}, return_when=asyncio.FIRST_COMPLETED)
            if task not in done:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
                return 499
            task.result()
            await send({"type": "http.response.body", "body": b"", "more_body": False})
            return 200
        finally:
            watch.cancel()
            self.metrics.streams_open.dec()

    # -- helpers ---------------------------------------------------------------

    def _authorize(self, scope: Scope) -> str:
        """The request's owner (whose stored objects it sees), or the 401."""
        key = self._key(scope)
        if key is None:
            given = _bearer(scope)
            what = "Missing bearer token" if not given else "Incorrect API key provided"
            raise HTTPError(401, f"{what}: send 'Authorization: Bearer <key>'", code="invalid_api_key")
        return owner_of(key)

    def _authorized(self, scope: Scope) -> bool:
        return self._key(scope) is not None

    def _key(self, scope: Scope) -> str | None:
        """The API key the request carries when it is one of the gateway's ("" when the gateway has
        none), else None. Every key is compared, in constant time each."""
        keys = self.settings.keys
        if not keys:
            return ""
        given = _bearer(scope).encode("latin-1")
        found = None
        for key in keys:
            if hmac.compare_digest(given, key.encode("latin-1")):
                found = key
        return found

    async def _read_body(self, scope: Scope, receive: Receive) -> bytes:
        """The request's body; each piece of it must come within --body-timeout seconds."""
        limit = self.settings.max_body_bytes
        headers = dict(scope["headers"])
        declared = headers.get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            raise HTTPError(413, f"the request body is larger than {limit} bytes", code="request_too_large")
        chunks, size = [], 0
        while True:
            try:
                message = await asyncio.wait_for(receive(), self.settings.body_timeout)
            except asyncio.TimeoutError:
                raise HTTPError(408, "the request body did not arrive within "
                                     f"{self.settings.body_timeout:g} s", code="request_timeout") from None
            if message["type"] == "http.disconnect":
                raise HTTPError(400, "the client went away before sending the whole body")
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit:
                raise HTTPError(413, f"the request body is larger than {limit} bytes",
                                code="request_too_large")
            chunks.append(chunk)
            if not message.get("more_body"):
                break
        return b"".join(chunks)

    def _bound(self, size: int, kind: str) -> None:
        """Refuse, before any work, a body far larger than any prompt the engines' context holds
        (no tokenization packs more than ~64 bytes of a JSON body into one token but long runs
        of one repeated character)."""
        contexts = [e.info.context for e in self.upstream.engines if e.info and e.info.context]
        if contexts and size > max(contexts) * _BYTES_PER_TOKEN_BOUND:
            raise HTTPError(400, f"the request ({size} bytes) cannot fit the engine's context of "
                                 f"{max(contexts)} tokens", param=_PROMPT[kind],
                            code="context_length_exceeded")

    async def _call(self, call: Awaitable[Any], request: dict[str, Any]) -> Any:
        try:
            return await call
        except UpstreamError as e:
            raise HTTPError(e.status, e.message, code=e.code) from None
        except UpstreamRejected as e:
            raise HTTPError(400, f"the engine rejected the request: {e.message}",
                            code="upstream_rejected") from None
        except ContextExceeded as e:
            param = _PROMPT["chat" if "messages" in request else "responses"]
            raise HTTPError(400, e.message, param=param, code="context_length_exceeded") from None
        except RequestError as e:  # what this engine would refuse, caught before it is called
            raise HTTPError(400, e.message, param=e.param) from None

    def _latency(self, info: dict[str, Any], t0: float) -> None:
        seconds = time.perf_counter() - t0
        info["upstream_ms"] = round(seconds * 1000, 2)
        self.metrics.upstream_latency.observe(seconds)

    def _count(self, info: dict[str, Any], completion: int, harmony: list[dict[str, Any]]) -> None:
        info["completion_tokens"] = completion
        self.metrics.tokens.labels("out").inc(completion)
        kinds: dict[str, int] = {}
        for h in harmony:
            for r in h.get("repairs", []):
                kinds[r["kind"]] = kinds.get(r["kind"], 0) + 1
            for n in h.get("notes", []):
                self.metrics.notes.labels(n["kind"]).inc()
        for kind, count in kinds.items():
            self.metrics.repairs.labels(kind).inc(count)
        if kinds:
            info["repairs"] = kinds


class _EngineStep:
    """One engine stream as the agent loop reads it: output ids (the stop strings applied), then
    the engine's finish reason."""

    def __init__(self, batches: EngineStream, end: OutputEnd) -> None:
        self.batches, self.end = batches, end
        self.finish_reason = "stop"

    async def __aiter__(self) -> AsyncIterator[list[int]]:
        finish = "stop"
        async for batch in self.batches:
            ids: list[int] = []
            for piece in batch:
                got, _ = self.end.feed(piece.ids, piece.logprobs)
                ids += got
                if piece.finish_reason is not None:
                    finish = piece.finish_reason
            if ids:
                yield ids
        rest, _ = self.end.finish(ended=finish != "length")
        self.finish_reason = finish
        if rest:
            yield rest


_PROMPT = {"chat": "messages", "responses": "input"}  # the field a prompt that is too long is named by
IGNORED = "harmonykit.ignored_fields"  # where the request keeps the fields it came with that were ignored


def _note_ignored(request: dict[str, Any], harmony: list[dict[str, Any]]) -> None:
    """The ``ignored_field`` notes, in each choice's (or the response's) ``harmony`` field."""
    for name in request.get(IGNORED) or ():
        note = {"kind": "ignored_field", "detail": f"request field {name[:200]!r} is not known here; ignored",
                "text": ""}
        for h in harmony:
            h.setdefault("notes", []).append(note)


def _harmony_of(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The ``harmony`` fields of a stream's last events (the response's, or the choices')."""
    out = []
    for e in events:
        if isinstance(e.get("response"), dict) and isinstance(e["response"].get("harmony"), dict):
            out.append(e["response"]["harmony"])
        for choice in e.get("choices") or []:
            if isinstance(choice.get("harmony"), dict):
                out.append(choice["harmony"])
    return out


def _loggable(data: bytes) -> Any:
    """A request body as --log-content logs it: parsed, an MCP server's credentials left out;
    a body that is not JSON, its first 2,000 characters."""
    try:
        body = orjson.loads(data)
    except orjson.JSONDecodeError:
        return data[:2000].decode("utf-8", "replace")
    return _redacted(body) if isinstance(body, dict) else body


def _redacted(request: dict[str, Any]) -> dict[str, Any]:
    """The request as --log-content logs it: an MCP server's credentials left out."""
    tools = request.get("tools")
    if not isinstance(tools, list) or not mcp_specs(request):
        return request

    def hide(t: Any) -> Any:
        if not isinstance(t, dict) or t.get("type") != "mcp":
            return t
        return {k: "(redacted)" if k in ("headers", "authorization") else v for k, v in t.items()}

    return {**request, "tools": [hide(t) for t in tools]}


def _chain(request: dict[str, Any]) -> str | None:
    """What the response continues: its conversation, else its previous response."""
    chain = request.get("previous_response_id")
    conversation = request.get("conversation")
    if conversation is not None:
        chain = conversation.get("id") if isinstance(conversation, dict) else conversation
    return chain if isinstance(chain, str) else None


def _conversation_id(request: dict[str, Any]) -> str | None:
    c = request.get("conversation")
    cid = c.get("id") if isinstance(c, dict) else c
    return cid if isinstance(cid, str) else None


def _bearer(scope: Scope) -> str:
    auth = dict(scope["headers"]).get(b"authorization", b"").decode("latin-1")
    return auth[7:] if auth.lower().startswith("bearer ") else ""


def _log_line(info: dict[str, Any]) -> str:
    """One JSON log line, whatever the request held: a body orjson cannot write (nested past 255
    levels, say) is left out and said so, and an error message is cut to a readable length."""
    if isinstance(info.get("error"), str) and len(info["error"]) > 500:
        info["error"] = info["error"][:500] + "..."
    try:
        return orjson.dumps(info).decode()
    except (TypeError, orjson.JSONEncodeError):
        info["request"] = "(not logged: it cannot be written as JSON, e.g. nested too deep)"
        return orjson.dumps(info, default=str).decode()


def _parse(data: bytes, loads: Callable[[bytes], Any] = orjson.loads) -> Any:
    try:
        return loads(data)
    except orjson.JSONDecodeError as e:
        raise HTTPError(400, f"the body is not valid JSON: {e}", code="invalid_json") from None


_RENDER: dict[str, Callable[..., Any]] = {"chat": render_chat_request, "responses": render_responses_request}


def _forces_a_call(request: dict[str, Any]) -> bool:
    choice = request.get("tool_choice")
    return choice == "required" or isinstance(choice, dict)


def _check_tool_choice(problem: str | None) -> None:
    """Without a grammar nothing can make the model call a tool: say so rather than ignore it."""
    if problem is not None:
        raise RequestError("tool_choice", "tool_choice 'required' or a named function needs guided decoding "
                                          f"to be honoured, which {problem}; use vLLM 0.11+ or SGLang, or "
                                          "send tool_choice 'auto'")


def _feed(out: ChatCompletionStream | ResponsesStream, ids: list[int],
          lps: list[dict[str, Any]]) -> list[dict[str, Any]]:
    if lps and isinstance(out, ChatCompletionStream):
        return out.feed_logprobs(ids, lps)
    return out.feed(ids)


def _frame(event: dict[str, Any], kind: str) -> bytes:
    return sse(event, event["type"]) if kind == "responses" else sse(event)


async def _disconnected(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


_json_response = json_response


def _error_frame(e: HTTPError) -> bytes:
    return sse({"type": "error", "code": e.code, "message": e.message, "param": e.param}, "error")


def create_app(settings: Settings, *, upstream: Upstream | None = None) -> Gateway:
    """The gateway for ``settings``; tests inject ``upstream``."""
    return Gateway(settings, upstream=upstream)
