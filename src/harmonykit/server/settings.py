"""The gateway's settings: one frozen dataclass from flags, then ``HARMONYKIT_*`` variables,
then defaults."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from functools import cached_property
from pathlib import Path
from typing import Any

from .engines import PROFILES

ENV_PREFIX = "HARMONYKIT_"


@dataclass(frozen=True)
class Settings:
    """What ``harmonykit serve`` runs with; each field also from ``HARMONYKIT_<NAME>``.

    >>> Settings.from_sources({"upstream": ["http://127.0.0.1:8001"]}, {"HARMONYKIT_PORT": "9000"}).port
    9000
    """

    upstream: tuple[str, ...] = ()
    upstream_model: str | None = None
    host: str = "127.0.0.1"
    port: int = 8000
    # one key, or several (--api-key repeated, or --api-keys-file): each key sees only what it stored
    api_key: str | tuple[str, ...] | None = None
    api_keys_file: str | None = None
    upstream_timeout: float = 600.0
    max_concurrency: int = 512
    max_body_bytes: int = 16 * 1024 * 1024
    log_content: bool = False
    body_timeout: float = 30.0  # each piece of a request body must arrive within this (else 408)
    header_timeout: float = 10.0  # a request's headers must arrive within this (else the socket is closed)
    health_interval: float = 5.0
    guided: str | None = None  # ask the engine to constrain generation: vllm or sglang
    engine: str | None = None  # vllm, sglang or llamacpp; None: recognised from /v1/models
    # the limit sent when neither the client nor the engine's context gives one
    max_tokens_default: int = 4096
    # megabytes of rendered conversation messages kept for the next request (0: off)
    render_cache_mb: int = 64
    # where responses and conversations are kept: sqlite:///PATH, postgresql://..., or none
    # (None: a SQLite file under the user's data directory)
    store: str | None = None
    store_ttl: float = 30 * 86400.0  # seconds an object is kept after its last change
    store_lease: float = 15.0  # seconds a gateway vouches for a response it generates, renewed
    store_timeout: float = 10.0  # seconds a store call may take before the request is a 503
    # gpt-oss's built-in tools, run by the gateway (off unless enabled)
    python: bool = False  # the python tool (Responses' code_interpreter), in a sandbox
    python_timeout: float = 120.0  # seconds a cell may run
    python_memory_mb: int = 1024  # address space of a container's interpreter
    python_procs: int = 64  # processes and threads a container may have
    python_sandbox: str = "bwrap"  # bwrap, or none (no isolation: only when asked for by name)
    browser: str | None = None  # the browser tool's search backend: searxng=URL, exa, youcom, index=PATH
    fetch_allow: tuple[str, ...] = ()  # address ranges the browser may open despite the SSRF rules
    mcp: bool = False  # Responses' mcp tools: the gateway reaches the MCP servers requests name
    mcp_server: tuple[str, ...] = ()  # when given, the only server URLs (prefixes) requests may name
    mcp_timeout: float = 60.0  # seconds an MCP tool call may take
    # seals reasoning.encrypted_content (base64 of 32 bytes; replicas share it); None: one kept in
    # the data directory
    state_key: str | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if not self.upstream:
            raise ValueError("no upstream engine: give --upstream URL (or HARMONYKIT_UPSTREAM), "
                             "e.g. --upstream http://127.0.0.1:8001")
        for url in self.upstream:
            if not url.startswith(("http://", "https://")):
                raise ValueError(f"upstream {url!r} is not an http(s) URL")
        for name in ("port", "max_concurrency", "max_body_bytes", "max_tokens_default"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        if self.guided is not None and self.guided not in PROFILES:
            raise ValueError(f"guided must be vllm or sglang, got {self.guided!r}")
        if self.guided is not None and PROFILES[self.guided].guided:
            raise ValueError(f"--guided {self.guided} cannot work: {PROFILES[self.guided].guided}")
        if self.engine is not None and self.engine not in PROFILES:
            raise ValueError(f"engine must be one of {', '.join(PROFILES)}, got {self.engine!r}")
        for key in self.keys:
            if not key:
                raise ValueError("--api-key is empty, which would turn authentication off: give a key, or "
                                 "leave the option (and HARMONYKIT_API_KEY) unset to run without one")
            if not key.isascii() or not key.isprintable():
                raise ValueError("--api-key must be printable ASCII: HTTP headers cannot carry other "
                                 "characters, so no client could ever send it")
        if self.store is not None:
            from ..store import check_store_url

            check_store_url(self.store)
        for name in ("store_ttl", "store_lease", "store_timeout"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        for name in ("body_timeout", "header_timeout"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if self.render_cache_mb < 0:
            raise ValueError(f"render_cache_mb must be 0 (off) or more, got {self.render_cache_mb}")
        if self.upstream_timeout <= 0:
            raise ValueError(f"upstream_timeout must be positive, got {self.upstream_timeout}")
        for name in ("python_timeout", "python_memory_mb", "python_procs", "mcp_timeout"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if self.state_key is not None:
            from .sealed import state_key

            state_key(self.state_key, Path("."))  # checked now: a bad key stops the gateway at startup
        if self.python_sandbox not in ("bwrap", "none"):
            raise ValueError(f"python_sandbox must be bwrap or none, got {self.python_sandbox!r}")
        from ..tools.net import parse_allow

        parse_allow(self.fetch_allow)

    @cached_property
    def keys(self) -> tuple[str, ...]:
        """Every API key the gateway accepts (none: no authentication)."""
        given = (self.api_key,) if isinstance(self.api_key, str) else tuple(self.api_key or ())
        if self.api_keys_file is None:
            return given
        try:
            text = open(self.api_keys_file, encoding="utf-8").read()
        except OSError as e:
            raise ValueError(f"--api-keys-file {self.api_keys_file!r} cannot be read: {e.strerror}") from None
        lines = [line.strip() for line in text.splitlines()]
        return given + tuple(line for line in lines if line and not line.startswith("#"))

    @property
    def sandbox(self) -> Any:
        """The python tool's sandbox (None: the tool is off)."""
        if not self.python:
            return None
        from ..tools.python import Sandbox

        return Sandbox(timeout=self.python_timeout, memory=self.python_memory_mb << 20,
                       procs=self.python_procs, isolation=self.python_sandbox)

    @property
    def store_url(self) -> str:
        from ..store import default_store_url

        return self.store or default_store_url()

    @classmethod
    def from_sources(cls, flags: Mapping[str, Any], env: Mapping[str, str] | None = None) -> Settings:
        """Flags that were given win over ``HARMONYKIT_*`` variables, which win over defaults."""
        env = os.environ if env is None else env
        values: dict[str, Any] = {}
        for f in fields(cls):
            given = flags.get(f.name)
            if given is not None and given != [] and given is not False:
                values[f.name] = given
                continue
            raw = env.get(ENV_PREFIX + f.name.upper())
            if raw is not None and (raw != "" or f.name == "api_key"):  # an empty key is refused, not ignored
                values[f.name] = _parse(f.name, raw)
        if isinstance(values.get("api_key"), list):
            values["api_key"] = tuple(values["api_key"])
        if "upstream" in values:
            values["upstream"] = tuple(u.rstrip("/") for u in values["upstream"])
        for name in ("fetch_allow", "mcp_server"):
            if name in values:
                values[name] = tuple(values[name])
        return cls(**values)


def duration(raw: str) -> float:
    """Seconds from ``90``, ``90s``, ``15m``, ``12h`` or ``30d``.

    >>> duration("30d"), duration("1.5h"), duration("20")
    (2592000.0, 5400.0, 20.0)
    """
    text = raw.strip().lower()
    scale = {"s": 1, "m": 60, "h": 3600, "d": 86400}.get(text[-1:], None)
    number = text[:-1] if scale is not None else text
    try:
        value = float(number) * (scale or 1)
    except ValueError:
        raise ValueError(f"{raw!r} is not a duration: give seconds, or a number with s, m, h or d "
                         "(e.g. 30d)") from None
    if value <= 0:
        raise ValueError(f"{raw!r} is not a positive duration")
    return value


def _parse(name: str, raw: str) -> Any:
    kinds: dict[str, Callable[[str], Any]] = {
        "port": int, "max_concurrency": int, "max_body_bytes": int, "upstream_timeout": float,
        "health_interval": float, "max_tokens_default": int, "body_timeout": float,
        "header_timeout": float, "render_cache_mb": int, "store_ttl": duration,
        "store_lease": float, "store_timeout": float, "python_timeout": float, "python_memory_mb": int,
        "python_procs": int, "mcp_timeout": float}
    if name in ("upstream", "fetch_allow", "mcp_server"):
        return [u.strip() for u in raw.split(",") if u.strip()]
    if name in ("log_content", "python", "mcp"):
        return raw.strip().lower() in ("1", "true", "yes", "on")
    if name in kinds:
        try:
            return kinds[name](raw)
        except ValueError as e:
            what = str(e) if name == "store_ttl" else "is not a number"
            raise ValueError(f"{ENV_PREFIX}{name.upper()}={raw!r}: {what}") from None
    return raw
