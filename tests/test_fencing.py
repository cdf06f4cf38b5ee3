"""Fencing in the write, proven by staged interleavings (issue: each numbered break).

Every test here stages one window that a real deployment opens by chance (a
store call landing late, a heartbeat batch in flight, two replicas racing) and
shows that the fenced producer changes nothing. Replicas are ``ChatHandler``s
in one process over shared stores, with a hand-moved clock; a store call is
held at a named point with ``tether.testing.interleavings.hold``. Nothing
sleeps: every wait is for a named event.
"""

from __future__ import annotations

import httpx2
import pytest

from tests.support.scripted import Script, ScriptedCluster, ScriptedRegistries, Scripts
from tether.api.app import setup_app
from tether.domain.chat_message import ChatMessageSender, ToolCallStatus
from tether.domain.chat_stream_supervision_store import ChatStreamStatus
from tether.domain.store_errors import StoreUnavailableError
from tether.handlers.chat_handler import ChatHandler
from tether.handlers.errors import ConversationBusyError
from tether.handlers.turn import Turn
from tether.testing.interleavings import Hold, hold


def _bots(transcript: list) -> list[str]:  # type: ignore[type-arg]
    return [m.content for m in transcript if m.sender is ChatMessageSender.BOT]


def _hold_checkpoints(store: object) -> Hold:
    """The checkpoint write, whichever form the runtime uses."""
    return hold(store, "save_fenced" if hasattr(type(store), "save_fenced") else "save")


def _hold_transcript_appends(store: object) -> Hold:
    method = "append_fenced" if hasattr(type(store), "append_fenced") else "append_messages"
    return hold(store, method, when=lambda *args, **kwargs: bool(args[4]))


async def _row(cluster: ScriptedCluster, session: str):  # type: ignore[no-untyped-def]
    assert cluster.stores.supervision is not None
    return await cluster.stores.supervision.read("t", "u", session)


# 1 ---------------------------------------------------------------------------------


@pytest.mark.cluster(conversation=False)
async def test_a_turn_resumed_twice_answers_its_own_question_without_a_conversation_store(
    cluster: ScriptedCluster,
) -> None:
    """A rolling deploy: drain A, resume on B with ``conversation: []``, drain B,
    resume on C. Every producer must be given the turn's real question."""
    a, b, c = cluster.replica(), cluster.replica(), cluster.replica()
    turn = await cluster.start(a, "s1", "What is the capital of France?")
    first = cluster.scripts.of(turn.message_id, 0)
    first.say("Paris")
    await first.spoken()
    await a.drain()
    on_b = await cluster.start(b, "s1", resume=turn.message_id)
    second = cluster.scripts.of(turn.message_id, 1)
    await second.started.wait()
    await b.drain()
    on_c = await cluster.start(c, "s1", resume=turn.message_id)
    third = cluster.scripts.of(turn.message_id, 2)
    await third.started.wait()
    third.say(" is the capital.")
    third.finish()
    assert await cluster.ended(on_c) == "done"
    asked = [[m.content for m in script.inputs[0]] for script in (first, second, third)]
    assert asked == [["What is the capital of France?"]] * 3
    assert on_b.message_id == on_c.message_id == turn.message_id


# 2 ---------------------------------------------------------------------------------


async def test_a_checkpoint_landing_after_a_cancel_and_the_next_claim_is_refused(
    cluster: ScriptedCluster,
) -> None:
    a, b = cluster.replica(), cluster.replica()
    first = await cluster.start(a, "s1", "first question")
    script = cluster.scripts.of(first.message_id)
    script.say("first answer")
    await script.spoken()
    assert cluster.stores.agent_state is not None
    late = _hold_checkpoints(cluster.stores.agent_state)
    script.checkpoint()
    await late.reached()  # the producer is inside its checkpoint write
    await b.cancel("t", "u", "s1", first.message_id)
    second = await cluster.start(b, "s1", "second question")
    await cluster.scripts.of(second.message_id).started.wait()
    late.release()
    assert await cluster.ended(first) in ("cancelled", "gone")
    state = await cluster.stores.agent_state.load("t", "u", "s1")
    marker = state["__turn__"]
    assert marker["message_id"] == second.message_id
    assert [m["content"] for m in marker["conversation"]] == ["second question"]
    assert state.get("notebook") != {"text": "first answer"}


# 3 ---------------------------------------------------------------------------------


@pytest.mark.parametrize("ending", ["done", "handed off"])
async def test_a_heartbeat_batch_landing_late_never_revives_a_turn(
    cluster: ScriptedCluster, ending: str
) -> None:
    a, b = cluster.replica(), cluster.replica()
    turn = await cluster.start(a, "s1")
    script = cluster.scripts.of(turn.message_id)
    script.say("an answer")
    await script.spoken()
    assert cluster.stores.supervision is not None and a.heartbeats is not None
    in_flight = hold(cluster.stores.supervision, "compare_and_swap_many")
    beat = _background(a.heartbeats.beat())
    await in_flight.reached()
    if ending == "done":
        script.finish()
        assert await cluster.ended(turn) == "done"
    else:
        await a.drain()
    in_flight.release()
    await beat
    row = await _row(cluster, "s1")
    assert row is not None
    if ending == "done":
        assert row.status is ChatStreamStatus.DONE
    else:
        # Handed off: dead at once, so another replica may resume it now.
        assert row.is_dead(cluster.clock(), b.dead_after)
        resumed = await cluster.start(b, "s1", resume=turn.message_id)
        assert resumed.message_id == turn.message_id


# 4 ---------------------------------------------------------------------------------


async def test_a_cancel_racing_the_seal_leaves_one_answer(cluster: ScriptedCluster) -> None:
    a, b = cluster.replica(), cluster.replica()
    turn = await cluster.start(a, "s1")
    script = cluster.scripts.of(turn.message_id)
    assert cluster.stores.conversation is not None
    sealing = _hold_transcript_appends(cluster.stores.conversation)
    script.say("the whole answer")
    script.finish()
    await sealing.reached()  # the producer is writing its answer
    await b.cancel("t", "u", "s1", turn.message_id)
    sealing.release()
    await cluster.ended(turn)
    transcript = await cluster.transcript("s1")
    assert _bots(transcript) == ["the whole answer"]
    row = await _row(cluster, "s1")
    assert row is not None and row.status is ChatStreamStatus.CANCELLED


async def test_a_turn_cancelled_inside_a_tool_call_leaves_no_call_running(
    cluster: ScriptedCluster,
) -> None:
    """The kept partial answer closes the call it stopped in: the transcript
    never shows it running, and the next turn's model gets it answered."""
    a, b = cluster.replica(), cluster.replica()
    turn = await cluster.start(a, "s1")
    script = cluster.scripts.of(turn.message_id)
    script.say("Sending it now.")
    script.call_tool("send_email")
    await script.spoken(2)
    assert a.flusher is not None
    await a.flusher.flush()  # the answer as its readers saw it is recorded
    await b.cancel("t", "u", "s1", turn.message_id)
    await cluster.ended(turn)
    answer = (await cluster.transcript("s1"))[-1]
    [call] = [p.tool for p in answer.content_parts or [] if p.tool is not None]
    assert (call.name, call.status) == ("send_email", ToolCallStatus.ERROR)
    assert "may or may not have happened" in str(call.response)


async def _resumed_elsewhere(
    cluster: ScriptedCluster, a: ChatHandler, b: ChatHandler, said: str
) -> tuple[Turn, Script, Turn, Script]:
    """A turn of ``s1`` started on ``a``, its agent having said ``said``; its
    producer then reads dead (silent past the threshold, its task still there)
    and ``b`` resumes it. The turn, its first script, the resumed turn, and the
    resumed producer's script."""
    turn = await cluster.start(a, "s1")
    first = cluster.scripts.of(turn.message_id, 0)
    first.say(said)
    await first.spoken()
    cluster.kill_by_silence()
    resumed = await cluster.start(b, "s1", resume=turn.message_id)
    return turn, first, resumed, cluster.scripts.of(turn.message_id, 1)


async def test_a_cancel_keeps_the_current_owners_content_not_a_stale_local_copy(
    cluster: ScriptedCluster,
) -> None:
    a, b = cluster.replica(), cluster.replica()
    turn, _, resumed, new = await _resumed_elsewhere(
        cluster, a, b, "stale text from the paused producer"
    )
    new.say("the new owner's text")
    await new.spoken()
    assert b.flusher is not None
    await b.flusher.flush()
    # Cancelled on A, which still holds its stale buffer of the turn.
    await a.cancel("t", "u", "s1", turn.message_id)
    assert await cluster.ended(resumed) == "cancelled"
    assert _bots(await cluster.transcript("s1")) == ["the new owner's text"]


# 5 ---------------------------------------------------------------------------------


@pytest.mark.cluster(finished_turn_grace=0.0)
async def test_epochs_never_restart_after_a_finished_turns_rows_are_removed(
    cluster: ScriptedCluster,
) -> None:
    a, b = cluster.replica(), cluster.replica()
    first = await cluster.start(a, "s1", "first")
    old = cluster.scripts.of(first.message_id, 0)
    assert cluster.stores.recording is not None
    late_put = hold(cluster.stores.recording, "put_many")
    old.say("paused here")
    await late_put.reached()  # the paused producer's put is in flight
    cluster.kill_by_silence()
    resumed = await cluster.start(b, "s1", resume=first.message_id)
    new = cluster.scripts.of(first.message_id, 1)
    new.say("resumed and finished")
    new.finish()
    assert await cluster.ended(resumed) == "done"
    await b.clean_ups_done()  # the grace period (0 s) is over: its rows are gone
    assert await _row(cluster, "s1") is None
    second = await cluster.start(b, "s1", "second")
    row = await _row(cluster, "s1")
    assert row is not None and row.message_id == second.message_id
    assert second.lease is not None and first.lease is not None
    assert second.lease.epoch > resumed.lease.epoch > first.lease.epoch  # type: ignore[union-attr]
    late_put.release()
    await late_put.returned()
    record = await cluster.stores.recording.read("t", "u", "s1")
    assert record is None or record.message_id == second.message_id


# 6 ---------------------------------------------------------------------------------


async def test_after_a_cross_replica_cancel_the_producer_records_nothing_more(
    cluster: ScriptedCluster,
) -> None:
    a, b = cluster.replica(), cluster.replica()
    turn = await cluster.start(a, "s1")
    script = cluster.scripts.of(turn.message_id)
    script.say("seen by every reader.")
    await script.spoken()
    assert cluster.stores.recording is not None
    late_put = hold(cluster.stores.recording, "put_many")
    script.say(" Never shown: its put is in flight.")
    await late_put.reached()
    assert turn.buffer.latest is not None
    assert turn.buffer.latest.message.content == "seen by every reader."
    await b.cancel("t", "u", "s1", turn.message_id)
    late_put.release()
    await late_put.returned()
    record = await cluster.stores.recording.read("t", "u", "s1")
    assert record is not None
    kept = _bots(await cluster.transcript("s1"))
    # What the transcript kept is what the recording holds: nothing landed after.
    assert kept == [record.message.content] == ["seen by every reader."]
    assert await cluster.ended(turn) in ("cancelled", "gone")


async def test_a_paused_producers_put_after_a_takeover_is_refused(
    cluster: ScriptedCluster,
) -> None:
    a, b = cluster.replica(), cluster.replica()
    turn = await cluster.start(a, "s1")
    old = cluster.scripts.of(turn.message_id, 0)
    assert cluster.stores.recording is not None
    late_put = hold(cluster.stores.recording, "put_many")
    old.say("old producer")
    await late_put.reached()
    cluster.kill_by_silence()
    resumed = await cluster.start(b, "s1", resume=turn.message_id)
    await cluster.scripts.of(turn.message_id, 1).started.wait()
    late_put.release()  # lands before the new owner's first put
    await late_put.returned()
    record = await cluster.stores.recording.read("t", "u", "s1")
    assert record is None or record.epoch == resumed.lease.epoch  # type: ignore[union-attr]


# 7 ---------------------------------------------------------------------------------


@pytest.mark.cluster(heartbeat_interval=0.01)
async def test_a_store_blip_at_the_final_flush_is_retried_and_the_turn_completes(
    cluster: ScriptedCluster,
) -> None:
    a = cluster.replica()
    turn = await cluster.start(a, "s1")
    script = cluster.scripts.of(turn.message_id)
    assert cluster.stores.recording is not None
    _fail_next(cluster.stores.recording, "put_many", times=2)
    script.say("a complete answer")
    script.finish()
    assert await cluster.ended(turn) == "done"
    assert _bots(await cluster.transcript("s1")) == ["a complete answer"]
    row = await _row(cluster, "s1")
    assert row is not None and row.status is ChatStreamStatus.DONE


async def test_two_resumes_of_one_turn_never_share_stream_indexes(
    cluster: ScriptedCluster,
) -> None:
    a, b, c = cluster.replica(), cluster.replica(), cluster.replica()
    turn = await cluster.start(a, "s1")
    script = cluster.scripts.of(turn.message_id)
    script.say("flushed")
    await script.spoken()
    assert a.flusher is not None
    await a.flusher.flush()
    cluster.kill_by_silence()
    on_b = await cluster.start(b, "s1", resume=turn.message_id)
    await cluster.scripts.of(turn.message_id, 1).started.wait()
    cluster.kill_by_silence()  # B dies before its first flush
    on_c = await cluster.start(c, "s1", resume=turn.message_id)
    await cluster.scripts.of(turn.message_id, 2).started.wait()
    limit = cluster.settings.max_turn_events
    ranges = [range(t.buffer.first_index, t.buffer.first_index + limit) for t in (on_b, on_c)]
    assert turn.buffer.first_index + limit <= ranges[0].start
    assert ranges[0].stop <= ranges[1].start


# 8 ---------------------------------------------------------------------------------


async def test_a_store_failure_before_the_stream_is_a_503_with_a_code() -> None:
    cluster = ScriptedCluster()
    assert cluster.stores.supervision is not None
    _fail_next(cluster.stores.supervision, "read", times=1)
    app = setup_app(
        ScriptedRegistries(Scripts()),
        agent_state_store=cluster.stores.agent_state,
        chat_stream_recording_store=cluster.stores.recording,
        chat_stream_supervision_store=cluster.stores.supervision,
        chat_conversation_store=cluster.stores.conversation,
    )
    transport = httpx2.ASGITransport(app=app)
    async with httpx2.AsyncClient(transport=transport, base_url="http://tether.test") as client:
        response = await client.post(
            "/chat/stream?tenant=t",
            headers={"requester-uuid": "u"},
            json={
                "agent_identifier": "scripted",
                "conversation": [{"sender": "user", "content": "hello"}],
                "stateful": True,
                "session_id": "s1",
            },
        )
    assert response.status_code == 503
    assert response.json()["code"] == "STORE_UNAVAILABLE"
    assert response.headers["Retry-After"] == "1"
    # Nothing was lost: the turn never started, so nothing was recorded either.
    assert await cluster.stores.supervision.read("t", "u", "s1") is None


# Cancel is one guarded transition, heard by push -----------------------------------


@pytest.mark.parametrize(
    ("cluster", "push"),
    [({"push": True}, True), ({"push": False}, False)],
    ids=["push", "no push"],
    indirect=["cluster"],
)
async def test_a_cancel_on_another_replica_stops_the_producer(
    cluster: ScriptedCluster, push: bool
) -> None:
    """With a push channel the producer stops as soon as the cancel is accepted,
    with no write of its own; without one, at its next write (a flush here)."""
    a, b = cluster.replica(), cluster.replica()
    turn = await cluster.start(a, "s1")
    script = cluster.scripts.of(turn.message_id)
    script.say("streaming")
    await script.spoken()
    assert a.flusher is not None
    await a.flusher.flush()  # what followers on other replicas saw
    await b.cancel("t", "u", "s1", turn.message_id)
    if not push:
        script.say(" on")
        await script.spoken(2)
        await a.flusher.flush()
    assert await cluster.ended(turn) == "cancelled"
    assert _bots(await cluster.transcript("s1")) == ["streaming"]


async def test_a_cancel_after_the_seal_is_refused_and_changes_nothing(
    cluster: ScriptedCluster,
) -> None:
    a, b = cluster.replica(), cluster.replica()
    turn = await cluster.start(a, "s1")
    script = cluster.scripts.of(turn.message_id)
    script.say("done already")
    script.finish()
    assert await cluster.ended(turn) == "done"
    with pytest.raises(Exception) as refused:
        await b.cancel("t", "u", "s1", turn.message_id)
    assert not isinstance(refused.value, ConversationBusyError)
    assert _bots(await cluster.transcript("s1")) == ["done already"]


# helpers -----------------------------------------------------------------------------


def _background(coroutine):  # type: ignore[no-untyped-def]
    import asyncio

    return asyncio.ensure_future(coroutine)


def _fail_next(store: object, method: str, *, times: int) -> None:
    """The next ``times`` calls of ``store.method`` fail as an outage would."""
    original = getattr(store, method)
    remaining = [times]

    async def failing(*args, **kwargs):  # type: ignore[no-untyped-def]
        if remaining[0] > 0:
            remaining[0] -= 1
            raise StoreUnavailableError(f"{method}: staged outage")
        return await original(*args, **kwargs)

    setattr(store, method, failing)


async def test_a_turns_agent_runs_with_the_turn_as_its_current_one(
    cluster: ScriptedCluster,
) -> None:
    """What a ChatClient the agent built itself keys its tool calls by
    (``tether.tools.current_turn_id``): the turn's own id, and on a resume
    elsewhere the same one."""
    a, b = cluster.replica(), cluster.replica()
    turn, first, resumed, second = await _resumed_elsewhere(cluster, a, b, "Half")
    second.finish()
    assert await cluster.ended(resumed) == "done"
    assert first.turn_ids == second.turn_ids == [turn.message_id]
