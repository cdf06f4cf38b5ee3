"""The crash test's checks of a conversation of several turns."""

from __future__ import annotations

from typing import Any

from tether.crashtest.conversation_checks import (
    ErasedEvidence,
    TurnTrace,
    check_conversation,
    check_erased,
    rewound,
)

ANSWER = "The river runs past the mill."
ANSWERS = {"p": ANSWER}


def _user(turn: str) -> dict[str, Any]:
    return {"sender": "user", "message_id": f"{turn}-user", "content": "p"}


def _bot(turn: str, content: str = ANSWER, **context: Any) -> dict[str, Any]:
    message: dict[str, Any] = {"sender": "bot", "message_id": turn, "content": content}
    if context:
        message["content_parts"] = [
            {"type": "text", "text": content},
            {"type": "context", "context": context},
        ]
    return message


def _turn(turn: str, outcome: str = "done", strategy: str = "first", **changes: Any) -> TurnTrace:
    trace = TurnTrace("p", strategy, turn, outcome, shown=[ANSWER[:10], ANSWER])
    for name, value in changes.items():
        setattr(trace, name, value)
    return trace


def _invariants(turns: list[TurnTrace], transcript: list[dict[str, Any]]) -> set[str]:
    return {v.invariant for v in check_conversation(turns, transcript, ANSWERS)}


def test_rewound_counts_the_characters_taken_back() -> None:
    assert rewound(["ab", "abc", "abcd"]) == 0
    assert rewound(["abcdef", "abc", "abcdef"]) == 3
    assert rewound(["abX", "abY"]) == 1


def test_an_enqueued_conversation_in_order_passes() -> None:
    turns = [_turn("a"), _turn("b", strategy="enqueue")]
    transcript = [_user("a"), _bot("a"), _user("b"), _bot("b")]
    assert _invariants(turns, transcript) == set()


def test_an_interrupted_turn_keeps_a_marked_beginning_of_its_answer() -> None:
    turns = [_turn("a", "cancelled", shown=[ANSWER[:9]]), _turn("b", strategy="interrupt")]
    kept = _bot("a", ANSWER[:9], turn_cancelled=True)
    assert _invariants(turns, [_user("a"), kept, _user("b"), _bot("b")]) == set()
    wrong = _bot("a", "Not what it said", turn_cancelled=True)
    assert _invariants(turns, [_user("a"), wrong, _user("b"), _bot("b")]) == {"answer"}


def test_a_rollback_leaves_nothing_of_the_turn_it_interrupted() -> None:
    turns = [_turn("a", "cancelled"), _turn("b", strategy="rollback")]
    assert _invariants(turns, [_user("b"), _bot("b")]) == set()


def test_a_lost_answer_two_questions_in_a_row_and_two_endings_are_caught() -> None:
    turns = [_turn("a", "errored"), _turn("b")]
    assert "form" in _invariants(turns, [_user("a"), _user("b"), _bot("b")])
    assert "verdict" in _invariants(turns, [_user("b"), _bot("b")])
    told_done = [_turn("a", "done"), _turn("b", strategy="reject")]
    cancelled = _bot("a", ANSWER[:9], turn_cancelled=True)
    assert "verdict" in _invariants(told_done, [_user("a"), cancelled, _user("b"), _bot("b")])


def test_what_each_strategy_promises() -> None:
    transcript = [_user("a"), _bot("a")]
    refused = _turn("b", None, strategy="reject", refused=True, message_id=None, shown=[])
    assert _invariants([_turn("a"), refused], transcript) == set()
    enqueue_refused = _turn("b", None, strategy="enqueue", refused=True, message_id=None)
    assert _invariants([_turn("a"), enqueue_refused], transcript) == {"strategy"}
    waited_for_a_cancel = [
        _turn("a", "cancelled", shown=[ANSWER[:9]]),
        _turn("b", strategy="enqueue"),
    ]
    kept = _bot("a", ANSWER[:9], turn_cancelled=True)
    full = [_user("a"), kept, _user("b"), _bot("b")]
    assert _invariants(waited_for_a_cancel, full) == {"strategy"}


def test_text_shown_and_taken_back_is_caught() -> None:
    turns = [_turn("a", shown=[ANSWER[:20], ANSWER[:12], ANSWER])]
    found = check_conversation(turns, [_user("a"), _bot("a")], ANSWERS)
    assert [(v.invariant, "8 characters" in v.detail) for v in found] == [("shown", True)]


def test_an_erase_that_left_something_is_caught() -> None:
    assert check_erased(ErasedEvidence(204, (), ())) == []
    assert [v.invariant for v in check_erased(ErasedEvidence(None, (), ()))] == ["erased"]
    left = check_erased(ErasedEvidence(204, ("r2's turn status (done)",), ("recording",)))
    assert len(left) == 2
