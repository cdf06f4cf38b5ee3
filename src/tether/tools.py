"""Tools an agent offers the model: a name, a description, a JSON schema and an async function.

``@tool`` builds a ``Tool`` from a plain async function. The schema comes from the
signature's type hints (through pydantic), so the schema the model sees and the
validation ``invoke`` applies can never drift apart.

A tool call survives its replica dying: the model/tool loop records a call as
*started* in the turn's checkpoint before it runs and *completed* with its
result after. On resume a completed call is never run again; a call that
started but never completed has an *unknown outcome*, and the tool's
``on_unknown`` says what happens then:

- ``"retry"``: run it again (the default for ``read_only`` tools: reading twice
  is harmless);
- ``"fail"``: do not run it; the model gets a result saying the call may or
  may not have happened (the default for every other tool: a call that must
  not run twice never does);
- ``"ask"``: do not run it; the turn ends asking the user what to do.

While a tool runs, ``current_tool_call()`` gives its ``idempotency_key`` (the
turn and the call's place in it: the same on every attempt, on every
replica), to pass on to the service it calls so that service can refuse a
repeat too.
"""

from __future__ import annotations

import contextvars
import inspect
import typing
from collections.abc import Awaitable, Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Annotated, Any, Literal, overload

from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model
from pydantic.json_schema import GenerateJsonSchema

from tether.domain.chat_model import ModelToolCall, ToolSpec

ToolFunction = Callable[..., Awaitable[Any]]
OnUnknown = Literal["retry", "fail", "ask"]
"""What a resumed turn does with a call that started but never completed."""
ON_UNKNOWN: tuple[OnUnknown, ...] = ("retry", "fail", "ask")


@dataclass(frozen=True)
class ToolCallContext:
    """The call a tool is running for (``current_tool_call()``)."""

    idempotency_key: str
    """``{turn}:{index}``: the turn's message id and the call's place among the
    turn's tool calls. The same on every attempt of this call, on any replica."""
    call_index: int
    attempt: int
    """1, or more when a ``retry`` tool runs again after its outcome was unknown."""
    tool_call_id: str


_CURRENT: contextvars.ContextVar[ToolCallContext | None] = contextvars.ContextVar(
    "tether_tool_call", default=None
)


_TURN: contextvars.ContextVar[str | None] = contextvars.ContextVar("tether_turn", default=None)


def current_turn_id() -> str | None:
    """The message id of the turn whose agent runs in this task; None outside one."""
    return _TURN.get()


def set_current_turn(message_id: str) -> None:
    """Make ``message_id`` the current turn for the rest of this task (the turn's
    own task sets it, before its agent runs; a task's context ends with it)."""
    _TURN.set(message_id)


def current_tool_call() -> ToolCallContext | None:
    """The call the running tool serves; None outside a tool call."""
    return _CURRENT.get()


@contextmanager
def running_tool_call(context: ToolCallContext) -> Iterator[None]:
    """Make ``context`` the current call while a tool runs (the tool loop's part)."""
    token = _CURRENT.set(context)
    try:
        yield
    finally:
        _CURRENT.reset(token)


class ToolArgumentsError(ValueError):
    """The arguments given to a tool do not match its parameters."""


@dataclass(frozen=True)
class MalformedToolCall(ModelToolCall):
    """A tool call whose arguments could not even be parsed (for example invalid JSON).

    A model adapter yields this instead of failing the turn; the tool loop does not
    run the tool and sends ``error`` back to the model as the tool's result, so the
    model can correct itself.
    """

    raw_arguments: str = ""
    error: str = ""


class Tool:
    """A tool the model may call.

    ``parameters`` is the JSON schema the model sees; ``invoke`` validates the
    model's arguments against the function's signature before calling it.
    """

    read_only: bool = False
    """The tool only reads: running it twice is harmless."""
    on_unknown: OnUnknown = "fail"
    """See the module docstring."""

    def __init__(
        self,
        name: str,
        description: str,
        function: ToolFunction,
        parameters: dict[str, Any] | None = None,
        *,
        read_only: bool = False,
        on_unknown: OnUnknown | None = None,
    ) -> None:
        if not name:
            raise ValueError("a tool needs a non-empty name")
        if not inspect.iscoroutinefunction(function):
            raise TypeError(f"tool {name!r}: {function!r} is not an async function")
        self.name = name
        self.description = description
        self.function = function
        self._arguments_model = _arguments_model(name, function)
        self.parameters = parameters if parameters is not None else _schema(self._arguments_model)
        self.set_outcome_policy(read_only=read_only, on_unknown=on_unknown)

    def set_outcome_policy(self, *, read_only: bool, on_unknown: OnUnknown | None) -> None:
        """Whether the tool only reads, and what a resume does with a call of it
        whose outcome is unknown (default: ``retry`` if it only reads, else ``fail``)."""
        if on_unknown is not None and on_unknown not in ON_UNKNOWN:
            raise ValueError(
                f"tool {self.name!r}: on_unknown must be one of {ON_UNKNOWN}, not {on_unknown!r}"
            )
        self.read_only = read_only
        self.on_unknown = on_unknown or ("retry" if read_only else "fail")

    @classmethod
    def from_function(
        cls,
        function: ToolFunction,
        *,
        name: str | None = None,
        description: str | None = None,
        read_only: bool = False,
        on_unknown: OnUnknown | None = None,
    ) -> Tool:
        """Build a tool from ``function``: its name, its docstring's first paragraph."""
        if description is None:
            description = _first_paragraph(inspect.getdoc(function) or "")
        return cls(
            name or function.__name__,
            description,
            function,
            read_only=read_only,
            on_unknown=on_unknown,
        )

    def spec(self) -> ToolSpec:
        """The tool as the model sees it."""
        return ToolSpec(name=self.name, description=self.description, parameters=self.parameters)

    async def invoke(self, arguments: Mapping[str, Any]) -> Any:
        """Validate ``arguments`` and call the function with them.

        Raises ``ToolArgumentsError`` when they do not fit the signature; whatever
        the function itself raises propagates unchanged.
        """
        if not isinstance(arguments, Mapping):
            raise ToolArgumentsError(
                f"tool {self.name!r} takes an object of named arguments, "
                f"got {type(arguments).__name__}"
            )
        try:
            validated = self._arguments_model.model_validate(dict(arguments))
        except ValidationError as error:
            raise ToolArgumentsError(_describe(self.name, error)) from error
        # Fields are stored under internal names (aliases carry the real ones) so a
        # parameter called ``json`` or ``schema`` cannot clash with BaseModel's API.
        kwargs = {
            field.alias or field_name: getattr(validated, field_name)
            for field_name, field in type(validated).model_fields.items()
        }
        return await self.function(**kwargs)

    def __repr__(self) -> str:
        return f"Tool(name={self.name!r})"


@overload
def tool(function: ToolFunction, /) -> Tool: ...


@overload
def tool(
    *,
    name: str | None = None,
    description: str | None = None,
    read_only: bool = False,
    on_unknown: OnUnknown | None = None,
) -> Callable[[ToolFunction], Tool]: ...


def tool(
    function: ToolFunction | None = None,
    /,
    *,
    name: str | None = None,
    description: str | None = None,
    read_only: bool = False,
    on_unknown: OnUnknown | None = None,
) -> Tool | Callable[[ToolFunction], Tool]:
    """Turn an async function into a ``Tool``: ``@tool``, or with options
    ``@tool(name=..., description=..., read_only=..., on_unknown=...)``."""
    if function is not None:
        return Tool.from_function(function)

    def decorator(inner: ToolFunction) -> Tool:
        return Tool.from_function(
            inner, name=name, description=description, read_only=read_only, on_unknown=on_unknown
        )

    return decorator


class _NoFieldTitles(GenerateJsonSchema):
    # Titles derived from parameter names only repeat the property names and cost the
    # model tokens.
    def field_title_should_be_set(self, schema: Any) -> bool:
        return False


def _arguments_model(name: str, function: ToolFunction) -> type[BaseModel]:
    signature = inspect.signature(function)
    # get_type_hints resolves the string annotations ``from __future__ import
    # annotations`` leaves behind; include_extras keeps Annotated[..., Field(...)].
    hints = typing.get_type_hints(function, include_extras=True)
    fields: dict[str, Any] = {}
    for index, parameter in enumerate(signature.parameters.values()):
        if parameter.kind in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD):
            raise TypeError(f"tool {name!r}: *args and **kwargs cannot be described to a model")
        if parameter.kind is parameter.POSITIONAL_ONLY:
            raise TypeError(f"tool {name!r}: parameter {parameter.name!r} is positional-only")
        annotation = hints.get(parameter.name, Any)
        default = ... if parameter.default is parameter.empty else parameter.default
        # The alias goes in Annotated so a ``= Field(...)`` default still merges in.
        fields[f"p{index}"] = (Annotated[annotation, Field(alias=parameter.name)], default)
    return create_model(f"{name}_arguments", __config__=ConfigDict(extra="forbid"), **fields)


def _schema(model: type[BaseModel]) -> dict[str, Any]:
    schema = model.model_json_schema(schema_generator=_NoFieldTitles)
    schema.pop("title", None)
    schema.setdefault("properties", {})
    return schema


def _first_paragraph(docstring: str) -> str:
    paragraph = docstring.strip().split("\n\n", 1)[0]
    return " ".join(paragraph.split())


def _describe(name: str, error: ValidationError) -> str:
    problems = []
    for item in error.errors():
        where = ".".join(str(part) for part in item["loc"]) or "arguments"
        problems.append(f"{where}: {item['msg']}")
    return f"invalid arguments for tool {name!r}: " + "; ".join(problems)
