"""``tether crash-test``: real replicas, real signals, invariants checked from outside.

The command itself is ``tether.cli.crash_test``; this package is its machinery:
``cluster`` (the replica processes), ``load_balancer`` (HAProxy in front of
them, with ``--via-load-balancer``), ``client`` (the HTTP calls), ``reader``
(the turn readers), ``faults``, ``recovery``, ``reference`` (crash-free runs),
``rounds`` and ``conversation_rounds``, ``invariants`` (a package, one module
a group of the design's invariants) and ``conversation_checks``, ``fence``,
``results`` and ``report``.
"""

from tether.crashtest.faults import FaultChoice, FaultKind, FaultPoint
from tether.crashtest.invariants import Violation, check_round
from tether.crashtest.results import CrashTestReport, RoundResult
from tether.crashtest.runner import CrashTestConfig, run_crash_test

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
