"""``tether simulate``: the seeded simulator replays exactly, and finds the races it was built for.

Each ``test_break_*`` replays the seed that first found one of the five
races of issue 24 (found from outside, before the supervision row had one
owner) with the options it was found with. They fail on the code before
that fix, so they are marked ``xfail(strict=True)`` here; the fix removes
the marks.
"""

from __future__ import annotations

import time

import pytest
from typer.testing import CliRunner

from tether.cli.main import app
from tether.simulation import Options, RunReport, history_seed, run_history

QUIET_SEED = 4
"""A history with turns in it that breaks nothing, even before the fix."""

# The seed of the history that first found each break (``--replay SEED``), and
# the run that found it: ``tether simulate --seed S`` after N histories.
BREAK_1 = 147020711  # --seed 7, the 1st history: a new turn claims over a dead one
BREAK_2 = 579723562  # --seed 7, the 64th: a kick starts a handed-off queued turn after its cancel
BREAK_3 = 1230778786  # --seed 8, the 24th: a takeover's checkpoint lands after the erase
BREAK_4 = 1476713353  # --seed 7, the 26th: the next turn claims between a cancel's row and partial


def test_a_seed_replays_the_same_history() -> None:
    first = run_history(QUIET_SEED, Options())
    again = run_history(QUIET_SEED, Options())
    assert first.schedule == again.schedule
    assert len(first.schedule) > 100
    noisy = run_history(1207114979, Options())
    assert noisy.schedule == run_history(1207114979, Options()).schedule
    assert noisy.violations == run_history(1207114979, Options()).violations


def test_the_command_ends_with_the_count_and_replays_a_seed() -> None:
    result = CliRunner().invoke(app, ["simulate", "--replay", str(QUIET_SEED)])
    assert result.exit_code == 0, result.output
    assert result.output.splitlines()[-1] == "1 histories, 0 violations"
    assert "send s0" in result.output  # the schedule is printed


def _replayed(seed: int) -> list[str]:
    return run_history(seed, Options()).violations


@pytest.mark.xfail(strict=True, reason="break 1, fixed in main")
def test_break_1_a_new_message_over_a_dead_turn_keeps_its_answer() -> None:
    assert _replayed(BREAK_1) == []


@pytest.mark.xfail(strict=True, reason="break 2, fixed in main")
def test_break_2_a_cancelled_queued_turn_never_runs() -> None:
    assert _replayed(BREAK_2) == []


@pytest.mark.xfail(strict=True, reason="break 3, fixed in main")
def test_break_3_an_erase_racing_a_takeover_is_final() -> None:
    assert _replayed(BREAK_3) == []


@pytest.mark.xfail(strict=True, reason="break 4, fixed in main")
def test_break_4_a_cancel_keeps_its_partial_when_the_next_turn_claims() -> None:
    assert _replayed(BREAK_4) == []


@pytest.mark.xfail(strict=True, reason="breaks 1-5, fixed in main")
def test_hundreds_of_histories_break_nothing() -> None:
    report = RunReport()
    started = time.perf_counter()
    for number in range(200):
        report.add(run_history(history_seed(24, number), Options()))
    assert time.perf_counter() - started < 60
    assert report.violations == 0, [h.violations[0] for h in report.failed[:5]]
