"""Tool calls of a PydanticAI run that never run twice unless the tool says they may.

``DurableTools`` is a PydanticAI capability wrapping every tool execution of
the run (the agent's own tools, toolsets and MCP servers alike). It keeps the
turn's tool ledger (``PydanticAIRun.tools``) the way tether's own model/tool
loop does: a call is checkpointed as started before it runs (a fenced write,
so a producer that lost its turn never runs it) and as settled, with its
outcome, before the run sees the result. A resumed run asks again for the
calls of its last response; a settled one gets its recorded outcome without
running, and one that started and never settled follows its tool's
``on_unknown``.

The calls of one response may run side by side (PydanticAI's default), where
tether's own loop runs them one at a time. So whether a resumed response asks
the user is decided from the ledger before any of its calls runs: while it
asks, no other call of it starts (one that had started shows its outcome as
unknown, one that had not as not run), as when tether's loop stops at the
call that asks.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic_ai.capabilities import AbstractCapability
from pydantic_ai.exceptions import ModelRetry, ToolFailed, ToolFailedError, ToolRetryError
from pydantic_ai.messages import ToolCallPart
from pydantic_ai.tools import RunContext, ToolDefinition
from pydantic_core import to_jsonable_python

from tether.integrations.pydantic_ai.run_state import PydanticAIRun, ToolCallRecord
from tether.tools import ON_UNKNOWN, OnUnknown, ToolCallContext, running_tool_call

ON_UNKNOWN_KEY = "on_unknown"
"""The tool metadata key that declares a tool's policy, for example
``@agent.tool_plain(metadata={"on_unknown": "fail"})``."""

DEFAULT_ON_UNKNOWN: OnUnknown = "retry"

NOT_RUN_WHILE_ASKING = "Not run: the answer stopped to ask the user about an earlier call."


class AskTheUser(Exception):
    """A call of unknown outcome whose tool says ``ask``: the turn ends asking."""

    def __init__(self, tool_name: str) -> None:
        super().__init__(tool_name)
        self.tool_name = tool_name


def on_unknown(tool_def: ToolDefinition) -> OnUnknown:
    """The tool's policy for a call of unknown outcome (``retry`` unless declared)."""
    declared = (tool_def.metadata or {}).get(ON_UNKNOWN_KEY, DEFAULT_ON_UNKNOWN)
    if declared not in ON_UNKNOWN:
        raise ValueError(
            f"tool {tool_def.name!r}: metadata {ON_UNKNOWN_KEY!r} must be one of "
            f"{ON_UNKNOWN}, not {declared!r}"
        )
    policy: OnUnknown = declared
    return policy


def unknown_outcome(name: str) -> str:
    return (
        f"The call to {name} may or may not have happened: the server running it stopped "
        "before it could record the result. Do not assume it succeeded or failed, and do "
        "not call it again without asking the user."
    )


@dataclass(init=False)
class DurableTools(AbstractCapability[Any]):
    """Checkpoints every tool call of the run in ``run``'s ledger (see the module)."""

    def __init__(self, run: PydanticAIRun, key_prefix: str) -> None:
        self.run = run
        self.key_prefix = key_prefix
        self.asking = _asking(run)
        """The id of the call whose cut-off makes this run ask the user, if
        any: decided from the ledger as loaded, before any call runs."""

    async def wrap_tool_execute(
        self,
        ctx: RunContext[Any],
        *,
        call: ToolCallPart,
        tool_def: ToolDefinition,
        args: Any,
        handler: Any,
    ) -> Any:
        ledger = self.run.tools
        record = ledger.setdefault(call.tool_call_id, ToolCallRecord(name=call.tool_name))
        if record.outcome is not None:
            return _replay(record)
        policy = on_unknown(tool_def)
        asking = self.asking
        if record.started and (policy != "retry" or asking is not None):
            # Cut off, and not run again (not even a retry while the run asks).
            record.outcome, record.value = "failed", unknown_outcome(call.tool_name)
            await self.run.request_checkpoint()
            if policy == "ask" or call.tool_call_id == asking:
                raise AskTheUser(call.tool_name)
            raise ToolFailed(record.value)
        if asking is not None:
            record.outcome, record.value = "failed", NOT_RUN_WHILE_ASKING
            await self.run.request_checkpoint()
            raise ToolFailed(record.value)
        # Durable before the call runs: a resume knows it may have happened.
        record.started += 1
        record.on_unknown = policy
        await self.run.request_checkpoint()
        index = self.run.call_index(call.tool_call_id)
        context = ToolCallContext(
            idempotency_key=f"{self.key_prefix}:{index}",
            call_index=index,
            attempt=record.started,
            tool_call_id=call.tool_call_id,
        )
        try:
            with running_tool_call(context):
                result = await handler(args)
        except ToolRetryError as error:
            await self._settle(record, "retry", _retry_message(error))
            raise
        except ToolFailedError as error:
            failed = error.tool_failed.model_response_str(wrap_if_error=False)
            await self._settle(record, "failed", failed)
            raise
        # Checkpointed before the run sees it: a resume never runs the call again.
        await self._settle(record, "returned", to_jsonable_python(result, fallback=str))
        return result

    async def _settle(self, record: ToolCallRecord, outcome: Any, value: Any) -> None:
        record.outcome, record.value = outcome, value
        await self.run.request_checkpoint()


def _asking(run: PydanticAIRun) -> str | None:
    """A call the run was cut off in (started, never settled) whose tool says ``ask``."""
    return next(
        (
            call_id
            for call_id, record in run.tools.items()
            if record.started and record.outcome is None and record.on_unknown == "ask"
        ),
        None,
    )


def _replay(record: ToolCallRecord) -> Any:
    """What a settled call gives a resumed run, without running it again."""
    if record.outcome == "retry":
        raise ModelRetry(str(record.value))
    if record.outcome == "failed":
        raise ToolFailed(str(record.value))
    return record.value


def _retry_message(error: ToolRetryError) -> str:
    content = getattr(error.tool_retry, "content", "")
    return content if isinstance(content, str) else str(content)
