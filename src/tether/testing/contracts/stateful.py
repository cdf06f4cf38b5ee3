"""Supervision and recording stores against a reference model, by hypothesis.

A state machine claims, heartbeats, takes over and deletes supervision rows, and
puts and deletes recordings at lower, equal and higher epochs, on two
conversations sharing a session id in two tenants. After every step the stores
must equal a small model of the rules, and no write may be accepted at an epoch
below one already accepted (design invariant 1), also after the row or record
was deleted: a claim of a conversation with no row must be above every epoch
ever written, and a put must not be below any epoch ever put or fenced.

Provide both stores as factories (zero-argument callables; see ``StoreFactory``)::

    import pytest
    from tether.testing.contracts import ChatStreamStoresStateMachineContract

    class TestMyStreamStores(ChatStreamStoresStateMachineContract):
        @pytest.fixture
        def supervision_store_factory(self):
            return MySupervisionStore

        @pytest.fixture
        def recording_store_factory(self):
            return MyRecordingStore

Each example builds its stores afresh inside the machine's own event loop and
uses fresh tenant ids, so a store backed by one shared database works too.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import ClassVar

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule, run_state_machine_as_test

from tether.domain.chat_message import ChatMessage, ChatMessageSender
from tether.domain.chat_stream_recording_store import RecordedStreamEvent, RecordingFencedError
from tether.domain.chat_stream_supervision_store import ChatStreamStatus, ChatStreamSupervision
from tether.testing.contracts._support import PrivateLoop, StoreFactory, unique

_T0 = datetime(2030, 1, 1, tzinfo=UTC)
_KEYS = st.sampled_from([0, 1])
_EPOCHS = st.integers(min_value=0, max_value=6)
_MESSAGE_IDS = st.sampled_from(["m-a", "m-b", "m-c"])
_STATUSES = st.sampled_from(list(ChatStreamStatus))
_OFFSETS = st.sampled_from([-2, -1, 1, 2])


class _StreamStoresMachine(RuleBasedStateMachine):
    def __init__(self, supervision_factory: StoreFactory, recording_factory: StoreFactory) -> None:
        super().__init__()
        self._loop = PrivateLoop()
        try:
            self._supervision = self._loop.open(supervision_factory)
            self._recording = self._loop.open(recording_factory)
        except BaseException:
            self._loop.close()
            raise
        tenant = unique("tenant")
        self._keys = [(tenant, "user", "session"), (f"{tenant}-other", "user", "session")]
        self._rows: list[ChatStreamSupervision | None] = [None, None]
        self._records: list[RecordedStreamEvent | None] = [None, None]
        # Highest epoch ever accepted, also across deletes: the fence of design
        # invariant 1, checked on every accepted write.
        self._row_floor = [0, 0]
        self._record_floor = [0, 0]
        self._step = 0

    def teardown(self) -> None:
        self._loop.close()

    # Supervision -----------------------------------------------------------------

    def _cas(self, key: int, expected: int | None, row: ChatStreamSupervision) -> None:
        current = self._rows[key]
        should_write = (None if current is None else current.epoch) == expected and (
            current is not None or row.epoch > self._row_floor[key]
        )
        wrote = self._loop.run(self._supervision.compare_and_swap(*self._keys[key], expected, row))
        assert wrote is should_write, f"CAS expected={expected} over {current} returned {wrote}"
        if wrote:
            assert row.epoch >= self._row_floor[key], "a write below an accepted epoch got in"
            self._row_floor[key] = row.epoch
            self._rows[key] = row

    def _row(self, epoch: int, message_id: str, status: ChatStreamStatus) -> ChatStreamSupervision:
        self._step += 1
        return ChatStreamSupervision(
            status=status,
            heartbeat_at=_T0 + timedelta(seconds=self._step),
            message_id=message_id,
            epoch=epoch,
        )

    @rule(key=_KEYS, epoch=_EPOCHS, message_id=_MESSAGE_IDS, status=_STATUSES)
    def claim(self, key: int, epoch: int, message_id: str, status: ChatStreamStatus) -> None:
        self._cas(key, None, self._row(epoch, message_id, status))

    @rule(key=_KEYS, bump=st.booleans(), message_id=_MESSAGE_IDS, status=_STATUSES)
    def cas_with_the_right_epoch(
        self, key: int, bump: bool, message_id: str, status: ChatStreamStatus
    ) -> None:
        current = self._rows[key]
        expected = 0 if current is None else current.epoch
        self._cas(key, expected, self._row(expected + bump, message_id, status))

    @rule(key=_KEYS, offset=_OFFSETS, bump=st.booleans(), message_id=_MESSAGE_IDS)
    def cas_with_a_wrong_epoch(self, key: int, offset: int, bump: bool, message_id: str) -> None:
        current = self._rows[key]
        expected = max(0, (0 if current is None else current.epoch) + offset)
        self._cas(key, expected, self._row(expected + bump, message_id, ChatStreamStatus.RUNNING))

    def _delete_row(self, key: int, message_id: str, epoch: int) -> None:
        self._loop.run(self._supervision.delete(*self._keys[key], message_id, epoch))
        current = self._rows[key]
        if current is not None and (current.message_id, current.epoch) == (message_id, epoch):
            self._rows[key] = None

    @rule(key=_KEYS)
    def delete_row_with_its_own_ids(self, key: int) -> None:
        current = self._rows[key]
        self._delete_row(
            key, *(("m-a", 0) if current is None else (current.message_id, current.epoch))
        )

    def _existing_row(self, key: int) -> ChatStreamSupervision:
        # A wrong-ids delete only tells something when there is a row to spare.
        if self._rows[key] is None:
            epoch = self._row_floor[key] + 1  # a claim continues after every past epoch
            self._cas(key, None, self._row(epoch, "m-a", ChatStreamStatus.RUNNING))
        current = self._rows[key]
        assert current is not None
        return current

    @rule(key=_KEYS, offset=_OFFSETS)
    def delete_row_with_a_wrong_epoch(self, key: int, offset: int) -> None:
        current = self._existing_row(key)
        self._delete_row(key, current.message_id, current.epoch + offset)

    @rule(key=_KEYS)
    def delete_row_with_a_wrong_message_id(self, key: int) -> None:
        current = self._existing_row(key)
        self._delete_row(key, f"{current.message_id}-other", current.epoch)

    # Recording -------------------------------------------------------------------

    def _put(self, key: int, epoch: int, message_id: str) -> None:
        self._step += 1
        current = self._records[key]
        event = RecordedStreamEvent(
            index=0 if current is None else current.index + 1,
            message=ChatMessage(sender=ChatMessageSender.BOT, content=f"step {self._step}"),
            message_id=message_id,
            epoch=epoch,
        )
        should_write = epoch >= self._record_floor[key]
        try:
            self._loop.run(self._recording.put(*self._keys[key], event))
        except RecordingFencedError:
            assert not should_write, f"put at epoch {epoch} over {current} was fenced"
            return
        assert should_write, f"put at epoch {epoch} over {current} was accepted"
        self._record_floor[key] = epoch
        self._records[key] = event

    @rule(key=_KEYS, epoch=_EPOCHS, message_id=_MESSAGE_IDS)
    def put_at_any_epoch(self, key: int, epoch: int, message_id: str) -> None:
        self._put(key, epoch, message_id)

    @rule(key=_KEYS, delta=st.sampled_from([-2, -1, 0, 1, 2]), message_id=_MESSAGE_IDS)
    def put_below_at_or_above_the_stored_epoch(self, key: int, delta: int, message_id: str) -> None:
        current = self._records[key]
        self._put(key, max(0, (1 if current is None else current.epoch) + delta), message_id)

    def _delete_record(self, key: int, message_id: str) -> None:
        self._loop.run(self._recording.delete(*self._keys[key], message_id))
        current = self._records[key]
        if current is not None and current.message_id == message_id:
            self._records[key] = None

    @rule(key=_KEYS)
    def delete_record_with_its_own_message_id(self, key: int) -> None:
        current = self._records[key]
        self._delete_record(key, "m-a" if current is None else current.message_id)

    @rule(key=_KEYS)
    def delete_record_with_a_wrong_message_id(self, key: int) -> None:
        if self._records[key] is None:
            self._put(key, max(1, self._record_floor[key]), "m-a")
        current = self._records[key]
        assert current is not None
        self._delete_record(key, f"{current.message_id}-other")

    # Invariants ------------------------------------------------------------------

    @invariant()
    def stores_equal_the_model(self) -> None:
        for key, address in enumerate(self._keys):
            assert self._loop.run(self._supervision.read(*address)) == self._rows[key]
            assert self._loop.run(self._recording.read(*address)) == self._records[key]


class ChatStreamStoresStateMachineContract:
    """Runs the state machine; override the two factory fixtures."""

    machine_settings: ClassVar[settings] = settings(
        max_examples=50,
        stateful_step_count=25,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.too_slow],
    )

    @pytest.fixture
    def supervision_store_factory(self) -> StoreFactory:
        """Override: builds the supervision store under test."""
        raise NotImplementedError("override `supervision_store_factory`")

    @pytest.fixture
    def recording_store_factory(self) -> StoreFactory:
        """Override: builds the recording store under test."""
        raise NotImplementedError("override `recording_store_factory`")

    def test_supervision_and_recording_follow_the_reference_model(
        self, supervision_store_factory: StoreFactory, recording_store_factory: StoreFactory
    ) -> None:
        run_state_machine_as_test(
            lambda: _StreamStoresMachine(supervision_store_factory, recording_store_factory),
            settings=self.machine_settings,
        )
