"""The OAuth clients tether keeps for one MCP server of one tenant, in one client info record.

``MCPOAuthClientInfoRecord.client_info`` holds one client at its top level (RFC
7591 client information, as the seed defines it) and the others under
``OTHER_CLIENTS_FIELD``. Several are kept because a registration names its
callback URLs: a replica reached under another host name (no
``TETHER_MCP_REDIRECT_URI``) registers a client of its own, and a changed
``client_id`` in the agent setup is another client. Replacing one with the other
would leave the users whose tokens were issued to the first unable to refresh
them, so none is dropped while it can still authenticate.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from tether.adapters.mcp.records import OTHER_CLIENTS_FIELD, REGISTRATIONS_FIELD

logger = logging.getLogger(__name__)

MAX_KEPT_CLIENTS = 32
"""A bound on the clients kept per tenant and server (callback URLs come from
request host names when ``TETHER_MCP_REDIRECT_URI`` is unset); past it the
oldest is forgotten, with a warning."""
_EXPIRY_SLACK_SECONDS = 60


def kept_clients(client_info: dict[str, Any] | None) -> list[dict[str, Any]]:
    """Every client of a record's ``client_info``, the top-level one first."""
    if not client_info:
        return []
    top = {
        k: v for k, v in client_info.items() if k not in (OTHER_CLIENTS_FIELD, REGISTRATIONS_FIELD)
    }
    found = [top] if top.get("client_id") else []
    others = client_info.get(OTHER_CLIENTS_FIELD)
    if isinstance(others, list):
        found += [dict(o) for o in others if isinstance(o, dict) and o.get("client_id")]
    return found


def packed(
    clients: Sequence[dict[str, Any]], registrations: Sequence[dict[str, Any]] = ()
) -> dict[str, Any]:
    """``client_info`` holding ``clients`` (the first at the top level, the rest
    beside it) and the ``registrations`` under way."""
    info = dict(clients[0]) if clients else {}
    if len(clients) > 1:
        info[OTHER_CLIENTS_FIELD] = [dict(client) for client in clients[1:]]
    if registrations:
        info[REGISTRATIONS_FIELD] = [dict(lease) for lease in registrations]
    return info


def registrations_under_way(
    client_info: dict[str, Any] | None, now: datetime
) -> list[dict[str, Any]]:
    """The registration leases of a record's ``client_info`` that have not lapsed."""
    leases = (client_info or {}).get(REGISTRATIONS_FIELD)
    if not isinstance(leases, list):
        return []
    return [
        dict(lease)
        for lease in leases
        if isinstance(lease, dict)
        and isinstance(lease.get("expires_at"), int | float)
        and lease["expires_at"] > now.timestamp()
    ]


def registration_for(
    leases: Sequence[dict[str, Any]], issuer: str, redirect_uri: str
) -> dict[str, Any] | None:
    """The lease of the registration at ``issuer`` for ``redirect_uri``, if one is under way."""
    return next(
        (
            lease
            for lease in leases
            if lease.get("issuer") == issuer and lease.get("redirect_uri") == redirect_uri
        ),
        None,
    )


def find_client(clients: Sequence[dict[str, Any]], client_id: str) -> dict[str, Any] | None:
    """The kept client ``client_id`` names, or None."""
    return next((c for c in clients if str(c.get("client_id")) == client_id), None)


def usable_registration(
    client: dict[str, Any], issuer: str, redirect_uri: str, now: datetime
) -> bool:
    """Whether ``client`` is a dynamic registration at ``issuer`` for ``redirect_uri``
    whose secret is good for a while yet."""
    if client.get("source") == "agent_setup" or client.get("issuer") != issuer:
        return False
    if redirect_uri not in (client.get("redirect_uris") or []):
        return False
    return not _expired(client, now, slack=_EXPIRY_SLACK_SECONDS)


def with_client(
    clients: Sequence[dict[str, Any]], client: dict[str, Any], now: datetime, *, first: bool
) -> list[dict[str, Any]]:
    """``clients`` with ``client`` added (or replacing the one of the same ``client_id``,
    in place), ``first`` if asked; clients whose secret has expired are dropped, and
    past ``MAX_KEPT_CLIENTS`` the oldest others are."""
    client_id = str(client["client_id"])
    kept = [c for c in clients if not _expired(c, now, slack=0)]
    position = next((i for i, c in enumerate(kept) if str(c["client_id"]) == client_id), None)
    if position is not None and not first:
        kept[position] = dict(client)
    else:
        kept = [c for c in kept if str(c["client_id"]) != client_id]
        kept.insert(0 if first else len(kept), dict(client))
    while len(kept) > MAX_KEPT_CLIENTS:
        oldest = next(i for i, c in enumerate(kept) if str(c["client_id"]) != client_id)
        dropped = kept.pop(oldest)
        logger.warning(
            "MCP OAuth: more than %d clients kept for one server; forgetting client %s (users "
            "whose tokens it holds will be asked to authorize again); set "
            "TETHER_MCP_REDIRECT_URI so that every replica uses one callback URL",
            MAX_KEPT_CLIENTS,
            dropped.get("client_id"),
        )
    return kept


def _expired(client: dict[str, Any], now: datetime, *, slack: float) -> bool:
    expires = client.get("client_secret_expires_at")
    # RFC 7591: 0 (or absent) means the secret does not expire.
    if isinstance(expires, bool) or not isinstance(expires, int | float) or not expires:
        return False
    return bool(expires < now.timestamp() + slack)
