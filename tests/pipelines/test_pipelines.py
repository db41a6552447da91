"""Pipelines: many tables in one file, each an ordinary guarded route, run at once.

Real databases throughout (SQLite, DuckDB, PostgreSQL); the only fault is a real
checkpoint store that fails the promotion after the target committed
(``FaultyStore``), as a kill there would leave it: the table is blocked.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import attrs
import pytest
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
from helpers.stores import sqlite_lock_free

from dpone_native_transfer.application import transfer
from dpone_native_transfer.errors import ConfigInvalid
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

    def run_table(table, events):
        def wrap(store):
            faulty = FaultyStore(store)
            if table.name == name:
                faulty.fail_batch(phase_batch("checkpoint_committed"), error=InjectedFault("x"))
            return faulty

        return transfer(table.config, run_id, events=events, wrap_store=wrap)

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
    run_in: str = "threads",
    lazy_plan: bool = True,
) -> None:
    """Run 1 (library, with the fault): t05 fails its gate, t07 fails after its commit, the
    rest load. Run 2 (the CLI): t07 is blocked (exit 3), t05 fails again, the rest skip.
    Then t07 is resolved from the target, t05's gate lifted, rows added: run 3 loads only
    the new rows (all of a refreshed table), every table exact. ``schema``: the source
    tables' (PostgreSQL), before each name; ``workers``: the jobs the run can use (a chDB
    database's tables load one at a time; a DuckDB file's run at once); ``run_in``: the
    command line's ``--workers`` (the library's run 1 takes the fault in threads);
    ``lazy_plan`` False: lazy-plan tables take ``auto`` (a target that cannot pull)."""
    bare = [f"t{n:02d}" for n in range(1, TABLES + 1)]
    named = {name: f"{schema}.{name}" if schema else name for name in bare}
    failing, blocked = named[FAILING], named[BLOCKED]

    def pipeline(**extra: dict[str, Any]) -> Path:
        settings = {named[name]: dict(plan_of(name)) for name in bare}
        for own in settings.values():
            if not lazy_plan and own.get("path") == "lazy-plan":
                own["path"] = "auto"
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
    left = {run.table: run.left_blocked for run in first.tables if run.left_blocked}
    assert list(left) == [blocked] and "the store did not record it" in left[blocked]
    for name in bare:
        if name != FAILING:  # t07's target committed: its rows are there once
            _exactly(ids(name), source_ids(name))

    second = run_cli("run", pipeline_file, "--json", "--jobs", jobs, "--workers", run_in)
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
        "seconds": 0, "jobs": workers, "workers": run_in, "exit_code": 3,
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
    third = run_cli("run", pipeline_file, "--json", "--workers", run_in)
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
    )


def test_twenty_sqlite_tables_into_postgres_in_worker_processes(tmp_path, postgres_schema):
    dsn, schema = postgres_schema
    source = tmp_path / "shop.db"
    build_tables(source, TABLES, ROWS)
    _scenario(
        tmp_path,
        source={"path": str(source)},
        target={"kind": "postgres", "dsn": postgres_url(dsn), "table_prefix": f"{schema}."},
        ids=lambda name: postgres_ids(dsn, f"{schema}.{name}"),
        source_ids=lambda name: sqlite_ids(source, name),
        add_rows=lambda rows: build_tables(source, TABLES, rows, start_id=ROWS + 1),
        run_in="processes",
        lazy_plan=False,  # PostgreSQL reads no SQLite file
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


def test_a_public_table_whose_name_has_a_dot_is_named_apart_from_a_schemas_table(
    tmp_path, postgres_dsn
):
    """A route splits a table's name at its first dot: ``public."a.b"`` was named ``a.b``,
    which names table ``b`` of schema ``a``: that one was copied in its place (exit 0), or,
    without it, the table was not found. Its name is now ``public.a.b``."""
    import uuid

    import psycopg

    from dpone_native_transfer.discover import read_catalog

    database = f"dots_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(postgres_dsn, autocommit=True) as admin:
        admin.execute(f"CREATE DATABASE {database}")
    try:
        dsn = psycopg.conninfo.make_conninfo(postgres_dsn, dbname=database)
        with psycopg.connect(dsn, autocommit=True) as db:
            db.execute('CREATE TABLE public."a.b" (id integer PRIMARY KEY, v text)')
            db.execute("INSERT INTO public.\"a.b\" SELECT i, 'p' FROM generate_series(1, 5) i")
            db.execute("CREATE SCHEMA a")
            db.execute("CREATE TABLE a.b (id integer PRIMARY KEY, v text)")
            db.execute("INSERT INTO a.b SELECT i, 'a' FROM generate_series(1, 3) i")
        url = postgres_url(dsn)
        assert sorted(t.name for t in read_catalog("postgres", url)) == ["a.b", "public.a.b"]
        pipeline_file = write_pipeline(
            tmp_path / "p.toml", source={"kind": "postgres", "dsn": url},
            target={"path": str(tmp_path / "w.db")}, store=str(tmp_path / "c.db"),
            tables=["public.a.b", "a.b"], defaults={"strategy": "full_refresh"},
        )  # fmt: skip
        done = run_cli("run", pipeline_file)
        assert done.returncode == 0, done.stderr
        with contextlib.closing(sqlite3.connect(tmp_path / "w.db")) as db:
            copied = {
                t: db.execute(f"SELECT v, count(*) FROM {t}").fetchone()
                for t in ("public_a_b", "a_b")
            }
        assert copied == {"public_a_b": ("p", 5), "a_b": ("a", 3)}
    finally:
        with psycopg.connect(postgres_dsn, autocommit=True) as admin:
            admin.execute(f"DROP DATABASE IF EXISTS {database} WITH (FORCE)")


# -- bad input: refused before any table runs, naming the key ---------------------------------


@pytest.fixture
def shop(tmp_path) -> Path:
    source = tmp_path / "shop.db"
    build_tables(source, 3, 20)
    build_tables(source, 0, 0)
    with sqlite3.connect(source) as conn:
        conn.execute("CREATE TABLE scratch_tmp (id INTEGER PRIMARY KEY, note TEXT)")
    conn.close()
    return source


def _bad(tmp_path: Path, shop: Path, **changes: Any) -> tuple[int, str]:
    sections = {
        "source": {"path": str(shop)},
        "target": {"path": str(tmp_path / "warehouse.db")},
        "store": str(tmp_path / "checkpoints.db"),
        "tables": ["t*"],
    }
    sections.update(changes)
    pipeline_file = write_pipeline(tmp_path / "bad.toml", **sections)
    done = run_cli("run", pipeline_file)
    assert done.stdout == ""
    assert not (tmp_path / "warehouse.db").exists()  # nothing ran
    return done.returncode, done.stderr.splitlines()[0]


@pytest.mark.parametrize(
    ("changes", "line"),
    [
        (
            {"tables": ["t01", "orderz"]},
            "error: native_transfer_config_invalid: pipeline.tables[1] names no table of the "
            "source",
        ),
        (
            {"tables": ["t*", "sales.*"]},
            "error: native_transfer_config_invalid: pipeline.tables[1] matches no table of the "
            "source",
        ),
        (
            {"store": "shop.db"},
            "error: native_transfer_config_invalid: store.path is the source's own file: give "
            "the store a file of its own",
        ),
        (
            {"store": "warehouse.db"},
            "error: native_transfer_config_invalid: store.path is the target's own file: give "
            "the store a file of its own",
        ),
        (  # SQLite folds ASCII letters only: a long s is no s (str.casefold made it one)
            {"tables": ["t01", "\u017fcratch_tmp"]},
            "error: native_transfer_config_invalid: pipeline.tables[1] names no table of the "
            "source",
        ),
        (
            {"tables": ["t01", "\u017fcratch*"]},
            "error: native_transfer_config_invalid: pipeline.tables[1] matches no table of the "
            "source",
        ),
        (
            {"settings": {"t01": {"cursor_colum": "updated_at"}}},
            "error: native_transfer_config_invalid: tables.t01.cursor_colum is not a known key; "
            "known: target_table, strategy, path, chunk_rows, artifact_dir, schema_contract, "
            "on_bad_value, quarantine_values, partition_column, partition_by, partition_rows, "
            "cursor_column, lag, on_null_cursor, primary_key, deleted_column, parallel, min_rows, "
            "max_rows, recovery",
        ),
        (
            {"settings": {"t02": {"cursor_column": "changed_at"}}},
            "error: native_transfer_config_invalid: tables.t02.cursor_column names no column of "
            "source table 't02'",
        ),
        (
            {"settings": {"t02": {"strategy": "upsert"}}},
            "error: native_transfer_config_invalid: tables.t02.strategy must be one of: "
            "full_refresh, incremental_append, merge",
        ),
        (
            {"defaults": {"chunk_rows": 0}},
            "error: native_transfer_config_invalid: defaults.chunk_rows must be an integer from "
            "1 to 10,000,000",
        ),
        (
            {"settings": {"orders": {}}},
            "error: native_transfer_config_invalid: tables.orders names no table of the source",
        ),
        (
            {"settings": {"t01": {"lag": 1}, "T01": {}}},
            "error: native_transfer_config_invalid: tables.T01 names source table 't01', as "
            "another [tables] section does",
        ),
        (
            {"settings": {"t01": {"target_table": "t02"}}},
            "error: native_transfer_config_invalid: tables.t02.target_table is the target table "
            'of tables.t01 too: tables share a target table only when each names it with its '
            'own target_table and appends (strategy = "incremental_append")',
        ),
        (
            {"target": {"path": "w.db", "table_prefix": 3}},
            "error: native_transfer_config_invalid: target.table_prefix must be a string, not "
            "an integer",
        ),
        (
            {"source": {"kind": "postgres", "path": "shop.db"}},
            "error: native_transfer_config_invalid: source.path is not used by source.kind = "
            "'postgres'",
        ),
        (
            {"tables": ["!t*"]},
            "error: native_transfer_config_invalid: pipeline.tables selects no table: its "
            "patterns take out every match",
        ),
        (
            {"source": {"path": 5}},
            "error: native_transfer_config_invalid: source.path must be a string, not an integer",
        ),
        (
            {"defaults": {"strategy": "merge", "primary_key": ["id", "nope_k"]}},
            "error: native_transfer_config_invalid: defaults.primary_key names no column of "
            "source table 't01'",
        ),
        (
            {"settings": {"t02": {"strategy": "merge", "deleted_column": "gone"}}},
            "error: native_transfer_config_invalid: tables.t02.deleted_column names no column "
            "of source table 't02'",
        ),
    ],
    ids=[
        "unknown-table", "pattern-matches-nothing", "store-is-source", "store-is-target",
        "non-ascii-fold", "non-ascii-fold-pattern",
        "unknown-key", "unknown-column",
        "bad-strategy", "bad-default", "unknown-table-section", "two-sections-one-table",
        "two-tables-one-target",
        "bad-prefix", "location-of-another-kind", "selects-nothing", "source-path-type",
        "unknown-primary-key", "unknown-deleted-column",
    ],
)  # fmt: skip
def test_a_bad_pipeline_is_refused_before_any_table_runs(tmp_path, shop, changes, line):
    code, first = _bad(tmp_path, shop, **changes)
    assert (code, first) == (2, line)


def test_a_merge_table_without_a_key_is_refused_before_any_table_runs(tmp_path, shop):
    """It failed once its turn came, exit 1 for the pipeline (a retry may succeed: it never
    would) while the other tables loaded."""
    with contextlib.closing(sqlite3.connect(shop)) as conn:
        conn.execute("CREATE TABLE t_keyless (k INTEGER, note TEXT)")
        conn.commit()
    code, first = _bad(tmp_path, shop, defaults={"strategy": "merge"})
    assert (code, first) == (
        2,
        "error: native_transfer_config_invalid: tables.t_keyless.primary_key is required: "
        "source table 't_keyless' has no primary key of its own and the table merges, so name "
        "the column(s) that identify a row",
    )


def test_a_pipeline_whose_tables_fail_as_invalid_exits_2_not_1(tmp_path, shop, monkeypatch):
    """An ``env:`` store whose variable is not set fails each table with exit code 2; the
    pipeline said 1 ("a retry may succeed"). One table failing otherwise makes it 1 again."""
    monkeypatch.delenv("DPONE_TEST_UNSET_STORE", raising=False)
    file = write_pipeline(
        tmp_path / "env.toml",
        source={"path": str(shop)},
        target={"path": str(tmp_path / "warehouse.db")},
        store="env:DPONE_TEST_UNSET_STORE",
        tables=["t*"],
    )
    done = run_cli("run", file, "--json")
    shown = json.loads(done.stdout)
    assert [table["exit_code"] for table in shown["tables"]] == [2, 2, 2]
    assert done.returncode == shown["totals"]["exit_code"] == 2
    pipeline = load_pipeline(file)
    mended = run_tables(pipeline.tables, "run-codes", jobs=1)
    assert mended.exit_code == 2
    runs = list(mended.tables)
    runs[1] = attrs.evolve(runs[1], exit_code=1)  # one failure a retry may mend
    assert attrs.evolve(mended, tables=tuple(runs)).exit_code == 1


@pytest.mark.parametrize(
    ("where", "line"),
    [
        ("shop.db", "target.path is the source's own file: give the target a file of its own"),
        (".", "target.path is a folder, not a database file"),
        ("/dev/null", "target.path is a device, a pipe or a socket, not a database file"),
    ],
)
def test_a_target_file_that_is_the_source_or_a_folder_is_refused_before_any_table(
    tmp_path, shop, where, line
):
    """Each table used to fail alone (exit 1), the source's own file after a 30 s wait."""
    code, first = _bad(tmp_path, shop, target={"path": str(tmp_path / where)})
    assert (code, first) == (2, f"error: native_transfer_config_invalid: {line}")


def test_a_second_ctrl_c_reports_a_table_it_left_running_as_interrupted(tmp_path, shop):
    """A table still running when a second Ctrl-C ends the wait was reported "not run", as
    if it had never started (it may have committed); the JSON's exit code was 1, not 130."""
    import _thread
    import threading

    pipeline_file = write_pipeline(
        tmp_path / "p.toml", source={"path": str(shop)}, target={"path": str(tmp_path / "w.db")},
        store=str(tmp_path / "c.db"), tables=["t*"],
    )  # fmt: skip
    tables = load_pipeline(pipeline_file).tables
    running, release = threading.Event(), threading.Event()

    def stuck(table: Any, events: Any) -> Any:  # an engine call deaf to the stop
        running.set()
        release.wait(60)
        raise KeyboardInterrupt

    def ctrl_c_twice() -> None:
        running.wait(30)
        for _ in range(2):
            time.sleep(0.3)
            _thread.interrupt_main()

    threading.Thread(target=ctrl_c_twice, daemon=True).start()
    try:
        result = run_tables(tables, "run-1", jobs=1, run_table=stuck)
    finally:
        release.set()
    outcomes = [run.outcome for run in result.tables]
    assert outcomes == ["interrupted"] + ["not run"] * (len(tables) - 1)
    assert isinstance(result.interrupted, KeyboardInterrupt)
    assert result.exit_code == 130 == result.totals()["exit_code"]


def test_a_failure_around_a_tables_run_is_that_tables_not_a_silent_interruption(tmp_path, shop):
    """A progress report (or a worker) failing in a worker thread stopped the run: the table
    it was on showed as interrupted in 0 s with no error, exit 1 and nothing else said."""
    pipeline_file = write_pipeline(
        tmp_path / "p.toml", source={"path": str(shop)}, target={"path": str(tmp_path / "w.db")},
        store=str(tmp_path / "c.db"), tables=["t*"],
    )  # fmt: skip
    tables = load_pipeline(pipeline_file).tables

    def report(event: str, number: int, table: Any, run: Any) -> None:
        if number == 2 and event == "started":
            raise OSError("the console went away")

    result = run_tables(tables, "run-1", jobs=1, report=report)
    runs = [(run.outcome, run.error) for run in result.tables]
    assert runs == [("succeeded", None), ("failed", "OSError")] + [("not run", None)] * (
        len(tables) - 2
    )
    assert isinstance(result.tables[1].failure, OSError) and result.exit_code == 1


def test_a_pipeline_section_or_key_the_file_may_not_have_is_named(tmp_path, shop):
    pipeline_file = write_pipeline(
        tmp_path / "p.toml",
        source={"path": str(shop), "table": "t01"},
        target={"path": "w.db"},
        store="c.db",
        tables=["t*"],
    )
    done = run_cli("run", pipeline_file)
    assert done.returncode == 2
    assert done.stderr.startswith(
        "error: native_transfer_config_invalid: source.table is not a known key; known: kind, "
        "path, dsn\n"
    )
    assert "Traceback" not in done.stderr
    pipeline_file.write_text(pipeline_file.read_text() + "[extra]\n")
    assert "extra is not a known section" in run_cli("run", pipeline_file).stderr


def test_patterns_select_and_exclusions_take_out(tmp_path, shop):
    pipeline_file = write_pipeline(
        tmp_path / "p.toml",
        source={"path": str(shop)},
        target={"path": "w.db", "table_prefix": "raw_"},
        store="c.db",
        tables=["t03", "*", "!*_tmp", "!t0[3]"],  # a name stays in, whatever takes it out
    )
    pipeline = load_pipeline(pipeline_file)
    assert pipeline.names == ["t03", "t01", "t02"]
    assert [t.config.sink.table for t in pipeline.tables] == ["raw_t03", "raw_t01", "raw_t02"]
    assert [t.config.route for t in pipeline.tables] == [
        t.config.route for t in (load_pipeline(pipeline_file).tables)
    ]
    assert pipeline.selected(["t02", "t02"])[0].name == "t02"
    with pytest.raises(ConfigInvalid, match=r": --tables names a table that is not in the"):
        pipeline.selected(["scratch_tmp"])
    done = run_cli("run", pipeline_file, "--tables", "t01,nope")
    assert done.returncode == 2
    assert "its tables: t03, t01, t02" in done.stderr


def test_a_table_is_the_route_a_route_file_of_it_would_be(tmp_path, shop):
    pipeline_file = write_pipeline(
        tmp_path / "p.toml",
        source={"path": str(shop)},
        target={"path": str(tmp_path / "w.db")},
        store=str(tmp_path / "c.db"),
        tables=["t01"],
        settings={"t01": {"cursor_column": "updated_at", "target_table": "t01_copy"}},
    )
    route_file = tmp_path / "route.toml"
    route_file.write_text(
        f'[source]\npath = "{shop}"\ntable = "t01"\ncursor_column = "updated_at"\n'
        f'[target]\npath = "{tmp_path / "w.db"}"\ntable = "t01_copy"\n'
        '[transfer]\nstrategy = "incremental_append"\npath = "staged"\n'
        f'[store]\npath = "{tmp_path / "c.db"}"\n'
    )
    assert run_cli("run", f"{pipeline_file}::t01").returncode == 0
    again = run_cli("run", route_file, "--json")  # the same route: nothing new to load
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout)["rows_loaded"] == 0
    shown = run_cli("state", "show", f"{pipeline_file}::t01", "--json")
    assert json.loads(shown.stdout)["target"] == "agrees with the checkpoint store"
    assert json.loads(shown.stdout)["route"]["target_table"] == "t01_copy"
    # a pipeline file where a route file is taken, without a table, says how to name one
    done = run_cli("state", "show", pipeline_file)
    assert done.returncode == 2
    assert "is a pipeline file: name one of its tables as PIPELINE::TABLE; its tables: t01" in (
        done.stderr
    )
    assert run_cli("run", route_file, "--jobs", "2").returncode == 2
    assert "names a table (::TABLE) of a route file" in run_cli("run", f"{route_file}::t01").stderr


def test_a_table_named_with_the_reference_separator_is_named_by_reference(tmp_path):
    """``PIPELINE::a::b`` names table ``a::b``: the reference was cut at its last ``::``,
    so the commands a failure prints for that table failed when pasted."""
    source = tmp_path / "s.db"
    with contextlib.closing(sqlite3.connect(source)) as db:
        db.execute('CREATE TABLE "a::b" (id INTEGER PRIMARY KEY, v TEXT)')
        db.executemany('INSERT INTO "a::b" VALUES (?, ?)', [(i, "x") for i in range(1, 6)])
        db.commit()
    pipeline_file = write_pipeline(
        tmp_path / "p.toml", source={"path": str(source)},
        target={"path": str(tmp_path / "w.db")}, store=str(tmp_path / "c.db"),
        tables=[], settings={"a::b": {}},
    )  # fmt: skip
    assert run_cli("run", pipeline_file).returncode == 0
    shown = run_cli("state", "show", f"{pipeline_file}::a::b", "--json")
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["route"]["source_table"] == "a::b"


def test_a_table_named_with_a_newline_is_shown_on_one_line(tmp_path):
    """A newline in a table's name was printed as it is: the progress line, the summary row
    and each failure line split, and the name could forge an ``error: ...`` line. Each shows
    it escaped now, and the command a failure prints is one line a shell still reads."""
    forged = "t\nerror: native_transfer_manual_reconciliation_required: forged"
    source = tmp_path / "s.db"
    with contextlib.closing(sqlite3.connect(source)) as db:
        db.execute(f'CREATE TABLE "{forged}" (id INTEGER PRIMARY KEY, v TEXT)')
        db.executemany(f'INSERT INTO "{forged}" VALUES (?, ?)', [(i, "x") for i in range(1, 6)])
        db.commit()
    pipeline_file = write_pipeline(
        tmp_path / "p.toml", source={"path": str(source)},
        target={"path": str(tmp_path / "w.db")}, store=str(tmp_path / "c.db"),
        tables=[], settings={forged: {}},
    )  # fmt: skip
    done = run_cli("run", pipeline_file)
    assert done.returncode == 0, done.stderr
    (tmp_path / "c.db").unlink()  # the store lost: the next run is refused, with commands
    refused = run_cli("run", pipeline_file)
    assert refused.returncode == 3
    lines = (done.stdout + done.stderr + refused.stdout + refused.stderr).splitlines()
    assert not [line for line in lines if line.startswith("error: native_transfer_manual")]
    assert any("t\\nerror: native_transfer_manual" in line for line in done.stdout.splitlines())
    commands = [line for line in refused.stderr.splitlines() if "state restore $'" in line]
    assert commands and "::t\\nerror" in commands[0]


def test_a_pipeline_merges_its_tables_on_their_own_primary_keys(tmp_path):
    """``strategy = "merge"`` in the defaults: each table merges on the key its source table
    declares (``id``), so an updated row replaces its old version and a deleted one leaves
    (``deleted_column``), table by table."""
    source, target = tmp_path / "shop.db", tmp_path / "warehouse.duckdb"
    names = build_tables(source, 3, 40)
    with sqlite3.connect(source) as db:
        for name in names:
            db.execute(f'ALTER TABLE "{name}" ADD COLUMN gone INTEGER NOT NULL DEFAULT 0')
    db.close()
    pipeline_file = write_pipeline(
        tmp_path / "p.toml",
        source={"path": str(source)},
        target={"kind": "duckdb", "path": str(target)},
        store=str(tmp_path / "c.db"),
        tables="t*",
        defaults={"strategy": "merge", "cursor_column": "updated_at", "deleted_column": "gone"},
    )
    assert run_cli("run", pipeline_file).returncode == 0
    with sqlite3.connect(source) as db:
        for name in names:  # 5 rows updated, 2 deleted, each with a newer cursor
            db.execute(f'UPDATE "{name}" SET amount = -1, updated_at = 2000000 + id WHERE id <= 5')
            db.execute(f'UPDATE "{name}" SET gone = 1, updated_at = 3000000 + id WHERE id > 38')
    db.close()
    done = run_cli("run", pipeline_file, "--json")
    assert done.returncode == 0, done.stderr
    import duckdb

    with sqlite3.connect(source) as db, duckdb.connect(str(target)) as warehouse:
        for name in names:
            kept = db.execute(
                f'SELECT id, amount FROM "{name}" WHERE gone = 0 ORDER BY id'
            ).fetchall()
            loaded = warehouse.execute(f'SELECT id, amount FROM "{name}" ORDER BY id').fetchall()
            assert loaded == kept and len(kept) == 38, name
    db.close()


def test_shards_fan_into_one_target_table_one_after_another(tmp_path):
    shards = tmp_path / "shards.db"
    build_tables(shards, 2, 50)
    build_tables(shards, 1, 0)
    with sqlite3.connect(shards) as conn:  # t02's ids follow t01's: the shards' rows differ
        conn.execute("UPDATE t02 SET id = id + 1000")
    conn.close()
    pipeline_file = write_pipeline(
        tmp_path / "p.toml",
        source={"path": str(shards)},
        target={"path": str(tmp_path / "w.db")},
        store=str(tmp_path / "c.db"),
        tables=["t0*"],
        settings={"t01": {"target_table": "all"}, "t02": {"target_table": "all"}},
    )
    pipeline = load_pipeline(pipeline_file)
    assert pipeline.tables[0].group == pipeline.tables[1].group
    done = run_cli("run", pipeline_file, "--json", "--jobs", "2")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["totals"]["jobs"] == 1  # one queue: the lease never refuses
    found = sqlite_ids(tmp_path / "w.db", "all")
    assert set(found) == set(sqlite_ids(shards, "t01")) | set(sqlite_ids(shards, "t02"))
    assert set(found.values()) == {1}
    refresh = write_pipeline(
        tmp_path / "p.toml",
        source={"path": str(shards)},
        target={"path": str(tmp_path / "w.db")},
        store=str(tmp_path / "c.db"),
        tables=["t0*"],
        settings={
            "t01": {"target_table": "all", "strategy": "full_refresh"},
            "t02": {"target_table": "all"},
        },
    )
    refused = run_cli("run", refresh)
    assert refused.returncode == 2
    assert "tables.t01.target_table is the target table of tables.t02 too" in refused.stderr


# -- discover ---------------------------------------------------------------------------------


def test_discover_lists_tables_and_writes_a_pipeline_that_runs(tmp_path, shop):
    listed = run_cli("discover", shop, "--json")
    assert listed.returncode == 0, listed.stderr
    tables = {table["table"]: table for table in json.loads(listed.stdout)}
    assert sorted(tables) == ["scratch_tmp", "t01", "t02", "t03"]
    assert tables["t01"] == {
        "table": "t01", "rows": 20, "columns": {
            "id": "integer", "region": "text", "amount": "real", "updated_at": "integer"
        },
        "primary_key": ["id"], "range_key": "id", "cursor_candidates": ["updated_at", "id"],
        "partition_candidates": ["id"],
    }  # fmt: skip
    out = tmp_path / "out"
    out.mkdir()
    written = run_cli("discover", shop, "--write", out / "pipeline.toml")
    assert written.returncode == 0, written.stderr
    assert (
        written.stdout.splitlines()[-1] == f"4 tables; wrote the pipeline file {out}/pipeline.toml"
    )
    text = (out / "pipeline.toml").read_text()
    assert 'path = "../shop.db"' in text  # relative to the pipeline file, where it is read
    assert 'cursor_column = "updated_at"' in text
    assert run_cli("discover", shop, "--write", out / "pipeline.toml").returncode == 2  # exists
    source = shop.read_bytes()  # --force replaces a pipeline file only, never the source
    replaced = run_cli("discover", shop, "--write", shop, "--force")
    assert replaced.returncode == 2 and "not a pipeline file" in replaced.stderr
    assert shop.read_bytes() == source
    ran = run_cli("run", out / "pipeline.toml", "--json")
    assert ran.returncode == 0, ran.stderr
    assert json.loads(ran.stdout)["totals"]["rows_loaded"] == 60
    for name in ("t01", "t02", "t03"):
        _exactly(sqlite_ids(out / "warehouse.db", name), sqlite_ids(shop, name))
    build_tables(shop, 3, 5, start_id=21)
    again = json.loads(run_cli("run", out / "pipeline.toml", "--json").stdout)
    assert again["totals"]["rows_loaded"] == 15


def _name_tables(shop: Path, names: list[str]) -> None:
    """A table per name, its number in ``names`` plus one rows."""
    with contextlib.closing(sqlite3.connect(shop)) as db:
        for number, name in enumerate(names):
            quoted = '"' + name + '"'
            db.execute(f"CREATE TABLE {quoted} (id INTEGER PRIMARY KEY, v TEXT)")
            db.executemany(
                f"INSERT INTO {quoted} VALUES (?, ?)", [(i, name) for i in range(number + 1)]
            )
        db.commit()


def test_discover_writes_tables_whose_names_read_as_patterns_by_their_sections(tmp_path):
    """``[pipeline] tables`` reads ``!bang`` as taking matches out and ``x[1]`` as a
    character class: listed there, neither matched a table and the file written was
    refused (exit 2). Their own ``[tables.NAME]`` sections select them instead."""
    shop = tmp_path / "shop.db"
    names = ["!bang", "x[1]", "a*b", "plain"]
    _name_tables(shop, names)
    written = run_cli("discover", shop, "--write", tmp_path / "pipeline.toml")
    assert written.returncode == 0, written.stderr
    assert 'tables = ["plain"]' in (tmp_path / "pipeline.toml").read_text()
    ran = run_cli("run", tmp_path / "pipeline.toml", "--json")
    assert ran.returncode == 0, ran.stderr
    assert json.loads(ran.stdout)["totals"]["rows_loaded"] == 1 + 2 + 3 + 4
    for name in names:
        _exactly(sqlite_ids(tmp_path / "warehouse.db", name), sqlite_ids(shop, name))


@pytest.mark.parametrize("into", ["duckdb", "clickhouse"])
def test_discover_names_the_target_tables_a_default_name_would_not_give(tmp_path, into):
    """``dot.ted``'s default target table is ``dot_ted``, another table's: the file written
    was refused (exit 2, naming a target_table no one wrote). chDB reads ``*``, ``?`` and
    ``{`` in a table name as a file path pattern: the table failed inside the target call,
    blocked. A table named "" cannot be selected: the whole file was refused. Now each gets
    a free target table (or is left out, said so), and the file runs as written; ``--tables``
    takes a SQLite table's name in any ASCII case, as ``[pipeline] tables`` does."""
    shop = tmp_path / "shop.db"
    names = ["dot.ted", "dot_ted", "Star*", "q?", "", "plain"]
    _name_tables(shop, names)
    target = ["--target", tmp_path / "wh.duckdb"]
    if into == "clickhouse":
        target = ["--target", tmp_path / "wh", "--target-kind", "clickhouse"]
    pipeline = tmp_path / "pipeline.toml"
    written = run_cli("discover", shop, "--write", pipeline, *target)
    assert written.returncode == 0, written.stderr
    assert "# left out: table ''" in pipeline.read_text()
    selected = run_cli("run", pipeline, "--tables", "PLAIN,DOT_TED", "--json")
    assert selected.returncode == 0, selected.stderr
    assert {t["table"] for t in json.loads(selected.stdout)["tables"]} == {"plain", "dot_ted"}
    ran = run_cli("run", pipeline, "--json")
    assert ran.returncode == 0, ran.stderr
    tables = {t["table"]: t["target_table"] for t in json.loads(ran.stdout)["tables"]}
    assert tables["dot_ted"] == "dot_ted" and tables["dot.ted"] == "dot_ted_2"
    if into == "clickhouse":
        assert (tables["Star*"], tables["q?"]) == ("Star_", "q_")
        from dpone_native_transfer.connectors.clickhouse import ClickHouseSink

        counts = {
            name: ClickHouseSink(str(tmp_path / "wh"), table).row_count()
            for name, table in tables.items()
        }
    else:
        import duckdb

        with duckdb.connect(str(tmp_path / "wh.duckdb")) as db:
            counts = {
                name: db.execute(f'SELECT count(*) FROM "{table}"').fetchone()[0]
                for name, table in tables.items()
            }
    assert counts == {name: names.index(name) + 1 for name in names if name}


def test_a_sqlite_tables_name_in_another_case_is_that_table_once(tmp_path, shop):
    """SQLite matches table names in any ASCII case. ``[tables.T01]`` was refused as naming
    no table, and ``--tables t01,T01`` ran ``t01`` twice, both lines of the summary showing
    the second run's 0 rows. Now a section in another case sets its table, and a table
    named twice runs once."""
    pipeline_file = write_pipeline(
        tmp_path / "p.toml", source={"path": str(shop)},
        target={"path": str(tmp_path / "warehouse.db")}, store=str(tmp_path / "checkpoints.db"),
        tables=["t01", "t02"], settings={"T01": {"target_table": "first"}},
    )  # fmt: skip
    done = run_cli("run", pipeline_file, "--tables", "t01,T01,t02", "--json")
    assert done.returncode == 0, done.stderr
    ran = json.loads(done.stdout)
    assert [(t["table"], t["target_table"]) for t in ran["tables"]] == [
        ("t01", "first"), ("t02", "t02"),
    ]  # fmt: skip
    assert [t["rows_loaded"] for t in ran["tables"]] == [20, 20]
    assert ran["totals"]["rows_loaded"] == 40
    _exactly(sqlite_ids(tmp_path / "warehouse.db", "first"), sqlite_ids(shop, "t01"))


def test_discover_reads_a_postgres_source_named_by_an_environment_variable(
    tmp_path, postgres_schema
):
    dsn, schema = postgres_schema
    lite = tmp_path / "shop.db"
    copy_to_postgres(lite, dsn, schema, build_tables(lite, 2, 30))
    env = {"SHOP_DSN": postgres_url(dsn)}
    listed = run_cli("discover", "env:SHOP_DSN", "--json", env=env)
    assert listed.returncode == 0, listed.stderr
    mine = {t["table"]: t for t in json.loads(listed.stdout) if t["table"].startswith(schema)}
    assert sorted(mine) == [f"{schema}.t01", f"{schema}.t02"]
    assert mine[f"{schema}.t01"]["range_key"] == "id"
    assert mine[f"{schema}.t01"]["rows"] == 30  # analysed by the copy
    out = tmp_path / "out"
    out.mkdir()
    refused = run_cli("discover", postgres_url(dsn), "--write", out / "p.toml")
    assert refused.returncode == 2
    assert "SOURCE holds a password, which --write would put into the file" in refused.stderr
    assert postgres_url(dsn) not in refused.stderr + refused.stdout
    written = run_cli(
        "discover", "env:SHOP_DSN", "--write", out / "p.toml", "--target", out / "w.duckdb",
        env=env,
    )  # fmt: skip
    assert written.returncode == 0, written.stderr
    text = (out / "p.toml").read_text()
    assert 'dsn = "env:SHOP_DSN"' in text
    assert f'[tables."{schema}.t01"]' in text
    ran = run_cli(
        "run", out / "p.toml", "--tables", f"{schema}.t01,{schema}.t02", "--json", env=env
    )
    assert ran.returncode == 0, ran.stderr
    assert json.loads(ran.stdout)["totals"]["rows_loaded"] == 60
    for name in ("t01", "t02"):
        _exactly(duckdb_ids(out / "w.duckdb", f"{schema}_{name}"), sqlite_ids(lite, name))


# -- signals ----------------------------------------------------------------------------------


@pytest.mark.parametrize("run_in", ["threads", "processes"])
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_stops_every_running_table_as_a_single_route_stops(tmp_path, signum, run_in):
    """The signal reaches the pipeline's process alone (a worker process has it passed on)."""
    work = tmp_path / "work"
    work.mkdir()
    source, pipeline_file = _four_tables(
        tmp_path, 150_000, chunk_rows=500, partition_rows=5_000, artifact_dir=str(work)
    )
    child = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "dpone_native_transfer",
            "run",
            str(pipeline_file),
            "--jobs",
            "2",
            "--workers",
            run_in,
        ],  # fmt: skip
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        # Ctrl-C's default, as in a terminal: a shell's background job (``pytest &``)
        # passes SIGINT on ignored, which the command rightly leaves alone
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    assert child.stderr is not None
    assert child.stderr.readline().endswith(": started\n")
    for _ in range(600):  # a worker process first starts its interpreter
        if (tmp_path / "c.db").exists():
            break
        time.sleep(0.05)
    time.sleep(0.05)  # while the first tables read their partitions
    child.send_signal(signum)
    out, err = child.communicate(timeout=120)
    assert child.returncode == (143 if signum == signal.SIGTERM else 130), err
    last = err.splitlines()[-1]
    said = "terminated (SIGTERM)" if signum == signal.SIGTERM else "interrupted"
    assert last.startswith(f"error: {said}: ")
    assert "tables had finished (the summary above says which)" in last
    outcomes = {line.split()[0]: line.split()[2] for line in out.splitlines()[1:-1]}
    assert "interrupted" in outcomes.values()
    assert set(outcomes.values()) <= {"succeeded", "interrupted", "not"}  # "not run"
    finished = sum(outcome == "succeeded" for outcome in outcomes.values())
    assert f": {finished} of 4 tables had finished" in last
    assert list(work.iterdir()) == []  # every table's work folder removed
    listed = run_cli("routes", "--store", tmp_path / "c.db", "--json")
    routes = json.loads(listed.stdout)
    assert isinstance(routes, list), listed.stdout + listed.stderr
    assert [route["lease"] for route in routes] == [None] * len(routes)  # every lease released
    # a table stops before its guard arms, or finishes: none is left blocked
    assert {route["outcome"] for route in routes} <= {"succeeded", "failed"}
    again = run_cli("run", pipeline_file, "--json")
    assert again.returncode == 0, again.stderr
    for name in ("t01", "t02", "t03", "t04"):
        _exactly(sqlite_ids(tmp_path / "w.db", name), sqlite_ids(source, name))


def _four_tables(
    tmp_path: Path, rows: int, *, count: int = 4, lease_seconds: float | None = None, **defaults
) -> tuple[Path, Path]:
    """A SQLite source of ``count`` tables of ``rows`` rows, and a legacy pipeline file of them
    into a SQLite target (``defaults`` added); the source and the file."""
    source = tmp_path / "big.db"
    build_tables(source, count, rows)
    pipeline_file = write_pipeline(
        tmp_path / "p.toml",
        source={"path": str(source)},
        target={"path": str(tmp_path / "w.db")},
        store=str(tmp_path / "c.db"),
        tables=["t*"],
        defaults={"path": "legacy", **defaults},
        lease_seconds=lease_seconds,
    )
    return source, pipeline_file


def _workers(pipeline: subprocess.Popen) -> list[int]:
    """The worker processes the pipeline's process has started (a worker thread starts each)."""
    found = []
    for task in Path(f"/proc/{pipeline.pid}/task").iterdir():
        with contextlib.suppress(FileNotFoundError):  # a thread that ended meanwhile
            found += [int(pid) for pid in (task / "children").read_text().split()]
    return found


def _ended(pid: int) -> bool:
    """Whether process ``pid`` (not a child of this one) has ended: gone, or a zombie no init
    reaped (a container's first process may not)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return True
    return "\nState:\tZ" in status


def _leases(store: Path) -> dict[str, int]:
    """The leases routes hold in the SQLite store ``store`` (read as it is written): each
    route's source table and the pid of the process holding it."""
    try:
        with contextlib.closing(sqlite3.connect(f"file:{store}?mode=ro", uri=True)) as db:
            found = db.execute(
                "SELECT lease_key, record FROM lease WHERE expires_at > ?", [time.time()]
            ).fetchall()
    except sqlite3.OperationalError:  # no file or no table yet, or a writer mid-commit
        return {}
    return {json.loads(key)[1]: json.loads(record)["process"]["pid"] for key, record in found}


def _started(pipeline_file: Path, *args: str) -> subprocess.Popen[str]:
    """``dpone-transfer run PIPELINE_FILE ARGS`` as a child process, its output piped."""
    command = [sys.executable, "-m", "dpone_native_transfer", "run", str(pipeline_file), *args]
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_a_worker_process_killed_fails_its_table_alone_and_the_next_run_recovers(tmp_path):
    """SIGKILL of a worker process in the middle of a table: that table failed (exit 1), the
    others run on (another worker takes the rest), nothing is loaded twice once recovered."""
    source, pipeline_file = _four_tables(tmp_path, 200_000, chunk_rows=500, partition_rows=5_000)
    child = _started(pipeline_file, "--jobs", "2", "--workers", "processes", "--json")
    assert child.stderr is not None
    assert child.stderr.readline().endswith(": started\n")
    for _ in range(600):  # the first worker's interpreter started, and its table running
        workers = _workers(child)
        if workers and (tmp_path / "c.db").exists():
            break
        time.sleep(0.05)
    time.sleep(0.1)
    os.kill(workers[0], signal.SIGKILL)
    out, err = child.communicate(timeout=300)
    assert child.returncode == 1, err
    runs = {run["table"]: run for run in json.loads(out)["tables"]}
    killed = [name for name, run in runs.items() if run["outcome"] != "succeeded"]
    assert len(killed) == 1, runs
    assert runs[killed[0]] | {"seconds": 0} == runs[killed[0]] | {
        "outcome": "failed", "error": "WorkerProcessEnded", "exit_code": 1, "seconds": 0,
    }  # fmt: skip
    again = run_cli("run", pipeline_file, "--recovery", "from_target", "--workers", "processes")
    assert again.returncode == 0, again.stderr
    for name in ("t01", "t02", "t03", "t04"):
        _exactly(sqlite_ids(tmp_path / "w.db", name), sqlite_ids(source, name))


@pytest.mark.parametrize("run_in", ["processes", "threads"])
def test_the_pipeline_process_killed_leaves_every_table_exact_after_a_rerun(tmp_path, run_in):
    """``kill -9`` of the pipeline's own process while tables run. Threads die with it, each
    table then a killed route; a worker process finishes the table it is running, releases
    its lease and ends. The rerun (recovering what the target's ledger proves) leaves every
    table exact."""
    source, pipeline_file = _four_tables(
        tmp_path, 100_000, chunk_rows=500, partition_rows=5_000, lease_seconds=1
    )
    child = _started(pipeline_file, "--jobs", "2", "--workers", run_in)
    try:
        assert child.stderr is not None
        assert child.stderr.readline().endswith(": started\n")
        for _ in range(600):  # tables running: their leases held (a worker's too)
            held, workers = _leases(tmp_path / "c.db"), _workers(child)
            if held and (run_in == "threads" or set(held.values()) & set(workers)):
                break
            time.sleep(0.02)
        assert (run_in == "processes") == bool(workers), workers
        child.kill()
        child.communicate(timeout=60)
    finally:
        if child.poll() is None:
            child.kill()
            child.communicate()
    for _ in range(1200):
        if all(_ended(pid) for pid in workers):
            break
        time.sleep(0.05)
    assert all(_ended(pid) for pid in workers), "a worker outlived its pipeline by 60 s"
    time.sleep(1.1)  # past the killed threads' one-second leases
    listed = run_cli("routes", "--store", tmp_path / "c.db", "--json")
    routes = json.loads(listed.stdout)
    assert [route["lease"] for route in routes] == [None] * len(routes)
    # each worker finished its table (the pipeline's process runs one job itself, a killed
    # route: blocked if killed in its target call)
    outcomes = {route["route"]["source_table"]: route["outcome"] for route in routes}
    finished = [name for name, pid in held.items() if pid in workers]
    assert bool(finished) == (run_in == "processes"), (held, workers)
    assert [outcomes[name] for name in finished] == ["succeeded"] * len(finished), routes
    again = run_cli("run", pipeline_file, "--recovery", "from_target", "--json")
    assert again.returncode == 0, again.stderr
    for name in ("t01", "t02", "t03", "t04"):
        _exactly(sqlite_ids(tmp_path / "w.db", name), sqlite_ids(source, name))


def test_a_worker_paused_past_its_lease_loads_nothing_stale_when_it_resumes(tmp_path):
    """A worker process stopped (SIGSTOP) while its table runs, until past the table's lease:
    another run takes the table over and loads it; resumed, the stopped worker's table fails
    ``native_transfer_lease_lost`` and writes nothing. Every row once."""
    source, pipeline_file = _four_tables(
        tmp_path, 300_000, count=2, chunk_rows=500, partition_rows=5_000, lease_seconds=1
    )
    first = _started(pipeline_file, "--jobs", "2", "--workers", "processes", "--json")
    worker, table = None, None
    try:
        for _ in range(3000):  # stopped once it holds its lease: reading, nothing armed
            held = {pid: name for name, pid in _leases(tmp_path / "c.db").items()}
            workers = [pid for pid in _workers(first) if pid in held] if held else []
            if workers:
                worker, table = workers[0], held[workers[0]]
                os.kill(worker, signal.SIGSTOP)
                # stopped inside a store write it would hold the SQLite store's lock, and the
                # next run wait for it (docs/pipelines.md): go on a little and stop it again
                if sqlite_lock_free(tmp_path / "c.db", begin="IMMEDIATE", timeout=0.2):
                    break
                os.kill(worker, signal.SIGCONT)
                worker = None
            time.sleep(0.005)
        assert worker is not None, "no worker process held its lease"
        time.sleep(1.5)  # past its one-second lease
        second = run_cli("run", pipeline_file, "--tables", table, "--json")
        assert second.returncode == 0, second.stderr
        os.kill(worker, signal.SIGCONT)
        out, err = first.communicate(timeout=120)
    finally:
        if worker is not None and not _ended(worker):
            os.kill(worker, signal.SIGCONT)
        if first.poll() is None:
            first.kill()
            first.communicate()
    assert first.returncode == 1, err
    runs = {run["table"]: run for run in json.loads(out)["tables"]}
    stale = runs[table]
    assert (stale["outcome"], stale["error"]) == ("failed", "native_transfer_lease_lost"), stale
    assert {run["outcome"] for name, run in runs.items() if name != table} == {"succeeded"}
    for name in ("t01", "t02"):
        _exactly(sqlite_ids(tmp_path / "w.db", name), sqlite_ids(source, name))
    again = run_cli("run", pipeline_file, "--json")
    assert again.returncode == 0, again.stderr
    for name in ("t01", "t02"):
        _exactly(sqlite_ids(tmp_path / "w.db", name), sqlite_ids(source, name))


@pytest.mark.parametrize("strategy", ["incremental_append", "full_refresh"])
def test_two_pipelines_at_once_in_worker_processes_load_each_row_once(tmp_path, strategy):
    """The same pipeline file run twice at once, each in worker processes: a table one run
    holds fails in the other (its lease: ``RouteBusy``; the target file's writer: busy),
    never loads a row twice, and a plain run then leaves every table exact."""
    source, pipeline_file = _four_tables(tmp_path, 50_000, strategy=strategy, chunk_rows=5_000)
    with contextlib.ExitStack() as stack:  # each child's pipes closed, whatever fails
        both = [
            stack.enter_context(
                _started(pipeline_file, "--jobs", "2", "--workers", "processes", "--json")
            )
            for _ in range(2)
        ]
        ended = [(child, *child.communicate(timeout=300)) for child in both]
    for child, out, err in ended:
        assert child.returncode in (0, 1), err
        runs = json.loads(out)["tables"]
        failed = {run["error"] for run in runs if run["outcome"] != "succeeded"}
        assert failed <= {"native_transfer_route_busy", "native_transfer_target_unavailable"}, runs
        assert (child.returncode == 1) == bool(failed)
    for name in ("t01", "t02", "t03", "t04"):
        with contextlib.suppress(sqlite3.OperationalError):  # a table neither run created
            assert set(sqlite_ids(tmp_path / "w.db", name).values()) <= {1}
    again = run_cli("run", pipeline_file, "--workers", "processes")
    assert again.returncode == 0, again.stderr
    for name in ("t01", "t02", "t03", "t04"):
        _exactly(sqlite_ids(tmp_path / "w.db", name), sqlite_ids(source, name))


# A pipeline of ``TABLES`` tables into chDB, in a process allowed ``FILES`` open files; prints
# the rows each target table then holds.
MANY_CHDB_TABLES = """
import json, resource, sys
resource.setrlimit(resource.RLIMIT_NOFILE, (FILES, FILES))
from dpone_native_transfer.cli import main
from dpone_native_transfer.connectors.clickhouse import ClickHouseSink
code = main(["run", sys.argv[1], "--quiet"])
with ClickHouseSink(sys.argv[2], "t01").client() as client:
    counts = client.query_rows("SELECT name, total_rows FROM system.tables"
                               " WHERE database = currentDatabase() AND name LIKE 't%'")
print(json.dumps({"code": code, "rows": {name: rows for name, rows in counts}}))
"""


def test_a_pipeline_of_many_chdb_tables_keeps_one_session_and_few_open_files(tmp_path):
    """chDB leaves five threads and some fifteen open files behind each session it closes,
    and each table's run opened one: 110 tables ran out of a default 1,024 open files and
    41 failed. The session of a data path is now kept for the whole pipeline."""
    tables = 70
    build_tables(tmp_path / "shop.db", tables, 5)
    file = write_pipeline(
        tmp_path / "pipeline.toml",
        source={"kind": "sqlite", "path": "shop.db"},
        target={"kind": "clickhouse", "path": "chdata"},
        store="checkpoints.db",
        tables="t*",
        defaults={"strategy": "full_refresh", "partition_column": "id", "partition_by": "range"},
    )
    script = MANY_CHDB_TABLES.replace("FILES", "400")
    done = subprocess.run(
        [sys.executable, "-c", script, str(file), str(tmp_path / "chdata")],
        capture_output=True, text=True, timeout=600, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    found = json.loads(done.stdout.splitlines()[-1])
    assert found["code"] == 0
    assert found["rows"] == {f"t{n:02d}": 5 for n in range(1, tables + 1)}


def test_a_signal_under_json_prints_one_object_saying_so(tmp_path):
    """``--json`` printed the summary and then the stop's own object: two, so stdout parsed
    as none; the tables it stopped said ``exit_code`` 0. One object now, ``stopped`` in it."""
    source, pipeline_file = _four_tables(tmp_path, 150_000, chunk_rows=500, partition_rows=5_000)
    child = subprocess.Popen(
        [sys.executable, "-m", "dpone_native_transfer", "run", str(pipeline_file), "--json",
         "--jobs", "2"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert child.stderr is not None
    assert child.stderr.readline().endswith(": started\n")
    for _ in range(600):
        if (tmp_path / "c.db").exists():
            break
        time.sleep(0.05)
    time.sleep(0.05)
    child.send_signal(signal.SIGTERM)
    out, err = child.communicate(timeout=120)
    assert child.returncode == 143, err
    shown = json.loads(out)
    assert shown["stopped"] == "terminated" and shown["totals"]["exit_code"] == 143
    stopped = [t for t in shown["tables"] if t["outcome"] in ("interrupted", "not run")]
    assert stopped and {t["exit_code"] for t in stopped} == {143}


def test_discover_write_into_a_missing_folder_names_the_folder_not_the_source(tmp_path):
    """It said "source database ... does not exist": the source's path is written relative
    to the pipeline file, and checked from a folder that is not there."""
    source = tmp_path / "shop.db"
    build_tables(source, 1, 5)
    done = run_cli("discover", source, "--write", tmp_path / "missing" / "p.toml")
    assert done.returncode == 2
    assert "--write names a file in a folder that does not exist" in done.stderr
