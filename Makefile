# The two set-up commands of the README: `make run` and `make test`.
# Both install into the current Python (no virtual environment is assumed).
PYTHON ?= python3
PIP := $(PYTHON) -m pip install --quiet --disable-pip-version-check
HOST ?= 127.0.0.1
PORT ?= 8000
# Test processes (pytest-xdist): most tests wait on servers and stores rather
# than compute, so a few more than the cores halves the suite's time.
TEST_WORKERS ?= 3

.PHONY: install install-backends install-dev run test lint typecheck unit bench crash-test

install:
	$(PIP) -e .

# The PostgreSQL and Redis drivers (the `postgres` and `redis` extras): what
# `tether serve --store postgresql://...` or `--stream-store redis://...` needs.
install-backends:
	$(PIP) -e ".[postgres,redis]"

install-dev:
	$(PIP) -e ".[dev]"

run: install
	$(PYTHON) -m tether serve --host $(HOST) --port $(PORT)

lint:
	$(PYTHON) -m ruff check src tests bench
	$(PYTHON) -m ruff format --check src tests bench

typecheck:
	$(PYTHON) -m mypy

# Lint, types, then every test. PostgreSQL and Redis tests skip without their
# servers unless TETHER_REQUIRE_SERVICES=1 (set by .ci/run), which makes them fail.
test: install-dev lint typecheck
	$(PYTHON) -m pytest -n $(TEST_WORKERS)

unit: install-dev
	$(PYTHON) -m pytest -n $(TEST_WORKERS) -m "not processes"

bench: install-dev
	$(PYTHON) -m bench

# 20 rounds of mixed faults (kill, term, stop) against real replicas on the
# embedded default store; exits non-zero on any invariant violation.
crash-test: install
	$(PYTHON) -m tether crash-test --rounds 20 --fault mixed
