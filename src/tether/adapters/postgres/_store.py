"""What the four PostgreSQL stores share: one database, held open while a store is open."""

from __future__ import annotations

from types import TracebackType
from typing import Self

from tether.adapters.postgres.database import PostgresDatabase


class PostgresStore:
    """A store on a shared :class:`PostgresDatabase`.

    ``open()`` and ``aclose()`` are idempotent per store and reference-counted on
    the database, so ``setup_app`` (which opens each distinct store once) opens
    the shared pool once and closes it after the last store. ``async with``
    works too.
    """

    def __init__(self, database: PostgresDatabase) -> None:
        self._database = database
        self._holding = False

    @property
    def database(self) -> PostgresDatabase:
        """The database this store runs on (shared with the other stores of a bundle)."""
        return self._database

    async def open(self) -> None:
        """Open the shared database if no other store has yet. Idempotent."""
        if not self._holding:
            await self._database.retain()
            self._holding = True

    async def aclose(self) -> None:
        """Let go of the database; the last store to let go closes it. Idempotent."""
        if self._holding:
            self._holding = False
            await self._database.release()

    async def __aenter__(self) -> Self:
        await self.open()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.aclose()
