"""The seam between the chat handler and agent construction."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any

from tether.domain.agent_setup import AgentSetup
from tether.domain.chat_agent import ChatAgent
from tether.domain.chat_request import ChatRequest
from tether.domain.turn_context import TurnContext


class AgentConstructionError(Exception):
    """An agent could not be built: a missing or cyclic dependency, bad configuration."""


class BotParamsRejectedError(ValueError):
    """``bot_params`` tried to set something that is not a declared request parameter."""


@dataclass
class CreatedAgent:
    """An agent built for one turn, with every dependency instance built for it.

    The runtime scans ``dependencies`` for resumable ones to checkpoint.
    """

    agent: ChatAgent
    setup: AgentSetup
    dependencies: list[Any] = field(default_factory=list)


class AgentRegistriesFactory(ABC):
    """Finds agent setups and builds agents for turns."""

    @abstractmethod
    async def get_setup(self, agent_identifier: str) -> AgentSetup | None:
        """The setup, or None for an unknown agent (the server answers 404)."""

    @abstractmethod
    async def list_setups(self) -> list[AgentSetup]:
        """Every agent this server can run."""

    @abstractmethod
    def check_bot_params(self, setup: AgentSetup, bot_params: dict[str, Any] | None) -> None:
        """Raise ``BotParamsRejectedError`` unless every key is a request parameter
        the agent declares and its configuration does not already set."""

    @abstractmethod
    async def create_agent(
        self, setup: AgentSetup, request: ChatRequest, turn: TurnContext
    ) -> CreatedAgent:
        """Build the agent for one turn, resolving its constructor's parameters:
        by type from registered dependency factories (recursively, one instance
        per type per turn), then by name from ``agent_configuration``, then, for
        declared request parameters only, from ``bot_params``."""
