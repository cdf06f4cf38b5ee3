"""What the MCP OAuth store persists: in-flight authorizations, granted tokens, client info.

One ``MCPUserIntegrationRecord`` per (tenant, user_uuid, server_name) holds both
halves of a user's connection to an MCP server: ``pending`` while the browser is
away at the authorization server, ``tokens`` once the grant has landed. The
fields marked secret (``code_verifier``, ``access_token``, ``refresh_token``, a
client's ``client_secret``) are what the shipped repositories encrypt at rest;
they are also kept out of ``repr`` so a log line never carries them.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

SECRET_CLIENT_INFO_FIELDS = ("client_secret", "registration_access_token")
"""Members of ``MCPOAuthClientInfoRecord.client_info`` that are credentials (at its top
level and in each entry of ``OTHER_CLIENTS_FIELD``)."""

REGISTRATIONS_FIELD = "tether_registrations"
"""The member of ``client_info`` listing registrations under way: each
``{"issuer", "redirect_uri", "holder", "expires_at"}`` (a Unix time), the lease
of the one replica registering a client for that callback URL, so that replicas
starting at once register one client between them (``MCPOAuthIntegrationStore.
registered_client``). No secret: it names a replica and a URL."""

OTHER_CLIENTS_FIELD = "other_clients"
"""The member of ``client_info`` listing the other clients kept for the same server: each
an RFC 7591 client information object of its own (``client_id``, ``client_secret``,
``redirect_uris``, ``issuer``...). A registration is made per callback URL and never
replaced by another one, because users' tokens stay bound to the client they were
issued to and are refreshed with its credentials."""


class MCPOAuthPendingAuthorization(BaseModel):
    """An authorization the user has been sent to finish in a browser.

    Everything the callback needs to complete the code exchange on any replica,
    found by ``state`` alone: the PKCE ``code_verifier``, the ``token_endpoint``,
    the ``redirect_uri`` the code was issued for, the RFC 8707 ``resource`` and
    the ``client_id`` the link was made for, and the ``issuer`` it was sent to
    (RFC 9207: the callback's ``iss`` must name it, and must be present when the
    authorization server advertised ``authorization_response_iss_parameter_supported``,
    which ``iss_parameter_supported`` records). After ``expires_at`` the wrapping
    store treats it as gone.
    """

    model_config = ConfigDict(extra="forbid")

    state: str
    tenant: str
    server_name: str
    user_uuid: str
    auth_url: str
    code_verifier: str = Field(repr=False)
    token_endpoint: str
    redirect_uri: str
    expires_at: datetime
    resource: str | None = None
    client_id: str | None = None
    scope: str | None = None
    issuer: str | None = None
    iss_parameter_supported: bool = False


class MCPOAuthTokens(BaseModel):
    """The tokens a user granted, with what a refresh needs (endpoint, client, resource).

    ``expires_at`` is absolute (the token response's ``expires_in`` added to the
    time it arrived, ``issued_at``), so every replica agrees on when the access
    token is stale. ``client_id`` is the client the tokens were issued to: they
    are refreshed as that client, with its stored credentials, and no other.
    """

    model_config = ConfigDict(extra="forbid")

    access_token: str = Field(repr=False)
    token_type: str = "Bearer"
    refresh_token: str | None = Field(default=None, repr=False)
    scope: str | None = None
    expires_at: datetime | None = None
    token_endpoint: str | None = None
    client_id: str | None = None
    resource: str | None = None
    issued_at: datetime | None = None


class MCPOAuthRefreshLease(BaseModel):
    """Who is spending the refresh token right now, and until when the claim holds.

    Written with ``compare_and_swap_user_integration`` so that of several
    replicas finding the same expired token, exactly one spends its refresh
    token; the others wait for the new tokens. A holder that dies lets the lease
    lapse at ``expires_at``.
    """

    model_config = ConfigDict(extra="forbid")

    holder: str
    expires_at: datetime


class MCPUserIntegrationRecord(BaseModel):
    """One user's connection to one MCP server: ``pending``, ``tokens``, both or neither.

    ``revision`` changes on every write the integration store makes (a fresh
    random value, never a counter, so even a blind last-write-wins save moves
    it); ``compare_and_swap_user_integration`` compares it. Repositories store it
    as given.
    """

    model_config = ConfigDict(extra="forbid")

    tenant: str
    user_uuid: str
    server_name: str
    pending: MCPOAuthPendingAuthorization | None = None
    tokens: MCPOAuthTokens | None = None
    refresh_lease: MCPOAuthRefreshLease | None = None
    revision: str | None = None


class MCPOAuthClientInfoRecord(BaseModel):
    """The OAuth client tether is at an MCP server's authorization server, per tenant.

    ``client_info`` is the RFC 7591 client information (``client_id``,
    ``client_secret``, ``redirect_uris``, ``token_endpoint_auth_method``...) as
    registered dynamically, or as configured in the agent setup; tether adds
    ``issuer`` (the authorization server it belongs to) and, under
    ``OTHER_CLIENTS_FIELD``, the other clients it keeps for this server (one per
    callback URL, and older ones still holding users' tokens).

    ``revision`` changes on every write the integration store makes; the optional
    ``compare_and_swap_client_info`` compares it, so that of two replicas
    registering at once only one registration is kept. Repositories store it as
    given.
    """

    model_config = ConfigDict(extra="forbid")

    tenant: str
    server_name: str
    client_info: dict[str, Any] = Field(repr=False)
    revision: str | None = None
