"""A project directory whose agents use MCP servers, for real-process tests."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

TEMPLATE = Path(__file__).parent / "project_template"


def make_mcp_project(directory: Path, setups: dict[str, list[dict[str, Any]]]) -> Path:
    """A project with one ``whoami-agent`` setup per entry of ``setups``
    (agent identifier -> its ``mcp_servers``)."""
    shutil.copytree(TEMPLATE, directory, dirs_exist_ok=True)
    entries = [
        {
            "agent_identifier": identifier,
            "agent_name": "whoami-agent",
            "agent_configuration": {"mcp_servers": servers},
        }
        for identifier, servers in setups.items()
    ]
    (directory / "agents" / "agent_setups.json").write_text(json.dumps(entries, indent=2))
    return directory
