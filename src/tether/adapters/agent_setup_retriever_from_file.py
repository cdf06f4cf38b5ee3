"""Agent setups read from ``agent_setups.json``, with secrets merged in from a second file.

Both files are read and checked once, in the constructor, so a typo in a setup
stops the server at start-up instead of failing the first request that needs it.
The secrets file (conventionally ``env/agent_setups.json``, kept out of version
control) has the same list shape; each of its entries is deep-merged into the
main entry with the same ``agent_identifier``.
"""

from __future__ import annotations

import builtins
import copy
import json
import os
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from tether.domain.agent_setup import AgentSetup, AgentSetupError, AgentSetupRetriever

_FIELDS = tuple(AgentSetup.model_fields)
# Fields that name things: blank strings are as good as missing, so they are refused.
_NAME_FIELDS = ("agent_identifier", "agent_name", "llm_configuration_name")


class AgentSetupRetrieverFromFile(AgentSetupRetriever):
    """Setups from a JSON file, validated eagerly.

    ``file_path`` must exist. ``secret_file_path`` may be missing (a checkout
    without secrets still starts); when present, every entry in it must name an
    ``agent_identifier`` of the main file. Nested dicts are merged recursively and
    a secret scalar replaces the main file's value. Every problem raises
    ``AgentSetupError`` naming the file.
    """

    def __init__(
        self,
        file_path: str | os.PathLike[str],
        secret_file_path: str | os.PathLike[str] | None = None,
    ) -> None:
        self._file_path = Path(file_path)
        self._secret_file_path = Path(secret_file_path) if secret_file_path is not None else None
        self._setups = _load_setups(self._file_path, self._secret_file_path)

    @property
    def file_path(self) -> Path:
        return self._file_path

    @property
    def secret_file_path(self) -> Path | None:
        return self._secret_file_path

    @property
    def setups(self) -> builtins.list[AgentSetup]:
        """Every setup, in file order, available synchronously (for start-up checks)."""
        # Copies, so an agent that mutates its configuration cannot leak into later turns.
        return [setup.model_copy(deep=True) for setup in self._setups.values()]

    async def get(self, agent_identifier: str) -> AgentSetup | None:
        setup = self._setups.get(agent_identifier)
        return setup.model_copy(deep=True) if setup is not None else None

    async def list(self) -> builtins.list[AgentSetup]:
        return self.setups


def _load_setups(file_path: Path, secret_file_path: Path | None) -> dict[str, AgentSetup]:
    main: dict[str, dict[str, Any]] = {}
    first_index: dict[str, int] = {}
    for index, entry in enumerate(_read_entries(file_path, "agent setups file")):
        _check_entry(file_path, index, entry, partial=False)
        identifier = entry["agent_identifier"]
        if identifier in main:
            raise AgentSetupError(
                f"{file_path}: duplicate agent_identifier {identifier!r} "
                f"(entries {first_index[identifier]} and {index})"
            )
        main[identifier] = entry
        first_index[identifier] = index

    # A missing secrets file is normal (a fresh checkout, CI); a present one is checked fully.
    if secret_file_path is not None and secret_file_path.exists():
        secret_first_index: dict[str, int] = {}
        label = "agent setups secrets file"
        for index, entry in enumerate(_read_entries(secret_file_path, label)):
            _check_entry(secret_file_path, index, entry, partial=True)
            identifier = entry["agent_identifier"]
            if identifier in secret_first_index:
                raise AgentSetupError(
                    f"{secret_file_path}: duplicate agent_identifier {identifier!r} "
                    f"(entries {secret_first_index[identifier]} and {index})"
                )
            secret_first_index[identifier] = index
            if identifier not in main:
                raise AgentSetupError(
                    f"{secret_file_path}: entry {index} names agent_identifier {identifier!r}, "
                    f"which {file_path} does not define "
                    f"(defined: {', '.join(sorted(main)) or 'none'})"
                )
            main[identifier] = _deep_merge(main[identifier], entry)

    setups: dict[str, AgentSetup] = {}
    for identifier, entry in main.items():
        try:
            setups[identifier] = AgentSetup.model_validate(entry, strict=True)
        except ValidationError as exc:
            # Only reachable when a secret changes a field's shape; both files are named.
            where = f"{file_path} merged with {secret_file_path}"
            raise AgentSetupError(
                f"{where}: agent_identifier {identifier!r}: {_describe(exc)}"
            ) from exc
    return setups


def _read_entries(path: Path, label: str) -> list[Any]:
    if not path.exists():
        raise AgentSetupError(f"{path}: {label} not found (resolved to {path.resolve()})")
    if path.is_dir():
        raise AgentSetupError(f"{path}: {label} is a directory, expected a JSON file")
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise AgentSetupError(f"{path}: cannot read {label}: {exc}") from exc
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise AgentSetupError(
            f"{path}: invalid JSON at line {exc.lineno}, column {exc.colno}: {exc.msg}"
        ) from exc
    if not isinstance(data, list):
        raise AgentSetupError(
            f"{path}: top level must be a JSON list of agent setups, got {_json_type(data)}"
        )
    return data


def _check_entry(path: Path, index: int, entry: Any, *, partial: bool) -> None:
    """Check one entry's shape before merging, so errors name the file they are in.

    ``partial`` is for the secrets file, where only ``agent_identifier`` is required.
    """
    if not isinstance(entry, dict):
        raise AgentSetupError(
            f"{path}: entry {index} must be a JSON object, got {_json_type(entry)}"
        )
    identifier = entry.get("agent_identifier")
    where = f"{path}: entry {index}"
    if isinstance(identifier, str) and identifier.strip():
        where += f" (agent_identifier {identifier!r})"

    unknown = sorted(set(entry) - set(_FIELDS))
    if unknown:
        raise AgentSetupError(
            f"{where}: unknown field(s) {', '.join(map(repr, unknown))} "
            f"(allowed: {', '.join(_FIELDS)})"
        )
    required = ("agent_identifier",) if partial else ("agent_identifier", "agent_name")
    for name in required:
        if name not in entry:
            raise AgentSetupError(f"{where}: missing required field {name!r}")
    for name in _NAME_FIELDS:
        if name not in entry:
            continue
        value = entry[name]
        if value is None and name == "llm_configuration_name":
            continue
        if not isinstance(value, str):
            raise AgentSetupError(
                f"{where}: field {name!r} must be a string, got {_json_type(value)}"
            )
        if not value.strip():
            raise AgentSetupError(f"{where}: field {name!r} must not be empty")
    if "agent_configuration" in entry and not isinstance(entry["agent_configuration"], dict):
        raise AgentSetupError(
            f"{where}: field 'agent_configuration' must be a JSON object, "
            f"got {_json_type(entry['agent_configuration'])}"
        )


def _deep_merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    merged = copy.deepcopy(base)
    for key, value in override.items():
        current = merged.get(key)
        if isinstance(current, dict) and isinstance(value, dict):
            merged[key] = _deep_merge(current, value)
        else:
            merged[key] = copy.deepcopy(value)
    return merged


def _describe(exc: ValidationError) -> str:
    parts = []
    for error in exc.errors():
        location = ".".join(str(item) for item in error["loc"])
        parts.append(f"field {location!r}: {error['msg']}")
    return "; ".join(parts)


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__
