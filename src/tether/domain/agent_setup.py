"""Agent setups: which agent class runs under which identifier, with what configuration."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

from pydantic import BaseModel, ConfigDict, Field


class AgentSetup(BaseModel):
    """One entry of ``agent_setups.json``.

    ``agent_identifier`` is what clients name; ``agent_name`` is the registered
    class; ``agent_configuration`` fills the class's constructor by parameter name.
    """

    model_config = ConfigDict(extra="forbid")

    agent_identifier: str = Field(min_length=1)
    agent_name: str = Field(min_length=1)
    llm_configuration_name: str | None = None
    agent_configuration: dict[str, Any] = Field(default_factory=dict)


class AgentSetupError(ValueError):
    """An agent setup file is malformed or inconsistent; the message names the file."""


class AgentSetupRetriever(ABC):
    """Where agent setups come from."""

    @abstractmethod
    async def get(self, agent_identifier: str) -> AgentSetup | None:
        """The setup for ``agent_identifier``, or None when there is none."""

    @abstractmethod
    async def list(self) -> list[AgentSetup]:
        """Every setup, in file order."""
