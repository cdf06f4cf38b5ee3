"""Every tunable of the runtime in one place, with the timing contract's defaults."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, fields


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
    """The producer flushes the newest cumulative message at most this often."""
    checkpoint_interval: float = 5.0
    """Resumable dependencies are checkpointed this often during a stateful turn."""
    follower_poll_interval: float = 0.2
    """A follower on another replica polls this often when it has no push channel."""
    follower_push_fallback_interval: float = 1.0
    """With a push channel, a follower still re-reads this often (a dead producer
    sends no notification)."""
    follower_pace_interval: float = 0.05
    """A follower paces new content out in steps this far apart, not one jump per flush."""
    max_turn_events: int = 10_000
    """A turn that yields more messages than this ends errored (TURN_TOO_LONG)."""
    max_turn_seconds: float = 900.0
    """A turn running longer than this ends errored (TURN_TIMEOUT)."""
    finished_turn_grace: float = 60.0
    """How long a finished turn stays attachable before its rows are cleaned up."""
    drain_grace: float = 2.0
    """On SIGTERM, running turns get this long to finish before they are
    checkpointed and handed off (their rows read as dead at once)."""
    max_body_bytes: int = 1_000_000
    """Request bodies over this size are refused with 413."""


def settings_from_env(environ: Mapping[str, str] | None = None) -> TetherSettings:
    """Settings with any ``TETHER_<FIELD>`` environment variable applied
    (for example ``TETHER_HEARTBEAT_INTERVAL=0.5``)."""
    environ = os.environ if environ is None else environ
    values: dict[str, float | int] = {}
    for item in fields(TetherSettings):
        raw = environ.get(f"TETHER_{item.name.upper()}")
        if raw is None:
            continue
        try:
            values[item.name] = int(raw) if item.type in ("int", int) else float(raw)
        except ValueError:
            raise ValueError(f"TETHER_{item.name.upper()}={raw!r} is not a number") from None
    return TetherSettings(**values)  # type: ignore[arg-type]
