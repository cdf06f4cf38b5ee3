"""Tools of the example agents: a safe calculator and a clock."""

from __future__ import annotations

import ast
import math
import operator
import os
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from tether.tools import tool

_MAX_EXPRESSION_LENGTH = 500
_MAX_EXPONENT = 1000
# Bounds the size of any intermediate result, so no expression can eat the CPU or
# memory of the server (10 ** 10 ** 10 is short to type).
_MAX_DIGITS = 1000

Number = int | float

_BINARY: dict[type[ast.operator], Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_UNARY: dict[type[ast.unaryop], Callable[[Any], Any]] = {
    ast.USub: operator.neg,
    ast.UAdd: operator.pos,
}


@tool(read_only=True)  # run again when a resume cannot tell if it ran
async def calculator(expression: str) -> Number:
    """Evaluate an arithmetic expression: numbers, + - * / // % ** and parentheses.

    Example: "(12 + 30) * 2 ** 3".
    """
    _count_execution(expression)
    return evaluate(expression)


@tool(read_only=True)  # run again when a resume cannot tell if it ran
async def clock() -> str:
    """The current date and time in UTC, as an ISO 8601 string."""
    return datetime.now(UTC).isoformat(timespec="seconds")


def _count_execution(expression: str) -> None:
    # With TETHER_TOOL_LOG set, every execution appends one line, so `tether
    # crash-test` can prove from outside the servers that a completed call never
    # ran twice across kills and resumes. Off by default; a one-line append.
    log = os.environ.get("TETHER_TOOL_LOG")
    if log:
        with open(log, "a", encoding="utf-8") as handle:
            handle.write(f"{os.getpid()} {' '.join(expression.split())}\n")


def evaluate(expression: str) -> Number:
    """Evaluate ``expression`` by walking its syntax tree; never ``eval``.

    Raises ``ValueError`` with a readable reason for anything that is not plain
    arithmetic or whose result would be unreasonably large.
    """
    if len(expression) > _MAX_EXPRESSION_LENGTH:
        raise ValueError(f"expression is longer than {_MAX_EXPRESSION_LENGTH} characters")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError as error:
        raise ValueError(f"not an arithmetic expression: {expression!r}") from error
    return _checked(_evaluate(tree.body))


def _evaluate(node: ast.expr) -> Number:
    if isinstance(node, ast.Constant):
        # bool is an int subclass; True + 1 is not arithmetic anyone meant.
        if isinstance(node.value, int | float) and not isinstance(node.value, bool):
            return _checked(node.value)
        raise ValueError(f"unsupported value {node.value!r}")
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _checked(_UNARY[type(node.op)](_evaluate(node.operand)))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _evaluate(node.left), _evaluate(node.right)
        if isinstance(node.op, ast.Pow):
            _check_power(left, right)
        try:
            result = _BINARY[type(node.op)](left, right)
        except ZeroDivisionError as error:
            raise ValueError("division by zero") from error
        except OverflowError as error:
            raise ValueError("result is too large") from error
        return _checked(result)
    raise ValueError(f"unsupported syntax: {ast.unparse(node)!r}")


def _check_power(base: Number, exponent: Number) -> None:
    if abs(exponent) > _MAX_EXPONENT:
        raise ValueError(f"exponent {exponent} is out of range (at most {_MAX_EXPONENT})")
    if abs(base) > 1 and exponent > 0 and exponent * math.log10(abs(base)) > _MAX_DIGITS:
        raise ValueError(f"result would have more than {_MAX_DIGITS} digits")


def _checked(value: Any) -> Number:
    if isinstance(value, complex):
        raise ValueError("result is not a real number")
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError("result is too large")
    if isinstance(value, int) and value != 0 and math.log10(abs(value)) > _MAX_DIGITS:
        raise ValueError(f"result has more than {_MAX_DIGITS} digits")
    return value
