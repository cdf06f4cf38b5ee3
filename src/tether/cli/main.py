"""The ``tether`` command: serve, init, chat (and, in later issues, more)."""

from __future__ import annotations

import typer

from tether.cli.chat import chat_command
from tether.cli.init import init_command
from tether.cli.serve import serve_command

app = typer.Typer(
    name="tether",
    help="Run LLM chat agents whose conversations survive reconnects and replica deaths.",
    no_args_is_help=True,
    add_completion=False,
)
app.command("serve")(serve_command)
app.command("init")(init_command)
app.command("chat")(chat_command)


def main() -> None:
    app()
