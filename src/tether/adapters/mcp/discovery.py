"""Finding an MCP server's authorization server and becoming its client.

After a 401: the protected resource metadata (RFC 9728, at the URL the
``WWW-Authenticate`` challenge names, else the well-known URLs), then the
authorization server metadata (RFC 8414, with the OpenID fallbacks), then,
when no client is configured, dynamic client registration (RFC 7591). The
metadata models and the discovery URL order are the ``mcp`` SDK's.
"""

from __future__ import annotations

import base64
import hashlib
import re
import secrets
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode

import httpx2
from mcp.client.auth.utils import (
    build_oauth_authorization_server_metadata_discovery_urls,
    build_protected_resource_metadata_discovery_urls,
)
from mcp.shared.auth import OAuthMetadata, ProtectedResourceMetadata
from mcp.shared.auth_utils import check_resource_allowed, resource_url_from_server_url
from pydantic import ValidationError

_AUTH_FIELD = r'{name}=(?:"([^"]*)"|([^\s,]+))'


class MCPOAuthDiscoveryError(Exception):
    """The server's OAuth set-up could not be found or used."""


@dataclass(frozen=True)
class Challenge:
    """What a 401's ``WWW-Authenticate: Bearer ...`` said."""

    resource_metadata: str | None = None
    scope: str | None = None

    @classmethod
    def parse(cls, header: str | None) -> Challenge:
        """Read ``resource_metadata`` and ``scope`` from a Bearer challenge."""
        if not header:
            return cls()
        found: dict[str, str | None] = {}
        for name in ("resource_metadata", "scope"):
            match = re.search(_AUTH_FIELD.format(name=name), header)
            found[name] = (match.group(1) or match.group(2)) if match else None
        return cls(resource_metadata=found["resource_metadata"], scope=found["scope"])


@dataclass(frozen=True)
class AuthorizationServer:
    """Where to send the user and where to exchange codes, for one MCP server."""

    issuer: str
    authorization_endpoint: str
    token_endpoint: str
    registration_endpoint: str | None
    scopes_supported: tuple[str, ...] | None
    resource: str
    resource_scopes: tuple[str, ...] | None
    issuer_identifier: str = ""
    """The issuer exactly as the metadata spells it (``issuer`` is normalized): what an
    RFC 9207 ``iss`` in the authorization response is compared with."""
    iss_parameter_supported: bool = False
    """The metadata's ``authorization_response_iss_parameter_supported``: responses
    without ``iss`` must then be refused."""


async def discover(
    http: httpx2.AsyncClient, server_url: str, challenge: Challenge
) -> AuthorizationServer:
    """The authorization server of the MCP server at ``server_url``."""
    protected = await _protected_resource(http, server_url, challenge)
    issuer = str(protected.authorization_servers[0]) if protected else None
    for url in build_oauth_authorization_server_metadata_discovery_urls(issuer, server_url):
        try:
            response = await http.get(url, headers={"Accept": "application/json"})
        except httpx2.HTTPError as error:
            raise MCPOAuthDiscoveryError(f"cannot reach {url}: {error}") from error
        if response.status_code != 200:
            if response.status_code >= 500:
                raise MCPOAuthDiscoveryError(f"{url} answered {response.status_code}")
            continue
        try:
            metadata = OAuthMetadata.model_validate_json(response.content)
        except ValidationError:
            continue
        if issuer is not None and str(metadata.issuer).rstrip("/") != issuer.rstrip("/"):
            # RFC 8414 §3.3: metadata naming another issuer must not be used.
            raise MCPOAuthDiscoveryError(f"{url} describes issuer {metadata.issuer}, not {issuer}")
        raw_issuer = response.json().get("issuer")
        methods = metadata.code_challenge_methods_supported
        if methods is not None and "S256" not in methods:
            raise MCPOAuthDiscoveryError(f"{metadata.issuer} does not support PKCE S256")
        return AuthorizationServer(
            issuer=str(metadata.issuer),
            authorization_endpoint=str(metadata.authorization_endpoint),
            token_endpoint=str(metadata.token_endpoint),
            registration_endpoint=(
                str(metadata.registration_endpoint) if metadata.registration_endpoint else None
            ),
            scopes_supported=_tuple(metadata.scopes_supported),
            resource=str(protected.resource)
            if protected
            else resource_url_from_server_url(server_url),
            resource_scopes=_tuple(protected.scopes_supported) if protected else None,
            issuer_identifier=str(raw_issuer) if raw_issuer else str(metadata.issuer),
            iss_parameter_supported=bool(metadata.authorization_response_iss_parameter_supported),
        )
    raise MCPOAuthDiscoveryError(f"no authorization server metadata found for {server_url}")


async def _protected_resource(
    http: httpx2.AsyncClient, server_url: str, challenge: Challenge
) -> ProtectedResourceMetadata | None:
    urls = build_protected_resource_metadata_discovery_urls(challenge.resource_metadata, server_url)
    for url in urls:
        try:
            response = await http.get(url, headers={"Accept": "application/json"})
        except httpx2.HTTPError as error:
            raise MCPOAuthDiscoveryError(f"cannot reach {url}: {error}") from error
        if response.status_code != 200:
            continue
        try:
            metadata = ProtectedResourceMetadata.model_validate_json(response.content)
        except ValidationError:
            continue
        # RFC 9728 §3.3: the metadata must be about this very resource.
        if not check_resource_allowed(server_url, str(metadata.resource)):
            raise MCPOAuthDiscoveryError(
                f"{url} describes resource {metadata.resource}, not {server_url}"
            )
        return metadata
    return None


async def register_client(
    http: httpx2.AsyncClient,
    server: AuthorizationServer,
    *,
    redirect_uri: str,
    scope: str | None,
    client_name: str,
) -> dict[str, Any]:
    """Register tether as an OAuth client (RFC 7591); returns the client information."""
    if server.registration_endpoint is None:
        raise MCPOAuthDiscoveryError(
            f"{server.issuer} offers no dynamic client registration; configure a client_id "
            "for this MCP server in the agent setup"
        )
    metadata: dict[str, Any] = {
        "client_name": client_name,
        "redirect_uris": [redirect_uri],
        "grant_types": ["authorization_code", "refresh_token"],
        "response_types": ["code"],
        "token_endpoint_auth_method": "client_secret_post",
        "application_type": "web",
    }
    if scope:
        metadata["scope"] = scope
    try:
        response = await http.post(server.registration_endpoint, json=metadata)
    except httpx2.HTTPError as error:
        raise MCPOAuthDiscoveryError(
            f"cannot reach {server.registration_endpoint}: {error}"
        ) from error
    if response.status_code not in (200, 201):
        raise MCPOAuthDiscoveryError(
            f"client registration at {server.registration_endpoint} answered "
            f"{response.status_code}: {response.text[:200]}"
        )
    try:
        info = response.json()
    except ValueError as error:
        raise MCPOAuthDiscoveryError("the client registration response is not JSON") from error
    if not isinstance(info, dict) or not info.get("client_id"):
        raise MCPOAuthDiscoveryError("the client registration response has no client_id")
    info.setdefault("redirect_uris", [redirect_uri])
    info["issuer"] = server.issuer
    return info


def pkce_pair() -> tuple[str, str]:
    """A fresh PKCE verifier and its S256 challenge (RFC 7636)."""
    verifier = secrets.token_urlsafe(64)
    digest = hashlib.sha256(verifier.encode("ascii")).digest()
    return verifier, base64.urlsafe_b64encode(digest).decode("ascii").rstrip("=")


def authorization_url(
    server: AuthorizationServer,
    *,
    client_id: str,
    redirect_uri: str,
    state: str,
    code_challenge: str,
    scope: str | None,
) -> str:
    """The link the user opens to grant access."""
    params = {
        "response_type": "code",
        "client_id": client_id,
        "redirect_uri": redirect_uri,
        "state": state,
        "code_challenge": code_challenge,
        "code_challenge_method": "S256",
        "resource": server.resource,
    }
    if scope:
        params["scope"] = scope
    separator = "&" if "?" in server.authorization_endpoint else "?"
    return f"{server.authorization_endpoint}{separator}{urlencode(params)}"


def _tuple(values: list[str] | None) -> tuple[str, ...] | None:
    return None if values is None else tuple(values)
