"""The store contract kit, run once per shipped backend, with one id per backend.

Each contract class takes its store from the backend's bundle; nothing here
branches on the backend. A hook only one backend needs (forcing a row to
expire) belongs to that backend's fixture.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.backends import BACKENDS, CONVERSATION_BACKENDS, backend_url, open_bundle
from tether.stores import StoreBundle
from tether.testing.contracts import (
    ChatAgentStateFenceContract,
    ChatConversationFenceContract,
    ChatStreamRecordingFenceContract,
    ChatStreamSupervisionEpochContract,
)


@pytest.fixture(params=BACKENDS)
async def bundle(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[StoreBundle]:
    with backend_url(request.param, tmp_path) as url:
        async with open_bundle(url) as opened:
            yield opened


@pytest.fixture(params=CONVERSATION_BACKENDS)
async def conversation_bundle(
    request: pytest.FixtureRequest, tmp_path: Path
) -> AsyncIterator[StoreBundle]:
    with backend_url(request.param, tmp_path) as url:
        async with open_bundle(url) as opened:
            yield opened


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


class TestConversationFence(ChatConversationFenceContract):
    @pytest.fixture
    def store(self, conversation_bundle: StoreBundle) -> Any:
        return conversation_bundle.chat_conversation_store
