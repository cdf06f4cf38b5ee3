"""Agent classes by ``agent_name``, filled by the ``register()`` decorator at import."""

from __future__ import annotations

from collections.abc import Callable
from typing import ClassVar, TypeVar

from tether.domain.chat_agent import ChatAgent

AgentClass = TypeVar("AgentClass", bound=type[ChatAgent])


class AgentNameConflictError(ValueError):
    """Two different classes were registered under one ``agent_name``."""


class ChatAgentClassRegistry:
    """A process-wide registry, used as the class itself (as the seed's wiring does).

    ``@ChatAgentClassRegistry.register()`` files a class under its ``agent_name``
    (or the name given). Registering the same class twice (a module imported
    again) is harmless; a different class under a taken name is an error.
    """

    registry: ClassVar[dict[str, type[ChatAgent]]] = {}

    @classmethod
    def register(cls, agent_name: str | None = None) -> Callable[[AgentClass], AgentClass]:
        def decorator(agent_class: AgentClass) -> AgentClass:
            name = agent_name or getattr(agent_class, "agent_name", None)
            if not name:
                raise ValueError(f"{agent_class.__qualname__} has no agent_name to register under")
            existing = cls.registry.get(name)
            if existing is not None and _qualified(existing) != _qualified(agent_class):
                raise AgentNameConflictError(
                    f"agent_name {name!r} is taken by {_qualified(existing)}; "
                    f"cannot register {_qualified(agent_class)}"
                )
            agent_class.agent_name = name
            cls.registry[name] = agent_class
            return agent_class

        return decorator

    @classmethod
    def get(cls, agent_name: str) -> type[ChatAgent] | None:
        return cls.registry.get(agent_name)

    @classmethod
    def names(cls) -> list[str]:
        return sorted(cls.registry)


def _qualified(agent_class: type) -> str:
    return f"{agent_class.__module__}.{agent_class.__qualname__}"
