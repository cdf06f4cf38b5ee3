"""Building agents: by type, recursively, one instance per type per turn; by name from
configuration; bot_params only for declared request parameters; defaults; errors."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tether.adapters import (
    AgentDependencyRegistry,
    AgentSetupRetrieverFromFile,
    DependencyRegistrationError,
    LocalAgentRegistriesFactory,
)
from tether.adapters._dependency_resolver import build_agent, check_bot_params
from tether.adapters.llm import ChatClient, ChatClientFactory
from tether.domain import (
    AgentConstructionError,
    AgentDependencyFactory,
    AgentSetup,
    AgentSetupError,
    AgentSetupRetriever,
    BotParamsRejectedError,
    ChatAgent,
    ChatAgentClassRegistry,
    ChatMessage,
    ChatRequest,
    RequestHeaders,
    TurnContext,
)

# Dependencies. Module level, because factories are filed under their resolved
# return annotations, which must be importable names.


class Database:
    def __init__(self, url: str, tenant: str) -> None:
        self.url = url
        self.tenant = tenant


class DatabaseFactory(AgentDependencyFactory):
    @classmethod
    def create(cls, database_url: str, turn: TurnContext) -> Database:
        return Database(database_url, turn.tenant)


class Repository:
    def __init__(self, database: Database, setup: AgentSetup) -> None:
        self.database = database
        self.setup = setup


class RepositoryFactory(AgentDependencyFactory):
    @classmethod
    def create(cls, database: Database, setup: AgentSetup) -> Repository:
        return Repository(database, setup)


class Cache:
    def __init__(self, size: int) -> None:
        self.size = size


class AsyncCacheFactory(AgentDependencyFactory):
    @classmethod
    async def create(cls, cache_size: int = 16) -> Cache:
        return Cache(cache_size)


class CycleA:
    pass


class CycleB:
    pass


class CycleAFactory(AgentDependencyFactory):
    @classmethod
    def create(cls, b: CycleB) -> CycleA:
        return CycleA()


class CycleBFactory(AgentDependencyFactory):
    @classmethod
    def create(cls, a: CycleA) -> CycleB:
        return CycleB()


class Unregistered:
    pass


class Broken:
    pass


class BrokenFactory(AgentDependencyFactory):
    @classmethod
    def create(cls) -> Broken:
        raise RuntimeError("connection refused")


class _Agent(ChatAgent):
    async def execute(self, conversation: list[ChatMessage]) -> ChatMessage | None:
        return None


class FullAgent(_Agent):
    agent_name = "full"
    request_parameters = frozenset({"style", "audience"})

    def __init__(
        self,
        repository: Repository,
        database: Database,
        turn: TurnContext,
        request: ChatRequest,
        headers: RequestHeaders,
        setup: AgentSetup,
        greeting: str,
        cache: Cache | None,
        style: str = "plain",
        audience: str = "everyone",
        temperature: float = 0.5,
    ) -> None:
        self.repository = repository
        self.database = database
        self.turn = turn
        self.request = request
        self.headers = headers
        self.setup = setup
        self.greeting = greeting
        self.cache = cache
        self.style = style
        self.audience = audience
        self.temperature = temperature


class CycleAgent(_Agent):
    agent_name = "cycle"

    def __init__(self, a: CycleA) -> None:
        self.a = a


class MissingTypeAgent(_Agent):
    agent_name = "missing-type"

    def __init__(self, thing: Unregistered) -> None:
        self.thing = thing


class NeedsDatabaseAgent(_Agent):
    agent_name = "needs-database"

    def __init__(self, database: Database) -> None:
        self.database = database


class BrokenAgent(_Agent):
    agent_name = "broken"

    def __init__(self, broken: Broken) -> None:
        self.broken = broken


class RequiredRequestParamAgent(_Agent):
    agent_name = "required-request-param"
    request_parameters = frozenset({"topic"})

    def __init__(self, topic: str) -> None:
        self.topic = topic


class NoInitAgent(_Agent):
    agent_name = "no-init"


@pytest.fixture
def registry() -> type[AgentDependencyRegistry]:
    isolated = AgentDependencyRegistry.copy()
    for factory in (DatabaseFactory, RepositoryFactory, AsyncCacheFactory):
        isolated.register(factory)
    return isolated


@pytest.fixture
def agent_classes() -> Iterator[type[ChatAgentClassRegistry]]:
    snapshot = dict(ChatAgentClassRegistry.registry)
    for agent_class in (FullAgent, CycleAgent, MissingTypeAgent, NeedsDatabaseAgent, BrokenAgent):
        ChatAgentClassRegistry.register()(agent_class)
    yield ChatAgentClassRegistry
    ChatAgentClassRegistry.registry.clear()
    ChatAgentClassRegistry.registry.update(snapshot)


def _setup(agent_name: str = "full", **configuration: Any) -> AgentSetup:
    if agent_name == "full" and not configuration:
        configuration = {"greeting": "hi", "database_url": "sqlite://x"}
    return AgentSetup(
        agent_identifier=f"{agent_name}-id",
        agent_name=agent_name,
        agent_configuration=configuration,
    )


def _request(bot_params: dict[str, Any] | None = None) -> ChatRequest:
    return ChatRequest(
        tenant="acme",
        request_headers=RequestHeaders.model_validate({"requester-uuid": "u1"}),
        agent_identifier="full-id",
        conversation=[ChatMessage(sender="user", content="hello")],  # type: ignore[arg-type]
        bot_params=bot_params,
    )


def _turn() -> TurnContext:
    return TurnContext(
        tenant="acme",
        requester_uuid="u1",
        session_id=None,
        message_id="m1",
        agent_identifier="full-id",
    )


async def _build(
    agent_class: type[ChatAgent],
    setup: AgentSetup,
    registry: type[AgentDependencyRegistry],
    bot_params: dict[str, Any] | None = None,
) -> tuple[Any, list[Any]]:
    return await build_agent(agent_class, setup, _request(bot_params), _turn(), registry)


# By type


async def test_builtins_and_factories_are_injected_by_type(
    registry: type[AgentDependencyRegistry],
) -> None:
    setup = _setup()
    request, turn = _request(), _turn()
    agent, _ = await build_agent(FullAgent, setup, request, turn, registry)

    assert isinstance(agent, FullAgent)
    assert agent.turn is turn
    assert agent.request is request
    assert agent.headers is request.request_headers
    assert agent.setup is setup
    assert isinstance(agent.database, Database)
    assert isinstance(agent.cache, Cache) and agent.cache.size == 16  # async create, X | None


async def test_factory_parameters_resolve_recursively(
    registry: type[AgentDependencyRegistry],
) -> None:
    agent, _ = await _build(FullAgent, _setup(), registry)
    # RepositoryFactory asked for a Database (a factory), which asked for
    # database_url (configuration) and the TurnContext (a built-in).
    assert agent.repository.database.url == "sqlite://x"
    assert agent.repository.database.tenant == "acme"
    assert agent.repository.setup.agent_identifier == "full-id"


async def test_one_instance_per_type_per_turn(registry: type[AgentDependencyRegistry]) -> None:
    agent, dependencies = await _build(FullAgent, _setup(), registry)
    assert agent.database is agent.repository.database
    # Every instance built, once each, in build order, for the runtime to scan.
    assert [type(d) for d in dependencies] == [Database, Repository, Cache]
    assert dependencies[0] is agent.database

    next_turn, _ = await _build(FullAgent, _setup(), registry)
    assert next_turn.database is not agent.database


async def test_dependency_cycle_names_the_chain(registry: type[AgentDependencyRegistry]) -> None:
    registry.register(CycleAFactory)
    registry.register(CycleBFactory)
    with pytest.raises(AgentConstructionError) as raised:
        await _build(CycleAgent, _setup("cycle"), registry)
    message = str(raised.value)
    assert "dependency cycle" in message
    assert "CycleA (CycleAFactory) -> CycleB (CycleBFactory) -> CycleA (CycleAFactory)" in message
    assert "CycleAgent" in message


async def test_missing_type_names_agent_parameter_and_type(
    registry: type[AgentDependencyRegistry],
) -> None:
    with pytest.raises(AgentConstructionError) as raised:
        await _build(MissingTypeAgent, _setup("missing-type"), registry)
    message = str(raised.value)
    assert "'missing-type-id'" in message and "MissingTypeAgent" in message
    assert "parameter 'thing'" in message
    assert "no dependency factory is registered for Unregistered" in message


async def test_missing_value_deep_in_the_chain_names_the_chain(
    registry: type[AgentDependencyRegistry],
) -> None:
    with pytest.raises(AgentConstructionError) as raised:
        await _build(NeedsDatabaseAgent, _setup("needs-database"), registry)
    message = str(raised.value)
    assert "parameter 'database_url' of DatabaseFactory.create" in message
    assert "NeedsDatabaseAgent.__init__ -> Database (DatabaseFactory)" in message
    assert "agent_configuration of 'needs-database-id' has no 'database_url'" in message


async def test_a_failing_factory_is_an_agent_construction_error(
    registry: type[AgentDependencyRegistry],
) -> None:
    registry.register(BrokenFactory)
    with pytest.raises(AgentConstructionError, match="connection refused") as raised:
        await _build(BrokenAgent, _setup("broken"), registry)
    assert isinstance(raised.value.__cause__, RuntimeError)


async def test_agent_without_constructor(registry: type[AgentDependencyRegistry]) -> None:
    agent, dependencies = await _build(NoInitAgent, _setup("no-init"), registry)
    assert isinstance(agent, NoInitAgent) and dependencies == []


# By name, bot_params, defaults


async def test_configuration_fills_parameters_by_name(
    registry: type[AgentDependencyRegistry],
) -> None:
    setup = _setup(greeting="bonjour", database_url="pg://db", temperature=0.1)
    agent, _ = await _build(FullAgent, setup, registry)
    assert agent.greeting == "bonjour"
    assert agent.temperature == 0.1


async def test_configuration_values_are_copied_per_turn(
    registry: type[AgentDependencyRegistry],
) -> None:
    setup = _setup("needs-database", database_url="x")
    setup.agent_configuration["database_url"] = ["mutable"]
    agent, _ = await _build(NeedsDatabaseAgent, setup, registry)
    agent.database.url.append("leak")
    assert setup.agent_configuration["database_url"] == ["mutable"]


async def test_defaults_fill_what_nothing_else_does(
    registry: type[AgentDependencyRegistry],
) -> None:
    agent, _ = await _build(FullAgent, _setup(), registry)
    assert (agent.style, agent.audience, agent.temperature) == ("plain", "everyone", 0.5)


async def test_bot_params_fill_declared_request_parameters(
    registry: type[AgentDependencyRegistry],
) -> None:
    agent, _ = await _build(FullAgent, _setup(), registry, bot_params={"style": "pirate"})
    assert agent.style == "pirate"
    assert agent.audience == "everyone"


async def test_bot_params_never_reach_undeclared_parameters(
    registry: type[AgentDependencyRegistry],
) -> None:
    # Even past the check (build_agent alone), an undeclared name is not taken from bot_params.
    agent, _ = await _build(
        FullAgent, _setup(), registry, bot_params={"temperature": 2.0, "greeting": "pwned"}
    )
    assert agent.temperature == 0.5
    assert agent.greeting == "hi"


async def test_configuration_wins_over_bot_params(
    registry: type[AgentDependencyRegistry],
) -> None:
    setup = _setup(greeting="hi", database_url="x", style="formal")
    agent, _ = await _build(FullAgent, setup, registry, bot_params={"style": "pirate"})
    assert agent.style == "formal"


async def test_nothing_to_fill_a_parameter_names_where_it_looked(
    registry: type[AgentDependencyRegistry],
) -> None:
    with pytest.raises(AgentConstructionError) as raised:
        await _build(FullAgent, _setup(database_url="x"), registry)
    message = str(raised.value)
    assert "'full-id'" in message and "FullAgent" in message
    assert "parameter 'greeting' of FullAgent.__init__" in message
    assert "agent_configuration of 'full-id' has no 'greeting'" in message
    assert "not in FullAgent.request_parameters" in message
    assert "no default" in message


async def test_missing_request_parameter_says_bot_params_lacked_it(
    registry: type[AgentDependencyRegistry],
) -> None:
    with pytest.raises(AgentConstructionError, match="bot_params has no 'topic'"):
        await _build(RequiredRequestParamAgent, _setup("required-request-param"), registry)
    agent, _ = await _build(
        RequiredRequestParamAgent,
        _setup("required-request-param"),
        registry,
        bot_params={"topic": "tides"},
    )
    assert agent.topic == "tides"


# check_bot_params


def test_check_bot_params_accepts_declared_unconfigured_keys() -> None:
    check_bot_params(_setup(), FullAgent, {"style": "x", "audience": "y"})
    check_bot_params(_setup(), FullAgent, None)
    check_bot_params(_setup(), FullAgent, {})


def test_check_bot_params_rejects_undeclared_keys() -> None:
    with pytest.raises(BotParamsRejectedError) as raised:
        check_bot_params(_setup(), FullAgent, {"style": "x", "temperature": 2, "extra": 1})
    message = str(raised.value)
    assert "'extra', 'temperature' are not request parameters of FullAgent" in message
    assert "declared: audience, style" in message
    assert "'style'" not in message


def test_check_bot_params_rejects_keys_set_by_configuration() -> None:
    setup = _setup(greeting="hi", database_url="x", style="formal")
    with pytest.raises(BotParamsRejectedError) as raised:
        check_bot_params(setup, FullAgent, {"style": "pirate", "audience": "kids"})
    message = str(raised.value)
    assert "'style' is set by agent_configuration" in message
    assert "'audience'" not in message


# The registry


def test_register_files_a_factory_under_its_return_annotation() -> None:
    isolated = AgentDependencyRegistry.copy()
    assert isolated.register(DatabaseFactory) is DatabaseFactory
    assert isolated.get(Database) is DatabaseFactory
    isolated.register(DatabaseFactory)  # the same factory again: harmless


def test_copies_do_not_touch_the_process_wide_registry() -> None:
    isolated = AgentDependencyRegistry.copy()
    isolated.register(BrokenFactory)
    assert isolated.get(Broken) is BrokenFactory
    assert AgentDependencyRegistry.get(Broken) is None
    assert AgentDependencyRegistry.copy().get(Broken) is None


def test_register_works_as_a_decorator() -> None:
    isolated = AgentDependencyRegistry.copy()

    @isolated.register
    class UnregisteredFactory(AgentDependencyFactory):
        @classmethod
        def create(cls) -> Unregistered:
            return Unregistered()

    assert isolated.get(Unregistered) is UnregisteredFactory


def test_register_needs_a_return_annotation() -> None:
    class NoAnnotationFactory(AgentDependencyFactory):
        @classmethod
        def create(cls):
            return object()

    with pytest.raises(DependencyRegistrationError, match="no return annotation"):
        AgentDependencyRegistry.copy().register(NoAnnotationFactory)


def test_register_refuses_a_second_factory_for_a_type() -> None:
    class OtherDatabaseFactory(AgentDependencyFactory):
        @classmethod
        def create(cls) -> Database:
            return Database("other", "t")

    isolated = AgentDependencyRegistry.copy()
    isolated.register(DatabaseFactory)
    with pytest.raises(DependencyRegistrationError, match="already built by"):
        isolated.register(OtherDatabaseFactory)


def test_chat_client_factory_is_a_lazy_builtin() -> None:
    assert AgentDependencyRegistry.copy().get(ChatClient) is ChatClientFactory


def test_a_project_factory_replaces_the_builtin_chat_client_factory() -> None:
    class MyChatClientFactory(AgentDependencyFactory):
        @classmethod
        def create(cls) -> ChatClient:
            raise NotImplementedError

    before = AgentDependencyRegistry.copy()
    before.register(MyChatClientFactory)
    assert before.get(ChatClient) is MyChatClientFactory

    after = AgentDependencyRegistry.copy()
    assert after.get(ChatClient) is not None  # the built-in, loaded
    after.register(MyChatClientFactory)
    assert after.get(ChatClient) is MyChatClientFactory


# LocalAgentRegistriesFactory


class _MemoryRetriever(AgentSetupRetriever):
    """Async-only, so the factory cannot validate at construction."""

    def __init__(self, *setups: AgentSetup) -> None:
        self._setups = {setup.agent_identifier: setup for setup in setups}

    async def get(self, agent_identifier: str) -> AgentSetup | None:
        return self._setups.get(agent_identifier)

    async def list(self) -> list[AgentSetup]:
        return list(self._setups.values())


def _file_retriever(tmp_path: Path, *setups: AgentSetup) -> AgentSetupRetrieverFromFile:
    path = tmp_path / "agent_setups.json"
    path.write_text(json.dumps([setup.model_dump() for setup in setups]), encoding="utf-8")
    return AgentSetupRetrieverFromFile(file_path=path)


async def test_factory_creates_agents_with_their_dependencies(
    registry: type[AgentDependencyRegistry], agent_classes: type[ChatAgentClassRegistry]
) -> None:
    factory = LocalAgentRegistriesFactory(
        agent_setup_retriever=_MemoryRetriever(_setup()),
        chat_agent_class_registry=agent_classes,
        agent_dependency_registry=registry,
    )
    setup = await factory.get_setup("full-id")
    assert setup is not None and [s.agent_identifier for s in await factory.list_setups()] == [
        "full-id"
    ]
    created = await factory.create_agent(setup, _request({"style": "pirate"}), _turn())
    assert isinstance(created.agent, FullAgent) and created.agent.style == "pirate"
    assert created.setup is setup
    assert [type(d) for d in created.dependencies] == [Database, Repository, Cache]


async def test_factory_rejects_bot_params_in_check_and_in_create(
    registry: type[AgentDependencyRegistry], agent_classes: type[ChatAgentClassRegistry]
) -> None:
    factory = LocalAgentRegistriesFactory(_MemoryRetriever(_setup()), agent_classes, registry)
    with pytest.raises(BotParamsRejectedError, match="'greeting'"):
        factory.check_bot_params(_setup(), {"greeting": "x"})
    with pytest.raises(BotParamsRejectedError, match="'greeting'"):
        await factory.create_agent(_setup(), _request({"greeting": "x"}), _turn())


def test_factory_validates_at_construction_an_unregistered_agent_name(
    tmp_path: Path,
    registry: type[AgentDependencyRegistry],
    agent_classes: type[ChatAgentClassRegistry],
) -> None:
    retriever = _file_retriever(tmp_path, _setup(), _setup("nonexistent"))
    with pytest.raises(AgentSetupError) as raised:
        LocalAgentRegistriesFactory(retriever, agent_classes, registry)
    message = str(raised.value)
    assert str(retriever.file_path) in message
    assert "agent_name 'nonexistent', which is not registered" in message
    assert "full" in message and "needs-database" in message  # the registered names


def test_factory_validates_at_construction_an_unbuildable_agent(
    tmp_path: Path,
    registry: type[AgentDependencyRegistry],
    agent_classes: type[ChatAgentClassRegistry],
) -> None:
    retriever = _file_retriever(tmp_path, _setup("needs-database"))
    with pytest.raises(AgentSetupError, match="database_url"):
        LocalAgentRegistriesFactory(retriever, agent_classes, registry)


def test_factory_validates_at_construction_a_cycle(
    tmp_path: Path,
    registry: type[AgentDependencyRegistry],
    agent_classes: type[ChatAgentClassRegistry],
) -> None:
    registry.register(CycleAFactory)
    registry.register(CycleBFactory)
    retriever = _file_retriever(tmp_path, _setup("cycle"))
    with pytest.raises(AgentSetupError, match="dependency cycle"):
        LocalAgentRegistriesFactory(retriever, agent_classes, registry)


def test_validation_counts_request_parameters_as_fillable(
    tmp_path: Path,
    registry: type[AgentDependencyRegistry],
    agent_classes: type[ChatAgentClassRegistry],
) -> None:
    ChatAgentClassRegistry.register()(RequiredRequestParamAgent)
    retriever = _file_retriever(tmp_path, _setup("required-request-param"), _setup())
    LocalAgentRegistriesFactory(retriever, agent_classes, registry)  # does not raise


def test_async_only_retriever_is_validated_on_request(
    registry: type[AgentDependencyRegistry], agent_classes: type[ChatAgentClassRegistry]
) -> None:
    factory = LocalAgentRegistriesFactory(
        _MemoryRetriever(_setup("nonexistent")), agent_classes, registry
    )
    with pytest.raises(AgentSetupError, match="not registered"):
        factory.validate([_setup("nonexistent")])
    with pytest.raises(AgentConstructionError, match="not registered"):
        factory.check_bot_params(_setup("nonexistent"), None)
