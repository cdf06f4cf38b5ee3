"""Many concurrent streamed turns of the offline model on one replica.

All stores on one backend; every turn stateful (claimed, heartbeated,
recorded, checkpointed) with one live reader each. Reports the delay from the
model's yield of each message to the first event of the reader on the
producing replica that shows it (median, p99, against a 50 ms target: where
readers are shown only recorded text, that includes the recording's round
trip), the longest gap between two renewals of any lease (a gap over the dead
threshold would be a false "dead" verdict), and the recording's write load.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

from bench._backends import backend_url, close_all, open_bundle
from bench._stats import summary
from tether.adapters.agent_dependency_registry import AgentDependencyRegistry
from tether.adapters.agent_setup_retriever_from_file import AgentSetupRetrieverFromFile
from tether.adapters.local_agent_registries_factory import LocalAgentRegistriesFactory
from tether.cli.load_chat_agent_factory import from_string
from tether.cli.server_app import example_project_dir
from tether.domain.chat_message import ChatMessage, ChatMessageSender
from tether.domain.chat_request import ChatRequest, RequestHeaders
from tether.domain.message_bus import MessageBus
from tether.handlers.chat_handler import ChatHandler
from tether.handlers.turn import Turn
from tether.runtime.live_buffer import StreamEvent
from tether.runtime.turn_stores import TurnStores
from tether.settings import TetherSettings


def _registries(
    directory: Path, chunks_per_second: float, answer_chunks: int, chunk_size: int = 3
) -> Any:
    setups = directory / "agent_setups.json"
    llm = {
        "seed": 3,
        "chunks_per_second": chunks_per_second,
        "chunk_size": chunk_size,
        "answer_chunks": answer_chunks,
    }
    # ``bench``, and ``bench-warm``: the same in three unpaced deltas, to warm up with.
    warm = {**llm, "chunks_per_second": 0, "answer_chunks": 3}
    setups.write_text(
        json.dumps(
            [
                {
                    "agent_identifier": identifier,
                    "agent_name": "long-writer",
                    "llm_configuration_name": "offline",
                    "agent_configuration": {"llm": options},
                }
                for identifier, options in (("bench", llm), ("bench-warm", warm))
            ]
        )
    )
    return LocalAgentRegistriesFactory(
        agent_setup_retriever=AgentSetupRetrieverFromFile(file_path=str(setups)),
        chat_agent_class_registry=from_string(str(example_project_dir() / "agents")),
        agent_dependency_registry=AgentDependencyRegistry,
    )


@contextlib.contextmanager
def busy_core() -> Iterator[None]:
    """Another process spinning on one core while the block runs: the outside
    CPU load under which no live producer may be read as dead."""
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        yield
    finally:
        spinner.kill()
        spinner.wait()


def turn_stores(bundle: Any) -> TurnStores:
    """The runtime's view of an opened bundle (every store on one backend)."""
    kwargs = bundle.setup_kwargs()
    return TurnStores(
        agent_state=kwargs["agent_state_store"],
        recording=kwargs["chat_stream_recording_store"],
        supervision=kwargs["chat_stream_supervision_store"],
        conversation=kwargs["chat_conversation_store"],
    )


@contextlib.asynccontextmanager
async def offline_replica(
    backend: str,
    settings: TetherSettings,
    *,
    chunks_per_second: float,
    answer_chunks: int,
    chunk_size: int,
) -> AsyncIterator[ChatHandler]:
    """One replica in this process, every store on ``backend``, serving the
    offline model's ``bench`` agent (and ``bench-warm``); shut down and its
    stores closed on exit."""
    with backend_url(backend) as url, tempfile.TemporaryDirectory() as directory:
        bundle, opened = await open_bundle(url)
        handler = ChatHandler(
            _registries(Path(directory), chunks_per_second, answer_chunks, chunk_size),
            turn_stores(bundle),
            settings,
            MessageBus(),
        )
        try:
            yield handler
        finally:
            await handler.shutdown()
            await close_all(opened)


async def measure(
    backend: str,
    turns: int,
    chunks_per_second: float = 10,
    answer_chunks: int = 50,
    chunk_size: int = 3,
    watched: bool = False,
) -> dict[str, Any]:
    """``chunk_size`` is words per delta: 1 gives token-sized deltas (what an
    OpenAI-compatible model streams). ``watched``: every turn publishes its
    deltas on the store's channel, as when a follower on another replica
    watches each of them (the channel's load at this many turns)."""
    # Many turns of one requester at once is the point: no fair limits.
    settings = TetherSettings(
        finished_turn_grace=1.0, max_turns_per_requester=0, max_turns_per_tenant=0
    )
    replica = offline_replica(
        backend,
        settings,
        chunks_per_second=chunks_per_second,
        answer_chunks=answer_chunks,
        chunk_size=chunk_size,
    )
    async with replica as handler, _yields() as yielded:
        delays: list[float] = []
        gaps = _instrument_gaps(handler)
        publishes = _instrument_publishes(handler) if watched else []
        puts = _instrument_puts(handler)
        started = time.monotonic()
        running = [
            asyncio.ensure_future(_one_turn(handler, i, delays, watched, yielded))
            for i in range(turns)
        ]
        outcomes = await asyncio.gather(*running, return_exceptions=True)
        elapsed = time.monotonic() - started
    failures = [o for o in outcomes if isinstance(o, BaseException) or o != "done"]
    return {
        "turns": turns,
        "chunk_size": chunk_size,
        "completed": turns - len(failures),
        "elapsed_s": elapsed,
        "turns_per_second": (turns - len(failures)) / elapsed,
        "delay": summary(delays),
        "recording_batches_per_second": len(puts) / elapsed,
        "recording_puts_per_second": sum(n for n, _, _ in puts) / elapsed,
        "recorded_kb_per_second": sum(size for _, size, _ in puts) / elapsed / 1000,
        "recording_batch": summary([seconds for _, _, seconds in puts]),
        "max_renewal_gap_s": max(gaps, default=float("nan")),
        "false_dead": sum(1 for gap in gaps if gap > settings.dead_after),
        "watched": watched,
        "deltas_per_second": sum(n for n, _ in publishes) / elapsed if publishes else 0.0,
        "delta_batches_per_second": len(publishes) / elapsed if publishes else 0.0,
        "delta_batch": summary([seconds for _, seconds in publishes]) if publishes else None,
        "failures": [repr(f) for f in failures[:3]],
    }


def _instrument_gaps(handler: ChatHandler) -> list[float]:
    """Record, for every renewal, how long the lease had gone unrenewed (from when
    it was taken or last renewed), including renewals that came too late."""
    gaps: list[float] = []
    batcher = handler.heartbeats
    if batcher is None:
        return gaps
    original = batcher.beat

    async def beat(*args: Any) -> None:
        # A row's heartbeat is as old as the last renewal that has *landed*: measure
        # from the previous renewal to the moment this batch's writes are done.
        with batcher._guard:
            before = {key: held.lease.renewed_at for key, held in batcher._held.items()}
        await original(*args)
        landed = handler.clock()
        gaps.extend((landed - renewed).total_seconds() for renewed in before.values())

    batcher.beat = beat  # type: ignore[method-assign]
    return gaps


def _instrument_publishes(handler: ChatHandler) -> list[tuple[int, float]]:
    """Record each delta batch the replica publishes: (deltas, seconds)."""
    publishes: list[tuple[int, float]] = []
    store = handler.stores.recording
    if store is None or handler.deltas is None:
        return publishes
    original = store.publish_deltas

    async def publish_deltas(deltas: Any) -> None:
        started = time.monotonic()
        await original(deltas)
        publishes.append((len(deltas), time.monotonic() - started))

    store.publish_deltas = publish_deltas  # type: ignore[method-assign]
    return publishes


@contextlib.asynccontextmanager
async def _yields() -> AsyncIterator[dict[str, list[tuple[int, float]]]]:
    """Every message each turn's agent yields, as (text length, when), by
    message id: the moment a token leaves the model, whatever the runtime
    does with it before a reader sees it (the same on every version)."""
    yielded: dict[str, list[tuple[int, float]]] = {}
    original = Turn._publish

    def publish(turn: Turn, message: ChatMessage) -> None:
        yielded.setdefault(turn.message_id, []).append((len(message.content), time.monotonic()))
        original(turn, message)

    Turn._publish = publish  # type: ignore[method-assign]
    try:
        yield yielded
    finally:
        Turn._publish = original  # type: ignore[method-assign]


def _instrument_puts(handler: ChatHandler) -> list[tuple[int, int, float]]:
    """Record each recording batch the replica writes: (puts, bytes of text,
    seconds)."""
    batches: list[tuple[int, int, float]] = []
    store = handler.stores.recording
    if store is None:
        return batches
    original = store.put_many

    async def put_many(puts: Any) -> list[bool]:
        started = time.monotonic()
        try:
            return await original(puts)
        finally:
            size = sum(len(p.event.message.content) for p in puts)
            batches.append((len(puts), size, time.monotonic() - started))

    store.put_many = put_many  # type: ignore[method-assign]
    return batches


async def _one_turn(
    handler: ChatHandler,
    i: int,
    delays: list[float],
    watched: bool,
    yielded: dict[str, list[tuple[int, float]]],
) -> str:
    request = ChatRequest(
        tenant="bench",
        request_headers=RequestHeaders(requester_uuid="u"),
        agent_identifier="bench",
        conversation=[ChatMessage(sender=ChatMessageSender.USER, content=f"Write about {i}")],
        stateful=True,
        session_id=f"s{i}",
    )
    turn = await handler.start_turn(request)
    if watched and handler.deltas is not None:
        # As a follower's watch does, heard by the turn on its channel.
        handler.deltas.watch(turn, turn.key, turn.message_id, turn.writer.epoch, None)
    reason = "?"
    credited = 0  # the turn's yields already shown
    async for item in turn.buffer.follow(0):
        if isinstance(item, StreamEvent):
            now, shown = time.monotonic(), len(item.message.content)
            mine = yielded.get(turn.message_id, [])
            while credited < len(mine) and mine[credited][0] <= shown:
                delays.append(now - mine[credited][1])
                credited += 1
        else:
            reason = item.reason
    return reason
