"""The store contract kit, run once per shipped backend, with one id per backend.

Each contract class takes its store from the backend's bundle (or, for the
state machine and the cross-process races, picklable factories built from the
backend's URL); nothing here branches on the backend. Whatever sets a backend
apart (the ids it refuses, where its rows live, which database a module
shares, a hook only it needs) belongs to its ``Backend`` in
``tests/support/backends.py``.

Backends without a store of some kind, or whose rows no other process sees,
or without a clock of their own, are left out of that class's params
(``CONVERSATION_BACKENDS``, ``CROSS_PROCESS_BACKENDS``, ``SERVER_TIME_BACKENDS``).
The epoch contract with rows removed the way Redis's TTL removes them runs in
``test_redis_stores.py``.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.support.backends import (
    CONVERSATION_BACKENDS,
    CROSS_PROCESS_BACKENDS,
    SERVER_TIME_BACKENDS,
    Backend,
    recording_store_factory,
    supervision_store_factory,
)
from tether.stores import StoreBundle
from tether.testing.contracts import (
    ChatAgentStateFenceContract,
    ChatAgentStateStoreContract,
    ChatConversationFenceContract,
    ChatConversationRemovalContract,
    ChatConversationRetentionContract,
    ChatConversationStoreFullContract,
    ChatStreamRecordingCrossProcessContract,
    ChatStreamRecordingFenceContract,
    ChatStreamRecordingStoreContract,
    ChatStreamStoresStateMachineContract,
    ChatStreamSupervisionClockContract,
    ChatStreamSupervisionCrossProcessContract,
    ChatStreamSupervisionEpochContract,
    ChatStreamSupervisionLookupContract,
    ChatStreamSupervisionStaleContract,
    ChatStreamSupervisionStoreContract,
    StoreFactory,
)

only_conversation_backends = pytest.mark.parametrize(
    "backend", CONVERSATION_BACKENDS, indirect=True
)
only_cross_process_backends = pytest.mark.parametrize(
    "backend", CROSS_PROCESS_BACKENDS, indirect=True
)
only_server_time_backends = pytest.mark.parametrize("backend", SERVER_TIME_BACKENDS, indirect=True)


class _TrickyIdsOfTheBackend:
    """Checks each backend with the awkward ids it can hold (PostgreSQL: no NUL)."""

    @pytest.fixture(autouse=True)
    def _tricky_ids_of_the_backend(self, backend: Backend) -> None:
        self.tricky_ids = backend.tricky_ids


# The stores, one contract each ------------------------------------------------------


class TestAgentStateStore(_TrickyIdsOfTheBackend, ChatAgentStateStoreContract):
    @pytest.fixture
    def store(self, bundle: StoreBundle) -> Any:
        return bundle.agent_state_store


class TestSupervisionStore(_TrickyIdsOfTheBackend, ChatStreamSupervisionStoreContract):
    @pytest.fixture
    def store(self, bundle: StoreBundle) -> Any:
        return bundle.chat_stream_supervision_store


class TestRecordingStore(_TrickyIdsOfTheBackend, ChatStreamRecordingStoreContract):
    @pytest.fixture
    def store(self, bundle: StoreBundle) -> Any:
        return bundle.chat_stream_recording_store


@only_conversation_backends
class TestConversationStore(_TrickyIdsOfTheBackend, ChatConversationStoreFullContract):
    @pytest.fixture
    def store(self, bundle: StoreBundle) -> Any:
        return bundle.chat_conversation_store


# Supervision and recording together -------------------------------------------------


class TestStreamStoresStateMachine(ChatStreamStoresStateMachineContract):
    @pytest.fixture
    def supervision_store_factory(self, store_url: str) -> StoreFactory:
        return supervision_store_factory(store_url)

    @pytest.fixture
    def recording_store_factory(self, store_url: str) -> StoreFactory:
        return recording_store_factory(store_url)


@only_cross_process_backends
class TestStoresAcrossProcesses(
    ChatStreamSupervisionCrossProcessContract, ChatStreamRecordingCrossProcessContract
):
    @pytest.fixture
    def supervision_store_factory(self, store_url: str) -> StoreFactory:
        return supervision_store_factory(store_url)

    @pytest.fixture
    def recording_store_factory(self, store_url: str) -> StoreFactory:
        return recording_store_factory(store_url)


# Fencing ----------------------------------------------------------------------------


class TestSupervisionEpochs(ChatStreamSupervisionEpochContract):
    @pytest.fixture
    def store(self, bundle: StoreBundle) -> Any:
        return bundle.chat_stream_supervision_store


class TestRecordingFence(ChatStreamRecordingFenceContract):
    @pytest.fixture
    def store(self, bundle: StoreBundle) -> Any:
        return bundle.chat_stream_recording_store


class TestAgentStateFence(ChatAgentStateFenceContract):
    @pytest.fixture
    def store(self, bundle: StoreBundle) -> Any:
        return bundle.agent_state_store


@only_conversation_backends
class TestConversationFence(ChatConversationFenceContract):
    @pytest.fixture
    def store(self, bundle: StoreBundle) -> Any:
        return bundle.chat_conversation_store


@only_conversation_backends
class TestConversationRemoval(ChatConversationRemovalContract):
    @pytest.fixture
    def store(self, bundle: StoreBundle) -> Any:
        return bundle.chat_conversation_store


class TestSupervisionLookups(ChatStreamSupervisionLookupContract):
    @pytest.fixture
    def store(self, bundle: StoreBundle) -> Any:
        return bundle.chat_stream_supervision_store


@only_server_time_backends
class TestSupervisionClock(ChatStreamSupervisionClockContract):
    @pytest.fixture
    def store(self, bundle: StoreBundle) -> Any:
        return bundle.chat_stream_supervision_store


class TestSupervisionStaleTurns(ChatStreamSupervisionStaleContract):
    @pytest.fixture
    def store(self, bundle: StoreBundle) -> Any:
        return bundle.chat_stream_supervision_store


@only_conversation_backends
class TestConversationRetention(ChatConversationRetentionContract):
    @pytest.fixture
    def store(self, bundle: StoreBundle) -> Any:
        return bundle.chat_conversation_store
