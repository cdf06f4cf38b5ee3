"""Implementations of the domain's interfaces.

The ``ChatClient`` factory of ``tether.adapters.llm`` is not registered here: the
dependency registry registers it lazily on the first lookup that misses (see
``AgentDependencyRegistry.get``), so importing this package never imports an LLM SDK.
"""

from tether.adapters.agent_dependency_registry import (
    AgentDependencyRegistry,
    DependencyRegistrationError,
)
from tether.adapters.agent_setup_retriever_from_file import AgentSetupRetrieverFromFile
from tether.adapters.local_agent_registries_factory import LocalAgentRegistriesFactory

__all__ = [
    "AgentDependencyRegistry",
    "AgentSetupRetrieverFromFile",
    "DependencyRegistrationError",
    "LocalAgentRegistriesFactory",
]
