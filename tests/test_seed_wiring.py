"""The seed's wiring example, with ``zav.agents_sdk`` renamed to ``tether``, builds an
app that serves turns (design §1)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx2
import pytest

from tests.support.client import turn_body
from tests.support.project import make_project
from tests.support.servers import free_port

SEED = (
    Path(__file__).resolve().parents[2] / "shared" / "seed" / "persist-conversations-and-state.txt"
)

# The first code block of the seed, renamed. Kept here so the test runs where the
# seed is not beside the checkout; `test_the_copy_matches_the_seed` keeps it honest.
WIRING = """
import os

from tether import AgentSetupRetrieverFromFile, setup_app
from tether.adapters import AgentDependencyRegistry
from tether.adapters.agent_state import LocalFileChatAgentStateStore
from tether.adapters.local_agent_registries_factory import (
    LocalAgentRegistriesFactory,
)
from tether.adapters.stream_buffer import (
    LocalFileChatStreamRecordingStore,
    LocalFileChatStreamSupervisionStore,
)
from tether.cli.load_chat_agent_factory import (
    from_string as import_chat_agent_class_registry_from_string,
)

storage_path = os.path.abspath(".agent-state")

chat_agent_class_registry = import_chat_agent_class_registry_from_string("./agents")
agent_setup_retriever = AgentSetupRetrieverFromFile(
    file_path="./agents/agent_setups.json",
    secret_file_path="./agents/env/agent_setups.json",
)

app = setup_app(
    agent_registries_factory=LocalAgentRegistriesFactory(
        agent_setup_retriever=agent_setup_retriever,
        chat_agent_class_registry=chat_agent_class_registry,
        agent_dependency_registry=AgentDependencyRegistry,
    ),
    agent_state_store=LocalFileChatAgentStateStore(
        base_path=os.path.join(storage_path, "state")
    ),
    chat_stream_recording_store=LocalFileChatStreamRecordingStore(
        base_path=os.path.join(storage_path, "recording")
    ),
    chat_stream_supervision_store=LocalFileChatStreamSupervisionStore(
        base_path=os.path.join(storage_path, "supervision")
    ),
)
"""


def _normalize(code: str) -> str:
    return "\n".join(line.rstrip() for line in code.strip().splitlines())


def test_the_copy_matches_the_seed() -> None:
    if not SEED.exists():
        pytest.skip(f"the seed is not beside this checkout ({SEED})")
    text = SEED.read_text()
    start = text.index("import os\n\nfrom zav.agents_sdk import")
    end = text.index("\n\nThe example wires", start)
    assert _normalize(text[start:end].replace("zav.agents_sdk", "tether")) == _normalize(WIRING)


@pytest.fixture
def wired_server(tmp_path: Path) -> Iterator[str]:
    make_project(tmp_path, chunks_per_second=50, answer_chunks=30)
    (tmp_path / "app.py").write_text(WIRING)
    port = free_port()
    log = tmp_path / "server.log"
    with open(log, "wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "uvicorn", "app:app", "--port", str(port)],
            cwd=tmp_path,
            env={**os.environ, "PYTHONPATH": str(tmp_path)},
            stdout=out,
            stderr=out,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            assert process.poll() is None, log.read_text()
            try:
                httpx2.get(f"{url}/probes/alive", timeout=0.5)
                break
            except httpx2.HTTPError:
                time.sleep(0.05)
        yield url
    finally:
        process.terminate()
        process.wait(timeout=10)
        shutil.rmtree(tmp_path / ".agent-state", ignore_errors=True)


@pytest.mark.processes
def test_the_seed_wiring_builds_an_app_that_runs_stateful_turns(wired_server: str) -> None:
    body = turn_body("Hello", stateful=True, session_id="seed-1")
    response = httpx2.post(f"{wired_server}/chat/response?tenant=t", json=body, timeout=30)
    assert response.status_code == 201, response.text
    assert len(response.json()["content"]) > 50
    status = httpx2.get(
        f"{wired_server}/chat/stream/status?tenant=t&session_id=seed-1", timeout=10
    ).json()
    assert status["status"] == "done"
    assert re.fullmatch(r"[0-9a-f]{32}", status["message_id"])


# Every import the seed's code blocks make, renamed, and the names its prose says
# are importable from a given module (design §1). A copy, like WIRING, kept honest
# by `test_the_import_copy_matches_the_seed`.
SEED_IMPORTS = [
    "from tether import AgentSetupRetrieverFromFile, setup_app",
    "from tether.adapters import AgentDependencyRegistry",
    "from tether.adapters.agent_state import LocalFileChatAgentStateStore",
    "from tether.adapters.local_agent_registries_factory import LocalAgentRegistriesFactory",
    "from tether.adapters.stream_buffer import LocalFileChatStreamRecordingStore, "
    "LocalFileChatStreamSupervisionStore",
    "from tether.cli.load_chat_agent_factory import from_string",
    "from tether import ChatAgentStateStore",
    "from tether import ChatStreamSupervisionStore",
    "from tether.domain.chat_stream_supervision_store import ChatStreamStatus, "
    "ChatStreamSupervision",
    "from tether import ChatStreamRecordingStore",
    "from tether.domain.chat_stream_recording_store import RecordedStreamEvent",
    "from tether import ChatConversationStore",
    "from tether import MCPOAuthIntegrationStore, get_local_file_mcp_oauth_integration_store, "
    "get_mcp_oauth_token_client",
    "from tether.adapters.mcp import MCPOAuthClientInfoRecord, MCPOAuthPendingAuthorization, "
    "MCPOAuthRepository, MCPUserIntegrationRecord",
]
SEED_PROSE_IMPORTS = [
    "from tether.domain.chat_agent_state_store import construct_agent_state_key",
    "from tether.domain.chat_conversation_store import ConversationNotOwnedError, LastTurnStatus",
]


def _seed_import_statements(text: str) -> list[str]:
    """The seed's ``from zav.agents_sdk... import ...`` statements, renamed and on one
    line each (comments, parentheses and ``as`` aliases dropped)."""
    statements = []
    pattern = r"^from (zav\.agents_sdk[\w.]*) import (\([^)]*\)|[^\n]*)"
    for match in re.finditer(pattern, text, re.MULTILINE):
        module = match.group(1).replace("zav.agents_sdk", "tether")
        body = re.sub(r"#[^\n]*", "", match.group(2)).strip("()")
        names = [part.split(" as ")[0].strip() for part in body.split(",")]
        statements.append(f"from {module} import {', '.join(n for n in names if n)}")
    return statements


def test_the_import_copy_matches_the_seed() -> None:
    if not SEED.exists():
        pytest.skip(f"the seed is not beside this checkout ({SEED})")
    assert _seed_import_statements(SEED.read_text()) == SEED_IMPORTS


@pytest.mark.parametrize("statement", SEED_IMPORTS + SEED_PROSE_IMPORTS)
def test_every_import_of_the_seed_resolves_in_a_fresh_interpreter(statement: str) -> None:
    # A fresh interpreter: an import that only works because a test imported
    # something else first would pass in-process and fail for a user.
    result = subprocess.run(
        [sys.executable, "-c", statement], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, f"{statement}\n{result.stderr}"
