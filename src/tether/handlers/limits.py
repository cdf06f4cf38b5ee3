"""Fair limits: how many turns one requester, and one tenant, may run at once.

A turn costs model calls until it ends, whether or not its client stays (a
turn outlives its stream), so a client that starts turns and leaves could
otherwise hold every model call a replica makes. Each replica counts the
turns it runs, per requester and per tenant, and refuses a new turn over
either limit with 429 ``TOO_MANY_TURNS`` and a ``Retry-After``.

The count is per replica, kept in memory: behind a load balancer that spreads
one requester's requests over N replicas, a requester may run up to N times
the limit. It counts every turn the replica runs (a resume, a takeover, a
queued turn's start too), but only a client's new turn is refused: the others
were accepted once already, and a queued turn starting replaces the turn that
just ended in the same conversation.

How many messages may wait in one conversation's queue is checked by the
queue (``handlers.queue``), with ``QueueFullError``.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from tether.handlers.errors import TooManyTurnsError


@dataclass
class TurnSlot:
    """One running turn's place in the counts; ``release`` when it ends (more
    than once is harmless: a start that fails and a task's end both release)."""

    _limits: TurnLimits
    _tenant: str
    _requester: str
    _held: bool = field(default=True)

    def release(self) -> None:
        if self._held:
            self._held = False
            self._limits._give_back(self._tenant, self._requester)


class TurnLimits:
    """The running turns of one replica, per requester and per tenant (see the
    module). A limit of 0 is none."""

    def __init__(self, *, per_requester: int, per_tenant: int, retry_after: int) -> None:
        self.per_requester = per_requester
        self.per_tenant = per_tenant
        self.retry_after = retry_after
        self._requesters: Counter[tuple[str, str]] = Counter()
        self._tenants: Counter[str] = Counter()

    def running(self, tenant: str, requester: str | None = None) -> int:
        """Turns counted now for the tenant, or for one requester in it."""
        if requester is None:
            return self._tenants[tenant]
        return self._requesters[(tenant, requester)]

    def take(self, tenant: str, requester: str, *, enforce: bool) -> TurnSlot:
        """Count one more turn of ``requester`` in ``tenant``; with ``enforce``
        (a client's new turn), raise ``TooManyTurnsError`` instead when either
        limit is reached. Synchronous, so two starts on one replica cannot both
        pass the check for the last place."""
        if enforce:
            if 0 < self.per_requester <= self._requesters[(tenant, requester)]:
                raise TooManyTurnsError(
                    f"this requester already runs {self.per_requester} turns, the most "
                    "allowed at once; wait for one to end, or cancel one",
                    retry_after=self.retry_after,
                )
            if 0 < self.per_tenant <= self._tenants[tenant]:
                raise TooManyTurnsError(
                    f"this tenant already runs {self.per_tenant} turns, the most allowed "
                    "at once; retry shortly",
                    retry_after=self.retry_after,
                )
        self._requesters[(tenant, requester)] += 1
        self._tenants[tenant] += 1
        return TurnSlot(self, tenant, requester)

    def _give_back(self, tenant: str, requester: str) -> None:
        # Counter keeps zero entries; drop them so a long-lived replica does
        # not keep one per requester it ever served.
        self._requesters[(tenant, requester)] -= 1
        if self._requesters[(tenant, requester)] <= 0:
            del self._requesters[(tenant, requester)]
        self._tenants[tenant] -= 1
        if self._tenants[tenant] <= 0:
            del self._tenants[tenant]
