"""The flow rules of ``MCPOAuthIntegrationStore``, over a repository, with a hand-moved clock.

Expired pendings are gone and cleaned up on read; a state is consumed once;
tokens landing clear the pending; an expired token is refreshed by one caller
of many; a refresh refused for good drops the tokens, a transient failure
keeps them; the file store defaults to the store directory.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from tether.adapters.mcp import (
    InMemoryMCPOAuthRepository,
    MCPOAuthCipher,
    MCPOAuthClient,
    MCPOAuthClientInfoRecord,
    MCPOAuthIntegrationStore,
    MCPOAuthRefreshLease,
    MCPOAuthRefreshUnavailableError,
    MCPOAuthRepository,
    MCPOAuthSettings,
    MCPOAuthTokenClient,
    MCPOAuthTokenError,
    MCPOAuthTokens,
    MCPUserIntegrationRecord,
    generate_encryption_key,
    get_local_file_mcp_oauth_integration_store,
)
from tether.adapters.mcp.client_registration import Register
from tether.adapters.mcp.records import REGISTRATIONS_FIELD
from tether.domain.store_errors import StoreUnavailableError
from tether.testing.contracts import ManualClock
from tether.testing.contracts.mcp_oauth import pending, tokens

KEY = generate_encryption_key()


class _Refresher(MCPOAuthTokenClient):
    """A token client whose refresh is scripted and counted (the HTTP side is tested
    against a real authorization server elsewhere)."""

    def __init__(self, clock: ManualClock, *, fail: MCPOAuthTokenError | None = None) -> None:
        super().__init__(clock=clock)
        self.refreshed: list[str | None] = []
        self.fail = fail
        self.gate = asyncio.Event()
        self.gate.set()

    async def refresh(self, tokens: MCPOAuthTokens, client: MCPOAuthClient) -> MCPOAuthTokens:
        self.refreshed.append(tokens.refresh_token)
        await self.gate.wait()
        if self.fail is not None:
            raise self.fail
        return tokens.model_copy(
            update={
                "access_token": f"new-{len(self.refreshed)}",
                "refresh_token": f"rotated-{len(self.refreshed)}",
                "expires_at": self.clock() + timedelta(hours=1),
            }
        )


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def repository() -> InMemoryMCPOAuthRepository:
    return InMemoryMCPOAuthRepository(MCPOAuthCipher([KEY]))


@pytest.fixture
def store(repository: InMemoryMCPOAuthRepository, clock: ManualClock) -> MCPOAuthIntegrationStore:
    async def sleep(seconds: float) -> None:
        # Waiting moves the clock; a millisecond of real time lets the others run.
        clock.advance(seconds)
        await asyncio.sleep(0.001)

    settings = MCPOAuthSettings(refresh_margin=30, refresh_lease=30, refresh_wait=5)
    return MCPOAuthIntegrationStore(repository, settings=settings, clock=clock, sleep=sleep)


async def _begin(store: MCPOAuthIntegrationStore, user: str = "alice") -> str:
    started = pending("t", user, "srv").model_copy(update={"expires_at": store.pending_expiry()})
    await store.begin_authorization(started)
    return started.state


async def _connect(
    store: MCPOAuthIntegrationStore, clock: ManualClock, *, expires_in: float = 3600
) -> MCPOAuthTokens:
    granted = tokens().model_copy(update={"expires_at": clock() + timedelta(seconds=expires_in)})
    await store.save_user_integration(
        MCPUserIntegrationRecord(tenant="t", user_uuid="alice", server_name="srv", tokens=granted)
    )
    return granted


def test_the_pending_lifetime_defaults_to_ten_minutes_and_is_a_setting() -> None:
    repository = InMemoryMCPOAuthRepository(MCPOAuthCipher([KEY]))
    assert MCPOAuthIntegrationStore(repository).pending_ttl == timedelta(minutes=10)
    assert MCPOAuthSettings.from_env({"TETHER_MCP_PENDING_TTL": "42"}).pending_ttl == 42
    configured = MCPOAuthIntegrationStore(repository, settings=MCPOAuthSettings(pending_ttl=5))
    assert configured.pending_ttl == timedelta(seconds=5)
    with pytest.raises(ValueError, match="TETHER_MCP_PENDING_TTL"):
        MCPOAuthSettings.from_env({"TETHER_MCP_PENDING_TTL": "soon"})


async def test_an_expired_pending_is_gone_and_cleaned_up_on_read(
    store: MCPOAuthIntegrationStore, repository: InMemoryMCPOAuthRepository, clock: ManualClock
) -> None:
    state = await _begin(store)
    assert await store.find_user_integration_by_pending_state(state) is not None
    clock.advance(601)
    assert await store.get_user_integration("t", "alice", "srv") is None
    assert await repository.get_user_integration("t", "alice", "srv") is None, "cleaned up"
    state = await _begin(store)
    clock.advance(601)
    assert await store.find_user_integration_by_pending_state(state) is None
    assert await repository.find_user_integration_by_pending_state(state) is None
    await _begin(store)
    clock.advance(601)
    assert await store.list_user_integrations("t", "alice") == []
    assert await repository.list_user_integrations("t", "alice") == []


async def test_an_expired_pending_leaves_the_tokens_alone(
    store: MCPOAuthIntegrationStore, repository: InMemoryMCPOAuthRepository, clock: ManualClock
) -> None:
    granted = await _connect(store, clock)
    record = await repository.get_user_integration("t", "alice", "srv")
    assert record is not None
    stale = pending("t", "alice", "srv").model_copy(update={"expires_at": clock()})
    await repository.save_user_integration(record.model_copy(update={"pending": stale}))
    found = await store.get_user_integration("t", "alice", "srv")
    assert found is not None and found.pending is None and found.tokens == granted
    raw = await repository.get_user_integration("t", "alice", "srv")
    assert raw is not None and raw.pending is None and raw.tokens == granted


async def test_a_state_is_consumed_once(store: MCPOAuthIntegrationStore) -> None:
    state = await _begin(store)
    taken = await asyncio.gather(*(store.consume_pending(state) for _ in range(5)))
    assert sum(item is not None for item in taken) == 1
    assert await store.consume_pending(state) is None
    assert await store.consume_pending("never issued") is None


async def test_an_expired_state_cannot_be_consumed(
    store: MCPOAuthIntegrationStore, clock: ManualClock
) -> None:
    state = await _begin(store)
    clock.advance(600)
    assert await store.consume_pending(state) is None


async def test_tokens_landing_clear_the_pending(store: MCPOAuthIntegrationStore) -> None:
    state = await _begin(store)
    taken = await store.consume_pending(state)
    assert taken is not None
    await _begin(store)  # the user clicked twice: a newer link is pending
    await store.complete_authorization(taken, tokens())
    record = await store.get_user_integration("t", "alice", "srv")
    assert record is not None and record.pending is None and record.tokens is not None
    both = MCPUserIntegrationRecord(
        tenant="t", user_uuid="bob", server_name="srv", pending=pending("t", "bob", "srv"),
        tokens=tokens(),
    )  # fmt: skip
    await store.save_user_integration(both)
    saved = await store.get_user_integration("t", "bob", "srv")
    assert saved is not None and saved.pending is None


async def test_fresh_tokens_are_returned_without_a_refresh(
    store: MCPOAuthIntegrationStore, clock: ManualClock
) -> None:
    granted = await _connect(store, clock)
    client = _Refresher(clock)
    assert await store.fresh_tokens("t", "alice", "srv", client) == granted
    assert client.refreshed == []
    assert await store.fresh_tokens("t", "nobody", "srv", client) is None


async def test_many_callers_of_an_expired_token_refresh_it_once(
    store: MCPOAuthIntegrationStore, clock: ManualClock
) -> None:
    granted = await _connect(store, clock, expires_in=10)  # inside the 30 s margin
    client = _Refresher(clock)
    client.gate.clear()
    callers = [
        asyncio.ensure_future(store.fresh_tokens("t", "alice", "srv", client)) for _ in range(6)
    ]
    await asyncio.sleep(0.01)
    client.gate.set()
    results = await asyncio.gather(*callers)
    assert client.refreshed == [granted.refresh_token]
    assert {r.access_token for r in results if r is not None} == {"new-1"}
    record = await store.get_user_integration("t", "alice", "srv")
    assert record is not None and record.refresh_lease is None
    assert record.tokens is not None and record.tokens.refresh_token == "rotated-1"


async def test_a_rejected_access_token_forces_one_refresh(
    store: MCPOAuthIntegrationStore, clock: ManualClock
) -> None:
    granted = await _connect(store, clock)
    client = _Refresher(clock)
    fresh = await store.fresh_tokens(
        "t", "alice", "srv", client, rejected_access_token=granted.access_token
    )
    assert fresh is not None and fresh.access_token == "new-1"
    # A caller still holding the old token finds the new one instead of refreshing again.
    again = await store.fresh_tokens(
        "t", "alice", "srv", client, rejected_access_token=granted.access_token
    )
    assert again == fresh and len(client.refreshed) == 1


async def test_a_refresh_refused_for_good_drops_the_tokens(
    store: MCPOAuthIntegrationStore, repository: InMemoryMCPOAuthRepository, clock: ManualClock
) -> None:
    await _connect(store, clock, expires_in=0)
    refused = MCPOAuthTokenError("invalid_grant", permanent=True, error="invalid_grant")
    assert await store.fresh_tokens("t", "alice", "srv", _Refresher(clock, fail=refused)) is None
    assert await repository.get_user_integration("t", "alice", "srv") is None


async def test_a_transient_refresh_failure_keeps_the_tokens_and_frees_the_lease(
    store: MCPOAuthIntegrationStore, clock: ManualClock
) -> None:
    granted = await _connect(store, clock, expires_in=0)
    down = MCPOAuthTokenError("unreachable", permanent=False)
    with pytest.raises(MCPOAuthRefreshUnavailableError):
        await store.fresh_tokens("t", "alice", "srv", _Refresher(clock, fail=down))
    record = await store.get_user_integration("t", "alice", "srv")
    assert record is not None and record.tokens == granted and record.refresh_lease is None


async def test_a_live_lease_of_another_replica_is_waited_for_then_given_up(
    store: MCPOAuthIntegrationStore, repository: InMemoryMCPOAuthRepository, clock: ManualClock
) -> None:
    await _connect(store, clock, expires_in=0)
    record = await repository.get_user_integration("t", "alice", "srv")
    assert record is not None
    lease = MCPOAuthRefreshLease(holder="elsewhere", expires_at=clock() + timedelta(seconds=60))
    await repository.save_user_integration(record.model_copy(update={"refresh_lease": lease}))
    client = _Refresher(clock)
    with pytest.raises(MCPOAuthRefreshUnavailableError, match="another replica"):
        await store.fresh_tokens("t", "alice", "srv", client)
    assert client.refreshed == []


async def test_a_lapsed_lease_is_taken_over(
    store: MCPOAuthIntegrationStore, repository: InMemoryMCPOAuthRepository, clock: ManualClock
) -> None:
    await _connect(store, clock, expires_in=0)
    record = await repository.get_user_integration("t", "alice", "srv")
    assert record is not None
    lease = MCPOAuthRefreshLease(holder="dead replica", expires_at=clock() - timedelta(seconds=1))
    await repository.save_user_integration(record.model_copy(update={"refresh_lease": lease}))
    fresh = await store.fresh_tokens("t", "alice", "srv", _Refresher(clock))
    assert fresh is not None and fresh.access_token == "new-1"


async def test_the_client_secret_for_a_refresh_comes_from_the_client_info(
    store: MCPOAuthIntegrationStore,
) -> None:
    info = {
        "client_id": "client-1",
        "client_secret": "s3cret",
        "token_endpoint_auth_method": "client_secret_post",
    }
    await store.save_client_info(
        MCPOAuthClientInfoRecord(tenant="t", server_name="srv", client_info=info)
    )
    client = await store.client_for("t", "srv", "client-1")
    assert (client.client_secret, client.auth_method()) == ("s3cret", "client_secret_post")
    stranger = await store.client_for("t", "srv", "someone-else")
    assert stranger.client_secret is None and stranger.auth_method() == "none"


class _PlainRepository(MCPOAuthRepository):
    """A repository with only the seed's eight methods."""

    def __init__(self) -> None:
        self.inner = InMemoryMCPOAuthRepository(MCPOAuthCipher([KEY]))

    async def list_user_integrations(
        self, tenant: str, user_uuid: str, server_names: Sequence[str] | None = None
    ) -> list[MCPUserIntegrationRecord]:
        return await self.inner.list_user_integrations(tenant, user_uuid, server_names)

    async def get_user_integration(
        self, tenant: str, user_uuid: str, server_name: str
    ) -> MCPUserIntegrationRecord | None:
        return await self.inner.get_user_integration(tenant, user_uuid, server_name)

    async def find_user_integration_by_pending_state(
        self, state: str
    ) -> MCPUserIntegrationRecord | None:
        return await self.inner.find_user_integration_by_pending_state(state)

    async def save_user_integration(self, record: MCPUserIntegrationRecord) -> None:
        await self.inner.save_user_integration(record)

    async def delete_user_integration(self, tenant: str, user_uuid: str, server_name: str) -> bool:
        return await self.inner.delete_user_integration(tenant, user_uuid, server_name)

    async def list_client_info(
        self, tenant: str, server_names: Sequence[str] | None = None
    ) -> list[MCPOAuthClientInfoRecord]:
        return await self.inner.list_client_info(tenant, server_names)

    async def get_client_info(
        self, tenant: str, server_name: str
    ) -> MCPOAuthClientInfoRecord | None:
        return await self.inner.get_client_info(tenant, server_name)

    async def save_client_info(self, record: MCPOAuthClientInfoRecord) -> None:
        await self.inner.save_client_info(record)


async def test_a_plain_crud_repository_works_and_is_warned_about(
    caplog: pytest.LogCaptureFixture, clock: ManualClock
) -> None:
    with caplog.at_level(logging.WARNING):
        store = MCPOAuthIntegrationStore(_PlainRepository(), clock=clock)
    assert "serialized within this process only" in caplog.text
    state = await _begin(store)
    taken = await asyncio.gather(*(store.consume_pending(state) for _ in range(4)))
    assert sum(item is not None for item in taken) == 1, "the default swap is atomic in-process"
    await _connect(store, clock, expires_in=0)
    client = _Refresher(clock)
    results = await asyncio.gather(
        *(store.fresh_tokens("t", "alice", "srv", client) for _ in range(4))
    )
    assert len(client.refreshed) == 1 and all(r is not None for r in results)


def test_the_file_store_lives_in_the_store_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("TETHER_MCP_OAUTH_DIR", raising=False)
    monkeypatch.setenv("TETHER_STORE", f"file://{tmp_path / 'shared'}")
    store = get_local_file_mcp_oauth_integration_store()
    assert store.repository.base_path == tmp_path / "shared" / "mcp-oauth"
    monkeypatch.delenv("TETHER_STORE")
    store = get_local_file_mcp_oauth_integration_store()
    assert store.repository.base_path == tmp_path / ".tether" / "mcp-oauth"
    monkeypatch.setenv("TETHER_MCP_OAUTH_DIR", str(tmp_path / "elsewhere"))
    store = get_local_file_mcp_oauth_integration_store()
    assert store.repository.base_path == tmp_path / "elsewhere"
    assert os.listdir(tmp_path) == [], "nothing is written before it is used"


# ------------------------------------------------------------ short-lived tokens


async def test_the_refresh_margin_is_at_most_half_the_tokens_lifetime(
    store: MCPOAuthIntegrationStore, clock: ManualClock
) -> None:
    short = tokens().model_copy(
        update={"issued_at": clock(), "expires_at": clock() + timedelta(seconds=5)}
    )
    await store.save_user_integration(
        MCPUserIntegrationRecord(tenant="t", user_uuid="alice", server_name="srv", tokens=short)
    )
    assert store.refresh_margin(short) == timedelta(seconds=2.5)
    client = _Refresher(clock)
    clock.advance(2)
    assert await store.fresh_tokens("t", "alice", "srv", client) == short
    assert client.refreshed == [], "a 5 s token is not refreshed as soon as it is issued"
    clock.advance(0.6)
    fresh = await store.fresh_tokens("t", "alice", "srv", client)
    assert fresh is not None and fresh.access_token == "new-1"
    # A long-lived token keeps the configured margin; one of unknown age too.
    long = short.model_copy(update={"expires_at": clock() + timedelta(hours=1)})
    assert store.refresh_margin(long) == timedelta(seconds=30)
    assert store.refresh_margin(long.model_copy(update={"issued_at": None})) == timedelta(
        seconds=30
    )


# ------------------------------------------------------------ clients


class _RevisionlessRepository(_PlainRepository):
    """A seed-only repository that does not keep the client info's revision."""

    async def get_client_info(
        self, tenant: str, server_name: str
    ) -> MCPOAuthClientInfoRecord | None:
        record = await self.inner.get_client_info(tenant, server_name)
        return None if record is None else record.model_copy(update={"revision": None})


def _registrar(redirect_uri: str, gate: asyncio.Event, made: list[str]) -> Register:
    async def register() -> dict[str, Any]:
        made.append(f"client-{len(made) + 1}")
        client_id = made[-1]
        await gate.wait()
        return {
            "client_id": client_id,
            "client_secret": f"secret-of-{client_id}",
            "redirect_uris": [redirect_uri],
            "issuer": "https://as.example/",
            "source": "dynamic_registration",
        }

    return register


@pytest.mark.parametrize("kind", ["memory", "plain", "revisionless"])
async def test_one_registration_per_callback_url_is_made_and_racers_use_it(
    kind: str, clock: ManualClock
) -> None:
    repository: MCPOAuthRepository = {
        "memory": lambda: InMemoryMCPOAuthRepository(MCPOAuthCipher([KEY])),
        "plain": _PlainRepository,
        "revisionless": _RevisionlessRepository,
    }[kind]()
    store = MCPOAuthIntegrationStore(repository, clock=clock)
    made: list[str] = []
    gate = asyncio.Event()
    first = "https://one.example/mcp/oauth/callback"
    racers = [
        asyncio.ensure_future(
            store.registered_client(
                "t",
                "srv",
                issuer="https://as.example/",
                redirect_uri=first,
                register=_registrar(first, gate, made),
            )
        )
        for _ in range(4)
    ]
    await asyncio.sleep(0.01)
    gate.set()
    winners = {client["client_id"] for client in await asyncio.gather(*racers)}
    assert len(made) == 1 and len(winners) == 1, "one registers (single flight), all use it"
    [winner] = winners
    second = "https://two.example/mcp/oauth/callback"
    other = await store.registered_client(
        "t",
        "srv",
        issuer="https://as.example/",
        redirect_uri=second,
        register=_registrar(second, gate, made),
    )
    assert other["client_id"] == "client-2"
    again = await store.registered_client(
        "t",
        "srv",
        issuer="https://as.example/",
        redirect_uri=first,
        register=_registrar(first, gate, made),
    )
    assert again["client_id"] == winner and len(made) == 2, "the first URL's client is kept"
    for client_id in (winner, "client-2"):
        client = await store.client_for("t", "srv", client_id)
        assert client.client_secret == f"secret-of-{client_id}"


async def test_an_expired_registration_is_replaced_and_a_configured_client_goes_first(
    store: MCPOAuthIntegrationStore, clock: ManualClock
) -> None:
    uri = "https://one.example/mcp/oauth/callback"
    gate = asyncio.Event()
    gate.set()
    made: list[str] = []
    await store.registered_client(
        "t",
        "srv",
        issuer="https://as.example/",
        redirect_uri=uri,
        register=_registrar(uri, gate, made),
    )
    record = await store.get_client_info("t", "srv")
    assert record is not None
    expiring = {**record.client_info, "client_secret_expires_at": int(clock().timestamp()) + 30}
    await store.save_client_info(record.model_copy(update={"client_info": expiring}))
    renewed = await store.registered_client(
        "t",
        "srv",
        issuer="https://as.example/",
        redirect_uri=uri,
        register=_registrar(uri, gate, made),
    )
    assert renewed["client_id"] == "client-2", "a secret about to expire is not used for a link"
    configured = {"client_id": "mine", "client_secret": "x", "source": "agent_setup"}
    await store.remember_client("t", "srv", configured)
    await store.remember_client("t", "srv", configured)
    record = await store.get_client_info("t", "srv")
    assert record is not None and record.client_info["client_id"] == "mine"
    kept = [c["client_id"] for c in record.client_info["other_clients"]]
    assert kept == ["client-1", "client-2"]
    clock.advance(60)  # client-1's secret has expired: it can authenticate nothing
    await store.remember_client("t", "srv", {**configured, "client_secret": "rotated"})
    record = await store.get_client_info("t", "srv")
    assert record is not None and record.client_info["client_secret"] == "rotated"
    assert [c["client_id"] for c in record.client_info["other_clients"]] == ["client-2"]


async def test_a_registration_whose_replica_died_is_waited_for_then_taken_over(
    store: MCPOAuthIntegrationStore, clock: ManualClock
) -> None:
    """A replica took the registration lease and died before writing its
    client: others wait for it up to ``refresh_wait``, then give up for this
    turn; once the lease lapses (``refresh_lease``) the next one registers."""
    uri = "https://one.example/mcp/oauth/callback"
    lease = {
        "issuer": "https://as.example/",
        "redirect_uri": uri,
        "holder": "a replica that died",
        "expires_at": (clock() + timedelta(seconds=30)).timestamp(),
    }
    await store.save_client_info(
        MCPOAuthClientInfoRecord(
            tenant="t", server_name="srv", client_info={REGISTRATIONS_FIELD: [lease]}
        )
    )
    gate = asyncio.Event()
    gate.set()
    made: list[str] = []
    register = _registrar(uri, gate, made)
    with pytest.raises(StoreUnavailableError, match="did not finish in time"):
        await store.registered_client(
            "t", "srv", issuer="https://as.example/", redirect_uri=uri, register=register
        )
    assert made == []
    clock.advance(30)
    client = await store.registered_client(
        "t", "srv", issuer="https://as.example/", redirect_uri=uri, register=register
    )
    assert client["client_id"] == "client-1" and made == ["client-1"]
    record = await store.get_client_info("t", "srv")
    assert record is not None and REGISTRATIONS_FIELD not in record.client_info
