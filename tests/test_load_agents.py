"""from_string: importing a project's agents package by path, robustly."""

from __future__ import annotations

import builtins
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from tether.cli.load_chat_agent_factory import (
    AgentPackageImportError,
    from_string,
    module_name_for,
)
from tether.domain import ChatAgentClassRegistry
from tether.project_layout import project_paths


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


def _agent_module(agent_name: str, helper_import: str = "from .helpers import GREETING") -> str:
    return textwrap.dedent(
        f'''
        from __future__ import annotations

        from tether.domain import ChatAgent, ChatAgentClassRegistry, ChatMessage

        {helper_import}


        @ChatAgentClassRegistry.register()
        class Agent(ChatAgent):
            agent_name = "{agent_name}"
            greeting = GREETING

            async def execute(self, conversation: list[ChatMessage]) -> ChatMessage | None:
                return None
        '''
    )


def _project(root: Path, agent_name: str, greeting: str, init: str = "") -> Path:
    """A project dir holding an ``agents`` package whose agent imports a sibling relatively."""
    agents = root / "agents"
    (agents / "sub").mkdir(parents=True)
    (agents / "__init__.py").write_text(init, encoding="utf-8")
    (agents / "helpers.py").write_text(f"GREETING = {greeting!r}\n", encoding="utf-8")
    (agents / "my_agent.py").write_text(_agent_module(agent_name), encoding="utf-8")
    # A subpackage that __init__.py never imports: found by walking the package.
    (agents / "sub" / "__init__.py").write_text("", encoding="utf-8")
    (agents / "sub" / "deep.py").write_text(
        _agent_module(f"{agent_name}-deep", "from ..helpers import GREETING"), encoding="utf-8"
    )
    return root


def test_imports_the_package_and_returns_the_registry(tmp_path: Path) -> None:
    project = _project(tmp_path / "project", "alpha", "hello")

    registry = from_string(project / "agents")

    assert registry is ChatAgentClassRegistry
    alpha = registry.get("alpha")
    deep = registry.get("alpha-deep")
    assert alpha is not None and deep is not None
    assert alpha.greeting == "hello"  # type: ignore[attr-defined]
    assert deep.greeting == "hello"  # type: ignore[attr-defined]


def test_accepts_a_project_dir_containing_agents(tmp_path: Path) -> None:
    project = _project(tmp_path / "project", "alpha", "hello")
    assert from_string(str(project)).get("alpha") is not None


def test_importing_twice_is_idempotent(tmp_path: Path) -> None:
    # The package counts its own executions in a module outside it.
    counter = "import builtins\nbuiltins.tether_test_imports += 1\n"
    project = _project(tmp_path / "project", "alpha", "hello", init=counter)
    builtins.tether_test_imports = 0  # type: ignore[attr-defined]
    try:
        from_string(project / "agents")
        first = ChatAgentClassRegistry.get("alpha")
        from_string(project)  # the same package, named through its project dir
        from_string(str(project / "agents") + "/")
        assert builtins.tether_test_imports == 1  # type: ignore[attr-defined]
        assert ChatAgentClassRegistry.get("alpha") is first
    finally:
        del builtins.tether_test_imports  # type: ignore[attr-defined]


def test_two_packages_named_agents_do_not_collide(tmp_path: Path) -> None:
    first = _project(tmp_path / "one", "first", "from one")
    second = _project(tmp_path / "two", "second", "from two")

    from_string(first)
    from_string(second)

    one, two = ChatAgentClassRegistry.get("first"), ChatAgentClassRegistry.get("second")
    assert one is not None and two is not None
    # Each package's relative import found its own helpers module.
    assert one.greeting == "from one"  # type: ignore[attr-defined]
    assert two.greeting == "from two"  # type: ignore[attr-defined]
    assert one.__module__ != two.__module__


def test_module_name_is_derived_from_the_resolved_path(tmp_path: Path) -> None:
    a = tmp_path / "one" / "agents"
    b = tmp_path / "two" / "agents"
    assert module_name_for(a) == module_name_for(tmp_path / "one" / "." / "agents")
    assert module_name_for(a) != module_name_for(b)
    assert module_name_for(a).isidentifier()


def test_missing_dir_names_the_path(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere" / "agents"
    with pytest.raises(AgentPackageImportError, match="agents package not found") as raised:
        from_string(missing)
    assert str(missing) in str(raised.value)


def test_a_dir_that_is_not_a_package_names_the_path(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    with pytest.raises(AgentPackageImportError, match="not an agents package") as raised:
        from_string(tmp_path / "empty")
    assert str(tmp_path / "empty") in str(raised.value)


def test_an_import_error_names_the_path_and_can_be_retried(tmp_path: Path) -> None:
    project = _project(tmp_path / "project", "alpha", "hello")
    broken = project / "agents" / "broken.py"
    broken.write_text("import tether_no_such_module\n", encoding="utf-8")

    with pytest.raises(AgentPackageImportError) as raised:
        from_string(project)
    message = str(raised.value)
    assert str(project / "agents") in message
    assert "tether_no_such_module" in message
    assert str(broken) in message
    assert isinstance(raised.value.__cause__, ModuleNotFoundError)
    name = module_name_for(project / "agents")
    assert not [key for key in sys.modules if key == name or key.startswith(name + ".")]

    broken.write_text("", encoding="utf-8")
    assert from_string(project).get("alpha") is not None


def test_a_syntax_error_names_the_file_and_line(tmp_path: Path) -> None:
    project = _project(tmp_path / "project", "alpha", "hello")
    (project / "agents" / "typo.py").write_text("x = 1\ndef oops(:\n", encoding="utf-8")
    with pytest.raises(AgentPackageImportError, match=r"typo\.py, line 2"):
        from_string(project)


def test_project_paths(tmp_path: Path) -> None:
    project = _project(tmp_path / "project", "alpha", "hello")
    agents = (project / "agents").resolve()
    expected = (agents, agents / "agent_setups.json", agents / "env" / "agent_setups.json")
    assert project_paths(project) == expected
    assert project_paths(project / "agents") == expected


def test_the_seed_wiring_imports_work(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The seed's wiring example, from a project directory, with its relative paths.
    from tether.adapters import AgentDependencyRegistry, AgentSetupRetrieverFromFile
    from tether.adapters.local_agent_registries_factory import LocalAgentRegistriesFactory
    from tether.cli.load_chat_agent_factory import (
        from_string as import_chat_agent_class_registry_from_string,
    )

    project = _project(tmp_path / "project", "alpha", "hello")
    (project / "agents" / "agent_setups.json").write_text(
        '[{"agent_identifier": "a", "agent_name": "alpha"}]', encoding="utf-8"
    )
    monkeypatch.chdir(project)

    chat_agent_class_registry = import_chat_agent_class_registry_from_string("./agents")
    agent_setup_retriever = AgentSetupRetrieverFromFile(
        file_path="./agents/agent_setups.json",
        secret_file_path="./agents/env/agent_setups.json",
    )
    factory = LocalAgentRegistriesFactory(
        agent_setup_retriever=agent_setup_retriever,
        chat_agent_class_registry=chat_agent_class_registry,
        agent_dependency_registry=AgentDependencyRegistry,
    )
    assert [setup.agent_name for setup in agent_setup_retriever.setups] == ["alpha"]
    assert factory.chat_agent_class_registry.get("alpha") is not None
