"""AgentSetupRetrieverFromFile: eager loading, the secrets merge, and every error."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tether.adapters import AgentSetupRetrieverFromFile
from tether.domain import AgentSetup, AgentSetupError


def _write(path: Path, content: Any) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(content if isinstance(content, str) else json.dumps(content), encoding="utf-8")
    return path


@pytest.fixture
def main_file(tmp_path: Path) -> Path:
    return tmp_path / "agents" / "agent_setups.json"


@pytest.fixture
def secrets_file(tmp_path: Path) -> Path:
    return tmp_path / "agents" / "env" / "agent_setups.json"


def _entry(identifier: Any = "assistant", **fields: Any) -> dict[str, Any]:
    return {"agent_identifier": identifier, "agent_name": "my_agent", **fields}


async def test_loads_setups_in_file_order(main_file: Path) -> None:
    _write(
        main_file,
        [
            _entry("b", llm_configuration_name="offline", agent_configuration={"x": 1}),
            _entry("a"),
        ],
    )
    retriever = AgentSetupRetrieverFromFile(file_path=main_file)

    assert [s.agent_identifier for s in await retriever.list()] == ["b", "a"]
    assert [s.agent_identifier for s in retriever.setups] == ["b", "a"]
    assert await retriever.get("b") == AgentSetup(
        agent_identifier="b",
        agent_name="my_agent",
        llm_configuration_name="offline",
        agent_configuration={"x": 1},
    )
    a = await retriever.get("a")
    assert a is not None and a.llm_configuration_name is None and a.agent_configuration == {}
    assert await retriever.get("missing") is None


async def test_returned_setups_are_copies(main_file: Path) -> None:
    _write(main_file, [_entry(agent_configuration={"nested": {"k": [1]}})])
    retriever = AgentSetupRetrieverFromFile(file_path=main_file)

    first = await retriever.get("assistant")
    assert first is not None
    first.agent_configuration["nested"]["k"].append(2)
    retriever.setups[0].agent_configuration["added"] = True

    again = await retriever.get("assistant")
    assert again is not None and again.agent_configuration == {"nested": {"k": [1]}}


async def test_secrets_are_deep_merged_and_win(main_file: Path, secrets_file: Path) -> None:
    _write(
        main_file,
        [
            _entry(
                "assistant",
                llm_configuration_name="offline",
                agent_configuration={
                    "llm": {"model": "small", "api_key": "placeholder", "opts": {"a": 1, "b": 2}},
                    "prompt": "hello",
                    "replaced": {"deep": True},
                },
            ),
            _entry("untouched", agent_configuration={"k": "v"}),
        ],
    )
    _write(
        secrets_file,
        [
            {
                "agent_identifier": "assistant",
                "llm_configuration_name": "openai",
                "agent_configuration": {
                    "llm": {"api_key": "sk-secret", "opts": {"b": 20, "c": 30}},
                    "token": "t",
                    "replaced": "scalar",
                },
            }
        ],
    )
    retriever = AgentSetupRetrieverFromFile(file_path=main_file, secret_file_path=secrets_file)

    merged = await retriever.get("assistant")
    assert merged is not None
    assert merged.llm_configuration_name == "openai"
    assert merged.agent_configuration == {
        "llm": {"model": "small", "api_key": "sk-secret", "opts": {"a": 1, "b": 20, "c": 30}},
        "prompt": "hello",
        "replaced": "scalar",
        "token": "t",
    }
    untouched = await retriever.get("untouched")
    assert untouched is not None and untouched.agent_configuration == {"k": "v"}


async def test_missing_secrets_file_is_fine(main_file: Path, secrets_file: Path) -> None:
    _write(main_file, [_entry()])
    retriever = AgentSetupRetrieverFromFile(file_path=main_file, secret_file_path=secrets_file)
    assert [s.agent_identifier for s in await retriever.list()] == ["assistant"]


def test_errors_are_raised_by_the_constructor(main_file: Path) -> None:
    # Eager: a broken file fails at start-up, before any request asks for a setup.
    _write(main_file, "[")
    with pytest.raises(AgentSetupError):
        AgentSetupRetrieverFromFile(file_path=main_file)


MAIN_FILE_ERRORS: list[tuple[str, Any, str]] = [
    (
        "invalid-json",
        '[\n  {"agent_identifier": "a",\n  oops\n]',
        "invalid JSON at line 3, column 3",
    ),
    ("top-level-object", {"agent_identifier": "a"}, "top level must be a JSON list"),
    ("top-level-string", '"x"', "got a string"),
    ("entry-not-object", [_entry(), ["a"]], "entry 1 must be a JSON object, got a list"),
    ("missing-identifier", [{"agent_name": "x"}], "missing required field 'agent_identifier'"),
    ("missing-name", [{"agent_identifier": "a"}], "missing required field 'agent_name'"),
    ("empty-identifier", [_entry("")], "field 'agent_identifier' must not be empty"),
    ("blank-name", [{"agent_identifier": "a", "agent_name": "  "}], "'agent_name' must not be"),
    ("identifier-not-string", [_entry(7)], "'agent_identifier' must be a string, got a number"),
    ("name-null", [{"agent_identifier": "a", "agent_name": None}], "must be a string, got null"),
    ("llm-config-bool", [_entry(llm_configuration_name=True)], "got a boolean"),
    ("llm-config-empty", [_entry(llm_configuration_name="")], "must not be empty"),
    ("configuration-list", [_entry(agent_configuration=[1])], "'agent_configuration' must be"),
    ("unknown-field", [_entry(agent_config={})], "unknown field(s) 'agent_config'"),
    ("duplicate", [_entry("a"), _entry("b"), _entry("a")], "duplicate agent_identifier 'a'"),
]


@pytest.mark.parametrize(
    ("content", "expected"),
    [pytest.param(content, expected, id=name) for name, content, expected in MAIN_FILE_ERRORS],
)
def test_main_file_errors_name_the_file_and_problem(
    main_file: Path, content: Any, expected: str
) -> None:
    _write(main_file, content)
    with pytest.raises(AgentSetupError) as raised:
        AgentSetupRetrieverFromFile(file_path=main_file)
    message = str(raised.value)
    assert str(main_file) in message
    assert expected in message


def test_duplicate_names_both_entries(main_file: Path) -> None:
    _write(main_file, [_entry("a"), _entry("b"), _entry("a")])
    with pytest.raises(AgentSetupError, match=r"entries 0 and 2"):
        AgentSetupRetrieverFromFile(file_path=main_file)


def test_missing_main_file(main_file: Path) -> None:
    with pytest.raises(AgentSetupError) as raised:
        AgentSetupRetrieverFromFile(file_path=main_file)
    assert str(main_file) in str(raised.value)
    assert "not found" in str(raised.value)


def test_main_file_is_a_directory(main_file: Path) -> None:
    main_file.mkdir(parents=True)
    with pytest.raises(AgentSetupError, match="is a directory"):
        AgentSetupRetrieverFromFile(file_path=main_file)


SECRETS_FILE_ERRORS: list[tuple[str, Any, str]] = [
    ("invalid-json", "[{]", "invalid JSON at line 1, column 3"),
    ("not-a-list", {"assistant": {}}, "top level must be a JSON list"),
    ("entry-not-object", ["assistant"], "entry 0 must be a JSON object, got a string"),
    ("missing-identifier", [{"agent_configuration": {}}], "missing required field"),
    ("unknown-identifier", [{"agent_identifier": "ghost"}], "'ghost', which"),
    ("unknown-field", [{"agent_identifier": "assistant", "secret": 1}], "unknown field(s)"),
    (
        "configuration-not-object",
        [{"agent_identifier": "assistant", "agent_configuration": "x"}],
        "'agent_configuration' must be a JSON object",
    ),
    (
        "duplicate",
        [{"agent_identifier": "assistant"}, {"agent_identifier": "assistant"}],
        "duplicate agent_identifier 'assistant'",
    ),
]


@pytest.mark.parametrize(
    ("content", "expected"),
    [pytest.param(content, expected, id=name) for name, content, expected in SECRETS_FILE_ERRORS],
)
def test_secrets_file_errors_name_the_secrets_file(
    main_file: Path, secrets_file: Path, content: Any, expected: str
) -> None:
    _write(main_file, [_entry("assistant")])
    _write(secrets_file, content)
    with pytest.raises(AgentSetupError) as raised:
        AgentSetupRetrieverFromFile(file_path=main_file, secret_file_path=secrets_file)
    message = str(raised.value)
    assert message.startswith(str(secrets_file))
    assert expected in message


def test_unknown_secret_identifier_lists_the_defined_ones(
    main_file: Path, secrets_file: Path
) -> None:
    _write(main_file, [_entry("assistant"), _entry("writer")])
    _write(secrets_file, [{"agent_identifier": "asistant"}])
    with pytest.raises(AgentSetupError, match=r"defined: assistant, writer"):
        AgentSetupRetrieverFromFile(file_path=main_file, secret_file_path=secrets_file)
