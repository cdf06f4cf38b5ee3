"""The Python client reads delta-mode streams and never goes backwards (issue 25),
against real ``tether serve`` processes."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.project import make_project
from tests.support.servers import ServerProcess
from tether.client import Connection, TetherClient, TurnObserver, TurnUpdate
from tether.client.sse import SSEEvent

pytestmark = pytest.mark.processes

PROMPT = "Tell me about rivers and the towns along them."
STEPS = (
    "Once upon a time there was a river.",
    "Once upon a time",  # shorter
    "Once upon a time there was a lake.",  # as long, other text
    "Once upon a time there was a river. It ran to the sea.",
)
"""The rewinder agent's answer, message by message (``steps.json``)."""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("client-delta")
    project = make_project(root / "project", chunks_per_second=100, answer_chunks=150)
    process = ServerProcess(
        project, store_url=f"sqlite:///{root}/tether.db", log_path=root / "server.log"
    ).start()
    yield process
    process.stop()


class _Recorder(TurnObserver):
    def __init__(self) -> None:
        self.events: list[SSEEvent] = []

    def received(self, connection: Connection, event: SSEEvent) -> None:
        self.events.append(event)


async def test_the_client_asks_for_deltas_and_yields_whole_messages(
    server: ServerProcess,
) -> None:
    recorder = _Recorder()
    async with TetherClient(server.url, tenant="t", requester_uuid="dee") as client:
        async with client.stream(
            agent_identifier="writer", message=PROMPT, observer=recorder
        ) as turn:
            updates = [update async for update in turn]
        transcript = await client.get_conversation(turn.session_id)
    sent = [json.loads(e.data) for e in recorder.events if e.event == "new_message"]
    assert "sender" in sent[0] and sum("delta" in data for data in sent) >= 5
    assert recorder.events[-1].event == "stream_status"
    # What the caller gets is the whole message each time, as in the seed's shape.
    assert all(u.data["sender"] == "bot" and u.message.content == u.content for u in updates)
    assert updates[-1].message == transcript.messages[-1]
    assert recorder.dropped_updates == 0


class _Gatekeeper(TurnObserver):
    """Opens the rewinder's next gate each time the client has dealt with its
    message: shown (an update) or dropped."""

    def __init__(self, gates: Path) -> None:
        self.gates = gates
        self.gates_opened = 0

    def open_next(self) -> None:
        self.gates_opened += 1
        (self.gates / f"go-{self.gates_opened}").touch()

    def dropped(self, connection: Connection, update: TurnUpdate, shown: TurnUpdate) -> None:
        super().dropped(connection, update, shown)
        self.open_next()


async def test_an_update_that_would_take_text_back_is_dropped_and_counted(
    server: ServerProcess, tmp_path: Path
) -> None:
    (tmp_path / "steps.json").write_text(json.dumps(STEPS))
    keeper = _Gatekeeper(tmp_path)
    async with TetherClient(server.url, tenant="t", requester_uuid="rex") as client:
        async with client.stream(
            agent_identifier="rewinder", message=str(tmp_path), observer=keeper
        ) as turn:
            shown: list[str] = []
            async for update in turn:
                shown.append(update.content)
                keeper.open_next()
    # The shorter message and the other text were not shown; the answer was.
    assert shown == [STEPS[0], STEPS[3]]
    assert turn.outcome == "done"
    assert keeper.dropped_updates == 2
    # "there was a river." back to "Once upon a time", then "river." to "lake.".
    assert keeper.dropped_characters == (len(STEPS[0]) - len(STEPS[1])) + len("river.")
