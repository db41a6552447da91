"""Issue 14: resume semantics through ``dpone-transfer run``, counted against the source.

Every source row exactly once in the target, or a refusal before the target
with a named code and the route still retryable.
"""

from __future__ import annotations

import contextlib
import shutil
import sqlite3
import subprocess
from pathlib import Path

import pytest
from helpers import routes
from helpers.cli import run_cli
from helpers.routes import PATHS

from dpone_native_transfer import (
    SQLiteCheckpointStore,
    SQLiteSink,
    SQLiteSource,
    TransferRuntime,
    TransferSpec,
)
from dpone_native_transfer.testing import assert_rows_exactly_once, build_sample_source

TARGETS = routes.TARGET_FILES
CURSORLESS = {"cursor_column": None}  # the sample route's [source] without its cursor column


def route(folder: Path, *, kind="sqlite", **options):
    """The sample route's file (``helpers.routes``), naming its target kind (``kind = ...``)."""
    return routes.write_route(folder, kind=kind, **options)


def run(route_file: Path, *, code: int = 0) -> subprocess.CompletedProcess[str]:
    done = run_cli("run", route_file)  # in this process: as the console script, measured
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
    route_file = route(tmp_path, strategy=strategy, sections={"gates": {"min_rows": 1}})
    run(route_file)
    empty_the_source(tmp_path)
    done = run(route_file, code=1)
    assert "native_transfer_governance_gate_failed" in done.stderr
    assert '"gate": "min_rows"' in done.stderr and '"rows": 0' in done.stderr
    assert target_rows(tmp_path, "sqlite") == 30  # a full refresh did not empty the target
    scan = run_cli("guard", "scan", "--store", tmp_path / "checkpoints.db")
    assert scan.returncode == 0, scan.stdout + scan.stderr  # nothing blocks the route


def test_an_incremental_run_with_no_new_rows_is_not_a_gate_failure(tmp_path: Path) -> None:
    """An idle window of a source that holds rows passes; only an empty source is gated."""
    build_sample_source(tmp_path / "source.db", rows=30, partitions=3)
    route_file = route(tmp_path, sections={"gates": {"min_rows": 1}})
    assert "loaded 30 rows" in run(route_file).stdout
    assert "loaded 0 rows" in run(route_file).stdout
    build_sample_source(tmp_path / "source.db", rows=4, partitions=2, start_id=31)
    assert "loaded 4 rows" in run(route_file).stdout
    assert target_rows(tmp_path, "sqlite") == 34


# 2. a changed route definition never re-appends or skips ---------------------------------------


def alter_source(folder: Path, *statements: str) -> None:
    with contextlib.closing(sqlite3.connect(folder / "source.db")) as source:
        for statement in statements:
            source.execute(statement)
        source.commit()


def target_ids(folder: Path) -> list[int]:
    with contextlib.closing(sqlite3.connect(folder / "target.db")) as target:
        return sorted(row[0] for row in target.execute("SELECT id FROM orders_copy"))


def source_ids(folder: Path) -> list[int]:
    with contextlib.closing(sqlite3.connect(folder / "source.db")) as source:
        return sorted(row[0] for row in source.execute("SELECT id FROM orders"))


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize(
    "change",
    [
        "ALTER TABLE orders DROP COLUMN amount",
        "ALTER TABLE orders RENAME COLUMN amount TO total",
    ],
)
def test_a_cursorless_append_route_never_reappends_after_its_schema_changed(
    tmp_path: Path, path: str, change: str
) -> None:
    """A changed schema hash made every committed partition look new: 1,000 duplicates."""
    build_sample_source(tmp_path / "source.db", rows=200, partitions=4)
    route_file = tmp_path / "route.toml"
    route_file.write_text(routes.route_text(kind="sqlite", path=path, source=CURSORLESS))
    assert "loaded 200 rows" in run(route_file).stdout
    alter_source(tmp_path, change)
    done = run(route_file)
    assert "loaded 0 rows" in done.stdout and "skipped 4" in done.stdout  # not new
    assert target_ids(tmp_path) == source_ids(tmp_path)  # every row once, whatever the exit


def test_a_run_stopped_before_its_state_then_a_schema_change_never_reappends(
    tmp_path: Path,
) -> None:
    """A window committed, the run died before advancing the source state, then the schema
    changed: the rerun planned the same window under new ids and appended it again."""

    build_sample_source(tmp_path / "source.db", rows=200, partitions=4)
    source = SQLiteSource(str(tmp_path / "source.db"), "orders", "region", "updated_at")
    sink = SQLiteSink(str(tmp_path / "target.db"), "orders_copy")
    store = SQLiteCheckpointStore(tmp_path / "checkpoints.db")
    try:

        def run_once(run_id: str) -> int:
            spec = TransferSpec(source=source, sink=sink, strategy="incremental_append",
                                path="legacy", run_id=run_id)  # fmt: skip
            return TransferRuntime(store).run(spec).rows_loaded

        assert run_once("first") == 200
        build_sample_source(tmp_path / "source.db", rows=80, partitions=4, start_id=201)
        route_key = TransferSpec(source=source, sink=sink, strategy="incremental_append",
                                 path="legacy", run_id="x").route  # fmt: skip
        before = store.load_source_state(route_key)
        assert run_once("second") == 80
        store.save_source_state(route_key, before)  # as if it died before the state write
        alter_source(tmp_path, "ALTER TABLE orders ADD COLUMN note TEXT")
        with contextlib.closing(sqlite3.connect(tmp_path / "target.db")) as db:
            db.execute("ALTER TABLE orders_copy ADD COLUMN note TEXT")  # the target follows
            db.commit()
        assert run_once("third") == 0  # the window is committed, whatever its ids now
        assert target_ids(tmp_path) == source_ids(tmp_path)
        alter_source(tmp_path, "INSERT INTO orders VALUES (281, 'region-x', 1.0, 2000000, 'n')")
        assert run_once("fourth") == 1
        assert target_ids(tmp_path) == source_ids(tmp_path)
    finally:
        store.close()


@pytest.mark.parametrize(
    ("before", "after", "changed"),
    [
        ('cursor_column = "updated_at"', 'cursor_column = "id"', "cursor_column"),
        ('cursor_column = "updated_at"\n', "", "cursor_column"),
        ('partition_column = "region"', 'partition_column = "amount"', "partition_column"),
    ],
)
def test_changing_the_cursor_or_partition_column_is_refused_before_the_target(
    tmp_path: Path, before: str, after: str, changed: str
) -> None:
    """Changing the cursor column (or dropping it) or the partition column of a healthy route
    loaded rows twice or skipped them, exit 0."""
    build_sample_source(tmp_path / "source.db", rows=100, partitions=4)
    route_file = route(tmp_path)
    assert "loaded 100 rows" in run(route_file).stdout
    build_sample_source(tmp_path / "source.db", rows=20, partitions=2, start_id=101)
    route_file.write_text(route_file.read_text().replace(before, after))
    done = run(route_file, code=2)
    assert "native_transfer_route_changed" in done.stderr
    assert changed in done.stderr and "state reset" in done.stderr
    assert target_ids(tmp_path) == list(range(1, 101))  # nothing written
    route(tmp_path)  # the old definition
    assert "loaded 20 rows" in run(route_file).stdout  # the old definition still works
    assert target_ids(tmp_path) == source_ids(tmp_path)


def test_adding_a_cursor_column_to_a_cursorless_route_is_refused(tmp_path: Path) -> None:
    build_sample_source(tmp_path / "source.db", rows=100, partitions=4)
    route_file = tmp_path / "route.toml"
    route_file.write_text(routes.route_text(kind="sqlite", source=CURSORLESS))
    assert "loaded 100 rows" in run(route_file).stdout
    route(tmp_path)  # the same route, now with a cursor column
    done = run(route_file, code=2)
    assert "native_transfer_route_changed" in done.stderr
    assert target_ids(tmp_path) == source_ids(tmp_path)


def state_reset(route_file: Path, *flags: str, code: int = 0) -> subprocess.CompletedProcess:
    done = run_cli("state", "reset", route_file, "--reason", "new cursor column",
                   "--operator", "ops", "--yes", *flags)  # fmt: skip
    assert done.returncode == code, done.stdout + done.stderr
    return done


def test_state_reset_from_now_continues_a_changed_cursor_without_a_duplicate(
    tmp_path: Path,
) -> None:
    build_sample_source(tmp_path / "source.db", rows=100, partitions=4)
    route_file = route(tmp_path)
    run(route_file)
    route_file.write_text(route_file.read_text().replace('"updated_at"', '"id"'))
    run(route_file, code=2)  # native_transfer_route_changed
    refused = state_reset(route_file, code=2)  # the target holds 100 rows
    assert "holds 100 rows" in refused.stderr and "--from-now" in refused.stderr
    done = state_reset(route_file, "--from-now")
    assert "forget 4 committed partitions" in done.stdout
    assert "loaded 0 rows" in run(route_file).stdout
    build_sample_source(tmp_path / "source.db", rows=20, partitions=2, start_id=101)
    assert "loaded 20 rows" in run(route_file).stdout
    assert target_ids(tmp_path) == source_ids(tmp_path)
    show = run_cli("guard", "show", route_file)
    assert "reset" in show.stdout and "new cursor column" in show.stdout


@pytest.mark.parametrize("kind", ["sqlite", "duckdb"])
def test_state_reset_refuses_while_the_target_file_is_missing(tmp_path: Path, kind: str) -> None:
    """A target file moved aside (a volume not mounted) is no empty table: a reset forgot the
    committed partitions, and once the file was back the next run loaded every row again,
    exit 0. Refused, naming ``state restore``; nothing written, the file back, the run loads
    only the new rows. Found by a hostile check."""
    build_sample_source(tmp_path / "source.db", rows=100, partitions=4)
    route_file = route(tmp_path, kind=kind)
    run(route_file)
    target = tmp_path / TARGETS[kind]
    target.rename(tmp_path / "aside")
    refused = state_reset(route_file, code=2)
    assert "does not exist" in refused.stderr and "state restore" in refused.stderr
    (tmp_path / "aside").rename(target)
    build_sample_source(tmp_path / "source.db", rows=20, partitions=2, start_id=101)
    assert "loaded 20 rows" in run(route_file).stdout
    assert target_rows(tmp_path, kind) == 120


def test_state_reset_of_an_emptied_target_loads_every_row_again_under_the_new_partitioning(
    tmp_path: Path,
) -> None:
    build_sample_source(tmp_path / "source.db", rows=100, partitions=4)
    route_file = tmp_path / "route.toml"
    text = routes.route_text(kind="sqlite", source=CURSORLESS)
    route_file.write_text(text)
    run(route_file)
    route_file.write_text(text.replace('partition_column = "region"', 'partition_column = "id"'))
    run(route_file, code=2)
    with contextlib.closing(sqlite3.connect(tmp_path / "target.db")) as target:
        target.execute("DELETE FROM orders_copy")
        target.commit()
    state_reset(route_file)
    assert "loaded 100 rows" in run(route_file).stdout
    assert target_ids(tmp_path) == source_ids(tmp_path)
    assert "loaded 0 rows" in run(route_file).stdout


# 3. schema evolution: a new, dropped or renamed source column, before the target ----------------


def target_table(folder: Path, kind: str) -> list[dict]:
    """The target's rows as {column: value}, by id."""
    if kind == "sqlite":
        with contextlib.closing(sqlite3.connect(folder / "target.db")) as db:
            cursor = db.execute("SELECT * FROM orders_copy ORDER BY id")
            names = [d[0] for d in cursor.description]
            return [dict(zip(names, row, strict=True)) for row in cursor]
    if kind == "duckdb":
        import duckdb

        with contextlib.closing(duckdb.connect(str(folder / "target.duckdb"))) as db:
            cursor = db.execute("SELECT * FROM orders_copy ORDER BY id")
            names = [d[0] for d in cursor.description]
            return [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]
    from dpone_native_transfer import ClickHouseSink

    with ClickHouseSink(folder / "chdata", "orders_copy").client() as client:
        names = [
            row[0]
            for row in client.query_rows(
                "SELECT name FROM system.columns WHERE table = 'orders_copy' ORDER BY position"
            )
        ]
        rows = client.query_rows(f"SELECT {', '.join(names)} FROM orders_copy ORDER BY id")
    return [dict(zip(names, row, strict=True)) for row in rows]  # fmt: skip


EVOLUTIONS = {
    "add": ("ALTER TABLE orders ADD COLUMN note TEXT", {"note": "n"}, set()),
    "drop": ("ALTER TABLE orders DROP COLUMN amount", {}, {"amount"}),
    "rename": ("ALTER TABLE orders RENAME COLUMN amount TO total", {"total": 1.5}, {"amount"}),
}


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("kind", ["sqlite", "duckdb", "clickhouse"])
@pytest.mark.parametrize("change", sorted(EVOLUTIONS))
def test_schema_evolution_adds_new_columns_before_the_target_and_loads_nulls_for_gone_ones(
    tmp_path: Path, kind: str, path: str, change: str
) -> None:
    """A new source column failed inside the target call (a bare OperationalError or
    BinderException), which blocked the route."""
    statement, new_values, gone = EVOLUTIONS[change]
    build_sample_source(tmp_path / "source.db", rows=40, partitions=2)
    route_file = route(tmp_path, kind=kind, path=path)
    assert "loaded 40 rows" in run(route_file).stdout
    alter_source(tmp_path, statement)
    with contextlib.closing(sqlite3.connect(tmp_path / "source.db")) as source:
        names = [row[1] for row in source.execute("PRAGMA table_info(orders)")]
        values = {"id": 41, "region": "region-000", "amount": 2.5, "updated_at": 2_000_000,
                  **new_values}  # fmt: skip
        source.execute(
            f"INSERT INTO orders ({', '.join(names)}) VALUES ({', '.join('?' * len(names))})",
            [values[name] for name in names],
        )
        source.commit()
    assert "loaded 1 row" in run(route_file).stdout
    rows = target_table(tmp_path, kind)
    assert [row["id"] for row in rows] == list(range(1, 42))
    last = rows[-1]
    for name, value in new_values.items():
        assert last[name] == value and all(row[name] is None for row in rows[:-1])
    for name in gone:
        assert last[name] is None  # a column the source no longer has loads NULL


RETYPES = {  # a rebuilt source: the same rows, then one more under the new type
    "integer to text": ("amount TEXT", "'12.5x'"),
    "real to integer": ("amount INTEGER", "3"),
    "real to blob": ("amount BLOB", "x'00ff'"),
}


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("kind", ["sqlite", "duckdb", "clickhouse"])
@pytest.mark.parametrize("change", sorted(RETYPES))
def test_a_retyped_column_the_target_cannot_take_is_refused_before_the_target(
    tmp_path: Path, kind: str, path: str, change: str
) -> None:
    """A retyped column was silently converted by the engine (SQLite's affinity turned '12'
    into 12), or failed inside the target call."""
    declared, value = RETYPES[change]
    build_sample_source(tmp_path / "source.db", rows=40, partitions=2)
    route_file = route(tmp_path, kind=kind, path=path)
    run(route_file)
    rebuild_source(tmp_path, f"id INTEGER PRIMARY KEY, region TEXT, {declared}, updated_at INTEGER")
    alter_source(tmp_path, f"INSERT INTO orders VALUES (41, 'region-000', {value}, 2000000)")
    for contract in ("evolve", "freeze"):
        route_file.write_text(route_file.read_text().replace(
            "[store]", f'schema_contract = "{contract}"\n[store]', 1))  # fmt: skip
        done = run(route_file, code=2)
        assert "native_transfer_schema_changed" in done.stderr and "'amount'" not in done.stdout
        assert '"columns": ["amount"]' in done.stderr and "12.5x" not in done.stderr
        route_file.write_text(route_file.read_text().replace(
            f'schema_contract = "{contract}"\n', ""))  # fmt: skip
    assert target_rows(tmp_path, kind) == 40
    scan = run_cli("guard", "scan", "--store", tmp_path / "checkpoints.db")
    assert scan.returncode == 0, scan.stdout + scan.stderr  # refused before the target


@pytest.mark.parametrize("kind", ["sqlite", "duckdb", "clickhouse"])
def test_a_frozen_schema_stops_on_a_new_column_before_the_target(tmp_path: Path, kind: str):
    build_sample_source(tmp_path / "source.db", rows=40, partitions=2)
    route_file = route(tmp_path, kind=kind)
    text = route_file.read_text().replace(
        'path = "staged"', 'path = "staged"\nschema_contract = "freeze"'
    )
    route_file.write_text(text)
    run(route_file)
    alter_source(tmp_path, "ALTER TABLE orders ADD COLUMN note TEXT",
                 "INSERT INTO orders VALUES (41, 'region-000', 2.5, 2000000, 'n')")  # fmt: skip
    done = run(route_file, code=2)
    assert "native_transfer_schema_changed" in done.stderr and "note" in done.stderr
    assert target_rows(tmp_path, kind) == 40
    route_file.write_text(text.replace('"freeze"', '"evolve"'))
    assert "loaded 1 row" in run(route_file).stdout


# found by a hostile pass: ways around the definition check ---------------------------------------


def rebuild_source(folder: Path, definition: str) -> None:
    """The same rows under other declared types (SQLite cannot retype a column in place)."""
    alter_source(
        folder,
        "ALTER TABLE orders RENAME TO orders_old",
        f"CREATE TABLE orders ({definition})",
        "INSERT INTO orders SELECT * FROM orders_old",
        "DROP TABLE orders_old",
    )


@pytest.mark.parametrize(
    ("definition", "changed"),
    [
        ("id INTEGER PRIMARY KEY, region TEXT, amount REAL, updated_at TEXT", "cursor_kind"),
        ("id INTEGER PRIMARY KEY, region REAL, amount REAL, updated_at INTEGER", "partition_kind"),
    ],
)
def test_retyping_the_partition_or_cursor_column_is_refused(
    tmp_path: Path, definition: str, changed: str
) -> None:
    """Bounds compare values as stored: 1 and 1.0 and '1' are other bounds, so a retyped
    partition column re-appended every committed partition (200 rows, 100 distinct)."""
    with contextlib.closing(sqlite3.connect(tmp_path / "source.db")) as db:
        db.execute("CREATE TABLE orders (id INTEGER PRIMARY KEY, region INTEGER, amount REAL,"
                   " updated_at INTEGER)")  # fmt: skip
        db.executemany("INSERT INTO orders VALUES (?, ?, ?, ?)",
                       [(i, i % 5, 1.0, 1000 + i) for i in range(1, 101)])  # fmt: skip
        db.commit()
    route_file = route(tmp_path)
    assert "loaded 100 rows" in run(route_file).stdout
    rebuild_source(tmp_path, definition.replace("region TEXT", "region INTEGER"))
    done = run(route_file, code=2)
    assert "native_transfer_route_changed" in done.stderr and changed in done.stderr
    assert target_ids(tmp_path) == source_ids(tmp_path)


def test_a_restored_store_keeps_the_definition_and_refuses_another_cursor(
    tmp_path: Path,
) -> None:
    """state restore wrote a source state without the definition: the next run took a new
    cursor column with the old one's watermark and lost every new row, exit 0."""
    build_sample_source(tmp_path / "source.db", rows=100, partitions=4)
    route_file = route(tmp_path)
    run(route_file)
    (tmp_path / "checkpoints.db").unlink()  # the store is lost
    route_file.write_text(route_file.read_text().replace('"updated_at"', '"id"'))
    done = run_cli("state", "restore", route_file, "--reason", "lost", "--operator", "o", "--yes")
    assert done.returncode == 2 and "native_transfer_route_changed" in done.stderr
    route(tmp_path)  # the old cursor column back: the restore works and keeps it
    done = run_cli("state", "restore", route_file, "--reason", "lost", "--operator", "o", "--yes")
    assert done.returncode == 0, done.stdout + done.stderr
    route_file.write_text(route_file.read_text().replace('"updated_at"', '"id"'))
    run(route_file, code=2)  # native_transfer_route_changed: the definition was restored
    route(tmp_path)
    build_sample_source(tmp_path / "source.db", rows=10, partitions=2, start_id=101)
    assert "loaded 10 rows" in run(route_file).stdout
    assert target_ids(tmp_path) == source_ids(tmp_path)


def test_a_failed_first_window_under_another_cursor_column_is_refused_not_reused(
    tmp_path: Path,
) -> None:
    """A first run failed before any state was written; then the cursor column changed: the
    old column's window was taken over (its upto became the new watermark), and later rows
    were never loaded, exit 0."""
    build_sample_source(tmp_path / "source.db", rows=100, partitions=4)
    with contextlib.closing(sqlite3.connect(tmp_path / "target.db")) as db:
        db.execute("CREATE TABLE orders_copy (id INTEGER, region TEXT, amount REAL,"
                   " updated_at INTEGER, note TEXT DEFAULT (no_such_function()))")  # fmt: skip
        db.commit()
    route_file = route(tmp_path)
    failed = run(route_file, code=1)  # the unknown function fails inside the target call,
    assert "failed before its commit" in failed.stderr  # before its COMMIT: nothing blocks
    alter_source(tmp_path, "UPDATE orders SET amount = amount")  # nothing changes there
    with contextlib.closing(sqlite3.connect(tmp_path / "target.db")) as db:
        db.execute("DROP TABLE orders_copy")
        db.commit()
    route_file.write_text(route_file.read_text().replace('"updated_at"', '"id"'))
    done = run(route_file, code=2)
    assert "native_transfer_route_changed" in done.stderr
    assert target_ids_or_none(tmp_path) is None


def target_ids_or_none(folder: Path) -> list[int] | None:
    with contextlib.closing(sqlite3.connect(folder / "target.db")) as target:
        if not target.execute("SELECT 1 FROM sqlite_master WHERE name = 'orders_copy'").fetchone():
            return None
    return target_ids(folder)


# a full refresh of the table, then an append route of the same source ----------------------------


@pytest.mark.parametrize("append_ran_before", [True, False], ids=["append-ran", "append-new"])
@pytest.mark.parametrize("ledger", [True, False], ids=["ledger", "no-ledger"])
@pytest.mark.parametrize("cursor", [True, False], ids=["cursor", "cursorless"])
def test_refresh_then_append_never_duplicates(
    tmp_path: Path, cursor: bool, ledger: bool, append_ran_before: bool
) -> None:
    """A new append route after a refresh loaded every row again (85 rows for 45), and without
    the ledger an append continued from its own, older watermark (55 for 45)."""
    build_sample_source(tmp_path / "source.db", rows=30, partitions=3)
    files = {}
    for name, strategy in (("refresh", "full_refresh"), ("append", "incremental_append")):
        text = routes.route_text(kind="sqlite", strategy=strategy)
        if not cursor:
            text = text.replace('cursor_column = "updated_at"\n', "")
        if not ledger:
            text = text.replace(
                'table = "orders_copy"\n', 'table = "orders_copy"\nledger = false\n'
            )
        files[name] = tmp_path / f"{name}.toml"
        files[name].write_text(text)
    if append_ran_before:
        run(files["append"])
    build_sample_source(tmp_path / "source.db", rows=10, partitions=3, start_id=31)
    run(files["refresh"])
    build_sample_source(tmp_path / "source.db", rows=5, partitions=3, start_id=41)
    if cursor:
        run(files["append"])
        assert "loaded 0 rows" in run(files["append"]).stdout
        assert target_ids(tmp_path) == source_ids(tmp_path)
    else:  # nothing tells which of its rows the refresh loaded: refused before the target
        done = run(files["append"], code=3)
        assert "replaced_by_another_route" in done.stderr
        assert target_rows(tmp_path, "sqlite") == 40


def append_and_refresh(folder: Path, *, ledger: bool = True) -> tuple[Path, Path]:
    """An append route file and a full refresh route file of the sample table into one
    target table; ``ledger`` False turns the target's ledger off in both."""
    files = folder / "append.toml", folder / "refresh.toml"
    for file, strategy in zip(files, ("incremental_append", "full_refresh"), strict=True):
        text = routes.route_text(kind="sqlite", strategy=strategy)
        if not ledger:
            text = text.replace(
                'table = "orders_copy"\n', 'table = "orders_copy"\nledger = false\n'
            )
        file.write_text(text)
    return files


@pytest.mark.parametrize("refreshed_before", [True, False], ids=["refreshed", "first-refresh"])
@pytest.mark.parametrize("ledger", [True, False], ids=["ledger", "no-ledger"])
def test_after_a_refresh_of_an_emptied_source_the_append_loads_every_new_row(
    tmp_path: Path, ledger: bool, refreshed_before: bool
) -> None:
    """A refresh that found the source empty kept its older watermark: the append route went
    on above it and never loaded the new rows below it (exit 0, 0 rows of 5). A first refresh
    that found it empty recorded none, and the append was refused for good. The append's
    first window also had the bounds of the one it takes now: it was skipped as committed."""
    build_sample_source(tmp_path / "source.db", rows=30, partitions=3, start_id=100)
    append, refresh = append_and_refresh(tmp_path, ledger=ledger)
    if refreshed_before:
        run(refresh)
    run(append)
    alter_source(tmp_path, "DELETE FROM orders")
    assert "the target was emptied" in run(refresh).stdout
    assert target_ids(tmp_path) == []
    build_sample_source(tmp_path / "source.db", rows=5, partitions=3)  # below the old rows
    assert "loaded 5 rows" in run(append).stdout
    assert target_ids(tmp_path) == source_ids(tmp_path) == [1, 2, 3, 4, 5]
    assert "loaded 0 rows" in run(append).stdout


def test_a_refresh_route_takes_a_retyped_column_once_its_table_is_dropped(
    tmp_path: Path,
) -> None:
    """A refresh of a retyped source column was refused (exit 2) with "refresh the target
    table", which it was; and once the table was dropped, the refresh was refused as
    target_emptied (exit 3). It says to drop the table, and then makes it anew."""
    build_sample_source(tmp_path / "source.db", rows=30, partitions=3)
    refresh = tmp_path / "refresh.toml"
    refresh.write_text(routes.route_text(kind="sqlite", strategy="full_refresh"))
    run(refresh)
    alter_source(
        tmp_path,
        "ALTER TABLE orders ADD COLUMN note TEXT",
        "UPDATE orders SET note = 'n' || id",
    )
    run(refresh)  # a new column: added, not refused
    alter_source(
        tmp_path,
        "ALTER TABLE orders DROP COLUMN note",
        "ALTER TABLE orders ADD COLUMN note BLOB",
        "UPDATE orders SET note = x'00ff'",
    )
    refused = run(refresh, code=2)
    assert "native_transfer_schema_changed" in refused.stderr
    assert "Drop the target table" in refused.stderr
    with contextlib.closing(sqlite3.connect(tmp_path / "target.db")) as target:
        target.execute("DROP TABLE orders_copy")
        target.commit()
    assert "loaded 30 rows" in run(refresh).stdout
    assert target_ids(tmp_path) == source_ids(tmp_path)
    with contextlib.closing(sqlite3.connect(tmp_path / "target.db")) as target:
        assert target.execute("SELECT DISTINCT note FROM orders_copy").fetchall() == [
            (b"\x00\xff",)
        ]


@pytest.mark.parametrize("ledger", [True, False], ids=["ledger", "no-ledger"])
def test_an_append_killed_before_its_state_after_a_refresh_loads_no_row_twice(
    tmp_path: Path, ledger: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first append run after a refresh committed, then died before writing its state:
    the next run, no longer realigned (its batch is newer than the refresh), planned from the
    older state and appended the refreshed rows again, exit 0. The realigned state is kept
    before the target call now."""
    from dpone_native_transfer.runtime import TransferRuntime

    build_sample_source(tmp_path / "source.db", rows=30, partitions=3)
    append, refresh = append_and_refresh(tmp_path, ledger=ledger)
    run(append)
    build_sample_source(tmp_path / "source.db", rows=10, partitions=3, start_id=31)
    run(refresh)
    build_sample_source(tmp_path / "source.db", rows=5, partitions=3, start_id=41)

    def killed(*args: object, **kwargs: object) -> None:
        raise OSError("killed after the commit, before the state")

    with monkeypatch.context() as patched:
        patched.setattr(TransferRuntime, "_settle", killed)
        run(append, code=1)
    assert target_ids(tmp_path) == source_ids(tmp_path)  # the commit took
    assert "loaded 0 rows" in run(append).stdout
    assert target_ids(tmp_path) == source_ids(tmp_path)


def test_a_lost_store_names_the_route_whose_batches_the_ledger_holds(tmp_path: Path) -> None:
    """The store was lost after a refresh; the append route's error told the operator to
    restore the append route, whose restore found no batch of its own (exit 2). It names
    the refresh route now, whose restore lets the append go on exactly."""
    build_sample_source(tmp_path / "source.db", rows=30, partitions=3)
    append, refresh = append_and_refresh(tmp_path)
    run(refresh)
    (tmp_path / "checkpoints.db").unlink()
    refused = run(append, code=3)
    assert "target_ahead_of_store" in refused.stderr
    assert "they are other routes' (orders -> orders_copy (full_refresh))" in refused.stderr
    restore = ("state", "restore", "--reason", "lost", "--operator", "o", "--yes")
    assert run_cli(*restore[:2], append, *restore[2:]).returncode == 2  # none of its own
    assert run_cli(*restore[:2], refresh, *restore[2:]).returncode == 0
    build_sample_source(tmp_path / "source.db", rows=5, partitions=3, start_id=31)
    assert "loaded 5 rows" in run(append).stdout
    assert target_ids(tmp_path) == source_ids(tmp_path)


def test_a_ledgerless_refresh_then_an_append_with_the_ledger_never_duplicates(
    tmp_path: Path,
) -> None:
    """The refresh kept no ledger entry, so the append's ledger check saw no refresh."""
    build_sample_source(tmp_path / "source.db", rows=10, partitions=2)
    refresh = tmp_path / "refresh.toml"
    refresh.write_text(route(tmp_path, strategy="full_refresh").read_text().replace(
        'kind = "sqlite"\n', 'kind = "sqlite"\nledger = false\n'))  # fmt: skip
    append = route(tmp_path)
    run(refresh)
    build_sample_source(tmp_path / "source.db", rows=3, partitions=2, start_id=11)
    run(append)
    assert target_ids(tmp_path) == source_ids(tmp_path)


def test_without_a_ledger_a_refresh_of_another_source_refuses_the_append(tmp_path: Path) -> None:
    """It replaced the table, so the append route's rows were silently gone."""
    build_sample_source(tmp_path / "source.db", rows=10, partitions=2)
    build_sample_source(tmp_path / "other.db", rows=5, partitions=1, start_id=100)
    ledgerless = (
        route(tmp_path)
        .read_text()
        .replace('kind = "sqlite"\n', 'kind = "sqlite"\nledger = false\n')
    )
    append = tmp_path / "append.toml"
    append.write_text(ledgerless.replace('path = "source.db"', 'path = "other.db"'))
    refresh = tmp_path / "refresh.toml"
    refresh.write_text(
        ledgerless.replace('strategy = "incremental_append"', 'strategy = "full_refresh"')
    )
    run(append)
    run(refresh)
    build_sample_source(tmp_path / "other.db", rows=3, partitions=1, start_id=200)
    done = run(append, code=3)
    assert "replaced_by_another_route" in done.stderr


HAND_MADE = {  # target engine: (a narrower column that is refused, wider ones that are taken)
    "duckdb": ("INTEGER", ["HUGEINT", "DECIMAL(38,0)"]),
    "clickhouse": ("Nullable(Int32)", ["Nullable(Int128)", "Nullable(Decimal(38, 0))"]),
}


@pytest.mark.parametrize("kind", sorted(HAND_MADE))
def test_a_hand_made_integer_column_must_hold_every_source_integer(
    tmp_path: Path, kind: str
) -> None:
    """A narrower hand-made column wrapped 2**32 + 5 into 5 (ClickHouse, exit 0) or failed
    inside the target call (DuckDB, blocked); wider ones were refused as retyped."""
    narrow, wide = HAND_MADE[kind]
    with contextlib.closing(sqlite3.connect(tmp_path / "source.db")) as db:
        db.execute("CREATE TABLE orders (id INTEGER PRIMARY KEY, region TEXT, amount INTEGER,"
                   " updated_at INTEGER)")  # fmt: skip
        db.execute("INSERT INTO orders VALUES (1, 'r', 4294967301, 1)")
        db.commit()
    route_file = route(tmp_path, kind=kind)
    for column_type, accepted in [(narrow, False), *((w, True) for w in wide)]:
        make_target(tmp_path, kind, column_type)
        done = run(route_file, code=0 if accepted else 2)
        if accepted:
            assert target_table(tmp_path, kind)[0]["amount"] == 4294967301
        else:
            assert "native_transfer_schema_changed" in done.stderr and "amount" in done.stderr
        for leftover in ("checkpoints.db", TARGETS[kind]):
            shutil.rmtree(tmp_path / leftover, ignore_errors=True)
            (tmp_path / leftover).unlink(missing_ok=True)


def make_target(folder: Path, kind: str, amount_type: str) -> None:
    if kind == "duckdb":
        import duckdb

        with contextlib.closing(duckdb.connect(str(folder / TARGETS[kind]))) as db:
            db.execute(f"CREATE TABLE orders_copy (id BIGINT, region VARCHAR, amount {amount_type},"
                       " updated_at BIGINT)")  # fmt: skip
        return
    from dpone_native_transfer import ClickHouseSink

    with ClickHouseSink(folder / TARGETS[kind], "orders_copy").client() as client:
        client.command(
            "CREATE TABLE orders_copy (id Nullable(Int64), region Nullable(String), amount"
            f" {amount_type}, updated_at Nullable(Int64)) ENGINE = MergeTree ORDER BY tuple()"
        )


# state restore refuses a definition a run refused (found by an attacker: 1,000 duplicates) ----


def _restore(route_file: Path) -> subprocess.CompletedProcess:
    return run_cli("state", "restore", route_file, "--reason", "store lost", "--operator", "o",
                   "--yes")  # fmt: skip


def test_state_restore_does_not_launder_a_refused_partition_column_change(tmp_path: Path) -> None:
    """A cursorless append route's partition column changed and a run refused it; the store
    was then lost, `state restore` wrote the new definition, and the next run appended the
    whole table again: 1,000 duplicates, exit 0."""
    from dpone_native_transfer import SQLiteCheckpointStore
    from dpone_native_transfer.config import load_route_config

    build_sample_source(tmp_path / "source.db", rows=1000, partitions=4)
    route_file = tmp_path / "route.toml"
    text = routes.route_text(kind="sqlite", source=CURSORLESS)
    route_file.write_text(text)
    assert "loaded 1,000 rows" in run(route_file).stdout
    route_file.write_text(text.replace('partition_column = "region"', 'partition_column = "id"'))
    assert "native_transfer_route_changed" in run(route_file, code=2).stderr
    (tmp_path / "checkpoints.db").unlink()  # the store is lost
    done = _restore(route_file)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "native_transfer_route_changed" in done.stderr and "partition_column" in done.stderr
    config = load_route_config(route_file)
    with SQLiteCheckpointStore(config.store_path) as store:
        assert store.list_latest(config.route) == [] and not store.load_source_state(config.route)
    assert "native_transfer_store_target_mismatch" in run(route_file, code=3).stderr
    route_file.write_text(text)  # the old column back: the restore works
    assert _restore(route_file).returncode == 0
    assert "loaded 0 rows" in run(route_file).stdout
    assert target_ids(tmp_path) == source_ids(tmp_path)  # 1,000 rows, each once


# --- a narrow window, read by dpone through the cursor's index -------------------------------


@pytest.mark.parametrize("target", ["sqlite", "duckdb", "clickhouse"])
@pytest.mark.parametrize("path", ["legacy", "staged", "file-artifact"])
def test_a_narrow_window_is_read_through_the_cursor_index_and_loaded_once(tmp_path, target, path):
    """Partition and cursor both indexed: the first load's window has no lower bound, so the
    target's engine pulls it; a run with 1% new rows is read by dpone in one scan of the
    cursor's index (not through the partition column's index, which reads every row of each
    partition, nor by the engine's reader, which reads the whole file). Each row once."""
    from helpers.matrix_targets import Place

    from dpone_native_transfer import SQLiteCheckpointStore, TransferRuntime, TransferSpec
    from dpone_native_transfer.events import EventName
    from dpone_native_transfer.testing import assert_rows_exactly_once

    place = Place(target=target, path=path, folder=str(tmp_path))
    place.build_source(rows=2_000, partitions=4)
    with contextlib.closing(sqlite3.connect(place.source_path)) as db:
        db.execute("CREATE INDEX orders_by_region ON orders (region)")
        db.execute("CREATE INDEX orders_by_updated ON orders (updated_at)")
        db.commit()
    store = SQLiteCheckpointStore(tmp_path / "checkpoints.db")

    def reads(run_id: str) -> set[str]:
        spec = TransferSpec(
            source=place.make_source(), sink=place.make_sink(), path=path, run_id=run_id,
            strategy="incremental_append", chunk_rows=100,
        )  # fmt: skip
        result = TransferRuntime(store).run(spec)
        return {e.fields["read"] for e in result.events if e.name == EventName.PARTITION_EXTRACTED}

    try:
        assert reads("first") == {"engine"}
        build_sample_source(place.source_path, rows=20, partitions=4, start_id=2_001)
        assert reads("new") == {"rows"}
        assert_rows_exactly_once(place.source_ids(), place.target_ids())
        assert len(place.target_ids()) == 2_020
    finally:
        store.close()


def test_a_narrow_window_of_indexed_partitions_is_one_scan_with_each_partitions_rows(tmp_path):
    """``read_partitions`` of a window holding few rows reads it once through the cursor's
    index and gives each partition exactly the rows its own read gives; a window without a
    lower bound, or one holding most rows, is left to a read per partition (None)."""
    from dpone_native_transfer import SQLiteSource

    path = tmp_path / "source.db"
    build_sample_source(path, rows=4_000, partitions=4)
    with contextlib.closing(sqlite3.connect(path)) as db:
        db.execute("CREATE INDEX orders_by_region ON orders (region)")
        db.execute("CREATE INDEX orders_by_updated ON orders (updated_at)")
        db.commit()
    source = SQLiteSource(path, "orders", "region", "updated_at")
    regions = [f"region-{n:03d}" for n in range(4)]

    def bounds(**window: int) -> list[dict]:
        return [{"partition": region, **window} for region in regions]

    narrow = bounds(cursor_after=1_003_950, cursor_upto=1_004_000)
    scan = source.read_partitions(narrow, chunk_rows=7)
    assert scan is not None
    found: dict[int, list[tuple]] = {index: [] for index in range(4)}
    for index, rows in scan:
        found[index] += rows
    for index, bound in enumerate(narrow):
        assert found[index] == [row for chunk in source.read(bound) for row in chunk]
    assert sum(map(len, found.values())) == 50
    assert source.read_partitions(bounds(cursor_upto=1_004_000)) is None  # a first load's
    assert source.read_partitions(bounds(cursor_after=1_000_010, cursor_upto=1_004_000)) is None


def _ids(path: Path, table: str) -> list[int]:
    with contextlib.closing(sqlite3.connect(path)) as db:
        return [row[0] for row in db.execute(f"SELECT id FROM {table}")]


@pytest.mark.parametrize("indexed", [True, False], ids=["indexed", "unindexed"])
@pytest.mark.parametrize(
    "declared",
    ["ANY) STRICT", "CHAR GENERATED INT)", '"ınt text")', '"ﬂoat")'],
    ids=["strict-any", "type-read-whole", "dotless-i", "fl-ligature"],
)
def test_partition_values_are_matched_as_the_column_stores_them(tmp_path, declared, indexed):
    """A one-scan read gives each row to the partition whose value it holds, as the column
    stores it: a STRICT table's ``ANY`` column keeps the text ``'1'`` (a temporary column
    declared ``ANY`` made it 1), and ``CHAR GENERATED INT`` has INTEGER affinity (read as
    ``CHAR``, its values stayed texts): no row matched, and the run left them out (exit 0).
    SQLite reads a declared type's ASCII letters only: ``ınt text`` (a dotless i) is TEXT
    and ``ﬂoat`` NUMERIC, where ``str.upper`` read INT and FLOAT (2**53 + 1 became 2**53).
    Found by hostile checks; the indexed case by today's narrow-window read."""

    source, target = tmp_path / "s.db", tmp_path / "t.db"
    text = declared.startswith("ANY")

    def add(first: int, last: int) -> None:
        def value(i: int) -> object:
            if text:
                return str(i % 4)
            return 2**53 + 1 if "ﬂ" in declared and i % 2 else i % 4

        rows = [(i, i, value(i)) for i in range(first, last + 1)]
        with contextlib.closing(sqlite3.connect(source)) as db:
            db.executemany("INSERT INTO src (id, c, p) VALUES (?, ?, ?)", rows)
            db.commit()

    with contextlib.closing(sqlite3.connect(source)) as db:
        db.execute(f"CREATE TABLE src (id INTEGER PRIMARY KEY, c INTEGER, p {declared}")
        if indexed:
            db.execute("CREATE INDEX src_p ON src (p)")
            db.execute("CREATE INDEX src_c ON src (c)")
    add(1, 4_000)
    store = SQLiteCheckpointStore(tmp_path / "c.db")
    try:
        for run_id in ("first", "new"):
            if run_id == "new":
                add(4_001, 4_050)
            spec = TransferSpec(
                source=SQLiteSource(source, "src", "p", "c"), sink=SQLiteSink(target, "dst"),
                strategy="incremental_append", path="legacy", run_id=run_id, chunk_rows=500,
            )  # fmt: skip
            TransferRuntime(store).run(spec)
            assert_rows_exactly_once(_ids(source, "src"), _ids(target, "dst"))
    finally:
        store.close()


@pytest.mark.parametrize("path", ["legacy", "lazy-plan"])
def test_a_strict_tables_any_column_keeps_each_value_as_stored(tmp_path, path):
    """A STRICT table's ``ANY`` column stores each value as given; the SQLite target's column
    is untyped, so it does too. Declared ``ANY`` in the (non-STRICT) target, it had NUMERIC
    affinity: the texts ``'1'`` and ``'007'`` became integers, exit 0. Found by a hostile
    check."""

    source, target = tmp_path / "s.db", tmp_path / "t.db"
    values = ["1", 1.0, 1, "007", b"\x00", None, "abc"]
    with contextlib.closing(sqlite3.connect(source)) as db:
        db.execute("CREATE TABLE src (id INTEGER PRIMARY KEY, p TEXT, a ANY) STRICT")
        db.executemany("INSERT INTO src VALUES (?, 'x', ?)", list(enumerate(values)))
        db.commit()
    store = SQLiteCheckpointStore(tmp_path / "c.db")
    try:
        spec = TransferSpec(
            source=SQLiteSource(source, "src", "p"), sink=SQLiteSink(target, "dst"),
            strategy="full_refresh", path=path, run_id="r",
        )  # fmt: skip
        TransferRuntime(store).run(spec)
    finally:
        store.close()

    def stored(path: Path, table: str) -> list[tuple]:
        with contextlib.closing(sqlite3.connect(path)) as db:
            return db.execute(f"SELECT id, typeof(a), a FROM {table} ORDER BY id").fetchall()

    assert stored(target, "dst") == stored(source, "src")


SPELLINGS = {
    # (the watermark, a row of its day later in time written another way, that row rewritten)
    "T, then a space": ("2024-01-05T10:00:00", "2024-01-05 11:00:00", "2024-01-05T11:00:00"),
    "a space, then T": ("2024-01-05 10:00:00", "2024-01-05T11:00:00", "2024-01-05 11:00:00"),
    "Z, then none": ("2024-01-05 10:00:00.0Z", "2024-01-05 10:00:00.5", "2024-01-05 10:00:00.5Z"),
    "a longer fraction": (
        "2024-01-05 10:00:00.5Z",
        "2024-01-05 10:00:00.51Z",
        "2024-01-05 10:00:00.6Z",
    ),
    "an offset, then Z": (
        "2024-01-05 10:00:00+00:00",
        "2024-01-05 11:00:00Z",
        "2024-01-05 11:00:00+00:00",
    ),
    "no seconds, the same instant": (
        "2024-01-05 10:00:00",
        "2024-01-05 10:00",
        "2024-01-05 10:00:00",
    ),
    "a date alone, the same instant": ("2024-01-05 00:00:00", "2024-01-05", "2024-01-05 00:00:00"),
    "a leading blank, a day later": (
        "2024-01-05 10:00:00",
        " 2024-01-06 10:00:00",
        "2024-01-06 10:00:00",
    ),
}
SPELLING_ROUTE = """\
[source]
path = "source.db"
table = "ev"
partition_column = "region"
cursor_column = "ts"
[target]
kind = "{kind}"
path = "target.{kind}"
table = "ev_copy"
[transfer]
strategy = "incremental_append"
path = "{path}"
[store]
path = "checkpoints.db"
"""


@pytest.mark.parametrize(("kind", "path"), [("sqlite", "legacy"), ("duckdb", "lazy-plan")])
@pytest.mark.parametrize("spelling", sorted(SPELLINGS))
def test_a_text_cursor_written_two_ways_on_the_watermarks_day_is_refused_not_lost(
    tmp_path, kind, path, spelling
):
    """SQLite orders timestamp texts as texts, so a row of the watermark's day written
    another way can sort below the watermark though it is later, and was never loaded, exit
    0. The next run is refused before the target; two spellings on earlier days are not
    (they sort below any watermark alike); once the rows are rewritten, every row loads
    once."""
    from dpone_native_transfer import DuckDBSink, SQLiteSink

    watermark, other, rewritten = SPELLINGS[spelling]
    file = tmp_path / "route.toml"
    file.write_text(SPELLING_ROUTE.format(kind=kind, path=path), encoding="utf-8")
    with contextlib.closing(sqlite3.connect(tmp_path / "source.db")) as db:
        db.execute("CREATE TABLE ev (id INTEGER PRIMARY KEY, region TEXT, ts TIMESTAMP)")
        db.execute("CREATE INDEX ev_ts ON ev (ts)")
        db.executemany(
            "INSERT INTO ev VALUES (?, 'a', ?)",
            [(1, "2024-01-03T10:00:00"), (2, "2024-01-04 10:00:00"), (3, watermark)],
        )
        db.commit()
    run(file)
    with contextlib.closing(sqlite3.connect(tmp_path / "source.db")) as db:
        db.executemany("INSERT INTO ev VALUES (?, 'a', ?)", [(4, other), (5, "2024-01-06")])
        db.commit()
    refused = run(file, code=2)
    assert "native_transfer_config_invalid" in refused.stderr
    assert "holds timestamps in more than one spelling" in refused.stderr
    assert other not in refused.stderr and watermark not in refused.stderr
    sink = {"sqlite": SQLiteSink, "duckdb": DuckDBSink}[kind](
        tmp_path / f"target.{kind}", "ev_copy"
    )
    assert sink.row_count() == 3
    with contextlib.closing(sqlite3.connect(tmp_path / "source.db")) as db:
        db.execute("UPDATE ev SET ts = ? WHERE id = 4", (rewritten,))
        db.commit()
    run(file)
    assert sorted(row[0] for row in sink.rows()) == [1, 2, 3, 4, 5]


@pytest.mark.parametrize("top", ["2024-1-11", "2024-01-05t10:00:00", "2024-01-05 9:30:00"])
def test_a_text_cursor_that_does_not_sort_as_time_is_refused_before_anything_loads(tmp_path, top):
    """``2024-1-11`` sorts above ``2024-01-12``; as the watermark it left that row out for
    good, exit 0; so did a lowercase ``t`` or a one-digit hour below a later time. A window
    whose top is not in the ordered form is refused, before the target."""
    file = tmp_path / "route.toml"
    file.write_text(SPELLING_ROUTE.format(kind="sqlite", path="legacy"), encoding="utf-8")
    with contextlib.closing(sqlite3.connect(tmp_path / "source.db")) as db:
        db.execute("CREATE TABLE ev (id INTEGER PRIMARY KEY, region TEXT, ts TIMESTAMP)")
        db.executemany("INSERT INTO ev VALUES (?, 'a', ?)", [(1, "2024-01-04"), (2, top)])
        db.commit()
    refused = run(file, code=2)
    assert "holds timestamps in more than one spelling" in refused.stderr
    assert not (tmp_path / "target.sqlite").exists()
