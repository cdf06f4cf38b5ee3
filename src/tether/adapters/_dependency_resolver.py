"""Building an agent for one turn: every constructor parameter from somewhere known.

Each parameter of the agent's constructor (and, recursively, of every dependency
factory's ``create``) is looked up, in order:

1. by type: the turn's built-ins (``TurnContext``, ``ChatRequest``,
   ``RequestHeaders``, ``AgentSetup``) or a registered dependency factory; one
   instance per type per turn, so everyone asking for a type shares it;
2. by name, from the setup's ``agent_configuration``;
3. by name, from the request's ``bot_params``, only for the agent's declared
   ``request_parameters``;
4. the parameter's default.

Anything else is an ``AgentConstructionError`` naming the agent, the parameter
and where it looked. The same plan runs without building anything
(``check_agent_buildable``) so a setup that can never work fails at start-up.
"""

from __future__ import annotations

import copy
import inspect
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from tether.adapters.agent_dependency_registry import AgentDependencyRegistry
from tether.domain.agent_dependency import AgentDependencyFactory
from tether.domain.agent_registries import AgentConstructionError, BotParamsRejectedError
from tether.domain.agent_setup import AgentSetup
from tether.domain.chat_agent import ChatAgent
from tether.domain.chat_request import ChatRequest, RequestHeaders
from tether.domain.turn_context import TurnContext

BUILTIN_INJECTABLES: tuple[type, ...] = (TurnContext, ChatRequest, RequestHeaders, AgentSetup)


def check_bot_params(
    setup: AgentSetup, agent_class: type[ChatAgent], bot_params: dict[str, Any] | None
) -> None:
    """Raise ``BotParamsRejectedError`` unless every key of ``bot_params`` is a
    request parameter ``agent_class`` declares and the setup's configuration does
    not already set: a client can fill gaps the operator left open, never add to
    or override what the operator configured."""
    if not bot_params:
        return
    declared = agent_class.request_parameters
    undeclared = sorted(key for key in bot_params if key not in declared)
    configured = sorted(
        key for key in bot_params if key in declared and key in setup.agent_configuration
    )
    if not undeclared and not configured:
        return
    problems = []
    if undeclared:
        problems.append(
            f"{_keys(undeclared)} not request parameters of {agent_class.__qualname__} "
            f"(declared: {', '.join(sorted(declared)) or 'none'})"
        )
    if configured:
        problems.append(f"{_keys(configured)} set by agent_configuration and cannot be overridden")
    raise BotParamsRejectedError(
        f"bot_params rejected for agent {setup.agent_identifier!r}: {'; '.join(problems)}"
    )


async def build_agent(
    agent_class: type[ChatAgent],
    setup: AgentSetup,
    request: ChatRequest,
    turn: TurnContext,
    registry: type[AgentDependencyRegistry],
) -> tuple[ChatAgent, list[Any]]:
    """The agent for this turn, and every dependency instance built for it (in the
    order built), for the runtime to find the resumable ones."""
    resolver = _Resolver(agent_class, setup, registry, request.bot_params or {})
    resolver.instances.update(
        {
            TurnContext: turn,
            ChatRequest: request,
            RequestHeaders: request.request_headers,
            AgentSetup: setup,
        }
    )
    agent = await resolver.build_agent()
    return agent, resolver.built


def check_agent_buildable(
    agent_class: type[ChatAgent], setup: AgentSetup, registry: type[AgentDependencyRegistry]
) -> None:
    """Walk the same plan as ``build_agent`` without building anything; raises
    ``AgentConstructionError`` for a missing or cyclic dependency or a required
    parameter nothing can fill. Request parameters count as fillable."""
    _Resolver(agent_class, setup, registry, bot_params=None).check_agent()


class _Source(Enum):
    BUILTIN = "built-in"
    FACTORY = "factory"
    CONFIGURATION = "agent_configuration"
    BOT_PARAMS = "bot_params"
    DEFAULT = "default"


@dataclass(frozen=True)
class _Param:
    name: str
    positional_only: bool
    hint: Any
    default: Any
    dependency_type: type | None


@dataclass(frozen=True)
class _Link:
    """One step of the path from the agent to the dependency being built, for
    cycle detection (by type) and for error messages (by label)."""

    dependency_type: type | None
    label: str
    # Whose parameters are resolved at this step: ``Agent.__init__`` or ``Factory.create``.
    callable_name: str


@dataclass
class _Resolver:
    agent_class: type[ChatAgent]
    setup: AgentSetup
    registry: type[AgentDependencyRegistry]
    # None means "not known yet": the start-up check, where any request parameter may come.
    bot_params: dict[str, Any] | None
    instances: dict[type, Any] = field(default_factory=dict)
    built: list[Any] = field(default_factory=list)
    _checked: set[type] = field(default_factory=set)

    async def build_agent(self) -> ChatAgent:
        chain = [_agent_link(self.agent_class)]
        args, kwargs = await self._arguments(self._parameters(self.agent_class, chain), chain)
        try:
            return self.agent_class(*args, **kwargs)
        except Exception as exc:
            raise self._error(f"{chain[0].label} raised {type(exc).__name__}: {exc}") from exc

    def check_agent(self) -> None:
        chain = [_agent_link(self.agent_class)]
        self._check(self._parameters(self.agent_class, chain), chain)

    async def _arguments(
        self, params: list[_Param], chain: list[_Link]
    ) -> tuple[list[Any], dict[str, Any]]:
        args: list[Any] = []
        kwargs: dict[str, Any] = {}
        for param in params:
            source = self._source(param, chain)
            if source is _Source.DEFAULT:
                # Keyword parameters keep their default by being left out; a
                # positional-only one needs it passed to keep later ones in place.
                if param.positional_only:
                    args.append(param.default)
                continue
            value = await self._value(param, source, chain)
            if param.positional_only:
                args.append(value)
            else:
                kwargs[param.name] = value
        return args, kwargs

    async def _value(self, param: _Param, source: _Source, chain: list[_Link]) -> Any:
        if source is _Source.CONFIGURATION:
            # A copy, so an agent mutating its configuration cannot change later turns.
            return copy.deepcopy(self.setup.agent_configuration[param.name])
        if source is _Source.BOT_PARAMS:
            assert self.bot_params is not None
            return self.bot_params[param.name]
        assert param.dependency_type is not None
        if param.dependency_type in self.instances:
            return self.instances[param.dependency_type]
        return await self._build_dependency(param.dependency_type, chain)

    async def _build_dependency(self, dependency_type: type, chain: list[_Link]) -> Any:
        factory, inner_chain = self._enter(dependency_type, chain)
        args, kwargs = await self._arguments(
            self._parameters(factory.create, inner_chain), inner_chain
        )
        try:
            instance = factory.create(*args, **kwargs)
            if inspect.isawaitable(instance):
                instance = await instance
        except Exception as exc:
            raise self._error(f"{_owner(inner_chain)} raised {type(exc).__name__}: {exc}") from exc
        self.instances[dependency_type] = instance
        self.built.append(instance)
        return instance

    def _check(self, params: list[_Param], chain: list[_Link]) -> None:
        for param in params:
            source = self._source(param, chain)
            dependency_type = param.dependency_type
            if source is not _Source.FACTORY or dependency_type in self._checked:
                continue
            assert dependency_type is not None
            factory, inner_chain = self._enter(dependency_type, chain)
            self._check(self._parameters(factory.create, inner_chain), inner_chain)
            self._checked.add(dependency_type)

    def _enter(
        self, dependency_type: type, chain: list[_Link]
    ) -> tuple[type[AgentDependencyFactory], list[_Link]]:
        """The factory for ``dependency_type`` and the chain extended by it, refusing
        a type that is already being built further up the chain."""
        factory = self.registry.get(dependency_type)
        assert factory is not None
        link = _Link(
            dependency_type,
            f"{dependency_type.__qualname__} ({factory.__qualname__})",
            f"{factory.__qualname__}.create",
        )
        building = [step.dependency_type for step in chain]
        if dependency_type in building:
            cycle = [*chain[building.index(dependency_type) :], link]
            raise self._error(f"dependency cycle: {_path(cycle)} (needed by {chain[0].label})")
        return factory, [*chain, link]

    def _source(self, param: _Param, chain: list[_Link]) -> _Source:
        dependency_type = param.dependency_type
        if dependency_type is not None:
            if dependency_type in BUILTIN_INJECTABLES:
                return _Source.BUILTIN
            if self.registry.get(dependency_type) is not None:
                return _Source.FACTORY
        if param.name in self.setup.agent_configuration:
            return _Source.CONFIGURATION
        requestable = param.name in self.agent_class.request_parameters
        # At start-up (bot_params None) a request parameter counts as fillable.
        if requestable and (self.bot_params is None or param.name in self.bot_params):
            return _Source.BOT_PARAMS
        if param.default is not inspect.Parameter.empty:
            return _Source.DEFAULT
        raise self._error(
            f"parameter {param.name!r} of {_owner(chain)} has no value: "
            f"{self._looked(param, requestable)}"
        )

    def _looked(self, param: _Param, requestable: bool) -> str:
        looked = []
        if param.dependency_type is not None:
            looked.append(f"no dependency factory is registered for {_type_name(param.hint)}")
        elif param.hint is not inspect.Parameter.empty:
            looked.append(f"its type {_type_name(param.hint)} is not injectable")
        looked.append(
            f"agent_configuration of {self.setup.agent_identifier!r} has no {param.name!r}"
        )
        if requestable:
            looked.append(f"bot_params has no {param.name!r}")
        else:
            looked.append(f"it is not in {self.agent_class.__qualname__}.request_parameters")
        looked.append("and it has no default")
        return ", ".join(looked)

    def _parameters(self, target: Callable[..., Any], chain: list[_Link]) -> list[_Param]:
        label = _owner(chain)
        if isinstance(target, type):
            annotated: Any = target.__init__  # type: ignore[misc]
            if annotated is object.__init__:
                return []
        else:
            annotated = target
        try:
            signature = inspect.signature(target)
        except (TypeError, ValueError) as exc:
            raise self._error(f"cannot read the signature of {label}: {exc}") from exc
        try:
            hints = typing.get_type_hints(annotated)
        except Exception as exc:
            # Typically a name imported only under TYPE_CHECKING: say so rather than guess.
            raise self._error(f"cannot resolve the annotations of {label}: {exc}") from exc
        params = []
        for parameter in signature.parameters.values():
            if parameter.kind in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD):
                continue
            hint = hints.get(parameter.name, inspect.Parameter.empty)
            params.append(
                _Param(
                    name=parameter.name,
                    positional_only=parameter.kind is parameter.POSITIONAL_ONLY,
                    hint=hint,
                    default=parameter.default,
                    dependency_type=_dependency_type(hint),
                )
            )
        return params

    def _error(self, detail: str) -> AgentConstructionError:
        return AgentConstructionError(
            f"cannot build agent {self.setup.agent_identifier!r} "
            f"({self.agent_class.__qualname__}): {detail}"
        )


def _dependency_type(hint: Any) -> type | None:
    """The class a parameter can be injected by, unwrapping ``X | None``."""
    # ``list[int]`` passes isinstance(..., type) on 3.11, hence the alias check.
    if isinstance(hint, type) and not isinstance(hint, types.GenericAlias):
        return hint
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        members = [arg for arg in typing.get_args(hint) if arg is not type(None)]
        if len(members) == 1:
            return _dependency_type(members[0])
    return None


def _agent_link(agent_class: type[ChatAgent]) -> _Link:
    name = f"{agent_class.__qualname__}.__init__"
    return _Link(None, name, name)


def _owner(chain: list[_Link]) -> str:
    """Whose parameter this is, and how the agent came to need it."""
    owner = chain[-1].callable_name
    return f"{owner} (via {_path(chain)})" if len(chain) > 1 else owner


def _path(chain: list[_Link]) -> str:
    return " -> ".join(step.label for step in chain)


def _type_name(hint: Any) -> str:
    return hint.__qualname__ if isinstance(hint, type) else repr(hint)


def _keys(keys: list[str]) -> str:
    quoted = ", ".join(repr(key) for key in keys)
    return f"{quoted} {'is' if len(keys) == 1 else 'are'}"
