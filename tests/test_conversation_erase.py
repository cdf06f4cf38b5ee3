"""Deleting a conversation erases everything it owns; retention erases old ones.

``DELETE /conversations/{id}`` removes the transcript, the checkpoint, the
recording and the supervision row (and, on the file store, the lock files
beside them), and keeps only the per-conversation epoch and fences, which are
numbers, not user data. A conversation with a live turn is a 409. ``tether
db prune`` does the same for every conversation nobody updated for a while.

Each test reads every store after the erase, on every shipped backend (Redis
paired with an in-memory conversation store: it has none of its own).
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tests.support.backends import (
    BACKENDS,
    CONVERSATION_BACKENDS,
    Backend,
    SharedPlaces,
    bundle_of,
    open_bundle,
)
from tests.support.inprocess import build, client_of, handler_of
from tests.support.scripted import Scripts, question
from tether.adapters.file import LocalFileChatConversationStore
from tether.adapters.file._paths import encode_component
from tether.adapters.memory import InMemoryChatConversationStore
from tether.cli.db import db_app
from tether.domain.chat_conversation_store import ChatConversationStore
from tether.domain.chat_message import ChatMessage, ChatMessageSender
from tether.domain.chat_request import ChatRequest, RequestHeaders
from tether.domain.chat_stream_recording_store import RecordedStreamEvent, RecordingPut
from tether.handlers.chat_handler import ChatHandler
from tether.handlers.retention import prune
from tether.handlers.turn import Turn
from tether.runtime.turn_stores import TurnStores
from tether.settings import parse_age
from tether.stores import StoreBundle, from_url
from tether.testing.contracts import ManualClock

ALICE = {"requester-uuid": "alice"}
BOB = {"requester-uuid": "bob"}


@dataclass
class Place:
    stores: TurnStores
    bundle: StoreBundle
    clock: ManualClock
    root: Path
    backend: Backend | None = None
    url: str = ""

    @property
    def conversations(self) -> ChatConversationStore:
        assert self.stores.conversation is not None
        return self.stores.conversation


async def _place(backend: Backend, places: SharedPlaces, tmp_path: Path) -> AsyncIterator[Place]:
    clock = ManualClock()
    with backend.url(places.of(backend), tmp_path) as url:
        async with open_bundle(bundle_of(backend, url, clock)) as bundle:
            stores = TurnStores(
                agent_state=bundle.agent_state_store,
                recording=bundle.chat_stream_recording_store,
                supervision=bundle.chat_stream_supervision_store,
                conversation=bundle.chat_conversation_store
                or InMemoryChatConversationStore(clock=clock),
            )
            yield Place(stores, bundle, clock, tmp_path, backend, url)


@pytest.fixture(params=BACKENDS)
async def place(
    request: pytest.FixtureRequest, places: SharedPlaces, tmp_path: Path
) -> AsyncIterator[Place]:
    async for made in _place(request.param, places, tmp_path):
        yield made


@pytest.fixture(params=CONVERSATION_BACKENDS)
async def conversation_place(
    request: pytest.FixtureRequest, places: SharedPlaces, tmp_path: Path
) -> AsyncIterator[Place]:
    async for made in _place(request.param, places, tmp_path):
        yield made


async def _finished_turn(
    handler: ChatHandler, scripts: Scripts, session: str, tenant: str = "t", owner: str = "alice"
) -> Turn:
    """A stateful turn of Alice's (or ``owner``'s) that checkpointed, recorded
    and finished; its rows stay (the grace period is far out)."""
    running = await _running_turn(handler, scripts, session, tenant, owner)
    script = scripts.of(running.message_id)
    script.checkpoint()
    script.finish()
    assert running.task is not None
    await running.task
    assert running.buffer.end is not None and running.buffer.end.reason == "done"
    return running


async def _running_turn(
    handler: ChatHandler, scripts: Scripts, session: str, tenant: str = "t", owner: str = "alice"
) -> Turn:
    request = ChatRequest(
        tenant=tenant,
        request_headers=RequestHeaders(requester_uuid=owner),
        agent_identifier="scripted",
        conversation=[question("keep this for me")],
        stateful=True,
        session_id=session,
    )
    running = await handler.start_turn(request)
    script = scripts.of(running.message_id)
    script.say("the answer to keep")
    await script.spoken()
    assert handler.flusher is not None
    await handler.flusher.flush()
    return running


async def _everything(place: Place, session: str, message_id: str, tenant: str = "t") -> dict:  # type: ignore[type-arg]
    """What every store holds of Alice's conversation."""
    s = place.stores
    assert s.agent_state and s.recording and s.supervision
    return {
        "transcript": await place.conversations.get_transcript(tenant, "alice", session),
        "conversation": await place.conversations.get_conversation(tenant, "alice", session),
        "checkpoint": await s.agent_state.load(tenant, "alice", session),
        "recording": await s.recording.read(tenant, "alice", session),
        "supervision": await s.supervision.read(tenant, "alice", session),
        "by_message_id": await s.supervision.find_by_message_id(tenant, "alice", message_id),
    }


_ERASED = {
    "transcript": [],
    "conversation": None,
    "checkpoint": {},
    "recording": None,
    "supervision": None,
    "by_message_id": None,
}


def _leftover_files(root: Path, *ids: str) -> list[str]:
    """Files under ``root`` named after ``ids`` that hold more than an epoch or a
    fence (the file store; other backends leave no such files)."""
    names = tuple(f"{encode_component(value)}." for value in ids)
    found: list[str] = []
    for path in root.rglob("*"):
        if not path.is_file() or not path.name.startswith(names):
            continue
        if path.suffix == ".json":
            document = json.loads(path.read_bytes())
            if isinstance(document, dict) and set(document) <= {"fence", "last_epoch"}:
                continue  # a number that outlives the rows: kept on purpose
        found.append(str(path.relative_to(root)))
    return found


# Deleting one conversation -------------------------------------------------------------


async def test_deleting_a_conversation_erases_what_it_owns_and_keeps_its_epochs(
    place: Place,
) -> None:
    scripts = Scripts()
    app = build(place.stores, clock=place.clock, scripts=scripts)
    async with client_of(app) as client:
        done = await _finished_turn(handler_of(app), scripts, "s-delete")
        before = await _everything(place, "s-delete", done.message_id)
        assert all(before[name] != erased for name, erased in _ERASED.items()), before
        assert place.stores.supervision is not None
        epoch = await place.stores.supervision.last_epoch("t", "alice", "s-delete")
        assert (
            await client.delete("/conversations/s-delete?tenant=t", headers=BOB)
        ).status_code in (
            403,
            404,
        )
        deleted = await client.delete("/conversations/s-delete?tenant=t", headers=ALICE)
        assert deleted.status_code == 204, deleted.text
        assert await _everything(place, "s-delete", done.message_id) == _ERASED
        assert _leftover_files(place.root, "s-delete", done.message_id) == []
        # The epoch outlives the rows (the erase's tombstone took the next
        # one, and the one after before the transcript went): the next turn
        # continues above it.
        assert await place.stores.supervision.last_epoch("t", "alice", "s-delete") == epoch + 2
        again = await _finished_turn(handler_of(app), scripts, "s-delete")
        assert again.lease is not None and again.lease.epoch > epoch
        gone = await client.delete("/conversations/never-was?tenant=t", headers=ALICE)
        assert gone.status_code == 404


async def test_an_erased_conversation_leaves_no_id_of_it_in_any_store(place: Place) -> None:
    """What keeps its epochs growing (the highest epoch, the recording's and
    the checkpoint's fences) stays, under a keyed hash: no store holds the
    conversation's id, its owner or its tenant in plain form afterwards, and
    the next turn of a conversation with that id still starts above them."""
    assert place.backend is not None
    tenant, owner, session = (f"{kind}-{uuid.uuid4().hex}" for kind in ("tenant", "owner", "s"))
    scripts = Scripts()
    app = build(place.stores, clock=place.clock, scripts=scripts)
    async with client_of(app) as client:
        done = await _finished_turn(handler_of(app), scripts, session, tenant, owner)
        assert place.stores.supervision is not None
        epoch = await place.stores.supervision.last_epoch(tenant, owner, session)
        before = place.backend.stored_text(place.stores, place.url)
        assert all(value in before for value in (tenant, owner, session, done.message_id))

        deleted = await client.delete(
            f"/conversations/{session}?tenant={tenant}", headers={"requester-uuid": owner}
        )
        assert deleted.status_code == 204, deleted.text

        after = place.backend.stored_text(place.stores, place.url)
        # (The question's text is the same in every test: a shared database has it.)
        for value in (tenant, owner, session, done.message_id):
            assert value not in after, f"{value!r} is still stored"
        assert await place.stores.supervision.last_epoch(tenant, owner, session) == epoch + 2
        again = await _finished_turn(handler_of(app), scripts, session, tenant, owner)
        assert again.lease is not None and again.lease.epoch > epoch + 2


async def test_deleting_another_users_shared_conversation_is_403_and_erases_nothing() -> None:
    place = await _memory_place()
    scripts = Scripts()
    app = build(place.stores, clock=place.clock, scripts=scripts)
    async with client_of(app) as client:
        done = await _finished_turn(handler_of(app), scripts, "s-shared")
        await place.conversations.set_shared("t", "alice", "s-shared", True)
        before = await _everything(place, "s-shared", done.message_id)
        refused = await client.delete("/conversations/s-shared?tenant=t", headers=BOB)
        assert refused.status_code == 403, refused.text
        assert await _everything(place, "s-shared", done.message_id) == before


async def test_deleting_a_conversation_with_a_live_turn_is_409_and_erases_nothing() -> None:
    place = await _memory_place()
    scripts = Scripts()
    app = build(place.stores, clock=place.clock, scripts=scripts)
    async with client_of(app) as client:
        running = await _running_turn(handler_of(app), scripts, "s-live")
        before = await _everything(place, "s-live", running.message_id)
        busy = await client.delete("/conversations/s-live?tenant=t", headers=ALICE)
        assert busy.status_code == 409, busy.text
        assert busy.json()["detail"] == {"session_id": "s-live", "message_id": running.message_id}
        assert await _everything(place, "s-live", running.message_id) == before


async def test_deleting_a_conversation_whose_turn_died_fences_the_paused_producer() -> None:
    place = await _memory_place()
    scripts = Scripts()
    app = build(place.stores, clock=place.clock, scripts=scripts)
    async with client_of(app) as client:
        running = await _running_turn(handler_of(app), scripts, "s-dead")
        assert running.lease is not None
        epoch = running.lease.epoch
        place.clock.advance(60)  # no heartbeat for a minute: the producer reads dead
        deleted = await client.delete("/conversations/s-dead?tenant=t", headers=ALICE)
        assert deleted.status_code == 204, deleted.text
        # The producer was only paused: whatever it writes now is refused.
        s = place.stores
        assert s.agent_state is not None and s.recording is not None
        assert not await s.agent_state.save_fenced("t", "alice", "s-dead", {"late": {}}, epoch)
        late = ChatMessage(sender=ChatMessageSender.BOT, content="late")
        event = RecordedStreamEvent(
            index=9, message=late, message_id=running.message_id, epoch=epoch
        )
        assert await s.recording.put_many([RecordingPut("t", "alice", "s-dead", event)]) == [False]
        assert await _everything(place, "s-dead", running.message_id) == _ERASED


async def _memory_place() -> Place:
    clock = ManualClock()
    bundle = from_url("memory://")
    stores = TurnStores(
        agent_state=bundle.agent_state_store,
        recording=bundle.chat_stream_recording_store,
        supervision=bundle.chat_stream_supervision_store,
        conversation=InMemoryChatConversationStore(clock=clock),
    )
    return Place(stores, bundle, clock, Path("/nonexistent"))


# Retention -----------------------------------------------------------------------------


async def test_prune_erases_what_nobody_updated_for_the_age_and_dry_run_only_lists(
    conversation_place: Place,
) -> None:
    place = conversation_place
    tenant = f"t-prune-{id(place)}"
    scripts = Scripts()
    app = build(place.stores, clock=place.clock, scripts=scripts)
    async with client_of(app):
        old = await _finished_turn(handler_of(app), scripts, "s-old", tenant)
        place.clock.advance(timedelta(days=40).total_seconds())
        fresh = await _finished_turn(handler_of(app), scripts, "s-fresh", tenant)
    bundle = StoreBundle(
        agent_state_store=place.stores.agent_state,
        chat_stream_recording_store=place.stores.recording,
        chat_stream_supervision_store=place.stores.supervision,
        chat_conversation_store=place.stores.conversation,
    )
    old_before = await _everything(place, "s-old", old.message_id, tenant)
    fresh_before = await _everything(place, "s-fresh", fresh.message_id, tenant)

    dry = await prune(bundle, timedelta(days=30), dry_run=True, now=place.clock())
    assert [(s.tenant, s.session_id) for s in dry.removed if s.tenant == tenant] == [
        (tenant, "s-old")
    ]
    assert await _everything(place, "s-old", old.message_id, tenant) == old_before

    done = await prune(bundle, timedelta(days=30), dry_run=False, now=place.clock())
    assert [(s.tenant, s.session_id) for s in done.removed if s.tenant == tenant] == [
        (tenant, "s-old")
    ]
    assert await _everything(place, "s-old", old.message_id, tenant) == _ERASED
    assert _leftover_files(place.root, "s-old", old.message_id) == []
    assert await _everything(place, "s-fresh", fresh.message_id, tenant) == fresh_before


def test_the_prune_command_lists_on_a_dry_run_and_erases_otherwise(tmp_path: Path) -> None:
    url = f"file://{tmp_path / 'stores'}"
    long_ago = datetime.now(UTC) - timedelta(days=40)
    conversations = LocalFileChatConversationStore(
        tmp_path / "stores" / "conversations", clock=lambda: long_ago
    )

    async def seed() -> None:
        await conversations.append_messages("t", "alice", "s-old", "a", [question("old")])
        state = from_url(url).agent_state_store
        assert state is not None
        await state.save("t", "alice", "s-old", {"dep": {"n": 1}})

    asyncio.run(seed())
    runner = CliRunner()
    dry = runner.invoke(db_app, ["prune", "--older-than", "30d", "--dry-run", "--store", url])
    assert dry.exit_code == 0, dry.output
    assert "would remove: tenant='t' session='s-old' owner='alice'" in dry.output
    assert "would remove 1 conversation(s)" in dry.output
    real = runner.invoke(db_app, ["prune", "--older-than", "30d", "--store", url])
    assert real.exit_code == 0, real.output
    assert "removed 1 conversation(s)" in real.output

    async def read() -> tuple[object, object]:
        state = from_url(url).agent_state_store
        assert state is not None
        return (
            await conversations.get_conversation("t", "alice", "s-old"),
            await state.load("t", "alice", "s-old"),
        )

    assert asyncio.run(read()) == (None, {})
    bad = runner.invoke(db_app, ["prune", "--older-than", "soon", "--store", url])
    assert bad.exit_code == 2
    missing = runner.invoke(db_app, ["prune", "--store", url], env={"TETHER_RETENTION": ""})
    assert missing.exit_code == 2


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("30d", 30 * 86400),
        ("12h", 43200),
        ("90m", 5400),
        ("45s", 45),
        ("2w", 14 * 86400),
        ("7", 7 * 86400),
    ],
)
def test_ages_read_as_operators_write_them(text: str, seconds: int) -> None:
    assert parse_age(text) == timedelta(seconds=seconds)
