"""Every tunable of the runtime in one place, with the timing contract's defaults."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, fields
from datetime import timedelta

_AGE = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([smhdw]?)\s*")
_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400, "": 86400}


def parse_age(text: str) -> timedelta:
    """``30d``, ``12h``, ``90m``, ``45s``, ``2w``; a bare number is days.

    How operators write a retention age, for ``TETHER_RETENTION`` and for
    ``tether db prune --older-than`` alike."""
    match = _AGE.fullmatch(text)
    if match is None or float(match.group(1)) <= 0:
        raise ValueError(f"{text!r} is not an age such as 30d, 12h or 90m")
    return timedelta(seconds=float(match.group(1)) * _UNIT_SECONDS[match.group(2)])


@dataclass(frozen=True)
class TetherSettings:
    """Defaults are design §4's timing contract; tests shorten them, operators may too.

    All durations are in seconds.
    """

    heartbeat_interval: float = 1.0
    """How often the owning replica stamps its RUNNING heartbeat."""
    dead_after: float = 3.0
    """A RUNNING row whose heartbeat is older than this is a dead producer."""
    recording_flush_interval: float = 0.5
    """The pause before a recording batch that met a store outage is sent again.
    Otherwise there is no interval: a turn's new message is recorded at once, in
    the replica's next batch, and shown to readers once recorded
    (``tether.runtime.recording_flusher``)."""
    checkpoint_interval: float = 5.0
    """Resumable dependencies are checkpointed this often during a stateful turn."""
    follower_poll_interval: float = 0.1
    """A follower on another replica polls this often when it has no push channel."""
    follower_push_fallback_interval: float = 1.0
    """With a push channel, a follower still re-reads this often (a dead producer
    sends no notification)."""
    takeover: bool = True
    """Replicas take over dead stateful turns by themselves, with no client
    (``tether.handlers.takeover``); off, a dead turn waits for a client's
    resume. Either way, a dead turn that cannot be resumed ends errored
    ``PRODUCER_LOST``."""
    presence: bool = True
    """Each replica holds a presence lock where the supervision store has one
    (``tether.runtime.presence``), so a killed replica's turns read dead at
    once instead of after ``dead_after``; off, they read dead by age alone."""
    takeover_limit: int = 3
    """A turn taken over this many times whose producer died again ends errored
    ``TAKEOVER_LIMIT`` (an agent that kills its replica)."""
    takeover_scan_interval: float = 0.25
    """How often each replica looks for dead turns (one indexed query): on
    average half of it passes between a turn reading dead and its takeover."""
    delta_window: float = 0.02
    """Where the stores have a push channel, a producer publishes a watched turn's
    recorded messages to followers on other replicas at once, one batch at a
    time; a batch that takes longer than this to publish is followed by a pause
    as long (back-pressure), in which the next one accumulates."""
    max_turn_events: int = 10_000
    """A turn that yields more messages than this ends errored (TURN_TOO_LONG)."""
    max_turn_seconds: float = 900.0
    """A turn running longer than this ends errored (TURN_TIMEOUT)."""
    finished_turn_grace: float = 60.0
    """How long a finished turn stays attachable before its rows are cleaned up."""
    drain_grace: float = 2.0
    """On SIGTERM, running turns get this long to finish before they are
    checkpointed and handed off (their rows read as dead at once)."""
    drain_timeout: float = 10.0
    """The drain (its grace included) is over this long after SIGTERM whatever
    the agents do: a turn whose agent has not stopped by then (it swallowed its
    cancellation) is handed off without it (``tether.api.signal_drain``)."""
    max_body_bytes: int = 1_000_000
    """Request bodies over this size are refused with 413."""
    max_header_bytes: int = 16_384
    """A request head (request line and headers) over this size is refused
    with 431; while it arrives, no more than this is buffered."""
    header_timeout: float = 10.0
    """A connection must deliver a request's head within this long of opening,
    or of the previous response: else it is answered 408 and closed (a client
    that trickles its headers, or connects and sends nothing)."""
    body_timeout: float = 30.0
    """A request body must arrive whole within this long of its head: else it
    is answered 408 and the connection closed (a body sent a byte a second)."""
    idle_timeout: float = 5.0
    """A kept-alive connection with no request for this long is closed."""
    max_turns_per_requester: int = 8
    """Turns one requester may run at once on one replica; a new turn over it
    is refused 429 ``TOO_MANY_TURNS`` (0: no limit). See ``tether.handlers.limits``."""
    max_turns_per_tenant: int = 64
    """Turns one tenant may run at once on one replica, likewise (0: no limit)."""
    max_queued_turns: int = 16
    """Messages that may wait in one conversation's queue (``enqueue``); one
    more is refused 429 ``QUEUE_FULL`` (0: no limit)."""
    limit_retry_after: int = 5
    """The ``Retry-After`` (seconds) of a 429 from the limits above."""
    retention: float | None = None
    """Conversations not updated for this long are erased, with everything they
    own, by one replica at a time (``TETHER_RETENTION``, an age such as ``30d``;
    unset: never). See ``tether.handlers.retention``."""
    retention_interval: float = 3600.0
    """How often a replica tries to run retention; one run per interval across
    all replicas (``TETHER_RETENTION_INTERVAL``)."""
    clock_skew: float = 0.0
    """For tests only (``TETHER_CLOCK_SKEW``): seconds added to this replica's
    local clock, before the store's clock corrects it (``tether.runtime.clock``)."""

    def __post_init__(self) -> None:
        for name in ("max_header_bytes", "header_timeout", "body_timeout", "idle_timeout"):
            if getattr(self, name) <= 0:
                raise ValueError(
                    f"TETHER_{name.upper()} must be positive, not {getattr(self, name)}"
                )
        for name in ("max_turns_per_requester", "max_turns_per_tenant", "max_queued_turns"):
            if getattr(self, name) < 0:
                raise ValueError(
                    f"TETHER_{name.upper()} must be 0 (no limit) or more, not {getattr(self, name)}"
                )
        if self.limit_retry_after < 1:
            raise ValueError(
                f"TETHER_LIMIT_RETRY_AFTER must be 1 or more, not {self.limit_retry_after}"
            )
        if self.retention is not None and self.retention <= 0:
            raise ValueError(f"TETHER_RETENTION must be positive, not {self.retention}")
        if self.retention_interval <= 0:
            raise ValueError(
                f"TETHER_RETENTION_INTERVAL must be positive, not {self.retention_interval}"
            )


def settings_from_env(environ: Mapping[str, str] | None = None) -> TetherSettings:
    """Settings with any ``TETHER_<FIELD>`` environment variable applied
    (for example ``TETHER_HEARTBEAT_INTERVAL=0.5``). ``TETHER_RETENTION`` is an
    age read by ``parse_age`` (``30d``); empty, it is unset."""
    environ = os.environ if environ is None else environ
    values: dict[str, float | int | bool] = {}
    for item in fields(TetherSettings):
        raw = environ.get(f"TETHER_{item.name.upper()}")
        if raw is None:
            continue
        if item.name == "retention":
            if raw.strip():
                try:
                    values[item.name] = parse_age(raw).total_seconds()
                except ValueError as error:
                    raise ValueError(f"TETHER_RETENTION: {error}") from None
            continue
        if item.type in ("bool", bool):
            word = raw.strip().lower()
            if word not in ("1", "true", "yes", "on", "0", "false", "no", "off"):
                raise ValueError(f"TETHER_{item.name.upper()}={raw!r} is not true or false")
            values[item.name] = word in ("1", "true", "yes", "on")
            continue
        try:
            values[item.name] = int(raw) if item.type in ("int", int) else float(raw)
        except ValueError:
            raise ValueError(f"TETHER_{item.name.upper()}={raw!r} is not a number") from None
    return TetherSettings(**values)  # type: ignore[arg-type]
