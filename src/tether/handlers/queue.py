"""A conversation's queue: messages sent while another turn runs (``enqueue``).

Where the queue lives: in the transcript. An enqueued user message is
appended at once with a ``queued`` mark (``QueuedTurn``: the id of the turn
it will start, its agent, its bot params, the requester's roles), under the
id ``<turn>-queued``; the marked messages, in transcript order, are the
queue. So it is as durable as the conversation, on every conversation store
that can remove a message (``remove_fenced``: memory, file, SQLite,
PostgreSQL), and any replica reads it.

How a queued turn starts: ``kick`` takes the head of the queue when the
conversation is idle (no RUNNING supervision row) and starts its turn through
``ChatHandler.start_turn(dequeue=...)``: the claim is the usual
compare-and-swap, so of several replicas kicking at once exactly one starts
it. After the claim the turn checks that its message is still waiting (not
cancelled, not started by someone else), appends it as its own user message
(``<turn>-user``, at the end of the transcript, where the model reads it
after the answers before it) and only then removes the queued copy, both
fenced at its epoch: a crash between the two leaves the message twice, never
lost.

Who starts the next turn: the turn before it, in its last write. A turn
whose producer ends it (done or errored) with turns waiting writes no
verdict: it hands the conversation to the head of the queue
(``Lease.pass_on``: the head's RUNNING row, dead at once), and its replica
then starts that turn. One write, so a replica killed right after it leaves
a row any replica's takeover starts (``start_handed_off``), and readers
elsewhere of the turn that ended hear ``gone`` (its answer is in the
transcript). Other ends (a cancel, the reaper, a turn whose queue was empty
when it ended) kick: the end of every turn starts the head if the
conversation is idle, so a queue drains one turn at a time, in arrival
order, on whichever replica ended the turn before. A replica that is
draining hands the head off instead, which the automatic takeover of another
replica starts. A status read or an attach to a queued turn kicks an idle
conversation (or one whose row is a hand-off nobody took) too, so a queue
whose kicker died between a verdict and the next claim is started by the
next client that looks.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from tether.domain.capabilities import Capability, supports
from tether.domain.chat_conversation_store import ChatConversationStore
from tether.domain.chat_message import QueuedTurn
from tether.domain.chat_request import ChatRequest, RequestHeaders
from tether.domain.chat_stream_supervision_store import ChatStreamStatus, ChatStreamSupervision
from tether.domain.queued_messages import Waiting, queued_id, waiting_in
from tether.handlers.errors import (
    BotParamsError,
    ConversationBusyError,
    DrainingError,
    NotImplementedByStoreError,
    QueueFullError,
    TurnEndedError,
    TurnRequestError,
    UnknownAgentError,
)
from tether.handlers.replica import AttachLater, Replica
from tether.runtime import conversation_row as rows
from tether.runtime.lease import ClaimRefusedError, ConversationKey, FencedError
from tether.runtime.live_buffer import EndReason, StreamEnd, StreamEvent

if TYPE_CHECKING:
    from tether.handlers.turn import Turn

logger = logging.getLogger(__name__)

_KICK_TRIES = 5
"""Queued turns one kick skips (cancelled or started meanwhile) before it
leaves the rest to the next kick."""
_RECHECK_POLLS = 5
"""An attach waiting for its queued turn reads the transcript at least every
this many polls of the supervision row (and whenever the row changes)."""


@dataclass(frozen=True)
class Ticket:
    """What ``enqueue`` answers when the turn waits: its id and its place (1: next)."""

    message_id: str
    position: int


class AlreadyDequeuedError(Exception):
    """The queued turn a claim was for is no longer waiting (cancelled, or
    started by another replica): the claim is given back."""


class TurnQueue:
    """The queue of each conversation, kept in its transcript (see the module)."""

    def __init__(self, handler: Replica) -> None:
        self._handler = handler

    @property
    def supported(self) -> bool:
        """Whether this server can keep queues: a supervision store to tell an
        idle conversation, and a conversation store that can remove a message."""
        stores = self._handler.stores
        conversations = stores.conversation
        return (
            stores.supervision is not None
            and conversations is not None
            and supports(conversations, Capability.CONVERSATION_REMOVE_FENCED)
        )

    def _conversations(self) -> ChatConversationStore:
        store = self._handler.stores.conversation
        assert store is not None
        return store

    async def waiting(self, key: ConversationKey) -> list[Waiting]:
        if not self.supported:
            return []
        transcript = await self._conversations().get_transcript(
            key.tenant, key.requester_uuid, key.session_id
        )
        return waiting_in(transcript)

    async def is_waiting(self, key: ConversationKey, message_id: str) -> bool:
        return any(w.message_id == message_id for w in await self.waiting(key))

    async def has_copy(self, key: ConversationKey, message_id: str) -> bool:
        """Whether turn ``message_id``'s queued copy is still in the transcript:
        waiting, or left by a start that was fenced after recording its
        question and before taking the copy out (which reads as waiting
        again once a rollback removes that question)."""
        if not self.supported:
            return False
        transcript = await self._conversations().get_transcript(
            key.tenant, key.requester_uuid, key.session_id
        )
        return any(m.message_id == queued_id(message_id) for m in transcript)

    # ------------------------------------------------------------ enqueue

    async def submit(self, request: ChatRequest) -> Turn | Ticket:
        """``multitask_strategy="enqueue"``: start the turn now if the
        conversation is idle and nothing waits, else queue it behind the rest."""
        handler = self._handler
        if not request.stateful or not request.session_id:
            raise TurnRequestError("enqueue needs a stateful turn with a session_id")
        if not self.supported:
            raise NotImplementedByStoreError(
                "enqueue needs a supervision store and a conversation store that can "
                "remove messages (remove_fenced); this server's cannot: use reject or interrupt"
            )
        await handler.check_request(request)
        key = handler.conversation_key(request)
        await handler.check_writer(key)
        waiting = await self.waiting(key)
        if not waiting:
            with contextlib.suppress(ConversationBusyError):
                return await handler.start_turn(request)
        limit = handler.settings.max_queued_turns
        if 0 < limit <= len(waiting):
            raise self._full(limit)
        ticket = await self._append(key, request)
        if 0 < limit < ticket.position:
            # Enqueued together with others past the last place (each read
            # the queue before any appended): the ones placed beyond it leave.
            await handler.cancel(
                key.tenant, key.requester_uuid, key.session_id, ticket.message_id, kick=False
            )
            raise self._full(limit)
        await self.kick(key)  # the turn before may have ended meanwhile
        return ticket

    def _full(self, limit: int) -> QueueFullError:
        return QueueFullError(
            f"{limit} messages already wait in this conversation, the most allowed; "
            "wait for the turns ahead to run, or cancel one",
            retry_after=self._handler.settings.limit_retry_after,
        )

    async def _append(self, key: ConversationKey, request: ChatRequest) -> Ticket:
        message_id = uuid.uuid4().hex
        headers = request.request_headers
        mark = QueuedTurn(
            message_id=message_id,
            agent_identifier=request.agent_identifier,
            enqueued_at=self._handler.clock(),
            bot_params=request.bot_params,
            user_roles=headers.user_roles,
            user_tenants=headers.user_tenants,
        )
        message = request.conversation[-1].model_copy(
            update={
                "message_id": queued_id(message_id),
                "session_id": key.session_id,
                "queued": mark,
            }
        )
        await self._conversations().append_messages(
            key.tenant,
            key.requester_uuid,
            key.session_id,
            request.agent_identifier,
            [message],
            user_roles=headers.user_roles,
            user_tenants=headers.user_tenants,
            # The turn before may not have recorded its own message yet (it
            # was claimed a moment ago): the queued one may be the first.
            create_if_absent=True,
        )
        ids = [w.message_id for w in await self.waiting(key)]
        if message_id not in ids:
            # Started and ended already? Not in the time of this call: the
            # store did not keep it, and the client must not be told it waits.
            raise RuntimeError(f"queued message {message_id} was not kept by the store")
        return Ticket(message_id, ids.index(message_id) + 1)

    # ------------------------------------------------------------ starting

    async def kick(self, key: ConversationKey) -> str | None:
        """Start the head of the queue if the conversation is idle; the id of
        the turn this replica started, if any."""
        if not self.supported:
            return None
        handler = self._handler
        supervision = handler.stores.supervision
        assert supervision is not None
        for _ in range(_KICK_TRIES):
            row = await supervision.read(key.tenant, key.requester_uuid, key.session_id)
            # A dead erase's tombstone holds nothing: the conversation is idle.
            running = (
                row is not None
                and row.status is ChatStreamStatus.RUNNING
                and not (row.message_id == rows.ERASING_ID and handler.reads_dead(row))
            )
            if row is not None and running and not handler.reads_dead(row):
                return None  # running: its end kicks
            waiting = await self.waiting(key)
            if not waiting:
                return None
            head = waiting[0]
            if row is not None and running:
                # Dead: its takeover (or the reaper) ends it and kicks, unless
                # the row is the head's own hand-off (``Lease.pass_on``, a
                # drain), left by a replica that died before starting it.
                if row.message_id != head.message_id:
                    return None
                started = await self.start_handed_off(key, head.message_id)
                return head.message_id if started else None
            try:
                turn = await handler.start_turn(self.request_of(key, head), dequeue=head.message_id)
            except (ConversationBusyError, ClaimRefusedError, TurnEndedError, FencedError):
                # Another replica (or a new turn) was first, the row changed
                # under the claim (a clean-up), or a newer hand (a cancel, a
                # rollback) took it after the claim: the next round reads it
                # again.
                continue
            except AlreadyDequeuedError:
                continue
            except DrainingError:
                if await self._hand_off(key, head):
                    return None
                continue
            except (UnknownAgentError, BotParamsError, TurnRequestError) as error:
                # It can never run: take it out of the queue (logged) rather
                # than block the turns behind it.
                logger.warning("queued turn %s cannot start: %s", head.message_id, error)
                if row is not None:
                    await self.take_out(key, head.message_id, row.epoch)  # refused: read again
                else:
                    await self._take_out_of_idle(key, head.message_id)
                continue
            return turn.message_id
        return None

    async def start_handed_off(self, key: ConversationKey, message_id: str) -> bool:
        """Start queued turn ``message_id`` whose row reads dead with no
        checkpoint of it (the turn before handed it the conversation, its
        starter was draining, or died before the turn marked its checkpoint);
        whether this replica started it. Called by the automatic takeover, a
        kick, and the replica whose turn handed it the conversation. One that
        can never run leaves the queue (logged), as in ``kick``."""
        waiting = await self.waiting(key)
        entry = next((w for w in waiting if w.message_id == message_id), None)
        if entry is None:
            return False
        try:
            await self._handler.start_turn(self.request_of(key, entry), dequeue=message_id)
        except (
            ConversationBusyError,
            ClaimRefusedError,
            AlreadyDequeuedError,
            DrainingError,
            TurnEndedError,
            FencedError,  # a newer hand (a cancel, a rollback) took it after the claim
        ):
            return False
        except (UnknownAgentError, BotParamsError, TurnRequestError) as error:
            logger.warning("queued turn %s cannot start: %s", message_id, error)
            supervision = self._handler.stores.supervision
            assert supervision is not None
            row = await supervision.read(key.tenant, key.requester_uuid, key.session_id)
            if row is not None and row.message_id == message_id:
                # Its row is the hand-off, unclaimed: out of the queue at its epoch.
                await self.remove(key, message_id, row.epoch)
            return False
        return True

    async def head(self, key: ConversationKey) -> str | None:
        """The id of the turn that starts next, if one waits (a turn ending
        hands the conversation to it: ``Turn._write_verdict``)."""
        waiting = await self.waiting(key)
        return waiting[0].message_id if waiting else None

    async def start_passed_on(self, key: ConversationKey, message_id: str, epoch: int) -> None:
        """Start queued turn ``message_id``, to which the turn before handed
        the conversation (``Lease.pass_on``: its row at ``epoch``). Another
        replica may have started it first; if it no longer waits (cancelled
        between the hand-off's read of the queue and its write), its row ends
        ``cancelled`` and the next one starts; a draining replica leaves it to
        the others."""
        if await self.start_handed_off(key, message_id):
            return
        supervision = self._handler.stores.supervision
        assert supervision is not None
        row = await supervision.read(key.tenant, key.requester_uuid, key.session_id)
        if (
            row is None
            or row.epoch != epoch
            or row.status is not ChatStreamStatus.RUNNING
            or await self.is_waiting(key, message_id)
        ):
            # Claimed since (by another replica, whose turn has then recorded
            # its own user message, so it no longer "waits"), or it waits for
            # another replica's start: not a cancelled hand-off to end.
            return
        ended = rows.verdict(
            message_id, epoch + 1, ChatStreamStatus.CANCELLED, self._handler.clock()
        )
        # Fenced at the hand-off's epoch: a claim landing after the read wins.
        if await rows.write(supervision, key, epoch, ended):
            await self.kick(key)

    async def _hand_off(self, key: ConversationKey, head: Waiting) -> bool:
        """A draining replica's kick: claim the head and give it up at once, so
        the row reads dead and another replica's takeover starts it. Whether
        it did (False: the claim lost a race; the kick reads the row again)."""
        try:
            lease = await self._handler.grant(key, head.message_id)
        except ClaimRefusedError:
            return False
        with contextlib.suppress(FencedError):
            await lease.abandon()
        logger.info("queued turn %s handed off (this replica drains)", head.message_id)
        return True

    def request_of(self, key: ConversationKey, entry: Waiting) -> ChatRequest:
        """The request of a queued turn, as its client sent it."""
        mark = entry.mark
        headers = RequestHeaders.model_validate(
            {
                "requester-uuid": key.requester_uuid or None,
                "user-roles": mark.user_roles,
                "user-tenants": mark.user_tenants,
            }
        )
        message = entry.message.model_copy(update={"queued": None, "message_id": None})
        return ChatRequest(
            tenant=key.tenant,
            request_headers=headers,
            agent_identifier=mark.agent_identifier,
            conversation=[message],
            bot_params=mark.bot_params,
            stateful=True,
            session_id=key.session_id,
        )

    async def check_still_waiting(self, key: ConversationKey, message_id: str) -> None:
        """Raise ``AlreadyDequeuedError`` unless ``message_id`` still waits
        (read after the claim fenced the transcript: a cancel cannot remove
        it afterwards without the turn's epoch)."""
        if not await self.is_waiting(key, message_id):
            raise AlreadyDequeuedError(message_id)

    async def remove(self, key: ConversationKey, message_id: str, epoch: int) -> bool:
        """Remove the queued copy of turn ``message_id``, fenced at ``epoch``
        (a started turn's own, or a cancel's); whether the store took it."""
        return await self._conversations().remove_fenced(
            key.tenant, key.requester_uuid, key.session_id, [queued_id(message_id)], epoch=epoch
        )

    # ------------------------------------------------------------ cancel

    async def take_out(self, key: ConversationKey, message_id: str, epoch: int) -> bool:
        """Take queued turn ``message_id`` out of the queue before it starts,
        fenced at ``epoch``: the epoch of the conversation as last read (the
        row's, or with no row the last one ever granted, read *before* the
        row), so the removal is refused once a claim has moved the
        conversation on (a start of this very turn checks that it still
        waits only once the transcript is fenced at its epoch). Whether it was
        taken out: False when it does not wait or a claim was first."""
        if not self.supported or not await self.is_waiting(key, message_id):
            return False
        return await self.remove(key, message_id, epoch)

    async def _take_out_of_idle(self, key: ConversationKey, message_id: str) -> bool:
        """``take_out`` where the conversation had no row when last read."""
        epoch, row = await self.epoch_and_row(key)
        if row is not None:
            return False  # claimed since: the next round reads it again
        return await self.take_out(key, message_id, epoch)

    async def epoch_and_row(self, key: ConversationKey) -> tuple[int, ChatStreamSupervision | None]:
        """The conversation's epoch and row as of one moment
        (``conversation_row.read``)."""
        supervision = self._handler.stores.supervision
        assert supervision is not None
        reading = await rows.read(supervision, key)
        return reading.epoch, reading.row

    # ------------------------------------------------------------ following

    async def follow_when_started(
        self,
        key: ConversationKey,
        message_id: str,
        attach: AttachLater,
        start_index: int,
    ) -> AsyncIterator[StreamEvent | StreamEnd]:
        """A queued turn's events once it starts (on whichever replica): until
        then this waits, polling the supervision row, and kicks the queue if
        the conversation is idle. Ends ``cancelled`` if the turn leaves the
        queue without starting."""
        handler = self._handler
        supervision = handler.stores.supervision
        assert supervision is not None
        interval = handler.settings.follower_poll_interval
        last: tuple[str, int, ChatStreamStatus] | None = None
        polls = 0
        while True:
            row = await supervision.read(key.tenant, key.requester_uuid, key.session_id)
            if row is not None and row.message_id == message_id:
                break
            seen = (row.message_id, row.epoch, row.status) if row is not None else None
            if seen != last or polls % _RECHECK_POLLS == 0:
                if not await self.is_waiting(key, message_id):
                    # Gone without our seeing its row: cancelled, or it ran
                    # and ended between two polls (its row then names it
                    # until its clean-up, so this is a cancel).
                    again = await supervision.read(key.tenant, key.requester_uuid, key.session_id)
                    if again is None or again.message_id != message_id:
                        yield StreamEnd(EndReason.CANCELLED)
                        return
                    break
                if (
                    row is None
                    or row.status is not ChatStreamStatus.RUNNING
                    or handler.reads_dead(row)
                ):
                    await self.kick(key)
            last = seen
            polls += 1
            await asyncio.sleep(interval)
        events = await attach(start_index)
        async for item in events:
            yield item
