"""The fixtures that run a test once per backend, shared by every module that does.

A module picks its backends by defining its own ``backend`` fixture (or by
``pytest.mark.parametrize("backend", ..., indirect=True)``); ``places``,
``store_url`` and ``bundle`` follow whichever ``backend`` the test gets.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from tests.support.backends import (
    BACKENDS,
    Backend,
    SharedPlaces,
    bundle_of,
    open_bundle,
    shared_places,
)
from tether.stores import StoreBundle
from tether.testing.contracts import ManualClock


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> Backend:
    """The backend under test: every shipped one unless the module narrows it."""
    chosen: Backend = request.param
    return chosen


@pytest.fixture(scope="module")
def places() -> Iterator[SharedPlaces]:
    """What each backend's tests of one module share (PostgreSQL: one database)."""
    with shared_places() as shared:
        yield shared


@pytest.fixture
def store_url(backend: Backend, places: SharedPlaces, tmp_path: Path) -> Iterator[str]:
    """Where this test's stores live; every test works under fresh ids anyway."""
    with backend.url(places.of(backend), tmp_path) as url:
        yield url


@pytest.fixture
def clock() -> ManualClock:
    """The conversation store's clock."""
    return ManualClock()


@pytest.fixture
async def bundle(
    backend: Backend, store_url: str, clock: ManualClock
) -> AsyncIterator[StoreBundle]:
    """The backend's stores, opened; closed after the test."""
    async with open_bundle(bundle_of(backend, store_url, clock)) as opened:
        yield opened
