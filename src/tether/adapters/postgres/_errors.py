"""The PostgreSQL driver's errors as tether's store errors, and conflicts run again.

Every call into psycopg goes through :func:`translated`: a server that cannot
be reached, or does not answer in time, is ``StoreUnavailableError``; anything
else it refuses is ``StoreError``, with the driver's error as ``__cause__``.
A statement PostgreSQL aborted as a deadlock or serialization victim changed
nothing, so it is always safe to send again (:func:`again_on_conflict`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import TypeVar

import psycopg

from tether.domain.store_errors import StoreError, StoreUnavailableError

logger = logging.getLogger(__name__)

_T = TypeVar("_T")

_CONFLICT_ATTEMPTS = 3


class LostConflictError(StoreError):
    """A statement lost a deadlock or serialization conflict (and changed nothing)."""


@asynccontextmanager
async def translated(
    url: str, within: float | None, unavailable: str = "is unavailable"
) -> AsyncIterator[None]:
    """Driver errors (and taking longer than ``within`` s) out as tether's store
    errors, naming the server by ``url`` (its password masked)."""
    try:
        async with asyncio.timeout(within):
            yield
    except StoreError:
        raise
    except TimeoutError as error:
        raise StoreUnavailableError(
            f"PostgreSQL at {url} {unavailable}: no answer within {within:g} s"
        ) from error
    except psycopg.errors.TransactionRollback as error:
        raise LostConflictError(f"PostgreSQL at {url}: {error}") from error
    except (psycopg.OperationalError, psycopg.InterfaceError, OSError) as error:
        raise StoreUnavailableError(f"PostgreSQL at {url} {unavailable}: {error}") from error
    except psycopg.Error as error:
        raise StoreError(f"PostgreSQL at {url} refused the request: {error}") from error


async def again_on_conflict(work: Callable[[], Awaitable[_T]], what: str) -> _T:
    """``await work()``, run again while it loses a conflict, up to three times
    in all; ``what`` (a statement, a transaction) names it in the log."""
    for attempt in range(1, _CONFLICT_ATTEMPTS + 1):
        try:
            return await work()
        except LostConflictError:
            if attempt == _CONFLICT_ATTEMPTS:
                raise
            logger.info("%s lost a conflict; running it again (%d)", what, attempt)
    raise AssertionError("unreachable")
