"""The example project serves without the pydantic-ai extra.

Its setups name ``pydantic-writer`` and ``pydantic-note-writer``, PydanticAI
agents, and a setup whose agent is not registered stops the server at
start-up. Without PydanticAI (the container image installs no such extra) a
stand-in is registered under each name: the project loads and validates, and
a turn of such an agent fails saying what to install. Checked in a fresh
interpreter where PydanticAI cannot be found, so this process's registry and
imports are untouched.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

_SCRIPT = textwrap.dedent(
    """
    import asyncio, sys

    sys.modules["pydantic_ai"] = None  # find_spec: not installed; import: fails

    from tether.adapters.agent_setup_retriever_from_file import AgentSetupRetrieverFromFile
    from tether.adapters.local_agent_registries_factory import LocalAgentRegistriesFactory
    from tether.cli.load_chat_agent_factory import from_string
    from tether.cli.server_app import example_project_dir
    from tether.project_layout import project_paths

    agents_dir, setups_file, secrets_file = project_paths(example_project_dir())
    registry = from_string(str(agents_dir))
    retriever = AgentSetupRetrieverFromFile(
        file_path=str(setups_file), secret_file_path=str(secrets_file)
    )
    LocalAgentRegistriesFactory(retriever, registry).validate()  # raises if it cannot serve
    stand_in = registry.get("pydantic-note-writer")
    assert stand_in is not None and stand_in.__name__ == "PydanticNoteWriterUnavailable"
    agent = registry.get("pydantic-writer")()
    print(type(agent).__name__)

    async def turn():
        async for _ in agent.execute_streaming([]):
            pass

    try:
        asyncio.run(turn())
    except RuntimeError as error:
        print(error)
    """
)


def test_the_example_project_loads_and_says_what_to_install() -> None:
    result = subprocess.run(
        [sys.executable, "-c", _SCRIPT], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    name, error = result.stdout.strip().splitlines()[-2:]
    assert name == "PydanticWriterUnavailable"
    assert "install the pydantic-ai extra" in error
