"""Which optional capabilities your adapter declares, and whether the kit's tests of them passed.

A pytest plugin: name it in your ``conftest.py``::

    pytest_plugins = ["tether.testing.contracts.report"]

and the end of the run prints a section ``tether store capabilities``: for each
store class a contract's ``store`` fixture gave, the tests of the port's
required methods, then every optional capability of its port
(``tether.domain.capabilities``) as ``declared`` (the class overrides the
method) or ``default`` (it keeps the port's), with the outcome of the kit's
tests of it: ``passed (N)``, ``FAILED (F of N)``, ``not run`` (the kit has a
contract for it: its name follows) or ``no contract in the kit``. A capability
declared but not run is one your adapter claims and nothing here checked.

The same rows are kept for code (``capability_reports(config)``), and run
under pytest-xdist too: each test's outcome travels with its report.
"""

from __future__ import annotations

from collections.abc import Generator, Iterable
from dataclasses import dataclass, field
from typing import Any

import pytest

from tether.domain.capabilities import Capability, Port, StoreCapabilities, optional_capabilities
from tether.testing.contracts._support import CONTRACTS, TESTED

_PROPERTY = "tether_store_capabilities"
_REPORTS = pytest.StashKey[dict[str, "StoreReport"]]()


@dataclass
class Outcomes:
    """How the tests of one capability (or of the required methods) went."""

    passed: int = 0
    failed: int = 0
    skipped: int = 0

    def add(self, outcome: str) -> None:
        if outcome == "passed":
            self.passed += 1
        elif outcome == "failed":
            self.failed += 1
        else:
            self.skipped += 1

    @property
    def run(self) -> int:
        return self.passed + self.failed

    def text(self) -> str:
        if self.failed:
            return f"FAILED ({self.failed} of {self.run})"
        if self.passed:
            return f"passed ({self.passed})"
        return f"skipped ({self.skipped})" if self.skipped else "not run"


@dataclass(frozen=True)
class CapabilityRow:
    """One optional capability of a store: declared or not, and its tests."""

    capability: Capability
    declared: bool
    outcomes: Outcomes

    @property
    def passed(self) -> bool:
        """Declared, tested and every test passed."""
        return self.declared and self.outcomes.run > 0 and not self.outcomes.failed

    def text(self) -> str:
        declared = "declared" if self.declared else "default"
        if self.outcomes.run or self.outcomes.skipped:
            tested = self.outcomes.text()
        elif self.capability in CONTRACTS:
            tested = f"not run ({', '.join(CONTRACTS[self.capability])})"
        else:
            tested = "no contract in the kit"
        return f"{self.capability.value:<40} {declared:<9} {tested}"


@dataclass
class StoreReport:
    """What the contract tests found of one store class."""

    store_type: str
    ports: frozenset[Port]
    declared: frozenset[Capability]
    required: Outcomes = field(default_factory=Outcomes)
    optional: dict[Capability, Outcomes] = field(default_factory=dict)

    @property
    def rows(self) -> list[CapabilityRow]:
        """Every optional capability of the store's ports, in the enum's order."""
        return [
            CapabilityRow(
                capability,
                capability in self.declared,
                self.optional.get(capability, Outcomes()),
            )
            for port in sorted(self.ports)
            for capability in optional_capabilities(port)
        ]

    def lines(self) -> list[str]:
        ports = ", ".join(sorted(self.ports)) or "no store port"
        return [
            f"{self.store_type} ({ports})",
            f"  {'required methods':<40} {'':<9} {self.required.text()}",
            *(f"  {row.text()}" for row in self.rows),
        ]


def capability_reports(config: pytest.Config) -> list[StoreReport]:
    """The stores the run's contract tests used, in the order first met."""
    return list(config.stash.get(_REPORTS, {}).values())


def _tested(item: pytest.Item) -> frozenset[Capability]:
    function = getattr(item, "function", None)
    return frozenset(getattr(function, TESTED, frozenset()))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """Note on the test's report which store it tested, and which capabilities
    (where a worker process ran it, the report carries it back)."""
    report = yield
    funcargs: dict[str, Any] = getattr(item, "funcargs", {})
    store = funcargs.get("store")
    if store is not None and (report.when == "call" or report.outcome != "passed"):
        found = StoreCapabilities.of(store)
        if found.ports:
            report.user_properties.append(
                (
                    _PROPERTY,
                    {
                        "store_type": found.store_type,
                        # Plain strings: a worker process sends the report
                        # back through execnet, which cannot serialize enums.
                        "ports": sorted(str(port) for port in found.ports),
                        "declared": sorted(str(value) for value in found.declared),
                        "tested": sorted(str(value) for value in _tested(item)),
                    },
                )
            )
    return report


class _Collector:
    """Adds up the noted reports (on the process that reports: the controller
    under pytest-xdist) and prints them at the end."""

    def __init__(self, config: pytest.Config) -> None:
        self._config = config

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        for name, noted in report.user_properties:
            if name == _PROPERTY and isinstance(noted, dict):
                self._record(report.outcome, noted)

    def _record(self, outcome: str, noted: dict[str, Any]) -> None:
        reports = self._config.stash.setdefault(_REPORTS, {})
        store = reports.get(noted["store_type"])
        if store is None:
            store = reports[noted["store_type"]] = StoreReport(
                noted["store_type"],
                frozenset(Port(port) for port in noted["ports"]),
                frozenset(Capability(value) for value in noted["declared"]),
            )
        tested: Iterable[str] = noted["tested"]
        buckets = [store.optional.setdefault(Capability(value), Outcomes()) for value in tested]
        for bucket in buckets or [store.required]:
            bucket.add(outcome)

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        reports = capability_reports(self._config)
        if not reports:
            return
        terminalreporter.write_sep("=", "tether store capabilities")
        for store in reports:
            for line in store.lines():
                terminalreporter.write_line(line)


def pytest_configure(config: pytest.Config) -> None:
    config.pluginmanager.register(_Collector(config), "tether-store-capabilities")
