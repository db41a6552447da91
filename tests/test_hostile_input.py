"""Issue 13: hostile input and hostile environments, each through ``dpone-transfer run``.

Every case is an attack or a new user's mistake that once changed, lost or
forged rows with exit 0; each counts the target's rows against the source.
"""

from __future__ import annotations

import contextlib
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from dpone_native_transfer.testing import build_sample_source

SCRIPT = str(Path(sys.executable).parent / "dpone-transfer")

ROUTE = """\
[source]
path = "source.db"
table = "orders"
partition_column = "region"
cursor_column = "updated_at"
[target]
kind = "{kind}"
path = "{target}"
table = "{table}"
[transfer]
strategy = "{strategy}"
path = "{path}"
[store]
path = "checkpoints.db"
"""


def route(folder: Path, **values: Any) -> Path:
    fields = {"kind": "sqlite", "target": "target.db", "table": "orders_copy"}
    fields |= {"strategy": "incremental_append", "path": "staged", **values}
    path = folder / "route.toml"
    path.write_text(ROUTE.format(**fields), encoding="utf-8")
    return path


def run(route_file: Path, *, code: int = 0) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        [SCRIPT, "run", str(route_file), "--quiet"], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == code, done.stdout + done.stderr
    return done


# 1. an append never drops a target table, whatever the spelling of its name ---------------------


@pytest.mark.parametrize("stored", ["Orders_Copy", "ORDERS_COPY"])
def test_an_append_keeps_a_target_table_whose_stored_name_differs_in_case(
    tmp_path: Path, stored: str
) -> None:
    build_sample_source(tmp_path / "source.db", rows=40, partitions=2)
    with contextlib.closing(sqlite3.connect(tmp_path / "target.db")) as target:
        target.execute("ATTACH DATABASE ? AS src", (str(tmp_path / "source.db"),))
        target.execute(f'CREATE TABLE "{stored}" AS SELECT * FROM src.orders WHERE 0')
        target.executemany(
            f'INSERT INTO "{stored}" (id, region, updated_at) VALUES (?, ?, ?)',
            [(9000 + n, "history", n) for n in range(10)],
        )
        target.commit()
    run(route(tmp_path))
    with contextlib.closing(sqlite3.connect(tmp_path / "target.db")) as target:
        ids = sorted(row[0] for row in target.execute("SELECT id FROM orders_copy"))
        tables = [row[0] for row in target.execute("SELECT name FROM sqlite_master")]
    assert ids == list(range(1, 41)) + [9000 + n for n in range(10)]
    assert stored in tables and "orders_copy" not in tables


@pytest.mark.parametrize(
    "table", ["_dpone_ledger", "_dpone_stage_orders_copy", "_DPONE_new_orders", "_Dpone_x"]
)
@pytest.mark.parametrize("kind", ["sqlite", "duckdb"])
def test_a_target_named_like_the_runtimes_own_tables_is_a_config_error(
    tmp_path: Path, table: str, kind: str
) -> None:
    """A target ``_dpone_stage_orders_copy`` was dropped as another route's staging table."""
    build_sample_source(tmp_path / "source.db", rows=10, partitions=2)
    target = "target.db" if kind == "sqlite" else "target.duckdb"
    done = run(route(tmp_path, kind=kind, target=target, table=table), code=2)
    assert "reserved for dpone's own tables" in done.stderr
    assert '"key": "target.table"' in done.stderr
    assert not (tmp_path / target).exists()
