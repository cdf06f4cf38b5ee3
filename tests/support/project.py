"""Build a project directory for a real-process test, with the pacing it needs."""

from __future__ import annotations

import json
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

TEMPLATE = Path(__file__).parent / "project_template"


def make_project(
    directory: Path,
    *,
    chunks_per_second: float = 40,
    answer_chunks: int = 80,
    tool_call_after_chunks: int | None = 5,
    seed: int = 11,
    variants: Mapping[str, Mapping[str, Any]] | None = None,
) -> Path:
    """A project with agents ``writer`` (long-writer shape: a calculator call after
    ``tool_call_after_chunks``), ``plain`` (the same without the tool), ``outliner``
    (the resumable-dependency example of docs/writing-agents.md), ``rewinder`` (an
    answer that goes backwards, step by step as the test says), ``broken`` (fails after three
    messages), ``poison`` (SIGKILLs its own replica after three), and
    ``calls-send_note`` / ``calls-fetch_note`` (a writing / reading tool call that
    SIGKILLs its replica in the middle of its first attempt). ``variants``:
    more agents, each a ``writer`` under another name with some of its model's
    pacing overridden (``{"slow-writer": {"answer_chunks": 250}}``)."""
    shutil.copytree(TEMPLATE, directory, dirs_exist_ok=True)
    llm = {
        "seed": seed,
        "chunks_per_second": chunks_per_second,
        "chunk_size": 3,
        "answer_chunks": answer_chunks,
    }
    if tool_call_after_chunks is not None:
        llm["tool_call_after_chunks"] = tool_call_after_chunks
    setups = [
        {
            "agent_identifier": "writer",
            "agent_name": "writer",
            "llm_configuration_name": "offline",
            "agent_configuration": {"llm": llm},
        },
        {
            "agent_identifier": "plain",
            "agent_name": "writer",
            "llm_configuration_name": "offline",
            "agent_configuration": {"llm": {**llm, "tool_call_after_chunks": None}},
        },
        {"agent_identifier": "outliner", "agent_name": "outliner"},
        {"agent_identifier": "rewinder", "agent_name": "rewinder"},
        {
            "agent_identifier": "broken",
            "agent_name": "broken",
            "llm_configuration_name": "offline",
            "agent_configuration": {"llm": {**llm, "tool_call_after_chunks": None}},
        },
        *(
            {
                "agent_identifier": f"calls-{name}",
                "agent_name": "caller",
                "llm_configuration_name": "offline",
                "agent_configuration": {
                    "llm": {
                        **llm,
                        "tool_call_after_chunks": None,
                        "call_tool": {"name": name, "arguments": {"text": "hello"}},
                    }
                },
            }
            for name in ("send_note", "fetch_note")
        ),
        {
            "agent_identifier": "poison",
            "agent_name": "poison",
            "llm_configuration_name": "offline",
            "agent_configuration": {"llm": {**llm, "tool_call_after_chunks": None}},
        },
    ]
    setups.extend(
        {**setups[0], "agent_identifier": name, "agent_configuration": {"llm": {**llm, **pacing}}}
        for name, pacing in (variants or {}).items()
    )
    (directory / "agents" / "agent_setups.json").write_text(json.dumps(setups, indent=2))
    return directory
