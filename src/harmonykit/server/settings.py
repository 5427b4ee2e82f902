"""The gateway's settings: one frozen dataclass from flags, then ``HARMONYKIT_*`` variables,
then defaults."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, fields
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
    api_key: str | None = None
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
        if self.api_key is not None and not self.api_key:
            raise ValueError("--api-key is empty, which would turn authentication off: give a key, or leave "
                             "the option (and HARMONYKIT_API_KEY) unset to run without one")
        if self.api_key is not None and (not self.api_key.isascii() or not self.api_key.isprintable()):
            raise ValueError("--api-key must be printable ASCII: HTTP headers cannot carry other characters, "
                             "so no client could ever send it")
        for name in ("body_timeout", "header_timeout"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if self.render_cache_mb < 0:
            raise ValueError(f"render_cache_mb must be 0 (off) or more, got {self.render_cache_mb}")
        if self.upstream_timeout <= 0:
            raise ValueError(f"upstream_timeout must be positive, got {self.upstream_timeout}")

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
        if "upstream" in values:
            values["upstream"] = tuple(u.rstrip("/") for u in values["upstream"])
        return cls(**values)


def _parse(name: str, raw: str) -> Any:
    kinds = {"port": int, "max_concurrency": int, "max_body_bytes": int, "upstream_timeout": float,
             "health_interval": float, "max_tokens_default": int, "body_timeout": float,
             "header_timeout": float, "render_cache_mb": int}
    if name == "upstream":
        return [u.strip() for u in raw.split(",") if u.strip()]
    if name == "log_content":
        return raw.strip().lower() in ("1", "true", "yes", "on")
    if name in kinds:
        try:
            return kinds[name](raw)
        except ValueError:
            raise ValueError(f"{ENV_PREFIX}{name.upper()}={raw!r} is not a number") from None
    return raw
