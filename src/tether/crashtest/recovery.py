"""Recovering a turn the way a client would, after its stream broke or went quiet.

The recovery is the Python client's own (``tether.client``: status, then
attach with ``Last-Event-ID``, resume when the producer is dead, attach when a
replica took it over first, the transcript once the stream is gone), run
through ``TetherClient.follow``. What this module adds is the crash
test's side: where the client may turn (the replicas other than the failing
one, or the load balancer in front of them), and the evidence: each
connection the client opens becomes a ``TurnReader`` holding every event with
its arrival time, and the round hears the moment the turn has a new owner.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from tether.client import RotatingEndpoints, TetherClient
from tether.client.endpoints import Endpoints
from tether.client.errors import RecoveryError, TetherHTTPError, TurnFailedError
from tether.client.observer import Connection, TurnObserver
from tether.client.sse import SSEEvent
from tether.crashtest.client import REQUESTER, TENANT, TIMEOUT, ClientView, TetherAPI
from tether.crashtest.cluster import Cluster, Replica
from tether.crashtest.reader import TurnReader


@dataclass
class Recovery:
    path: list[str] = field(default_factory=list)
    readers: list[TurnReader] = field(default_factory=list)
    finished: bool = False
    problem: str | None = None
    finished_at: float | None = None


async def recover(
    api: TetherAPI,
    cluster: Cluster,
    failing: Replica,
    *,
    session_id: str,
    message_id: str,
    view: ClientView,
    deadline: float,
    on_takeover: Callable[[TurnReader], None] | None = None,
    resumed_from_index: int | None = None,
    failed_start: int | None = None,
) -> Recovery:
    """Drive the turn to its end from the replicas other than ``failing`` (until it
    is restarted: a rolling deploy resumes on it again), or through the load
    balancer when there is one. A replica that is paused or draining is never
    asked directly. ``failed_start`` is the start of ``failing`` that failed
    (``Replica.starts``; by default its current one): a later start counts as
    restarted, even one before the recovery began.

    ``on_takeover`` hears the reader through which the client has the turn
    from its new owner: its own accepted resume, or, where replicas take dead
    turns over by themselves, an attach whose stream comes from a resumed
    producer (an index at or past ``resumed_from_index``: a resumed producer
    streams past every index the first one can use)."""
    recovery = Recovery()
    endpoints: Endpoints = (
        RotatingEndpoints(api.front.url)
        if api.front is not None
        else _Survivors(cluster, failing, failed_start)
    )
    evidence = _Evidence(cluster, view, on_takeover, resumed_from_index)
    client = TetherClient(
        endpoints,
        tenant=TENANT,
        requester_uuid=REQUESTER,
        http=api.http,
        timeout=TIMEOUT.connect or 5.0,
        stream_read_timeout=TIMEOUT.read or 30.0,
        # The round's deadline bounds the recovery; the client must not give up first.
        recovery_timeout=max(1.0, deadline - time.monotonic()),
    )
    turn = client.follow(
        session_id,
        message_id,
        last_event_id=view.last_event_id,
        agent_identifier=api.agent,
        observer=evidence,
    )
    try:
        async with asyncio.timeout(max(0.0, deadline - time.monotonic())):
            async for _ in turn:
                pass
    except TimeoutError:
        recovery.problem = "the turn did not finish within the round's bound"
    except TurnFailedError as error:
        recovery.problem = f"the turn ended errored ({error.code})"
    except (RecoveryError, TetherHTTPError) as error:
        recovery.problem = str(error)
    finally:
        await turn.aclose()
    recovery.path = turn.path
    recovery.readers = evidence.readers
    if turn.outcome == "done":
        recovery.finished, recovery.finished_at = True, time.monotonic()
    elif turn.outcome is not None:
        recovery.path.append(turn.outcome)
        recovery.problem = f"the turn ended {turn.outcome}"
    return recovery


class _Survivors:
    """The replicas a client can turn to while ``failing`` fails, in turn: running
    ones (not paused, not draining), ``failing`` only once it was restarted, and
    then after the others (a rolling deploy resumes on a replica it has not
    drained yet, whether or not the drained one is back already)."""

    def __init__(self, cluster: Cluster, failing: Replica, failed_start: int | None) -> None:
        self._cluster = cluster
        self._failing = failing
        self._failed_start = failing.starts if failed_start is None else failed_start
        self._attempt = 0

    def current(self) -> str | None:
        failing = self._failing
        survivors = [
            replica
            for replica in self._cluster.replicas
            if replica.running and replica is not failing
        ]
        if failing.running and failing.starts != self._failed_start:
            survivors.append(failing)
        if not survivors:
            return None
        return survivors[self._attempt % len(survivors)].url

    def failed(self, url: str) -> None:
        self._attempt += 1


class _Evidence(TurnObserver):
    """One ``TurnReader`` per connection the client opens, fed as it reads."""

    def __init__(
        self,
        cluster: Cluster,
        view: ClientView,
        on_takeover: Callable[[TurnReader], None] | None,
        resumed_from_index: int | None,
    ) -> None:
        self.readers: list[TurnReader] = []
        self._cluster = cluster
        self._view = view
        self._on_takeover = on_takeover
        self._resumed_from = resumed_from_index
        self._by_connection: dict[int, TurnReader] = {}
        self._owners: set[int] = set()

    def opened(self, connection: Connection) -> None:
        replica = self._cluster.replica_at(connection.url)
        reader = TurnReader.fed(connection.kind, replica.name if replica else connection.url)
        self._by_connection[id(connection)] = reader
        self.readers.append(reader)

    def responded(self, connection: Connection) -> None:
        reader = self._by_connection[id(connection)]
        assert connection.status_code is not None
        reader.got_response(connection.status_code, connection.headers)
        if connection.kind == "resume" and connection.status_code == 201:
            self._takeover(reader)

    def received(self, connection: Connection, event: SSEEvent) -> None:
        reader = self._by_connection[id(connection)]
        reader._receive(event.event, event.id, event.data)
        latest = reader.events[-1] if reader.events else None
        if (
            self._resumed_from is not None
            and latest is not None
            and latest.index is not None
            and latest.index >= self._resumed_from
        ):
            self._takeover(reader)

    def closed(self, connection: Connection) -> None:
        reader = self._by_connection.pop(id(connection))
        failure = connection.failure
        reader.finish(
            http_error=_body(connection.refusal) if connection.refusal is not None else None,
            error=f"{type(failure).__name__}: {failure}".strip() if failure is not None else None,
        )
        self._view.take(reader)

    def _takeover(self, reader: TurnReader) -> None:
        """Tell the round, once per reader, that it has the turn from a new owner."""
        if id(reader) not in self._owners and self._on_takeover is not None:
            self._owners.add(id(reader))
            self._on_takeover(reader)


def _body(refusal: TetherHTTPError) -> str:
    return refusal.body if isinstance(refusal.body, str) else f"{refusal.code}: {refusal.message}"
