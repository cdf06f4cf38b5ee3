"""Cross-replica lag and cancel, end to end: two real ``tether serve`` processes.

Both replicas share one store set (file and SQLite: one path on this host;
PostgreSQL: one database; Redis: one key prefix). Replica A produces every
turn; a direct reader POSTs ``/chat/stream`` there, and once the turn has
started a follower attaches to it through replica B (``GET
/chat/stream/{message_id}``), which has no producer of its own and follows
from the stores. Every event's arrival is stamped with this process's
monotonic clock, so both readers are timed by one clock.

- Text lag: for each index the direct reader saw after the follower's first
  event, when the follower first showed that text (or a longer text that
  starts with it) minus when the direct reader saw it. Indexes up to the
  follower's first one are left out: the follower attached after them, and
  its first event holds the whole answer so far by design.
- Indexes missed: indexes the direct reader saw after the follower's first
  event that the follower never saw; texts never shown; follower texts that
  are not a prefix of the direct reader's final answer (must be 0).
- End lag: the follower's end (its ``stream_status``, else the close of its
  stream) minus the direct reader's.
- Cancel: separate turns on A, cancelled by a ``DELETE`` sent to B (cross) or
  to A itself (same replica, the baseline); time from the ``DELETE`` answer to
  the last event the direct reader on A receives.

The replicas are the crash test's (``tether.crashtest.cluster``) and the
readers its SSE readers (``tether.crashtest.reader``).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import shutil
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench._backends import backend_url
from bench._stats import summary
from tether.cli.server_app import example_project_dir
from tether.crashtest.client import TetherAPI
from tether.crashtest.cluster import Cluster, Replica
from tether.crashtest.reader import Received, TurnReader
from tether.runtime.follower import has_deltas, has_push
from tether.stores import compose

BACKENDS = ("postgres", "redis", "sqlite", "file")
"""The default backends; ``postgres+redis`` (PostgreSQL, streams on Redis) works too."""

AGENT = "bench-stream"
PROMPT = "Tell me about rivers and the towns along them."
# How long one stream may take before the run gives up on it.
_STREAM_WITHIN = 120.0

# Targets of issue 11, for the "meets target" columns.
LAG_P50_TARGET_MS = 50.0
LAG_P99_TARGET_MS = 150.0
END_LAG_TARGET_MS = 100.0
CANCEL_PUSH_TARGET_MS = 100.0
CANCEL_POLL_TARGET_MS = 1200.0


@dataclass(frozen=True)
class Pace:
    """The offline model's pacing: token-sized deltas over a few seconds."""

    chunk_size: int = 1
    chunks_per_second: float = 50.0
    answer_chunks: int = 200

    def llm(self) -> dict[str, Any]:
        return {
            "seed": 5,
            "chunk_size": self.chunk_size,
            "chunks_per_second": self.chunks_per_second,
            "answer_chunks": self.answer_chunks,
        }


def write_project(directory: Path, pace: Pace) -> Path:
    """The example project's agents, with one setup: ``bench-stream``, the
    long writer on the offline model at ``pace``, no tool call."""
    shutil.copytree(example_project_dir() / "agents", directory / "agents", dirs_exist_ok=True)
    setups = [
        {
            "agent_identifier": AGENT,
            "agent_name": "long-writer",
            "llm_configuration_name": "offline",
            "agent_configuration": {"llm": pace.llm()},
        }
    ]
    (directory / "agents" / "agent_setups.json").write_text(json.dumps(setups, indent=2))
    return directory


@contextlib.contextmanager
def store_urls(backend: str) -> Iterator[tuple[str, str | None]]:
    """``(store URL, stream store URL or None)`` for ``backend``, made fresh and
    removed afterwards (``postgres+redis``: everything on PostgreSQL, the
    recording and supervision stores on Redis)."""
    main, _, stream = backend.partition("+")
    with contextlib.ExitStack() as stack:
        store = stack.enter_context(backend_url(main))
        yield store, (stack.enter_context(backend_url(stream)) if stream else None)


def push_of(store: str, stream: str | None) -> tuple[bool, bool]:
    """Whether the stores announce changes (a push channel) and carry deltas."""
    recording = compose(store, stream=stream).chat_stream_recording_store
    if recording is None:
        return False, False
    return has_push(recording), has_deltas(recording)


def _content(event: Received) -> str:
    return str((event.message or {}).get("content") or "")


def _end_at(reader: TurnReader) -> float | None:
    """When the reader learnt the stream ended: its ``stream_status`` (or
    ``error``) event, else the close of the stream."""
    for event in reader.events:
        if event.kind in ("stream_status", "error"):
            return event.at
    return reader.ended_at


def compare(direct: TurnReader, follower: TurnReader) -> dict[str, Any]:
    """Text lags (seconds), and what the follower missed or got wrong."""
    shown = [(event.at, _content(event), event.index) for event in follower.messages]
    final = _content(direct.messages[-1]) if direct.messages else ""
    first = follower.messages[0].index if follower.messages else None
    lags: list[float] = []
    never_shown = 0
    position = 0
    considered = [
        event
        for event in direct.messages
        if first is not None and event.index is not None and event.index > first
    ]
    for event in considered:
        text = _content(event)
        # Both texts only grow, so the first follower event showing this text is
        # at or after the one that showed the previous index's text.
        found = position
        while found < len(shown) and not shown[found][1].startswith(text):
            found += 1
        if found == len(shown):
            never_shown += 1
            continue
        position = found
        lags.append(shown[position][0] - event.at)
    seen = {index for _, _, index in shown}
    missed = [event.index for event in considered if event.index not in seen]
    not_prefix = sum(1 for _, text, _ in shown if not final.startswith(text))
    out_of_order = sum(
        1
        for (_, before, i), (_, after, j) in itertools.pairwise(shown)
        if i is None or j is None or j <= i or not after.startswith(before)
    )
    direct_end, follower_end = _end_at(direct), _end_at(follower)
    gaps = [b.at - a.at for a, b in itertools.pairwise(direct.messages)]
    return {
        "lags": lags,
        "indexes": len(considered),
        "missed": len(missed),
        "missed_indexes": missed[:20],
        "never_shown": never_shown,
        "not_prefix": not_prefix,
        "out_of_order": out_of_order,
        "end_lag": (
            follower_end - direct_end
            if follower_end is not None and direct_end is not None
            else None
        ),
        "gaps": gaps,
        "finished": direct.finished_turn and follower.finished_turn,
        "ends": (direct.describe_end(), follower.describe_end()),
    }


async def _follow_turn(api: TetherAPI, a: Replica, b: Replica, label: str) -> dict[str, Any]:
    session = f"{label}-{uuid.uuid4().hex[:10]}"
    direct = api.start_turn(a.url, a.name, PROMPT, session)
    follower: TurnReader | None = None
    try:
        if not await direct.wait_for(lambda r: bool(r.messages), within=30):
            raise RuntimeError(f"the turn did not start on {a.name}: {direct.describe_end()}")
        assert direct.message_id is not None
        follower = api.attach(b.url, b.name, direct.message_id, session, label="follower")
        await direct.ended(_STREAM_WITHIN)
        await follower.ended(_STREAM_WITHIN)
        return compare(direct, follower)
    finally:
        await direct.aclose()
        if follower is not None:
            await follower.aclose()


async def _cancel_turn(
    api: TetherAPI, producer: Replica, canceller: Replica, after_messages: int, label: str
) -> dict[str, Any]:
    session = f"{label}-{uuid.uuid4().hex[:10]}"
    direct = api.start_turn(producer.url, producer.name, PROMPT, session)
    try:
        if not await direct.wait_for(lambda r: len(r.messages) >= after_messages, within=30):
            raise RuntimeError(f"the turn did not stream on {producer.name}")
        assert direct.message_id is not None
        sent = time.monotonic()
        status = await api.cancel(canceller.url, direct.message_id, session)
        answered = time.monotonic()
        await direct.ended(_STREAM_WITHIN)
        last = direct.events[-1].at if direct.events else (direct.ended_at or answered)
        return {
            "status": status,
            # Negative when the reader's last event came before the answer (a
            # cancel on the producing replica stops it before answering).
            "stop": last - answered,
            "delete": answered - sent,
            "verdict": direct.verdict,
            "messages_after": sum(1 for event in direct.messages if event.at > answered),
        }
    finally:
        await direct.aclose()


async def _warm_up(api: TetherAPI, a: Replica, b: Replica) -> None:
    """One turn on A, followed on B and cancelled there, unmeasured: agent
    loading, pools and every path the measured turns take are warm."""
    session = f"warm-{uuid.uuid4().hex[:10]}"
    direct = api.start_turn(a.url, a.name, PROMPT, session)
    follower: TurnReader | None = None
    try:
        if not await direct.wait_for(lambda r: bool(r.messages), within=60):
            raise RuntimeError(f"the warm-up turn did not start on {a.name}")
        assert direct.message_id is not None
        follower = api.attach(b.url, b.name, direct.message_id, session, label="follower")
        await follower.wait_for(lambda r: len(r.messages) >= 2, within=30)
        await api.cancel(b.url, direct.message_id, session)
        await direct.ended(_STREAM_WITHIN)
        await follower.ended(_STREAM_WITHIN)
    finally:
        await direct.aclose()
        if follower is not None:
            await follower.aclose()


async def measure(
    backend: str, turns: int, pace: Pace | None = None, at_once: int = 1
) -> dict[str, Any]:
    """``turns`` followed turns, ``at_once`` of them streaming together, then
    ``turns`` cross-replica and ``turns`` same-replica cancels, one turn at a
    time, on ``backend``."""
    pace = pace or Pace()
    with (
        store_urls(backend) as (store, stream),
        tempfile.TemporaryDirectory(prefix="tether-bench-") as directory,
    ):
        workdir = Path(directory)
        push, deltas = push_of(store, stream)
        cluster = Cluster(
            write_project(workdir / "project", pace),
            store,
            size=2,
            workdir=workdir,
            stream_store_url=stream,
        )
        async with cluster, TetherAPI.client() as http:
            api = TetherAPI(http, AGENT, conversations=not backend.startswith("redis"))
            a, b = cluster.replicas
            await _warm_up(api, a, b)
            follows: list[dict[str, Any]] = []
            for first in range(0, turns, at_once):
                batch = range(first, min(turns, first + at_once))
                follows += await asyncio.gather(
                    *(_follow_turn(api, a, b, f"follow{i}") for i in batch)
                )
            cancels: dict[str, list[dict[str, Any]]] = {"cross": [], "same": []}
            for i in range(turns):
                # Cancel at varied points, so the DELETE lands anywhere in the
                # producer's heartbeat and flush cycles.
                after = 3 + (i * 7) % 25
                cancels["cross"].append(await _cancel_turn(api, a, b, after, f"cancel{i}"))
                cancels["same"].append(await _cancel_turn(api, a, a, after, f"local{i}"))
    report = _report(backend, turns, pace, push, deltas, follows, cancels)
    report["at_once"] = at_once
    return report


def _report(
    backend: str,
    turns: int,
    pace: Pace,
    push: bool,
    deltas: bool,
    follows: list[dict[str, Any]],
    cancels: dict[str, list[dict[str, Any]]],
) -> dict[str, Any]:
    lags = [lag for follow in follows for lag in follow["lags"]]
    gaps = [gap for follow in follows for gap in follow["gaps"]]
    end_lags = [f["end_lag"] for f in follows if f["end_lag"] is not None]
    cancel_figures = {}
    for where, runs in cancels.items():
        accepted = [run for run in runs if run["status"] == 204]
        cancel_figures[where] = {
            "stop": summary([run["stop"] for run in accepted]),
            "delete": summary([run["delete"] for run in accepted]),
            "accepted": len(accepted),
            "tried": len(runs),
            "verdicts": sorted({str(run["verdict"]) for run in runs}),
            "statuses": sorted({run["status"] for run in runs}),
            "messages_after_median": (
                sorted(run["messages_after"] for run in accepted)[len(accepted) // 2]
                if accepted
                else None
            ),
        }
    return {
        "backend": backend,
        "push": push,
        "deltas": deltas,
        "turns": turns,
        "pace": pace.llm(),
        "text_lag": summary(lags),
        "delta_interval": summary(gaps),
        "indexes": sum(f["indexes"] for f in follows),
        "missed": sum(f["missed"] for f in follows),
        # With push, which indexes the follower skipped (the first few per turn).
        "missed_indexes": [f["missed_indexes"] for f in follows if push and f["missed"]],
        "never_shown": sum(f["never_shown"] for f in follows),
        "not_prefix": sum(f["not_prefix"] for f in follows),
        "out_of_order": sum(f["out_of_order"] for f in follows),
        "unfinished": [f["ends"] for f in follows if not f["finished"]],
        "end_lag": summary(end_lags),
        "cancel": cancel_figures,
    }


def lag_row(result: dict[str, Any]) -> list[object]:
    lag, end = result["text_lag"], result["end_lag"]
    interval = result["delta_interval"]["median_ms"]
    ok: object = "n/a (no push)"
    if result["push"]:
        ok = (
            "yes"
            if lag["median_ms"] < LAG_P50_TARGET_MS
            and lag["p99_ms"] < LAG_P99_TARGET_MS
            and result["missed"] == 0
            and end["p99_ms"] < END_LAG_TARGET_MS
            else "no"
        )
    wrong = result["not_prefix"] + result["out_of_order"]
    return [
        result["backend"],
        _channel(result),
        result["turns"],
        lag["median_ms"],
        lag["p99_ms"],
        lag["median_ms"] / interval if interval else float("nan"),
        f"{result['missed']} of {result['indexes']}",
        wrong,
        end["median_ms"],
        end["p99_ms"],
        ok,
    ]


LAG_HEADERS = [
    "backend",
    "push",
    "turns",
    "text lag p50 ms",
    "p99 ms",
    "p50 ÷ delta interval",
    "indexes missed",
    "not a prefix / out of order",
    "end lag p50 ms",
    "p99 ms",
    "meets target",
]


def cancel_row(result: dict[str, Any]) -> list[object]:
    cross, same = result["cancel"]["cross"], result["cancel"]["same"]
    target = CANCEL_PUSH_TARGET_MS if result["push"] else CANCEL_POLL_TARGET_MS
    return [
        result["backend"],
        _channel(result),
        f"{cross['accepted']}/{cross['tried']}",
        cross["stop"]["median_ms"],
        cross["stop"]["p99_ms"],
        cross["delete"]["median_ms"],
        same["stop"]["median_ms"],
        same["stop"]["p99_ms"],
        cross["messages_after_median"],
        ",".join(cross["verdicts"]),
        f"{'yes' if cross['stop']['p99_ms'] < target else 'no'} (< {target:.0f} ms)",
    ]


CANCEL_HEADERS = [
    "backend",
    "push",
    "cancels",
    "answer → last event p50 ms",
    "p99 ms",
    "DELETE round trip p50 ms",
    "same replica p50 ms",
    "same p99 ms",
    "events after answer (median)",
    "verdicts",
    "p99 meets target",
]


def _channel(result: dict[str, Any]) -> str:
    if not result["push"]:
        return "no (polls)"
    return "yes, deltas" if result["deltas"] else "yes"


async def measure_all(
    backends: list[str], turns: int, pace: Pace, at_once: int = 1
) -> dict[str, Any]:
    return {backend: await measure(backend, turns, pace, at_once) for backend in backends}
