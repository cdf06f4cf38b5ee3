"""The clusters tests run replicas in, each defined once (``tests/conftest.py``
registers them): a module says which it needs, and how, with a mark or an
indirect parameter, never with a fixture body of its own.

In process, for one test (the replicas are ``ChatHandler``s, see ``ScriptedCluster``):

- ``cluster``: over one set of in-memory stores and one manual clock;
- ``backend_cluster``: the same over the ``backend`` fixture's real stores
  (its ``bundle``, opened), so once per backend the module gives ``backend``;
  a backend without a conversation store (Redis) gets an in-memory one.

Both take ``@pytest.mark.cluster(**options)`` on the module (``pytestmark``)
or on the test (the test's wins, whole): ``ScriptedCluster``'s keywords, i.e.
any ``TetherSettings`` field (``takeover_scan_interval``, ``presence``...) and
``conversation``, ``push``; an indirect parameter (a dict of them) adds to
the mark's.

Real server processes of the test project (``tests/support/project.py``), for a module:

- ``replica_cluster``: two replicas (``Replicas``);
- ``crash_test_cluster``: ``size`` replicas as ``tether crash-test`` runs them
  (``tether.crashtest.cluster.Cluster``);
- ``replicas``: the module's cluster of the two (``crash_test_cluster`` where
  its mark says ``crash_test=True``) with every replica up again (a test
  before may have killed one).

They take ``@pytest.mark.replica_cluster(**options)`` on the module: the
project's pacing (``make_project``'s keywords, ``variants`` among them), ``env``
(a value may name a replica's URL as ``{one}`` or ``{two}``), ``tool_log=True``
(``TETHER_TEST_TOOL_LOG`` in the cluster's directory) and, for
``crash_test_cluster``, ``size`` (2). Their stores are ``replica_backend``'s:
SQLite, unless the module parametrizes it
(``pytest.mark.parametrize("replica_backend", [...], indirect=True, scope="module")``
with ``file``, ``sqlite``, ``postgres``, ``redis-streams``). Their project is
``replica_project``'s, which a module overrides for a project of its own.

Without the replicas, for code that takes stores (retention's runners):
``replica_stores``, what two replicas of the ``backend`` fixture's backend hold.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import AsyncExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.support.backends import Backend, SharedPlaces, bundle_of, open_bundle
from tests.support.project import make_project
from tests.support.replicas import Replicas, two_replicas
from tests.support.scripted import ScriptedCluster
from tests.support.services import postgres_database, redis_prefix
from tether.adapters.memory import InMemoryChatConversationStore
from tether.crashtest.cluster import Cluster
from tether.runtime.turn_stores import TurnStores
from tether.stores import StoreBundle, compose
from tether.testing.contracts import ManualClock

# In process -----------------------------------------------------------------------------


def _options(request: pytest.FixtureRequest, mark: str) -> dict[str, Any]:
    """The closest ``mark``'s keywords, updated by an indirect parameter's (a dict)."""
    marker = request.node.get_closest_marker(mark)
    options = dict(marker.kwargs) if marker is not None else {}
    return options | getattr(request, "param", {})


@contextlib.asynccontextmanager
async def _staged(cluster: ScriptedCluster) -> AsyncIterator[ScriptedCluster]:
    try:
        yield cluster
    finally:
        await cluster.aclose()


@pytest.fixture
async def cluster(request: pytest.FixtureRequest) -> AsyncIterator[ScriptedCluster]:
    """In-process replicas over in-memory stores (``@pytest.mark.cluster`` options)."""
    async with _staged(ScriptedCluster(**_options(request, "cluster"))) as staged:
        yield staged


@pytest.fixture
async def backend_cluster(
    request: pytest.FixtureRequest, bundle: StoreBundle
) -> AsyncIterator[ScriptedCluster]:
    """In-process replicas over the ``backend`` fixture's stores (``@pytest.mark.cluster``
    options); the replicas' clock is still the cluster's manual one."""
    stores = TurnStores(
        agent_state=bundle.agent_state_store,
        recording=bundle.chat_stream_recording_store,
        supervision=bundle.chat_stream_supervision_store,
        conversation=bundle.chat_conversation_store or InMemoryChatConversationStore(),
    )
    async with _staged(ScriptedCluster(stores=stores, **_options(request, "cluster"))) as staged:
        yield staged


@dataclass(frozen=True)
class ReplicaStores:
    """The stores two replicas of one backend hold: ``b`` opened on its own
    where the backend is shared by processes (else the same as ``a``)."""

    a: TurnStores
    b: TurnStores
    clock: ManualClock
    """What the conversation stores stamp times with."""
    tenant: str
    """A tenant of this test's own (a module's tests may share a database)."""


@pytest.fixture
async def replica_stores(
    backend: Backend, places: SharedPlaces, tmp_path: Path
) -> AsyncIterator[ReplicaStores]:
    """Two replicas' stores of the ``backend`` fixture's backend, opened; one
    in-memory conversation store for both where the backend has none (Redis)."""
    clock = ManualClock()
    fallback = InMemoryChatConversationStore(clock=clock)
    async with AsyncExitStack() as stack:
        url = stack.enter_context(backend.url(places.of(backend), tmp_path))
        first = await stack.enter_async_context(open_bundle(bundle_of(backend, url, clock)))
        second = first
        if backend.shared_by_processes:
            second = await stack.enter_async_context(open_bundle(bundle_of(backend, url, clock)))
        a, b = (
            TurnStores(
                agent_state=bundle.agent_state_store,
                recording=bundle.chat_stream_recording_store,
                supervision=bundle.chat_stream_supervision_store,
                conversation=bundle.chat_conversation_store or fallback,
            )
            for bundle in (first, second)
        )
        yield ReplicaStores(a, b, clock, tenant=f"t-{uuid.uuid4().hex[:12]}")


# Real processes -------------------------------------------------------------------------


@dataclass(frozen=True)
class ReplicaBackend:
    """Where a module's replicas keep their stores: one URL, and maybe a stream override."""

    name: str
    store_url: str
    stream_url: str | None = None

    def serve_args(self) -> list[str]:
        return ["--stream-store", self.stream_url] if self.stream_url else []

    @contextlib.asynccontextmanager
    async def stores(self) -> AsyncIterator[StoreBundle]:
        """The same stores, opened from the test process, to inspect raw rows."""
        bundle = compose(self.store_url, stream=self.stream_url)
        distinct = {id(s): s for s in bundle.setup_kwargs().values() if s is not None}
        for store in distinct.values():
            if hasattr(store, "open"):
                await store.open()
        try:
            yield bundle
        finally:
            for store in distinct.values():
                if hasattr(store, "aclose"):
                    await store.aclose()


@pytest.fixture(scope="module")
def replica_backend(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ReplicaBackend]:
    """The module's replicas' stores: ``request.param`` names the backend
    (an indirect parameter), SQLite without one."""
    name = getattr(request, "param", "sqlite")
    directory = tmp_path_factory.mktemp("store")
    if name == "file":
        yield ReplicaBackend(name, f"file://{directory}")
    elif name == "sqlite":
        yield ReplicaBackend(name, f"sqlite:///{directory}/tether.db")
    elif name == "postgres":
        with postgres_database() as postgres_url:
            yield ReplicaBackend(name, postgres_url)
    elif name == "redis-streams":
        with redis_prefix() as redis_url:
            yield ReplicaBackend(name, f"file://{directory}", stream_url=redis_url)
    else:
        raise AssertionError(name)


_CLUSTER_OPTIONS = ("env", "tool_log", "size", "crash_test")


@pytest.fixture(scope="module")
def replica_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The module's replicas' directory: their project, logs and tool log."""
    return tmp_path_factory.mktemp("replicas")


@pytest.fixture(scope="module")
def replica_project(request: pytest.FixtureRequest, replica_root: Path) -> Path:
    """The test project, paced as ``@pytest.mark.replica_cluster`` says."""
    options = _options(request, "replica_cluster")
    pacing = {k: v for k, v in options.items() if k not in _CLUSTER_OPTIONS}
    return make_project(replica_root / "project", **pacing)


def _env(request: pytest.FixtureRequest, root: Path) -> dict[str, str]:
    options = _options(request, "replica_cluster")
    env: dict[str, str] = dict(options.get("env", {}))
    if options.get("tool_log"):
        env["TETHER_TEST_TOOL_LOG"] = str(root / "tools.log")
    return env


@pytest.fixture(scope="module")
def replica_cluster(
    request: pytest.FixtureRequest,
    replica_project: Path,
    replica_backend: ReplicaBackend,
    replica_root: Path,
) -> Iterator[Replicas]:
    """Two replicas of ``replica_project`` on ``replica_backend``'s stores."""
    with two_replicas(
        replica_project,
        replica_root,
        replica_backend.store_url,
        env=_env(request, replica_root),
        extra_args=replica_backend.serve_args(),
    ) as started:
        yield started


@pytest.fixture
def replicas(request: pytest.FixtureRequest, replica_backend: ReplicaBackend) -> Replicas | Cluster:
    """The module's replicas (``crash_test_cluster``'s where its mark says
    ``crash_test=True``, else ``replica_cluster``'s), each up again if a test
    before killed it. (It names ``replica_backend`` so that a module can
    parametrize that.)"""
    if _options(request, "replica_cluster").get("crash_test"):
        crash_test: Cluster = request.getfixturevalue("crash_test_cluster")
        for replica in crash_test.replicas:
            if not replica.alive:
                asyncio.run(replica.start())
        return crash_test
    two: Replicas = request.getfixturevalue("replica_cluster")
    two.restart()
    return two


@pytest.fixture(scope="module")
def crash_test_cluster(
    request: pytest.FixtureRequest,
    replica_project: Path,
    replica_backend: ReplicaBackend,
    replica_root: Path,
) -> Iterator[Cluster]:
    """``size`` replicas of ``replica_project`` as ``tether crash-test`` runs them."""
    started = Cluster(
        replica_project,
        replica_backend.store_url,
        size=_options(request, "replica_cluster").get("size", 2),
        workdir=replica_root,
        env=_env(request, replica_root),
        stream_store_url=replica_backend.stream_url,
    )
    asyncio.run(started.start())
    try:
        yield started
    finally:
        started.stop()
