"""What a file store keeps of a conversation for ever: a number, in a file named by its tombstone.

Epochs only grow, also after a conversation's rows are removed (design
invariant 2), so each file store keeps one number per conversation for ever:
the supervision store its highest epoch, the recording and checkpoint stores
their fences. An erase must leave no id, owner or tenant in plain form
(invariant 14), so that number lives in a file named by the conversation's
tombstone (``tether.domain.tombstones``: an HMAC-SHA256 of its ids with
``TETHER_TOMBSTONE_KEY``), never in one named after its ids::

    {base}/{kind}/{tombstone[:2]}/{tombstone}.json      {"<field>": n}

(the first two hex digits are a directory, so that no directory holds more
than a 256th of them). The file is only ever written under the lock of the
conversation's row, so the row lock that orders a store's read-check-write
orders its number too; it is replaced atomically and fsynced, because the
row it stands for is removed right after, and an epoch must not go back
after an OS crash either.

``{base}/tombstone-key.json`` holds the key's check value
(``TombstoneKey.check``): recorded on a store's first use of a number
(``open``, or its first read or write), compared on every later start, so a
replica with another key fails loudly instead of finding no numbers and
granting epochs again.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tether.adapters.file._files import create_json, read_json, write_json
from tether.adapters.file._paths import child_path
from tether.domain.store_errors import StoreCorruptedError, StoreError
from tether.domain.tombstones import TombstoneKey, TombstoneKeyError

KEY_CHECK_FILE = "tombstone-key.json"
"""The file in a store's base directory holding the key's check value."""
_CHECK_VALUE = "check_value"


class KeptNumbers:
    """One file store's number per conversation, in files named by tombstone.

    ``kind`` names the directory (one per store, so stores sharing a base
    directory keep theirs apart), ``field`` the number's key in each file.
    """

    def __init__(self, base: Path, kind: str, field: str, key: TombstoneKey) -> None:
        self._base = base
        self._directory = child_path(base, kind)
        self._field = field
        self._key = key
        self._verified = False

    def of(self, tenant: str, requester_uuid: str | None, session_id: str) -> KeptNumber:
        """The number of conversation ``(tenant, requester_uuid, session_id)``."""
        return KeptNumber(self, (tenant, requester_uuid, session_id))

    def verify(self) -> None:
        """Record the key's check value if the store has none; raise
        ``StoreError`` when it was recorded with another key. Blocking; done
        once per instance (the value never changes once recorded)."""
        if self._verified:
            return
        path = child_path(self._base, KEY_CHECK_FILE)
        recorded = _check_value(path)
        if recorded is None:
            # Of the processes racing here, one records its check value, and
            # every other compares with it.
            create_json(path, {_CHECK_VALUE: self._key.check})
            recorded = _check_value(path)
        try:
            self._key.verify(recorded, f"file store {self._base}")
        except TombstoneKeyError as error:
            raise StoreError(str(error)) from error
        self._verified = True

    def _path(self, ids: tuple[str, str | None, str]) -> Path:
        tombstone = self._key.of(*ids)
        return child_path(self._directory, tombstone[:2], f"{tombstone}.json")

    def read(self, ids: tuple[str, str | None, str]) -> int:
        """The number kept for the conversation ``ids``; 0 when none was."""
        self.verify()
        path = self._path(ids)
        document = read_json(path)
        if document is None:
            return 0
        number = document.get(self._field) if isinstance(document, dict) else None
        if (
            not isinstance(number, int)
            or isinstance(number, bool)
            or document.keys() != {self._field}
        ):
            raise StoreCorruptedError(
                f'{path} does not hold {{"{self._field}": integer}}; left as is'
            )
        return number

    def write(self, ids: tuple[str, str | None, str], number: int) -> None:
        """Keep ``number`` for the conversation ``ids`` (atomically, durably)."""
        self.verify()
        write_json(self._path(ids), {self._field: number}, durable=True)


@dataclass(frozen=True)
class KeptNumber:
    """One conversation's kept number; its file's name (a keyed hash) is only
    worked out when it is read or written, inside the store's thread call.

    Read and write it only under the conversation's row lock, but for a
    lock-free reader that found no row: the number is written before the row
    is removed, so such a reader finds one or the other.
    """

    numbers: KeptNumbers
    ids: tuple[str, str | None, str]

    def read(self) -> int:
        """The number; 0 when none was kept."""
        return self.numbers.read(self.ids)

    def write(self, number: int) -> None:
        """Keep ``number`` (atomically, durably)."""
        self.numbers.write(self.ids, number)


def _check_value(path: Path) -> str | None:
    document = read_json(path)
    if document is None:
        return None
    value = document.get(_CHECK_VALUE) if isinstance(document, dict) else None
    if not isinstance(value, str):
        raise StoreCorruptedError(f'{path} does not hold {{"{_CHECK_VALUE}": text}}; left as is')
    return value
