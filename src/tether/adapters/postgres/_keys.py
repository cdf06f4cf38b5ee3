"""Row keys and id checks: what every PostgreSQL store does before it sends an id."""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Protocol, TypeVar

from tether.domain.tombstones import TombstoneKey


def row_key(*ids: str) -> bytes:
    """The 32-byte primary key of the row addressed by ``ids``.

    SHA-256 over each id's UTF-8 bytes behind an 8-byte length: the encoding is
    injective, so distinct id tuples get distinct keys (short of a SHA-256
    collision), and ids of any length fit a B-tree. The key derivation is part of
    the schema: changing it needs a migration.
    """
    digest = hashlib.sha256()
    for value in ids:
        data = value.encode("utf-8")
        digest.update(len(data).to_bytes(8, "big"))
        digest.update(data)
    return digest.digest()


DEAD_TURNS_KEY = b"dead turns"
"""The key ``announce_dead_turns`` notifies under: not 32 bytes long, so no
row's key (see :func:`row_key`)."""


def check_ids(*ids: str) -> None:
    """Refuse, before any I/O, ids a PostgreSQL ``text`` column cannot hold.

    That is NUL characters and lone surrogates (not valid UTF-8). Raises
    ``ValueError`` naming the problem; every other string is stored exactly.
    """
    for value in ids:
        if "\x00" in value:
            raise ValueError(f"PostgreSQL cannot store an id containing NUL: {value[:80]!r}")
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as error:
            raise ValueError(f"id is not valid Unicode text: {value[:80]!r}") from error


@functools.cache
def tombstones() -> TombstoneKey:
    """The key conversations' rows are keyed with: ``TETHER_TOMBSTONE_KEY`` as
    this process read it first (``tether.domain.tombstones``)."""
    return TombstoneKey.from_env()


def session_key(tenant: str, requester_uuid: str | None, session_id: str) -> bytes:
    """The key of a conversation's checkpoint, supervision row and recording,
    and of the numbers kept for it for ever (its highest epoch, its fences):
    its tombstone, a keyed hash of the ids (32 bytes), so that those numbers
    name nothing once the conversation is erased.

    The supervision row and the recording of one conversation share it, so one
    NOTIFY payload (the key in hex) announces either kind of write. A missing
    requester is ``""``. Checks the ids first (see :func:`check_ids`).
    """
    check_ids(tenant, requester_uuid or "", session_id)
    return bytes.fromhex(tombstones().of(tenant, requester_uuid, session_id))


class _ConversationItem(Protocol):
    @property
    def tenant(self) -> str: ...
    @property
    def requester_uuid(self) -> str | None: ...
    @property
    def session_id(self) -> str: ...


_Item = TypeVar("_Item", bound=_ConversationItem)


def conversation_rounds(items: Sequence[_Item]) -> list[list[tuple[int, _Item, bytes]]]:
    """A batch cut into rounds in which no conversation repeats: (position, item,
    session key) triples, each conversation's items in batch order across rounds.

    One statement over ``unnest()`` arrays cannot apply two writes to one row in
    order, so a batch sends one statement per round; a batch of distinct
    conversations (a heartbeat or a flush, the usual case) is one round.
    """
    rounds: list[list[tuple[int, _Item, bytes]]] = []
    seen: dict[bytes, int] = {}
    for position, item in enumerate(items):
        key = session_key(item.tenant, item.requester_uuid, item.session_id)
        occurrence = seen.get(key, 0)
        seen[key] = occurrence + 1
        if occurrence == len(rounds):
            rounds.append([])
        rounds[occurrence].append((position, item, key))
    return rounds


async def written_per_item(
    items: Sequence[_Item],
    write_round: Callable[[list[tuple[int, _Item, bytes]]], Awaitable[Sequence[Mapping[str, Any]]]],
) -> list[bool]:
    """Run a batch round by round (see ``conversation_rounds``): ``write_round``
    sends one statement for a round and returns its rows, one per item in
    order, each with a ``written`` column. True per item written, in batch order."""
    results = [False] * len(items)
    for this_round in conversation_rounds(items):
        rows = await write_round(this_round)
        for (position, _, _), row in zip(this_round, rows, strict=True):
            results[position] = bool(row["written"])
    return results
