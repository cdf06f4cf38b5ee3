# The two set-up commands of the README: `make run` and `make test`.
# Both install into the current Python (no virtual environment is assumed).
PYTHON ?= python3
PIP := $(PYTHON) -m pip install --quiet --disable-pip-version-check
HOST ?= 127.0.0.1
PORT ?= 8000
# Test processes (pytest-xdist): most tests wait on servers and stores rather
# than compute, so a few more than the cores halves the suite's time.
TEST_WORKERS ?= 3

.PHONY: install install-backends install-dev run test lint typecheck docs docs-build unit bench crash-test

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

# The documentation site (mkdocs.yml, docs/): `make docs` serves it with live
# reload; `make docs-build` builds it into site/ (git-ignored) with --strict,
# so a broken link or anchor, or a page left out of nav, fails. Material's
# notice about MkDocs 2 is printed on every run: silenced, it is not a finding.
DOCS_HOST ?= 127.0.0.1:8001
MKDOCS := NO_MKDOCS_2_WARNING=1 $(PYTHON) -m mkdocs

docs: install-dev
	$(MKDOCS) serve --dev-addr $(DOCS_HOST)

docs-build:
	$(MKDOCS) build --strict --site-dir site

# Lint, types, the docs site, then every test. PostgreSQL and Redis tests skip
# without their servers unless TETHER_REQUIRE_SERVICES=1 (set by .ci/run),
# which makes them fail.
test: install-dev lint typecheck docs-build
	$(PYTHON) -m pytest -n $(TEST_WORKERS)

unit: install-dev
	$(PYTHON) -m pytest -n $(TEST_WORKERS) -m "not processes"

bench: install-dev
	$(PYTHON) -m bench

# 20 rounds of mixed faults (kill, term, stop) against real replicas on the
# embedded default store; exits non-zero on any invariant violation.
crash-test: install
	$(PYTHON) -m tether crash-test --rounds 20 --fault mixed
