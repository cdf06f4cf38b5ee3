"""The ``tether`` command: serve, init, chat, crash-test, simulate, db."""

from __future__ import annotations

import typer

from tether.cli.chat import chat_command
from tether.cli.crash_test import crash_test_command
from tether.cli.db import db_app
from tether.cli.init import init_command
from tether.cli.serve import serve_command
from tether.cli.simulate import simulate_command

app = typer.Typer(
    name="tether",
    help="Run LLM chat agents whose conversations survive reconnects and replica deaths.",
    no_args_is_help=True,
    add_completion=False,
)
app.command("serve")(serve_command)
app.command("init")(init_command)
app.command("chat")(chat_command)
app.command("crash-test")(crash_test_command)
app.command("simulate")(simulate_command)
app.add_typer(db_app, name="db")


def main() -> None:
    app()
