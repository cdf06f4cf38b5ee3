"""Dependency factories by the type they build, used as the class (as the seed's wiring does).

An agent's constructor asks for a dependency by annotating a parameter with its
type; the registry says which ``AgentDependencyFactory`` builds that type. The
factory is filed under the return annotation of its ``create`` classmethod, so
registering is one line and cannot drift from what the factory really returns.
"""

from __future__ import annotations

import importlib
import inspect
import typing
from typing import Any, ClassVar, TypeVar

from tether.domain.agent_dependency import AgentDependencyFactory

FactoryClass = TypeVar("FactoryClass", bound=type[AgentDependencyFactory])

# Factories that ship with tether and are registered on first need rather than at
# import, so importing the registry never drags in an LLM SDK, and a missing or
# broken optional module only matters to agents that ask for what it builds.
# Each entry is (module, attribute of the factory class).
_BUILTIN_FACTORIES: tuple[tuple[str, str], ...] = (
    ("tether.adapters.llm", "ChatClientFactory"),
    # Only with the tether[pydantic-ai] extra installed (an ImportError skips it).
    ("tether.integrations.pydantic_ai", "PydanticAIRunFactory"),
)


class DependencyRegistrationError(TypeError):
    """A factory cannot be registered: no usable ``create`` or return annotation,
    or another factory already builds that type."""


class AgentDependencyRegistry:
    """A process-wide registry of dependency factories, keyed by the type they build.

    ``AgentDependencyRegistry.register(MyFactory)`` (or ``@AgentDependencyRegistry.register``
    on the class) files ``MyFactory`` under the return annotation of
    ``MyFactory.create``. Registering the same factory again (its module imported
    twice) is harmless; a different factory for a taken type is an error, except
    over a built-in factory, which a project may replace.

    Built-in factories (the ``ChatClient`` factory of ``tether.adapters.llm``) are
    registered lazily by ``get``, the first time a lookup misses.

    ``copy()`` returns an isolated registry (a subclass holding its own table), so a
    test can register factories without touching the process-wide one. Any subclass
    is isolated the same way.
    """

    _factories: ClassVar[dict[type, type[AgentDependencyFactory]]] = {}
    _builtin_types: ClassVar[set[type]] = set()
    _builtins_loaded: ClassVar[bool] = False

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        # Every subclass starts from a copy of its parent's table and then diverges.
        cls._factories = dict(cls._factories)
        cls._builtin_types = set(cls._builtin_types)

    @classmethod
    def register(cls, factory_class: FactoryClass) -> FactoryClass:
        """File ``factory_class`` under the return type of its ``create``; returns it,
        so it works as a class decorator."""
        dependency_type = factory_return_type(factory_class)
        existing = cls._factories.get(dependency_type)
        if (
            existing is not None
            and _qualified(existing) != _qualified(factory_class)
            and dependency_type not in cls._builtin_types
        ):
            raise DependencyRegistrationError(
                f"{_qualified(dependency_type)} is already built by {_qualified(existing)}; "
                f"cannot register {_qualified(factory_class)}"
            )
        cls._factories[dependency_type] = factory_class
        cls._builtin_types.discard(dependency_type)
        return factory_class

    @classmethod
    def get(cls, dependency_type: type) -> type[AgentDependencyFactory] | None:
        """The factory that builds ``dependency_type``, or None."""
        factory = cls._factories.get(dependency_type)
        if factory is None and not cls._builtins_loaded:
            cls._load_builtins()
            factory = cls._factories.get(dependency_type)
        return factory

    @classmethod
    def types(cls) -> list[type]:
        """Every type a factory is registered for (built-ins included once loaded)."""
        return list(cls._factories)

    @classmethod
    def copy(cls) -> type[AgentDependencyRegistry]:
        """An isolated registry starting with this one's factories."""
        return type(f"{cls.__name__}Copy", (cls,), {})

    @classmethod
    def _load_builtins(cls) -> None:
        cls._builtins_loaded = True
        for module_name, attribute in _BUILTIN_FACTORIES:
            try:
                module = importlib.import_module(module_name)
            except ImportError:
                # The module is optional (or not written yet); agents that need what
                # it builds get the usual "no factory" error naming the type.
                continue
            factory_class = getattr(module, attribute, None)
            if not isinstance(factory_class, type):
                continue
            if not issubclass(factory_class, AgentDependencyFactory):
                continue
            dependency_type = factory_return_type(factory_class)
            # A project's own factory for the same type wins over the built-in one.
            if dependency_type not in cls._factories:
                cls._factories[dependency_type] = factory_class
                cls._builtin_types.add(dependency_type)


def factory_return_type(factory_class: type[AgentDependencyFactory]) -> type:
    """The type ``factory_class.create`` says it returns; raises
    ``DependencyRegistrationError`` when that cannot be determined."""
    name = _qualified(factory_class)
    if not (isinstance(factory_class, type) and issubclass(factory_class, AgentDependencyFactory)):
        raise DependencyRegistrationError(f"{name} is not an AgentDependencyFactory subclass")
    create = inspect.getattr_static(factory_class, "create", None)
    if not isinstance(create, classmethod):
        raise DependencyRegistrationError(f"{name}.create must be a classmethod")
    if getattr(create.__func__, "__isabstractmethod__", False):
        raise DependencyRegistrationError(f"{name} does not implement create")
    try:
        hints = typing.get_type_hints(factory_class.create)
    except Exception as exc:
        # Annotations are resolved in the factory's module: a type defined inside a
        # function, or imported only under TYPE_CHECKING, cannot be found there.
        raise DependencyRegistrationError(
            f"cannot resolve the annotations of {name}.create: {exc} (the return type must "
            "be importable from the factory's module)"
        ) from exc
    if "return" not in hints:
        raise DependencyRegistrationError(
            f"{name}.create has no return annotation; it is registered under the type it "
            f"returns, so annotate it (def create(cls, ...) -> MyDependency)"
        )
    dependency_type = hints["return"]
    if not isinstance(dependency_type, type) or dependency_type is type(None):
        raise DependencyRegistrationError(
            f"{name}.create must be annotated to return a class, not {dependency_type!r}"
        )
    return dependency_type


def _qualified(obj: Any) -> str:
    return f"{getattr(obj, '__module__', '?')}.{getattr(obj, '__qualname__', repr(obj))}"
