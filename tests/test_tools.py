"""Tool: schema from the signature, validation on invoke; and the example calculator."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType
from typing import Annotated, Any

import pytest
from pydantic import Field

from tether.domain.chat_model import ToolSpec
from tether.tools import Tool, ToolArgumentsError, tool

EXAMPLE_TOOLS = Path(__file__).parent.parent / "src" / "tether" / "examples" / "agents" / "tools.py"


def _example_tools() -> ModuleType:
    # Loaded by path rather than as ``tether.examples.agents.tools``: importing the
    # package would register the example agents under a module name the project
    # loader does not use, and a later load by the loader would then conflict.
    spec = importlib.util.spec_from_file_location("_tether_example_tools", EXAMPLE_TOOLS)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@tool
async def search(
    query: str,
    limit: Annotated[int, Field(description="How many hits.", ge=1)] = 5,
    exact: bool = False,
) -> dict[str, Any]:
    """Search the library catalogue.

    This second paragraph is not part of the description.
    """
    return {"query": query, "limit": limit, "exact": exact}


def test_schema_is_derived_from_the_signature() -> None:
    assert search.name == "search"
    assert search.description == "Search the library catalogue."
    assert search.parameters == {
        "type": "object",
        "properties": {
            "query": {"type": "string"},
            "limit": {
                "type": "integer",
                "default": 5,
                "minimum": 1,
                "description": "How many hits.",
            },
            "exact": {"type": "boolean", "default": False},
        },
        "required": ["query"],
        "additionalProperties": False,
    }


def test_spec_is_what_the_model_sees() -> None:
    assert search.spec() == ToolSpec(
        name="search", description="Search the library catalogue.", parameters=search.parameters
    )


def test_decorator_with_name_and_description() -> None:
    @tool(name="lookup", description="Look something up.")
    async def anything(key: str) -> str:
        """Ignored docstring."""
        return key.upper()

    assert isinstance(anything, Tool)
    assert (anything.name, anything.description) == ("lookup", "Look something up.")
    assert anything.parameters["required"] == ["key"]


def test_a_function_without_parameters_has_an_empty_object_schema() -> None:
    @tool
    async def ping() -> str:
        return "pong"

    assert ping.parameters["properties"] == {}
    assert ping.description == ""


async def test_invoke_validates_applies_defaults_and_calls() -> None:
    assert await search.invoke({"query": "rivers"}) == {
        "query": "rivers",
        "limit": 5,
        "exact": False,
    }
    # Lax validation: the JSON-ish "3" a model may send becomes the int the hint asks for.
    assert (await search.invoke({"query": "x", "limit": "3"}))["limit"] == 3


@pytest.mark.parametrize(
    ("arguments", "fragment"),
    [
        ({}, "query: Field required"),
        ({"query": "x", "limit": "many"}, "limit: Input should be a valid integer"),
        ({"query": "x", "limit": 0}, "limit: Input should be greater than or equal to 1"),
        ({"query": "x", "colour": "red"}, "colour: Extra inputs are not permitted"),
    ],
)
async def test_invalid_arguments_raise_a_clear_error(
    arguments: dict[str, Any], fragment: str
) -> None:
    with pytest.raises(ToolArgumentsError) as caught:
        await search.invoke(arguments)
    assert "tool 'search'" in str(caught.value)
    assert fragment in str(caught.value)


async def test_arguments_must_be_an_object() -> None:
    with pytest.raises(ToolArgumentsError, match="object of named arguments, got list"):
        await search.invoke(["rivers"])  # type: ignore[arg-type]


async def test_errors_of_the_function_itself_propagate_unchanged() -> None:
    @tool
    async def broken(n: int) -> int:
        raise LookupError(f"nothing at {n}")

    with pytest.raises(LookupError, match="nothing at 4"):
        await broken.invoke({"n": 4})


async def test_parameter_names_may_shadow_pydantic_attributes() -> None:
    @tool
    async def render(json: str, schema: str = "plain") -> str:
        return f"{json}/{schema}"

    assert set(render.parameters["properties"]) == {"json", "schema"}
    assert await render.invoke({"json": "{}"}) == "{}/plain"


def test_functions_a_model_cannot_call_are_rejected() -> None:
    def sync(x: int) -> int:
        return x

    async def variadic(*values: int) -> int:
        return sum(values)

    with pytest.raises(TypeError, match="not an async function"):
        tool(sync)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"\*args and \*\*kwargs"):
        tool(variadic)


# The example calculator: safe arithmetic, never eval.


@pytest.mark.parametrize(
    ("expression", "value"),
    [
        ("1 + 2", 3),
        ("(12 + 30) * 2 ** 3", 336),
        ("-3 // 2", -2),
        ("7 % 3", 1),
        ("10 / 4", 2.5),
        ("2 ** -1", 0.5),
        ("-(4 - 10)", 6),
        ("+5", 5),
        ("1.5 * 4", 6.0),
    ],
)
async def test_calculator_evaluates_arithmetic(expression: str, value: float) -> None:
    calculator = _example_tools().calculator
    assert await calculator.invoke({"expression": expression}) == value


@pytest.mark.parametrize(
    ("expression", "reason"),
    [
        ("__import__('os').system('true')", "unsupported syntax"),
        ("x + 1", "unsupported syntax"),
        ("(1).__class__", "unsupported syntax"),
        ("'a' * 3", "unsupported value"),
        ("True + 1", "unsupported value"),
        ("1 if 1 else 2", "unsupported syntax"),
        ("2 ^ 3", "unsupported syntax"),
        ("1 / 0", "division by zero"),
        ("5 % 0", "division by zero"),
        ("10 ** 10 ** 10", "out of range"),
        ("99 ** 999", "more than 1000 digits"),
        ("10 ** 600 * 10 ** 600", "more than 1000 digits"),
        ("1e400", "too large"),
        ("2.0 ** 999 * 2.0 ** 999", "too large"),
        ("(-8) ** 0.5", "not a real number"),
        ("1 +", "not an arithmetic expression"),
        ("1" * 501, "longer than 500"),
    ],
)
def test_calculator_refuses_anything_but_bounded_arithmetic(expression: str, reason: str) -> None:
    with pytest.raises(ValueError, match=reason):
        _example_tools().evaluate(expression)


async def test_clock_returns_utc_iso_time() -> None:
    from datetime import datetime

    stamp = await _example_tools().clock.invoke({})
    offset = datetime.fromisoformat(stamp).utcoffset()
    assert offset is not None and offset.total_seconds() == 0
