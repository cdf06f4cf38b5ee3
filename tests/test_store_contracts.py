"""The contract kit over an adapter with only the seed's methods, plus file-only guarantees.

The contract kit over every shipped backend runs in ``test_contracts.py``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import threading
from collections.abc import Awaitable, Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from tests.support.seed_only import SeedOnlyRecordingStore
from tether.adapters.file import (
    LocalFileChatAgentStateStore,
    LocalFileChatConversationStore,
    LocalFileChatStreamRecordingStore,
    LocalFileChatStreamSupervisionStore,
    _files,
    _paths,
)
from tether.adapters.file import supervision as file_supervision
from tether.adapters.file import supervision_rows as file_supervision_rows
from tether.domain.chat_agent_state_store import construct_agent_state_key
from tether.domain.chat_message import ChatMessage, ChatMessageSender
from tether.domain.chat_stream_recording_store import (
    ChatStreamRecordingStore,
    RecordedStreamEvent,
    RecordingFencedError,
)
from tether.domain.chat_stream_supervision_store import (
    ChatStreamStatus,
    ChatStreamSupervision,
    SupervisionSwap,
)
from tether.domain.store_errors import StoreCorruptedError, StoreError
from tether.domain.tombstones import TombstoneKey
from tether.testing.contracts import TRICKY_IDS, ChatStreamRecordingStoreContract, ManualClock


class TestSeedOnlyRecordingStore(ChatStreamRecordingStoreContract):
    """The contract holds for an adapter that implements only the seed's methods."""

    @pytest.fixture
    def store(self) -> ChatStreamRecordingStore:
        return SeedOnlyRecordingStore()


# File-only guarantees -----------------------------------------------------------------

_ROW = ChatStreamSupervision(
    status=ChatStreamStatus.RUNNING,
    heartbeat_at=ManualClock()(),
    message_id="m-1",
    epoch=1,
)
_EVENT = RecordedStreamEvent(
    index=0,
    message=ChatMessage(sender=ChatMessageSender.BOT, content="so far"),
    message_id="m-1",
    epoch=1,
)
_USER = ChatMessage(sender=ChatMessageSender.USER, content="hello")


class _FileStores:
    """All four file stores under one base directory."""

    def __init__(self, base: Path) -> None:
        self.state = LocalFileChatAgentStateStore(base)
        self.supervision = LocalFileChatStreamSupervisionStore(base)
        self.recording = LocalFileChatStreamRecordingStore(base)
        self.conversations = LocalFileChatConversationStore(base, clock=ManualClock())

    async def write_everything(self, tenant: str, user: str, session: str) -> None:
        await self.state.save(tenant, user, session, {"dep": {"n": 1}})
        await self.supervision.compare_and_swap(tenant, user, session, None, _ROW)
        await self.recording.put(tenant, user, session, _EVENT)
        await self.conversations.append_messages(tenant, user, session, "agent", [_USER])


def _names(directory: Path) -> list[str]:
    return sorted(entry.name for entry in directory.iterdir())


def _files_under(root: Path) -> list[Path]:
    return sorted(path for path in root.rglob("*") if path.is_file())


async def test_hostile_ids_stay_inside_the_base_directory(tmp_path: Path) -> None:
    base = tmp_path / "nested" / "base"
    stores = _FileStores(base)
    hostile = ["../../x", "..", ".", "/", "/etc/passwd", "..\\..\\x", "a/../../b", "nul\x00"]
    for tricky in hostile:
        await stores.write_everything(tricky, tricky, tricky)
    assert _names(tmp_path) == ["nested"]
    assert _names(tmp_path / "nested") == ["base"]
    written = _files_under(tmp_path)
    assert len(written) > 4 * len(hostile)
    for path in written:
        assert base in path.parents
        assert all(part not in ("", ".", "..") for part in path.relative_to(base).parts)
    assert await stores.state.load("../../x", "../../x", "../../x") == {"dep": {"n": 1}}


def test_the_state_layout_follows_construct_agent_state_key(tmp_path: Path) -> None:
    files = _paths.row_files(tmp_path, "agent-state", "acme", "user-1", "session-1")
    key = construct_agent_state_key("acme", "user-1", "session-1")
    assert files.data == tmp_path / f"{key}.json"
    assert files.lock == tmp_path / f"{key}.lock"


def test_encoded_names_are_safe_and_collision_free() -> None:
    ids = [*TRICKY_IDS, "\udc80", "A", "a", "%41", "%61", "x" * 150, "x" * 151, "é", "%C3%A9"]
    names = [_paths.encode_component(value) for value in ids]
    for name in names:
        assert name not in ("", ".", "..")
        assert set(name) <= set("abcdefghijklmnopqrstuvwxyzABCDEF0123456789_-%")
        assert len(name.encode()) <= 150
    assert len(set(names)) == len(ids)
    # Still distinct where the file system ignores case.
    assert len({name.lower() for name in names}) == len(ids)


@pytest.mark.parametrize("names", [("..",), ("a", "..", ".."), ("a/../../x",), ("",), (".",)])
def test_child_path_refuses_paths_outside_the_base(tmp_path: Path, names: tuple[str, ...]) -> None:
    with pytest.raises(StoreError):
        _paths.child_path(tmp_path, *names)


_Operation = Callable[[_FileStores], Awaitable[Any]]
_CORRUPTIBLE: dict[str, list[_Operation]] = {
    "agent-state": [lambda s: s.state.load("t", "u", "s")],
    "stream-supervision": [
        lambda s: s.supervision.read("t", "u", "s"),
        lambda s: s.supervision.compare_and_swap("t", "u", "s", None, _ROW),
        lambda s: s.supervision.compare_and_swap("t", "u", "s", 1, _ROW),
        lambda s: s.supervision.delete("t", "u", "s", "m-1", 1),
    ],
    "stream-recording": [
        lambda s: s.recording.read("t", "u", "s"),
        lambda s: s.recording.put("t", "u", "s", _EVENT),
        lambda s: s.recording.delete("t", "u", "s", "m-1"),
    ],
    "conversations": [
        lambda s: s.conversations.get_transcript("t", "u", "s"),
        lambda s: s.conversations.get_conversation("t", "u", "s"),
        lambda s: s.conversations.append_messages("t", "u", "s", "agent", [_USER]),
        lambda s: s.conversations.append_messages(
            "t", "u", "s", "agent", [_USER], create_if_absent=False
        ),
        lambda s: s.conversations.set_last_turn_status("t", "u", "s", "errored"),
        lambda s: s.conversations.set_shared("t", "u", "s", True),
        lambda s: s.conversations.delete_conversation("t", "u", "s"),
        lambda s: s.conversations.remove_fenced("t", "u", "s", ["m-1"], epoch=9),
        lambda s: s.conversations.list_conversations("t", "u"),
    ],
}


@pytest.mark.parametrize("damage", [b"", b'{"torn": ', b'["valid JSON", "wrong shape"]'])
@pytest.mark.parametrize("prefix", sorted(_CORRUPTIBLE))
async def test_a_corrupt_file_raises_and_is_left_untouched(
    tmp_path: Path, prefix: str, damage: bytes
) -> None:
    stores = _FileStores(tmp_path)
    await stores.write_everything("t", "u", "s")
    (document,) = (path for path in _files_under(tmp_path / prefix) if path.suffix == ".json")
    document.write_bytes(damage)
    for operation in _CORRUPTIBLE[prefix]:
        with pytest.raises(StoreCorruptedError, match="left as is") as caught:
            await operation(stores)
        assert str(document) in str(caught.value)
        assert document.read_bytes() == damage


async def test_no_temp_files_are_left_behind(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    stores = _FileStores(tmp_path)
    for number in range(3):
        await stores.write_everything("t", "u", f"s{number}")
        await stores.write_everything("t", "u", f"s{number}")
    with pytest.raises(TypeError):
        await stores.state.save("t", "u", "s0", {"dep": {"not json": object()}})
    before = {path: path.read_bytes() for path in _files_under(tmp_path)}
    monkeypatch.setattr(os, "replace", _refuse_replace)
    with pytest.raises(StoreError, match="No space left"):
        await stores.state.save("t", "u", "s0", {"dep": {"n": 2}})
    with pytest.raises(StoreError, match="No space left"):
        await stores.conversations.append_messages("t", "u", "s0", "agent", [_USER])
    monkeypatch.undo()
    after = {path: path.read_bytes() for path in _files_under(tmp_path)}
    assert after == before
    assert {path.suffix for path in after} == {".json", ".lock"}


def _refuse_replace(source: str | os.PathLike[str], target: str | os.PathLike[str]) -> None:
    raise OSError(28, "No space left on device")


async def test_writes_replace_the_document_and_lock_a_separate_file(tmp_path: Path) -> None:
    store = LocalFileChatStreamSupervisionStore(tmp_path)
    await store.compare_and_swap("t", "u", "s", None, _ROW)
    files = _paths.row_files(tmp_path, "stream-supervision", "t", "u", "s")
    document_inode, lock_inode = files.data.stat().st_ino, files.lock.stat().st_ino
    heartbeat = _ROW.model_copy(update={"message_id": "m-1"})
    assert await store.compare_and_swap("t", "u", "s", 1, heartbeat)
    assert files.data.stat().st_ino != document_inode
    assert files.lock.stat().st_ino == lock_inode


async def test_transcripts_and_checkpoints_are_fsynced_heartbeats_are_not(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    stores = _FileStores(tmp_path)
    await stores.write_everything("t", "u", "warm-up")
    synced: list[int] = []
    real_fsync = os.fsync

    def counting_fsync(descriptor: int) -> None:
        synced.append(descriptor)
        real_fsync(descriptor)

    monkeypatch.setattr(os, "fsync", counting_fsync)
    await stores.supervision.compare_and_swap("t", "u", "s", None, _ROW)
    await stores.recording.put("t", "u", "s", _EVENT)
    assert synced == []
    await stores.state.save("t", "u", "warm-up", {"dep": {"n": 2}})
    assert len(synced) >= 2  # the file, then its directory
    synced.clear()
    await stores.conversations.append_messages("t", "u", "warm-up", "agent", [_USER])
    assert len(synced) >= 2


async def test_every_operation_is_one_thread_call(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    stores = _FileStores(tmp_path)
    calls: list[str] = []
    real_to_thread = asyncio.to_thread

    async def counting(func: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        calls.append(getattr(func, "__name__", repr(func)))
        return await real_to_thread(func, *args, **kwargs)

    monkeypatch.setattr(asyncio, "to_thread", counting)
    operations: list[Callable[[], Awaitable[Any]]] = [
        lambda: stores.state.save("t", "u", "s", {"dep": {}}),
        lambda: stores.state.load("t", "u", "s"),
        lambda: stores.state.delete("t", "u", "s"),
        lambda: stores.supervision.compare_and_swap("t", "u", "s", None, _ROW),
        lambda: stores.supervision.read("t", "u", "s"),
        lambda: stores.supervision.list_stale_running(_ROW.heartbeat_at, 10),
        lambda: stores.supervision.delete("t", "u", "s", "m-1", 1),
        lambda: stores.recording.put("t", "u", "s", _EVENT),
        lambda: stores.recording.read("t", "u", "s"),
        lambda: stores.recording.delete("t", "u", "s", "m-1"),
        lambda: stores.conversations.append_messages("t", "u", "s", "agent", [_USER]),
        lambda: stores.conversations.set_last_turn_status("t", "u", "s", "complete"),
        lambda: stores.conversations.get_transcript("t", "u", "s"),
        lambda: stores.conversations.get_conversation("t", "u", "s"),
        lambda: stores.conversations.list_conversations("t", "u"),
        lambda: stores.conversations.set_shared("t", "u", "s", True),
        lambda: stores.conversations.delete_conversation("t", "u", "s"),
    ]
    for number, operation in enumerate(operations, start=1):
        await operation()
        assert len(calls) == number, f"operation {number} made calls {calls}"


async def test_a_heartbeat_batch_is_one_call_on_the_stores_own_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A thousand heartbeats a second must not queue behind the fsynced writes
    # sharing the loop's default executor: one call, on a thread of the store's.
    stores = _FileStores(tmp_path)
    hops: list[str] = []
    threads: set[str] = set()
    real_to_thread, real_swap = asyncio.to_thread, file_supervision_rows.compare_and_swap

    async def counting(func: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        hops.append(getattr(func, "__name__", repr(func)))
        return await real_to_thread(func, *args, **kwargs)

    def noting_thread(*args: Any) -> bool:
        threads.add(threading.current_thread().name)
        return real_swap(*args)

    monkeypatch.setattr(asyncio, "to_thread", counting)
    monkeypatch.setattr(file_supervision_rows, "compare_and_swap", noting_thread)
    swaps = [SupervisionSwap("t", "u", f"s{i}", None, _ROW) for i in range(50)]
    assert await stores.supervision.compare_and_swap_many(swaps) == [True] * 50
    assert hops == []
    assert len(threads) == 1 and next(iter(threads)).startswith("tether-file-heartbeats")


async def test_closing_waits_for_a_heartbeat_batch_whose_caller_was_cancelled(
    tmp_path: Path,
) -> None:
    # A shutdown cancels the batcher mid-batch; the thread goes on writing. Once
    # the store is closed, nothing more may land (a bench or a test removing the
    # directory, a drain that already marked its rows dead).
    stores = _FileStores(tmp_path)
    swaps = [SupervisionSwap("t", "u", f"s{i}", None, _ROW) for i in range(300)]
    batch = asyncio.ensure_future(stores.supervision.compare_and_swap_many(swaps))
    await asyncio.sleep(0.005)  # the batch is on its thread now
    batch.cancel()
    await stores.supervision.aclose()
    root = tmp_path / "stream-supervision"
    rows = sorted(root.rglob("*.json"))
    await asyncio.sleep(0.2)
    assert sorted(root.rglob("*.json")) == rows
    assert len(rows) == 300  # the batch ran to its end: cancelling a caller undoes nothing


async def test_listing_ignores_lock_and_temp_files(tmp_path: Path) -> None:
    stores = _FileStores(tmp_path)
    await stores.conversations.append_messages("t", "u", "s", "agent", [_USER])
    tenant_dir = _paths.row_files(tmp_path, "conversations", "t", "s").data.parent
    (tenant_dir / ".s.json.abandoned.tmp").write_bytes(b'{"torn": ')
    page = await stores.conversations.list_conversations("t", "u")
    assert [item.session_id for item in page.items] == ["s"]


# Erasure: what stays of a conversation names none of its ids --------------------------


def _erasable() -> list[tuple[str, str, str]]:
    """Conversations whose ids are plain, escaped, hashed (too long) or none."""
    return [("acme", "alice", "s-1"), ("a/b", "会話", "x" * 500), ("%none", "", "Session")]


async def _erase(stores: _FileStores, tenant: str, user: str, session: str) -> None:
    assert await stores.state.save_fenced(tenant, user, session, {"dep": {"n": 2}}, 1)
    await stores.state.delete(tenant, user, session)
    await stores.recording.delete(tenant, user, session, "m-1")
    await stores.supervision.delete(tenant, user, session, "m-1", 1)
    assert await stores.conversations.delete_conversation(tenant, user, session)


def _named_after(root: Path, *ids: str) -> list[str]:
    """Paths under ``root`` whose names or contents hold any of ``ids``, as
    written or as a path component (escaped, or hashed when long)."""
    forms = {form for value in ids if value for form in (value, _paths.encode_component(value))}
    found = []
    for path in sorted(root.rglob("*")):
        name = str(path.relative_to(root))
        text = path.read_bytes().decode("utf-8", "replace") if path.is_file() else ""
        if any(form in name or form in text for form in forms):
            found.append(name)
    return found


async def test_an_erase_leaves_nothing_named_after_the_conversation(tmp_path: Path) -> None:
    stores = _FileStores(tmp_path)
    for tenant, user, session in _erasable():
        await stores.write_everything(tenant, user, session)
        await stores.write_everything(tenant, user, "neighbour")
        await _erase(stores, tenant, user, session)
        assert _named_after(tmp_path, session) == []
        # The neighbour is all there, in the directories they shared.
        assert await stores.state.load(tenant, user, "neighbour") == {"dep": {"n": 1}}
        assert await stores.supervision.read(tenant, user, "neighbour") == _ROW
        assert await stores.supervision.find_by_message_id(tenant, user, "m-1") == "neighbour"
        assert await stores.recording.read(tenant, user, "neighbour") == _EVENT
        assert await stores.conversations.get_transcript(tenant, user, "neighbour") != []
        await _erase(stores, tenant, user, "neighbour")
        assert _named_after(tmp_path, tenant, user, session, "neighbour") == []


async def test_an_erased_conversations_numbers_hold_for_another_store_over_the_directory(
    tmp_path: Path,
) -> None:
    """Epochs and fences an erase kept bind a second set of stores over the
    same directory (another process's), and refused writes leave no name."""
    erasing = _FileStores(tmp_path)
    for ids in _erasable():
        await erasing.write_everything(*ids)
        await _erase(erasing, *ids)
    later = _FileStores(tmp_path)
    for ids in _erasable():
        assert await later.supervision.last_epoch(*ids) == 1
        assert not await later.supervision.compare_and_swap(*ids, None, _ROW)
        with pytest.raises(RecordingFencedError):
            await later.recording.put(*ids, _EVENT.model_copy(update={"epoch": 0}))
        assert not await later.state.save_fenced(*ids, {"dep": {}}, 0)
        await later.state.fence(*ids, 1)
        assert _named_after(tmp_path, *ids) == []
        claim = _ROW.model_copy(update={"epoch": 2, "message_id": "m-2"})
        assert await later.supervision.compare_and_swap(*ids, None, claim)
        assert await later.state.save_fenced(*ids, {"dep": {}}, 2)
        assert await erasing.supervision.last_epoch(*ids) == 2


async def test_a_store_kept_under_another_tombstone_key_is_refused(tmp_path: Path) -> None:
    first, other = TombstoneKey(b"the key the store began with"), TombstoneKey(b"another key!!!")
    store = LocalFileChatStreamSupervisionStore(tmp_path, tombstone_key=first)
    await store.open()
    assert await store.compare_and_swap("t", "u", "s", None, _ROW)
    await store.delete("t", "u", "s", "m-1", 1)
    for wrong in (
        LocalFileChatStreamSupervisionStore(tmp_path, tombstone_key=other),
        LocalFileChatStreamRecordingStore(tmp_path, tombstone_key=other),
        LocalFileChatAgentStateStore(tmp_path, tombstone_key=other),
    ):
        with pytest.raises(StoreError, match="TETHER_TOMBSTONE_KEY"):
            await wrong.open()
    unopened = LocalFileChatStreamSupervisionStore(tmp_path, tombstone_key=other)
    with pytest.raises(StoreError, match="TETHER_TOMBSTONE_KEY"):
        await unopened.last_epoch("t", "u", "s")  # not 0: its epochs would start again
    again = LocalFileChatStreamSupervisionStore(tmp_path, tombstone_key=first)
    assert await again.last_epoch("t", "u", "s") == 1


async def test_numbers_an_earlier_release_kept_under_ids_count_and_move(tmp_path: Path) -> None:
    """Before tombstones a delete left ``{"last_epoch": n}`` or ``{"fence": n}``
    at the row's path, and a checkpoint's fence beside it: they still bind,
    and the first locked step that finds no row to write moves them."""
    stores = _FileStores(tmp_path)
    ids = ("t-old", "u-old", "s-old")
    named = {
        _paths.row_files(tmp_path, "stream-supervision", *ids).data: {"last_epoch": 5},
        _paths.row_files(tmp_path, "stream-recording", *ids).data: {"fence": 4},
        tmp_path / "agent-state" / "t-old" / "u-old" / "s-old.fence.json": {"fence": 3},
    }
    for path, document in named.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(document))
    assert await stores.supervision.last_epoch(*ids) == 5
    assert not await stores.supervision.compare_and_swap(*ids, None, _running(0, "m-5", 5))
    with pytest.raises(RecordingFencedError):
        await stores.recording.put(*ids, _EVENT.model_copy(update={"epoch": 3}))
    assert not await stores.state.save_fenced(*ids, {"dep": {}}, 2)
    assert _named_after(tmp_path, *ids) == []
    assert await stores.supervision.last_epoch(*ids) == 5
    assert await stores.supervision.compare_and_swap(*ids, None, _running(0, "m-6", 6))
    with pytest.raises(RecordingFencedError):
        await stores.recording.put(*ids, _EVENT.model_copy(update={"epoch": 3}))
    assert not await stores.state.save_fenced(*ids, {"dep": {}}, 2)
    assert await stores.state.save_fenced(*ids, {"dep": {}}, 3)


def _removing_the_directory_once(
    real: Callable[..., Any], directory: Path, where: Callable[..., Any]
) -> Callable[..., Any]:
    """``real``, but its first call that creates a file in ``directory`` (whose
    directory ``where(*args, **kwargs)`` gives) finds it removed just before,
    as an erase of another conversation that emptied it leaves it."""
    removed: list[Path] = []

    def racing(*args: Any, **kwargs: Any) -> Any:
        if not removed and Path(where(*args, **kwargs)) == directory:
            removed.append(directory)
            directory.rmdir()
        return real(*args, **kwargs)

    return racing


async def test_a_directory_removed_under_a_writer_is_made_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    stores = _FileStores(tmp_path)
    directory = _paths.row_files(tmp_path, "agent-state", "t", "u", "s").data.parent
    directory.mkdir(parents=True)
    temp_file = _removing_the_directory_once(
        _files.tempfile.mkstemp, directory, lambda **kwargs: kwargs["dir"]
    )
    monkeypatch.setattr(_files.tempfile, "mkstemp", temp_file)
    await stores.state.save("t", "u", "s", {"dep": {"n": 1}})
    monkeypatch.undo()
    assert await stores.state.load("t", "u", "s") == {"dep": {"n": 1}}
    await stores.state.delete("t", "u", "s")
    directory.mkdir(parents=True)
    lock_file = _removing_the_directory_once(os.open, directory, lambda path, *_: Path(path).parent)
    monkeypatch.setattr(_files.os, "open", lock_file)
    assert await stores.state.save_fenced("t", "u", "s", {"dep": {"n": 2}}, 1)
    monkeypatch.undo()
    assert await stores.state.load("t", "u", "s") == {"dep": {"n": 2}}


def test_read_json_is_none_only_for_a_missing_file(tmp_path: Path) -> None:
    assert _files.read_json(tmp_path / "missing.json") is None
    (tmp_path / "empty.json").write_bytes(b"")
    with pytest.raises(StoreCorruptedError):
        _files.read_json(tmp_path / "empty.json")


# Dead turns (list_stale_running) ------------------------------------------------------


def _running(heartbeat_offset: float, message_id: str, epoch: int = 1) -> ChatStreamSupervision:
    return _ROW.model_copy(
        update={
            "heartbeat_at": _ROW.heartbeat_at + timedelta(seconds=heartbeat_offset),
            "message_id": message_id,
            "epoch": epoch,
        }
    )


async def test_dead_turns_are_listed_with_their_exact_ids(tmp_path: Path) -> None:
    # Ids are escaped in the path, and a long one hashed: the document keeps them.
    store = LocalFileChatStreamSupervisionStore(tmp_path)
    ids = [*TRICKY_IDS, "x" * 2_000, "\udc80"]
    for number, value in enumerate(ids):
        row = _running(-100 + number / 1_000, f"m-{number}")
        assert await store.compare_and_swap(value, value, value, None, row)
    listed = await store.list_stale_running(_ROW.heartbeat_at, limit=1_000)
    assert [(t.tenant, t.requester_uuid, t.session_id) for t in listed] == [
        (value, value or None, value) for value in ids
    ]
    assert [t.supervision.message_id for t in listed] == [f"m-{n}" for n in range(len(ids))]


async def test_a_row_written_before_documents_kept_their_ids_is_listed_by_its_path(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = LocalFileChatStreamSupervisionStore(tmp_path)
    long_id = "y" * 500
    for tenant, session in [("a/b", "会話"), ("t", long_id)]:
        assert await store.compare_and_swap(tenant, None, session, None, _running(-10, session))
        path = _paths.row_files(tmp_path, "stream-supervision", tenant, "", session).data
        document = json.loads(path.read_bytes())
        for key in ("tenant", "requester_uuid", "session_id"):
            del document[key]
        path.write_text(json.dumps(document, separators=(",", ":")))
    with caplog.at_level(logging.WARNING, logger=file_supervision.__name__):
        listed = await store.list_stale_running(_ROW.heartbeat_at, limit=10)
    # The hashed name does not give its id back: that row waits for a client.
    assert [(t.tenant, t.requester_uuid, t.session_id) for t in listed] == [("a/b", None, "会話")]
    assert "hashed path" in caplog.text


async def test_only_candidates_are_parsed_and_tombstones_not_even_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = LocalFileChatStreamSupervisionStore(tmp_path)
    assert await store.compare_and_swap("t", "u", "dead", None, _running(-10, "m-dead"))
    assert await store.compare_and_swap("t", "u", "live", None, _running(0, "m-live"))
    done = _running(-20, "m-done", 2).model_copy(update={"status": ChatStreamStatus.DONE})
    assert await store.compare_and_swap("t", "u", "done", None, done)
    assert await store.compare_and_swap("t", "u", "gone", None, _running(-30, "m-gone"))
    await store.delete("t", "u", "gone", "m-gone", 1)  # leaves a tombstone
    parsed: list[str] = []
    read: list[str] = []
    real_parse, real_read = file_supervision.parse_json, Path.read_bytes

    def counting_parse(path: Path, raw: bytes) -> Any:
        parsed.append(path.name)
        return real_parse(path, raw)

    def counting_read(path: Path) -> bytes:
        read.append(path.name)
        return real_read(path)

    monkeypatch.setattr(file_supervision, "parse_json", counting_parse)
    monkeypatch.setattr(Path, "read_bytes", counting_read)
    listed = await store.list_stale_running(_ROW.heartbeat_at - timedelta(seconds=5), limit=10)
    assert [t.session_id for t in listed] == ["dead"]
    assert parsed == ["dead.json"]
    assert sorted(read) == ["dead.json", "done.json", "live.json"]


async def test_a_document_in_another_layout_is_parsed_and_a_corrupt_candidate_raises(
    tmp_path: Path,
) -> None:
    store = LocalFileChatStreamSupervisionStore(tmp_path)
    assert await store.compare_and_swap("t", "u", "s", None, _running(-10, "m-1"))
    path = _paths.row_files(tmp_path, "stream-supervision", "t", "u", "s").data
    # Written with spaces (by hand, another tool): the byte look does not
    # match, so the document is parsed, never skipped.
    path.write_text(json.dumps(json.loads(path.read_bytes()), indent=1))
    listed = await store.list_stale_running(_ROW.heartbeat_at, limit=10)
    assert [t.session_id for t in listed] == ["s"]
    damage = b'{"status":"running","heartbeat_at":"2001-01-01T00:00:00Z","epoch":"x"}'
    path.write_bytes(damage)
    with pytest.raises(StoreCorruptedError, match="left as is"):
        await store.list_stale_running(_ROW.heartbeat_at, limit=10)
    assert path.read_bytes() == damage


async def test_no_directory_yet_lists_nothing(tmp_path: Path) -> None:
    store = LocalFileChatStreamSupervisionStore(tmp_path / "missing")
    assert await store.list_stale_running(_ROW.heartbeat_at, limit=10) == []
