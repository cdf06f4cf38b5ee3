"""Replica presence by ``flock``, for the stores whose replicas share a host
(SQLite, the file store): one lock file per replica in a directory of the
store's (``tether.runtime.presence``).

The kernel drops a dead process's ``flock`` at once, and never a live one's.
A holder's file is removed by the replica that finds it free, and by the
holder at a clean exit; a missing file is not judged (it may be another
host's directory of the same name), so it counts as held.
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Collection
from pathlib import Path

from tether.domain.chat_stream_supervision_store import PresenceLock, is_replica_id


class FlockPresenceLock(PresenceLock):
    """Presence by an ``flock`` on ``{directory}/{replica id}.lock``."""

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self._directory = Path(directory)
        self._held: tuple[int, Path] | None = None

    async def hold(self, replica_id: str) -> None:
        self._directory.mkdir(parents=True, exist_ok=True)
        path = self._directory / f"{replica_id}.lock"
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BaseException:
            os.close(fd)
            raise
        self._held = (fd, path)

    async def find_free(self, replica_ids: Collection[str]) -> set[str]:
        free = set()
        for replica_id in replica_ids:
            if not is_replica_id(replica_id):
                continue
            path = self._directory / f"{replica_id}.lock"
            try:
                fd = os.open(path, os.O_RDWR)
            except FileNotFoundError:
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                continue  # held: the process lives
            finally:
                # Closing drops the lock we may have just taken.
                os.close(fd)
            free.add(replica_id)
            path.unlink(missing_ok=True)
        return free

    async def release(self) -> None:
        if self._held is None:
            return
        fd, path = self._held
        self._held = None
        path.unlink(missing_ok=True)
        os.close(fd)
