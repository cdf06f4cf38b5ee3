"""Where a tether project keeps its parts: the ``agents`` package, beside it
the agents' setups, and the setups holding secrets in ``env/`` (what
``tether init`` scaffolds and ``tether serve`` and the crash test read)."""

from __future__ import annotations

import os
from pathlib import Path

AGENTS_PACKAGE = "agents"
SETUPS_FILE = "agent_setups.json"
SECRETS_DIR = "env"


def project_paths(project_dir: str | os.PathLike[str]) -> tuple[Path, Path, Path]:
    """``(agents_package_dir, setups_file, secrets_file)`` for a project.

    ``project_dir`` is the directory holding ``agents/``, or the agents package
    itself. The files need not exist; the setup retriever says what is missing.
    """
    given = Path(project_dir).expanduser()
    nested = given / AGENTS_PACKAGE
    agents_dir = nested if nested.is_dir() or not (given / "__init__.py").is_file() else given
    agents_dir = agents_dir.resolve()
    return agents_dir, agents_dir / SETUPS_FILE, agents_dir / SECRETS_DIR / SETUPS_FILE
