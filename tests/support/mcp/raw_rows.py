"""Everything an MCP OAuth repository has at rest, as raw bytes, read around the repository.

For files: every file under the store's ``mcp-oauth`` directory. For SQLite: the
database file and its WAL. For PostgreSQL: every MCP OAuth table's rows, as text.
A test searches this for credentials that must never be there in clear.
"""

from __future__ import annotations

import os
from pathlib import Path
from urllib.parse import unquote, urlsplit


def raw_store_bytes(store_url: str) -> bytes:
    parts = urlsplit(store_url)
    if parts.scheme == "file":
        return _directory_bytes(Path(parts.netloc + parts.path) / "mcp-oauth")
    if parts.scheme == "sqlite":
        database = Path(unquote(parts.path)[1:])  # as the backend reads it
        chunks = []
        for suffix in ("", "-wal", "-journal"):
            candidate = Path(f"{database}{suffix}")
            if candidate.exists():
                chunks.append(candidate.read_bytes())
        return b"".join(chunks)
    if parts.scheme in ("postgres", "postgresql"):
        import psycopg

        with psycopg.connect(store_url) as connection:
            tables = connection.execute(
                "SELECT tablename FROM pg_tables WHERE tablename LIKE 'tether_mcp_%'"
            ).fetchall()
            text = []
            for (table,) in tables:
                for row in connection.execute(f'SELECT * FROM "{table}"').fetchall():
                    text.append(repr(row))
        return "\n".join(text).encode()
    raise ValueError(f"no raw reader for {store_url}")


def _directory_bytes(directory: Path) -> bytes:
    chunks = []
    for root, _, names in os.walk(directory):
        for name in sorted(names):
            chunks.append((Path(root) / name).read_bytes())
    return b"".join(chunks)
