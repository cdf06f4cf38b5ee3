"""Where each row lives: the key layout under a configurable prefix.

A conversation is ``{tenant}:{requester}:{session}`` with every part
percent-encoded (UTF-8, nothing but ``A-Za-z0-9_.-~`` left as is), so no part
contains a ``:`` and the three parts always split back apart: ids with colons,
percent signs, NUL bytes or newlines cannot collide, and the keys stay readable
in ``redis-cli``. The rows of one conversation are then::

    {prefix}agent-state:{conversation}          string, the checkpoint JSON
    {prefix}stream-supervision:{conversation}   hash: epoch, message_id, row, token, indexed
    {prefix}stream-recording:{conversation}     hash: epoch, message_id, event

each beside a decimal string that the scripts raise in the same step as every
accepted write and that never expires, so it outlives its row's delete and TTL,
named by the conversation's tombstone (``tether.domain.tombstones``: a keyed
hash, 64 hex digits), so that an erased conversation leaves no id behind::

    {prefix}agent-state-fence:{tombstone}       the checkpoint's fence
    {prefix}supervision-epoch:{tombstone}       the highest supervision epoch ever written
    {prefix}recording-fence:{tombstone}         the recording's fence

(one short key per conversation ever streamed, kept forever: epochs only grow;
``{prefix}tombstone-key`` holds the key's check value), and, with its
supervision row's TTL, one key per turn for ``find_by_message_id``::

    {prefix}supervision-message:{tenant}:{requester}:{message_id}   the session id

and, for ``list_stale_running``, one sorted set of the conversations whose
supervision row is RUNNING, scored by the heartbeat in microseconds since 1970
(exact in a double up to 2^53, the year 2255), kept by the supervision scripts
in the same step as the row (the row's hash then has a field ``indexed`` too)::

    {prefix}running-heartbeats                  zset: {conversation} by heartbeat

Keys carry no hash tag of their own (ids are percent-encoded, ``{`` too); a
prefix with one (``{tether}:``) puts every key, the set included, in one slot.

Every write to a recording, and every write to a supervision row that changes
its epoch or deletes it (not a heartbeat), publishes ``{conversation}``, a
newline and the kind of change (``r`` or ``s``) on the one channel
``{prefix}changes``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from urllib.parse import quote, unquote

from tether.domain.tombstones import TombstoneKey

DEFAULT_PREFIX = "tether:"


AGENT_STATE_FENCE = "agent-state-fence:"
SUPERVISION_EPOCH = "supervision-epoch:"
RECORDING_FENCE = "recording-fence:"
TOMBSTONE_KINDS = (AGENT_STATE_FENCE, SUPERVISION_EPOCH, RECORDING_FENCE)
"""What a key of each number kept for ever starts with, after the prefix."""

DEAD_TURNS = "dead turns"
"""The change channel's pseudo-conversation of ``announce_dead_turns``: it has
no ``:``, so it is no conversation (see ``KeyLayout.conversation``)."""


def encode_part(value: str) -> str:
    """``value`` percent-encoded: injective, and free of ``:``.

    ``surrogatepass`` keeps even a lone surrogate (which strict UTF-8 refuses)
    storable and distinct.
    """
    return quote(value.encode("utf-8", "surrogatepass"), safe="")


def decode_part(value: str) -> str:
    """The inverse of ``encode_part``."""
    return unquote(value, errors="surrogatepass")


@dataclass(frozen=True)
class KeyLayout:
    """The keys and the change channel under one prefix (used verbatim)."""

    prefix: str = DEFAULT_PREFIX
    tombstones: TombstoneKey = field(default_factory=TombstoneKey.from_env)

    @property
    def channel(self) -> str:
        """The pub/sub channel every supervision and recording write announces on."""
        return f"{self.prefix}changes"

    def conversation(self, tenant: str, requester_uuid: str | None, session_id: str) -> str:
        """The escaped conversation id; a missing requester is ``""``."""
        parts = (tenant, requester_uuid or "", session_id)
        return ":".join(encode_part(part) for part in parts)

    @staticmethod
    def conversation_ids(conversation: str) -> tuple[str, str | None, str]:
        """``conversation``'s ids back: ``(tenant, requester_uuid, session_id)``,
        a missing requester as None. Raises ``ValueError`` for anything that
        ``conversation`` did not make."""
        tenant, requester, session = (decode_part(part) for part in conversation.split(":"))
        return tenant, requester or None, session

    @property
    def running_heartbeats(self) -> str:
        """The sorted set of conversations with a RUNNING row, by heartbeat."""
        return f"{self.prefix}running-heartbeats"

    def presence_client(self, replica_id: str) -> str:
        """Not a key: the client name of a replica's presence connection
        (``tether.adapters.redis.presence``)."""
        return f"{self.prefix}presence:{replica_id}"

    def agent_state(self, conversation: str) -> str:
        return f"{self.prefix}agent-state:{conversation}"

    def supervision(self, conversation: str) -> str:
        return f"{self.prefix}stream-supervision:{conversation}"

    def recording(self, conversation: str) -> str:
        return f"{self.prefix}stream-recording:{conversation}"

    def supervision_message(self, tenant: str, requester_uuid: str | None, message_id: str) -> str:
        """The requester's turn ``message_id``: its session's id, with the row's TTL."""
        parts = (tenant, requester_uuid or "", message_id)
        return f"{self.prefix}supervision-message:" + ":".join(encode_part(p) for p in parts)

    def tombstone(self, conversation: str) -> str:
        """The tombstone of ``conversation`` (an escaped conversation id)."""
        return self.tombstones.of(*self.conversation_ids(conversation))

    def agent_state_fence(self, conversation: str) -> str:
        """No TTL: ``delete`` and ``state_ttl`` remove the checkpoint, never its fence."""
        return f"{self.prefix}{AGENT_STATE_FENCE}{self.tombstone(conversation)}"

    def supervision_epoch(self, conversation: str) -> str:
        """No TTL: the row's delete or expiry never loses its epoch."""
        return f"{self.prefix}{SUPERVISION_EPOCH}{self.tombstone(conversation)}"

    def recording_fence(self, conversation: str) -> str:
        """No TTL: the record's delete or expiry never lowers its fence."""
        return f"{self.prefix}{RECORDING_FENCE}{self.tombstone(conversation)}"

    @property
    def tombstone_key(self) -> str:
        """The check value of the key tombstones are made with (``TombstoneKey.check``)."""
        return f"{self.prefix}tombstone-key"
