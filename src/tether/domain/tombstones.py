"""What a conversation's epoch and fences are kept under: a keyed hash, never its ids.

Epochs only grow, also after a conversation is erased (design invariant 2): a
producer paused past the erase must find its epoch fenced, and a new
conversation with the same id must start above every epoch granted before.
So each store keeps a few numbers per conversation for ever: the highest
supervision epoch, the recording's fence, the checkpoint's fence. Erasure
must leave no id, owner or tenant in plain form (invariant 14), so those
numbers are kept under ``TombstoneKey.of(tenant, requester, session)``, an
HMAC-SHA256 of the three ids with a server secret, and hold nothing else.

The secret is ``TETHER_TOMBSTONE_KEY``. Every replica sharing a store must
have the same one, and it must never change: under another key a
conversation's numbers are not found, and its epochs would start again. Each
store that keeps numbers on disk records a check value on first use and
refuses to open with another key (``check``), so a replica started with the
wrong key fails at once instead of fencing nothing. Unset, the key is a
fixed one (``DERIVED_DEFAULT``), the same in every tether: the tombstones
still name no id, but whoever can read the store and guesses all three ids of
a conversation can tell it existed. Set a secret of your own for that.
"""

from __future__ import annotations

import hashlib
import hmac
import os
from collections.abc import Mapping

ENV = "TETHER_TOMBSTONE_KEY"
DERIVED_DEFAULT = b"tether tombstones: set TETHER_TOMBSTONE_KEY for a secret of your own"
"""The key when none is set (see the module): public, so pseudonymous only."""
MINIMUM_LENGTH = 16
"""Characters a configured key must have at least."""
_CHECK = (b"tether", b"tombstone key check", b"")
"""Ids no conversation can have (a tenant with no requester and no session
is refused at the edge): their hash identifies the key without revealing it."""


class TombstoneKeyError(ValueError):
    """A configured key that cannot be used, or a store written with another."""


class TombstoneKey:
    """The keyed hash conversations' epochs and fences are stored under."""

    def __init__(self, secret: bytes) -> None:
        if not secret:
            raise TombstoneKeyError(f"{ENV} is empty")
        self._secret = secret

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> TombstoneKey:
        """The key ``TETHER_TOMBSTONE_KEY`` names, or ``DERIVED_DEFAULT``."""
        raw = (os.environ if environ is None else environ).get(ENV)
        if raw is None or raw == "":
            return cls(DERIVED_DEFAULT)
        if len(raw) < MINIMUM_LENGTH:
            raise TombstoneKeyError(
                f"{ENV} must have at least {MINIMUM_LENGTH} characters (a random secret, "
                f"the same on every replica); it has {len(raw)}"
            )
        return cls(raw.encode("utf-8", "surrogatepass"))

    def of(self, tenant: str, requester_uuid: str | None, session_id: str) -> str:
        """The tombstone of conversation ``(tenant, requester, session)``: 64 hex digits."""
        return self.of_bytes(*(_bytes(part) for part in (tenant, requester_uuid, session_id)))

    def of_bytes(self, tenant: bytes, requester_uuid: bytes, session_id: bytes) -> str:
        """``of`` for ids already encoded as UTF-8 (``surrogatepass``), as the
        SQLite backend binds them."""
        mac = hmac.new(self._secret, digestmod=hashlib.sha256)
        for part in (tenant, requester_uuid, session_id):
            # Length-prefixed, so no two id triples give the same input.
            mac.update(len(part).to_bytes(8, "big"))
            mac.update(part)
        return mac.hexdigest()

    @property
    def check(self) -> str:
        """A value that tells keys apart (what a store records on first use)."""
        return self.of_bytes(*_CHECK)

    def verify(self, recorded: str | None, store: str) -> None:
        """Raise ``TombstoneKeyError`` unless ``recorded`` (a store's check
        value, None when it has none yet) was made with this key."""
        if recorded is not None and not hmac.compare_digest(recorded, self.check):
            raise TombstoneKeyError(
                f"{store} keeps its epochs under another {ENV} than this replica's: every "
                "replica must use the key the store was first used with"
            )


def _bytes(value: str | None) -> bytes:
    return (value or "").encode("utf-8", "surrogatepass")
