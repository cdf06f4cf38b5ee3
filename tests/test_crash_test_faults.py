"""The crash test's fault planning (``tether.crashtest.faults``), in process.

``plan_fault`` draws, from a seeded random source and the crash-free turn's
shape, where each round's fault lands: every planned fault falls inside the
turn (by messages or seconds; a turn shorter than the checkpoint interval is
never faulted at a checkpoint), a pause in a write picks a call among the
writes the turn makes, a rolling deploy's and a cancel's timings stay within
the answer, and tool rounds kill inside a call of a policy the tool agent has;
``draw_kind`` draws tool rounds for ``mixed`` only where the project has the
tool agent.
"""

from __future__ import annotations

import random

from tether.crashtest.faults import (
    FaultChoice,
    FaultKind,
    FaultPoint,
    TurnShape,
    draw_kind,
    plan_fault,
)
from tether.crashtest.instruments.pause_in_write import WriteKind


def test_every_planned_fault_lands_inside_the_turn() -> None:
    rng = random.Random(3)
    shape = TurnShape(messages=200, duration=20.0, tool_message=11)
    plans = [plan_fault(rng, FaultChoice.MIXED, shape, checkpoint_interval=5.0) for _ in range(200)]
    assert {plan.kind for plan in plans} == {k for k in FaultKind if not k.conversational}
    assert {plan.point for plan in plans} == set(FaultPoint)
    for plan in plans:
        if plan.after_messages is not None:
            assert 2 <= plan.after_messages <= 170
        if plan.after_seconds is not None:
            assert 4.9 <= plan.after_seconds <= 17.0 + 0.25
    short = TurnShape(messages=80, duration=2.0, tool_message=6)
    for _ in range(50):
        plan = plan_fault(rng, FaultChoice.STOP, short, checkpoint_interval=5.0)
        assert plan.kind is FaultKind.STOP and plan.point is not FaultPoint.CHECKPOINT


def test_new_faults_plan_inside_the_turn_and_the_writes_it_makes() -> None:
    rng = random.Random(5)
    shape = TurnShape(messages=200, duration=20.0, tool_message=11)
    writes = (WriteKind.CHECKPOINT, WriteKind.RECORDING)
    pauses = [
        plan_fault(
            rng, FaultChoice.PAUSE_IN_WRITE, shape, checkpoint_interval=5.0, conversations=4,
            writes=writes,
        )
        for _ in range(200)
    ]  # fmt: skip
    assert {plan.pause.kind for plan in pauses if plan.pause} == set(writes)
    for plan in pauses:
        assert plan.pause is not None and plan.point is FaultPoint.WRITE
        if plan.pause.kind is WriteKind.CHECKPOINT:
            # 3 periodic, before and after the tool call, at the end: 6 a turn, 4 turns.
            assert 1 <= plan.pause.call <= 24
        else:
            assert 3 <= plan.pause.call <= 34  # one batch each 0.5 s
    sealing = plan_fault(
        rng, FaultChoice.PAUSE_IN_WRITE, shape, 5.0, conversations=3,
        writes=(WriteKind.TRANSCRIPT,),
    )  # fmt: skip
    assert sealing.pause is not None and 1 <= sealing.pause.call <= 3
    for _ in range(50):
        rolling = plan_fault(rng, FaultChoice.ROLLING_DEPLOY, shape, 5.0)
        assert rolling.after_messages is not None and 2 <= rolling.after_messages <= 70
        assert rolling.second_after is not None and 1 <= rolling.second_after <= 30
        cancel = plan_fault(rng, FaultChoice.CANCEL_AT_END, shape, 5.0)
        assert cancel.before_end is not None and 0 <= cancel.before_end <= 3


def test_tool_rounds_kill_inside_a_call_of_a_policy_the_agent_has() -> None:
    rng = random.Random(2)
    shape = TurnShape(80, 2.0, 6, tool_policies=("retry", "fail"))
    plans = [plan_fault(rng, FaultChoice.TOOL, shape, 5.0) for _ in range(60)]
    assert {plan.hold for plan in plans} == {"fail", "retry"}
    for plan in plans:
        assert (plan.kind, plan.point, plan.variant) == (
            FaultKind.TOOL,
            FaultPoint.IN_TOOL,
            plan.hold,
        )
        assert plan.describe() == f"in {plan.hold} tool call"
    writes_only = TurnShape(80, 2.0, 6, tool_policies=("fail",))
    assert {plan_fault(rng, FaultKind.TOOL, writes_only, 5.0).hold for _ in range(20)} == {"fail"}
    # mixed draws tool rounds only where the project has the tool agent.
    assert FaultKind.TOOL in {draw_kind(rng, FaultChoice.MIXED) for _ in range(300)}
    drawn = {draw_kind(rng, FaultChoice.MIXED, tool_rounds=False) for _ in range(300)}
    # The conversation rounds are asked for by name, never drawn for mixed.
    assert drawn == set(FaultKind) - {FaultKind.TOOL, FaultKind.QUEUE, FaultKind.ERASE}
