"""tether init: the scaffold is a project the loaders accept and that answers offline."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from tether.adapters import (
    AgentDependencyRegistry,
    AgentSetupRetrieverFromFile,
    LocalAgentRegistriesFactory,
)
from tether.adapters.llm import ChatClient
from tether.cli.init import init_command
from tether.cli.load_chat_agent_factory import from_string
from tether.domain import (
    ChatAgentClassRegistry,
    ChatMessage,
    ChatRequest,
    ContentPartType,
    StreamableChatAgent,
    ToolCallStatus,
    TurnContext,
)
from tether.project_layout import project_paths

EXPECTED_FILES = [
    "README.md",
    "agents/__init__.py",
    "agents/agent_setups.json",
    "agents/env/.gitignore",
    "agents/my_agent.py",
]


@pytest.fixture(autouse=True)
def isolated_agent_classes() -> Iterator[None]:
    snapshot = dict(ChatAgentClassRegistry.registry)
    modules = set(sys.modules)
    yield
    ChatAgentClassRegistry.registry.clear()
    ChatAgentClassRegistry.registry.update(snapshot)
    for name in set(sys.modules) - modules:
        if name.startswith("_tether_agents_"):
            del sys.modules[name]


def _invoke(directory: Path) -> tuple[int, str]:
    app = typer.Typer()
    app.command()(init_command)
    result = CliRunner().invoke(app, [str(directory)])
    return result.exit_code, result.output


def _files(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())


async def test_init_scaffolds_a_project_the_loaders_accept(tmp_path: Path) -> None:
    project = tmp_path / "new-project"
    code, output = _invoke(project)
    assert code == 0, output
    assert _files(project) == EXPECTED_FILES
    assert "tether serve" in output

    agents_dir, setups_file, secrets_file = project_paths(project)
    registry = from_string(agents_dir)
    retriever = AgentSetupRetrieverFromFile(setups_file, secret_file_path=secrets_file)
    # Constructing the factory validates every setup against the registered agents.
    factory = LocalAgentRegistriesFactory(retriever, registry, AgentDependencyRegistry)

    setup = await factory.get_setup("assistant")
    assert setup is not None and setup.agent_name == "my_agent"
    assert setup.llm_configuration_name == "offline"
    setup.agent_configuration["llm"]["chunks_per_second"] = 0  # no pacing in a test
    request = ChatRequest(
        tenant="t",
        agent_identifier="assistant",
        conversation=[ChatMessage(sender="user", content="What time is it?")],  # type: ignore[arg-type]
    )
    turn = TurnContext(
        tenant="t",
        requester_uuid="u",
        session_id=None,
        message_id="m",
        agent_identifier="assistant",
    )
    created = await factory.create_agent(setup, request, turn)
    assert isinstance(created.agent, StreamableChatAgent)
    assert [type(d) for d in created.dependencies] == [ChatClient]

    answer = await created.agent.execute(request.conversation)
    assert answer is not None and answer.content
    tools = [p.tool for p in answer.content_parts or [] if p.type == ContentPartType.TOOL]
    assert [(t.name, t.status) for t in tools if t] == [("clock", ToolCallStatus.COMPLETED)]


def test_the_scaffolds_clock_is_a_reading_tool(tmp_path: Path) -> None:
    """It only reads the time: a resume that cannot tell whether it ran runs it
    again, instead of telling the model the call may not have happened."""
    project = tmp_path / "p"
    assert _invoke(project)[0] == 0
    from_string(project_paths(project)[0])
    module = sys.modules[ChatAgentClassRegistry.registry["my_agent"].__module__]
    assert module.clock.read_only
    assert module.clock.on_unknown == "retry"


def test_env_gitignore_keeps_secrets_out(tmp_path: Path) -> None:
    _invoke(tmp_path / "p")
    lines = (tmp_path / "p" / "agents" / "env" / ".gitignore").read_text().splitlines()
    assert "*" in lines and "!.gitignore" in lines


def test_init_into_an_existing_empty_dir(tmp_path: Path) -> None:
    code, output = _invoke(tmp_path)
    assert code == 0, output
    assert _files(tmp_path) == EXPECTED_FILES


def test_init_refuses_to_overwrite_and_writes_nothing(tmp_path: Path) -> None:
    (tmp_path / "README.md").write_text("mine", encoding="utf-8")

    code, output = _invoke(tmp_path)

    assert code != 0
    assert "refusing to overwrite" in output and "README.md" in output
    assert (tmp_path / "README.md").read_text(encoding="utf-8") == "mine"
    assert _files(tmp_path) == ["README.md"]  # all or nothing


def test_init_twice_refuses_the_second_time(tmp_path: Path) -> None:
    assert _invoke(tmp_path / "p")[0] == 0
    before = (tmp_path / "p" / "agents" / "my_agent.py").read_text()
    code, output = _invoke(tmp_path / "p")
    assert code != 0 and "my_agent.py" in output
    assert (tmp_path / "p" / "agents" / "my_agent.py").read_text() == before


def test_init_refuses_a_file_as_directory(tmp_path: Path) -> None:
    target = tmp_path / "file"
    target.write_text("x", encoding="utf-8")
    code, output = _invoke(target)
    assert code != 0 and "not a directory" in output


def _serve_start_up(project: Path) -> subprocess.CompletedProcess[str]:
    # A real process: what a user sees in the terminal, not what CliRunner catches.
    command = [sys.executable, "-m", "tether", "serve", str(project), "--store", "memory://"]
    return subprocess.run(command, capture_output=True, text=True, timeout=60)


def _setups(project: Path) -> Path:
    return project / "agents" / "agent_setups.json"


@pytest.mark.processes
def test_a_malformed_setups_file_stops_serve_with_a_message_not_a_traceback(
    tmp_path: Path,
) -> None:
    project = tmp_path / "project"
    assert _invoke(project)[0] == 0
    _setups(project).write_text('[{"agent_identifier": "a"}]')
    result = _serve_start_up(project)
    assert result.returncode == 2
    assert str(_setups(project)) in result.stderr
    assert "agent_name" in result.stderr
    assert "Traceback" not in result.stderr + result.stdout


@pytest.mark.processes
def test_malformed_mcp_servers_stop_serve_naming_the_agent(tmp_path: Path) -> None:
    project = tmp_path / "project"
    assert _invoke(project)[0] == 0
    setups = json.loads(_setups(project).read_text())
    setups[0].setdefault("agent_configuration", {})["mcp_servers"] = [
        {"name": "files", "url": "ftp://files.example/mcp"}
    ]
    _setups(project).write_text(json.dumps(setups))
    result = _serve_start_up(project)
    assert result.returncode == 2
    assert repr(setups[0]["agent_identifier"]) in result.stderr
    assert "mcp_servers[0]" in result.stderr and "http" in result.stderr
    assert "Traceback" not in result.stderr + result.stdout
