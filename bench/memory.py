"""Resident memory per in-flight turn, beyond the answer itself.

Two measurements, in one process, with the runtime driven directly as
``bench/concurrent_turns.py`` does (every turn stateful, one live reader each,
the offline model streaming token-sized deltas: ``chunk_size`` 1, one word):

- ``concurrent``: N turns at once. Resident memory (``/proc/self/statm``) is
  sampled while they run; at the sample with the highest RSS, the growth over
  the baseline (taken after one warm-up turn) less the text of the answers
  the turns held at that moment, divided by the number of turns.
- ``long answer``: one turn whose answer streams as 4,000 deltas, read by a
  live reader and by one that reads the first event and never again. Its
  peak is measured with ``tracemalloc`` (Python allocations, exact) and RSS
  (everything, noisy at this size). The baseline, in the same run, is the
  offline model streaming the same answer alone into one string: it composes
  its whole answer up front (about 0.7 MiB for 4,000 words, the bench's own
  cost), so the server's cost beyond the answer is the turn's peak less that.

The offline model's deltas are whole words: 4,000 of them make an answer of
about 26 KB, not 16 KiB (the answer's size is reported).
"""

from __future__ import annotations

import asyncio
import gc
import os
import time
import tracemalloc
from collections.abc import AsyncGenerator
from dataclasses import dataclass, field
from typing import Any, cast

from bench.concurrent_turns import offline_replica
from tether.adapters.llm.offline import OfflineChatModel
from tether.domain.chat_message import ChatMessage, ChatMessageSender
from tether.domain.chat_model import ModelMessage, TextDelta
from tether.domain.chat_request import ChatRequest, RequestHeaders
from tether.handlers.chat_handler import ChatHandler
from tether.runtime.live_buffer import StreamEvent
from tether.settings import TetherSettings

BACKENDS = ("sqlite",)
"""The default: the embedded store, whose rows live outside Python's heap."""

TARGET_KIB = 100.0
_SEED = 3  # the offline model's seed in bench.concurrent_turns' setups
_PAGE = os.sysconf("SC_PAGE_SIZE")


def rss() -> int:
    """Resident set size of this process, in bytes."""
    with open("/proc/self/statm", encoding="ascii") as statm:
        return int(statm.read().split()[1]) * _PAGE


@dataclass
class _Held:
    """What the turns' readers hold: each turn's newest answer, in bytes."""

    answer_bytes: list[int]
    running: int = 0
    peak_rss: int = 0
    answers_at_peak: int = 0
    running_at_peak: int = 0
    samples: int = 0
    timeline: list[tuple[float, int, int]] = field(default_factory=list)

    def sample(self, started: float) -> None:
        now = rss()
        self.samples += 1
        if now > self.peak_rss:
            self.peak_rss = now
            self.answers_at_peak = sum(self.answer_bytes)
            self.running_at_peak = self.running
        if self.samples % 10 == 0:
            self.timeline.append((time.monotonic() - started, now, self.running))


def _prompt(i: int) -> str:
    return f"Write about {i}"


def _request(i: int, prefix: str, agent: str = "bench") -> ChatRequest:
    return ChatRequest(
        tenant="bench",
        request_headers=RequestHeaders(requester_uuid="u"),
        agent_identifier=agent,
        conversation=[ChatMessage(sender=ChatMessageSender.USER, content=_prompt(i))],
        stateful=True,
        session_id=f"{prefix}{i}",
    )


async def _warm_up(handler: ChatHandler) -> None:
    """One short turn, so code paths, pools and caches are warm and not counted."""
    await _turn(handler, 0, "warm", _Held([0]), agent="bench-warm")
    gc.collect()


async def model_alone(chunk_size: int, answer_chunks: int, prompt: str) -> tuple[int, int]:
    """The offline model streaming the same answer with no server, into one
    string as an agent keeps it: ``(tracemalloc peak, answer bytes)``. The
    model composes its whole answer up front, so this is the bench's own
    cost, to tell apart from the server's."""
    model = OfflineChatModel(seed=_SEED, chunk_size=chunk_size, answer_chunks=answer_chunks)
    started = not tracemalloc.is_tracing()
    if started:
        tracemalloc.start()
    gc.collect()
    before = tracemalloc.get_traced_memory()[0]
    tracemalloc.reset_peak()
    text = ""
    async for event in model.stream([ModelMessage(role="user", content=prompt)], []):
        if isinstance(event, TextDelta):
            text += event.text
    peak = tracemalloc.get_traced_memory()[1] - before
    if started:
        tracemalloc.stop()
    return peak, len(text.encode())


async def _turn(
    handler: ChatHandler, i: int, prefix: str, held: _Held, agent: str = "bench"
) -> str:
    turn = await handler.start_turn(_request(i, prefix, agent))
    held.running += 1
    reason = "?"
    try:
        async for item in turn.buffer.follow(0):
            if isinstance(item, StreamEvent):
                held.answer_bytes[i] = len(item.message.content.encode())
            else:
                reason = item.reason
    finally:
        held.running -= 1
    return reason


async def _sampler(held: _Held, started: float, every: float) -> None:
    while True:
        held.sample(started)
        await asyncio.sleep(every)


async def measure_concurrent(
    backend: str,
    turns: int,
    *,
    chunk_size: int = 1,
    chunks_per_second: float = 10,
    answer_chunks: int = 100,
) -> dict[str, Any]:
    """Peak RSS growth per turn, ``turns`` at once, beyond the answers held."""
    # Finished turns keep their final message for the grace period: longer than
    # the run, so at the peak every turn is either streaming or holding its answer.
    # Many turns of one requester at once is the point: no fair limits.
    settings = TetherSettings(
        finished_turn_grace=600.0, max_turns_per_requester=0, max_turns_per_tenant=0
    )
    replica = offline_replica(
        backend,
        settings,
        chunks_per_second=chunks_per_second,
        answer_chunks=answer_chunks,
        chunk_size=chunk_size,
    )
    async with replica as handler:
        await _warm_up(handler)
        held = _Held([0] * turns)
        baseline = rss()
        held.peak_rss = baseline
        started = time.monotonic()
        sampler = asyncio.ensure_future(_sampler(held, started, 0.02))
        outcomes = await asyncio.gather(
            *(_turn(handler, i, "s", held) for i in range(turns)), return_exceptions=True
        )
        elapsed = time.monotonic() - started
        sampler.cancel()
        held.sample(started)
        gc.collect()
        after = rss()
    failures = [o for o in outcomes if o != "done"]
    growth = held.peak_rss - baseline
    model_peak, _ = await model_alone(chunk_size, answer_chunks, _prompt(turns // 2))
    return {
        "turns": turns,
        "completed": turns - len(failures),
        "failures": [repr(f) for f in failures[:3]],
        "chunk_size": chunk_size,
        "chunks_per_second": chunks_per_second,
        "answer_chunks": answer_chunks,
        "elapsed_s": elapsed,
        "baseline_mib": baseline / 2**20,
        "peak_mib": held.peak_rss / 2**20,
        "after_mib": after / 2**20,
        "answer_kib_mean": sum(held.answer_bytes) / max(1, turns) / 1024,
        "running_at_peak": held.running_at_peak,
        "kib_per_turn": growth / turns / 1024,
        "kib_per_turn_beyond_answer": (growth - held.answers_at_peak) / turns / 1024,
        "model_alone_kib": model_peak / 1024,
        "timeline": held.timeline,
    }


async def _long_turn(handler: ChatHandler, prefix: str) -> tuple[_Held, int, str]:
    """One long turn, read live and by a reader that never reads on; its RSS
    sampled. ``(held, events read, how it ended)``."""
    held = _Held([0])
    held.peak_rss = rss()
    started = time.monotonic()
    sampler = asyncio.ensure_future(_sampler(held, started, 0.01))
    try:
        turn = await handler.start_turn(_request(1, prefix))
        # A reader that takes the first event and then never reads again.
        stalled = cast(AsyncGenerator[Any, None], turn.buffer.follow(0))
        await anext(stalled)
        reason, events = "?", 0
        async for item in turn.buffer.follow(0):
            if isinstance(item, StreamEvent):
                events += 1
                held.answer_bytes[0] = len(item.message.content.encode())
            else:
                reason = item.reason
        held.sample(started)
        await stalled.aclose()
    finally:
        sampler.cancel()
    return held, events, reason


async def measure_long_answer(
    backend: str, *, deltas: int = 4000, chunks_per_second: float = 1000
) -> dict[str, Any]:
    """One turn of ``deltas`` one-word deltas: its peak memory beyond the answer.

    Run twice: first for RSS, then under ``tracemalloc`` (whose own records
    would count in RSS), with the model alone as the baseline."""
    settings = TetherSettings(finished_turn_grace=600.0)
    replica = offline_replica(
        backend, settings, chunks_per_second=chunks_per_second, answer_chunks=deltas, chunk_size=1
    )
    async with replica as handler:
        await _warm_up(handler)
        baseline = rss()
        started = time.monotonic()
        measured, events, reason = await _long_turn(handler, "rss")
        elapsed = time.monotonic() - started
        gc.collect()
        tracemalloc.start()
        traced_before = tracemalloc.get_traced_memory()[0]
        tracemalloc.reset_peak()
        await _long_turn(handler, "traced")
        traced = tracemalloc.get_traced_memory()[1] - traced_before
        model_peak, model_answer = await model_alone(1, deltas, _prompt(1))
        tracemalloc.stop()
    answer = measured.answer_bytes[0]
    assert answer == model_answer, "the model alone wrote another answer than the turn"
    return {
        "deltas": deltas,
        "events_read": events,
        "ended": reason,
        "elapsed_s": elapsed,
        "answer_kib": answer / 1024,
        "traced_peak_kib": traced / 1024,
        "model_alone_kib": model_peak / 1024,
        # The model alone holds its plan and the answer: what the turn holds
        # beyond that is the server's, beyond the answer itself.
        "server_beyond_answer_kib": (traced - model_peak) / 1024,
        "rss_growth_kib": (measured.peak_rss - baseline) / 1024,
    }


async def measure(backend: str, turns: int, chunk_size: int = 1) -> dict[str, Any]:
    return {
        "concurrent": await measure_concurrent(backend, turns, chunk_size=chunk_size),
        "long_answer": await measure_long_answer(backend),
    }


CONCURRENT_HEADERS = [
    "backend",
    "turns",
    "completed",
    "answer KiB (mean)",
    "RSS baseline MiB",
    "peak MiB",
    "KiB per turn",
    "beyond answer KiB",
    "of which the model's",
    f"< {TARGET_KIB:.0f} KiB",
]


def concurrent_row(backend: str, result: dict[str, Any]) -> list[object]:
    beyond = result["kib_per_turn_beyond_answer"]
    return [
        backend,
        result["turns"],
        f"{result['completed']}/{result['turns']}",
        result["answer_kib_mean"],
        result["baseline_mib"],
        result["peak_mib"],
        result["kib_per_turn"],
        beyond,
        f"≤ {result['model_alone_kib']:.2f}",
        "yes" if beyond < TARGET_KIB else "no",
    ]


LONG_HEADERS = [
    "backend",
    "deltas",
    "answer KiB",
    "turn peak KiB",
    "model alone KiB",
    "server beyond answer KiB",
    "turn ÷ model alone",
    "RSS growth KiB",
    f"< {TARGET_KIB:.0f} KiB",
]


def long_row(backend: str, result: dict[str, Any]) -> list[object]:
    beyond = result["server_beyond_answer_kib"]
    return [
        backend,
        result["deltas"],
        result["answer_kib"],
        result["traced_peak_kib"],
        result["model_alone_kib"],
        beyond,
        result["traced_peak_kib"] / result["model_alone_kib"],
        result["rss_growth_kib"],
        "yes" if beyond < TARGET_KIB else "no",
    ]
