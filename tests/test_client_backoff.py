"""The client's retries back off with jitter, so clients that failed together
(a replica died under all of them) do not come back together.

The random source is injected: each pause is drawn between half its step and
the step (50 ms doubling to 1 s), and a Retry-After is a floor.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Iterator

import httpx2
import pytest

from tether.client import routes
from tether.client.backoff import Backoff
from tether.client.recovery import Timeouts, TurnDriver, TurnKnowledge

STEPS = [0.05, 0.1, 0.2, 0.4, 0.8, 1.0, 1.0]


def test_each_pause_lies_between_half_its_step_and_the_step() -> None:
    lowest = Backoff(0.05, 1.0, random=lambda: 0.0)
    assert [lowest.next() for _ in STEPS] == [step / 2 for step in STEPS]
    highest = Backoff(0.05, 1.0, random=lambda: 1.0)
    assert [highest.next() for _ in STEPS] == STEPS


def test_two_clients_that_fail_together_pause_differently() -> None:
    first = Backoff(0.05, 1.0, random=random.Random(1).random)
    second = Backoff(0.05, 1.0, random=random.Random(2).random)
    pauses = [(first.next(), second.next()) for _ in STEPS]
    for (a, b), step in zip(pauses, STEPS, strict=True):
        assert step / 2 <= a <= step and step / 2 <= b <= step
        assert a != b


def test_a_retry_after_is_a_floor_and_progress_starts_over() -> None:
    backoff = Backoff(0.05, 1.0, random=lambda: 0.0)
    assert backoff.next(at_least=0.5) == 0.5
    assert backoff.next(at_least=30) == 1.0  # capped: another replica may answer sooner
    backoff.reset()
    assert backoff.next() == 0.025


class _Unusable:
    """Endpoints with no usable URL, for ``tries`` asks; then the test is over."""

    def __init__(self, tries: int) -> None:
        self.tries = tries

    def current(self) -> str | None:
        self.tries -= 1
        if self.tries < 0:
            raise _Over
        return None

    def failed(self, url: str) -> None:
        pass


class _Over(Exception):
    pass


@pytest.fixture
def pauses(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[float]]:
    """Every pause the driver sleeps, recorded instead of slept."""
    recorded: list[float] = []
    real_sleep = asyncio.sleep

    async def record(delay: float) -> None:
        recorded.append(delay)
        await real_sleep(0)

    monkeypatch.setattr("tether.client.recovery.asyncio.sleep", record)
    yield recorded


async def test_the_turn_driver_pauses_with_the_injected_jitter(pauses: list[float]) -> None:
    async with httpx2.AsyncClient() as http:
        driver = TurnDriver(
            http=http,
            endpoints=_Unusable(tries=5),
            tenant="t",
            state=TurnKnowledge(session_id="s"),
            timeouts=Timeouts(
                stream=httpx2.Timeout(1), control=httpx2.Timeout(1), recovery=60, patience=60
            ),
            start=routes.status("t", "s"),
            random=lambda: 0.0,
        )
        with pytest.raises(_Over):
            async for _ in driver.run():
                pass
    assert pauses == [step / 2 for step in STEPS[:5]]
