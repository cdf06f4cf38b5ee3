"""Atomicity across processes: for backends that several server processes share.

Run these only for a backend whose rows other processes see (files on one disk,
a database), never for an in-memory store. The subclass provides a *picklable*
zero-argument factory (a top-level class or function, or a ``functools.partial``
of one); each child process, started with ``multiprocessing``'s ``spawn``
method, builds its own store from it::

    import functools
    import pytest
    from tether.testing.contracts import (
        ChatStreamRecordingCrossProcessContract,
        ChatStreamSupervisionCrossProcessContract,
    )

    class TestMyStoresAcrossProcesses(
        ChatStreamSupervisionCrossProcessContract, ChatStreamRecordingCrossProcessContract
    ):
        @pytest.fixture
        def supervision_store_factory(self):
            return functools.partial(MySupervisionStore, "postgresql://...")

        @pytest.fixture
        def recording_store_factory(self):
            return functools.partial(MyRecordingStore, "postgresql://...")

Children import the factory's module, so it must be importable in a fresh
interpreter (a test module inside a package, or your library).
"""

from __future__ import annotations

import asyncio
import multiprocessing
import queue
import traceback
from collections.abc import Callable
from contextlib import AsyncExitStack
from datetime import UTC, datetime
from multiprocessing.queues import Queue
from typing import Any, ClassVar

import pytest

from tether.domain.chat_message import ChatMessage, ChatMessageSender
from tether.domain.chat_stream_recording_store import RecordedStreamEvent, RecordingFencedError
from tether.domain.chat_stream_supervision_store import ChatStreamStatus, ChatStreamSupervision
from tether.testing.contracts._support import PrivateLoop, StoreFactory, open_store, unique

_Key = tuple[str, str, str]
_TIMEOUT = 120.0


class ChatStreamSupervisionCrossProcessContract:
    """Processes racing compare-and-swap: each epoch has exactly one claimant;
    a row one process removes leaves its epoch to every other."""

    processes: ClassVar[int] = 4
    epochs: ClassVar[int] = 40

    @pytest.fixture
    def supervision_store_factory(self) -> StoreFactory:
        """Override: a picklable factory of the shared supervision store."""
        raise NotImplementedError("override `supervision_store_factory`")

    def test_processes_racing_compare_and_swap_have_one_winner_per_epoch(
        self, supervision_store_factory: StoreFactory
    ) -> None:
        key = (unique("tenant"), "racer", "session")
        names = [f"process-{number}" for number in range(self.processes)]
        results = _run_in_processes(
            _race_compare_and_swap,
            [(supervision_store_factory, key, self.epochs, n) for n in names],
        )
        claimants: dict[int, list[str]] = {}
        for name, won in zip(names, results, strict=True):
            for epoch in won:
                claimants.setdefault(epoch, []).append(name)
        assert sorted(claimants) == list(range(1, self.epochs + 1))
        doubles = {epoch: who for epoch, who in claimants.items() if len(who) != 1}
        assert not doubles, f"epochs claimed by more than one process: {doubles}"
        loop = PrivateLoop()
        try:
            final = loop.run(loop.open(supervision_store_factory).read(*key))
        finally:
            loop.close()
        assert final is not None and final.epoch == self.epochs
        assert final.message_id == f"{claimants[self.epochs][0]}:{self.epochs}"

    def test_a_row_deleted_through_one_store_leaves_its_epoch_to_another(
        self, supervision_store_factory: StoreFactory
    ) -> None:
        """Two stores over the same place, as two processes have: after one
        removes a row (an erase, a finished turn's clean-up), the other's
        claims of the same ids start above every epoch granted before, and a
        late write through the first finds nothing to swap."""
        loop = PrivateLoop()
        try:
            first = loop.open(supervision_store_factory)
            second = loop.open(supervision_store_factory)
            loop.run(_claim_after_a_delete_elsewhere(first, second, unique("tenant")))
        finally:
            loop.close()


class ChatStreamRecordingCrossProcessContract:
    """Processes racing puts at interleaved epochs: no regression, the highest
    stays; a record one process removes leaves its fence to every other.

    In round ``r`` process ``p`` puts at epoch ``r * processes + p + 1``, so the
    stored epoch climbs many times while every process is writing, and each
    climb is a chance for a non-atomic fence to let a lower write in.
    """

    processes: ClassVar[int] = 4
    rounds: ClassVar[int] = 100
    puts_per_round: ClassVar[int] = 2

    @pytest.fixture
    def recording_store_factory(self) -> StoreFactory:
        """Override: a picklable factory of the shared recording store."""
        raise NotImplementedError("override `recording_store_factory`")

    def test_processes_racing_puts_leave_the_highest_epoch(
        self, recording_store_factory: StoreFactory
    ) -> None:
        key = (unique("tenant"), "racer", "session")
        plan = (self.processes, self.rounds, self.puts_per_round)
        results = _run_in_processes(
            _race_puts, [(recording_store_factory, key, *plan, p) for p in range(self.processes)]
        )
        for process, (accepted, seen) in enumerate(results):
            # The stored epoch only grows, so what one process learns about it must
            # never go down, and the record never disappears.
            floor = 0
            for step, (value, exact) in enumerate(seen):
                assert not exact or value >= floor, (
                    f"process {process} found epoch {value} after epoch {floor} "
                    f"(step {step} of {seen})"
                )
                floor = max(floor, value)
            for epoch, outcomes in accepted.items():
                first_fence = outcomes.index(False) if False in outcomes else len(outcomes)
                assert not any(outcomes[first_fence:]), (
                    f"epoch {epoch} wrote again after being fenced: {outcomes}"
                )
        top = self.rounds * self.processes
        assert all(results[-1][0][top]), "the highest epoch must never be fenced"
        loop = PrivateLoop()
        try:
            final = loop.run(loop.open(recording_store_factory).read(*key))
        finally:
            loop.close()
        assert final == _event(top, self.rounds * self.puts_per_round - 1)

    def test_a_record_deleted_through_one_store_leaves_its_fence_to_another(
        self, recording_store_factory: StoreFactory
    ) -> None:
        """Two stores over the same place, as two processes have: after one
        removes a record, the other refuses puts below its fence, and a fence
        the second raises on the empty conversation holds for the first."""
        loop = PrivateLoop()
        try:
            first = loop.open(recording_store_factory)
            second = loop.open(recording_store_factory)
            loop.run(_put_after_a_delete_elsewhere(first, second, unique("tenant")))
        finally:
            loop.close()


def _event(epoch: int, index: int) -> RecordedStreamEvent:
    return RecordedStreamEvent(
        index=index,
        message=ChatMessage(sender=ChatMessageSender.BOT, content=f"epoch {epoch} up to {index}"),
        message_id=f"m-{epoch}",
        epoch=epoch,
    )


def _row(epoch: int, message_id: str) -> ChatStreamSupervision:
    return ChatStreamSupervision(
        status=ChatStreamStatus.RUNNING,
        heartbeat_at=datetime.now(UTC),
        message_id=message_id,
        epoch=epoch,
    )


async def _claim_after_a_delete_elsewhere(first: Any, second: Any, tenant: str) -> None:
    key = (tenant, "user", "session")
    assert await first.compare_and_swap(*key, None, _row(1, "m-1"))
    assert await first.compare_and_swap(*key, 1, _row(3, "m-1"))
    await first.delete(*key, "m-1", 3)
    assert await second.read(*key) is None
    assert await second.last_epoch(*key) == 3
    for reused in (1, 3):
        assert not await second.compare_and_swap(*key, None, _row(reused, "m-2"))
    assert await second.compare_and_swap(*key, None, _row(4, "m-2"))
    # The removed turn's producer, paused through all of it, writes late.
    assert not await first.compare_and_swap(*key, 3, _row(3, "m-1"))
    row = await first.read(*key)
    assert row is not None and (row.message_id, row.epoch) == ("m-2", 4)
    assert await first.last_epoch(*key) == 4


async def _put_after_a_delete_elsewhere(first: Any, second: Any, tenant: str) -> None:
    key = (tenant, "user", "session")
    await first.put(*key, _event(5, 0))
    await first.delete(*key, "m-5")
    assert await second.read(*key) is None
    with pytest.raises(RecordingFencedError):
        await second.put(*key, _event(4, 0))
    await second.fence(*key, 7)
    with pytest.raises(RecordingFencedError):
        await first.put(*key, _event(6, 1))
    assert await first.read(*key) is None
    await first.put(*key, _event(7, 0))
    assert await second.read(*key) == _event(7, 0)


def _run_in_processes(target: Callable[..., Any], arguments: list[tuple[Any, ...]]) -> list[Any]:
    """Run ``target(*args, barrier)`` in one spawned process per ``args``; their results."""
    context = multiprocessing.get_context("spawn")
    barrier = context.Barrier(len(arguments))
    results: Queue[tuple[int, bool, Any]] = context.Queue()
    processes = [
        context.Process(target=_child, args=(number, target, args, barrier, results), daemon=True)
        for number, args in enumerate(arguments)
    ]
    for process in processes:
        process.start()
    collected: dict[int, Any] = {}
    failure: str | None = None
    try:
        while len(collected) < len(processes) and failure is None:
            try:
                number, ok, value = results.get(timeout=_TIMEOUT)
            except queue.Empty:
                failure = f"a racing process sent no result within {_TIMEOUT} s"
            else:
                if ok:
                    collected[number] = value
                else:
                    failure = f"racing process {number} failed:\n{value}"
    finally:
        if failure is not None:
            barrier.abort()  # release the others instead of letting them wait out the timeout
        for process in processes:
            process.join(timeout=5 if failure else _TIMEOUT)
            if process.is_alive():
                process.kill()
                process.join()
        results.close()
        results.join_thread()
    if failure is not None:
        pytest.fail(failure)
    return [collected[number] for number in range(len(arguments))]


def _child(
    number: int,
    target: Callable[..., Any],
    args: tuple[Any, ...],
    barrier: Any,
    results: Queue[tuple[int, bool, Any]],
) -> None:
    try:
        results.put((number, True, asyncio.run(target(*args, barrier))))
    except BaseException:
        barrier.abort()
        results.put((number, False, traceback.format_exc()))


async def _race_compare_and_swap(
    factory: StoreFactory, key: _Key, epochs: int, name: str, barrier: Any
) -> list[int]:
    """Read the row and try to take the next epoch, until epoch ``epochs`` exists."""
    won: list[int] = []
    async with AsyncExitStack() as stack:
        store = await open_store(factory, stack)
        await asyncio.to_thread(barrier.wait, _TIMEOUT)
        while True:
            row = await store.read(*key)
            current = 0 if row is None else row.epoch
            if current >= epochs:
                return won
            claim = ChatStreamSupervision(
                status=ChatStreamStatus.RUNNING,
                heartbeat_at=datetime.now(UTC),
                message_id=f"{name}:{current + 1}",
                epoch=current + 1,
            )
            expected = None if row is None else row.epoch
            if await store.compare_and_swap(*key, expected, claim):
                won.append(current + 1)


async def _race_puts(
    factory: StoreFactory,
    key: _Key,
    processes: int,
    rounds: int,
    puts_per_round: int,
    process: int,
    barrier: Any,
) -> tuple[dict[int, list[bool]], list[tuple[int, bool]]]:
    """Put growing events at this process's epoch of each round, reading back after each.

    Returns, per epoch, whether each put was accepted, and in order what each put
    and read established about the stored epoch: ``(value, exact)``, where a
    non-exact value is only a lower bound.
    """
    accepted: dict[int, list[bool]] = {}
    seen: list[tuple[int, bool]] = []
    index = 0
    async with AsyncExitStack() as stack:
        store = await open_store(factory, stack)
        await asyncio.to_thread(barrier.wait, _TIMEOUT)
        for round_number in range(rounds):
            epoch = round_number * processes + process + 1
            outcomes = accepted.setdefault(epoch, [])
            for _ in range(puts_per_round):
                # What each step proves about the stored epoch at that moment: an
                # accepted put leaves it at exactly ``epoch``, a read sees it, and a
                # fenced put only proves it was higher.
                try:
                    await store.put(*key, _event(epoch, index))
                except RecordingFencedError:
                    outcomes.append(False)
                    seen.append((epoch + 1, False))
                else:
                    outcomes.append(True)
                    seen.append((epoch, True))
                index += 1
                stored = await store.read(*key)
                seen.append((-1 if stored is None else stored.epoch, True))
    return accepted, seen
