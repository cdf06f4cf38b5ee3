"""The SQL of the PostgreSQL MCP OAuth repository (``mcp_repository``), by name.

Beside ``queries`` (the stores' statements), apart because these tables are not
the backend's schema: the repository creates them at open with the idempotent
DDL of :data:`CREATE_TABLES`, under an advisory lock of its own, and the
backend's migrations and schema version never touch them. The rules of
``queries`` hold here too: ids are parameters, and a compare-and-swap is one
conditional statement.
"""

from __future__ import annotations

from typing import Final

LOCK_KEY: Final = 8387237872774807600
"""Advisory lock serializing this repository's DDL across replicas."""

CREATE_TABLES: Final = (
    "SELECT pg_advisory_xact_lock(%(lock_key)s)",
    """
    CREATE TABLE IF NOT EXISTS tether_mcp_oauth_integrations (
        key bytea PRIMARY KEY CHECK (octet_length(key) = 32),
        owner_key bytea NOT NULL,
        state_key bytea,
        tenant text NOT NULL,
        user_uuid text NOT NULL,
        server_name text NOT NULL,
        revision text,
        document jsonb NOT NULL,
        updated_at timestamptz NOT NULL DEFAULT now()
    )
    """,
    """
    CREATE INDEX IF NOT EXISTS tether_mcp_oauth_integrations_owner
    ON tether_mcp_oauth_integrations (owner_key)
    """,
    """
    CREATE INDEX IF NOT EXISTS tether_mcp_oauth_integrations_state
    ON tether_mcp_oauth_integrations (state_key) WHERE state_key IS NOT NULL
    """,
    """
    CREATE TABLE IF NOT EXISTS tether_mcp_oauth_clients (
        key bytea PRIMARY KEY CHECK (octet_length(key) = 32),
        tenant_key bytea NOT NULL,
        tenant text NOT NULL,
        server_name text NOT NULL,
        document jsonb NOT NULL,
        updated_at timestamptz NOT NULL DEFAULT now()
    )
    """,
    """
    CREATE INDEX IF NOT EXISTS tether_mcp_oauth_clients_tenant
    ON tether_mcp_oauth_clients (tenant_key)
    """,
)
TABLES_EXIST: Final = """
SELECT to_regclass('tether_mcp_oauth_integrations') IS NOT NULL
   AND to_regclass('tether_mcp_oauth_clients') IS NOT NULL AS ready
"""
LIST_INTEGRATIONS: Final = """
SELECT document FROM tether_mcp_oauth_integrations WHERE owner_key = %(owner_key)s
"""
GET_INTEGRATION: Final = "SELECT document FROM tether_mcp_oauth_integrations WHERE key = %(key)s"
FIND_BY_STATE: Final = """
SELECT document FROM tether_mcp_oauth_integrations WHERE state_key = %(state_key)s LIMIT 1
"""
_COLUMNS: Final = "key, owner_key, state_key, tenant, user_uuid, server_name, revision, document"
_VALUES: Final = """
%(key)s, %(owner_key)s, %(state_key)s, %(tenant)s, %(user_uuid)s, %(server_name)s,
%(revision)s, %(document)s::jsonb
"""
UPSERT_INTEGRATION: Final = f"""
INSERT INTO tether_mcp_oauth_integrations ({_COLUMNS}) VALUES ({_VALUES})
ON CONFLICT (key) DO UPDATE SET
    state_key = excluded.state_key, revision = excluded.revision,
    document = excluded.document, updated_at = now()
"""
INSERT_INTEGRATION_IF_ABSENT: Final = f"""
INSERT INTO tether_mcp_oauth_integrations ({_COLUMNS}) VALUES ({_VALUES})
ON CONFLICT (key) DO NOTHING
RETURNING 1 AS written
"""
UPDATE_INTEGRATION_IF_REVISION: Final = """
UPDATE tether_mcp_oauth_integrations
SET state_key = %(state_key)s, revision = %(revision)s, document = %(document)s::jsonb,
    updated_at = now()
WHERE key = %(key)s AND revision IS NOT DISTINCT FROM %(expected)s::text
RETURNING 1 AS written
"""
DELETE_INTEGRATION: Final = """
DELETE FROM tether_mcp_oauth_integrations WHERE key = %(key)s RETURNING 1 AS written
"""
DELETE_INTEGRATION_IF_REVISION: Final = """
DELETE FROM tether_mcp_oauth_integrations
WHERE key = %(key)s AND revision IS NOT DISTINCT FROM %(expected)s::text
RETURNING 1 AS written
"""
NO_INTEGRATION: Final = """
SELECT NOT EXISTS (SELECT 1 FROM tether_mcp_oauth_integrations WHERE key = %(key)s) AS written
"""
LIST_CLIENTS: Final = """
SELECT document FROM tether_mcp_oauth_clients WHERE tenant_key = %(tenant_key)s
"""
GET_CLIENT: Final = "SELECT document FROM tether_mcp_oauth_clients WHERE key = %(key)s"
UPSERT_CLIENT: Final = """
INSERT INTO tether_mcp_oauth_clients (key, tenant_key, tenant, server_name, document)
VALUES (%(key)s, %(tenant_key)s, %(tenant)s, %(server_name)s, %(document)s::jsonb)
ON CONFLICT (key) DO UPDATE SET document = excluded.document, updated_at = now()
"""
INSERT_CLIENT_IF_ABSENT: Final = """
INSERT INTO tether_mcp_oauth_clients (key, tenant_key, tenant, server_name, document)
VALUES (%(key)s, %(tenant_key)s, %(tenant)s, %(server_name)s, %(document)s::jsonb)
ON CONFLICT (key) DO NOTHING
RETURNING 1 AS written
"""
UPDATE_CLIENT_IF_REVISION: Final = """
UPDATE tether_mcp_oauth_clients SET document = %(document)s::jsonb, updated_at = now()
WHERE key = %(key)s AND document->>'revision' IS NOT DISTINCT FROM %(expected)s::text
RETURNING 1 AS written
"""
