"""``tether db``: manage the schema of a database-backed store (PostgreSQL): create or
upgrade it, or check that it is at this tether's version; and
retention: ``tether db prune`` erases conversations nobody updated for a while.

Mounted by ``tether.cli.main`` as ``app.add_typer(db_app, name="db")``.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Annotated, Any
from urllib.parse import urlsplit

import typer

from tether.cli.serve import DEFAULT_STORE_URL
from tether.domain.store_errors import StoreError
from tether.handlers.retention import PruneReport, prune
from tether.settings import parse_age, settings_from_env
from tether.stores import StoreBundle, StoreURLError, compose, import_backend

_SCHEMES = ("postgresql", "postgres")

db_app = typer.Typer(name="db", no_args_is_help=True, add_completion=False)


@db_app.callback()
def db_callback() -> None:
    """Manage the schema of a database-backed store (PostgreSQL); prune old conversations."""
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
    # the CLI must work without it. import_backend turns its absence into the
    # one line naming the extra to install.
    import_backend("postgresql")
    from tether.adapters.postgres import PostgresDatabase

    # No pool and no open(): upgrade() and schema_version() use a connection
    # of their own, so this works on a database whose schema is behind.
    database = PostgresDatabase.from_url(url)
    applied = await database.upgrade()
    return applied, await database.schema_version(), database.display_url


@db_app.command("check")
def check_command(
    store: Annotated[
        str,
        typer.Option(
            "--store",
            envvar="TETHER_STORE",
            help="The store URL, e.g. postgresql://user:password@host:5432/dbname.",
        ),
    ],
    wait: Annotated[
        float,
        typer.Option(
            min=0,
            help="Seconds to wait for the schema to reach this tether's version (0: look once).",
        ),
    ] = 0.0,
) -> None:
    """Exit 0 once the schema is at this tether's version or newer; 1 if it is not
    within --wait seconds. Changes nothing, so the servers' own database user
    can run it: a Kubernetes initContainer holds the pods until the schema Job's
    `tether db upgrade` is through."""
    scheme = urlsplit(store).scheme
    if scheme not in _SCHEMES:
        typer.echo(
            f"tether db check: {scheme or 'this'}:// stores have no schema to check "
            f"(supported: {', '.join(s + '://' for s in _SCHEMES)})",
            err=True,
        )
        raise typer.Exit(2)
    try:
        version, needed, where = asyncio.run(_wait_for_schema(store, wait))
    except StoreURLError as error:
        typer.echo(f"tether db check: {error}", err=True)
        raise typer.Exit(2) from error
    except StoreError as error:
        typer.echo(f"tether db check: {error}", err=True)
        raise typer.Exit(1) from error
    if version < needed:
        typer.echo(
            f"tether db check: {where} has schema version {version}, this tether needs "
            f"{needed}: run `tether db upgrade` with a user that may change the schema",
            err=True,
        )
        raise typer.Exit(1)
    typer.echo(f"{where}: schema at version {version}; this tether needs {needed}")


_CHECK_EVERY = 2.0
"""Seconds between looks at the schema version while ``tether db check --wait``s."""


async def _wait_for_schema(url: str, wait: float) -> tuple[int, int, str]:
    import_backend("postgresql")
    from tether.adapters.postgres import PostgresDatabase
    from tether.adapters.postgres.migrations import LATEST_VERSION

    database = PostgresDatabase.from_url(url)
    deadline = asyncio.get_running_loop().time() + wait
    version = 0
    while True:
        try:
            version = await database.schema_version()
        except StoreError:
            # The database may not be up yet either (a cluster starting as a
            # whole): within the wait that is one more reason to look again.
            if asyncio.get_running_loop().time() >= deadline:
                raise
        else:
            if version >= LATEST_VERSION:
                break
        remaining = deadline - asyncio.get_running_loop().time()
        if remaining <= 0:
            break
        await asyncio.sleep(min(_CHECK_EVERY, remaining))
    return version, LATEST_VERSION, database.display_url


# Retention -----------------------------------------------------------------------------


@db_app.command("prune")
def prune_command(
    older_than: Annotated[
        str | None,
        typer.Option(
            "--older-than",
            envvar="TETHER_RETENTION",
            help=(
                "Remove conversations not updated for this long: 30d, 12h, 90m, 2w "
                "(a bare number is days). Default: TETHER_RETENTION."
            ),
        ),
    ] = None,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Only print what would be removed.")
    ] = False,
    store: Annotated[
        str, typer.Option(envvar="TETHER_STORE", help="The store URL the servers use.")
    ] = DEFAULT_STORE_URL,
    stream_store: Annotated[
        str | None,
        typer.Option(envvar="TETHER_STREAM_STORE", help="Override for recording and supervision."),
    ] = None,
    state_store: Annotated[
        str | None,
        typer.Option(envvar="TETHER_STATE_STORE", help="Override for the agent state store."),
    ] = None,
    conversation_store: Annotated[
        str | None,
        typer.Option(
            envvar="TETHER_CONVERSATION_STORE", help="Override for the conversation store."
        ),
    ] = None,
) -> None:
    """Erase conversations not updated for --older-than, and everything they own
    (checkpoint, recording, supervision row). Run it from ONE scheduler (cron, a
    Kubernetes CronJob) against the servers' stores, or set TETHER_RETENTION on
    the servers instead (one replica at a time prunes). A conversation with a
    running turn is skipped."""
    if older_than is None:
        typer.echo("tether db prune: give --older-than (or set TETHER_RETENTION)", err=True)
        raise typer.Exit(2)
    try:
        age = parse_age(older_than)
    except ValueError as error:
        raise typer.BadParameter(str(error), param_hint="--older-than") from error
    try:
        dead_after = timedelta(seconds=settings_from_env().dead_after)
    except ValueError as error:
        typer.echo(f"tether db prune: {error}", err=True)
        raise typer.Exit(2) from error
    try:
        bundle = compose(
            store, stream=stream_store, state=state_store, conversation=conversation_store
        )
        report = asyncio.run(_run_prune(bundle, age, dry_run, dead_after))
    except (StoreError, StoreURLError) as error:
        typer.echo(f"tether db prune: {error}", err=True)
        raise typer.Exit(1) from error
    verb = "would remove" if dry_run else "removed"
    for summary in report.removed:
        typer.echo(
            f"{verb}: tenant={summary.tenant!r} session={summary.session_id!r} "
            f"owner={summary.owner_uuid!r} updated_at={summary.updated_at.isoformat()}"
        )
    for summary, reason in report.skipped:
        typer.echo(f"skipped: tenant={summary.tenant!r} session={summary.session_id!r} ({reason})")
    typer.echo(
        f"{verb} {len(report.removed)} conversation(s) not updated since "
        f"{report.cutoff.isoformat()}; skipped {len(report.skipped)}"
    )


async def _run_prune(
    bundle: StoreBundle, age: timedelta, dry_run: bool, dead_after: timedelta
) -> PruneReport:
    opened: list[Any] = []
    try:
        for store in {id(s): s for s in bundle.setup_kwargs().values() if s is not None}.values():
            if hasattr(store, "open"):
                await store.open()
            if hasattr(store, "aclose"):
                opened.append(store)
        return await prune(bundle, age, dry_run=dry_run, dead_after=dead_after)
    finally:
        for store in reversed(opened):
            await store.aclose()
