"""Pipelines: many tables in one file, each an ordinary guarded route, run at once.

Real databases throughout (SQLite, DuckDB, PostgreSQL); the only fault is a real
checkpoint store that fails the promotion after the target committed
(``FaultyStore``), as a kill there would leave it: the table is blocked.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from helpers.cli import run_cli
from helpers.pipelines import (
    build_tables,
    copy_to_postgres,
    duckdb_ids,
    plan_of,
    postgres_ids,
    sqlite_ids,
    write_pipeline,
)
from helpers.postgres_server import postgres_url

from dpone_native_transfer.application import transfer
from dpone_native_transfer.pipeline import load_pipeline
from dpone_native_transfer.pipeline_run import run_tables
from dpone_native_transfer.testing import FaultyStore, InjectedFault, phase_batch

TABLES, ROWS, NEW_ROWS = 20, 120, 30
FAILING, BLOCKED = "t05", "t07"  # a gate refuses t05; t07's promotion fails after its commit


def _settings(names: list[str], **extra: dict[str, Any]) -> dict[str, dict[str, Any]]:
    settings = {name: dict(plan_of(name)) for name in names}
    for name, own in extra.items():
        settings[name] = {**settings.get(name, {}), **own}
    return settings


def _promotion_fails(name: str, run_id: str):
    """``run_table`` for ``run_tables``: table ``name``'s store fails the commit checkpoints
    after the target committed (a kill there leaves the same: the route is blocked)."""

    def run_table(table):
        def wrap(store):
            faulty = FaultyStore(store)
            if table.name == name:
                faulty.fail_batch(phase_batch("checkpoint_committed"), error=InjectedFault("x"))
            return faulty

        return transfer(table.config, run_id, wrap_store=wrap)

    return run_table


def _exactly(found, expected) -> None:
    assert set(found) == set(expected)
    assert set(found.values()) <= {1}


def _scenario(
    tmp_path: Path,
    *,
    source,
    target,
    ids,
    source_ids,
    add_rows,
    schema: str = "",
    jobs: int = 2,
    workers: int = 2,
) -> None:
    """Run 1 (library, with the fault): t05 fails its gate, t07 fails after its commit, the
    rest load. Run 2 (the CLI): t07 is blocked (exit 3), t05 fails again, the rest skip.
    Then t07 is resolved from the target, t05's gate lifted, rows added: run 3 loads only
    the new rows (all of a refreshed table), every table exact. ``schema``: the source
    tables' (PostgreSQL), before each name; ``workers``: the jobs the run can use (a DuckDB
    file's tables load one at a time)."""
    bare = [f"t{n:02d}" for n in range(1, TABLES + 1)]
    named = {name: f"{schema}.{name}" if schema else name for name in bare}
    failing, blocked = named[FAILING], named[BLOCKED]

    def pipeline(**extra: dict[str, Any]) -> Path:
        settings = {named[name]: dict(plan_of(name)) for name in bare}
        for name, own in extra.items():
            settings[named[name]].update(own)
        return write_pipeline(
            tmp_path / "pipeline.toml",
            source=source,
            target=target,
            store=str(tmp_path / "checkpoints.db"),
            tables=[f"{schema}.t*" if schema else "t*"],
            settings=settings,
        )

    pipeline_file = pipeline(t05={"max_rows": 10})
    loaded = load_pipeline(pipeline_file, rows=True)
    assert sorted(loaded.names) == sorted(named.values())
    first = run_tables(
        loaded.tables, "run-1", jobs=jobs, run_table=_promotion_fails(blocked, "run-1")
    )
    outcomes = {run.table: run.outcome for run in first.tables}
    expected = {name: "succeeded" for name in named.values()}
    assert outcomes == expected | {failing: "failed", blocked: "failed"}
    assert {run.table: run.error for run in first.tables if run.error} == {
        failing: "native_transfer_governance_gate_failed",
        blocked: "InjectedFault",
    }
    assert first.exit_code == 1
    for name in bare:
        if name != FAILING:  # t07's target committed: its rows are there once
            _exactly(ids(name), source_ids(name))

    second = run_cli("run", pipeline_file, "--json", "--jobs", jobs)
    assert second.returncode == 3, second.stderr
    summary = json.loads(second.stdout)
    runs = {run["table"]: run for run in summary["tables"]}
    assert runs[blocked]["outcome"] == "blocked"
    assert runs[blocked]["error"] == "native_transfer_manual_reconciliation_required"
    assert runs[failing]["outcome"] == "failed"
    assert runs[failing]["exit_code"] == 1
    assert summary["totals"] | {"seconds": 0} == {
        "tables": TABLES, "succeeded": TABLES - 2, "failed": 1, "blocked": 1, "interrupted": 0,
        "not run": 0, "rows_loaded": sum(r["rows_loaded"] for r in runs.values()),
        "seconds": 0, "jobs": workers, "exit_code": 3,
    }  # fmt: skip
    for name in bare:
        refreshed = plan_of(name).get("strategy") == "full_refresh"
        if name not in (FAILING, BLOCKED):
            assert runs[named[name]]["rows_loaded"] == (ROWS if refreshed else 0), name
    # each failed table's lines name its route as PIPELINE::TABLE
    reference = f"{pipeline_file}::{blocked}"
    assert f"{blocked}: next: `dpone-transfer guard verify {reference}`" in second.stderr

    scan = run_cli("guard", "scan", reference, "--json")
    assert scan.returncode == 3
    batch = json.loads(scan.stdout.splitlines()[0])["batch_id"]
    resolved = run_cli(
        "guard", "resolve", reference, "--batch", batch, "--from-target",
        "--reason", "the ledger holds it", "--operator", "test", "--yes",
    )  # fmt: skip
    assert resolved.returncode == 0, resolved.stdout + resolved.stderr
    pipeline_file = pipeline()  # the gate lifted
    add_rows(NEW_ROWS)
    third = run_cli("run", pipeline_file, "--json")
    assert third.returncode == 0, third.stderr
    runs = {run["table"]: run for run in json.loads(third.stdout)["tables"]}
    for name in bare:
        refreshed = plan_of(name).get("strategy") == "full_refresh"
        expected_rows = ROWS + NEW_ROWS if refreshed or name == FAILING else NEW_ROWS
        assert runs[named[name]]["rows_loaded"] == expected_rows, name
        _exactly(ids(name), source_ids(name))


def test_twenty_sqlite_tables_into_sqlite(tmp_path):
    source = tmp_path / "shop.db"
    build_tables(source, TABLES, ROWS)
    target = tmp_path / "warehouse.db"
    _scenario(
        tmp_path,
        source={"path": str(source)},
        target={"path": str(target)},
        ids=lambda name: sqlite_ids(target, name),
        source_ids=lambda name: sqlite_ids(source, name),
        add_rows=lambda rows: build_tables(source, TABLES, rows, start_id=ROWS + 1),
    )


def test_twenty_sqlite_tables_into_duckdb(tmp_path):
    source = tmp_path / "shop.db"
    build_tables(source, TABLES, ROWS)
    target = tmp_path / "warehouse.duckdb"
    _scenario(
        tmp_path,
        source={"path": str(source)},
        target={"kind": "duckdb", "path": str(target)},
        ids=lambda name: duckdb_ids(target, name),
        source_ids=lambda name: sqlite_ids(source, name),
        add_rows=lambda rows: build_tables(source, TABLES, rows, start_id=ROWS + 1),
        workers=1,
    )


def test_twenty_postgres_tables_into_postgres(tmp_path, postgres_schema):
    import psycopg

    dsn, schema = postgres_schema
    url = postgres_url(dsn)
    lite = tmp_path / "shop.db"
    names = build_tables(lite, TABLES, ROWS)
    copy_to_postgres(lite, dsn, schema, names)

    def add_rows(rows: int) -> None:
        build_tables(lite, TABLES, rows, start_id=ROWS + 1)
        copy_to_postgres(lite, dsn, schema, names)

    target_schema = f"{schema}_target"  # the target tables: <target_schema>.<schema>_tNN
    with psycopg.connect(dsn, autocommit=True) as admin:
        admin.execute(f'CREATE SCHEMA "{target_schema}"')
    try:
        _scenario(
            tmp_path,
            source={"kind": "postgres", "dsn": url},
            target={"kind": "postgres", "dsn": url, "table_prefix": f"{target_schema}."},
            ids=lambda name: postgres_ids(dsn, f"{target_schema}.{schema}_{name}"),
            source_ids=lambda name: postgres_ids(dsn, f"{schema}.{name}"),
            add_rows=add_rows,
            schema=schema,
        )
    finally:
        with psycopg.connect(dsn, autocommit=True) as admin:
            admin.execute(f'DROP SCHEMA IF EXISTS "{target_schema}" CASCADE')
