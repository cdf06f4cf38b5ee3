"""Agents built in-process from a setup retriever and the two class-level registries."""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

from tether.adapters._dependency_resolver import (
    build_agent,
    check_agent_buildable,
    check_bot_params,
)
from tether.adapters.agent_dependency_registry import AgentDependencyRegistry
from tether.domain.agent_registries import (
    AgentConstructionError,
    AgentRegistriesFactory,
    CreatedAgent,
)
from tether.domain.agent_setup import AgentSetup, AgentSetupError, AgentSetupRetriever
from tether.domain.chat_agent import ChatAgent
from tether.domain.chat_agent_class_registry import ChatAgentClassRegistry
from tether.domain.chat_request import ChatRequest
from tether.domain.turn_context import TurnContext


@runtime_checkable
class _SyncSetups(Protocol):
    """A retriever that already holds its setups (``AgentSetupRetrieverFromFile``)."""

    @property
    def setups(self) -> list[AgentSetup]: ...


class LocalAgentRegistriesFactory(AgentRegistriesFactory):
    """Finds setups through ``agent_setup_retriever`` and builds agents in this process.

    ``chat_agent_class_registry`` and ``agent_dependency_registry`` are the registry
    classes themselves (``ChatAgentClassRegistry``, ``AgentDependencyRegistry``, or
    isolated copies in tests).

    When the retriever exposes its setups synchronously (a ``setups`` property, as
    the file retriever does), the constructor calls ``validate()``, so a setup
    naming an unregistered agent or one whose constructor can never be filled
    stops the server at start-up rather than failing its first request.
    """

    def __init__(
        self,
        agent_setup_retriever: AgentSetupRetriever,
        chat_agent_class_registry: type[ChatAgentClassRegistry] = ChatAgentClassRegistry,
        agent_dependency_registry: type[AgentDependencyRegistry] = AgentDependencyRegistry,
    ) -> None:
        self.agent_setup_retriever = agent_setup_retriever
        self.chat_agent_class_registry = chat_agent_class_registry
        self.agent_dependency_registry = agent_dependency_registry
        if isinstance(agent_setup_retriever, _SyncSetups):
            self.validate()

    def validate(self, setups: list[AgentSetup] | None = None) -> None:
        """Raise ``AgentSetupError`` for the first setup that cannot work: its
        ``agent_name`` is not registered, or its agent's constructor has a
        parameter nothing can fill (or a dependency cycle).

        ``setups`` defaults to the retriever's synchronous ``setups``; pass them
        explicitly for a retriever that only has the async interface.
        """
        if setups is None:
            if not isinstance(self.agent_setup_retriever, _SyncSetups):
                raise TypeError(
                    f"{type(self.agent_setup_retriever).__qualname__} has no synchronous "
                    "setups; pass them to validate(setups=...)"
                )
            setups = self.agent_setup_retriever.setups
        for setup in setups:
            agent_class = self._agent_class_or_setup_error(setup)
            try:
                check_agent_buildable(agent_class, setup, self.agent_dependency_registry)
            except AgentConstructionError as exc:
                raise AgentSetupError(f"{self._where()}{exc}") from exc

    async def get_setup(self, agent_identifier: str) -> AgentSetup | None:
        return await self.agent_setup_retriever.get(agent_identifier)

    async def list_setups(self) -> list[AgentSetup]:
        return await self.agent_setup_retriever.list()

    def check_bot_params(self, setup: AgentSetup, bot_params: dict[str, Any] | None) -> None:
        check_bot_params(setup, self._agent_class(setup), bot_params)

    async def create_agent(
        self, setup: AgentSetup, request: ChatRequest, turn: TurnContext
    ) -> CreatedAgent:
        agent_class = self._agent_class(setup)
        # Checked again here, not only by the handler: nothing may reach an agent's
        # configuration through a request unless it passed this gate.
        check_bot_params(setup, agent_class, request.bot_params)
        agent, dependencies = await build_agent(
            agent_class, setup, request, turn, self.agent_dependency_registry
        )
        return CreatedAgent(agent=agent, setup=setup, dependencies=dependencies)

    def _agent_class(self, setup: AgentSetup) -> type[ChatAgent]:
        agent_class = self.chat_agent_class_registry.get(setup.agent_name)
        if agent_class is None:
            raise AgentConstructionError(self._unknown_agent_name(setup))
        return agent_class

    def _agent_class_or_setup_error(self, setup: AgentSetup) -> type[ChatAgent]:
        agent_class = self.chat_agent_class_registry.get(setup.agent_name)
        if agent_class is None:
            raise AgentSetupError(f"{self._where()}{self._unknown_agent_name(setup)}")
        return agent_class

    def _unknown_agent_name(self, setup: AgentSetup) -> str:
        registered = ", ".join(self.chat_agent_class_registry.names()) or "none"
        return (
            f"agent {setup.agent_identifier!r} names agent_name {setup.agent_name!r}, "
            f"which is not registered (registered: {registered})"
        )

    def _where(self) -> str:
        # Name the setups file when there is one, as every other setup error does.
        file_path = getattr(self.agent_setup_retriever, "file_path", None)
        return f"{file_path}: " if file_path is not None else ""
