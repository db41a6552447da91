"""Issue 14.1: cursor edges through ``dpone-transfer run``, counted against the source.

Ties at the watermark, late rows within ``lag``, NULL cursors and identical
rows: after every run the target holds each source row a window covers
exactly once (a multiset), on every path and target, or the run is refused
before the target with a named code and the route stays retryable.
"""

from __future__ import annotations

import contextlib
import sqlite3
from collections import Counter
from decimal import Decimal
from pathlib import Path
from types import SimpleNamespace

import pytest
from helpers import routes
from helpers.cli import run_cli
from helpers.routes import PATHS
from helpers.stores import make_checkpoint
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dpone_native_transfer import SQLiteSink
from dpone_native_transfer.config import load_route_config
from dpone_native_transfer.cursor_edge import EDGE_KEY, MAX_EDGE_ROWS, EdgeTracker, row_digest
from dpone_native_transfer.payloads import Column
from dpone_native_transfer.runtime import TransferRuntime
from dpone_native_transfer.source_state import Edge
from dpone_native_transfer.stores.sqlite import SQLiteCheckpointStore
from dpone_native_transfer.testing import FaultyStore, InjectedFault

TARGETS = routes.TARGET_FILES
# The sample route over this module's events table (region, ts, v).
EVENTS = {"table": "events", "cursor_column": "ts"}


def make_route(folder: Path, *, kind: str = "sqlite", path: str = "staged", source=None):
    with contextlib.closing(sqlite3.connect(folder / "source.db")) as db:
        db.execute("CREATE TABLE IF NOT EXISTS events (region TEXT, ts INTEGER, v TEXT)")
        db.commit()
    source = {**EVENTS, **(source or {})}
    return routes.write_route(folder, kind=kind, path=path, table="events_copy", source=source)


def insert(folder: Path, *rows: tuple) -> None:
    with contextlib.closing(sqlite3.connect(folder / "source.db")) as db:
        db.executemany("INSERT INTO events (region, ts, v) VALUES (?, ?, ?)", rows)
        db.commit()


def source_rows(folder: Path) -> Counter:
    with contextlib.closing(sqlite3.connect(folder / "source.db")) as db:
        return Counter(db.execute("SELECT region, ts, v FROM events"))


def target_rows(folder: Path, kind: str) -> Counter:
    from dpone_native_transfer import ClickHouseSink, DuckDBSink

    sinks = {"sqlite": SQLiteSink, "duckdb": DuckDBSink, "clickhouse": ClickHouseSink}
    return Counter(sinks[kind](folder / TARGETS[kind], "events_copy").rows())


def run(route_file: Path, *, code: int = 0):
    done = run_cli("run", route_file)
    assert done.returncode == code, done.stdout + done.stderr
    return done


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("kind", ["sqlite", "duckdb", "clickhouse"])
def test_rows_written_later_at_the_watermark_value_are_loaded_once(
    tmp_path: Path, kind: str, path: str
) -> None:
    """The window was ``(watermark, upto]``: a tie written after a run was never loaded."""
    route_file = make_route(tmp_path, kind=kind, path=path)
    insert(tmp_path, ("a", 1, "x"), ("b", 2, "x"), ("a", 2, "y"))
    run(route_file)
    insert(tmp_path, ("a", 2, "tie"), ("c", 2, "tie in a new partition"))
    assert "loaded 2 rows" in run(route_file).stdout
    assert "loaded 0 rows" in run(route_file).stdout  # and not again
    insert(tmp_path, ("a", 3, "z"), ("a", 2, "another tie"))
    run(route_file)
    assert target_rows(tmp_path, kind) == source_rows(tmp_path)


@pytest.mark.parametrize("path", PATHS)
def test_identical_rows_are_counted_as_a_multiset(tmp_path: Path, path: str) -> None:
    route_file = make_route(tmp_path, path=path)
    insert(tmp_path, ("a", 5, "same"), ("a", 5, "same"))
    run(route_file)
    insert(tmp_path, ("a", 5, "same"))  # a third, identical row at the watermark
    assert "loaded 1 row " in run(route_file).stdout
    assert target_rows(tmp_path, "sqlite") == source_rows(tmp_path)
    assert target_rows(tmp_path, "sqlite")[("a", 5, "same")] == 3


@pytest.mark.parametrize("path", PATHS)
def test_lag_rereads_late_rows_and_loads_only_the_new_ones(tmp_path: Path, path: str) -> None:
    route_file = make_route(tmp_path, path=path, source={"lag": 10})
    insert(tmp_path, *(("a", ts, "x") for ts in range(0, 100, 5)))
    run(route_file)  # watermark 95: the edge is [85, 95]
    insert(tmp_path, ("a", 86, "late"), ("b", 95, "tie"), ("a", 84, "too late"))
    assert "loaded 2 rows" in run(route_file).stdout
    insert(tmp_path, ("a", 120, "new"))  # watermark 120: the edge moves to [110, 120]
    run(route_file)
    insert(tmp_path, ("a", 100, "below the moved edge"), ("a", 115, "late"))
    assert "loaded 1 row " in run(route_file).stdout
    expected = source_rows(tmp_path)
    del expected[("a", 84, "too late")], expected[("a", 100, "below the moved edge")]
    assert target_rows(tmp_path, "sqlite") == expected


def test_lag_on_a_text_cursor_is_refused_before_any_read(tmp_path: Path) -> None:
    route_file = make_route(tmp_path, source={"lag": 1, "on_null_cursor": "load_once"})
    with contextlib.closing(sqlite3.connect(tmp_path / "source.db")) as db:
        db.execute("DROP TABLE events")
        db.execute("CREATE TABLE events (region TEXT, ts TEXT, v TEXT)")
        db.execute("INSERT INTO events VALUES ('a', 'k1', 'x')")
        db.commit()
    done = run(route_file, code=2)
    assert "native_transfer_config_invalid" in done.stderr and "source.lag" in done.stderr
    assert not (tmp_path / TARGETS["sqlite"]).exists()


@pytest.mark.parametrize("days", [0, 2])
def test_lag_on_date_text_moves_back_by_days(tmp_path: Path, days: int) -> None:
    route_file = make_route(tmp_path, source={"lag": days})
    with contextlib.closing(sqlite3.connect(tmp_path / "source.db")) as db:
        db.execute("DROP TABLE events")
        db.execute("CREATE TABLE events (region TEXT, ts DATE, v TEXT)")
        db.executemany(
            "INSERT INTO events VALUES ('a', ?, 'x')", [("2024-03-01",), ("2024-03-05",)]
        )
        db.commit()
    run(route_file)
    with contextlib.closing(sqlite3.connect(tmp_path / "source.db")) as db:
        db.executemany(
            "INSERT INTO events VALUES ('a', ?, 'late')", [("2024-03-04",), ("2024-03-02",)]
        )
        db.commit()
    assert f"loaded {plural(days)}" in run(route_file).stdout  # 03-04 is within two days


def plural(days: int) -> str:
    return "0 rows" if days == 0 else "1 row "


@pytest.mark.parametrize("path", PATHS)
def test_null_cursors_are_refused_by_default_before_the_target(tmp_path: Path, path: str) -> None:
    """NULL-cursor rows were silently never loaded, not even on the first run."""
    route_file = make_route(tmp_path, path=path)
    insert(tmp_path, ("a", 1, "x"), ("a", None, "no cursor"), ("b", None, "no cursor"))
    done = run(route_file, code=2)
    assert "native_transfer_cursor_null" in done.stderr
    assert "'ts'" in done.stderr and '"rows": 2' in done.stderr
    assert "no cursor" not in done.stderr  # the column and count, never a value
    assert not (tmp_path / TARGETS["sqlite"]).exists()  # before the target
    scan = run_cli("guard", "scan", "--store", tmp_path / "checkpoints.db")
    assert scan.returncode == 0, scan.stdout + scan.stderr  # nothing blocks the route
    make_route(tmp_path, path=path, source={"on_null_cursor": "load_once"})
    assert "loaded 3 rows" in run(route_file).stdout


@pytest.mark.parametrize("path", PATHS)
def test_load_once_loads_each_null_cursor_row_once(tmp_path: Path, path: str) -> None:
    route_file = make_route(tmp_path, path=path, source={"on_null_cursor": "load_once"})
    insert(tmp_path, ("a", 1, "x"), ("a", None, "n"), ("a", None, "n"))
    assert "loaded 3 rows" in run(route_file).stdout
    assert "loaded 0 rows" in run(route_file).stdout
    insert(tmp_path, ("a", None, "n"), ("b", None, "m"), ("a", 2, "y"))
    assert "loaded 3 rows" in run(route_file).stdout
    assert target_rows(tmp_path, "sqlite") == source_rows(tmp_path)
    make_route(tmp_path, path=path)  # back to "error": the loaded NULL rows do not count
    assert "loaded 0 rows" in run(route_file).stdout
    insert(tmp_path, ("c", None, "new"))
    assert '"rows": 1' in run(route_file, code=2).stderr


def test_a_crash_between_commit_and_state_never_loads_the_edge_twice(tmp_path: Path) -> None:
    """The retry skips the committed partitions and rebuilds the record from their checkpoints."""
    route_file = make_route(tmp_path, source={"on_null_cursor": "load_once"})
    insert(tmp_path, ("a", 1, "x"), ("a", 2, "x"), ("b", None, "n"))
    config = load_route_config(route_file)
    store = FaultyStore(SQLiteCheckpointStore(config.store_path))
    store.fail_state_write("source_state")
    with pytest.raises(InjectedFault):
        TransferRuntime(store).run(config.spec("run-1"))
    insert(tmp_path, ("a", 2, "tie"), ("c", None, "n"))  # written before the retry
    result = TransferRuntime(store).run(config.spec("run-1"))
    assert len(result.skipped_partition_ids) == 2  # a's window and b's NULL row: committed
    assert result.rows_loaded == 1  # c's NULL row is new work of the same generation
    state = store.load_source_state(config.route)
    assert state[EDGE_KEY]["since"] == 2 and state[EDGE_KEY]["nulls"] is True
    assert "loaded 1 row " in run(route_file).stdout  # the tie, once; no NULL row again
    assert target_rows(tmp_path, "sqlite") == source_rows(tmp_path)


def test_a_lazy_plan_whose_top_rows_changed_during_the_load_forgets_them(tmp_path: Path) -> None:
    """A row added between the two reads around the engine's load may or may not be in the
    target: the record drops the range (never a duplicate) and says so in an event."""
    route_file = make_route(tmp_path, path="lazy-plan")
    insert(tmp_path, ("a", 1, "x"), ("a", 2, "x"))
    config = load_route_config(route_file)
    sink = config.sink
    load = sink.load_plan

    def load_then_write(plan, **ledger):
        rows = load(plan, **ledger)
        insert(tmp_path, ("a", 2, "written during the load"))
        return rows

    sink.load_plan = load_then_write
    events = []
    store = SQLiteCheckpointStore(config.store_path)
    TransferRuntime(store, events=events.append).run(config.spec("run-1", sink=sink))
    assert {"part": "range"} in [e.fields for e in events if e.name == "cursor_edge_untracked"]
    assert store.load_source_state(config.route)[EDGE_KEY]["since"] is None
    assert "loaded 0 rows" in run(route_file).stdout  # the exclusive bound: no duplicate
    insert(tmp_path, ("a", 3, "y"))
    run(route_file)
    insert(tmp_path, ("a", 3, "tie"))  # tracked again from the next window on
    assert "loaded 1 row " in run(route_file).stdout


def test_a_restored_store_loads_no_null_row_again(tmp_path: Path) -> None:
    route_file = make_route(tmp_path, source={"on_null_cursor": "load_once"})
    insert(tmp_path, ("a", 1, "x"), ("b", None, "n"))
    run(route_file)
    (tmp_path / "checkpoints.db").unlink()
    restore = run_cli(
        "state", "restore", route_file, "--reason", "lost", "--operator", "me", "--yes"
    )
    assert restore.returncode == 0, restore.stdout + restore.stderr
    assert "loaded 0 rows" in run(route_file).stdout  # the NULL rows there now: taken as loaded
    insert(tmp_path, ("c", None, "new"))
    assert "loaded 1 row " in run(route_file).stdout  # and later ones load once, as before
    assert target_rows(tmp_path, "sqlite") == source_rows(tmp_path)


def test_an_edge_wider_than_the_bound_falls_back_to_the_exclusive_bound(tmp_path: Path) -> None:
    route_file = make_route(tmp_path)
    insert(tmp_path, *(("a", 7, str(i)) for i in range(MAX_EDGE_ROWS + 1)))
    done = run_cli("run", route_file)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "cursor edge" in done.stderr  # the warning says what is no longer tracked
    insert(tmp_path, ("a", 7, "tie"))
    assert "loaded 0 rows" in run(route_file).stdout  # not loaded, and nothing twice
    insert(tmp_path, ("a", 8, "y"))
    run(route_file)
    insert(tmp_path, ("a", 8, "tie"))  # a narrow edge is tracked again
    assert "loaded 1 row " in run(route_file).stdout


# the property: random inserts at, below and above the watermark, NULLs, ties, with and without
# lag; after every run the target equals the rows a window covers (a multiset) ------------------

values = st.one_of(st.none(), st.integers(min_value=-3, max_value=3))  # offsets from the mark
batches = st.lists(
    st.lists(st.tuples(st.sampled_from("ab"), values, st.sampled_from("xy")), max_size=6),
    min_size=1,
    max_size=5,
)


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(batches=batches, lag=st.sampled_from([0, 2]), path=st.sampled_from(PATHS))
def test_cursor_edge_property(tmp_path_factory, batches, lag, path) -> None:
    folder = tmp_path_factory.mktemp("edge")
    source = {"lag": lag, "on_null_cursor": "load_once"}
    route_file = make_route(folder, path=path, source=source)
    expected: Counter = Counter()
    watermark = None
    for batch in batches:
        base = 10 if watermark is None else watermark
        rows = [(r, None if d is None else base + d, v) for r, d, v in batch]
        insert(folder, *rows)
        for row in rows:  # what a window may still cover when the row is written
            cursor = row[1]
            if cursor is None or watermark is None or cursor >= watermark - lag:
                expected[row] += 1
        run(route_file)
        cursors = [row[1] for row in source_rows(folder) if row[1] is not None]
        watermark = max(cursors, default=watermark)
        assert target_rows(folder, "sqlite") == expected
    assert SQLiteSink(folder / TARGETS["sqlite"], "events_copy").row_count() == sum(
        expected.values()
    )


# what a hostile pass found --------------------------------------------------------------------


def alter(folder: Path, *statements: str) -> None:
    with contextlib.closing(sqlite3.connect(folder / "source.db")) as db:
        for statement in statements:
            db.execute(statement)
        db.commit()


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("change", ["DROP COLUMN extra", "RENAME COLUMN extra TO Extra"])
def test_a_dropped_or_renamed_column_never_reloads_the_edge(
    tmp_path: Path, path: str, change: str
) -> None:
    """The digests covered the dropped column: they matched no row, so all loaded again."""
    route_file = make_route(tmp_path, path=path, source={"on_null_cursor": "load_once"})
    alter(tmp_path, "ALTER TABLE events ADD COLUMN extra TEXT")
    alter(tmp_path, "INSERT INTO events VALUES ('a', 1, 'x', 'e'), ('a', NULL, 'n', 'e')")
    alter(tmp_path, "INSERT INTO events VALUES ('b', 5, 'y', 'e')")
    run(route_file)
    alter(tmp_path, f"ALTER TABLE events {change}")
    assert "loaded 0 rows" in run(route_file).stdout
    insert(tmp_path, ("a", 7, "z"), ("b", 7, "w"))
    run(route_file)
    assert "loaded 0 rows" in run(route_file).stdout
    assert target_rows(tmp_path, "sqlite").total() == source_rows(tmp_path).total() == 5
    insert(tmp_path, ("a", 7, "tie"), ("c", None, "m"))  # tracked again under the new columns
    assert "loaded 2 rows" in run(route_file).stdout


def test_lag_covers_the_edge_again_after_a_dropped_column(tmp_path: Path) -> None:
    """After a dropped column the record knew its rows from the next window's top up only:
    a later window set that to its own top, and a run with nothing new dropped it, so ties
    and late rows there were never loaded (exit 0). It is kept, and lag's whole range is
    tracked again once the watermark passes it."""
    route_file = make_route(tmp_path, source={"lag": 10})
    alter(tmp_path, "ALTER TABLE events ADD COLUMN extra TEXT")
    alter(tmp_path, "INSERT INTO events VALUES ('a', 100, 'x', 'e'), ('b', 100, 'y', 'e')")
    run(route_file)
    alter(tmp_path, "ALTER TABLE events DROP COLUMN extra")
    insert(tmp_path, ("c", 101, "z"))
    run(route_file)
    insert(tmp_path, ("d", 105, "w"))
    run(route_file)
    assert "loaded 0 rows" in run(route_file).stdout
    insert(tmp_path, ("e", 105, "tie"), ("f", 104, "late"), ("g", 101, "late"))
    assert "loaded 3 rows" in run(route_file).stdout
    insert(tmp_path, ("h", 100, "unknown"))  # at or below the dropped column's record: not known
    assert "loaded 0 rows" in run(route_file).stdout
    insert(tmp_path, ("i", 120, "top"))
    run(route_file)
    insert(tmp_path, ("j", 111, "late"), ("k", 110, "late"), ("l", 109, "too late"))
    assert "loaded 2 rows" in run(route_file).stdout  # lag's range, [110, 120], again
    loaded = Counter(row[:3] for row in target_rows(tmp_path, "sqlite").elements())  # less extra
    assert loaded == source_rows(tmp_path) - Counter(
        [("h", 100, "unknown"), ("l", 109, "too late")]
    )


@pytest.mark.parametrize("path", ["staged", "lazy-plan"])
def test_a_collated_partition_column_reads_each_edge_row_once(tmp_path: Path, path: str) -> None:
    """'a' and 'A' were two edge partitions, and SQLite's NOCASE made each read both."""
    make_route(tmp_path, path=path)
    alter(tmp_path, "DROP TABLE events")
    alter(tmp_path, "CREATE TABLE events (region TEXT COLLATE NOCASE, ts INTEGER, v TEXT)")
    route_file = make_route(tmp_path, path=path)
    insert(tmp_path, ("a", 1, "x"))
    run(route_file)
    insert(tmp_path, ("a", 1, "t1"), ("A", 1, "t2"))
    assert "loaded 2 rows" in run(route_file).stdout
    assert Counter(SQLiteSink(tmp_path / "target.db", "events_copy").rows()) == source_rows(
        tmp_path
    )


def test_a_retry_with_a_larger_lag_keeps_the_lag_its_partitions_recorded(tmp_path: Path) -> None:
    """The committed partitions recorded rows at 100 only; the retry's lag of 10 claimed
    [90, 100] known, so the next run loaded 90..99 again."""
    route_file = make_route(tmp_path)
    insert(tmp_path, *(("a", ts, "x") for ts in range(90, 101)))
    config = load_route_config(route_file)
    store = FaultyStore(SQLiteCheckpointStore(config.store_path))
    store.fail_state_write("source_state")
    with pytest.raises(InjectedFault):
        TransferRuntime(store).run(config.spec("run-1"))
    route_file = make_route(tmp_path, source={"lag": 10})
    run(route_file)
    assert "loaded 0 rows" in run(route_file).stdout
    assert target_rows(tmp_path, "sqlite") == source_rows(tmp_path)


@pytest.mark.parametrize("lag", ["1e20", "5"])
def test_a_lag_past_the_calendar_is_a_configuration_error(tmp_path: Path, lag: str) -> None:
    route_file = make_route(tmp_path, source={"lag": routes.Literal(lag)})
    alter(tmp_path, "DROP TABLE events", "CREATE TABLE events (region TEXT, ts DATE, v TEXT)")
    alter(tmp_path, "INSERT INTO events VALUES ('a', '0001-01-02', 'x')")
    done = run(route_file, code=2)
    assert "native_transfer_config_invalid" in done.stderr and "source.lag" in done.stderr


def test_a_decimal_nan_cursor_value_is_never_inside_the_edge() -> None:
    """PostgreSQL orders numeric 'NaN' above every number; comparing it raised."""
    from dpone_native_transfer.cursor_edge import _at_or_above

    assert _at_or_above("NaN", "1.5", "decimal") is False
    assert _at_or_above("2.50", "2.5", "decimal") is True


def test_a_postgres_source_loads_ties_late_rows_and_null_cursors_once(
    tmp_path: Path, postgres_schema
) -> None:
    import psycopg
    from helpers.postgres_server import postgres_url

    schema = postgres_schema.schema
    table = f'"{schema}".events'

    def sql(*statements: str) -> None:
        with contextlib.closing(psycopg.connect(postgres_schema.dsn, autocommit=True)) as conn:
            for statement in statements:
                conn.execute(statement)

    sql(f'CREATE SCHEMA "{schema}"', f"CREATE TABLE {table} (region text, ts bigint, v text)",
        f"INSERT INTO {table} VALUES ('a', 1, 'x'), ('a', 5, 'y'), ('b', NULL, 'n')")  # fmt: skip
    (tmp_path / "route.toml").write_text(
        f"""[source]
kind = "postgres"
dsn = "env:EDGE_DSN"
table = "{schema}.events"
partition_column = "region"
cursor_column = "ts"
lag = 2
on_null_cursor = "load_once"
[target]
path = "target.db"
table = "events_copy"
[transfer]
strategy = "incremental_append"
path = "staged"
[store]
path = "checkpoints.db"
"""
    )
    env = {"EDGE_DSN": postgres_url(postgres_schema.dsn)}

    def run_pg() -> str:
        done = run_cli("run", tmp_path / "route.toml", env=env)
        assert done.returncode == 0, done.stdout + done.stderr
        return done.stdout

    assert "loaded 3 rows" in run_pg()
    sql(f"INSERT INTO {table} VALUES ('a', 5, 'tie'), ('c', 4, 'late'), ('c', 2, 'too late'),"
        " ('b', NULL, 'n')")  # fmt: skip
    assert "loaded 3 rows" in run_pg()  # the tie, the late row within 2, the second NULL row
    assert "loaded 0 rows" in run_pg()
    with contextlib.closing(psycopg.connect(postgres_schema.dsn)) as conn:
        rows = conn.execute(f"SELECT region, ts, v FROM {table}").fetchall()
    expected = Counter(rows) - Counter([("c", 2, "too late")])
    assert target_rows(tmp_path, "sqlite") == expected


def test_the_largest_lag_below_negative_cursors_reads_every_row_once(tmp_path: Path) -> None:
    """``upto - lag`` below -2**63 failed the run with OverflowError (exit 1, no code): SQLite
    binds no such integer. It is a double then, which every engine compares."""
    with contextlib.closing(sqlite3.connect(tmp_path / "source.db")) as db:
        db.execute("CREATE TABLE events (id INTEGER PRIMARY KEY, region TEXT, ts INTEGER)")
        db.executemany("INSERT INTO events VALUES (?, ?, ?)", [(1, "a", -9), (2, "b", -5)])
        db.commit()
    route_file = routes.write_route(
        tmp_path,
        source={"table": "events", "cursor_column": "ts", "lag": 2**63 - 1},
        table="events_copy",
        path="legacy",
    )
    for loaded in ("loaded 2 rows", "loaded 0 rows"):
        done = run_cli("run", route_file, "--quiet")
        assert done.returncode == 0 and loaded in done.stdout, done.stdout + done.stderr
    with contextlib.closing(sqlite3.connect(tmp_path / "source.db")) as db:
        db.execute("INSERT INTO events VALUES (3, 'a', -7)")  # late, within the lag
        db.commit()
    assert "loaded 1 row" in run_cli("run", route_file, "--quiet").stdout
    assert sorted(target_rows(tmp_path, "sqlite")) == [(1, "a", -9), (2, "b", -5), (3, "a", -7)]


_VALUES = st.one_of(
    st.none(),
    st.integers(-5, 5),
    st.floats(-5, 5),
    st.just(float("nan")),
    st.sampled_from(["3", "a", "2026-01-01", b"\x00"]),
    st.decimals(-5, 5, places=1),
    st.just(Decimal("NaN")),
)


@settings(max_examples=300, deadline=None)
@given(
    values=st.lists(_VALUES, max_size=30),
    since=st.one_of(st.none(), st.integers(-5, 5), st.just("3"), st.just(2.5)),
    kind=st.sampled_from(["integer", "real", "text", "decimal", None]),
)
def test_a_chunk_away_from_the_edge_records_the_same_top_rows_in_one_pass_as_row_by_row(
    values, since, kind
):
    """``EdgeTracker._top`` compares a whole chunk at once; where it cannot (a decimal's text,
    values that do not compare), the row-by-row ``_kept`` decides: the recorded rows are
    the same either way."""
    columns = [Column("part", "TEXT"), Column("cur", "TEXT")]
    source = SimpleNamespace(cursor_column="cur", partition_column="part")
    tracker = EdgeTracker(
        Edge(columns=("part", "cur")), columns, source, top_since=since, kind=kind
    )
    chunk = [("p", value) for value in values]
    candidate = make_checkpoint(partition_bounds={"partition": "p", "cursor_above": -10})
    tracker.recorded[candidate.partition_id] = Counter()
    assert tracker._passed(candidate, chunk) == chunk
    expected = Counter((row[1], row_digest(row, [0, 1])) for row in chunk if tracker._kept(row[1]))
    assert tracker.recorded[candidate.partition_id] == expected
