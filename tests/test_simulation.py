"""``tether simulate``: the seeded simulator replays exactly, and finds the races it was built for.

Each ``test_break_*`` replays the seed that first found one of the five
races of issue 24 (found from outside, before the supervision row had one
owner) with the options it was found with; each failed on the code before
that fix. ``FOUND_SINCE`` keeps the seeds of the races the simulator found
by itself on the way to zero (each failed before its own fix). The seeds
belong to the scheduler as it is: a change to its choices changes every
history, and the seeds must be found again.
"""

from __future__ import annotations

import time

import pytest
from typer.testing import CliRunner

from tether.cli.main import app
from tether.simulation import Options, RunReport, history_seed, run_history
from tether.simulation.gate import Gate, Parked

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


SLOW_SENSITIVE = 154521889
"""``history_seed(24, 583)``: a history whose followers, when they measured
real elapsed time, became another one on a loaded machine (and polled for
minutes instead of 0.1 s)."""
ORDER_SENSITIVE = 924980049
"""``history_seed(24, 521)``: a history whose followers the in-memory channel
woke in the order of their addresses, so that a rerun in the same process
took another turn. (A killed replica's tasks were cancelled in that order
too; that one differed between processes.)"""


def test_a_history_does_not_depend_on_how_long_its_steps_take(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A loaded machine, staged: every tenth step takes 30 ms of real time.
    (Not a wait for anything; the time is what the history must not see.)"""
    quick = run_history(SLOW_SENSITIVE, Options())
    release = Gate.release
    steps = 0

    def slow_release(gate: Gate, parked: Parked) -> None:
        nonlocal steps
        steps += 1
        if steps % 10 == 0:
            time.sleep(0.03)
        release(gate, parked)

    monkeypatch.setattr(Gate, "release", slow_release)
    slow = run_history(SLOW_SENSITIVE, Options())
    assert steps > 100
    assert slow.schedule == quick.schedule


def test_a_history_does_not_depend_on_where_its_objects_live() -> None:
    first = run_history(ORDER_SENSITIVE, Options()).schedule
    assert all(run_history(ORDER_SENSITIVE, Options()).schedule == first for _ in range(3))


def test_the_command_ends_with_the_count_and_replays_a_seed() -> None:
    result = CliRunner().invoke(app, ["simulate", "--replay", str(QUIET_SEED)])
    assert result.exit_code == 0, result.output
    assert result.output.splitlines()[-1] == "1 histories, 0 violations"
    assert "send s0" in result.output  # the schedule is printed


def _replayed(seed: int) -> list[str]:
    return run_history(seed, Options()).violations


def test_break_1_a_new_message_over_a_dead_turn_keeps_its_answer() -> None:
    assert _replayed(BREAK_1) == []


def test_break_2_a_cancelled_queued_turn_never_runs() -> None:
    assert _replayed(BREAK_2) == []


def test_break_3_an_erase_racing_a_takeover_is_final() -> None:
    assert _replayed(BREAK_3) == []


def test_break_4_a_cancel_keeps_its_partial_when_the_next_turn_claims() -> None:
    assert _replayed(BREAK_4) == []


FOUND_SINCE = {
    824584291: "an enqueue before the first turn recorded its question was lost",
    1646320725: "a queued turn's start claimed the row after its cancel returned",
    607516621: "a cancel removed a queued turn at an epoch read after a start's claim",
    1789552694: "the clean-up of a turn stopped for a cancel deleted its row first",
    810948490: "a cancel and the reaper each wrote a verdict for one turn",
    1316167367: "a claim that lost fenced the newer holder it had not seen",
    326098816: "an erase that lost its tombstone left a dead turn with no verdict",
    1616987884: "a queued turn fenced after recording its question gave its row back",
    1276445604: "a started queued turn with a stale heartbeat was cancelled as unstarted",
    1112264012: "a claim read the erase's tombstone dead and won after its renewal",
    1929247444: "an erase judged a turn live, then took its row as dead, and died",
    359838041: "a dead turn lost its verdict to an erase that stopped half way",
    749231069: "a queue waited forever behind a dead erase's tombstone",
    1645306185: "a refused resume ended its own turn, resumed elsewhere, then ran as new",
    1005424036: "a cancel that died half way was ended errored, then cancelled again",
    661026026: "a turn cancelled between its mark and its agent's start started it",
    719993441: "a cancel took a stalled ender's row and said cancelled over its errored answer",
    2030845472: "a rollback removed a cancelled turn's question but not the queued copy a "
    "fenced start had left, so the copy read as waiting and the turn ran again",
    640167408: "a retention prune died holding its tombstone and nothing finished it",
    869320828: "an erase died holding its tombstone and nothing finished it",
    1011549266: "an erase died holding its tombstone and nothing finished it",
    2045729741: "an interrupt cancelled an erase's tombstone as if it were a turn",
    2083313695: "the model held a turn to its answer after an erase that died had removed it",
}


@pytest.mark.parametrize("seed", sorted(FOUND_SINCE), ids=str)
def test_a_race_the_simulator_found_stays_fixed(seed: int) -> None:
    assert _replayed(seed) == [], FOUND_SINCE[seed]


@pytest.mark.timeout(400)  # about 10 s alone; several times that beside the whole suite
@pytest.mark.parametrize("first", range(0, 3000, 500))
def test_three_thousand_histories_break_nothing(first: int) -> None:
    """3,000 histories in ``make test``, in six parts so that test workers
    share them (``tether simulate --histories N`` runs more)."""
    report = RunReport()
    for number in range(first, first + 500):
        report.add(run_history(history_seed(24, number), Options()))
    assert report.violations == 0, [(h.seed, h.violations[0]) for h in report.failed[:5]]
