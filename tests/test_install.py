"""Installing tether: a store whose driver is missing is one line naming the extra.

``pip install tether`` (or ``make install``) brings no PostgreSQL or Redis
driver; those are the ``postgres`` and ``redis`` extras. A command given such
a store URL says so in one line and exits non-zero, instead of a traceback.
The driver's absence is simulated in the child process (``sys.modules[name] =
None`` makes its import fail as a missing package does), so nothing is
uninstalled from the machine running the tests.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

POSTGRES_URL = "postgresql://u:secret@db.invalid/t"
_RUN_WITHOUT = """\
import sys
for name in sys.argv[1].split(","):
    sys.modules[name] = None
sys.argv = ["tether", *sys.argv[2:]]
from tether.cli.main import main
main()
"""


def tether_without(drivers: list[str], *args: str) -> subprocess.CompletedProcess[str]:
    """``tether ARGS`` in a child process in which ``drivers`` cannot be imported."""
    return subprocess.run(
        [sys.executable, "-c", _RUN_WITHOUT, ",".join(drivers), *args],
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.parametrize(
    ("drivers", "args", "extra"),
    [
        (["psycopg"], ["serve", "--store", POSTGRES_URL], "postgres"),
        (["psycopg_pool"], ["serve", "--store", POSTGRES_URL], "postgres"),
        (
            ["redis"],
            ["serve", "--store", "memory://", "--stream-store", "redis://r.invalid:6379/0"],
            "redis",
        ),
        (["psycopg"], ["db", "upgrade", "--store", POSTGRES_URL], "postgres"),
    ],
    ids=["serve-psycopg", "serve-psycopg-pool", "serve-redis", "db-upgrade-psycopg"],
)
def test_a_missing_driver_is_one_line_naming_the_extra(
    drivers: list[str], args: list[str], extra: str
) -> None:
    done = tether_without(drivers, *args)
    assert done.returncode != 0
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert f"pip install 'tether[{extra}]'" in lines[0]
    assert "Traceback" not in done.stderr and "secret" not in done.stderr
