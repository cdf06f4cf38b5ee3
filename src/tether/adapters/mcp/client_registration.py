"""The OAuth clients the MCP OAuth store keeps for a server: found, registered, remembered.

Tokens are refreshed as the client they were issued to, so clients are kept
per callback URL and never replaced by another registration
(``tether.adapters.mcp.clients``). A client is registered once per callback
URL, across replicas: the first replica to need one takes a registration lease
in the client info record (compare-and-swap), registers, and writes the client
in place of its lease; the others wait for it and use that client. A lease
whose holder died lapses (``refresh_lease`` seconds), and the next replica
registers instead.
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import socket
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Any

from tether.adapters.mcp.clients import (
    find_client,
    kept_clients,
    packed,
    registration_for,
    registrations_under_way,
    usable_registration,
    with_client,
)
from tether.adapters.mcp.records import MCPOAuthClientInfoRecord
from tether.adapters.mcp.repository import MCPOAuthRepository
from tether.adapters.mcp.settings import MCPOAuthSettings
from tether.adapters.mcp.token_client import Clock, MCPOAuthClient
from tether.domain.store_errors import StoreUnavailableError

logger = logging.getLogger(__name__)

Sleep = Callable[[float], Awaitable[None]]
Register = Callable[[], Awaitable[dict[str, Any]]]
POLL = 0.05
"""Seconds between the reads of a replica waiting for another's lease."""
_CLIENT_WRITE_ATTEMPTS = 8


def lease_holder() -> str:
    """A name for a lease this replica takes: its host, its process, a token."""
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(6)}"


class ClientRegistration:
    """The client side of ``MCPOAuthIntegrationStore``, which it is mixed into:
    the store gives the repository, its settings, its clock and its sleep."""

    repository: MCPOAuthRepository
    settings: MCPOAuthSettings
    clock: Clock
    _sleep: Sleep

    async def client_for(self, tenant: str, server_name: str, client_id: str) -> MCPOAuthClient:
        """The client credentials stored for ``client_id`` at this server, whichever of
        the kept clients it is (a public client without a secret when none are stored)."""
        record = await self.repository.get_client_info(tenant, server_name)
        found = find_client(kept_clients(record.client_info if record else None), client_id)
        if found is not None:
            return MCPOAuthClient.from_client_info(found)
        return MCPOAuthClient(client_id=client_id)

    async def registered_client(
        self,
        tenant: str,
        server_name: str,
        *,
        issuer: str,
        redirect_uri: str,
        register: Register,
    ) -> dict[str, Any]:
        """The client registered dynamically at ``issuer`` for ``redirect_uri``: the one
        kept, else a new one from ``register()`` (RFC 7591 client information).

        Single flight across replicas: ``register()`` runs only under this
        replica's registration lease for the callback URL, taken by
        compare-and-swap on the client info; a replica that finds another's
        lease waits (up to ``refresh_wait`` seconds) for the client it writes.
        A new client is added beside the clients already kept, never over them.
        Raises ``StoreUnavailableError`` when the wait runs out.
        """
        deadline = self.clock() + timedelta(seconds=self.settings.refresh_wait)
        holder = lease_holder()
        lost = 0  # compare-and-swaps lost to other writers (a wait is not one)
        while lost < _CLIENT_WRITE_ATTEMPTS:
            current = await self.repository.get_client_info(tenant, server_name)
            info = current.client_info if current else None
            clients = kept_clients(info)
            now = self.clock()
            found = next(
                (c for c in clients if usable_registration(c, issuer, redirect_uri, now)), None
            )
            if found is not None:
                return found
            leases = registrations_under_way(info, now)
            if registration_for(leases, issuer, redirect_uri) is not None:
                # Another replica registers this very client now: wait for it.
                if now >= deadline:
                    raise StoreUnavailableError(
                        f"another replica's client registration at {issuer} did not finish "
                        "in time; try again"
                    )
                await self._sleep(POLL)
                continue
            lease = {
                "issuer": issuer,
                "redirect_uri": redirect_uri,
                "holder": holder,
                "expires_at": (now + timedelta(seconds=self.settings.refresh_lease)).timestamp(),
            }
            leased = self._client_record(tenant, server_name, clients, [*leases, lease])
            if await self.repository.compare_and_swap_client_info(leased, current):
                return await self._register_under_lease(leased, lease, register)
            lost += 1
        raise StoreUnavailableError(
            f"the OAuth client info of {server_name!r} kept changing; try again"
        )

    async def _register_under_lease(
        self, leased: MCPOAuthClientInfoRecord, lease: dict[str, Any], register: Register
    ) -> dict[str, Any]:
        """Register while holding ``lease``, then keep the client in its place
        (or, when registering fails, just let the lease go)."""
        registered: dict[str, Any] | None = None
        try:
            registered = await register()
        finally:
            # Written even when registering failed or was cancelled: nobody
            # should wait for a registration that is not coming.
            await asyncio.shield(self._end_lease(leased, lease, registered))
        return registered

    async def _end_lease(
        self,
        leased: MCPOAuthClientInfoRecord,
        lease: dict[str, Any],
        registered: dict[str, Any] | None,
    ) -> None:
        tenant, server_name = leased.tenant, leased.server_name
        current: MCPOAuthClientInfoRecord | None = leased
        for _ in range(_CLIENT_WRITE_ATTEMPTS):
            if current is None:
                current = await self.repository.get_client_info(tenant, server_name)
            info = current.client_info if current else None
            now = self.clock()
            clients = kept_clients(info)
            if registered is not None:
                clients = with_client(clients, registered, now, first=False)
            others = [
                other
                for other in registrations_under_way(info, now)
                if other.get("holder") != lease["holder"]
                or other.get("redirect_uri") != lease["redirect_uri"]
            ]
            updated = self._client_record(tenant, server_name, clients, others)
            if await self.repository.compare_and_swap_client_info(updated, current):
                return
            current = None  # changed meanwhile (another URL's lease): read it again
        logger.warning(
            "MCP OAuth: could not keep the client registered for %r; it is registered "
            "again when next needed",
            server_name,
        )

    async def remember_client(self, tenant: str, server_name: str, info: dict[str, Any]) -> None:
        """Keep ``info`` (a client configured in the agent setup) as this server's first
        client, so the callback, which has no setup, finds its secret; clients kept
        before stay, for the tokens issued to them."""
        for _ in range(_CLIENT_WRITE_ATTEMPTS):
            current = await self.repository.get_client_info(tenant, server_name)
            clients = kept_clients(current.client_info if current else None)
            known = find_client(clients, str(info["client_id"]))
            wanted = dict(info)
            if known is not None:
                uris = [*(known.get("redirect_uris") or []), *(info.get("redirect_uris") or [])]
                wanted["redirect_uris"] = list(dict.fromkeys(uris))
            if clients and clients[0] == wanted:
                return
            updated = self._client_record(
                tenant,
                server_name,
                with_client(clients, wanted, self.clock(), first=True),
                registrations_under_way(current.client_info if current else None, self.clock()),
            )
            if await self.repository.compare_and_swap_client_info(updated, current):
                return
        raise StoreUnavailableError(
            f"the OAuth client info of {server_name!r} kept changing; try again"
        )

    @staticmethod
    def _client_record(
        tenant: str,
        server_name: str,
        clients: list[dict[str, Any]],
        registrations: list[dict[str, Any]],
    ) -> MCPOAuthClientInfoRecord:
        return MCPOAuthClientInfoRecord(
            tenant=tenant,
            server_name=server_name,
            client_info=packed(clients, registrations),
            revision=secrets.token_hex(12),
        )
