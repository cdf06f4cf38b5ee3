"""A turn's checkpoint: its marker, its resumable dependencies' state, and its restore.

The agent state store holds one checkpoint per conversation. A stateful turn
marks it as its own before its agent runs (``mark``: its input, and what a
replica needs to take it over with no client), saves its resumable
dependencies into it as it goes (``checkpoint``, fenced by the turn's
epoch), and a resumed turn restores from it (``restore``): its input as first
claimed, its dependencies' state, and the text its clients last saw.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
from collections.abc import Callable
from typing import Any

from tether.domain.agent_dependency import ResumableAgentDependency
from tether.domain.chat_agent_state_store import TURN_STATE_KEY, DependencyState
from tether.domain.chat_message import ChatMessage
from tether.domain.chat_request import ChatRequest
from tether.domain.queued_messages import without_queued
from tether.domain.turn_context import TurnContext
from tether.observability.turns import TurnObservation
from tether.runtime.fenced_writer import FencedWriter
from tether.runtime.lease import ConversationKey
from tether.runtime.turn_stores import TurnStores


@functools.cache
def _takes_resuming_turn(dependency_class: type[ResumableAgentDependency]) -> bool:
    """Whether the class's ``load`` accepts ``resuming_turn`` (inspected once per class).

    The seed's SDK defines ``load(self, state)``; tether offers the flag to
    the dependencies that ask for it, by name or by ``**kwargs``."""
    try:
        parameters = inspect.signature(dependency_class.load).parameters.values()
    except (TypeError, ValueError):
        return True  # not introspectable: the interface's own signature
    return any(
        p.kind is inspect.Parameter.VAR_KEYWORD
        or (p.name == "resuming_turn" and p.kind is not inspect.Parameter.POSITIONAL_ONLY)
        for p in parameters
    )


def _load_options(dependency: ResumableAgentDependency, resuming_turn: bool) -> dict[str, bool]:
    """The keyword arguments ``dependency.load`` takes besides the state."""
    return {"resuming_turn": resuming_turn} if _takes_resuming_turn(type(dependency)) else {}


class TurnCheckpoint:
    """The checkpoint of one turn, as its producer keeps it."""

    def __init__(
        self,
        *,
        request: ChatRequest,
        context: TurnContext,
        stores: TurnStores,
        writer: FencedWriter,
        observed: TurnObservation,
        recorded: ChatMessage | None,
    ) -> None:
        """``recorded``: what a resumed turn's clients last saw (its recording)."""
        self._request = request
        self._context = context
        self._message_id = context.message_id
        self._key = ConversationKey(
            context.tenant, context.requester_uuid, context.session_id or ""
        )
        self._stores = stores
        self._writer = writer
        self._observed = observed
        self._recorded = recorded
        self.input: list[ChatMessage] = list(request.conversation)
        """The turn's input: fixed when the turn is claimed (a new turn's
        request, or the input a resumed turn's checkpoint carries), never a
        resume body."""
        self.takeovers = 0
        self.resumables: list[ResumableAgentDependency] = []
        """The agent's dependencies whose state the checkpoint keeps (set once
        the agent is created)."""
        self._marked: DependencyState | None = None
        self._lock = asyncio.Lock()

    async def mark(self) -> None:
        """Mark the checkpoint as this turn's (CLAIMED, before the agent runs),
        with its input and what a takeover needs to rebuild its request: a
        turn whose producer dies at any point after this, even before its
        first checkpoint, can be resumed, by a client or by another replica on
        its own, and answers this turn's question."""
        store = self._stores.agent_state
        if store is None or not self._context.stateful or self._context.resuming:
            return
        k = self._key
        state = await store.load(k.tenant, k.requester_uuid, k.session_id)
        marked = {**state, TURN_STATE_KEY: self.marker(progress=False)}
        await self._writer.checkpoint(marked)
        self._marked = marked  # what the agent's dependencies load: no second read

    async def restore(self) -> list[ChatMessage]:
        """Fix the turn's input, load checkpoints into resumable dependencies,
        and return what the agent reads."""
        store = self._stores.agent_state
        assert store is not None  # the handler refuses stateful turns without one
        k = self._key
        state = self._marked
        if state is None:
            state = await store.load(k.tenant, k.requester_uuid, k.session_id)
        marker = state.get(TURN_STATE_KEY, {})
        own_marker = marker.get("message_id") == self._message_id
        if self._context.resuming:
            # The input is the one fixed when the turn was first claimed, carried
            # by its checkpoint: a resume's body (often ``[]``) is not a question.
            if own_marker and "conversation" in marker:
                self.input = [ChatMessage.model_validate(m) for m in marker["conversation"]]
            resuming_turn = own_marker and bool(marker.get("progress"))
            if own_marker:
                self._observed.link_to(marker.get("trace"))
            # Count this takeover before the agent runs: a turn whose agent
            # kills every replica that takes it over is stopped after
            # ``TETHER_TAKEOVER_LIMIT`` of them (see ``handlers.takeover``).
            self.takeovers = int(marker.get("takeovers", 0)) + 1 if own_marker else 1
            await self._writer.checkpoint(
                {**state, TURN_STATE_KEY: self.marker(progress=resuming_turn)}
            )
        else:
            resuming_turn = False  # marked as this turn's by ``mark`` already
        for dep in self.resumables:
            await dep.load(state.get(dep.state_key, {}), **_load_options(dep, resuming_turn))
            if self._recorded is not None:
                # What its clients saw is often newer than the checkpoint: go on
                # from there where the dependency can (no text said twice).
                await dep.catch_up(self._recorded)
            dep.bind_checkpoint_hook(self.checkpoint)
        if any(dep.restores_conversation for dep in self.resumables):
            return self.input
        if self._stores.conversation is not None:
            return without_queued(
                await self._stores.conversation.get_transcript(
                    k.tenant, k.requester_uuid, k.session_id
                )
            )
        return self.input

    def marker(self, *, progress: bool) -> dict[str, Any]:
        """The checkpoint's record of the turn itself: its input, whether the
        agent made progress, how often it was taken over, and what a replica
        needs to take it over with no client (``handlers.takeover``)."""
        request = self._request
        marker: dict[str, Any] = {
            "message_id": self._message_id,
            "epoch": self._writer.epoch,
            "progress": progress,
            "conversation": [m.model_dump(mode="json") for m in self.input],
            "takeovers": self.takeovers,
            "request": {
                "agent_identifier": request.agent_identifier,
                "bot_params": request.bot_params,
                "user_roles": request.request_headers.user_roles,
                "user_tenants": request.request_headers.user_tenants,
            },
        }
        trace = self._observed.trace_carrier()
        if trace:
            # Its span's context: a later producer's span links to this one.
            marker["trace"] = trace
        return marker

    async def checkpoint(self) -> None:
        """Save every resumable dependency now (fenced by the turn's epoch)."""
        if not self._context.stateful or not self.resumables:
            return
        async with self._lock:
            state: DependencyState = {dep.state_key: await dep.dump() for dep in self.resumables}
            state[TURN_STATE_KEY] = self.marker(progress=True)
            await self._writer.checkpoint(state)

    async def keep(self, interval: float, *, running: Callable[[], bool]) -> None:
        """Checkpoint every ``interval`` seconds while ``running()`` (a stateful
        turn's worker); raises what the writes raise."""
        while True:
            await asyncio.sleep(interval)
            if not running():
                return
            await self.checkpoint()
