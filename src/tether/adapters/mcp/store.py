"""``MCPOAuthIntegrationStore``: a repository wrapped with the rules of the OAuth flow.

The repository stores rows; this class decides what they mean:

- an expired pending authorization is gone: reads never return it, and the
  read that meets it removes it;
- a pending authorization is consumed once: of two callbacks carrying one
  ``state``, one gets it, the other hears "unknown state";
- tokens landing clear the pending authorization;
- an expired access token is refreshed by exactly one replica: it takes a lease
  on the integration by compare-and-swap, spends the refresh token, writes the
  new tokens; the others wait and read them. A refresh the server refuses for
  good clears the tokens, so the next use asks the user again instead of looping;
- "about to expire" is the refresh margin, capped at half the token's lifetime,
  so short-lived tokens are not refreshed before every request;
- tokens are refreshed as the client they were issued to, and a client is
  registered once per callback URL across replicas (``client_registration``,
  whose methods the store has).
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
from collections.abc import Sequence
from datetime import datetime, timedelta

from tether.adapters.mcp.client_registration import (
    POLL,
    ClientRegistration,
    Sleep,
    lease_holder,
)
from tether.adapters.mcp.records import (
    MCPOAuthClientInfoRecord,
    MCPOAuthPendingAuthorization,
    MCPOAuthRefreshLease,
    MCPOAuthTokens,
    MCPUserIntegrationRecord,
)
from tether.adapters.mcp.repository import MCPOAuthRepository
from tether.adapters.mcp.settings import MCPOAuthSettings
from tether.adapters.mcp.token_client import (
    Clock,
    MCPOAuthTokenClient,
    MCPOAuthTokenError,
    utc_now,
)

logger = logging.getLogger(__name__)


class MCPOAuthRefreshUnavailableError(Exception):
    """Fresh tokens could not be had right now (server unreachable, or another
    replica's refresh did not finish in time); the stored tokens are kept."""


class MCPOAuthIntegrationStore(ClientRegistration):
    """The MCP OAuth store to pass to ``setup_app(mcp_oauth_store=...)``.

    ``settings`` gives the pending-authorization lifetime (default 10 minutes)
    and the refresh margin, lease and wait; ``pending_ttl`` (seconds) overrides
    the lifetime. ``clock`` and ``sleep`` are injectable for tests.
    """

    def __init__(
        self,
        repository: MCPOAuthRepository,
        *,
        pending_ttl: float | None = None,
        settings: MCPOAuthSettings | None = None,
        clock: Clock = utc_now,
        sleep: Sleep = asyncio.sleep,
    ) -> None:
        self.repository = repository
        self.settings = settings or MCPOAuthSettings.from_env()
        ttl = self.settings.pending_ttl if pending_ttl is None else pending_ttl
        self.pending_ttl = timedelta(seconds=ttl)
        self.clock = clock
        self._sleep = sleep
        if not repository.compare_and_swap_is_atomic:
            logger.warning(
                "%s does not declare an atomic compare_and_swap_user_integration: refreshes "
                "are serialized within this process only, so replicas sharing it could spend "
                "one rotating refresh token twice",
                type(repository).__qualname__,
            )

    # ------------------------------------------------------------ lifecycle

    async def open(self) -> None:
        """Open the repository (pools, tables), if it has anything to open."""
        open_ = getattr(self.repository, "open", None)
        if open_ is not None:
            await open_()

    async def aclose(self) -> None:
        """Close the repository."""
        await self.repository.aclose()

    def credentials_problem(self) -> str | None:
        """Why this store cannot keep credentials now (no encryption key), or None."""
        return self.repository.credentials_problem()

    # ------------------------------------------------------------ the eight, with the rules

    async def list_user_integrations(
        self, tenant: str, user_uuid: str, server_names: Sequence[str] | None = None
    ) -> list[MCPUserIntegrationRecord]:
        """The user's integrations (every server when ``server_names`` is None);
        expired pendings are removed, and integrations left empty are not listed."""
        records = await self.repository.list_user_integrations(tenant, user_uuid, server_names)
        live = [await self._without_expired_pending(record) for record in records]
        return [record for record in live if record is not None]

    async def get_user_integration(
        self, tenant: str, user_uuid: str, server_name: str
    ) -> MCPUserIntegrationRecord | None:
        """The integration without an expired pending (removed on the way), or None."""
        record = await self.repository.get_user_integration(tenant, user_uuid, server_name)
        return None if record is None else await self._without_expired_pending(record)

    async def find_user_integration_by_pending_state(
        self, state: str
    ) -> MCPUserIntegrationRecord | None:
        """The integration whose live pending authorization has ``state``, or None."""
        record = await self.repository.find_user_integration_by_pending_state(state)
        if record is None or record.pending is None or record.pending.state != state:
            return None
        cleaned = await self._without_expired_pending(record)
        return cleaned if cleaned is not None and cleaned.pending is not None else None

    async def save_user_integration(self, record: MCPUserIntegrationRecord) -> None:
        """Store ``record`` (last write wins); tokens landing clear its pending."""
        if record.tokens is not None:
            record = record.model_copy(update={"pending": None})
        await self.repository.save_user_integration(_revised(record))

    async def delete_user_integration(self, tenant: str, user_uuid: str, server_name: str) -> bool:
        """Disconnect: remove the integration; returns whether there was one."""
        return await self.repository.delete_user_integration(tenant, user_uuid, server_name)

    async def list_client_info(
        self, tenant: str, server_names: Sequence[str] | None = None
    ) -> list[MCPOAuthClientInfoRecord]:
        return await self.repository.list_client_info(tenant, server_names)

    async def get_client_info(
        self, tenant: str, server_name: str
    ) -> MCPOAuthClientInfoRecord | None:
        return await self.repository.get_client_info(tenant, server_name)

    async def save_client_info(self, record: MCPOAuthClientInfoRecord) -> None:
        """Store ``record`` (last write wins), under a new revision."""
        await self.repository.save_client_info(_revised_client(record))

    # ------------------------------------------------------------ the flow

    def pending_expiry(self) -> datetime:
        """When a pending authorization created now stops being usable."""
        return self.clock() + self.pending_ttl

    async def begin_authorization(self, pending: MCPOAuthPendingAuthorization) -> None:
        """Persist ``pending``: the user's integration is now waiting for the callback.
        Tokens it held are dropped: an authorization starts because they failed."""
        record = MCPUserIntegrationRecord(
            tenant=pending.tenant,
            user_uuid=pending.user_uuid,
            server_name=pending.server_name,
            pending=pending,
        )
        await self.repository.save_user_integration(_revised(record))

    async def consume_pending(self, state: str) -> MCPOAuthPendingAuthorization | None:
        """Take the live pending authorization of ``state`` out of the store, once:
        None when it is unknown, expired, or already taken by another callback."""
        record = await self.find_user_integration_by_pending_state(state)
        if record is None or record.pending is None:
            return None
        taken = record.model_copy(update={"pending": None})
        if not await self._swap(taken, record.revision):
            return None
        return record.pending

    async def complete_authorization(
        self, pending: MCPOAuthPendingAuthorization, tokens: MCPOAuthTokens
    ) -> None:
        """Store the tokens ``pending`` was exchanged for; any pending is cleared."""
        await self.save_user_integration(
            MCPUserIntegrationRecord(
                tenant=pending.tenant,
                user_uuid=pending.user_uuid,
                server_name=pending.server_name,
                tokens=tokens,
            )
        )

    def refresh_margin(self, tokens: MCPOAuthTokens) -> timedelta:
        """How long before its expiry an access token counts as stale: the configured
        margin, but at most half the token's lifetime (a server issuing 5 s tokens
        would otherwise get a refresh before every request)."""
        margin = timedelta(seconds=self.settings.refresh_margin)
        if tokens.expires_at is not None and tokens.issued_at is not None:
            lifetime = tokens.expires_at - tokens.issued_at
            margin = min(margin, max(lifetime / 2, timedelta(0)))
        return margin

    async def fresh_tokens(
        self,
        tenant: str,
        user_uuid: str,
        server_name: str,
        token_client: MCPOAuthTokenClient,
        *,
        rejected_access_token: str | None = None,
    ) -> MCPOAuthTokens | None:
        """Usable tokens for the integration, refreshing them first when they are
        (about to be) expired or ``rejected_access_token`` is still the current one.

        None means there are none (any more): the user must authorize. Raises
        ``MCPOAuthRefreshUnavailableError`` when a refresh cannot happen now.
        """
        deadline = self.clock() + timedelta(seconds=self.settings.refresh_wait)
        holder = lease_holder()
        while True:
            record = await self.get_user_integration(tenant, user_uuid, server_name)
            if record is None or record.tokens is None:
                return None
            tokens = record.tokens
            stale = tokens.access_token == rejected_access_token or (
                tokens.expires_at is not None
                and tokens.expires_at - self.refresh_margin(tokens) <= self.clock()
            )
            if not stale:
                return tokens
            if not tokens.refresh_token or not tokens.token_endpoint or not tokens.client_id:
                await self._swap(record.model_copy(update={"tokens": None}), record.revision)
                return None
            lease = record.refresh_lease
            if lease is not None and lease.expires_at > self.clock():
                # Another replica is spending the refresh token: wait for its tokens.
                if self.clock() >= deadline:
                    raise MCPOAuthRefreshUnavailableError(
                        f"another replica's refresh of {server_name!r} did not finish in time"
                    )
                await self._sleep(POLL)
                continue
            leased = _revised(
                record.model_copy(
                    update={
                        "refresh_lease": MCPOAuthRefreshLease(
                            holder=holder,
                            expires_at=self.clock()
                            + timedelta(seconds=self.settings.refresh_lease),
                        )
                    }
                )
            )
            if not await self.repository.compare_and_swap_user_integration(leased, record.revision):
                continue
            return await self._refresh_under_lease(leased, tokens, token_client)

    async def _refresh_under_lease(
        self,
        leased: MCPUserIntegrationRecord,
        tokens: MCPOAuthTokens,
        token_client: MCPOAuthTokenClient,
    ) -> MCPOAuthTokens | None:
        assert tokens.client_id is not None
        client = await self.client_for(leased.tenant, leased.server_name, tokens.client_id)
        try:
            refreshed = await token_client.refresh(tokens, client)
        except MCPOAuthTokenError as error:
            if error.permanent:
                logger.info("refresh of %r refused for good: %s", leased.server_name, error)
                await self._swap(
                    leased.model_copy(update={"tokens": None, "refresh_lease": None}),
                    leased.revision,
                )
                return None
            await self._swap(leased.model_copy(update={"refresh_lease": None}), leased.revision)
            raise MCPOAuthRefreshUnavailableError(str(error)) from error
        except BaseException:
            # Cancelled or broken mid-refresh: let the lease go so no one waits for it.
            await asyncio.shield(
                self._swap(leased.model_copy(update={"refresh_lease": None}), leased.revision)
            )
            raise
        done = leased.model_copy(update={"tokens": refreshed, "refresh_lease": None})
        if not await self._swap(done, leased.revision):
            # Someone replaced the integration meanwhile (a new authorization, a
            # disconnect): theirs is newer, so these tokens are not kept.
            logger.info("refreshed tokens of %r superseded by a newer write", leased.server_name)
            current = await self.get_user_integration(
                leased.tenant, leased.user_uuid, leased.server_name
            )
            return None if current is None else current.tokens
        return refreshed

    async def _without_expired_pending(
        self, record: MCPUserIntegrationRecord
    ) -> MCPUserIntegrationRecord | None:
        if record.pending is None or record.pending.expires_at > self.clock():
            return record
        cleaned = record.model_copy(update={"pending": None})
        # Best effort: if the row changed meanwhile, the next read cleans it.
        await self._swap(cleaned, record.revision)
        return None if cleaned.tokens is None else cleaned

    async def _swap(self, record: MCPUserIntegrationRecord, expected: str | None) -> bool:
        if record.pending is None and record.tokens is None:
            record = record.model_copy(update={"revision": None, "refresh_lease": None})
        else:
            record = _revised(record)
        return await self.repository.compare_and_swap_user_integration(record, expected)


def _revised(record: MCPUserIntegrationRecord) -> MCPUserIntegrationRecord:
    return record.model_copy(update={"revision": secrets.token_hex(12)})


def _revised_client(record: MCPOAuthClientInfoRecord) -> MCPOAuthClientInfoRecord:
    return record.model_copy(update={"revision": secrets.token_hex(12)})


def get_local_file_mcp_oauth_integration_store(
    base_path: str | os.PathLike[str] | None = None,
    *,
    settings: MCPOAuthSettings | None = None,
) -> MCPOAuthIntegrationStore:
    """The file-backed store, in ``base_path`` or else the store directory.

    The default directory is ``TETHER_MCP_OAUTH_DIR``, else ``mcp-oauth`` inside
    the ``file://`` directory of ``TETHER_STORE``, else ``.tether/mcp-oauth`` (the
    directory ``tether serve`` uses by default). Credentials are encrypted with
    ``TETHER_MCP_ENCRYPTION_KEYS``; without a key, storing them is refused.
    """
    from tether.adapters.file.mcp_repository import LocalFileMCPOAuthRepository
    from tether.adapters.mcp.encryption import MCPOAuthCipher

    settings = settings or MCPOAuthSettings.from_env()
    if base_path is None:
        base_path = default_store_directory()
    repository = LocalFileMCPOAuthRepository(base_path, MCPOAuthCipher(settings.encryption_keys))
    return MCPOAuthIntegrationStore(repository, settings=settings)


def default_store_directory() -> str:
    """Where the file-backed MCP OAuth store lives when no path is given."""
    explicit = os.environ.get("TETHER_MCP_OAUTH_DIR")
    if explicit:
        return os.path.abspath(explicit)
    store_url = os.environ.get("TETHER_STORE", "file://.tether")
    directory = store_url[len("file://") :] if store_url.startswith("file://") else ".tether"
    return os.path.join(os.path.abspath(directory or ".tether"), "mcp-oauth")
