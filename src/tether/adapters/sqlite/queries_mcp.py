"""The SQL of the SQLite MCP OAuth repository (``mcp_repository``), by name.

Beside ``queries`` (the stores' statements), apart because these tables are not
the backend's schema: the repository creates them at open with the idempotent
DDL of ``CREATE_TABLES``, in one ``BEGIN IMMEDIATE`` transaction, and the
schema version never counts them. Ids are bound parameters, as in ``queries``.
"""

from __future__ import annotations

CREATE_TABLES = (
    """
    CREATE TABLE IF NOT EXISTS mcp_oauth_integrations (
        tenant BLOB NOT NULL,
        user_uuid BLOB NOT NULL,
        server_name BLOB NOT NULL,
        pending_state BLOB,
        revision TEXT,
        document TEXT NOT NULL,
        PRIMARY KEY (tenant, user_uuid, server_name)
    ) STRICT
    """,
    """
    CREATE INDEX IF NOT EXISTS mcp_oauth_integrations_by_state
    ON mcp_oauth_integrations (pending_state) WHERE pending_state IS NOT NULL
    """,
    """
    CREATE TABLE IF NOT EXISTS mcp_oauth_clients (
        tenant BLOB NOT NULL,
        server_name BLOB NOT NULL,
        document TEXT NOT NULL,
        PRIMARY KEY (tenant, server_name)
    ) STRICT
    """,
)
_KEY = "tenant = :tenant AND user_uuid = :user AND server_name = :server"
LIST_INTEGRATIONS = """
    SELECT document FROM mcp_oauth_integrations
    WHERE tenant = :tenant AND user_uuid = :user ORDER BY server_name
"""
GET_INTEGRATION = f"SELECT document FROM mcp_oauth_integrations WHERE {_KEY}"
FIND_BY_STATE = """
    SELECT document FROM mcp_oauth_integrations WHERE pending_state = :state LIMIT 1
"""
UPSERT_INTEGRATION = """
    INSERT INTO mcp_oauth_integrations
        (tenant, user_uuid, server_name, pending_state, revision, document)
    VALUES (:tenant, :user, :server, :state, :revision, :document)
    ON CONFLICT (tenant, user_uuid, server_name) DO UPDATE SET
        pending_state = excluded.pending_state,
        revision = excluded.revision,
        document = excluded.document
"""
INSERT_INTEGRATION_IF_ABSENT = """
    INSERT INTO mcp_oauth_integrations
        (tenant, user_uuid, server_name, pending_state, revision, document)
    VALUES (:tenant, :user, :server, :state, :revision, :document)
    ON CONFLICT (tenant, user_uuid, server_name) DO NOTHING
"""
UPDATE_INTEGRATION_IF_REVISION = f"""
    UPDATE mcp_oauth_integrations
    SET pending_state = :state, revision = :revision, document = :document
    WHERE {_KEY} AND revision IS :expected
"""
DELETE_INTEGRATION = f"DELETE FROM mcp_oauth_integrations WHERE {_KEY}"
DELETE_INTEGRATION_IF_REVISION = f"{DELETE_INTEGRATION} AND revision IS :expected"
EXISTS_INTEGRATION = f"SELECT 1 FROM mcp_oauth_integrations WHERE {_KEY}"
LIST_CLIENTS = """
    SELECT document FROM mcp_oauth_clients WHERE tenant = :tenant ORDER BY server_name
"""
GET_CLIENT = """
    SELECT document FROM mcp_oauth_clients WHERE tenant = :tenant AND server_name = :server
"""
UPSERT_CLIENT = """
    INSERT INTO mcp_oauth_clients (tenant, server_name, document)
    VALUES (:tenant, :server, :document)
    ON CONFLICT (tenant, server_name) DO UPDATE SET document = excluded.document
"""
INSERT_CLIENT_IF_ABSENT = """
    INSERT INTO mcp_oauth_clients (tenant, server_name, document)
    VALUES (:tenant, :server, :document)
    ON CONFLICT (tenant, server_name) DO NOTHING
"""
UPDATE_CLIENT_IF_REVISION = """
    UPDATE mcp_oauth_clients SET document = :document
    WHERE tenant = :tenant AND server_name = :server
      AND json_extract(document, '$.revision') IS :expected
"""
