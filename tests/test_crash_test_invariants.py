"""The crash test's checker (``tether.crashtest.invariants``): each invariant catches its fault.

Every test feeds ``check_round`` doctored evidence of one round (what the
readers were streamed, the transcript, the turn's status, the stored
checkpoint and recording, the fence, a cancel's verdicts, the tool-call
ledger's runs) and shows that a sound round passes while each fault the
invariant is for fails it: a duplicated user message, a regressing index, text
shown and taken back, two answers, a fenced producer that wrote, a cancel with
two verdicts, and the at-most-once rule of tool calls (a write that ran twice,
a cut-off write shown as done, a completed call run again, a cut-off read not
run again), with the report's count of the tool calls.
"""

from __future__ import annotations

from typing import Any

from tether.crashtest.client import TurnStatus
from tether.crashtest.instruments.tool_ledger import ToolRun
from tether.crashtest.invariants import (
    CancelEvidence,
    Expected,
    FenceEvidence,
    Observed,
    ReaderTrace,
    SeenEvent,
    Snapshot,
    StoredTurn,
    ToolCalls,
    check_round,
    normalize_all,
    rewound_characters,
)
from tether.crashtest.results import RoundResult, tool_call_counts

PROMPT = "Tell me about rivers and the towns along them."
BREAK = 5000


# ---------------------------------------------------------------- the checker


def _bot(content: str, *, tool_status: str = "completed") -> dict[str, Any]:
    return {
        "sender": "bot",
        "content": content,
        "message_id": "m",
        "session_id": "s",
        "content_parts": [
            {"type": "text", "text": content},
            {
                "type": "tool",
                "tool": {"tool_call_id": "c1", "name": "calculator", "status": tool_status},
            },
        ],
    }


def _user() -> dict[str, Any]:
    return {"sender": "user", "content": PROMPT, "message_id": "m-user", "session_id": "s"}


ANSWER = "The calculator says 2 + 2 = 4. The river follows the road."
EXPECTED = Expected(PROMPT, normalize_all([_user(), _bot(ANSWER)]), tool_runs=1)


def _sound_round() -> Observed:
    """A killed-and-resumed round as it should look: the start reader, then a
    resume whose indexes begin past anything seen, going on from at least the
    text the start reader was shown."""
    start = ReaderTrace(
        "start",
        tuple(SeenEvent(i, _bot(ANSWER[: 10 + i], tool_status="running")) for i in range(5)),
        consumed=5,
    )
    resume = ReaderTrace(
        "resume",
        (SeenEvent(10_003, _bot(ANSWER[:16])), SeenEvent(10_004, _bot(ANSWER))),
        consumed=2,
    )
    return Observed(
        transcript=[_user(), {**_bot(ANSWER), "message_id": "other"}],
        final_status=TurnStatus("m", "done", 2, "t"),
        tool_runs=1,
        readers=[start, resume],
        final_streamed=_bot(ANSWER),
    )


def _invariants(observed: Observed) -> set[str]:
    return {v.invariant for v in check_round(EXPECTED, observed, producer_break=BREAK)}


def test_the_checker_passes_a_sound_round() -> None:
    assert check_round(EXPECTED, _sound_round(), producer_break=BREAK) == []


def test_the_checker_catches_a_duplicated_user_message() -> None:
    observed = _sound_round()
    assert observed.transcript is not None
    observed.transcript.insert(1, _user())
    # Two user messages and one answer: also a turn left without its answer.
    assert _invariants(observed) == {"user-message", "transcript", "one-answer"}


def test_the_checker_catches_a_regressing_index() -> None:
    observed = _sound_round()
    start = observed.readers[0]
    events = list(start.events)
    events[3] = SeenEvent(1, events[3].message)
    observed.readers[0] = ReaderTrace(start.label, tuple(events), start.consumed)
    # Index 1 again, with other text: also one stream id with two contents.
    assert _invariants(observed) == {"no-regress", "unique-ids"}


def test_the_checker_catches_a_replay_across_readers() -> None:
    observed = _sound_round()
    observed.readers.append(ReaderTrace("attach", (SeenEvent(4, _bot(ANSWER)),), consumed=1))
    # The start reader got index 4 with a shorter text: also two contents for one id.
    assert _invariants(observed) == {"no-regress", "unique-ids"}


def test_the_checker_catches_shrinking_content_within_one_producer() -> None:
    observed = _sound_round()
    resume = observed.readers[1]
    shrunk = (SeenEvent(10_003, _bot(ANSWER)), SeenEvent(10_004, _bot(ANSWER[:20])))
    observed.readers[1] = ReaderTrace(resume.label, shrunk, resume.consumed)
    assert _invariants(observed) == {"no-regress", "shown-kept"}


def test_the_checker_catches_text_rewound_across_a_takeover_and_counts_it() -> None:
    """The successor resumed from an older recording than the start reader was
    shown: its first message takes 2 characters back (582, 563, 582 on a screen)."""
    observed = _sound_round()
    assert rewound_characters(observed) == 0
    resume = observed.readers[1]
    rewound = (SeenEvent(10_003, _bot(ANSWER[:12])), SeenEvent(10_004, _bot(ANSWER)))
    observed.readers[1] = ReaderTrace(resume.label, rewound, resume.consumed)
    # Across producers, which ``no-regress`` allows: only ``shown-kept`` sees it.
    assert _invariants(observed) == {"shown-kept"}
    assert rewound_characters(observed) == 2


def test_the_checker_catches_a_changed_text_and_a_kept_answer_that_drops_what_was_shown() -> None:
    observed = _sound_round()
    resume = observed.readers[1]
    changed = ANSWER[:14] + "X"
    events = (SeenEvent(10_003, _bot(changed)),)
    observed.readers[1] = ReaderTrace(resume.label, events, consumed=1)
    assert _invariants(observed) == {"shown-kept"}
    # The screen took nothing back from 14 characters, and then the kept
    # answer took back the 1 changed character it was last shown.
    assert rewound_characters(observed) == 1


def test_the_checker_catches_a_second_tool_execution() -> None:
    observed = _sound_round()
    observed.tool_runs = 2
    assert _invariants(observed) == {"tool-once"}


def test_a_fault_before_the_tool_result_was_shown_allows_one_more_run_never_two() -> None:
    # The fault may have fallen between the call and the checkpoint holding its
    # result: the resume cannot know the call completed (at-least-once until
    # issue 14). Once a result was shown, tool-once is strict (the test above).
    observed = _sound_round()
    observed.tool_outcome_unknown = True
    observed.tool_runs = 2
    assert _invariants(observed) == set()
    observed.tool_runs = 3
    assert _invariants(observed) == {"tool-once"}


def test_the_checker_catches_a_different_answer_and_an_unfinished_turn() -> None:
    observed = _sound_round()
    assert observed.transcript is not None
    observed.transcript[-1] = _bot(ANSWER + " And again.")
    observed.final_status = TurnStatus("m", "errored", 2, "t")
    assert _invariants(observed) == {"transcript", "terminal"}


def test_the_checker_catches_a_fenced_producer_that_wrote() -> None:
    observed = _sound_round()
    left = Snapshot(TurnStatus("m", "done", 2, "t1"), EXPECTED.transcript)
    observed.fence = FenceEvidence(
        epoch_before_fault=1,
        left_by_new_owner=left,
        after_continue=Snapshot(TurnStatus("m", "done", 1, "t2"), EXPECTED.transcript),
        old_readers_ended=True,
        recorded_final=_bot(ANSWER),
        recorded_epoch=1,
        checkpoint_epoch=2,
    )
    violations = check_round(EXPECTED, observed, producer_break=BREAK)
    assert {v.invariant for v in violations} == {"fenced"}
    assert len(violations) == 2  # the row changed; the recording carries the old epoch


# ------------------------------------------------------- the new checker rules


def test_the_checker_catches_two_answers_for_one_turn() -> None:
    observed = _sound_round()
    observed.message_id = "m"
    assert observed.transcript is not None
    observed.transcript[-1] = _bot(ANSWER)  # the turn's own message id
    assert check_round(EXPECTED, observed, producer_break=BREAK) == []
    observed.transcript.append(_bot(ANSWER))
    assert "one-answer" in _invariants(observed)
    observed.transcript[1:] = []  # no answer at all
    assert "one-answer" in _invariants(observed)


def _stored(**changes: Any) -> StoredTurn:
    fields: dict[str, Any] = {
        "recorded_final": _bot(ANSWER),
        "recorded_epoch": 2,
        "recorded_message_id": "m",
        "checkpoint_epoch": 2,
        "checkpoint_message_id": "m",
        "checkpoint_input": ({"sender": "user", "content": PROMPT},),
    }
    return StoredTurn(**{**fields, **changes})


def test_the_checker_catches_a_checkpoint_of_another_turn_or_question() -> None:
    observed = _sound_round()
    observed.message_id = "m"
    assert observed.transcript is not None
    observed.transcript[-1]["message_id"] = "m"
    observed.stored = _stored()
    assert check_round(EXPECTED, observed, producer_break=BREAK) == []
    observed.stored = _stored(checkpoint_message_id="an-older-turn")
    assert _invariants(observed) == {"own-checkpoint"}
    # A resume that answered its empty body instead of the turn's question.
    observed.stored = _stored(checkpoint_input=())
    assert _invariants(observed) == {"own-checkpoint"}
    observed.stored = _stored(checkpoint_message_id=None)
    assert _invariants(observed) == {"own-checkpoint"}


def test_the_checker_catches_a_stream_id_with_two_contents() -> None:
    observed = _sound_round()
    # A fenced producer's reader that got index 3 again, with other text.
    stale = ReaderTrace("start", (SeenEvent(3, _bot(ANSWER[:5]), "m:3"),), consumed=0)
    observed.readers.append(stale)
    for reader in observed.readers[:2]:
        index = observed.readers.index(reader)
        events = tuple(SeenEvent(e.index, e.message, f"m:{e.index}") for e in reader.events)
        observed.readers[index] = ReaderTrace(reader.label, events, reader.consumed)
    assert _invariants(observed) == {"unique-ids"}
    # The same id with the same message is a replay, not a violation.
    observed.readers[-1] = ReaderTrace(
        "attach", (SeenEvent(3, observed.readers[0].events[3].message, "m:3"),), consumed=0
    )
    assert check_round(EXPECTED, observed, producer_break=BREAK) == []


def _cancelled_round(kept: str, **cancel: Any) -> Observed:
    observed = _sound_round()
    observed.message_id = "m"
    observed.final_status = TurnStatus("m", "cancelled", 2, "t")
    observed.transcript = [_user(), _bot(kept)]
    observed.final_streamed = None
    observed.last_turn_status = "cancelled"
    fields = {"response_status": 204, "reader_verdict": "cancelled", **cancel}
    observed.cancel = CancelEvidence(**fields)
    return observed


def test_the_checker_passes_a_cancel_at_the_end_either_way() -> None:
    assert check_round(EXPECTED, _cancelled_round(ANSWER[:30]), producer_break=BREAK) == []
    done = _sound_round()
    done.message_id = "m"
    done.transcript = [_user(), _bot(ANSWER)]
    done.last_turn_status = "complete"
    done.cancel = CancelEvidence(response_status=410, reader_verdict="done")
    assert check_round(EXPECTED, done, producer_break=BREAK) == []


def test_the_checker_catches_a_cancel_with_two_verdicts() -> None:
    # Accepted, yet the turn says done.
    accepted = _cancelled_round(ANSWER)
    accepted.final_status = TurnStatus("m", "done", 2, "t")
    accepted.last_turn_status = "complete"
    assert _invariants(accepted) == {"verdict"}
    # The transcript's last turn and the supervision row disagree.
    assert _invariants(_cancelled_round(ANSWER[:30], response_status=409)) == set()
    mixed = _cancelled_round(ANSWER[:30])
    mixed.last_turn_status = "complete"
    assert _invariants(mixed) == {"verdict"}
    # The client's stream said done; the row says cancelled.
    assert _invariants(_cancelled_round(ANSWER[:30], reader_verdict="done")) == {"verdict"}
    # Too late (410), yet cancelled.
    assert _invariants(_cancelled_round(ANSWER[:30], response_status=410)) == {"verdict"}


def test_the_checker_catches_a_bad_partial_answer_of_a_cancelled_turn() -> None:
    assert _invariants(_cancelled_round("Something else entirely.")) == {"transcript"}
    twice = _cancelled_round(ANSWER[:30])
    assert twice.transcript is not None
    twice.transcript.append(_bot(ANSWER[:30]))
    assert _invariants(twice) == {"one-answer"}
    ran_again = _cancelled_round(ANSWER[:30])
    ran_again.tool_runs = 2
    assert _invariants(ran_again) == {"tool-once"}
    errored = _cancelled_round(ANSWER[:30])
    errored.final_status = TurnStatus("m", "errored", 2, "t")
    assert "terminal" in _invariants(errored)


def test_without_a_conversation_store_the_recording_is_the_answer() -> None:
    observed = _sound_round()
    observed.message_id = "m"
    observed.transcript = None
    observed.conversation_store = False
    observed.stored = _stored()
    assert check_round(EXPECTED, observed, producer_break=BREAK) == []
    observed.stored = _stored(recorded_final=_bot(ANSWER[:20]))
    # Kept shorter than what the readers were shown: also text taken back.
    assert _invariants(observed) == {"transcript", "shown-kept"}
    observed.stored = _stored(recorded_final=None, recorded_message_id=None)
    assert _invariants(observed) == {"transcript"}
    observed.stored = _stored()
    observed.final_streamed = _bot(ANSWER + " More.")
    assert _invariants(observed) == {"transcript"}


# ------------------------------------------------ the at-most-once rule of tool calls

UNKNOWN = (
    "The call to send_note may or may not have happened: the server running it stopped "
    "before it could record the result."
)
OPENING = "The river keeps the road. Let me check with the calculator and the send_note."


def _tool_answer(
    note: tuple[str, str] = ("completed", "note sent"),
    reply: str = "The send_note tool returned note sent. The river follows the road.",
    calculator: tuple[str, str] = ("completed", "2002"),
) -> dict[str, Any]:
    def call(call_id: str, name: str, params: dict[str, Any], outcome: tuple[str, str]) -> Any:
        status, response = outcome
        return {
            "type": "tool",
            "tool": {
                "tool_call_id": call_id, "name": name, "params": params,
                "status": status, "response": response,
            },
        }  # fmt: skip

    return {
        "sender": "bot",
        "content": f"{OPENING}\n\n{reply}",
        "message_id": "m",
        "session_id": "s",
        "content_parts": [
            {"type": "text", "text": OPENING},
            call("c0", "calculator", {"expression": "2 * 1001"}, calculator),
            call("c1", "send_note", {"text": "hello"}, note),
            {"type": "text", "text": reply},
        ],
    }


TOOL_EXPECTED = Expected(PROMPT, normalize_all([_user(), _tool_answer()]), tool_runs=2)


def _ran(index: int, attempt: int, pid: int, started: int, ended: int | None = None) -> ToolRun:
    tool, policy = ("calculator", "retry") if index == 0 else ("send_note", "fail")
    return ToolRun(f"m:{index}", tool, policy, attempt, pid, ended is not None, started, ended)


def _write_cut_off() -> Observed:
    """A tool round as it should end: the calculator ran and completed, the
    kill cut send_note off, and the resume told the model it may or may not
    have happened (the model's reply differs from the crash-free one)."""
    answer = _tool_answer(
        note=("error", UNKNOWN), reply=f"The send_note tool returned Error: {UNKNOWN} The end."
    )
    return Observed(
        transcript=[_user(), answer],
        final_status=TurnStatus("m", "done", 2, "t"),
        tool_runs=2,
        final_streamed=answer,
        message_id="m",
        tool_calls=ToolCalls((_ran(0, 1, 100, 0, 1), _ran(1, 1, 100, 2))),
    )


def _tool_invariants(observed: Observed) -> set[str]:
    return {v.invariant for v in check_round(TOOL_EXPECTED, observed, producer_break=BREAK)}


def test_the_checker_passes_a_write_cut_off_by_a_kill() -> None:
    observed = _write_cut_off()
    assert check_round(TOOL_EXPECTED, observed, producer_break=BREAK) == []
    assert observed.tool_calls is not None and observed.tool_calls.unknown() == {1}


def test_the_checker_catches_a_write_that_ran_twice() -> None:
    # The resume ran send_note again (attempt 2 on the survivor) and showed it done.
    observed = _write_cut_off()
    assert observed.tool_calls is not None
    again = (*observed.tool_calls.runs, _ran(1, 2, 200, 3, 4))
    observed.tool_calls = ToolCalls(again)
    observed.transcript = [_user(), _tool_answer()]
    observed.final_streamed = _tool_answer()
    observed.tool_runs = 3
    violations = check_round(TOOL_EXPECTED, observed, producer_break=BREAK)
    assert {v.invariant for v in violations} == {"at-most-once", "tool-once"}
    assert any("send_note, on_unknown=fail) ran 2 times" in v.detail for v in violations)
    # Twice is too many even where the transcript still says "unknown".
    observed = _write_cut_off()
    observed.tool_calls = ToolCalls((_ran(0, 1, 100, 0, 1), _ran(1, 1, 100, 2), _ran(1, 2, 200, 3)))
    observed.tool_runs = 3
    assert _tool_invariants(observed) == {"at-most-once", "tool-once"}


def test_the_checker_catches_a_cut_off_write_shown_as_done() -> None:
    observed = _write_cut_off()
    observed.transcript = [_user(), _tool_answer()]
    observed.final_streamed = _tool_answer()
    violations = check_round(TOOL_EXPECTED, observed, producer_break=BREAK)
    assert {v.invariant for v in violations} == {"at-most-once", "transcript"}
    assert any("shown completed but no run of it ended" in v.detail for v in violations)


def test_the_checker_catches_a_completed_call_run_again() -> None:
    # The calculator completed, send_note started after it (so its result was
    # checkpointed), and still it ran again: a retry tool, but not completed ones.
    observed = _write_cut_off()
    observed.tool_calls = ToolCalls(
        (_ran(0, 1, 100, 0, 1), _ran(1, 1, 100, 2), _ran(0, 2, 200, 3, 4))
    )
    violations = check_round(TOOL_EXPECTED, observed, producer_break=BREAK)
    assert "at-most-once" in {v.invariant for v in violations}
    assert any("ran again after it completed" in v.detail for v in violations)


def test_the_checker_catches_a_cut_off_read_not_run_again() -> None:
    # The calculator (retry) was cut off; the resume settled it as unknown
    # instead of running it again.
    answer = _tool_answer(calculator=("error", UNKNOWN))
    observed = Observed(
        transcript=[_user(), answer],
        final_status=TurnStatus("m", "done", 2, "t"),
        tool_runs=2,
        message_id="m",
        tool_calls=ToolCalls((_ran(0, 1, 100, 0), _ran(1, 1, 200, 1, 2))),
    )
    assert _tool_invariants(observed) == {"at-most-once", "transcript"}
    # Run again with the same key, as attempt 2: the crash-free answer.
    observed.transcript = [_user(), _tool_answer()]
    observed.tool_calls = ToolCalls(
        (_ran(0, 1, 100, 0), _ran(0, 2, 200, 1, 2), _ran(1, 1, 200, 3, 4))
    )
    observed.tool_runs, observed.tool_outcome_unknown = 3, True
    assert check_round(TOOL_EXPECTED, observed, producer_break=BREAK) == []
    # A second attempt 1: the run was never recorded as started.
    observed.tool_calls = ToolCalls(
        (_ran(0, 1, 100, 0), _ran(0, 1, 200, 1, 2), _ran(1, 1, 200, 3, 4))
    )
    assert _tool_invariants(observed) == {"at-most-once"}


def test_the_cut_off_write_changes_only_its_result_and_the_reply_after_it() -> None:
    """What the transcript check still compares when a write was cut off."""

    def answer(**changes: Any) -> dict[str, Any]:
        changed = _tool_answer(note=("error", UNKNOWN), reply="Another reply.")
        for key, value in changes.items():
            changed["content_parts"][int(key[1:])] = value
        return changed

    observed = _write_cut_off()
    observed.final_streamed = None
    for transcript in (
        [_user(), answer(p0={"type": "text", "text": "Another opening."})],
        [_user(), answer(p1=_tool_answer(calculator=("completed", "2003"))["content_parts"][1])],
        [_user(), {**answer(), "content_parts": answer()["content_parts"][:3]}],
        [_user(), _user(), answer()],
    ):
        observed.transcript = transcript
        assert "transcript" in _tool_invariants(observed), transcript
    observed.transcript = [_user(), answer()]
    assert "transcript" not in _tool_invariants(observed)


def test_the_report_counts_the_tool_calls() -> None:
    def result(*calls: dict[str, Any]) -> RoundResult:
        return RoundResult(1, "r1", "tool", "in fail tool call", PROMPT, tool_calls=list(calls))

    def call(policy: str, runs: int, cut_off: bool, shown: str) -> dict[str, Any]:
        return {"on_unknown": policy, "runs": runs, "cut_off": cut_off, "shown": shown}

    counts = tool_call_counts(
        [
            result(call("retry", 1, False, "completed"), call("fail", 1, True, "unknown")),
            result(call("retry", 2, True, "completed"), call("fail", 2, False, "completed")),
            result(),
        ]
    )
    assert counts == {
        "turns": 2, "calls": 4, "runs": 6,
        "cut_off_at_most_once": 1, "cut_off_at_most_once_ran_once": 1,
        "cut_off_at_most_once_shown_unknown": 1,
        "cut_off_retry": 1, "cut_off_retry_ran_again": 1,
        "at_most_once_ran_twice": 1, "completed_ran_again": 1,
    }  # fmt: skip
