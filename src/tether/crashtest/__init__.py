"""``tether crash-test``: real replicas, real signals, invariants checked from outside.

The command itself is ``tether.cli.crash_test``; this package is its machinery:
``cluster`` (the replica processes), ``load_balancer`` (HAProxy in front of
them, with ``--via-load-balancer``), ``client`` (the HTTP calls), ``reader``
(the turn readers), ``faults``, ``recovery``, ``reference`` (crash-free runs),
``rounds`` and ``conversation_rounds``, ``invariants`` (a package, one module
a group of the design's invariants) and ``conversation_checks``, ``fence``,
``results`` and ``report``; and ``instruments``, what a replica it starts
carries inside it (the ``pause-in-write`` fault, the tool-call ledger).

The names below are imported when first used: a server process imports
``instruments`` (it does nothing unless the crash test armed it) without
loading the rest of the machinery.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tether.crashtest.faults import FaultChoice, FaultKind, FaultPoint
    from tether.crashtest.invariants import Violation, check_round
    from tether.crashtest.results import CrashTestReport, RoundResult
    from tether.crashtest.runner import CrashTestConfig, run_crash_test

_HOMES = {
    "CrashTestConfig": "tether.crashtest.runner",
    "CrashTestReport": "tether.crashtest.results",
    "FaultChoice": "tether.crashtest.faults",
    "FaultKind": "tether.crashtest.faults",
    "FaultPoint": "tether.crashtest.faults",
    "RoundResult": "tether.crashtest.results",
    "Violation": "tether.crashtest.invariants",
    "check_round": "tether.crashtest.invariants",
    "run_crash_test": "tether.crashtest.runner",
}

__all__ = [
    "CrashTestConfig",
    "CrashTestReport",
    "FaultChoice",
    "FaultKind",
    "FaultPoint",
    "RoundResult",
    "Violation",
    "check_round",
    "run_crash_test",
]


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(home), name)
