"""Old import path, kept working: the SQLite MCP OAuth repository now lives in
``tether.adapters.sqlite.mcp_repository`` (its SQL in ``tether.adapters.sqlite.queries_mcp``).

Only a re-export remains here, so that code importing ``tether.adapters.mcp.sqlite_repository``
(the seed's wiring, third-party code) runs unchanged; import from the new place in new code.
"""

from tether.adapters.sqlite.mcp_repository import (
    DATABASE_TYPE,
    SQLiteMCPOAuthRepository,
    mcp_oauth_repository_from_url,
)

__all__ = [
    "DATABASE_TYPE",
    "SQLiteMCPOAuthRepository",
    "mcp_oauth_repository_from_url",
]
