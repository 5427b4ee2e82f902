"""Prometheus metrics of one gateway (its own registry, so several apps can live in a process)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST


class Metrics:
    """Requests by endpoint and status, repairs by kind, upstream latency, tokens, open streams."""

    content_type = CONTENT_TYPE_LATEST

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter("harmonykit_requests", "Requests by endpoint and HTTP status",
                                ["endpoint", "status"], registry=r)
        self.repairs = Counter("harmonykit_repairs", "Repairs made to model output, by kind", ["kind"],
                               registry=r)
        self.notes = Counter("harmonykit_notes", "What the OpenAI mapping set aside or moved, by kind",
                             ["kind"], registry=r)
        self.upstream_latency = Histogram(
            "harmonykit_upstream_latency_seconds", "Time until the engine answered (first byte of a stream)",
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120), registry=r)
        self.tokens = Counter("harmonykit_tokens", "Tokens: prompt (in) and completion (out)", ["direction"],
                              registry=r)
        self.streams_open = Gauge("harmonykit_streams_open", "Streaming responses in progress", registry=r)

    def render(self) -> bytes:
        return generate_latest(self.registry)
