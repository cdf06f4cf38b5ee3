"""Retention: erase the conversations nobody updated for a while, with
everything they own, from the CLI (``tether db prune``) or from the servers
themselves (``TETHER_RETENTION``), one replica at a time.

``prune`` lists the stale conversations (``list_stale_conversations``) and
erases each as its owner would (``erase_conversation``), re-reading it first:
one updated since it was listed, or with a live turn, is skipped.

``RetentionRunner`` is the servers' side: every ``TETHER_RETENTION_INTERVAL``
each replica tries to run a prune, and only the replica holding the
retention lease does. The lease is a row of the supervision store under a
reserved conversation key, ``LEASE_KEY``:

- The supervision store is the one store every replica shares whose writes
  are an atomic compare-and-swap on an epoch, in every backend (a Lua script
  on Redis, one statement on PostgreSQL, ``BEGIN IMMEDIATE`` on SQLite, a
  lock file on files), seed-only adapters included. The lease needs nothing
  else: no new store method, no schema change.
- The key cannot be a real conversation's: its tenant, ``tether/retention``,
  holds a slash, and every tenant a client can name passes
  ``tether.api.ids.ID_PATTERN`` (a JWT's tenants the same check), which
  refuses slashes. No turn, cancel or erase of a client reaches the row. The
  stores escape ids, so to them the slash is one more character.
- The row is a RUNNING row whose ``message_id`` names the holder (host, pid,
  a random suffix) and whose heartbeat says when it was taken or last
  renewed. It is held for one interval after that (``is_live`` with the
  interval as the threshold). A replica takes it when there is no row, when
  it has expired, or when it is the replica's own from its previous run,
  each time by a compare-and-swap at the next epoch: of two replicas racing
  for the same period, one swap is refused and that replica skips the run.
- The holder renews the lease (a compare-and-swap at its epoch) before each
  erase and stops at the first refusal. The lease is not released after a
  run: it covers the period, so the replicas that wake during it skip, and
  retention runs about once per interval across all replicas.

What is guaranteed: at most one replica holds the lease at any moment, by
the clock turn heartbeats are judged by (the store's where it has one,
``tether.runtime.clock``), and a replica erases only right after renewing
it. A replica paused for longer than the interval between its renewal and
its erase can land that one erase while another replica prunes; erasing
re-reads and is idempotent, so that does no harm. On Redis the row expires
after ``stream_ttl``: an interval longer than that lets the next run come
sooner than one interval, never alongside a holder that is renewing.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from tether.domain.capabilities import Capability, supports
from tether.domain.chat_conversation_store import (
    ConversationNotOwnedError,
    ConversationSummary,
)
from tether.domain.store_bundle import StoreBundle, StoreURLError
from tether.handlers.erase import EndDead, erase_conversation
from tether.handlers.errors import ConversationBusyError
from tether.runtime import background
from tether.runtime import conversation_row as rows
from tether.runtime.lease import ClaimRefusedError, ConversationKey, FencedError, Lease, take
from tether.runtime.turn_stores import TurnStores
from tether.settings import TetherSettings

logger = logging.getLogger(__name__)

Clock = Callable[[], datetime]
Sleep = Callable[[float], Awaitable[None]]

LEASE_KEY = ConversationKey(tenant="tether/retention", requester_uuid="", session_id="lease")
"""The supervision row of the retention lease (a tenant no client can name)."""

_PAGE = 200
_NEEDED = (
    Capability.CONVERSATION_LIST_STALE,
    Capability.CONVERSATION_GET,
    Capability.CONVERSATION_DELETE,
)


@dataclass
class PruneReport:
    """What a prune found: the conversations it removed (or, dry, would remove)
    and those it left because a turn runs in them or they changed meanwhile."""

    cutoff: datetime
    removed: list[ConversationSummary] = field(default_factory=list)
    skipped: list[tuple[ConversationSummary, str]] = field(default_factory=list)


async def prune(
    bundle: StoreBundle,
    older_than: timedelta,
    *,
    dry_run: bool,
    now: datetime | None = None,
    dead_after: timedelta = timedelta(seconds=3),
) -> PruneReport:
    """Erase every conversation (with its checkpoint, recording and supervision
    row) not updated for ``older_than``; with ``dry_run`` only list them.

    Each is re-read just before it is erased: one updated since it was listed,
    or with a live turn, is skipped. Erasing is idempotent, so two prunes that
    overlap do no harm; run it from one scheduler all the same (or let the
    servers run it: ``RetentionRunner``)."""
    stores = TurnStores(
        agent_state=bundle.agent_state_store,
        recording=bundle.chat_stream_recording_store,
        supervision=bundle.chat_stream_supervision_store,
        conversation=bundle.chat_conversation_store,
    )
    return await prune_stores(
        stores, older_than, dry_run=dry_run, now=now or datetime.now(UTC), dead_after=dead_after
    )


async def prune_stores(
    stores: TurnStores,
    older_than: timedelta,
    *,
    dry_run: bool,
    now: datetime,
    dead_after: timedelta,
    before_erase: Callable[[], Awaitable[bool]] | None = None,
    clock: Clock = lambda: datetime.now(UTC),
    end_dead: EndDead | None = None,
) -> PruneReport:
    """``prune`` over the stores a server holds. ``before_erase`` runs before
    each erase (the runner renews its lease there); when it returns False the
    prune stops and returns what it did so far. ``clock`` stamps each
    erase's tombstone and ``end_dead`` ends a dead turn before its erase
    (``handlers.erase``)."""
    conversations = stores.conversation
    if conversations is None:
        raise StoreURLError("pruning needs a conversation store; these URLs have none")
    if not supports(conversations, Capability.CONVERSATION_LIST_STALE):
        raise StoreURLError(f"{type(conversations).__name__} cannot list conversations by age")
    report = PruneReport(cutoff=now - older_than)
    cursor: str | None = None
    while True:
        listed = await conversations.list_stale_conversations(report.cutoff, _PAGE, cursor)
        for summary in listed.items:
            if dry_run:
                report.removed.append(summary)
                continue
            if before_erase is not None and not await before_erase():
                return report
            await _prune_one(
                stores, summary, report, clock=clock, dead_after=dead_after, end_dead=end_dead
            )
        if listed.next_cursor is None:
            return report
        cursor = listed.next_cursor


async def _prune_one(
    stores: TurnStores,
    summary: ConversationSummary,
    report: PruneReport,
    *,
    clock: Clock,
    dead_after: timedelta,
    end_dead: EndDead | None,
) -> None:
    assert stores.conversation is not None
    owner, tenant, session = summary.owner_uuid, summary.tenant, summary.session_id
    current = await stores.conversation.get_conversation(tenant, owner, session)
    if current is None:
        return  # gone meanwhile (its owner deleted it, or another prune did)
    if current.updated_at >= report.cutoff:
        report.skipped.append((summary, "updated since it was listed"))
        return
    try:
        await erase_conversation(
            stores, tenant, owner, session, clock=clock, dead_after=dead_after, end_dead=end_dead
        )
    except ConversationBusyError as busy:
        report.skipped.append((summary, f"turn {busy.message_id} is running"))
    except ConversationNotOwnedError:
        report.skipped.append((summary, "its owner changed"))
    else:
        report.removed.append(summary)


# The servers' retention -----------------------------------------------------------------


@dataclass(frozen=True)
class RetentionRun:
    """One run of a replica: what it pruned, or who held the lease instead."""

    report: PruneReport | None
    """None when another replica held the lease (then ``held_by`` names it)."""
    held_by: str | None = None
    lease_lost: bool = False
    """The lease was taken over during the run, which then stopped."""


@dataclass(frozen=True)
class RetentionOff:
    """Why a server runs no retention (logged at start-up)."""

    reason: str


class RetentionRunner:
    """Prunes every ``interval`` from one replica at a time (see the module
    docstring for the lease). ``run_once`` is one run; ``start`` runs one at
    once and then one per interval until ``aclose``."""

    def __init__(
        self,
        stores: TurnStores,
        *,
        older_than: timedelta,
        interval: timedelta,
        dead_after: timedelta,
        clock: Clock,
        holder: str | None = None,
        sleep: Sleep = asyncio.sleep,
        end_dead: EndDead | None = None,
    ) -> None:
        if stores.supervision is None or stores.conversation is None:
            raise ValueError("retention needs a supervision and a conversation store")
        self._stores = stores
        self._supervision = stores.supervision
        self.older_than = older_than
        self.interval = interval
        self._dead_after = dead_after
        self._clock = clock
        self._sleep = sleep
        self._end_dead = end_dead
        self.holder = holder or _holder_name()
        """The lease's ``message_id`` while this runner holds it."""
        self._task: asyncio.Task[None] | None = None

    async def run_once(self) -> RetentionRun:
        """Take the lease and prune, or return at once if another replica holds it.

        Store errors are raised (the loop logs them and tries again next interval)."""
        lease = await self._take_lease()
        if isinstance(lease, str):
            return RetentionRun(report=None, held_by=lease)
        lost = False

        async def renew() -> bool:
            nonlocal lost
            try:
                await lease.renew()
            except FencedError:
                lost = True
            return not lost

        report = await prune_stores(
            self._stores,
            self.older_than,
            dry_run=False,
            now=self._clock(),
            dead_after=self._dead_after,
            before_erase=renew,
            clock=self._clock,
            end_dead=self._end_dead,
        )
        return RetentionRun(report=report, lease_lost=lost)

    async def _take_lease(self) -> Lease | str:
        """Our lease, or the ``message_id`` of the replica that holds it."""
        key, store = LEASE_KEY, self._supervision
        reading = await rows.read(store, key)
        current = reading.row
        if (
            current is not None
            and current.message_id != self.holder
            and current.is_live(self._clock(), self.interval)
        ):
            return current.message_id
        try:
            return await take(store, key, reading, self.holder, self._clock, None)
        except ClaimRefusedError as refused:
            winner = refused.occupant
            return "another replica" if winner is None else winner.message_id

    def start(self) -> None:
        """Run now, then once per interval, in a background task."""
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._loop(), name="retention")

    @property
    def running(self) -> bool:
        """Whether the background task is alive."""
        return self._task is not None and not self._task.done()

    async def aclose(self) -> None:
        """Stop the background task, in a run or between runs. A run stopped
        half-way leaves at worst one conversation partly erased; the next run
        (here or elsewhere) finishes it, as erasing is repeatable."""
        await background.stop(self._task)

    async def _loop(self) -> None:
        while True:
            try:
                self._log(await self.run_once())
            except Exception:
                logger.exception(
                    "retention run failed; the next one is in %s s",
                    self.interval.total_seconds(),
                )
            await self._sleep(self.interval.total_seconds())

    def _log(self, run: RetentionRun) -> None:
        if run.report is None:
            logger.debug("retention: %s holds the lease; skipping this run", run.held_by)
            return
        report = run.report
        logger.info(
            "retention: removed %d conversation(s) not updated since %s; skipped %d",
            len(report.removed),
            report.cutoff.isoformat(),
            len(report.skipped),
        )
        if run.lease_lost:
            logger.warning("retention: another replica took the lease over; this run stopped")


def retention_runner(
    stores: TurnStores,
    settings: TetherSettings,
    *,
    clock: Clock,
    end_dead: EndDead | None = None,
) -> RetentionRunner | RetentionOff:
    """The runner ``settings`` ask for, or why there is none."""
    if settings.retention is None:
        return RetentionOff("TETHER_RETENTION is unset")
    if stores.conversation is None:
        return RetentionOff("no conversation store is wired, so there is nothing to prune")
    missing = [need.method for need in _NEEDED if not supports(stores.conversation, need)]
    if missing:
        return RetentionOff(
            f"{type(stores.conversation).__name__} does not implement {', '.join(missing)}"
        )
    if stores.supervision is None:
        return RetentionOff(
            "no supervision store is wired, and its compare-and-swap is what lets "
            "one replica at a time prune"
        )
    return RetentionRunner(
        stores,
        older_than=timedelta(seconds=settings.retention),
        interval=timedelta(seconds=settings.retention_interval),
        dead_after=timedelta(seconds=settings.dead_after),
        clock=clock,
        end_dead=end_dead,
    )


def _holder_name() -> str:
    return f"retention:{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
