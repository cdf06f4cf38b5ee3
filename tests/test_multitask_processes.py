"""Double texting across real replicas: a turn streams on one replica, and a
new message sent through the other interrupts it, or rolls it back."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from tests.support.project import make_project
from tether.crashtest.client import TENANT, TetherAPI
from tether.crashtest.cluster import Cluster

pytestmark = [pytest.mark.processes, pytest.mark.timeout(90)]


@pytest.mark.parametrize("strategy", ["interrupt", "rollback"])
async def test_a_new_message_through_another_replica_displaces_the_running_turn(
    tmp_path: Path, strategy: str
) -> None:
    project = make_project(tmp_path / "project", chunks_per_second=40, answer_chunks=400)
    cluster = Cluster(project, f"sqlite:///{tmp_path}/tether.db", size=2, workdir=tmp_path)
    async with cluster, TetherAPI.client() as http:
        api = TetherAPI(http, "plain")
        a, b = cluster.replicas
        session = f"s-{uuid.uuid4().hex[:10]}"
        first = api.start_turn(a.url, a.name, "Tell me about rivers.", session)
        # Past a recording flush (every 0.5 s): the partial a cancel keeps is
        # what was recorded, as for any cancel from another replica.
        assert await first.wait_for(lambda r: len(r.messages) >= 40, 30)

        response = await http.post(
            f"{b.url}/chat/response",
            params={"tenant": TENANT},
            json={
                "agent_identifier": "plain",
                "stateful": True,
                "session_id": session,
                "conversation": [{"sender": "user", "content": "Actually, lakes?"}],
                "multitask_strategy": strategy,
            },
            timeout=60,
        )
        assert response.status_code == 201, response.text
        answer = response.json()["content"]

        assert await first.ended(30)
        assert first.describe_end() in ("cancelled", "gone"), first.describe_end()
        transcript = await api.transcript(b.url, session)
        assert transcript is not None
        shape = [(m["sender"], m["content"]) for m in transcript]
        if strategy == "interrupt":
            # The interrupted turn keeps its partial answer, as a cancel does.
            assert [s for s, _ in shape] == ["user", "bot", "user", "bot"]
            assert shape[0][1] == "Tell me about rivers." and shape[1][1]
            assert shape[2:] == [("user", "Actually, lakes?"), ("bot", answer)]
        else:
            assert shape == [("user", "Actually, lakes?"), ("bot", answer)]
        status = await api.status(a.url, session)
        assert status is not None and status.status == "done"


async def test_an_unknown_strategy_is_a_clear_422(tmp_path: Path) -> None:
    project = make_project(tmp_path / "project")
    cluster = Cluster(project, f"sqlite:///{tmp_path}/tether.db", size=2, workdir=tmp_path)
    async with cluster, TetherAPI.client() as http:
        response = await http.post(
            f"{cluster.replicas[0].url}/chat/stream",
            params={"tenant": TENANT},
            json={
                "agent_identifier": "plain",
                "stateful": True,
                "session_id": "s-1",
                "conversation": [{"sender": "user", "content": "Hi"}],
                "multitask_strategy": "shout",
            },
        )
        assert response.status_code == 422
        assert "multitask_strategy" in response.text
