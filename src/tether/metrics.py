"""Operator metrics for one server: turns, leases, heartbeats, followers, stores.

Each ``TetherMetrics`` owns its own ``CollectorRegistry``: two apps built in one
process (tests do this, so do embedders) must not share, or collide on, the
process-wide default registry. ``GET /metrics`` renders the app's registry.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import contextmanager
from datetime import datetime
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST as CONTENT_TYPE
from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    ProcessCollector,
    generate_latest,
)
from prometheus_client.metrics_core import Metric

from tether.runtime.lease import Takeover
from tether.runtime.live_buffer import StreamEnd, StreamEvent

__all__ = ["CONTENT_TYPE", "TetherMetrics", "backend_name"]

# Heartbeats are due every second: the interesting range is a few milliseconds
# (healthy) up to the dead threshold (3 s), past which other replicas may take over.
_HEARTBEAT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 3.0, 5.0)
_LAG_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
_STORE_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
# From a dead verdict to the taker's first new content: the target is under a
# second; a client's resume waits on the client, so the range runs to a minute.
_TAKEOVER_BUCKETS = (0.1, 0.25, 0.5, 0.75, 1.0, 1.5, 2.5, 5.0, 10.0, 30.0, 60.0)
# From a producer's start to its first content: a model's first token takes from a
# fraction of a second to tens of seconds behind a tool call or a slow provider.
_FIRST_CONTENT_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 15.0, 30.0, 60.0)
# Requests: probes in milliseconds, a streamed turn for as long as its answer.
_HTTP_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)
_SIZE_BUCKETS = (256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304)

# How a turn's end reads to an operator; "dead" and "gone" are turns this
# replica gave up (handed off on drain, shut down, or taken over elsewhere).
_ENDED = {"done": "completed", "errored": "errored", "cancelled": "cancelled"}


def backend_name(store: object) -> str:
    """A short backend label (``sqlite``, ``postgres``, ``redis``, ``file``, ``memory``)."""
    kind = type(store)
    if kind.__name__.startswith("InMemory"):
        return "memory"
    if kind.__name__.startswith("LocalFile"):
        return "file"
    parts = kind.__module__.split(".")
    if len(parts) > 2 and parts[:2] == ["tether", "adapters"]:
        return parts[2]
    return kind.__name__


class TetherMetrics:
    """The metrics of one app, registered in their own registry."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        self.turns_started = Counter(
            "tether_turns_started",
            "Turns this replica started producing, resumes included",
            registry=r,
        )
        self.turns_completed = Counter(
            "tether_turns_completed", "Turns that ended done on this replica", registry=r
        )
        self.turns_errored = Counter(
            "tether_turns_errored", "Turns that ended with an error on this replica", registry=r
        )
        self.turns_cancelled = Counter(
            "tether_turns_cancelled", "Turns cancelled while this replica produced them", registry=r
        )
        self.turns_abandoned = Counter(
            "tether_turns_abandoned",
            "Turns this replica stopped producing without a verdict (drain, shutdown, takeover)",
            registry=r,
        )
        self.turns_resumed = Counter(
            "tether_turns_resumed", "Dead turns this replica resumed", registry=r
        )
        self.turns_in_flight = Gauge(
            "tether_turns_in_flight", "Turns this replica is producing now", registry=r
        )
        self.takeovers = Counter(
            "tether_takeovers",
            "Leases claimed from a dead producer, by cause: automatic (a replica's takeover "
            "loop), client (a client's resume), drain_handoff (a drained replica's turn)",
            ["cause"],
            registry=r,
        )
        self.takeover_first_content_seconds = Histogram(
            "tether_takeover_first_content_seconds",
            "Time from a turn reading dead (or being handed off) to the first new content "
            "of the replica that took it over, by the store's clock",
            ["cause"],
            buckets=_TAKEOVER_BUCKETS,
            registry=r,
        )
        self.turns_reaped = Counter(
            "tether_turns_reaped",
            "Dead turns this replica ended errored instead (PRODUCER_LOST, TAKEOVER_LIMIT)",
            ["code"],
            registry=r,
        )
        self.presence_tests = Counter(
            "tether_presence_tests",
            "Presence-lock tests of the producers of rows not renewed for half a heartbeat "
            "interval, by verdict: gone (the lock was free: their turns read dead at once) "
            "or held (alive, if slow: their turns read dead only past the dead threshold)",
            ["verdict"],
            registry=r,
        )
        self.presence_changes = Counter(
            "tether_presence_changes",
            "Times this replica's presence id changed after start-up: its presence lock "
            "was lost with its connection (a database restart, a network reset), and "
            "held again under a new id or, while the database is out of reach, not "
            "held at all; or it was first held after failing at start-up",
            registry=r,
        )
        self.fencing_rejections = Counter(
            "tether_fencing_rejections",
            "Turns stopped because a guarded write was refused (lease lost: takeover, cancel)",
            registry=r,
        )
        self.heartbeat_batch_seconds = Histogram(
            "tether_heartbeat_batch_seconds",
            "Duration of one heartbeat batch; near or past the interval means late heartbeats",
            buckets=_HEARTBEAT_BUCKETS,
            registry=r,
        )
        self.follower_lag_seconds = Histogram(
            "tether_follower_lag_seconds",
            "Time from publishing an event to handing it to a reader attached on this replica",
            buckets=_LAG_BUCKETS,
            registry=r,
        )
        self.store_operation_seconds = Histogram(
            "tether_store_operation_seconds",
            "Latency of the stores' hot-path operations",
            ["store", "backend", "operation"],
            buckets=_STORE_BUCKETS,
            registry=r,
        )
        self.turn_first_content_seconds = Histogram(
            "tether_turn_first_content_seconds",
            "Time from a producer starting a turn to the first content it shows, by agent "
            "(a resumed turn's first content past what its clients saw)",
            ["agent"],
            buckets=_FIRST_CONTENT_BUCKETS,
            registry=r,
        )
        self.model_tokens = Counter(
            "tether_model_tokens",
            "Tokens of model calls, by agent and direction (input: the prompt, output: "
            "the completion), where the model reports them",
            ["agent", "direction"],
            registry=r,
        )
        self.http_request_seconds = Histogram(
            "tether_http_request_seconds",
            "Duration of HTTP requests, from the request to the end of the response (a "
            "stream's whole length), by method, route template and status",
            ["method", "route", "status"],
            buckets=_HTTP_BUCKETS,
            registry=r,
        )
        # CPU, memory, open descriptors, start time of this process (Linux).
        ProcessCollector(registry=r)
        self.checkpoint_bytes = Histogram(
            "tether_checkpoint_bytes",
            "Size of an agent state checkpoint, as JSON",
            buckets=_SIZE_BUCKETS,
            registry=r,
        )

    # ------------------------------------------------------------- turns

    def turn_started(self, takeover: Takeover | None = None) -> None:
        """A turn started producing here; ``takeover`` when it was resumed."""
        self.turns_started.inc()
        self.turns_in_flight.inc()
        if takeover is not None:
            # A resume claims the lease of a dead producer: that is the takeover.
            self.turns_resumed.inc()
            self.takeovers.labels(takeover.cause.value).inc()

    def takeover_produced(self, takeover: Takeover, now: datetime) -> None:
        """A taken-over turn showed its first new content at ``now`` (store clock)."""
        seconds = (now - takeover.dead_since).total_seconds()
        self.takeover_first_content_seconds.labels(takeover.cause.value).observe(max(seconds, 0.0))

    def turn_ended(self, end: StreamEnd | None, *, lease_lost: bool) -> None:
        self.turns_in_flight.dec()
        reason = end.reason if end is not None else "dead"
        counter = _ENDED.get(reason)
        if counter is None:
            self.turns_abandoned.inc()
        else:
            getattr(self, f"turns_{counter}").inc()
        # "gone" is what a fenced producer tells its readers; a cancel from
        # another replica also reaches the producer as a refused heartbeat.
        if reason == "gone" or (reason == "cancelled" and lease_lost):
            self.fencing_rejections.inc()

    def first_content(self, agent: str, seconds: float) -> None:
        self.turn_first_content_seconds.labels(agent).observe(max(seconds, 0.0))

    def tokens_used(
        self, agent: str, *, input_tokens: int | None, output_tokens: int | None
    ) -> None:
        if input_tokens:
            self.model_tokens.labels(agent, "input").inc(input_tokens)
        if output_tokens:
            self.model_tokens.labels(agent, "output").inc(output_tokens)

    # ----------------------------------------------------- stores and timing

    def heartbeat_observer(self, store: object) -> Callable[[float], None]:
        """What the heartbeat batcher calls with each batch's duration: that is
        both the heartbeat's lateness and the supervision store's batch latency."""
        latency = self.store_operation_seconds.labels(
            "supervision", backend_name(store), "compare_and_swap_many"
        )

        def observe(seconds: float) -> None:
            self.heartbeat_batch_seconds.observe(seconds)
            latency.observe(seconds)

        return observe

    @contextmanager
    def timed(self, store_name: str, store: object, operation: str) -> Iterator[None]:
        """Time one store call (observed on success and on failure alike)."""
        started = time.perf_counter()
        try:
            yield
        finally:
            self.store_operation_seconds.labels(store_name, backend_name(store), operation).observe(
                time.perf_counter() - started
            )

    def observe_checkpoint(self, state: dict[str, Any]) -> None:
        # Serialized again only to measure it: one extra dumps every few seconds
        # per turn is cheap next to the store write it accompanies.
        self.checkpoint_bytes.observe(len(json.dumps(state, default=str).encode()))

    async def lagged(
        self, events: AsyncIterator[StreamEvent | StreamEnd]
    ) -> AsyncIterator[StreamEvent | StreamEnd]:
        """Pass a local reader's events on, observing publish-to-reader lag.

        Events published before the reader attached are a replay, not lag; only
        those published while it was attached are observed."""
        attached = time.monotonic()
        async for item in events:
            if isinstance(item, StreamEvent) and item.published_at >= attached:
                self.follower_lag_seconds.observe(time.monotonic() - item.published_at)
            yield item

    def render(self) -> bytes:
        return generate_latest(_WithoutCreated(self.registry))


class _WithoutCreated:
    """The registry, less the ``*_created`` series (a timestamp per counter and
    histogram, noise on a dashboard). prometheus-client only offers to drop them
    process-wide (``disable_created_metrics``), which would change what every
    other registry of an embedding application exports; this leaves those alone."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self._registry = registry

    def collect(self) -> Iterator[Metric]:
        # ``collect`` builds new families on every call: trimming them is safe.
        for family in self._registry.collect():
            family.samples = [s for s in family.samples if not s.name.endswith("_created")]
            yield family
