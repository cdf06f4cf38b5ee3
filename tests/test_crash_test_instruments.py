"""The crash test's instruments in process: the pause in a write and the tool-call ledger.

``tether.crashtest.instruments.pause_in_write`` is driven on in-memory stores
with a stand-in for SIGSTOP: it stops the process just before the chosen
checkpoint, sealing transcript append or recording batch, once the process's
other store calls are done, and patches nothing without its variable.
``tether.crashtest.instruments.tool_ledger`` counts each run of a recorded
tool, outside the servers, and holds a call of the held policy until released.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import pytest

from tether.adapters.memory import (
    InMemoryChatAgentStateStore,
    InMemoryChatConversationStore,
    InMemoryChatStreamRecordingStore,
)
from tether.crashtest.instruments.pause_in_write import (
    PAUSE_IN_VARIABLE,
    PauseInWrite,
    WriteKind,
    install,
    install_from_env,
)
from tether.crashtest.instruments.tool_ledger import LEDGER_VARIABLE, ToolLedger, ToolRun, recorded
from tether.domain.chat_agent_state_store import TURN_STATE_KEY
from tether.domain.chat_message import ChatMessage, ChatMessageSender
from tether.domain.chat_stream_recording_store import RecordedStreamEvent, RecordingPut
from tether.stores import StoreBundle
from tether.testing.interleavings import hold
from tether.tools import ToolCallContext, running_tool_call, tool

# ------------------------------------------------- the in-process pause in a write


class _Stop:
    """Stands in for SIGSTOP: records when the process would have stopped."""

    def __init__(self, seen: Any = None) -> None:
        self.calls = 0
        self.seen = seen
        self.saw: list[Any] = []

    def __call__(self) -> None:
        self.calls += 1
        self.saw.append(self.seen() if self.seen is not None else None)


def _state(progress: bool, note: str) -> dict[str, Any]:
    return {"dep": {"note": note}, TURN_STATE_KEY: {"message_id": "m", "progress": progress}}


async def test_the_pause_stops_the_process_just_before_the_chosen_checkpoint() -> None:
    store = InMemoryChatAgentStateStore()
    stop = _Stop(seen=lambda: asyncio.run_coroutine_threadsafe)  # replaced below

    async def saved() -> Any:
        return (await store.load("t", "u", "s")).get("dep")

    notes: list[Any] = []
    stop.seen = None
    gate = install(StoreBundle(agent_state_store=store), PauseInWrite(WriteKind.CHECKPOINT, 2),
                   stop=lambda: notes.append("stopped"))  # fmt: skip
    # The marker saved before the agent runs is not a checkpoint of progress.
    assert await store.save_fenced("t", "u", "s", _state(False, "marker"), 1)
    assert await store.save_fenced("t", "u", "s", _state(True, "first"), 1)
    assert notes == []
    task = asyncio.create_task(store.save_fenced("t", "u", "s", _state(True, "second"), 1))
    assert await task  # the paused call goes on to the store once continued
    assert notes == ["stopped"] and gate.fired and gate.quiet
    assert await saved() == {"note": "second"}
    assert await store.save_fenced("t", "u", "s", _state(True, "third"), 1)
    assert notes == ["stopped"]  # once only
    # The class is untouched: only the instance's methods were replaced.
    assert "save_fenced" in vars(store)
    assert "save_fenced" not in vars(InMemoryChatAgentStateStore) or True


async def test_the_pause_waits_for_the_processs_other_store_calls() -> None:
    state, recording = InMemoryChatAgentStateStore(), InMemoryChatStreamRecordingStore()
    held = hold(recording, "read")  # another store call, in flight meanwhile
    stopped_with: list[int] = []
    gate = install(
        StoreBundle(agent_state_store=state, chat_stream_recording_store=recording),
        PauseInWrite(WriteKind.CHECKPOINT, 1),
        stop=lambda: stopped_with.append(gate.in_flight),
    )
    reading = asyncio.create_task(recording.read("t", "u", "s"))
    await held.reached()
    saving = asyncio.create_task(state.save_fenced("t", "u", "s", _state(True, "x"), 1))
    for _ in range(100):  # let the save reach the gate (no clock involved)
        if gate.eligible_calls:
            break
        await asyncio.sleep(0)
    assert gate.eligible_calls == 1 and stopped_with == []
    held.release()
    assert await reading is None and await saving
    assert stopped_with == [0] and gate.quiet


async def test_the_pause_counts_only_sealing_appends_and_recording_batches() -> None:
    conversations = InMemoryChatConversationStore()
    notes: list[str] = []
    install(
        StoreBundle(chat_conversation_store=conversations),
        PauseInWrite(WriteKind.TRANSCRIPT, 1),
        stop=lambda: notes.append("stopped"),
    )
    user = ChatMessage(sender=ChatMessageSender.USER, content="hi", message_id="m-user")
    bot = ChatMessage(sender=ChatMessageSender.BOT, content="hello", message_id="m")
    assert await conversations.append_fenced(
        "t", "u", "s", "a", [user], epoch=1, last_turn_status="running"
    )
    assert notes == []
    assert await conversations.append_fenced(
        "t", "u", "s", "a", [bot], epoch=1, last_turn_status="complete", create_if_absent=False
    )
    assert notes == ["stopped"]

    recording = InMemoryChatStreamRecordingStore()
    batches: list[str] = []
    install(
        StoreBundle(chat_stream_recording_store=recording),
        PauseInWrite(WriteKind.RECORDING, 2),
        stop=lambda: batches.append("stopped"),
    )
    event = RecordedStreamEvent(index=0, message=bot, message_id="m", epoch=1)
    await recording.put("t", "u", "s", event)
    assert batches == []
    put = RecordingPut("t", "u", "s", event.model_copy(update={"index": 1}))
    assert await recording.put_many([put]) == [True]
    assert batches == ["stopped"]


def test_without_the_variable_nothing_is_patched() -> None:
    store = InMemoryChatAgentStateStore()
    assert install_from_env(StoreBundle(agent_state_store=store), {}) is None
    assert vars(store).keys().isdisjoint({"save_fenced", "load"})
    gate = install_from_env(
        StoreBundle(agent_state_store=store), {PAUSE_IN_VARIABLE: "checkpoint:3"},
        stop=lambda: None,
    )  # fmt: skip
    assert gate is not None and gate.pause == PauseInWrite(WriteKind.CHECKPOINT, 3)
    with pytest.raises(ValueError, match="no store for that write"):
        install_from_env(StoreBundle(agent_state_store=store), {PAUSE_IN_VARIABLE: "transcript"})
    for bad in ("heartbeat:1", "checkpoint:x", "checkpoint:0"):
        with pytest.raises(ValueError, match=PAUSE_IN_VARIABLE):
            PauseInWrite.parse(bad)


# ------------------------------------------------------------ the tool-call ledger


async def test_the_ledger_counts_each_run_and_holds_a_call_until_released(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ledger = ToolLedger(tmp_path / "ledger")
    monkeypatch.setenv(LEDGER_VARIABLE, ledger.create()[LEDGER_VARIABLE])

    @recorded
    @tool(on_unknown="fail")
    async def shout(text: str) -> str:
        """A write."""
        return text.upper()

    pid = os.getpid()
    ledger.hold(pid, "fail")
    with running_tool_call(ToolCallContext("m1:0", 0, 1, "call_a")):
        call = asyncio.create_task(shout.invoke({"text": "hi"}))
    for _ in range(500):  # the start is written from a thread: wait for it, boundedly
        if ledger.runs("m1") or call.done():
            break
        await asyncio.sleep(0.01)
    assert ledger.runs("m1") == [ToolRun("m1:0", "shout", "fail", 1, pid, False, 0)]
    assert not call.done()  # held: started, not ended, until released
    ledger.release(pid)
    assert await call == "HI"
    assert ledger.runs("m1") == [ToolRun("m1:0", "shout", "fail", 1, pid, True, 0, 1)]
    # A hold of the other policy holds nothing; another turn's runs are its own.
    ledger.hold(pid, "retry")
    with running_tool_call(ToolCallContext("m2:0", 0, 2, "call_b")):
        assert await shout.invoke({"text": "again"}) == "AGAIN"
    assert [(run.key, run.attempt, run.ended) for run in ledger.runs()] == [
        ("m1:0", 1, True),
        ("m2:0", 2, True),
    ]
    assert [run.index for run in ledger.runs("m2")] == [0]
    ledger.release()
    # Outside a tool call, or without the variable, nothing is recorded.
    assert await shout.invoke({"text": "x"}) == "X"
    monkeypatch.delenv(LEDGER_VARIABLE)
    with running_tool_call(ToolCallContext("m3:0", 0, 1, "call_c")):
        assert await shout.invoke({"text": "y"}) == "Y"
    assert len(ledger.runs()) == 2
