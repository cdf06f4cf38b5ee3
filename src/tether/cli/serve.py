"""``tether serve``: run the API server on a project (default: the bundled example)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
import uvicorn

from tether.cli.draining_server import DrainingServer
from tether.cli.server_app import build_app
from tether.settings import settings_from_env
from tether.stores import STORE_NAMES, compose

DEFAULT_STORE_URL = "file://.tether"


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
            help="Where every store lives: file://DIR (shared by processes) or memory://.",
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
    log_level: Annotated[str, typer.Option(help="uvicorn log level.")] = "info",
) -> None:
    """Serve the project's agents over HTTP. Settings come from TETHER_* variables."""
    stores = compose(
        store,
        stream=stream_store,
        state=state_store,
        conversation=conversation_store,
    ).without(without or [])
    app = build_app(project_dir, stores=stores, settings=settings_from_env())
    config = uvicorn.Config(app, host=host, port=port, log_level=log_level)
    DrainingServer(config, app).run()
