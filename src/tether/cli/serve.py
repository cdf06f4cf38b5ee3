"""``tether serve``: run the API server on a project (default: the bundled example)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
import uvicorn

from tether.api.auth import AuthMode, build_authenticator
from tether.api.server_limits import uvicorn_options
from tether.cli.server_app import build_app
from tether.observability.logs import configure_logging
from tether.settings import settings_from_env
from tether.stores import STORE_NAMES, StoreURLError, compose

DEFAULT_STORE_URL = "sqlite:///.tether/tether.db"
EXIT_BAD_PROJECT = 2
EXIT_BAD_STORE = 2


def serve_command(
    project_dir: Annotated[
        Path | None,
        typer.Argument(help="Project directory with an agents/ package (default: the example)."),
    ] = None,
    host: Annotated[str, typer.Option(help="Interface to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to listen on.")] = 8000,
    store: Annotated[
        str,
        typer.Option(
            envvar="TETHER_STORE",
            help=(
                "Where every store lives: sqlite:///FILE (default), file://DIR, "
                "postgresql://..., redis://... (no conversation store), memory://."
            ),
        ),
    ] = DEFAULT_STORE_URL,
    stream_store: Annotated[
        str | None,
        typer.Option(
            envvar="TETHER_STREAM_STORE",
            help="Override for the recording and supervision stores (e.g. redis://...).",
        ),
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
    without: Annotated[
        list[str] | None,
        typer.Option(
            help=f"Leave a store out (its layer is off): one of {', '.join(STORE_NAMES)}.",
        ),
    ] = None,
    log_level: Annotated[
        str, typer.Option(help="Level of tether's and uvicorn's log lines (others: warning).")
    ] = "info",
    log_format: Annotated[
        str,
        typer.Option(
            envvar="TETHER_LOG_FORMAT",
            help="'text' (readable) or 'json' (one object per line, for a log pipeline).",
        ),
    ] = "text",
    auth: Annotated[
        AuthMode,
        typer.Option(
            envvar="TETHER_AUTH",
            help="Who is asking: 'headers' set by a trusted gateway, or a verified 'jwt'.",
        ),
    ] = AuthMode.HEADERS,
    jwt_secret: Annotated[
        str | None,
        typer.Option(
            envvar="TETHER_JWT_SECRET",
            help="HS256 shared secret, at least 32 bytes (prefer the variable: flags show in ps).",
            show_default=False,
        ),
    ] = None,
    jwt_public_key: Annotated[
        Path | None,
        typer.Option(
            envvar="TETHER_JWT_PUBLIC_KEY",
            help="PEM public key or certificate (RS256, ES256/384/512 or EdDSA).",
            exists=True,
            dir_okay=False,
        ),
    ] = None,
    jwt_jwks: Annotated[
        Path | None,
        typer.Option(
            envvar="TETHER_JWT_JWKS", help="JSON Web Key Set file.", exists=True, dir_okay=False
        ),
    ] = None,
    jwt_jwks_url: Annotated[
        str | None,
        typer.Option(
            envvar="TETHER_JWT_JWKS_URL",
            help="The identity provider's JSON Web Key Set URL (cached, refreshed on rotation).",
        ),
    ] = None,
    jwt_audience: Annotated[
        str | None, typer.Option(envvar="TETHER_JWT_AUDIENCE", help="Required 'aud' of tokens.")
    ] = None,
    jwt_issuer: Annotated[
        str | None, typer.Option(envvar="TETHER_JWT_ISSUER", help="Required 'iss' of tokens.")
    ] = None,
    jwt_requester_claim: Annotated[
        str, typer.Option(envvar="TETHER_JWT_REQUESTER_CLAIM", help="Claim naming the requester.")
    ] = "sub",
    jwt_roles_claim: Annotated[
        str, typer.Option(envvar="TETHER_JWT_ROLES_CLAIM", help="Claim listing the user's roles.")
    ] = "roles",
    jwt_tenants_claim: Annotated[
        str,
        typer.Option(
            envvar="TETHER_JWT_TENANTS_CLAIM",
            help="Claim listing the tenants the user may use (absent: --jwt-default-tenants).",
        ),
    ] = "tenants",
    jwt_default_tenants: Annotated[
        str | None,
        typer.Option(
            envvar="TETHER_JWT_DEFAULT_TENANTS",
            help=(
                "Tenants (comma-separated) a token without the tenants claim may use; "
                "without this option such a token may use none."
            ),
        ),
    ] = None,
) -> None:
    """Serve the project's agents over HTTP. Settings come from TETHER_* variables."""
    try:
        # First: the lines of building the app are formatted like the rest.
        configure_logging(log_level, log_format)
    except ValueError as error:
        raise typer.BadParameter(str(error), param_hint="--log-format/--log-level") from error
    try:
        stores = compose(
            store,
            stream=stream_store,
            state=state_store,
            conversation=conversation_store,
        ).without(without or [])
    except StoreURLError as error:
        # A driver not installed or a URL that names no backend: the message
        # says what to do (for a driver, which extra to install); a traceback
        # through the CLI's frames would only bury it.
        typer.echo(f"tether serve: {error}", err=True)
        raise typer.Exit(EXIT_BAD_STORE) from error
    try:
        authenticator = build_authenticator(
            auth,
            secret=jwt_secret,
            public_key_file=jwt_public_key,
            jwks_file=jwt_jwks,
            jwks_url=jwt_jwks_url,
            audience=jwt_audience,
            issuer=jwt_issuer,
            requester_claim=jwt_requester_claim,
            roles_claim=jwt_roles_claim,
            tenants_claim=jwt_tenants_claim,
            default_tenants=[
                item.strip() for item in (jwt_default_tenants or "").split(",") if item.strip()
            ],
        )
    except ValueError as error:
        raise typer.BadParameter(str(error), param_hint="--auth") from error
    settings = settings_from_env()
    try:
        app = build_app(
            project_dir,
            stores=stores,
            settings=settings,
            authenticator=authenticator,
            mcp_store_url=store,
        )
    except ValueError as error:
        # A malformed or inconsistent project (agent setups, MCP servers): the
        # message names the file or agent and the problem; a traceback of
        # tether's own frames would only bury it.
        typer.echo(f"tether serve: {error}", err=True)
        raise typer.Exit(EXIT_BAD_PROJECT) from error
    # The app drains on SIGTERM by itself (``tether.api.signal_drain``).
    # log_config=None: uvicorn keeps the logging configured above. Slow and
    # oversized clients are bounded here (``tether.api.server_limits``).
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level=log_level,
        log_config=None,
        **uvicorn_options(settings),
    )
    uvicorn.Server(config).run()
