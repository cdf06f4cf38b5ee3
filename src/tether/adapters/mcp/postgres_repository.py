"""Old import path, kept working: the PostgreSQL MCP OAuth repository now lives in
``tether.adapters.postgres.mcp_repository`` (its SQL in
``tether.adapters.postgres.queries_mcp``).

Only a re-export remains here, so that code importing
``tether.adapters.mcp.postgres_repository`` (the seed's wiring, third-party code) runs
unchanged; import from the new place in new code.
"""

from tether.adapters.postgres.mcp_repository import (
    DATABASE_TYPE,
    PostgresMCPOAuthRepository,
    mcp_oauth_repository_from_url,
)

__all__ = [
    "DATABASE_TYPE",
    "PostgresMCPOAuthRepository",
    "mcp_oauth_repository_from_url",
]
