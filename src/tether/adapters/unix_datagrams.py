"""Push between the processes of one host: datagrams on Unix sockets in a shared directory.

SQLite and the file store have no server to carry announcements, but the
replicas sharing them share a host. So each store of a replica that listens
(its recording store, for followers and producers; its supervision store, for
the takeover loop) binds one datagram socket in a directory beside the data
(``{db}.wake``, or ``.tether-wake`` beside the file store's folders), and an
announcement is a datagram sent to every socket found there: a recording
write, a supervision write that changed the epoch, a follower's watch, or a
producer's delta, which travels in the datagram itself (the change kinds of
``StreamChange``). Sending never waits: the sockets are non-blocking, and a
peer whose queue is full loses that datagram.

Polling is the fallback, as it is for PostgreSQL and Redis when their
connection is lost: a datagram lost (a full queue, a crash between a commit
and its announcement) is a change its follower reads at its next fallback
poll, and a replica that cannot listen (the directory is not writable, the
socket path is out of reach, another event loop holds the socket) gets
subscriptions that poll: a follower's ``wait`` returns both kinds of write
after ``poll_interval`` seconds, a spurious wake-up it re-reads after, as it
would have polled; a producer hears of a cancel at its next fenced write. A
replica on another host (a directory on a network file system) never sees
these sockets' datagrams (its followers re-read at the push fallback
interval, 1 s; both stores are for one host); the sockets are named after
their host, so it neither sends to nor removes another host's sockets.

Edges handled where they arise:

- A dead replica's socket file stays behind; sending to it is refused
  (``ECONNREFUSED``), and the sender removes it. One removed meanwhile
  (``ENOENT``) is skipped.
- A socket's address holds at most 107 bytes. Names are short (a host hash
  and a random token); a directory too deep for that is reached through
  ``/proc/self/fd`` of a descriptor on it (Linux), else the channel polls.
- The kernel queues few datagrams per socket (``net.unix.max_dgram_qlen``,
  often 10), so one call's announcements travel together, as lines of as few
  datagrams as fit (``unix_datagram_wire``). A delta too large for any
  datagram goes as a wake-up without its payload (a recording change): its
  follower reads the snapshot.
- Permissions: a socket that refuses this process (``EACCES``) is skipped.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import hashlib
import json
import logging
import os
import secrets
import socket
import weakref
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Final

from tether.adapters import unix_datagram_wire as wire
from tether.domain.chat_stream_recording_store import (
    EVERYTHING,
    ChangeSubscription,
    DeltaPublication,
    PendingChanges,
    StreamChange,
    deliver,
)
from tether.domain.stream_delta import StreamDelta

logger = logging.getLogger(__name__)

DEAD_TURNS_KEY: Final = "dead-turns"
"""The key of ``announce_dead_turns``; no conversation key (hex) spells it."""

_SUFFIX: Final = ".sock"
_MAX_ADDRESS: Final = 107
"""``sun_path`` holds 108 bytes with the terminating NUL."""


def conversation_key(tenant: str, requester_uuid: str | None, session_id: str) -> str:
    """The channel's name for a conversation: a hash of its ids, the same in
    every process (ids may hold any character, a hash holds none to escape)."""
    ids = json.dumps([tenant, requester_uuid or "", session_id]).encode()
    return hashlib.blake2b(ids, digest_size=16).hexdigest()


def _host_tag() -> str:
    return hashlib.blake2b(socket.gethostname().encode(), digest_size=3).hexdigest()


def _close(receiver: socket.socket, path: Path) -> None:
    receiver.close()
    with contextlib.suppress(OSError):
        path.unlink()


class _Polling(ChangeSubscription):
    """A subscription without a socket to hear on. A follower's (it wants
    deltas) announces both kinds of write every ``interval`` seconds, so it
    polls at that pace although its store has a channel; any other holder (a
    producer listening for a cancel, a takeover loop) hears nothing, as from a
    store without a channel, rather than re-read its row ten times a second
    for every turn."""

    def __init__(self, interval: float) -> None:
        self._interval = interval

    async def wait(self, max_wait: float) -> frozenset[StreamChange]:
        if not self.wants_deltas or max_wait < self._interval:
            await asyncio.sleep(max(max_wait, 0))
            return frozenset()
        await asyncio.sleep(self._interval)
        return EVERYTHING


class UnixDatagramChannel:
    """Announcements among the processes that share ``directory`` on one host.

    A store keeps one; the stores of a backend that share a directory hear
    each other's announcements, within a process as across processes (every
    announcement goes through the sockets). The socket is bound by the first
    ``subscribe`` (or ``listen``), on that event loop, and closed by
    ``aclose``; sending needs none.
    """

    def __init__(self, directory: str | os.PathLike[str], *, poll_interval: float = 0.1) -> None:
        self._directory = Path(os.path.abspath(os.fspath(directory)))
        self._poll_interval = poll_interval
        self._host = _host_tag()
        self._subscriptions: dict[str, set[PendingChanges[str]]] = {}
        self._socket: socket.socket | None = None
        self._sender: socket.socket | None = None
        self._name: str | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._directory_fd: int | None = None
        self._cannot_listen: str | None = None
        self._forget: weakref.finalize[[socket.socket, Path], UnixDatagramChannel] | None = None

    @property
    def directory(self) -> Path:
        """Where the sockets are."""
        return self._directory

    @property
    def listening(self) -> bool:
        """Whether this channel's socket is bound (its subscriptions hear pushes)."""
        return self._socket is not None

    def listen(self) -> bool:
        """Bind the socket now, on the running event loop, if it is not yet;
        whether it is (else subscriptions poll, and a warning says why)."""
        loop = asyncio.get_running_loop()
        if self._socket is not None:
            if self._loop is loop:
                return True
            if self._loop is not None and not self._loop.is_closed():
                return False  # another live loop hears on it
            self._unbind()
        if self._cannot_listen is not None:
            return False
        try:
            self._bind(loop)
        except OSError as error:
            self._cannot_listen = str(error)
            logger.warning(
                "cannot listen for wake-ups in %s (%s); followers here poll",
                self._directory,
                error,
            )
            return False
        return True

    def subscribe(self, key: str) -> ChangeSubscription:
        """Hear ``key``'s announcements from now on (a polling subscription
        when this channel cannot listen)."""
        if not self.listen():
            return _Polling(self._poll_interval)
        subscription = PendingChanges(key, self._drop)
        self._subscriptions.setdefault(key, set()).add(subscription)
        return subscription

    async def wait(self, key: str, max_wait: float) -> bool:
        """Whether ``key`` was announced within ``max_wait`` seconds (on a
        subscription of its own: only what is announced during the call counts)."""
        if max_wait <= 0:
            return False
        async with self.subscribe(key) as subscription:
            return bool(await subscription.wait(max_wait))

    def announce(self, changes: Iterable[tuple[str, StreamChange]]) -> None:
        """Send each ``(key, change)`` to every socket in the directory."""
        self._send([wire.encode(key, change) for key, change in changes])

    def announce_deltas(self, deltas: Iterable[tuple[str, StreamDelta]]) -> None:
        """Send each ``(key, delta)`` with its encoding to every socket."""
        self._send([wire.encode(key, StreamChange.DELTA, delta.encode()) for key, delta in deltas])

    async def aclose(self) -> None:
        """Close the socket and remove its file; subscriptions still open
        return from their ``wait`` and hear nothing more. Idempotent."""
        self._unbind()
        if self._sender is not None:
            self._sender.close()
            self._sender = None
        if self._directory_fd is not None:
            os.close(self._directory_fd)
            self._directory_fd = None
        for subscriptions in list(self._subscriptions.values()):
            for subscription in subscriptions:
                subscription.release()

    # ------------------------------------------------------------ receiving

    def _bind(self, loop: asyncio.AbstractEventLoop) -> None:
        self._directory.mkdir(parents=True, exist_ok=True)
        name = f"{self._host}-{secrets.token_hex(6)}{_SUFFIX}"
        receiver = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        try:
            receiver.setblocking(False)
            receiver.bind(self._address(name))
            loop.add_reader(receiver.fileno(), self._drain)
        except BaseException:
            receiver.close()
            raise
        self._socket, self._name, self._loop = receiver, name, loop
        # A channel dropped unclosed (its loop closed first) still closes its
        # socket and removes its file when it is collected.
        self._forget = weakref.finalize(self, _close, receiver, self._directory / name)

    def _unbind(self) -> None:
        receiver, self._socket = self._socket, None
        if receiver is None:
            return
        loop, self._loop = self._loop, None
        if loop is not None and not loop.is_closed():
            loop.remove_reader(receiver.fileno())
        if self._forget is not None:
            self._forget()
        self._name = self._forget = None

    def _drain(self) -> None:
        receiver = self._socket
        while receiver is not None:
            try:
                datagram = receiver.recv(wire.DATAGRAM_BYTES + 1)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                logger.debug("receiving a wake-up failed", exc_info=True)
                return
            for line in datagram.decode(errors="replace").split("\n"):
                key, changes, delta = wire.parse(line)
                subscriptions = self._subscriptions.get(key)
                if subscriptions:  # most lines are for turns nobody here reads
                    deliver(subscriptions, changes, delta)

    def _drop(self, subscription: PendingChanges[str]) -> None:
        subscriptions = self._subscriptions.get(subscription.key)
        if subscriptions is not None:
            subscriptions.discard(subscription)
            if not subscriptions:
                del self._subscriptions[subscription.key]

    # -------------------------------------------------------------- sending

    def _send(self, lines: list[bytes]) -> None:
        if not lines:
            return
        peers = self._peers()
        if not peers:
            return
        if self._sender is None:
            self._sender = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
            self._sender.setblocking(False)
        datagrams = list(wire.datagrams(lines))
        for name in peers:
            try:
                address = self._address(name)
            except OSError as error:
                logger.debug("no wake-ups through %s: %s", self._directory, error)
                return
            for group in datagrams:
                if not self._send_to(address, name, group):
                    break

    def _send_to(self, address: str, name: str, group: list[bytes]) -> bool:
        """Send one datagram to peer ``name``; whether to go on with this peer."""
        assert self._sender is not None
        try:
            self._sender.sendto(b"\n".join(group), address)
        except (BlockingIOError, InterruptedError):
            return True  # its queue is full: lost, a change it reads at its next poll
        except ConnectionRefusedError:
            # Nobody is bound to it: a dead replica's socket file.
            with contextlib.suppress(OSError):
                (self._directory / name).unlink()
            return False
        except OSError as error:
            if error.errno == errno.EMSGSIZE:
                with contextlib.suppress(OSError):
                    self._sender.sendto(b"\n".join(map(wire.wake_up, group)), address)
                return True
            # Gone meanwhile (ENOENT), not ours to write (EACCES), ...: skip it.
            logger.debug("no wake-up to %s: %s", name, error)
            return False
        return True

    def _peers(self) -> list[str]:
        """The sockets of this host's replicas (this channel's own too)."""
        try:
            names = os.listdir(self._directory)
        except OSError:
            return []  # nobody listens yet
        prefix = f"{self._host}-"
        return [n for n in names if n.startswith(prefix) and n.endswith(_SUFFIX)]

    def _address(self, name: str) -> str:
        path = f"{self._directory}/{name}"
        if len(os.fsencode(path)) <= _MAX_ADDRESS:
            return path
        # Too deep for sun_path: reach the directory through a descriptor on it.
        if self._directory_fd is None:
            self._directory_fd = os.open(self._directory, os.O_RDONLY | os.O_DIRECTORY)
        return f"/proc/self/fd/{self._directory_fd}/{name}"


class PushesOnThisHost:
    """The push half of a recording store whose replicas share one host
    (SQLite, the file store): every method goes through ``_channel``, this
    replica's socket in the shared directory."""

    _channel: UnixDatagramChannel

    def subscribe(
        self, tenant: str, requester_uuid: str | None, session_id: str
    ) -> ChangeSubscription:
        """Hear the conversation's puts and deletes, and its supervision
        store's changes of epoch, from any process on this host, from now on
        (the socket is bound before this returns, so nothing is missed)."""
        return self._channel.subscribe(conversation_key(tenant, requester_uuid, session_id))

    async def listen(self) -> None:
        """Bind this replica's socket now (the first ``subscribe`` does anyway)."""
        self._channel.listen()

    async def publish_deltas(self, deltas: Sequence[DeltaPublication]) -> None:
        """Every delta in the datagrams of one send per replica; one too large
        for a datagram goes as a recording change (its follower reads the snapshot)."""
        self._channel.announce_deltas(
            (conversation_key(d.tenant, d.requester_uuid, d.session_id), d.delta) for d in deltas
        )

    async def announce_watch(
        self, tenant: str, requester_uuid: str | None, session_id: str
    ) -> None:
        """Tell the conversation's producer, in whichever process, that a follower watches."""
        key = conversation_key(tenant, requester_uuid, session_id)
        self._channel.announce([(key, StreamChange.WATCH)])

    async def wait_for_change(
        self, tenant: str, requester_uuid: str | None, session_id: str, max_wait: float
    ) -> bool:
        """True when the conversation is announced within ``max_wait`` seconds."""
        key = conversation_key(tenant, requester_uuid, session_id)
        return await self._channel.wait(key, max_wait)
