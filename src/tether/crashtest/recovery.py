"""Recovering a turn the way a client would, after its stream broke or went quiet.

Ask a surviving replica for the conversation's status, then act on the verdict:
``dead`` resumes the turn there (``POST /chat/stream?resume=true``), ``running``
attaches to it (``GET /chat/stream/{id}`` with ``Last-Event-ID``), ``done`` means
the answer is complete and only the transcript is left to fetch. A stream that
ends with ``dead`` or ``gone``, or a refused resume, sends the client back to
the status; every step is bounded.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import httpx2

from tether.crashtest.client import ClientView, TetherAPI, TurnReader
from tether.crashtest.cluster import Cluster, Replica

_RETRY_PAUSE = 0.05


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
) -> Recovery:
    """Drive the turn to its end from the replicas other than ``failing`` (until it
    is restarted: a rolling deploy resumes on it again). A replica that is
    paused or draining is never asked.

    ``on_takeover`` hears the reader through which the client has the turn
    from its new owner: its own accepted resume, or, where replicas take dead
    turns over by themselves, an attach whose stream comes from a resumed
    producer (an index at or past ``resumed_from_index``: a resumed producer
    streams past every index the first one can use)."""
    recovery = Recovery()
    attempt = 0
    failed_start = failing.starts
    while time.monotonic() < deadline:
        survivors = [
            replica
            for replica in cluster.replicas
            if replica.running and not (replica is failing and replica.starts == failed_start)
        ]
        if not survivors:
            await asyncio.sleep(_RETRY_PAUSE)
            continue
        replica = survivors[attempt % len(survivors)]
        attempt += 1
        try:
            status = await api.status(replica.url, session_id)
        except httpx2.HTTPError:
            await asyncio.sleep(_RETRY_PAUSE)
            continue
        if status is None:
            recovery.problem = f"{replica.name} knows no turn for the conversation (404)"
            return recovery
        if status.message_id != message_id:
            recovery.problem = f"the conversation's turn is {status.message_id}, not {message_id}"
            return recovery
        if status.status == "done":
            recovery.path.append("transcript")
            recovery.finished, recovery.finished_at = True, time.monotonic()
            return recovery
        if status.status in ("errored", "cancelled"):
            recovery.path.append(status.status)
            recovery.problem = f"the turn ended {status.status}"
            return recovery
        if status.status == "dead":
            reader = api.resume(replica.url, replica.name, message_id, session_id)
        else:
            reader = api.attach(
                replica.url, replica.name, message_id, session_id, last_event_id=view.last_event_id
            )
        recovery.readers.append(reader)
        if await _took_over(reader, deadline, resumed_from_index) and on_takeover is not None:
            on_takeover(reader)
        if not await reader.ended(max(0.0, deadline - time.monotonic())):
            await reader.aclose()
            view.take(reader)
            recovery.path.append(reader.label)
            break
        view.take(reader)
        if reader.http_error is not None:
            # 409: still live or taken over meanwhile; 410: finished meanwhile.
            # Either way the status says what to do next.
            recovery.path.append(f"{reader.label}:{reader.status_code}")
            await asyncio.sleep(_RETRY_PAUSE)
            continue
        recovery.path.append(reader.label)
        if reader.finished_turn:
            recovery.finished, recovery.finished_at = True, time.monotonic()
            return recovery
        await asyncio.sleep(_RETRY_PAUSE)
    recovery.problem = "the turn did not finish within the round's bound"
    return recovery


async def _took_over(reader: TurnReader, deadline: float, resumed_from_index: int | None) -> bool:
    """Whether this client now has the turn from a new owner through ``reader``:
    a resume the server accepted, or an attach to a turn a replica took over."""
    if reader.label == "resume":
        await reader.responded(max(0.0, deadline - time.monotonic()))
        return reader.status_code == 201
    if resumed_from_index is None:
        return False
    await reader.wait_for(
        lambda r: any((e.index or 0) >= resumed_from_index for e in r.messages),
        max(0.0, deadline - time.monotonic()),
    )
    return any((e.index or 0) >= resumed_from_index for e in reader.messages)
