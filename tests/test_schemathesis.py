"""Schemathesis against the OpenAPI schema of a real server process.

Every operation of the schema gets generated requests, valid and not: none may
answer 5xx, and every documented response must match its schema. Most valid
generated turns are pointed at a real agent, so the success paths run too, not
only the 404 for an agent nobody set up. Bounded: a fixed number of examples per
operation and a deadline per run, so the whole module stays under a minute.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, settings
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import response_schema_conformance

from tests.support.project import make_project
from tests.support.servers import ServerProcess

pytestmark = pytest.mark.processes

ALICE = {"requester-uuid": "alice"}
# Not "broken": an agent that raises is a 500 INTERNAL on /chat/response by design.
AGENTS = ("plain", "writer")
STATUSES: dict[str, list[int]] = {}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("schemathesis")
    # A quick answer, so generated turns that do run finish in milliseconds.
    project = make_project(root / "project", chunks_per_second=1000, answer_chunks=4)
    process = ServerProcess(
        project,
        store_url=f"file://{root / 'store'}",
        log_path=root / "server.log",
        env={"TETHER_FINISHED_TURN_GRACE": "5"},
    ).start()
    yield process
    process.stop()


@pytest.fixture(scope="module")
def api_schema(server: ServerProcess) -> Any:
    return schemathesis.openapi.from_url(f"{server.url}/openapi.json")


schema = schemathesis.pytest.from_fixture("api_schema")


@schema.parametrize()
@settings(
    max_examples=40,
    deadline=None,
    database=None,  # no .hypothesis/ left behind; failures print their reproduction
    derandomize=True,  # the same cases on every run, so CI failures reproduce
    phases=[Phase.explicit, Phase.generate],
    suppress_health_check=list(HealthCheck),
)
def test_no_server_error_and_responses_match_the_schema(case: Any) -> None:
    _aim_at_real_agents(case)
    response = case.call_and_validate(
        headers=ALICE,
        timeout=20,
        checks=[not_a_server_error, response_schema_conformance],
    )
    STATUSES.setdefault(f"{case.method} {case.path}", []).append(response.status_code)


def _aim_at_real_agents(case: Any) -> None:
    """Turn most valid generated turns into ones that run: a random agent id
    is only ever a 404, and that path has its own test in test_bad_input."""
    body = case.body
    if not isinstance(body, dict) or "agent_identifier" not in body:
        return
    if case.meta is None or case.meta.generation.mode is not GenerationMode.POSITIVE:
        return
    # Derived from the generated data, so as reproducible as the rest.
    draw = len(json.dumps(body, default=str))
    if draw % 4 == 0:
        return
    body["agent_identifier"] = AGENTS[draw % len(AGENTS)]
    if draw % 3:
        body.pop("bot_params", None)
    conversation = body.setdefault("conversation", [])
    if not conversation or conversation[-1].get("sender") != "user":
        conversation.append({"sender": "user", "content": "Hello"})


def test_the_generated_turns_reached_the_agents() -> None:
    """Guard against a run that only ever met validation errors."""
    if not STATUSES:
        pytest.skip("the schemathesis test did not run in this session")
    ran = STATUSES.get("POST /chat/response", []) + STATUSES.get("POST /chat/stream", [])
    assert ran.count(201) >= 5, sorted(Counter(ran).items())
