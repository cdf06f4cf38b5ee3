"""HAProxy for the load balancer tests: Debian's package, started by each test on loopback.

The configuration is the crash test's own (``tether.crashtest.load_balancer``),
so the tests prove the load balancer the crash test runs behind. Without
``haproxy`` the tests skip saying how to install it; with
``TETHER_REQUIRE_SERVICES=1`` (set by ``.ci/run``, which installs it) they fail.
"""

from __future__ import annotations

from tests.support.services import missing
from tether.crashtest.load_balancer import HAPROXY_HOW, haproxy_executable


def require_haproxy() -> str:
    """The haproxy executable; skips (or fails, in CI) without one."""
    path = haproxy_executable()
    if path is None:
        missing(f"no haproxy executable on PATH or in /usr/sbin; {HAPROXY_HOW}")
    return path
