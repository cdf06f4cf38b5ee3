"""What each store declares of its port's optional methods (``tether.domain.capabilities``),
and what the runtime and the contract kit make of it.

The shipped backends declare what they implement; a third-party adapter with
only the seed's methods declares nothing, and then gets each fallback (a 501,
no takeover loop, the local clock). The kit's report names, for such an
adapter, each capability as declared or not and whether its tests passed.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx2
import pytest

import tether
from tests.support.backends import Backend
from tests.support.inprocess import build, client_of, turn
from tests.support.seed_only import (
    SeedOnlyAgentStateStore,
    SeedOnlyConversationStore,
    SeedOnlyRecordingStore,
    SeedOnlySupervisionStore,
)
from tether import stores
from tether.adapters.memory import (
    InMemoryChatStreamRecordingStore,
    InMemoryChatStreamSupervisionStore,
)
from tether.domain.capabilities import (
    Capability,
    Port,
    StoreCapabilities,
    capabilities,
    optional_capabilities,
    supports,
)
from tether.domain.chat_stream_supervision_store import ChatStreamSupervisionStore
from tether.domain.store_bundle import StoreURLError
from tether.handlers.retention import prune_stores
from tether.runtime.turn_stores import TurnStores
from tether.testing.contracts import ManualClock

C = Capability

MISSING: dict[str, dict[str, set[Capability]]] = {
    "memory": {
        "recording": {C.RECORDING_WAIT_FOR_CHANGE},
        "supervision": {
            C.SUPERVISION_SWAP_MANY,
            C.SUPERVISION_FOR_ANOTHER_LOOP,
            C.SUPERVISION_SERVER_TIME,
            C.SUPERVISION_PRESENCE_LOCK,
        },
    },
    "file": {"supervision": {C.SUPERVISION_FOR_ANOTHER_LOOP, C.SUPERVISION_SERVER_TIME}},
    "sqlite": {"supervision": {C.SUPERVISION_FOR_ANOTHER_LOOP, C.SUPERVISION_SERVER_TIME}},
    "postgres": {},
    "redis": {},
}
"""What each shipped backend leaves to the port's defaults, by store; every
other optional capability of its stores is declared."""


def test_each_shipped_backend_declares_what_it_implements(backend: Backend, store_url: str) -> None:
    bundle = stores.from_url(store_url)
    found = bundle.capabilities()
    assert list(found) == ["state", "recording", "supervision", "conversation"]
    for name, declared in found.items():
        if name == "conversation" and not backend.has_conversations:
            assert declared.ports == frozenset() and declared.declared == frozenset()
            continue
        port = Port(name)
        assert declared.ports == {port}
        missing = MISSING[backend.name].get(name, set())
        assert set(declared.missing) == missing, (backend.name, name)
        assert declared.declared == set(optional_capabilities(port)) - missing
    supervision = found["supervision"]
    assert (C.SUPERVISION_SERVER_TIME in supervision) is backend.has_server_time


def test_a_store_with_only_the_seeds_methods_declares_nothing() -> None:
    for store, port in [
        (SeedOnlyAgentStateStore(), Port.AGENT_STATE),
        (SeedOnlyRecordingStore(), Port.RECORDING),
        (SeedOnlySupervisionStore(), Port.SUPERVISION),
        (SeedOnlyConversationStore(), Port.CONVERSATION),
    ]:
        found = capabilities(store)
        assert found.ports == {port}
        assert found.declared == frozenset()
        assert found.missing == optional_capabilities(port) == found.optional
        assert not any(supports(store, capability) for capability in Capability)


def test_a_missing_store_declares_nothing() -> None:
    assert capabilities(None).declared == frozenset()
    assert not supports(None, C.CONVERSATION_GET)


def test_a_method_set_back_to_the_ports_default_is_not_declared() -> None:
    class NoListing(InMemoryChatStreamSupervisionStore):
        list_stale_running = ChatStreamSupervisionStore.list_stale_running  # type: ignore[assignment]

    assert supports(InMemoryChatStreamSupervisionStore(), C.SUPERVISION_LIST_STALE_RUNNING)
    assert not supports(NoListing(), C.SUPERVISION_LIST_STALE_RUNNING)
    assert supports(NoListing(), C.SUPERVISION_FIND_BY_MESSAGE_ID)  # inherited


def test_it_is_decided_once_per_class() -> None:
    one, two = InMemoryChatStreamRecordingStore(), InMemoryChatStreamRecordingStore()
    assert StoreCapabilities.of(one) is StoreCapabilities.of(two)


def test_every_capability_names_an_optional_method_of_its_port() -> None:
    for capability in Capability:
        method = getattr(capability.port.interface, capability.method)
        assert not getattr(method, "__isabstractmethod__", False), capability
        assert capability.without, capability


# What the runtime does without them ------------------------------------------------------


def _seed_only_conversations() -> TurnStores:
    bundle = stores.from_url("memory://")
    return TurnStores(
        agent_state=bundle.agent_state_store,
        recording=bundle.chat_stream_recording_store,
        supervision=bundle.chat_stream_supervision_store,
        conversation=SeedOnlyConversationStore(),
    )


async def test_a_seed_only_conversation_store_serves_turns_and_answers_501_to_the_rest() -> None:
    held = _seed_only_conversations()
    app = build(held, clock=ManualClock())
    headers = {"requester-uuid": "alice"}
    async with client_of(app) as client:
        answered = await client.post(
            "/chat/response?tenant=t",
            json=turn("hi", session_id="s1", stateful=True),
            headers=headers,
        )
        assert answered.status_code == 201, answered.text
        assert held.conversation is not None
        transcript = await held.conversation.get_transcript("t", "alice", "s1")
        assert [m.content for m in transcript] == ["hi", "echo: hi"]
        refused: list[httpx2.Response] = [
            await client.get("/conversations?tenant=t", headers=headers),
            await client.get("/conversations/s1?tenant=t", headers=headers),
            await client.patch(
                "/conversations/s1?tenant=t", json={"shared": True}, headers=headers
            ),
            await client.delete("/conversations/s1?tenant=t", headers=headers),
        ]
    for response, what in zip(refused, ["list", "read", "read", "delete"], strict=True):
        assert response.status_code == 501, response.text
        assert response.json()["code"] == "NOT_IMPLEMENTED_BY_STORE"
        assert response.json()["message"] == f"the conversation store does not support {what}"


async def test_prune_says_a_store_cannot_list_conversations_by_age() -> None:
    with pytest.raises(StoreURLError, match="SeedOnlyConversationStore cannot list"):
        await prune_stores(
            _seed_only_conversations(),
            timedelta(days=1),
            dry_run=True,
            now=datetime.now(UTC),
            dead_after=timedelta(seconds=3),
        )


# The contract kit's report -----------------------------------------------------------------

_ADAPTER = '''
import pytest

from tether.adapters.memory import InMemoryChatStreamSupervisionStore
from tether.domain.chat_stream_supervision_store import ChatStreamSupervisionStore
from tether.testing.contracts import (
    ChatStreamSupervisionLookupContract,
    ChatStreamSupervisionStaleContract,
    ChatStreamSupervisionStoreContract,
)


class ThirdPartySupervisionStore(ChatStreamSupervisionStore):
    """The seed's methods, a working find_by_message_id, a broken list_stale_running."""

    def __init__(self):
        self._inner = InMemoryChatStreamSupervisionStore()

    async def compare_and_swap(self, *args):
        return await self._inner.compare_and_swap(*args)

    async def read(self, *args):
        return await self._inner.read(*args)

    async def delete(self, *args):
        await self._inner.delete(*args)

    async def find_by_message_id(self, *args):
        return await self._inner.find_by_message_id(*args)

    async def list_stale_running(self, heartbeat_before, limit):
        return []


class TestRequired(ChatStreamSupervisionStoreContract):
    @pytest.fixture
    def store(self):
        return ThirdPartySupervisionStore()


class TestLookups(ChatStreamSupervisionLookupContract):
    @pytest.fixture
    def store(self):
        return ThirdPartySupervisionStore()


class TestStale(ChatStreamSupervisionStaleContract):
    @pytest.fixture
    def store(self):
        return ThirdPartySupervisionStore()
'''


# Under xdist the workers send each report back through execnet, which refused
# the enums the report first carried (an internal error that stopped the run).
@pytest.mark.parametrize("workers", [[], ["-n", "2"]], ids=["one process", "xdist"])
def test_the_kit_reports_what_a_third_party_adapter_declares_and_passed(
    tmp_path: Path, workers: list[str]
) -> None:
    (tmp_path / "conftest.py").write_text(
        'pytest_plugins = ["tether.testing.contracts.report"]\n', encoding="utf-8"
    )
    (tmp_path / "test_adapter.py").write_text(textwrap.dedent(_ADAPTER), encoding="utf-8")
    source = Path(tether.__file__).resolve().parents[1]
    ran = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *workers, str(tmp_path)],
        cwd=tmp_path,
        env={"PYTHONPATH": str(source), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert ran.returncode == 1, ran.stdout + ran.stderr  # the broken listing fails
    section = ran.stdout.split("tether store capabilities", 1)[1]
    rows = {
        line.split()[0]: line.split(None, 1)[1].split()
        for line in section.splitlines()[1:]
        if line.startswith("  ") and line.split()[0] != "required"
    }
    assert "ThirdPartySupervisionStore (supervision)" in section
    assert section.splitlines()[2].split()[-2] == "passed"  # the required methods
    assert rows["supervision.find_by_message_id"][:2] == ["declared", "passed"]
    assert rows["supervision.list_stale_running"][:2] == ["declared", "FAILED"]
    assert rows["supervision.compare_and_swap_many"][:2] == ["default", "passed"]
    assert rows["supervision.last_epoch"] == [
        "default",
        "not",
        "run",
        "(ChatStreamSupervisionEpochContract)",
    ]
    assert rows["supervision.presence_lock"] == ["default", "no", "contract", "in", "the", "kit"]
    assert set(rows) == {c.value for c in optional_capabilities(Port.SUPERVISION)}
