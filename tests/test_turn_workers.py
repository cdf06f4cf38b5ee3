"""A turn's background work on one replica: checkpoints and recording flushes end with it."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tether.adapters.agent_dependency_registry import AgentDependencyRegistry
from tether.adapters.agent_setup_retriever_from_file import AgentSetupRetrieverFromFile
from tether.adapters.local_agent_registries_factory import LocalAgentRegistriesFactory
from tether.adapters.memory import (
    InMemoryChatAgentStateStore,
    InMemoryChatConversationStore,
    InMemoryChatStreamRecordingStore,
    InMemoryChatStreamSupervisionStore,
)
from tether.cli.load_chat_agent_factory import from_string
from tether.cli.server_app import example_project_dir
from tether.domain.chat_message import ChatMessage, ChatMessageSender
from tether.domain.chat_request import ChatRequest, RequestHeaders
from tether.domain.chat_stream_recording_store import RecordedStreamEvent, RecordingPut
from tether.domain.message_bus import MessageBus
from tether.handlers.chat_handler import ChatHandler
from tether.runtime.live_buffer import StreamEnd
from tether.runtime.turn_stores import TurnStores
from tether.settings import TetherSettings


def _registries(directory: Path) -> Any:
    setups = directory / "agent_setups.json"
    llm = {"seed": 3, "chunks_per_second": 100, "chunk_size": 3, "answer_chunks": 20}
    agent = {"agent_identifier": "writer", "agent_name": "long-writer"}
    setups.write_text(
        json.dumps(
            [{**agent, "llm_configuration_name": "offline", "agent_configuration": {"llm": llm}}]
        )
    )
    return LocalAgentRegistriesFactory(
        agent_setup_retriever=AgentSetupRetrieverFromFile(file_path=str(setups)),
        chat_agent_class_registry=from_string(str(example_project_dir() / "agents")),
        agent_dependency_registry=AgentDependencyRegistry,
    )


class SwallowingRecordingStore(InMemoryChatStreamRecordingStore):
    """Records slowly and swallows a cancellation that lands meanwhile, as a store
    driver on Python 3.11 can (``asyncio.wait_for`` returns the inner result when
    it completes in the same step as the outer task's cancellation; redis-py
    writes through it). A turn must not depend on cancelling a store call."""

    async def put(
        self, tenant: str, requester_uuid: str | None, session_id: str, event: RecordedStreamEvent
    ) -> None:
        try:
            await asyncio.sleep(0.02)
        except asyncio.CancelledError:
            pass
        await super().put(tenant, requester_uuid, session_id, event)

    async def put_many(self, puts: Sequence[RecordingPut]) -> list[bool]:
        try:
            await asyncio.sleep(0.02)
        except asyncio.CancelledError:
            pass
        return await super().put_many(puts)


async def _run_turn(handler: ChatHandler, session: str) -> StreamEnd:
    request = ChatRequest(
        tenant="t",
        request_headers=RequestHeaders(requester_uuid="u"),
        agent_identifier="writer",
        conversation=[ChatMessage(sender=ChatMessageSender.USER, content="Write.")],
        stateful=True,
        session_id=session,
    )
    turn = await handler.start_turn(request)
    assert turn.task is not None
    await asyncio.wait_for(asyncio.shield(turn.task), 10.0)
    assert turn.buffer.end is not None
    return turn.buffer.end


async def test_a_turn_ends_even_when_a_store_swallows_a_flushs_cancellation(
    tmp_path: Path,
) -> None:
    stores = TurnStores(
        agent_state=InMemoryChatAgentStateStore(),
        recording=SwallowingRecordingStore(),
        supervision=InMemoryChatStreamSupervisionStore(),
        conversation=InMemoryChatConversationStore(),
    )
    # Flushes back to back: a flush is nearly always in a put when the turn ends.
    settings = TetherSettings(recording_flush_interval=0.001, finished_turn_grace=0.1)
    handler = ChatHandler(_registries(tmp_path), stores, settings, MessageBus())
    try:
        ends = [await _run_turn(handler, f"s{i}") for i in range(5)]
    finally:
        await handler.shutdown()
    assert [end.reason for end in ends] == ["done"] * 5


async def test_every_turn_of_a_replica_is_recorded_to_its_final_message(
    tmp_path: Path,
) -> None:
    class Counting(InMemoryChatStreamRecordingStore):
        def __init__(self) -> None:
            super().__init__()
            self.batch_sizes: list[int] = []

        async def put_many(self, puts: Any) -> list[bool]:
            self.batch_sizes.append(len(puts))
            return await super().put_many(puts)

    recording = Counting()
    stores = TurnStores(
        agent_state=InMemoryChatAgentStateStore(),
        recording=recording,
        supervision=InMemoryChatStreamSupervisionStore(),
        conversation=InMemoryChatConversationStore(),
    )
    # Twenty turns of one requester at once: the fair limit is not what this tests.
    settings = TetherSettings(finished_turn_grace=0.1, max_turns_per_requester=0)
    handler = ChatHandler(_registries(tmp_path), stores, settings, MessageBus())
    try:
        ends = await asyncio.gather(*(_run_turn(handler, f"s{i}") for i in range(20)))
    finally:
        await handler.shutdown()
    assert [end.reason for end in ends] == ["done"] * 20
    # The turns run side by side, recorded by the replica's one flusher (how
    # batches carry several turns' puts is staged in ``test_recording_flusher``).
    assert recording.batch_sizes
    for i in range(20):
        record = await recording.read("t", "u", f"s{i}")
        assert record is not None and record.message.content  # the final message
