"""Issue 14: resume semantics through ``dpone-transfer run``, counted against the source.

Every source row exactly once in the target, or a refusal before the target
with a named code and the route still retryable.
"""

from __future__ import annotations

import contextlib
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from dpone_native_transfer.testing import build_sample_source

SCRIPT = str(Path(sys.executable).parent / "dpone-transfer")
PATHS = ("legacy", "staged", "file-artifact", "lazy-plan")

ROUTE = """\
[source]
path = "source.db"
table = "orders"
partition_column = "region"
cursor_column = "updated_at"
[target]
kind = "{kind}"
path = "{target}"
table = "orders_copy"
[transfer]
strategy = "{strategy}"
path = "{path}"
[store]
path = "checkpoints.db"
{extra}"""
TARGETS = {"sqlite": "target.db", "duckdb": "target.duckdb", "clickhouse": "chdata"}


def route(folder: Path, *, kind="sqlite", strategy="incremental_append", path="staged", extra=""):
    text = ROUTE.format(kind=kind, target=TARGETS[kind], strategy=strategy, path=path, extra=extra)
    (folder / "route.toml").write_text(text)
    return folder / "route.toml"


def run(route_file: Path, *, code: int = 0) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        [SCRIPT, "run", str(route_file)], capture_output=True, text=True, timeout=180
    )
    assert done.returncode == code, done.stdout + done.stderr
    return done


def target_rows(folder: Path, kind: str) -> int:
    from dpone_native_transfer import ClickHouseSink, DuckDBSink, SQLiteSink

    sinks = {"sqlite": SQLiteSink, "duckdb": DuckDBSink, "clickhouse": ClickHouseSink}
    return sinks[kind](folder / TARGETS[kind], "orders_copy").row_count()


def empty_the_source(folder: Path) -> None:
    with contextlib.closing(sqlite3.connect(folder / "source.db")) as source:
        source.execute("DELETE FROM orders")
        source.commit()


# 5. gates and empty sources --------------------------------------------------------------------


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("kind", ["sqlite", "duckdb", "clickhouse"])
def test_a_full_refresh_of_an_emptied_source_empties_the_target_and_says_so(
    tmp_path: Path, kind: str, path: str
) -> None:
    """An empty source has no partition, so no target call was made: the old rows stayed."""
    build_sample_source(tmp_path / "source.db", rows=30, partitions=3)
    route_file = route(tmp_path, kind=kind, strategy="full_refresh", path=path)
    run(route_file)
    assert target_rows(tmp_path, kind) == 30
    empty_the_source(tmp_path)
    done = run(route_file)
    assert "the source is empty, so the target was emptied" in done.stdout
    assert target_rows(tmp_path, kind) == 0
    build_sample_source(tmp_path / "source.db", rows=5, partitions=1)
    assert "loaded 5 rows" in run(route_file).stdout
    assert target_rows(tmp_path, kind) == 5


@pytest.mark.parametrize("strategy", ["full_refresh", "incremental_append"])
def test_min_rows_fires_on_an_empty_source_before_the_target(tmp_path: Path, strategy: str) -> None:
    build_sample_source(tmp_path / "source.db", rows=30, partitions=3)
    route_file = route(tmp_path, strategy=strategy, extra="[gates]\nmin_rows = 1\n")
    run(route_file)
    empty_the_source(tmp_path)
    done = run(route_file, code=1)
    assert "native_transfer_governance_gate_failed" in done.stderr
    assert '"gate": "min_rows"' in done.stderr and '"rows": 0' in done.stderr
    assert target_rows(tmp_path, "sqlite") == 30  # a full refresh did not empty the target
    scan = subprocess.run(
        [SCRIPT, "guard", "scan", "--store", str(tmp_path / "checkpoints.db")],
        capture_output=True,
        text=True,
    )
    assert scan.returncode == 0, scan.stdout + scan.stderr  # nothing blocks the route


def test_min_rows_fires_on_an_incremental_run_with_no_new_rows(tmp_path: Path) -> None:
    """Every run is gated, also one whose window holds no row; a healing run is not."""
    build_sample_source(tmp_path / "source.db", rows=30, partitions=3)
    route_file = route(tmp_path, extra="[gates]\nmin_rows = 1\n")
    assert "loaded 30 rows" in run(route_file).stdout
    done = run(route_file, code=1)
    assert "native_transfer_governance_gate_failed" in done.stderr
    build_sample_source(tmp_path / "source.db", rows=4, partitions=2, start_id=31)
    assert "loaded 4 rows" in run(route_file).stdout
    assert target_rows(tmp_path, "sqlite") == 34
