"""Taking a conversation for a turn: a new one, a resume, an interrupt.

Every turn of a stateful conversation starts by claiming its supervision row
at the next epoch (``conversation_row``: ``CLAIM``, or ``TAKE_OVER`` for a
resume), with every other store fenced at that epoch first. Here is what a
start decides around that claim: a resume takes over only a dead turn; a
new message over a dead turn ends it first with what it recorded (the
seed's strategy); ``interrupt`` and ``rollback`` cancel whatever occupies the
conversation, and a rollback removes the interrupted turn's question and
answer; a resumed stream starts past every index an earlier producer used.
"""

from __future__ import annotations

import functools

from tether.domain.capabilities import Capability, supports
from tether.domain.chat_agent_state_store import TURN_STATE_KEY
from tether.domain.chat_conversation_store import normalize_owner
from tether.domain.chat_message import ChatMessage
from tether.domain.chat_request import MultitaskStrategy
from tether.domain.chat_stream_supervision_store import ChatStreamStatus, ChatStreamSupervision
from tether.domain.queued_messages import queued_id
from tether.domain.turn_context import TurnContext
from tether.handlers.endings import PRODUCER_LOST
from tether.handlers.errors import (
    ConversationBusyError,
    NotImplementedByStoreError,
    TurnEndedError,
    TurnNotFoundError,
)
from tether.handlers.replica import Replica
from tether.runtime import conversation_row as rows
from tether.runtime.conversation_row import RowState
from tether.runtime.fenced_writer import raise_fences
from tether.runtime.lease import BeforeGrant, ClaimRefusedError, ConversationKey, Lease, claim

_DISPLACE_TRIES = 3
"""Claims an ``interrupt`` or ``rollback`` turn tries, cancelling the occupant
before each: more than one only when other turns keep taking the conversation."""


class ConversationClaims:
    """The claims of the turns one replica starts."""

    def __init__(self, replica: Replica) -> None:
        self._replica = replica

    async def claim(
        self,
        context: TurnContext,
        *,
        automatic: bool,
        end_dead: bool = False,
        before_grant: BeforeGrant | None = None,
    ) -> Lease | None:
        """The lease of a new turn, or of a resume (``context.resuming``); 409
        naming the occupant when the conversation is not free. A turn whose
        producer died occupies it until it is resumed or ended: with
        ``end_dead`` (the seed's strategy) it is ended first, with what it
        had recorded and a verdict, and the claim made again."""
        store = self._replica.stores.supervision
        if store is None:
            return None
        key = _key(context.tenant, context.requester_uuid, context.session_id or "")
        takeover = context.message_id if context.resuming else None
        if takeover is not None:
            await self._check_resumable(key, takeover)
        if takeover is not None and automatic and before_grant is None:
            before_grant = functools.partial(self._under_the_takeover_limit, key, takeover)
        try:
            return await self.grant_epoch(
                key,
                context.message_id,
                takeover_of=takeover,
                automatic=automatic,
                before_grant=before_grant,
            )
        except ClaimRefusedError as refused:
            # Never for a resume: the occupant may be its own turn, resumed
            # elsewhere a moment ago.
            ending = end_dead and takeover is None
            if not (ending and await self._end_displaced(key, refused.occupant)):
                raise _refusal(key, refused) from refused
        try:
            return await self.grant_epoch(
                key, context.message_id, takeover_of=None, before_grant=before_grant
            )
        except ClaimRefusedError as refused:
            raise _refusal(key, refused) from refused

    async def _end_displaced(
        self, key: ConversationKey, occupant: ChatStreamSupervision | None
    ) -> bool:
        """End the dead turn a new message is about to displace (or one whose
        cancel or reaping died half way), so its answer and verdict stay in
        the transcript; whether the claim may be tried again. Not a queued
        turn the row was passed on to: it runs first."""
        if occupant is None:
            return False
        replica = self._replica
        now = replica.clock()
        state = rows.state_of(occupant, now, replica.dead_after, replica.presence.gone)
        stuck = state is RowState.ENDING and rows.is_stuck(occupant, now, replica.dead_after)
        if not (state is RowState.DEAD or stuck):
            return False
        if await replica.queue.is_waiting(key, occupant.message_id):
            return False
        await replica.endings.end_dead_turn(
            key,
            occupant.message_id,
            PRODUCER_LOST,
            "the turn's producer died and a new message took the conversation",
        )
        return True  # ended, by us or by another hand meanwhile: claim again

    async def displace(
        self, context: TurnContext, strategy: MultitaskStrategy
    ) -> tuple[Lease | None, str | None]:
        """Claim the conversation for a new turn, cancelling whatever turn
        occupies it (``interrupt``, ``rollback``): the cancel of any replica,
        so the occupant's partial answer is kept and its producer, wherever it
        runs, is fenced. Returns the lease and the interrupted turn's id."""
        if strategy == "rollback" and not self._can_roll_back():
            raise NotImplementedByStoreError(
                "rollback needs a conversation store that can remove messages "
                "(remove_fenced); this server's cannot: use interrupt"
            )
        interrupted: str | None = None
        for _ in range(_DISPLACE_TRIES):
            try:
                return await self.claim(context, automatic=False), interrupted
            except ConversationBusyError as busy:
                occupant = busy.message_id
            try:
                await self._replica.cancel(
                    context.tenant, context.requester_uuid, context.session_id, occupant, kick=False
                )
                interrupted = occupant
            except (TurnEndedError, TurnNotFoundError, ConversationBusyError):
                pass  # it ended, or changed hands, meanwhile: claim again
        raise ConversationBusyError(
            "the conversation stayed busy: other turns kept taking it; try again",
            message_id=occupant,
            session_id=context.session_id,
        )

    def _can_roll_back(self) -> bool:
        store = self._replica.stores.conversation
        return store is None or supports(store, Capability.CONVERSATION_REMOVE_FENCED)

    async def roll_back(self, context: TurnContext, interrupted: str, epoch: int) -> None:
        """Remove the interrupted turn's user message and partial answer from the
        transcript, fenced at the new turn's epoch (before its own user message)."""
        store = self._replica.stores.conversation
        if store is None:
            return  # no transcript here: the client's is the only one
        # And its queued copy, should a start fenced half way have left one:
        # alone, it would read as waiting again and the turn would run.
        ids = [interrupted, f"{interrupted}-user", queued_id(interrupted)]
        key = _key(context.tenant, context.requester_uuid, context.session_id or "")
        if not await store.remove_fenced(
            key.tenant, key.requester_uuid, key.session_id, ids, epoch=epoch
        ):
            raise ConversationBusyError(
                "the conversation changed hands during the rollback; try again",
                message_id=context.message_id,
                session_id=key.session_id,
            )

    async def grant_epoch(
        self,
        key: ConversationKey,
        message_id: str,
        *,
        takeover_of: str | None,
        automatic: bool = False,
        before_grant: BeforeGrant | None = None,
    ) -> Lease:
        """Claim the conversation's next epoch for ``message_id``, every other
        store fenced at it first (``ClaimRefusedError`` when it is not free)."""
        assert self._replica.stores.supervision is not None
        return await claim(
            self._replica.stores.supervision,
            key,
            message_id,
            self._replica.clock,
            self._replica.dead_after,
            raise_fences=functools.partial(raise_fences, self._replica.stores, key),
            takeover_of=takeover_of,
            automatic=automatic,
            producer=lambda: self._replica.presence.producer,
            gone=self._replica.presence.gone,
            before_grant=before_grant,
        )

    async def _under_the_takeover_limit(self, key: ConversationKey, message_id: str) -> None:
        """Refuse an automatic takeover of a turn already taken over
        ``TETHER_TAKEOVER_LIMIT`` times, as the checkpoint says once the claim
        has fenced it: the scan read the count before it claimed, and a taker
        of another replica may have counted one more and died meanwhile. The
        next scan then ends the turn (``TAKEOVER_LIMIT``)."""
        store = self._replica.stores.agent_state
        if store is None:
            return
        state = await store.load(key.tenant, key.requester_uuid, key.session_id)
        marker = state.get(TURN_STATE_KEY, {})
        limit = self._replica.settings.takeover_limit
        if marker.get("message_id") == message_id and int(marker.get("takeovers", 0)) >= limit:
            raise TurnEndedError(f"turn {message_id} was taken over {limit} times already")

    async def _check_resumable(self, key: ConversationKey, message_id: str) -> None:
        """Resume takes over only a dead turn: live is 409, finished or replaced is 410."""
        assert self._replica.stores.supervision is not None
        row = await self._replica.stores.supervision.read(
            key.tenant, key.requester_uuid, key.session_id
        )
        if row is None or row.message_id != message_id:
            raise TurnEndedError(f"turn {message_id} is finished or was replaced by a newer turn")
        if row.status is not ChatStreamStatus.RUNNING:
            raise TurnEndedError(f"turn {message_id} is {row.status.value}; nothing to resume")
        if row.is_live(
            self._replica.clock(), self._replica.dead_after, self._replica.presence.gone
        ):
            raise ConversationBusyError(
                f"turn {message_id} is still running; attach to it instead",
                message_id=message_id,
                session_id=key.session_id,
            )

    async def recorded(
        self, context: TurnContext, lease: Lease | None
    ) -> tuple[int, ChatMessage | None]:
        """Where a resumed turn's stream starts, and what its clients last saw.

        Each producer of a turn streams at most ``max_turn_events`` messages, so
        a resumed producer at epoch ``e`` starts at ``e * max_turn_events``:
        past anything any earlier producer can have streamed (their epochs are
        lower), and apart from any other resumer (each epoch has one claimant),
        so ids never repeat with different content, and an old ``start_index``
        or ``Last-Event-ID`` still works. The recorded message, read after the
        claim fenced the recording, is returned so the resumed stream starts
        from it rather than from the (older) checkpoint."""
        epoch = lease.epoch if lease is not None else 1
        first_index = epoch * self._replica.settings.max_turn_events
        store = self._replica.stores.recording
        if store is None:
            return first_index, None
        record = await store.read(context.tenant, context.requester_uuid, context.session_id or "")
        if record is None or record.message_id != context.message_id:
            return first_index, None
        return max(first_index, record.index + 1), record.message


def _key(tenant: str, requester_uuid: str | None, session_id: str) -> ConversationKey:
    return ConversationKey(tenant, normalize_owner(requester_uuid), session_id)


def _refusal(key: ConversationKey, refused: ClaimRefusedError) -> Exception:
    """What a refused claim answers: 409 naming the occupant, or 410 when a
    resume finds its turn gone."""
    occupant = refused.occupant
    if occupant is None:
        return TurnEndedError("the turn to resume no longer exists")
    return ConversationBusyError(
        f"the conversation is busy with turn {occupant.message_id}",
        message_id=occupant.message_id,
        session_id=key.session_id,
    )
