"""``tether db``: manage the schema of a database-backed store (PostgreSQL).

Mounted by ``tether.cli.main`` as ``app.add_typer(db_app, name="db")``.
"""

from __future__ import annotations

import asyncio
from typing import Annotated
from urllib.parse import urlsplit

import typer

from tether.domain.store_errors import StoreError
from tether.stores import StoreURLError

_SCHEMES = ("postgresql", "postgres")

db_app = typer.Typer(name="db", no_args_is_help=True, add_completion=False)


@db_app.callback()
def db_callback() -> None:
    """Manage the schema of a database-backed store (PostgreSQL)."""
    # A callback keeps ``db`` a command group even while it has one command.


@db_app.command("upgrade")
def upgrade_command(
    store: Annotated[
        str,
        typer.Option(
            "--store",
            envvar="TETHER_STORE",
            help="The store URL, e.g. postgresql://user:password@host:5432/dbname.",
        ),
    ],
) -> None:
    """Create the schema, or upgrade it to this tether's version. Safe to repeat,
    and safe while servers run (migrations take an advisory lock)."""
    scheme = urlsplit(store).scheme
    if scheme not in _SCHEMES:
        typer.echo(
            f"tether db upgrade: {scheme or 'this'}:// stores have no schema to upgrade "
            f"(supported: {', '.join(s + '://' for s in _SCHEMES)})",
            err=True,
        )
        raise typer.Exit(2)
    try:
        applied, version, where = asyncio.run(_upgrade(store))
    except (StoreError, StoreURLError) as error:
        typer.echo(f"tether db upgrade: {error}", err=True)
        raise typer.Exit(1) from error
    if applied:
        listed = ", ".join(str(number) for number in applied)
        typer.echo(f"{where}: applied migration(s) {listed}; schema at version {version}")
    else:
        typer.echo(f"{where}: schema already at version {version}; nothing to do")


async def _upgrade(url: str) -> tuple[list[int], int, str]:
    # Imported here: the PostgreSQL driver is an optional extra, and the rest of
    # the CLI must work without it.
    try:
        from tether.adapters.postgres import PostgresDatabase
    except ImportError as error:
        raise StoreURLError(
            f"PostgreSQL support is not installed ({error}); install tether[postgres]"
        ) from error

    # No pool and no open(): upgrade() and schema_version() use a connection
    # of their own, so this works on a database whose schema is behind.
    database = PostgresDatabase.from_url(url)
    applied = await database.upgrade()
    return applied, await database.schema_version(), database.display_url
