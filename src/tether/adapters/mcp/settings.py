"""The tunables of MCP OAuth, from ``TETHER_MCP_*`` environment variables."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field

from tether.adapters.mcp.encryption import ENCRYPTION_KEYS_ENV


@dataclass(frozen=True)
class MCPOAuthSettings:
    """Durations are in seconds.

    ``redirect_uri`` is where authorization servers send the browser back: the
    public URL of ``GET /mcp/oauth/callback`` behind the load balancer. Unset, a
    turn uses the URL of the request that started it, which is right for one
    replica but not for several behind different host names.
    """

    encryption_keys: tuple[str, ...] = field(default=(), repr=False)
    """Keys sealing credentials at rest (``TETHER_MCP_ENCRYPTION_KEYS``, comma-separated;
    the first encrypts, every one decrypts)."""
    pending_ttl: float = 600.0
    """How long an authorization link stays usable (``TETHER_MCP_PENDING_TTL``)."""
    redirect_uri: str | None = None
    """The callback URL given to authorization servers (``TETHER_MCP_REDIRECT_URI``)."""
    refresh_margin: float = 30.0
    """An access token this close to expiry is refreshed before use
    (``TETHER_MCP_REFRESH_MARGIN``)."""
    refresh_lease: float = 30.0
    """How long a replica may hold the right to spend a refresh token before others
    may take over (``TETHER_MCP_REFRESH_LEASE``); longer than a token request takes."""
    refresh_wait: float = 20.0
    """How long a replica waits for another one's refresh before giving up on the
    server for this turn (``TETHER_MCP_REFRESH_WAIT``)."""

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> MCPOAuthSettings:
        """Defaults, with any ``TETHER_MCP_*`` variable applied."""
        environ = os.environ if environ is None else environ
        keys = tuple(
            k.strip() for k in environ.get(ENCRYPTION_KEYS_ENV, "").split(",") if k.strip()
        )
        numbers: dict[str, float] = {}
        for name in ("pending_ttl", "refresh_margin", "refresh_lease", "refresh_wait"):
            variable = f"TETHER_MCP_{name.upper()}"
            raw = environ.get(variable)
            if raw is None:
                continue
            try:
                numbers[name] = float(raw)
            except ValueError:
                raise ValueError(f"{variable}={raw!r} is not a number") from None
            if numbers[name] < 0:
                raise ValueError(f"{variable}={raw!r} must not be negative")
        return cls(
            encryption_keys=keys,
            redirect_uri=environ.get("TETHER_MCP_REDIRECT_URI") or None,
            **numbers,
        )
