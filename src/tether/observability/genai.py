"""Model and tool calls as children of their turn's span, in the OpenTelemetry
GenAI semantic conventions (``gen_ai.operation.name`` ``chat`` and
``execute_tool``), and the model's token counts as metrics.

Called by the model/tool loop (``ChatClient``) around each call; a model
that knows its usage says so with ``report_usage`` while its call runs. Outside
a turn (a client used on its own) or without tracing, these cost a
contextvar read.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass

from tether.observability.traces import Span
from tether.observability.turns import current_turn

__all__ = ["ModelCall", "model_call", "report_usage", "tool_call"]


@dataclass
class ModelCall:
    """What a model call reported about itself."""

    input_tokens: int | None = None
    output_tokens: int | None = None
    response_model: str | None = None


_call: ContextVar[ModelCall | None] = ContextVar("tether_model_call", default=None)


def report_usage(
    *,
    input_tokens: int | None = None,
    output_tokens: int | None = None,
    response_model: str | None = None,
) -> None:
    """A model's word on the call it is serving (tokens, the model that answered)."""
    call = _call.get()
    if call is None:
        return
    if input_tokens is not None:
        call.input_tokens = input_tokens
    if output_tokens is not None:
        call.output_tokens = output_tokens
    if response_model is not None:
        call.response_model = response_model


@contextmanager
def model_call(model: str | None, provider: str | None = None) -> Iterator[None]:
    """One model call (a ``chat`` span) of the current turn."""
    turn = current_turn()
    call = ModelCall()
    # Restored by value, not by token: this runs inside the model loop's
    # async generator, which may be finalized in another context (a closed
    # stream), where resetting a token raises.
    previous = _call.get()
    _call.set(call)
    span: Span | None = None
    if turn is not None:
        attributes: dict[str, str] = {"gen_ai.operation.name": "chat"}
        if model:
            attributes["gen_ai.request.model"] = model
        if provider:
            attributes["gen_ai.provider.name"] = provider
        span = turn.child(f"chat {model}" if model else "chat", attributes)
    try:
        yield
    except BaseException as error:
        if span is not None:
            span.fail(type(error).__qualname__)
        raise
    finally:
        _call.set(previous)
        if turn is not None:
            turn.tokens_used(call.input_tokens, call.output_tokens)
        if span is not None:
            span.set_attributes(_usage_attributes(call))
            span.end()


def _usage_attributes(call: ModelCall) -> dict[str, str | int]:
    attributes: dict[str, str | int] = {}
    if call.input_tokens is not None:
        attributes["gen_ai.usage.input_tokens"] = call.input_tokens
    if call.output_tokens is not None:
        attributes["gen_ai.usage.output_tokens"] = call.output_tokens
    if call.response_model is not None:
        attributes["gen_ai.response.model"] = call.response_model
    return attributes


@contextmanager
def tool_call(name: str, call_id: str) -> Iterator[Span | None]:
    """One tool call (an ``execute_tool`` span) of the current turn; the span
    (None when not traced) takes the call's outcome."""
    turn = current_turn()
    if turn is None:
        yield None
        return
    span = turn.child(
        f"execute_tool {name}",
        {
            "gen_ai.operation.name": "execute_tool",
            "gen_ai.tool.name": name,
            "gen_ai.tool.call.id": call_id,
        },
    )
    try:
        yield span
    except BaseException as error:
        span.fail(type(error).__qualname__)
        raise
    finally:
        span.end()
