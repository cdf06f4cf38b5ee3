"""``tether init DIR``: scaffold a project that ``tether serve DIR`` runs as it is."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape

_INIT_PY = '''\
"""This project's agents; importing the package registers them."""

from . import my_agent

__all__ = ["my_agent"]
'''

_MY_AGENT_PY = '''\
"""``my_agent``: a streaming chat agent with one tool.

The constructor's parameters are filled per turn: ``chat_client`` by its type (the
model/tool loop, built from the setup's ``llm_configuration_name`` and ``llm``
options), ``system_prompt`` by its name from the setup's ``agent_configuration``.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from datetime import UTC, datetime

from tether import ChatAgentClassRegistry, ChatMessage, StreamableChatAgent
from tether.adapters.llm import ChatClient
from tether.tools import tool


# read_only: it only reads the time, so a resume that cannot tell whether a
# call finished runs it again (writing tools default to not running twice).
@tool(read_only=True)
async def clock() -> str:
    """The current date and time in UTC, as an ISO 8601 string."""
    return datetime.now(UTC).isoformat(timespec="seconds")


@ChatAgentClassRegistry.register()
class MyAgent(StreamableChatAgent):
    """Answers with the help of a clock."""

    agent_name = "my_agent"

    def __init__(
        self, chat_client: ChatClient, system_prompt: str = "You are a helpful assistant."
    ) -> None:
        self.chat_client = chat_client
        self.system_prompt = system_prompt

    async def execute_streaming(
        self, conversation: list[ChatMessage]
    ) -> AsyncGenerator[ChatMessage, None]:
        # Every message yielded is the whole answer so far, never a delta.
        async for message in self.chat_client.stream(
            conversation, tools=[clock], system_prompt=self.system_prompt
        ):
            yield message
'''

_AGENT_SETUPS_JSON = """\
[
  {
    "agent_identifier": "assistant",
    "agent_name": "my_agent",
    "llm_configuration_name": "offline",
    "agent_configuration": {
      "system_prompt": "You are a helpful assistant. Use the clock for the date or time.",
      "llm": {
        "seed": 1,
        "chunks_per_second": 20,
        "chunk_size": 3,
        "answer_chunks": 30
      }
    }
  }
]
"""

_ENV_GITIGNORE = """\
# Secrets live here (env/agent_setups.json, merged over ../agent_setups.json): never commit them.
*
!.gitignore
"""

_README_MD = """\
# {name}

A tether project.

- `agents/my_agent.py`: the agent (`my_agent`), a streaming chat agent with a clock tool.
- `agents/agent_setups.json`: which agent runs under which identifier, with what
  configuration. `assistant` runs `my_agent` on the offline model, which needs no
  LLM service and answers deterministically.
- `agents/env/`: secrets, never committed. `agents/env/agent_setups.json` has the
  same shape as `agents/agent_setups.json` and is merged over it by `agent_identifier`.

## Run it

    tether serve .
    tether chat "What time is it?"

## Use a real model

In `agents/agent_setups.json` set `"llm_configuration_name": "openai"` and
`"llm": {{"model": "gpt-4o-mini"}}`, then put the key in `agents/env/agent_setups.json`:

    [{{"agent_identifier": "assistant", "agent_configuration": {{"llm": {{"api_key": "sk-..."}}}}}}]

(or set `TETHER_LLM_API_KEY`; `base_url` points it at any OpenAI-compatible server).
"""


def _files(directory: Path) -> dict[Path, str]:
    agents = directory / "agents"
    return {
        agents / "__init__.py": _INIT_PY,
        agents / "my_agent.py": _MY_AGENT_PY,
        agents / "agent_setups.json": _AGENT_SETUPS_JSON,
        agents / "env" / ".gitignore": _ENV_GITIGNORE,
        directory / "README.md": _README_MD.format(name=directory.resolve().name),
    }


def init_command(
    directory: Annotated[
        Path,
        typer.Argument(
            help="Directory to create the project in; created if missing. "
            "Existing files are never overwritten."
        ),
    ],
) -> None:
    """Scaffold a tether project: an agent, its setup and a secrets folder."""
    console = Console(soft_wrap=True)
    # Soft wrap: paths are copied from here, so the terminal must not break them.
    errors = Console(stderr=True, soft_wrap=True)
    if directory.exists() and not directory.is_dir():
        errors.print(f"[red]{escape(str(directory))} exists and is not a directory[/red]")
        raise typer.Exit(1)
    files = _files(directory)
    # All or nothing: check every target before writing any, so a refusal leaves
    # the directory exactly as it was.
    taken = [path for path in files if path.exists()]
    if taken:
        listed = "\n".join(f"  {escape(str(path.relative_to(directory)))}" for path in taken)
        errors.print(
            f"[red]refusing to overwrite existing files in {escape(str(directory))}:[/red]\n"
            f"{listed}\nChoose an empty directory, or move these away first."
        )
        raise typer.Exit(1)
    for path, content in files.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(content, encoding="utf-8")

    shown = escape(str(directory))
    console.print(f"[green]Created a tether project in {shown}[/green]")
    for path in files:
        console.print(f"  {escape(str(path.relative_to(directory)))}")
    console.print("\n[bold]Next steps[/bold]")
    console.print(f"  1. [cyan]tether serve {shown}[/cyan]  (offline model: no key needed)")
    console.print('  2. [cyan]tether chat "What time is it?"[/cyan]  (in another terminal)')
    console.print(
        f"  3. Edit [cyan]{shown}/agents/my_agent.py[/cyan] and [cyan]agent_setups.json[/cyan]"
        " beside it; secrets go in [cyan]agents/env/[/cyan]."
    )
