"""The production server imports no test kit.

``tether.testing`` is for a project's own tests (the store contract kit, the
interleavings); the crash test's instruments that a replica carries (the
``pause-in-write`` fault, the tool-call ledger) live in
``tether.crashtest.instruments`` and load nothing else of the crash test.
Checked in a fresh interpreter, so this process's imports do not count.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

_SCRIPT = textwrap.dedent(
    """
    import sys

    from tether.cli.server_app import build_app
    from tether.stores import from_url

    build_app(None, stores=from_url("memory://"))  # the example project, as `tether serve`
    print(" ".join(sorted(m for m in sys.modules if m.startswith("tether."))))
    import tether.cli.main  # every command of the command line

    print(" ".join(sorted(m for m in sys.modules if m.startswith("tether."))))
    """
)


def test_the_server_app_imports_no_test_kit_and_only_the_crash_tests_instruments() -> None:
    result = subprocess.run(
        [sys.executable, "-c", _SCRIPT], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    server, command_line = (set(line.split()) for line in result.stdout.strip().splitlines())
    assert "tether.cli.server_app" in server
    assert not any(m == "tether.testing" or m.startswith("tether.testing.") for m in server)
    assert {m for m in server if m.startswith("tether.crashtest")} == {
        "tether.crashtest",
        "tether.crashtest.instruments",
        "tether.crashtest.instruments.pause_in_write",
        "tether.crashtest.instruments.tool_ledger",
    }
    assert not any(m.startswith("tether.testing") for m in command_line)
