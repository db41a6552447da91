"""Issue 14.6: partitions that fit the table, through ``dpone-transfer run``.

Without a partition column (or with ``partition_by = "range"``) a route cuts
its key into contiguous ranges of about ``partition_rows`` rows: each run
loads every source row exactly once, with a handful of partitions instead of
one per distinct value.
"""

from __future__ import annotations

import contextlib
import sqlite3
from pathlib import Path

import pytest
from helpers import routes
from helpers.cli import run_cli
from helpers.routes import PATHS

from dpone_native_transfer import TransferSpec
from dpone_native_transfer.config import load_route_config
from dpone_native_transfer.connectors.sqlite import SQLiteSource
from dpone_native_transfer.errors import RouteDefinitionChanged
from dpone_native_transfer.runtime import TransferRuntime
from dpone_native_transfer.stores.sqlite import SQLiteCheckpointStore
from dpone_native_transfer.testing import FaultyStore, InjectedFault

FILES, SINKS = routes.TARGET_FILES, routes.SINKS
STRATEGIES = {  # strategy, cursor column
    "refresh": ("full_refresh", None),
    "append-by-key": ("incremental_append", None),
    "append-by-cursor": ("incremental_append", "ts"),
}
# The sample route over this module's events table (id, v, ts), cut into ranges of its key.
EVENTS = {"table": "events", "partition_column": None, "partition_rows": 1000}


def write_route(folder: Path, *, kind="sqlite", path="staged", which="append-by-key", source=None):
    strategy, cursor = STRATEGIES[which]
    source = {**EVENTS, "cursor_column": cursor, **(source or {})}
    return routes.write_route(
        folder, kind=kind, path=path, strategy=strategy, table="copy", source=source
    )


def add_rows(folder: Path, count: int, *, ids: list[int] | None = None) -> None:
    with contextlib.closing(sqlite3.connect(folder / "source.db")) as db:
        db.execute("CREATE TABLE IF NOT EXISTS events (id INTEGER PRIMARY KEY, v TEXT, ts INTEGER)")
        start = db.execute("SELECT coalesce(max(id), 0) FROM events").fetchone()[0]
        ids = ids or list(range(start + 1, start + count + 1))
        db.executemany("INSERT INTO events VALUES (?, ?, ?)", [(i, f"v{i}", i // 10) for i in ids])
        db.commit()


def source_ids(folder: Path) -> list[int]:
    with contextlib.closing(sqlite3.connect(folder / "source.db")) as db:
        return sorted(row[0] for row in db.execute("SELECT id FROM events"))


def target_ids(folder: Path, kind: str) -> list[int]:
    return sorted(row[0] for row in SINKS[kind](folder / FILES[kind], "copy").rows())


def run(route_file: Path, *, code: int = 0):
    done = run_cli("run", route_file)
    assert done.returncode == code, done.stdout + done.stderr
    return done


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("kind", ["sqlite", "duckdb", "clickhouse"])
@pytest.mark.parametrize("which", sorted(STRATEGIES))
def test_a_table_without_a_partition_column_is_cut_into_key_ranges(
    tmp_path: Path, kind: str, path: str, which: str
) -> None:
    add_rows(tmp_path, 2500)
    route_file = write_route(tmp_path, kind=kind, path=path, which=which)
    assert "committed 3 partitions" in run(route_file).stdout  # ceil(2,500 / 1,000)
    add_rows(tmp_path, 1500)
    again = run(route_file).stdout
    # a refresh cuts all 4,000 rows; an append the 1,500 new ones, and by cursor also loads
    # the new rows at the old watermark (ts 250, ids 2501-2509) as one edge partition
    new_ranges = {"refresh": 4, "append-by-key": 2, "append-by-cursor": 3}[which]
    assert f"committed {new_ranges} partitions" in again
    assert target_ids(tmp_path, kind) == source_ids(tmp_path)  # every row once
    assert "loaded 0 rows" in run(route_file).stdout or which == "refresh"


def test_the_checkpoints_record_the_ranges(tmp_path: Path) -> None:
    add_rows(tmp_path, 5000)
    route_file = write_route(tmp_path)
    run(route_file)
    config = load_route_config(route_file)
    latest = SQLiteCheckpointStore(config.store_path).list_latest(config.route)
    ranges = sorted(
        ((cp.partition_bounds["partition_from"] or 0), cp.rows_exported) for cp in latest
    )
    assert ranges == [(0, 1000), (1001, 1000), (2001, 1000), (3001, 1000), (4001, 1000)]


def test_a_retry_keeps_its_ranges_when_rows_moved_the_cuts(tmp_path: Path) -> None:
    """Rows written into a pending window would move every cut: new ranges, new ids, and the
    ranges the first attempt committed would load again."""
    add_rows(tmp_path, 0, ids=list(range(2, 5001, 2)))  # even ids: cuts every 1,000 rows
    route_file = write_route(tmp_path, which="append-by-cursor")
    config = load_route_config(route_file)
    store = FaultyStore(SQLiteCheckpointStore(config.store_path))
    store.fail_state_write("source_state")
    with pytest.raises(InjectedFault):  # committed, then the state write failed
        TransferRuntime(store).run(config.spec("run-1"))
    first = target_ids(tmp_path, "sqlite")
    add_rows(tmp_path, 0, ids=list(range(1, 5000, 2)))  # odd ids inside the same window
    retry = TransferRuntime(store).run(config.spec("run-1"))
    assert retry.rows_loaded == 0 and len(retry.skipped_partition_ids) == 3
    assert target_ids(tmp_path, "sqlite") == first  # nothing twice


def test_no_integer_primary_key_and_no_partition_column_is_refused(tmp_path: Path) -> None:
    with contextlib.closing(sqlite3.connect(tmp_path / "source.db")) as db:
        db.execute("CREATE TABLE events (id TEXT PRIMARY KEY, v TEXT, ts INTEGER)")
    done = run(write_route(tmp_path), code=2)
    assert "native_transfer_config_invalid" in done.stderr
    assert "partition_column" in done.stderr


def test_partition_rows_needs_range_partitioning(tmp_path: Path) -> None:
    add_rows(tmp_path, 10)
    route_file = write_route(tmp_path, source={"partition_column": "v", "partition_by": "value"})
    done = run(route_file, code=2)
    assert "source.partition_rows" in done.stderr and "range" in done.stderr


def test_a_named_column_can_be_cut_into_ranges(tmp_path: Path) -> None:
    add_rows(tmp_path, 2500)
    route_file = write_route(tmp_path, source={"partition_column": "ts", "partition_by": "range"})
    assert "committed 3 partitions" in run(route_file).stdout  # ts repeats: cuts stay whole
    assert target_ids(tmp_path, "sqlite") == source_ids(tmp_path)


def test_very_many_partitions_by_value_warn(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr("dpone_native_transfer.planner.MANY_PARTITIONS", 5)
    add_rows(tmp_path, 8)
    text = write_route(tmp_path).read_text().replace("partition_rows = 1000", "")
    (tmp_path / "route.toml").write_text(
        text.replace("[source]", '[source]\npartition_column = "v"')
    )
    done = run(tmp_path / "route.toml")
    assert "warning: 8 partitions by value of 'v'" in done.stderr
    assert 'partition_by = "range"' in done.stderr


def test_a_postgres_table_is_cut_into_ranges_of_its_key(tmp_path: Path, postgres_schema) -> None:
    import psycopg

    schema = postgres_schema.schema
    with contextlib.closing(psycopg.connect(postgres_schema.dsn, autocommit=True)) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')
        conn.execute(f'CREATE TABLE "{schema}".events (id bigint PRIMARY KEY, v text)')
        conn.execute(
            f"INSERT INTO \"{schema}\".events SELECT i, 'v' || i FROM generate_series(1, 2500) i"
        )
    (tmp_path / "route.toml").write_text(
        f"""[source]
kind = "postgres"
dsn = "env:RANGE_DSN"
table = "{schema}.events"
partition_column = "id"
partition_by = "range"
partition_rows = 1000
[target]
path = "target.db"
table = "copy"
[transfer]
strategy = "incremental_append"
path = "staged"
[store]
path = "checkpoints.db"
"""
    )
    from helpers.postgres_server import postgres_url

    env = {"RANGE_DSN": postgres_url(postgres_schema.dsn)}
    done = run_cli("run", tmp_path / "route.toml", env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "committed 3 partitions" in done.stdout
    assert target_ids(tmp_path, "sqlite") == list(range(1, 2501))
    again = run_cli("run", tmp_path / "route.toml", env=env)
    assert "loaded 0 rows" in again.stdout, again.stdout + again.stderr


@pytest.mark.parametrize("path", PATHS)
def test_switching_to_ranges_in_a_pending_window_keeps_its_value_partitions(
    tmp_path: Path, path: str
) -> None:
    """The retry cut the pending window into ranges: new ids, and all 30 rows loaded again."""
    add_rows(tmp_path, 30)
    route_file = write_route(tmp_path, path=path, which="append-by-cursor")
    by_value = route_file.read_text().replace("partition_rows = 1000", 'partition_column = "v"')
    route_file.write_text(by_value)
    config = load_route_config(route_file)
    store = FaultyStore(SQLiteCheckpointStore(config.store_path))
    store.fail_state_write("source_state")
    with pytest.raises(InjectedFault):
        TransferRuntime(store).run(config.spec("run-1"))
    ranges = {"partition_column": "v", "partition_by": "range"}  # the same column, in ranges
    write_route(tmp_path, path=path, which="append-by-cursor", source=ranges)
    add_rows(tmp_path, 0, ids=[40, 41, 42, 43])  # above the window (ts 4)
    run(route_file)
    run(route_file)
    assert target_ids(tmp_path, "sqlite") == source_ids(tmp_path)


def _keyed_source(path: Path, *, index: bool = True) -> SQLiteSource:
    """``t`` keyed by ``k`` (indexed, some rows without a key), in ranges of about 300 rows;
    ``id`` is its cursor."""
    with contextlib.closing(sqlite3.connect(path)) as db:
        db.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, k INTEGER, v TEXT)")
        rows = [(i, None if i % 97 == 0 else (i * 7919) % 1000, f"v{i}") for i in range(1, 1201)]
        db.executemany("INSERT INTO t VALUES (?, ?, ?)", rows)
        if index:
            db.execute("CREATE INDEX t_k ON t (k)")
        db.commit()
    return SQLiteSource(str(path), "t", "k", "id", partition_rows=300)


def test_key_ranges_from_the_lowest_key_to_the_highest_are_one_statement(tmp_path):
    """table_sql reads such a plan in one statement, which selects exactly the rows of the
    ranges' own reads, in a cursor window or not, with the NULL key's rows only when its
    partition is planned; a gap or a missing end keeps each range's own read."""
    source = _keyed_source(tmp_path / "s.db")
    columns = source.describe().columns
    ranges = source.partition_ranges()
    null, keyed = ranges[0], ranges[1:]
    assert null == {"partition": None} and len(keyed) > 2

    def whole(bounds: list) -> bool:
        with source.reader() as conn:
            sql = source.table_sql(bounds, conn=conn, schema="main", columns=columns)
            if sql is None:
                return False
            own = [
                row
                for b in bounds
                for row in conn.execute(*source.select_sql(b, schema="main", columns=columns))
            ]
            assert sorted(conn.execute(*sql).fetchall()) == sorted(own)
            return True

    assert whole(ranges)
    assert whole(keyed)  # the rows without a key are left out
    assert whole([{**b, "cursor_upto": 500} for b in ranges])  # in a cursor window
    assert whole([{**b, "cursor_after": 100, "cursor_upto": 500} for b in keyed])
    assert not whole([null, *keyed[:1], *keyed[2:]])  # a gap
    assert not whole([null, *keyed[:-1]])  # the highest keys
    assert not whole([{**ranges[0], "cursor_upto": 5}, *ranges[1:]])  # two windows
    with source.reader() as conn:  # an index reads each range: no scan sorted by range
        assert (
            source.table_sql(ranges, conn=conn, schema="main", columns=columns, by_partition=True)
            is None
        )


@pytest.mark.parametrize("window", [{}, {"cursor_after": 100, "cursor_upto": 900}])
def test_an_unindexed_keys_ranges_are_one_scan_sorted_by_range(tmp_path, window):
    """``by_partition``: each range's rows together, in the bounds' order, each run exactly
    the range's own read (file-artifact's pull into SQLite cuts the runs into its files)."""
    source = _keyed_source(tmp_path / "s.db", index=False)
    columns = source.describe().columns
    bounds = [{**b, **window} for b in source.partition_ranges()]
    with source.reader() as conn:
        sql = source.table_sql(bounds, conn=conn, schema="main", columns=columns, by_partition=True)
        assert sql is not None
        rows = conn.execute(*sql).fetchall()
        own = [list(conn.execute(*source.select_sql(b, columns=columns))) for b in bounds]
    assert rows == [row for run in own for row in run] and all(own)


@pytest.mark.parametrize("strategy", ["full_refresh", "incremental_append"])
@pytest.mark.parametrize("index", [True, False])
@pytest.mark.parametrize("path", ["legacy", "staged", "file-artifact", "lazy-plan"])
@pytest.mark.parametrize("kind", ["sqlite", "duckdb", "clickhouse"])
def test_key_ranges_copied_whole_load_every_row_once_with_each_range_counted(
    tmp_path, kind, path, index, strategy
):
    """Each range's count: by an index count each, or without an index by one read of the
    pulled keys, each given to the range SQLite's ``>=`` and ``<`` put it in (DuckDB: an
    ``ASOF`` join on the ranges' starts; chDB: ``roundDown`` to them). An append's next run,
    after rows at the cuts, below and above every key and without a key, loads just those."""
    from dpone_native_transfer import TransferSpec

    source = _keyed_source(tmp_path / "s.db", index=index)
    if kind == "clickhouse":
        sink = routes.SINKS[kind](str(tmp_path / "target"), "copy")
    else:
        sink = routes.make_sink(kind, tmp_path / f"target.{kind}", "copy")
    with contextlib.closing(sqlite3.connect(tmp_path / "s.db")) as db:
        expected = db.execute("SELECT * FROM t ORDER BY id").fetchall()
    runs = [expected]
    if strategy == "incremental_append":
        cuts = sorted(
            b["partition_from"] for b in source.partition_ranges() if b.get("partition_from")
        )
        added = [(1201 + n, key, f"new{n}") for n, key in enumerate([*cuts, -5, 10**6, None])]
        runs.append(expected + added)
    for number, rows in enumerate(runs):
        with contextlib.closing(sqlite3.connect(tmp_path / "s.db")) as db:
            db.executemany("INSERT OR IGNORE INTO t VALUES (?, ?, ?)", rows)
            db.commit()
        spec = TransferSpec(
            source=source, sink=sink, strategy=strategy, path=path, run_id=f"r{number}"
        )
        with SQLiteCheckpointStore(str(tmp_path / "checkpoints.db")) as store:
            loaded = TransferRuntime(store).run(spec).rows_loaded
            latest = list(store.list_latest(spec.route))
        assert loaded == len(rows) - (len(runs[number - 1]) if number else 0)
        assert sorted(sink.rows()) == rows
        if path != "lazy-plan":  # the engine counts nothing there
            own = {cp.partition_id: source.count(cp.partition_bounds) for cp in latest}
            assert {cp.partition_id: cp.rows_exported for cp in latest} == own


# the range size is part of a cursorless route's definition ---------------------------------------


def _restore(route_file: Path):
    return run_cli("state", "restore", route_file, "--reason", "lost", "--operator", "o", "--yes")


def test_a_changed_range_size_is_refused_where_the_ranges_are_the_increments(
    tmp_path: Path,
) -> None:
    """Without a cursor (a Python caller's route: a route file's ranges window by their key)
    the ranges are the increments: cut at 500 rows instead of 1,000, every range was new, and
    the run appended all 2,500 rows again."""
    add_rows(tmp_path, 2500)
    store = SQLiteCheckpointStore(str(tmp_path / "checkpoints.db"))

    def run_with(rows: int) -> None:
        source = SQLiteSource(str(tmp_path / "source.db"), "events", "id", partition_rows=rows)
        sink = SINKS["sqlite"](str(tmp_path / "target.db"), "copy")
        spec = TransferSpec(source=source, sink=sink, strategy="incremental_append",
                            path="staged", run_id=f"cut-{rows}")  # fmt: skip
        TransferRuntime(store).run(spec)

    try:
        run_with(1000)
        with pytest.raises(RouteDefinitionChanged, match="partition_rows"):
            run_with(500)
        run_with(1000)
    finally:
        store.close()
    assert target_ids(tmp_path, "sqlite") == source_ids(tmp_path)


def test_a_changed_range_size_of_a_route_file_loads_each_row_once(tmp_path: Path) -> None:
    """A route file's ranges window by their key: its watermark decides what a run loads, so
    another range size is taken, recorded and never loads a row twice."""
    add_rows(tmp_path, 2500)
    route_file = write_route(tmp_path)
    run(route_file)
    route_file.write_text(
        route_file.read_text().replace("partition_rows = 1000", "partition_rows = 500")
    )
    assert "loaded 0 rows" in run(route_file).stdout
    add_rows(tmp_path, 700)
    assert "committed 2 partitions, skipped 0, loaded 700 rows" in run(route_file).stdout
    assert target_ids(tmp_path, "sqlite") == source_ids(tmp_path)


def test_state_restore_reads_what_a_ledger_of_version_1_tells_of_the_definition(
    tmp_path: Path,
) -> None:
    """A ledger row written before it recorded the definition: its bounds still say the
    route cut key ranges, so a restore under partitions by value is refused."""
    add_rows(tmp_path, 2500)
    route_file = write_route(tmp_path)
    run(route_file)
    with contextlib.closing(sqlite3.connect(tmp_path / "target.db")) as db:
        db.execute(
            "UPDATE _dpone_ledger SET entry = json_remove(json_set(entry, '$.format', "
            "'dpone.target_ledger.v1'), '$.epoch', '$.definition', '$.excused', '$.rejected')"
        )
        db.commit()
    (tmp_path / "checkpoints.db").unlink()
    text = route_file.read_text()
    by_value = text.replace("partition_rows = 1000", 'partition_column = "v"')
    route_file.write_text(by_value)
    done = _restore(route_file)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "partition_by 'range' -> 'value'" in done.stderr  # told by the bounds alone
    route_file.write_text(text)
    assert _restore(route_file).returncode == 0
    assert "loaded 0 rows" in run(route_file).stdout
    assert target_ids(tmp_path, "sqlite") == source_ids(tmp_path)


@pytest.mark.parametrize("rows", [2, 7, 100, 999, 1000, 5000])
@pytest.mark.parametrize("window", [{}, {"after": 100, "upto": 900}, {"upto": 0}])
def test_a_primary_keys_cuts_are_the_window_functions(tmp_path, rows, window):
    """A key that alone is the PRIMARY KEY is cut by an OFFSET from each cut to the next;
    the ranges are exactly those of ``range_cuts_sql``'s window function (gaps in the key,
    a NULL-less key, a cursor window, nothing in the window)."""
    db = tmp_path / "s.db"
    with contextlib.closing(sqlite3.connect(db)) as conn, conn:
        conn.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, ts INTEGER)")
        conn.executemany(
            "INSERT INTO t VALUES (?, ?)", [(n * 3 + n % 7, n % 1000) for n in range(2000)]
        )
    chained = SQLiteSource(str(db), "t", "id", "ts", partition_rows=rows)
    # the same key, not alone in the PRIMARY KEY's place: the window function cuts it
    with contextlib.closing(sqlite3.connect(db)) as conn, conn:
        conn.execute("CREATE TABLE u AS SELECT * FROM t")
        conn.execute("CREATE INDEX u_id ON u (id)")
    windowed = SQLiteSource(str(db), "u", "id", "ts", partition_rows=rows)
    with chained.reader() as conn:
        assert chained._sole_primary_key(conn)
    with windowed.reader() as conn:
        assert not windowed._sole_primary_key(conn)
    assert chained.partition_ranges(**window) == windowed.partition_ranges(**window)
    assert len(chained.partition_ranges()) == -(-2000 // rows)


@pytest.mark.parametrize("rows", [1, 2, 7, 100, 999, 1000, 5000])
@pytest.mark.parametrize("window", [{}, {"after": 100, "upto": 900}, {"upto": -1}])
def test_a_postgres_keys_walked_cuts_are_the_window_functions(postgres_schema, rows, window):
    """PostgreSQL's cuts, found by walking a cursor of the keys, are exactly those of
    ``range_cuts_sql``'s window function, on a key with gaps, repeats and NULLs, in a
    cursor window or none, with nothing in the window."""
    import psycopg

    from dpone_native_transfer.connectors._sql import range_cuts_sql
    from dpone_native_transfer.connectors.postgres import PostgresSource

    schema = postgres_schema.schema
    with contextlib.closing(psycopg.connect(postgres_schema.dsn, autocommit=True)) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')
        conn.execute(f'CREATE TABLE "{schema}".t (k numeric, ts bigint)')
        conn.execute(
            f'INSERT INTO "{schema}".t SELECT CASE WHEN n % 11 = 0 THEN NULL ELSE (n * 3 +'
            " n % 7) / 4 END, n % 1000 FROM generate_series(0, 1999) AS n"
        )
        conn.execute(f'CREATE INDEX ON "{schema}".t (k)')
        conditions = [f"ts > {window['after']}"] if "after" in window else []
        conditions += [f"ts <= {window['upto']}"] if "upto" in window else []
        cuts_sql = range_cuts_sql("k", f'"{schema}".t', conditions, str(rows))
        expected = [row[0] for row in conn.execute(f"SELECT k::text FROM ({cuts_sql}) AS c")]
    from helpers.postgres_server import postgres_url

    source = PostgresSource(
        postgres_url(postgres_schema.dsn), f"{schema}.t", "k", "ts", partition_rows=rows
    )
    ranges = source.partition_ranges(**window)
    edges = [each["partition_from"] for each in ranges if "partition_from" in each][1:]
    assert edges == list(dict.fromkeys(expected))
    if 1 < rows <= 100 and window.get("upto", 0) >= 0:
        assert len(edges) > 1  # not vacuous: the key is cut
