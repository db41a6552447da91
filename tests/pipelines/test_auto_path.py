"""``path = "auto"``: per table, the path docs/connectors.md names for its source and target,
chosen before the target, reported in the summary, ``--json`` and the evidence (issue 48).

Real SQLite, DuckDB and PostgreSQL; every target's rows are counted against the source.
A pipeline table that names no path runs ``auto``.
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
from collections import Counter
from pathlib import Path
from typing import Any

import psycopg
import pytest
from helpers.cli import run_cli
from helpers.pipelines import (
    build_tables,
    copy_to_postgres,
    duckdb_ids,
    postgres_ids,
    sqlite_ids,
    write_pipeline,
)
from helpers.postgres_server import postgres_url

from dpone_native_transfer.pipeline import load_pipeline
from dpone_native_transfer.pipeline_run import pipeline_summary, run_tables
from dpone_native_transfer.stores.sqlite import SQLiteCheckpointStore

TABLES, ROWS = 3, 150

# (source, target) -> the path auto takes (docs/connectors.md, "Choosing a path")
CHOSEN = {
    ("sqlite", "duckdb"): "lazy-plan",  # DuckDB reads the SQLite file itself
    ("sqlite", "sqlite"): "lazy-plan",  # SQLite attaches it
    ("postgres", "postgres"): "lazy-plan",  # the server copies a table of its own database
    ("postgres", "duckdb"): "legacy",  # PostgreSQL's COPY writes the files DuckDB loads
    ("sqlite", "postgres"): "staged",  # PostgreSQL reads no SQLite file: dpone reads the rows
}


def _without_path(file: Path) -> Path:
    """The pipeline file with no ``path`` in its defaults: every table runs auto."""
    text = file.read_text()
    assert '\npath = "staged"\n' in text
    file.write_text(text.replace('\npath = "staged"\n', "\n", 1))
    return file


def _ids(kind: str, location: Any, table: str) -> Counter[int]:
    if kind == "duckdb":
        return duckdb_ids(location, table)
    if kind == "sqlite":
        return sqlite_ids(location, table)
    return postgres_ids(location, table)


@pytest.mark.parametrize(("source_kind", "target_kind"), sorted(CHOSEN))
def test_auto_takes_the_documented_path_for_each_pair_and_loads_every_row(
    tmp_path: Path, postgres_schema, source_kind: str, target_kind: str
):
    dsn, schema = postgres_schema
    url = postgres_url(dsn)
    lite = tmp_path / "shop.db"
    names = build_tables(lite, TABLES, ROWS)
    if source_kind == "postgres":
        copy_to_postgres(lite, dsn, schema, names)
        source, tables = {"kind": "postgres", "dsn": url}, f"{schema}.t*"
    else:
        source, tables = {"path": str(lite)}, "t*"
    target_schema = f"{schema}_target"
    if target_kind == "postgres":
        with psycopg.connect(dsn, autocommit=True) as admin:
            admin.execute(f'CREATE SCHEMA "{target_schema}"')
        target: dict[str, str] = {"kind": "postgres", "dsn": url}
        target["table_prefix"] = f"{target_schema}."
    else:
        suffix = ".duckdb" if target_kind == "duckdb" else ".db"
        target = {"kind": target_kind, "path": str(tmp_path / f"warehouse{suffix}")}
    file = _without_path(
        write_pipeline(
            tmp_path / "pipeline.toml",
            source=source,
            target=target,
            store=str(tmp_path / "checkpoints.db"),
            tables=tables,
        )
    )
    pipeline = load_pipeline(file)
    assert {table.config.path for table in pipeline.tables} == {"auto"}
    result = run_tables(pipeline.tables, "run-auto", jobs=2)
    expected = CHOSEN[(source_kind, target_kind)]
    assert result.exit_code == 0, [(run.table, run.error) for run in result.tables]
    assert [run.path for run in result.tables] == [expected] * TABLES
    summary = pipeline_summary(result, "run-auto")
    assert {row["path"] for row in summary["tables"]} == {expected}
    with contextlib.closing(SQLiteCheckpointStore(tmp_path / "checkpoints.db")) as store:
        for table in pipeline.tables:
            evidence = store.list_evidence(table.config.route)
            assert [record["path"] for record in evidence] == [expected]
    for run in result.tables:
        name = run.table.rpartition(".")[2]
        where: Any = dsn if target_kind == "postgres" else Path(target["path"])
        loaded_name = f"{target_schema}.{run.target_table.rpartition('.')[2]}"
        loaded = _ids(
            target_kind, where, loaded_name if target_kind == "postgres" else run.target_table
        )
        if source_kind == "postgres":
            assert loaded == postgres_ids(dsn, f"{schema}.{name}")
        else:
            assert loaded == sqlite_ids(lite, name)
        assert sum(loaded.values()) == ROWS
    if target_kind == "postgres":
        with psycopg.connect(dsn, autocommit=True) as admin:
            admin.execute(f'DROP SCHEMA "{target_schema}" CASCADE')


def test_a_plan_duckdb_would_misread_falls_to_staged_before_the_target(tmp_path: Path):
    """A NOCASE partition column: DuckDB would compare its values otherwise than SQLite
    (``PlanInexact``), so auto takes the next path, before anything is armed; a batch column
    needs dpone to read the rows: no lazy-plan either."""
    source = tmp_path / "shop.db"
    with contextlib.closing(sqlite3.connect(source)) as conn:
        conn.execute(
            "CREATE TABLE folded (id INTEGER PRIMARY KEY, region TEXT COLLATE NOCASE,"
            " amount REAL, updated_at INTEGER)"
        )
        conn.executemany(
            "INSERT INTO folded VALUES (?, ?, 1.0, ?)",
            [(n, ["East", "east", "EAST"][n % 3], 1000 + n) for n in range(1, 31)],
        )
        conn.commit()
    build_tables(source, 1, ROWS)
    for batched, expected in ((False, {"folded": "staged", "t01": "lazy-plan"}), (True, None)):
        target = {"kind": "duckdb", "path": str(tmp_path / f"w{batched}.duckdb")}
        if batched:
            target["batch_column"] = "dpone_batch"
        file = _without_path(
            write_pipeline(
                tmp_path / "pipeline.toml",
                source={"path": str(source)},
                target=target,
                store=str(tmp_path / f"checkpoints-{batched}.db"),
                tables=["folded", "t01"],
                settings={"folded": {"partition_column": "region"}},
            )
        )
        result = run_tables(load_pipeline(file).tables, f"run-{batched}", jobs=1)
        assert result.exit_code == 0, [(run.table, run.error) for run in result.tables]
        paths = {run.table: run.path for run in result.tables}
        assert paths == (expected or {"folded": "staged", "t01": "staged"})
        for name in ("folded", "t01"):
            loaded = duckdb_ids(Path(target["path"]), name)
            assert loaded == sqlite_ids(source, name)


def test_a_route_file_runs_auto_and_says_which_path_ran(tmp_path: Path):
    source, target = tmp_path / "shop.db", tmp_path / "warehouse.duckdb"
    build_tables(source, 1, ROWS)
    route = tmp_path / "route.toml"
    route.write_text(
        f'[source]\npath = "{source}"\ntable = "t01"\npartition_column = "region"\n'
        f'[target]\nkind = "duckdb"\npath = "{target}"\ntable = "t01"\n'
        f'[store]\npath = "{tmp_path / "checkpoints.db"}"\n'
        '[transfer]\nstrategy = "full_refresh"\npath = "auto"\n'
    )
    done = run_cli("run", route)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "path auto (lazy-plan)" in done.stdout
    again = run_cli("run", route, "--json")
    assert again.returncode == 0, again.stdout + again.stderr
    shown = json.loads(again.stdout.strip().splitlines()[-1])
    assert (shown["path"], shown["path_ran"]) == ("auto", "lazy-plan")
    assert duckdb_ids(target, "t01") == sqlite_ids(source, "t01")


def test_a_pipeline_sets_its_postgres_tables_parallel_reads(tmp_path: Path, postgres_schema):
    """``parallel`` in ``[defaults]`` or a ``[tables.NAME]``, as a route file's ``[source]``
    (refused, naming the pipeline's key, for a source that does not read it)."""
    dsn, schema = postgres_schema
    lite = tmp_path / "shop.db"
    names = build_tables(lite, TABLES, ROWS)
    copy_to_postgres(lite, dsn, schema, names)
    first = f"{schema}.{names[0]}"
    file = write_pipeline(
        tmp_path / "pipeline.toml",
        source={"kind": "postgres", "dsn": postgres_url(dsn)},
        target={"kind": "duckdb", "path": str(tmp_path / "warehouse.duckdb")},
        store=str(tmp_path / "checkpoints.db"),
        tables=f"{schema}.t*",
        defaults={"parallel": 2, "path": "legacy"},
        settings={first: {"parallel": 1}},
    )
    pipeline = load_pipeline(file)
    parallel = {table.name: table.config.source.parallel for table in pipeline.tables}
    assert parallel == {f"{schema}.{name}": 1 if name == names[0] else 2 for name in names}
    result = run_tables(pipeline.tables, "run-parallel", jobs=2)
    assert result.exit_code == 0, [(run.table, run.error) for run in result.tables]
    for run in result.tables:
        name = run.table.rpartition(".")[2]
        loaded = duckdb_ids(tmp_path / "warehouse.duckdb", run.target_table)
        assert loaded == postgres_ids(dsn, f"{schema}.{name}") and sum(loaded.values()) == ROWS
    local = write_pipeline(
        tmp_path / "local.toml",
        source={"path": str(lite)},
        target={"kind": "duckdb", "path": str(tmp_path / "local.duckdb")},
        store=str(tmp_path / "local.db"),
        tables="t*",
        settings={names[1]: {"parallel": 2}},
    )
    done = run_cli("run", local, "--json")
    assert done.returncode == 2 and json.loads(done.stdout)["diagnostics"] == {
        "key": f"tables.{names[1]}.parallel"
    }
