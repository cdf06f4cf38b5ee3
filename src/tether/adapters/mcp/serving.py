"""The MCP OAuth store ``tether serve`` runs with, chosen from the same store URL.

``file://DIR`` keeps MCP OAuth rows in ``DIR/mcp-oauth``; ``memory://`` in
memory; ``sqlite:///PATH`` and ``postgresql://...`` in their databases (tables
of their own) once those backends ship an MCP OAuth repository. A backend
without one (Redis) serves no MCP OAuth store: MCP servers that need the
user's authorization are then skipped, and agents say so.
"""

from __future__ import annotations

import importlib
import logging
import os
from collections.abc import Sequence
from typing import Any
from urllib.parse import urlsplit

from tether.adapters.mcp.encryption import MCPOAuthCipher
from tether.adapters.mcp.repository import MCPOAuthRepository
from tether.adapters.mcp.settings import MCPOAuthSettings
from tether.adapters.mcp.store import MCPOAuthIntegrationStore
from tether.adapters.mcp.token_client import get_mcp_oauth_token_client
from tether.domain.store_bundle import StoreBundle

logger = logging.getLogger(__name__)

_SQL_REPOSITORIES = {
    # scheme -> module with ``mcp_oauth_repository_from_url(url, cipher)``
    "sqlite": "tether.adapters.sqlite.mcp_repository",
    "postgresql": "tether.adapters.postgres.mcp_repository",
    "postgres": "tether.adapters.postgres.mcp_repository",
}


def mcp_oauth_repository_from_url(
    url: str, cipher: MCPOAuthCipher, stores: StoreBundle | None = None
) -> MCPOAuthRepository | None:
    """The MCP OAuth repository for a store URL, or None when its backend has none.

    For a SQL backend it works over the database object of ``stores`` (the
    other stores of the same URL: one file, one pool) when that is unambiguous.
    """
    parts = urlsplit(url)
    if parts.scheme == "file":
        from tether.adapters.file.mcp_repository import LocalFileMCPOAuthRepository

        directory = os.path.abspath(parts.netloc + parts.path)
        return LocalFileMCPOAuthRepository(os.path.join(directory, "mcp-oauth"), cipher)
    if parts.scheme == "memory":
        from tether.adapters.memory.mcp_repository import InMemoryMCPOAuthRepository

        return InMemoryMCPOAuthRepository(cipher)
    module_name = _SQL_REPOSITORIES.get(parts.scheme)
    if module_name is None:
        return None
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        logger.warning("no MCP OAuth repository for %s stores: %s", parts.scheme, error)
        return None
    repository: MCPOAuthRepository = module.mcp_oauth_repository_from_url(
        url, cipher, _shared_database(stores, module.DATABASE_TYPE)
    )
    return repository


def _shared_database(stores: StoreBundle | None, kind: type) -> Any:
    """The one database of type ``kind`` the bundle's stores run on (the backend
    module checks it is ``url``'s)."""
    if stores is None:
        return None
    found = {
        id(database): database
        for store in stores.setup_kwargs().values()
        if isinstance(database := getattr(store, "database", None), kind)
    }
    if len(found) != 1:
        return None  # none, or per-store overrides on several: open one of our own
    (database,) = found.values()
    return database


def mcp_oauth_setup_kwargs(
    store_url: str | None,
    settings: MCPOAuthSettings | None = None,
    *,
    stores: StoreBundle | None = None,
    oauth_agents: Sequence[str] = (),
) -> dict[str, Any]:
    """``setup_app`` keyword arguments (``mcp_oauth_store``, ``mcp_oauth_token_client``)
    for ``store_url``; empty when its backend keeps no MCP OAuth rows. Pass the
    server's other ``stores`` so a SQL backend shares their database, and the
    agents whose MCP servers use OAuth, so a missing key is reported where it
    matters (and not to every project, most of which have no such server)."""
    if not store_url:
        return {}
    settings = settings or MCPOAuthSettings.from_env()
    cipher = MCPOAuthCipher(settings.encryption_keys)
    repository = mcp_oauth_repository_from_url(store_url, cipher, stores)
    if repository is None:
        return {}
    if not cipher.configured and oauth_agents:
        logger.warning(
            "MCP OAuth: TETHER_MCP_ENCRYPTION_KEYS is not set, so the OAuth MCP servers of "
            "agents %s cannot be connected (credentials are never stored in clear)",
            ", ".join(sorted(oauth_agents)),
        )
    return {
        "mcp_oauth_store": MCPOAuthIntegrationStore(repository, settings=settings),
        "mcp_oauth_token_client": get_mcp_oauth_token_client(),
    }
