"""Merge on a key (``strategy = "merge"``), through ``dpone-transfer run`` on real targets.

Every scenario runs the command on route files, on each merging target (SQLite, DuckDB,
PostgreSQL, ClickHouse through chDB) and each path, and after each run compares the whole
target table (on ClickHouse its merged view, ``FINAL``), row by row, with what the source
says it must hold: each key's latest version (highest cursor, ties by
the other columns, highest first), less keys whose latest version is deleted. The model
is written here from ``docs/incremental.md``, not from the SQL the sinks run.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
import types
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from helpers.cli import run_cli
from helpers.postgres_server import postgres_url
from helpers.routes import PATHS

TARGETS = ("sqlite", "duckdb", "postgres", "clickhouse")
EVENT_COLUMNS = ("seq", "tenant", "id", "region", "v", "status", "gone")
KEY = ("tenant", "id")
LOADED = tuple(c for c in EVENT_COLUMNS if c != "gone")  # the deleted column is not loaded


# -- the model ------------------------------------------------------------------------------


def _rank(value: Any) -> tuple[bool, Any]:
    """Highest first, NULL last: as a value in a max()."""
    return (value is not None, value)


def ordered(rows: Sequence[tuple]) -> list[tuple]:
    """Rows sorted, NULL first (comparable with any value)."""
    return sorted((tuple(row) for row in rows), key=lambda row: tuple(map(_rank, row)))


def _quoted(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def expected(
    rows: Sequence[tuple], columns: Sequence[str], key: Sequence[str], version: str | None
) -> list[tuple]:
    """Each key's winner (highest version, then the other columns in order, each highest
    first, NULL last), less deleted ones, without the deleted column; sorted."""
    at = {name: i for i, name in enumerate(columns)}
    order = ([version] if version else []) + [c for c in columns if c not in key and c != version]
    winners: dict[tuple, tuple] = {}
    for row in rows:
        k = tuple(row[at[c]] for c in key)
        best = winners.get(k)
        rank = tuple(_rank(row[at[c]]) for c in order)
        if best is None or rank > tuple(_rank(best[at[c]]) for c in order):
            winners[k] = row
    gone = at.get("gone")
    kept = [row for row in winners.values() if gone is None or not row[gone]]
    return ordered(
        [tuple(v for c, v in zip(columns, row, strict=True) if c != "gone") for row in kept]
    )


# -- the databases --------------------------------------------------------------------------


def _sqlite(path: Path) -> contextlib.closing[sqlite3.Connection]:
    return contextlib.closing(sqlite3.connect(path))


class Target:
    """One merging target of a test: where it is, how a route file names it, its rows."""

    def __init__(self, kind: str, folder: Path, schema: Any = None) -> None:
        self.kind, self.folder, self.schema = kind, folder, schema

    def section(self, table: str) -> str:
        if self.kind == "postgres":
            url = postgres_url(self.schema.dsn)
            return f'kind = "postgres"\ndsn = "{url}"\ntable = "{self.schema.schema}.{table}"'
        if self.kind == "duckdb":
            return f'kind = "duckdb"\npath = "target.duckdb"\ntable = "{table}"'
        if self.kind == "clickhouse":
            return f'kind = "clickhouse"\npath = "chdata"\ntable = "{table}"'
        return f'path = "target.db"\ntable = "{table}"'

    def query(self, sql: str) -> list[tuple]:
        if self.kind == "sqlite":
            with _sqlite(self.folder / "target.db") as db:
                return db.execute(sql).fetchall()
        if self.kind == "duckdb":
            import duckdb

            with contextlib.closing(duckdb.connect(str(self.folder / "target.duckdb"))) as db:
                return db.execute(sql).fetchall()
        if self.kind == "clickhouse":  # a session of its own, closed: a run opens the path
            from dpone_native_transfer.connectors.clickhouse import ClickHouseSink

            with ClickHouseSink(self.folder / "chdata", "events").client() as client:
                return client.query_rows(sql)
        import psycopg

        with psycopg.connect(self.schema.dsn) as db:
            db.execute(f'SET search_path = "{self.schema.schema}"')
            cursor = db.execute(sql)
            return cursor.fetchall() if cursor.description else []  # DDL: no rows

    def exists(self, table: str) -> bool:
        try:
            self.query(f'SELECT 1 FROM "{table}" LIMIT 1')
        except Exception:
            return False
        return True

    def rows(self, table: str, columns: Sequence[str]) -> list[tuple]:
        """The rows a reader sees: on ClickHouse the merged view (``FINAL``) of a merge
        route's table (a plain MergeTree one has no FINAL)."""
        names = ", ".join(_quoted(c) for c in columns)
        final = ""
        if self.kind == "clickhouse":
            engine = self.query(
                f"SELECT engine FROM system.tables WHERE name = '{table}'"
                " AND database = currentDatabase()"
            )  # not system.events
            final = " FINAL" if engine == [("ReplacingMergeTree",)] else ""
        return ordered(self.query(f"SELECT {names} FROM {_quoted(table)}{final}"))

    def ledger_rows(self) -> int:
        if not self.exists("_dpone_ledger"):
            return 0
        return self.query('SELECT count(*) FROM "_dpone_ledger"')[0][0]

    def columns(self, table: str) -> list[str]:
        if self.kind == "sqlite":
            return [r[1] for r in self.query(f"SELECT * FROM pragma_table_info('{table}')")]
        if self.kind == "duckdb":
            return [r[0] for r in self.query(f'DESCRIBE "{table}"')]
        if self.kind == "clickhouse":
            return [r[0] for r in self.query(f"SELECT name FROM system.columns WHERE table = "
                                             f"'{table}' AND database = currentDatabase()"
                                             " ORDER BY position")]  # fmt: skip
        return [
            r[0]
            for r in self.query(
                "SELECT column_name FROM information_schema.columns WHERE table_schema ="
                f" '{self.schema.schema}' AND table_name = '{table}' ORDER BY ordinal_position"
            )
        ]

    def key_columns(self, table: str) -> list[str]:
        """The table's PRIMARY KEY columns, in key order (ClickHouse: its ORDER BY)."""
        if self.kind == "clickhouse":
            found = self.query(
                f"SELECT sorting_key FROM system.tables WHERE name = '{table}'"
                " AND database = currentDatabase()"
            )
            return found[0][0].removeprefix("(").removesuffix(")").split(", ") if found else []
        if self.kind == "sqlite":
            found = self.query(f"SELECT name, pk FROM pragma_table_info('{table}') WHERE pk > 0")
            return [name for name, _ in sorted(found, key=lambda r: r[1])]
        if self.kind == "duckdb":
            found = self.query(
                "SELECT constraint_column_names FROM duckdb_constraints()"
                f" WHERE table_name = '{table}' AND constraint_type = 'PRIMARY KEY'"
            )
            return list(found[0][0]) if found else []
        found = self.query(
            "SELECT a.attname FROM pg_index i CROSS JOIN LATERAL unnest(i.indkey)"
            " WITH ORDINALITY AS k(attnum, n) JOIN pg_attribute a ON a.attrelid = i.indrelid"
            f' AND a.attnum = k.attnum WHERE i.indrelid = to_regclass(\'"{self.schema.schema}".'
            f'"{table}"\') AND i.indisprimary ORDER BY k.n'
        )
        return [r[0] for r in found]


@pytest.fixture(params=TARGETS)
def target(request, tmp_path) -> Iterator[Target]:
    if request.param == "postgres":
        location = request.getfixturevalue("postgres_schema")
        import psycopg

        with psycopg.connect(location.dsn, autocommit=True) as db:
            db.execute(f'CREATE SCHEMA "{location.schema}"')
        yield Target("postgres", tmp_path, location)
    else:
        yield Target(request.param, tmp_path)


def _toml(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    return json.dumps(value, ensure_ascii=False)


def write_route(
    folder: Path, target: Target, *, table: str, path: str, target_table: str | None = None,
    transfer: dict[str, Any] | None = None, guard: dict[str, Any] | None = None, **source: Any,
) -> Path:  # fmt: skip
    """A merge route file from ``source.db``'s ``table`` into ``target``."""
    lines = ["[source]", 'path = "source.db"', f"table = {_toml(table)}"]
    lines += [f"{k} = {_toml(v)}" for k, v in source.items() if v is not None]
    lines += ["", "[target]", target.section(target_table or table), "", "[transfer]"]
    options = {"strategy": "merge", "path": path, **(transfer or {})}
    lines += [f"{k} = {_toml(v)}" for k, v in options.items()]
    lines += ["", "[store]", 'path = "checkpoints.db"']
    if guard:
        lines += ["", "[guard]", *(f"{k} = {_toml(v)}" for k, v in guard.items())]
    file = folder / "route.toml"
    file.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return file


def events_route(folder: Path, target: Target, path: str, **extra: Any) -> Path:
    """The events table's merge route (``write_route``): partitioned by region, cursor ``v``,
    keyed on ``KEY``, rows whose ``gone`` is true deleted."""
    return write_route(
        folder, target, table="events", path=path, partition_column="region",
        cursor_column="v", primary_key=list(KEY), deleted_column="gone", **extra,
    )  # fmt: skip


def run(route: Path, *args: str) -> subprocess.CompletedProcess:
    return run_cli("run", route, "--quiet", *args)


def _resolve(route: Path, batch_id: str, outcome: str, reason: str) -> None:
    """``guard resolve`` of the batch as an operator would, after comparing by hand."""
    resolved = run_cli(
        "guard", "resolve", route, "--batch", batch_id, "--as", outcome,
        "--reason", reason, "--operator", "me", "--yes",
    )  # fmt: skip
    assert resolved.returncode == 0, resolved.stderr


# -- an event log with a composite key, a cursor, deletes and late rows ---------------------


def make_events(folder: Path) -> Path:
    path = folder / "source.db"
    with _sqlite(path) as db:
        db.execute(
            "CREATE TABLE events (seq INTEGER PRIMARY KEY, tenant TEXT, id INTEGER,"
            " region TEXT, v INTEGER, status TEXT, gone BOOLEAN)"
        )
        db.commit()
    return path


def add(path: Path, *rows: tuple) -> None:
    with _sqlite(path) as db:
        start = db.execute("SELECT coalesce(max(seq), 0) FROM events").fetchone()[0]
        db.executemany(
            "INSERT INTO events VALUES (?, ?, ?, ?, ?, ?, ?)",
            [(start + i + 1, *row) for i, row in enumerate(rows)],
        )
        db.commit()


def source_rows(path: Path, table: str = "events") -> list[tuple]:
    with _sqlite(path) as db:
        return db.execute(f'SELECT * FROM "{table}"').fetchall()


def check_target(target: Target, source: Path) -> None:
    want = expected(source_rows(source), EVENT_COLUMNS, KEY, "v")
    assert target.rows("events", LOADED) == want


@pytest.mark.parametrize("path", PATHS)
def test_merge_applies_updates_deletes_and_late_rows_on_every_target_and_path(
    tmp_path, target, path
):
    source = make_events(tmp_path)
    route = events_route(tmp_path, target, path, lag=2)
    # run 1: inserts; one key twice in one batch; a tie in the cursor (the later seq wins);
    # keys that differ only in case, and a unicode key
    add(
        source,
        ("acme", 1, "eu", 1, "new", False),
        ("acme", 1, "eu", 2, "paid", False),
        ("ACME", 1, "us", 1, "x", False),
        ("Ünï 'q\"", 2, "eu", 3, "new", False),
        ("acme", 2, "us", 3, "a", False),
        ("acme", 2, "us", 3, "b", False),
        ("acme", 3, "eu", 3, "new", False),
    )
    assert run(route).returncode == 0
    check_target(target, source)
    assert target.rows("events", ("tenant", "id", "status")) == [
        ("ACME", 1, "x"), ("acme", 1, "paid"), ("acme", 2, "b"), ("acme", 3, "new"),
        ("Ünï 'q\"", 2, "new"),
    ]  # fmt: skip
    assert "gone" not in target.columns("events")
    assert target.key_columns("events") == list(KEY)
    # run 2: a key moves to another partition; a delete; a late row older than the target's
    # (within the lag: read, and left out by the monotonic rule); a new key
    add(
        source,
        ("acme", 1, "us", 4, "shipped", False),
        ("Ünï 'q\"", 2, "eu", 5, "cancelled", True),
        ("acme", 3, "eu", 2, "stale", False),
        ("acme", 4, "asia", 5, "new", False),
    )
    assert run(route).returncode == 0
    check_target(target, source)
    assert ("acme", 3, "new") in target.rows("events", ("tenant", "id", "status"))
    # run 3: the deleted key comes back; a tie with the last batch at the watermark (the
    # later batch wins); a delete of a key only the run deletes; a late new key in the lag
    add(
        source,
        ("Ünï 'q\"", 2, "us", 6, "back", False),
        ("acme", 4, "asia", 5, "again", False),
        ("ACME", 1, "us", 6, "gone", True),
        ("acme", 5, "eu", 4, "late", False),
    )
    assert run(route).returncode == 0
    check_target(target, source)
    statuses = dict(((t, i), s) for t, i, s in target.rows("events", ("tenant", "id", "status")))
    assert statuses[("Ünï 'q\"", 2)] == "back" and statuses[("acme", 4)] == "again"
    assert ("ACME", 1) not in statuses and statuses[("acme", 5)] == "late"
    # a run that finds nothing new changes nothing
    before = target.rows("events", LOADED)
    assert run(route).returncode == 0
    assert target.rows("events", LOADED) == before


@pytest.mark.parametrize("path", ["legacy", "staged"])
def test_a_row_edited_and_edited_back_at_the_watermark_is_merged_each_time(tmp_path, target, path):
    """Rows at the watermark are read again by each run; a merge route skips those the
    target holds as they are now, and only those: a row edited and then edited back without
    its cursor moving, and a delete undone, each replace what the target holds. The edge
    record kept every version ever loaded, so the edit back was skipped as loaded (exit 0,
    the edited version kept for good)."""
    source = make_events(tmp_path)
    route = events_route(tmp_path, target, path)
    add(source, ("acme", 1, "eu", 5, "a", False), ("acme", 2, "eu", 5, "b", False))

    def edit(status: str, gone: bool) -> None:
        with _sqlite(source) as db:
            db.execute("UPDATE events SET status = ? WHERE id = 1", (status,))
            db.execute("UPDATE events SET gone = ? WHERE id = 2", (gone,))
            db.commit()

    for status, gone in (("a", False), ("a2", True), ("a2", True), ("a", False), ("a", False)):
        edit(status, gone)
        assert run(route).returncode == 0
        check_target(target, source)
    assert target.rows("events", ("id", "status")) == [(1, "a"), (2, "b")]


def test_a_key_deleted_after_a_tie_across_partitions_stays_deleted(tmp_path, target):
    """Two versions of a key at one cursor value, in two partitions and loaded by two runs,
    then a delete: every later run must leave the key deleted. The edge record dropped the
    first version when the second was loaded, so each later run loaded one of them again:
    the key came back, and flipped between its versions with the source unchanged (exit 0,
    found by a hostile check)."""
    source = make_events(tmp_path)
    route = events_route(tmp_path, target, "legacy", lag=10)
    for row in (
        ("acme", 1, "eu", 5, "a", False),
        ("acme", 1, "us", 5, "b", False),  # a tie at the watermark, another partition
        ("acme", 1, "asia", 7, "c", True),
        None,  # nothing new: twice
        None,
    ):
        if row is not None:
            add(source, row, ("acme", 2, "eu", 7, "kept", False))
        assert run(route).returncode == 0
        check_target(target, source)
    assert target.rows("events", ("tenant", "id", "status")) == [("acme", 2, "kept")]


def test_a_mutable_table_merges_on_its_own_primary_key_with_range_partitions(tmp_path, target):
    """No primary_key named: the source table's own; partitions by key range; the cursor
    windows as an append's; schema evolution adds a new source column."""
    source = tmp_path / "source.db"
    with _sqlite(source) as db:
        db.execute("CREATE TABLE orders (id INTEGER PRIMARY KEY, v INTEGER, status TEXT)")
        db.executemany("INSERT INTO orders VALUES (?, ?, ?)", [(i, 1, "new") for i in range(1, 51)])
        db.commit()
    route = write_route(
        tmp_path, target, table="orders", path="legacy", partition_by="range",
        partition_rows=7, cursor_column="v",
    )  # fmt: skip
    assert run(route).returncode == 0
    assert target.rows("orders", ("id", "v", "status")) == ordered(source_rows(source, "orders"))
    assert target.key_columns("orders") == ["id"]
    with _sqlite(source) as db:
        db.execute("UPDATE orders SET v = 2, status = 'paid' WHERE id % 5 = 0")
        db.execute("INSERT INTO orders VALUES (51, 2, 'new')")
        db.execute("ALTER TABLE orders ADD COLUMN note TEXT")
        db.execute("UPDATE orders SET note = 'n', v = 3 WHERE id = 7")
        db.commit()
    assert run(route).returncode == 0
    want = ordered(source_rows(source, "orders"))
    assert target.rows("orders", ("id", "v", "status", "note")) == want
    assert len(want) == 51


@pytest.mark.parametrize("path", PATHS)
def test_without_a_cursor_each_run_merges_the_whole_table_and_the_source_row_wins(
    tmp_path, target, path
):
    """Duplicate keys in the source and no cursor: the other columns pick one row per key;
    a later run's row replaces the target's whatever it holds; keys gone from the source
    stay."""
    source = tmp_path / "source.db"
    with _sqlite(source) as db:
        db.execute("CREATE TABLE log (code TEXT, region TEXT, status TEXT)")
        db.executemany(
            "INSERT INTO log VALUES (?, ?, ?)",
            [("a", "eu", "x"), ("a", "eu", "y"), ("A", "us", None), ("b", "us", "z"),
             ("b", "eu", "z"), ("c", None, None), ("c", None, "w")],
        )  # fmt: skip
        db.commit()
    route = write_route(
        tmp_path, target, table="log", path=path, partition_column="region", primary_key="code"
    )
    assert run(route).returncode == 0
    columns = ("code", "region", "status")
    assert target.rows("log", columns) == expected(
        source_rows(source, "log"), columns, ["code"], None
    )
    assert target.rows("log", columns) == ordered(
        [("A", "us", None), ("a", "eu", "y"), ("b", "us", "z"), ("c", None, "w")]
    )
    with _sqlite(source) as db:
        db.execute("DELETE FROM log WHERE code = 'b'")  # missing from the source: left alone
        db.execute("UPDATE log SET status = 'older' WHERE code = 'a' AND status = 'y'")
        db.commit()
    assert run(route).returncode == 0
    assert ("b", "us", "z") in target.rows("log", columns)
    assert ("a", "eu", "x") in target.rows("log", columns)  # 'x' > 'older': the winner now
    assert len(target.rows("log", columns)) == 4


# -- refusals, before the target --------------------------------------------------------------


@pytest.mark.parametrize("path", PATHS)
def test_a_null_key_is_refused_before_the_target(tmp_path, target, path):
    source = make_events(tmp_path)
    route = events_route(tmp_path, target, path)
    add(source, ("acme", 1, "eu", 1, "new", False))
    assert run(route).returncode == 0
    before, ledger = target.rows("events", LOADED), target.ledger_rows()
    add(source, ("acme", 2, "eu", 2, "new", False), ("secret-tenant", None, "eu", 2, "x", False))
    done = run(route)
    assert done.returncode == 2, done.stderr
    assert "native_transfer_value_unsupported" in done.stderr and "'id'" in done.stderr
    assert "secret-tenant" not in done.stdout + done.stderr
    assert target.rows("events", LOADED) == before and target.ledger_rows() == ledger
    with _sqlite(source) as db:  # fixed in the source: the next run loads the window
        db.execute("UPDATE events SET id = 9 WHERE id IS NULL")
        db.commit()
    assert run(route).returncode == 0
    check_target(target, source)


@pytest.mark.parametrize("path", ["legacy", "staged"])
def test_a_deleted_column_holds_a_boolean_or_an_integer_on_every_target(tmp_path, target, path):
    """A SQLite column declared BOOLEAN may hold text or a fraction: SQLite's cast read
    ``'true'`` as 0 (the key kept, exit 0) where the other targets refused it, so it is
    refused on every target before the target. An integer beyond 32 bits deletes its key
    everywhere (DuckDB and PostgreSQL overflowed inside the target call and blocked)."""
    with _sqlite(tmp_path / "source.db") as db:
        db.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, r TEXT, v INTEGER, gone BOOLEAN)")
        db.executemany(
            "INSERT INTO t VALUES (?, 'eu', 1, ?)",
            [(1, 2**31), (2, 2**63 - 1), (3, -(2**63)), (4, 0), (5, None), (6, True), (7, 1)],
        )
        db.commit()
    route = write_route(tmp_path, target, table="t", path=path, partition_column="r",
                        cursor_column="v", deleted_column="gone")  # fmt: skip
    assert run(route).returncode == 0
    assert target.rows("t", ("id", "v")) == [(4, 1), (5, 1)]
    ledger = target.ledger_rows()
    for odd in ("true", "false", 0.5):
        with _sqlite(tmp_path / "source.db") as db:
            db.execute("INSERT INTO t VALUES (8, 'eu', 2, ?)", (odd,))
            db.commit()
        done = run(route)
        assert done.returncode == 2, done.stderr
        assert "native_transfer_value_unsupported" in done.stderr and "'gone'" in done.stderr
        assert target.rows("t", ("id", "v")) == [(4, 1), (5, 1)]
        assert target.ledger_rows() == ledger
        with _sqlite(tmp_path / "source.db") as db:
            db.execute("DELETE FROM t WHERE id = 8")
            db.commit()


@pytest.mark.parametrize("on_bad_value", ["refuse", "quarantine"])
@pytest.mark.parametrize("path", PATHS)
def test_a_deleted_rows_other_values_never_stop_its_delete(tmp_path, target, path, on_bad_value):
    """A delete writes none of the row's other values, but they were checked as a live row's:
    a text in a REAL column stopped the route (exit 2), or with quarantine set the delete
    aside, and the key the source deleted stayed in the target (exit 0)."""
    with _sqlite(tmp_path / "source.db") as db:
        db.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, r TEXT, v INTEGER, amount REAL,"
                   " gone BOOLEAN)")  # fmt: skip
        db.executemany("INSERT INTO t VALUES (?, 'eu', 1, ?, 0)", [(1, 1.5), (2, 2.5), (3, 3.5)])
        db.commit()
    route = write_route(tmp_path, target, table="t", path=path, partition_column="r",
                        cursor_column="v", deleted_column="gone",
                        transfer={"on_bad_value": on_bad_value})  # fmt: skip
    assert run(route).returncode == 0
    with _sqlite(tmp_path / "source.db") as db:
        db.execute("UPDATE t SET v = 2, gone = 1, amount = 'n/a' WHERE id = 2")
        db.commit()
    done = run(route)
    assert done.returncode == 0, done.stderr
    assert "set aside" not in done.stdout
    assert target.rows("t", ("id", "amount")) == [(1, 1.5), (3, 3.5)]


@pytest.mark.parametrize("path", ["legacy", "lazy-plan"])
def test_odd_key_values_reserved_names_and_null_cursors_merge(tmp_path, target, path):
    """Keys that differ only by case or a trailing space, the empty text, emoji and control
    characters, the extreme 64-bit integers, -0.0 and 0.0 (one key), in columns named like
    reserved words; NULL cursors loaded once (the lowest version) and cursor ties."""
    columns = ("order", "select", "group", "from", "gone", "s")
    key = ["order", "select", "group"]
    with _sqlite(tmp_path / "source.db") as db:
        db.execute(
            'CREATE TABLE "table" ("order" TEXT, "select" INTEGER, "group" REAL, "from" INTEGER,'
            " gone BOOLEAN, s TEXT)"
        )
        db.commit()

    def load(*rows: tuple) -> None:
        with _sqlite(tmp_path / "source.db") as db:
            db.executemany('INSERT INTO "table" VALUES (?, ?, ?, ?, ?, ?)', rows)
            db.commit()
        done = run(route)
        assert done.returncode == 0, done.stderr
        want = expected(source_rows(tmp_path / "source.db", "table"), columns, key, "from")
        assert target.rows("table", [c for c in columns if c != "gone"]) == want

    route = write_route(
        tmp_path, target, table="table", path=path, partition_column="s", cursor_column="from",
        primary_key=key, deleted_column="gone", on_null_cursor="load_once",
    )  # fmt: skip
    big, small = 2**63 - 1, -(2**63)
    load(
        ("", big, 0.0, 1, 0, "a"), ("", big, -0.0, 2, 0, "b"),
        ("a", small, 1.5, None, 0, "c"), ("a", small, 1.5, None, 0, "d"),
        ("a ", small, 1.5, 1, 0, "e"), ("A", small, 1.5, 1, 0, "f"),
        ("\U0001f600\t\n", 0, 1e308, 3, 0, "g"), ("\U0001f600\t\n", 0, 1e308, 3, 0, "h"),
        ("x", 1, 2.0, None, 0, "i"), ("x", 1, 2.0, 3, 1, "j"),
    )  # fmt: skip
    load(
        ("", big, 0.0, 3, 0, "k"), ("a", small, 1.5, None, 1, "l"), ("a ", small, 1.5, 4, 1, "m"),
        ("x", 1, 2.0, 4, 0, "n"), ("A", small, 1.5, 3, 0, "o"),
    )  # fmt: skip


def test_a_changed_primary_key_is_a_changed_route_definition(tmp_path):
    target = Target("sqlite", tmp_path)
    source = make_events(tmp_path)
    add(source, ("acme", 1, "eu", 1, "new", False))
    options = dict(partition_column="region", cursor_column="v", deleted_column="gone")
    route = write_route(
        tmp_path, target, table="events", path="legacy", primary_key=["id"], **options
    )
    assert run(route).returncode == 0
    route = write_route(
        tmp_path, target, table="events", path="legacy", primary_key=list(KEY), **options
    )
    done = run(route)
    assert done.returncode == 2
    assert "native_transfer_route_changed" in done.stderr and "primary_key" in done.stderr
    route = write_route(tmp_path, target, table="events", path="legacy", primary_key=["id"],
                        partition_column="region", cursor_column="v")  # fmt: skip
    done = run(route)
    assert done.returncode == 2 and "deleted_column" in done.stderr
    route = write_route(
        tmp_path, target, table="events", path="legacy", primary_key=list(KEY), **options
    )
    reset = run_cli("state", "reset", route, "--yes", "--reason", "new key", "--operator", "me")
    assert reset.returncode == 0, reset.stderr
    add(source, ("beta", 1, "eu", 2, "new", False))  # the old key (id) would be violated
    done = run(route)  # the table's PRIMARY KEY (id) is narrower than the new key
    assert done.returncode == 2 and "part of the merge's key" in done.stderr
    with _sqlite(tmp_path / "target.db") as db:  # the operator drops the table
        db.execute("DROP TABLE events")
        db.commit()
    assert run(route).returncode == 0
    check_target(target, source)
    assert target.key_columns("events") == list(KEY)


def test_a_source_without_a_primary_key_needs_one_named(tmp_path):
    target = Target("sqlite", tmp_path)
    with _sqlite(tmp_path / "source.db") as db:
        db.execute("CREATE TABLE log (code TEXT, region TEXT)")
        db.execute("INSERT INTO log VALUES ('a', 'eu')")
        db.commit()
    route = write_route(tmp_path, target, table="log", path="legacy", partition_column="region")
    done = run(route)
    assert done.returncode == 2
    assert "native_transfer_config_invalid" in done.stderr and "source.primary_key" in done.stderr
    assert not (tmp_path / "target.db").exists() or not target.exists("log")


@pytest.mark.parametrize("path", ["legacy", "lazy-plan"])
def test_a_timestamp_key_written_two_ways_is_refused_and_one_way_merges(tmp_path, target, path):
    """``10:00:00``, ``T10:00:00`` and ``10:00:00.000``: three keys to SQLite, one instant to
    a target that holds instants; the merge kept one row of three (exit 0). Refused before
    the target; keys of one instant each merge, Python's spellings (a fraction or none) too."""
    with _sqlite(tmp_path / "source.db") as db:
        db.execute("CREATE TABLE t (k TIMESTAMP PRIMARY KEY, p TEXT, v INTEGER, val TEXT)")
        db.executemany(
            "INSERT INTO t VALUES (?, 'x', ?, ?)",
            [("2024-01-01 10:00:00", 1, "a"), ("2024-01-01 10:00:00.500000", 2, "b")],
        )
        db.commit()
    route = write_route(
        tmp_path, target, table="t", path=path, partition_column="p", cursor_column="v",
        primary_key=["k"],
    )  # fmt: skip
    assert run(route).returncode == 0
    assert len(target.rows("t", ["k", "val"])) == 2
    with _sqlite(tmp_path / "source.db") as db:
        db.execute("INSERT INTO t VALUES ('2024-01-01T10:00:00', 'x', 3, 'c')")
        db.commit()
    done = run(route)
    assert done.returncode == 2 and "in more than one spelling" in done.stderr
    assert "source.primary_key" in done.stderr and "10:00" not in done.stderr
    assert sorted(row[1] for row in target.rows("t", ["k", "val"])) == ["a", "b"]


@pytest.mark.parametrize("when", ["AFTER INSERT", "BEFORE UPDATE"])
def test_a_postgresql_table_with_a_row_trigger_is_refused_a_merge(tmp_path, postgres_schema, when):
    """An AFTER INSERT trigger deleting half the rows a merge wrote ended 0, the ledger
    counting the batch as applied (an append counts the table and rolls back); a BEFORE
    UPDATE one rewrote the values. Refused before the target call, the table unchanged."""
    import psycopg

    with psycopg.connect(postgres_schema.dsn, autocommit=True) as db:
        db.execute(f'CREATE SCHEMA "{postgres_schema.schema}"')
    target = Target("postgres", tmp_path, postgres_schema)
    source = make_events(tmp_path)
    route = events_route(tmp_path, target, "legacy")
    add(source, ("acme", 1, "eu", 1, "new", False), ("acme", 2, "eu", 1, "new", False))
    assert run(route).returncode == 0
    schema = f'"{postgres_schema.schema}"'
    with psycopg.connect(postgres_schema.dsn, autocommit=True) as db:
        db.execute(
            f"CREATE FUNCTION {schema}.drop_rows() RETURNS trigger LANGUAGE plpgsql AS"
            f" $$ BEGIN DELETE FROM {schema}.events WHERE id = 2; RETURN NEW; END $$"
        )
        db.execute(
            f"CREATE TRIGGER t {when} ON {schema}.events FOR EACH ROW"
            f" EXECUTE FUNCTION {schema}.drop_rows()"
        )
    before = target.rows("events", LOADED)
    add(source, ("acme", 2, "eu", 2, "paid", False), ("acme", 3, "eu", 2, "new", False))
    done = run(route)
    assert done.returncode == 2 and "a trigger on inserts, updates or deletes" in done.stderr
    assert target.rows("events", LOADED) == before


def test_merge_is_refused_where_it_cannot_run(tmp_path):
    """A batch column cannot count a merge's batches; the merge options belong to merge
    routes."""
    source = make_events(tmp_path)
    add(source, ("acme", 1, "eu", 1, "new", False))
    options = dict(partition_column="region", cursor_column="v", primary_key=list(KEY))
    sqlite_target = Target("sqlite", tmp_path)
    route = write_route(tmp_path, sqlite_target, table="events", path="legacy", **options)
    text = route.read_text().replace("\n\n[transfer]", '\nbatch_column = "b"\n\n[transfer]')
    route.write_text(text)
    done = run(route)
    assert done.returncode == 2 and "target.batch_column" in done.stderr
    route = write_route(tmp_path, sqlite_target, table="events", path="legacy",
                        transfer={"strategy": "incremental_append"}, **options)  # fmt: skip
    done = run(route)
    assert done.returncode == 2 and "source.primary_key" in done.stderr
    assert not (tmp_path / "target.db").exists()


@pytest.mark.parametrize("deleted", ["nope", "GONE"])
def test_a_deleted_column_the_source_lacks_is_named_as_missing(tmp_path, deleted):
    """Names match exactly, as the key's do: a deleted column the source lacks (or spelled in
    another case) is said to be missing, not of the wrong kind."""
    make_events(tmp_path)
    route = write_route(
        tmp_path, Target("sqlite", tmp_path), table="events", path="legacy",
        partition_column="region", cursor_column="v", primary_key=list(KEY),
        deleted_column=deleted,
    )  # fmt: skip
    done = run(route)
    assert done.returncode == 2 and "native_transfer_config_invalid" in done.stderr
    assert f"source.deleted_column names no column of the source: {deleted!r}" in done.stderr


def test_odd_key_column_names_merge(tmp_path, target):
    """Quotes, spaces, a percent sign and unicode in the key's and cursor's names."""
    with _sqlite(tmp_path / "source.db") as db:
        db.execute(
            'CREATE TABLE "we ird" ("k ""1""" TEXT, "ключ%s" INTEGER, "ver sion" INTEGER, r TEXT)'
        )
        db.executemany(
            'INSERT INTO "we ird" VALUES (?, ?, ?, ?)',
            [("a", 1, 1, "x"), ("a", 1, 2, "y"), ("b", 1, 1, "z")],
        )
        db.commit()
    route = write_route(
        tmp_path, target, table="we ird", path="staged", partition_column="r",
        cursor_column="ver sion", primary_key=['k "1"', "ключ%s"],
    )  # fmt: skip
    assert run(route).returncode == 0
    assert target.rows("we ird", ('k "1"', "ключ%s", "ver sion")) == [("a", 1, 2), ("b", 1, 1)]


@pytest.mark.parametrize("path", ["legacy", "staged"])
def test_ties_go_to_the_same_row_in_a_postgresql_database_collated_otherwise(
    tmp_path, postgres_dsn, path
):
    """A tie in the cursor is broken by the other columns in byte order on every target:
    in a PostgreSQL database collated ICU ``en-US`` the tie-breaking text columns ranked
    ``'B'`` above ``'a'`` and ``'f'`` above ``'é'`` (only the cursor was ordered by bytes),
    another winner than SQLite, DuckDB and ClickHouse gave (exit 0)."""
    import psycopg

    name = f"icu_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(postgres_dsn, autocommit=True) as admin:
        admin.execute(
            f"CREATE DATABASE {name} TEMPLATE template0 LOCALE_PROVIDER icu"
            " ICU_LOCALE 'en-US' LOCALE 'C'"
        )
    try:
        dsn = psycopg.conninfo.make_conninfo(postgres_dsn, dbname=name)
        source = tmp_path / "source.db"
        with _sqlite(source) as db:
            db.execute("CREATE TABLE ties (id INTEGER, region TEXT, v INTEGER, status TEXT)")
            db.executemany(
                "INSERT INTO ties VALUES (?, 'eu', 5, ?)",
                [(1, "a"), (1, "B"), (2, "\u00e9"), (2, "f")],
            )
            db.commit()
        icu = Target("postgres", tmp_path, types.SimpleNamespace(dsn=dsn, schema="public"))
        route = write_route(
            tmp_path, icu, table="ties", path=path, partition_column="region",
            cursor_column="v", primary_key=["id"],
        )  # fmt: skip
        assert run(route).returncode == 0
        found = icu.rows("ties", ("id", "status"))
        want = expected(source_rows(source, "ties"), ("id", "region", "v", "status"), ("id",), "v")
        assert found == [(1, "a"), (2, "\u00e9")] == [(row[0], row[3]) for row in want]
    finally:
        with psycopg.connect(postgres_dsn, autocommit=True) as admin:
            admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


def test_a_source_column_named_like_the_merges_rank_merges(tmp_path, target):
    """The winners' ranking names its ROW_NUMBER column ``_dpone_merge_rank``: a source
    column of that name was read as the rank instead, so SQLite and DuckDB kept only the rows
    holding 1 there (exit 0, rows lost) and PostgreSQL failed inside the target call.
    ClickHouse refuses the names it keeps (``_dpone_...``) before the target."""
    with _sqlite(tmp_path / "source.db") as db:
        db.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, r TEXT, v INT, _dpone_merge_rank INT)")
        db.executemany("INSERT INTO t VALUES (?, 'eu', 1, ?)", [(1, 5), (2, 1), (3, None)])
        db.commit()
    route = write_route(
        tmp_path, target, table="t", path="staged", partition_column="r", cursor_column="v"
    )
    done = run(route)
    columns = ("id", "v", "_dpone_merge_rank")
    if target.kind == "clickhouse":
        assert done.returncode == 2 and "native_transfer_config_invalid" in done.stderr
        return
    assert done.returncode == 0, done.stderr
    assert target.rows("t", columns) == ordered([(1, 1, 5), (2, 1, 1), (3, 1, None)])
    with _sqlite(tmp_path / "source.db") as db:
        db.execute("UPDATE t SET v = 2, _dpone_merge_rank = 7 WHERE id < 3")
        db.commit()
    assert run(route).returncode == 0
    assert target.rows("t", columns) == ordered([(1, 2, 7), (2, 2, 7), (3, 1, None)])


# -- a crash inside the target call -----------------------------------------------------------

_SINK_MODULES = {
    "sqlite": "dpone_native_transfer.connectors.sqlite.sink:SQLiteSink",
    "duckdb": "dpone_native_transfer.connectors.duckdb.sink:DuckDBSink",
    "postgres": "dpone_native_transfer.connectors.postgres_sink:PostgresSink",
    "clickhouse": "dpone_native_transfer.connectors.clickhouse.sink:ClickHouseSink",
}
# A child that runs the route and SIGKILLs itself inside the target call: after the merge's
# statements, before the commit (its ledger row not written), or after the commit. ClickHouse
# has no transaction: "before-commit" is after its one INSERT, before the ledger row; and
# "before-insert" before that INSERT (the batch's rows in their own table only).
_CHILD = """
import importlib, os, signal, sys
from dpone_native_transfer import cli
module_name, class_name = sys.argv[1].split(":")
module = importlib.import_module(module_name)
point = sys.argv[2]
if point == "before-insert":
    def merge_insert_sql(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGKILL)
    module.merge_insert_sql = merge_insert_sql
elif point == "before-commit":
    real = module._record
    def _record(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGKILL)
    module._record = _record
else:
    sink = getattr(module, class_name)
    for name in ("load", "finalize_staged_load"):
        real = getattr(sink, name)
        def call(self, *args, _real=real, **kwargs):
            _real(self, *args, **kwargs)
            os.kill(os.getpid(), signal.SIGKILL)
        setattr(sink, name, call)
sys.exit(cli.main(["run", sys.argv[3], "--quiet"]))
"""


@pytest.mark.parametrize("point", ["before-commit", "after-commit"])
@pytest.mark.parametrize("path", ["legacy", "staged"])
def test_a_kill_inside_the_target_call_blocks_and_recovery_from_the_target_is_exact(
    tmp_path, target, path, point
):
    """Blocked, then healed by what the target proves: its ledger row, or on ClickHouse the
    batch's rows counted by their batch column (``_dpone_batch``), the merged view exact."""
    _kill_inside_the_target_call(tmp_path, target, path, point)


@pytest.mark.parametrize("path", ["legacy", "staged"])
def test_a_kill_before_the_clickhouse_merge_insert_is_proven_not_applied(tmp_path, path):
    """ClickHouse has no transaction: a kill before its one ``INSERT ... SELECT`` leaves the
    batch table but nothing in the target, which its batch column proves."""
    _kill_inside_the_target_call(tmp_path, Target("clickhouse", tmp_path), path, "before-insert")


# A child whose merge INSERT into ClickHouse writes blocks of 500 rows, each a part committed
# as it is written, and a watcher process that SIGKILLs it once the first of them is there.
_MID_INSERT_CHILD = """
import subprocess, sys
from dpone_native_transfer import cli
from dpone_native_transfer.connectors.clickhouse import sink
real = sink.merge_insert_sql
def merge_insert_sql(*args, settings, **kwargs):
    small = ", max_block_size = 500, max_insert_block_size = 500"
    small += ", min_insert_block_size_rows = 500, min_insert_block_size_bytes = 0"
    watcher = subprocess.Popen([sys.executable, "-c", sys.argv[2], sys.argv[1]],
                               stdout=subprocess.PIPE, text=True)
    assert watcher.stdout.readline() == "watching\\n"
    return real(*args, settings=settings + small, **kwargs)
sink.merge_insert_sql = merge_insert_sql
sys.exit(cli.main(["run", sys.argv[3], "--quiet"]))
"""
_PART_WATCHER = """
import os, signal, sys, time
from pathlib import Path
def parts():
    while True:  # a folder the server removes while it is walked: walk again
        try:
            return {p for p in Path(sys.argv[1]).rglob("all_*") if p.is_dir()}
        except FileNotFoundError:
            pass
before, parent = parts(), os.getppid()
print("watching", flush=True)
deadline = time.monotonic() + 120
while time.monotonic() < deadline and not parts() - before:
    time.sleep(0.001)
os.kill(parent, signal.SIGKILL)
"""


def test_a_kill_inside_the_clickhouse_merge_insert_is_partial_and_merging_again_heals_it(
    tmp_path,
):
    """ClickHouse commits an ``INSERT ... SELECT``'s parts one by one: killed between two, the
    merged view shows some keys of the batch at their new version. The batch column proves a
    partial insert (``unknown``: no automatic recovery); a merge needs no repair (the next
    batch's versions are higher, and a key's latest version is what it merges again), so
    resolving the batch as ``failed_before_target`` and running again gives every key its
    latest version, no key twice."""
    target = Target("clickhouse", tmp_path)
    path = tmp_path / "source.db"
    keys = 20_000
    with _sqlite(path) as db:
        db.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, r TEXT, v INTEGER, s TEXT)")
        db.executemany("INSERT INTO t VALUES (?, 'eu', 1, 'old')", [(i,) for i in range(keys)])
        db.commit()
    route = write_route(
        tmp_path, target, table="t", path="legacy", partition_column="r", cursor_column="v"
    )
    assert run(route).returncode == 0
    with _sqlite(path) as db:
        db.execute("UPDATE t SET v = 2, s = 'new' WHERE id % 2 = 0")
        db.execute("UPDATE t SET v = 3, s = 'newer' WHERE id % 2 = 1")
        db.commit()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    child = subprocess.run(
        [sys.executable, "-c", _MID_INSERT_CHILD, str(tmp_path / "chdata"), _PART_WATCHER,
         str(route)],
        env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert child.returncode == -signal.SIGKILL, child.stderr
    columns = ("id", "v", "s")
    merged = target.rows("t", columns)
    assert len(merged) == keys  # every key once in the merged view
    moved = sum(1 for _, v, _ in merged if v > 1)
    assert 0 < moved < keys, f"{moved} keys of {keys} moved: the kill was not inside the insert"
    blocked = run(route, "--recovery", "from_target")
    assert blocked.returncode == 3, blocked.stderr  # a partial insert proves nothing
    verified = run_cli("guard", "verify", route, "--json")
    [proof] = [json.loads(line) for line in verified.stdout.splitlines()]
    assert proof["proof"]["verdict"] == "unknown", verified.stdout
    assert "partial insert" in proof["proof"]["reason"], verified.stdout
    _resolve(route, proof["batch_id"], "failed_before_target", "a merge needs no repair")
    healed = run(route)
    assert healed.returncode == 0, healed.stderr
    assert target.rows("t", columns) == ordered(
        [(i, 2, "new") if i % 2 == 0 else (i, 3, "newer") for i in range(keys)]
    )
    assert run(route).returncode == 0 and target.rows("t", columns)[-1] == (keys - 1, 3, "newer")


@pytest.mark.parametrize("path", ["legacy", "staged"])
def test_a_clickhouse_batch_the_ledger_lacks_resolved_committed_by_hand_lets_the_route_go_on(
    tmp_path, path
):
    """Killed after the merge's INSERT and before its ledger row: the batch column proves it
    applied, and an operator who resolves it ``--as committed`` (the runbook's manual way) is
    right. The next run must go on, not refuse the store as ahead of the ledger (it did:
    only ``--from-target`` recorded the batch against the ledger)."""
    target = Target("clickhouse", tmp_path)
    _kill_inside_the_target_call(tmp_path, target, path, "before-commit", by_hand=True)


def _kill_inside_the_target_call(
    tmp_path: Path, target: Target, path: str, point: str, *, by_hand: bool = False
) -> None:
    source = make_events(tmp_path)
    route = events_route(tmp_path, target, path)
    add(source, ("acme", 1, "eu", 1, "new", False), ("acme", 2, "us", 1, "new", False))
    assert run(route).returncode == 0
    add(
        source,
        ("acme", 1, "eu", 2, "paid", False),
        ("acme", 2, "us", 2, "x", True),
        ("acme", 3, "us", 2, "new", False),
    )
    before = target.rows("events", LOADED)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    child = subprocess.run(
        [sys.executable, "-c", _CHILD, _SINK_MODULES[target.kind], point, str(route)],
        env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert child.returncode == -signal.SIGKILL, child.stderr
    after = target.rows("events", LOADED)
    applied = point == "after-commit" or (point, target.kind) == ("before-commit", "clickhouse")
    assert after == (expected(source_rows(source), EVENT_COLUMNS, KEY, "v") if applied else before)
    blocked = run(route)
    assert blocked.returncode == 3, blocked.stderr  # the outcome is unknown to the store
    assert target.rows("events", LOADED) == after
    if target.kind == "clickhouse":  # the batch column proves it: applied, or none of it
        verified = run_cli("guard", "verify", route, "--json")
        proofs = [json.loads(line) for line in verified.stdout.splitlines()]
        assert [p["proof"]["verdict"] for p in proofs] == [
            "applied" if applied else "not_applied"
        ], verified.stdout
    if by_hand:  # what the operator found, recorded with --as, then a plain run
        [proof] = [json.loads(line) for line in verified.stdout.splitlines()]
        _resolve(route, proof["batch_id"], "committed", "counted the merged view")
        healed = run(route)
    else:
        healed = run(route, "--recovery", "from_target")
    assert healed.returncode == 0, healed.stderr
    check_target(target, source)
    batches = target.query('SELECT batch_id FROM "_dpone_ledger"')
    # ClickHouse killed before its ledger row: the rows prove the batch, the row stays missing
    unlisted = (point, target.kind) == ("before-commit", "clickhouse")
    assert len(batches) == len({b for (b,) in batches}) == (1 if unlisted else 2)


def _churn(source: Path, rng: Any, rows: int) -> None:
    """``rows`` new events: updates, deletes, new keys, and late rows within a lag of 2 (of
    keys never deleted: a late row older than a delete inserts its key again, as documented)."""
    with _sqlite(source) as db:
        top = db.execute("SELECT coalesce(max(v), 0) FROM events").fetchone()[0]
        dead = set(db.execute("SELECT tenant, id FROM events WHERE gone").fetchall())
    new = []
    for _ in range(rows):
        key = (f"t{rng.randrange(3)}", rng.randrange(300))
        late = rng.random() < 0.1 and key not in dead
        v = top - rng.randrange(3) if late else top + 1 + rng.randrange(3)
        new.append((*key, rng.choice(["eu", "us", "asia"]), v, rng.choice("ab\u00dc"),
                    rng.random() < 0.15))  # fmt: skip
    add(source, *new)


@pytest.mark.parametrize("path", ["staged", "lazy-plan"])
def test_kills_and_pauses_at_random_moments_leave_the_target_exact(tmp_path, target, path):
    """A run SIGKILLed, or paused past its lease while another runs, at random moments; then
    ``--recovery manual`` either runs (exit 0) or is blocked (exit 3) and ``from_target``
    heals it; after each round the target equals the source's latest version of each key."""
    import random
    import time

    rng = random.Random(f"{target.kind}-{path}")
    source = make_events(tmp_path)
    route = events_route(tmp_path, target, path, lag=2, transfer={"chunk_rows": 64})
    route.write_text(route.read_text() + "lease_seconds = 1\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    command = [sys.executable, "-m", "dpone_native_transfer", "run", str(route), "--quiet"]
    for round in range(4):
        _churn(source, rng, 1000)
        child = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL,
                                 stderr=subprocess.DEVNULL)  # fmt: skip
        try:
            time.sleep(rng.uniform(0.05, 1.0))
            if round % 2:  # paused past its lease while another run takes the table, resumed
                child.send_signal(signal.SIGSTOP)
                time.sleep(1.6)
                other = subprocess.run(command, env=env, capture_output=True, timeout=300)
                child.send_signal(signal.SIGCONT)
                # the other run is blocked when the paused one had armed its batch
                assert other.returncode in (0, 1, 3) and child.wait(timeout=300) in (0, 1)
            else:
                child.send_signal(signal.SIGKILL)
        finally:
            if child.poll() is None:
                child.kill()
            child.wait(timeout=60)
        manual = run(route, "--recovery", "manual")
        if manual.returncode != 0:
            assert manual.returncode == 3, manual.stderr
            assert "--recovery from_target" in manual.stderr
            healed = run(route, "--recovery", "from_target")
            assert healed.returncode == 0, healed.stderr
        check_target(target, source)


@pytest.mark.parametrize("kind", ["sqlite", "clickhouse"])
def test_a_lost_store_is_restored_from_the_target_of_a_merge_route(tmp_path, kind):
    """The target's rows are not the sum of its merge batches' rows (updates, deletes):
    ``state restore`` does not ask them to be, and the next run continues exactly. On
    ClickHouse, whose table keeps every batch's rows (``FINAL`` shows the merged view),
    nothing is applied twice: the next runs add only the new batch's rows, each batch once."""
    target = Target(kind, tmp_path)
    source = make_events(tmp_path)
    route = events_route(tmp_path, target, "legacy")
    add(source, ("acme", 1, "eu", 1, "new", False), ("acme", 2, "eu", 1, "new", False))
    assert run(route).returncode == 0
    add(source, ("acme", 1, "eu", 2, "paid", False), ("acme", 2, "us", 2, "", True))
    assert run(route).returncode == 0
    kept = _batches(target)
    for file in tmp_path.glob("checkpoints.db*"):
        file.unlink()
    assert run(route).returncode == 3  # the target's ledger is ahead of the (new) store
    assert _batches(target) == kept
    restored = run_cli("state", "restore", route, "--yes", "--reason", "lost", "--operator", "me")
    assert restored.returncode == 0, restored.stderr
    again = run_cli("run", route)  # nothing new: the restored store says every batch is in
    assert again.returncode == 0, again.stderr
    assert "loaded 0 rows" in again.stdout
    assert _batches(target) == kept
    check_target(target, source)
    add(source, ("acme", 3, "eu", 3, "new", False), ("acme", 1, "us", 3, "late", False))
    assert run(route).returncode == 0
    check_target(target, source)
    batches = target.query('SELECT batch_id FROM "_dpone_ledger"')
    assert len(batches) == len({b for (b,) in batches}) == 3
    if kind == "clickhouse":  # the third batch's two rows added, the others' as they were
        [new] = {batch for (batch,) in batches} - {batch for batch, _ in kept}
        assert _batches(target) == sorted([*kept, (new, 2)])


def test_a_dropped_merge_table_is_refused_and_loaded_again_but_an_emptied_one_is_not(
    tmp_path, target
):
    """A merge never drops its table, while its batches may delete every row: a table the
    ledger says a merge wrote that is gone was dropped behind it, so the run is refused
    (the next batch made the table again holding only its own rows, exit 0); ``state
    restore`` then loads every row again. An empty table is still every row deleted."""
    source = make_events(tmp_path)
    route = events_route(tmp_path, target, "legacy")
    add(source, ("acme", 1, "eu", 1, "new", False), ("acme", 2, "eu", 1, "new", False))
    assert run(route).returncode == 0
    target.query('DROP TABLE "events"')
    add(source, ("acme", 1, "eu", 2, "paid", False), ("acme", 3, "us", 2, "new", False))
    refused = run(route)
    assert refused.returncode == 3 and "mismatch: target_emptied" in refused.stderr
    assert not target.exists("events")
    verify = run_cli("guard", "verify", route)
    assert verify.returncode == 3 and "target_emptied" in verify.stdout
    restored = run_cli(
        "state", "restore", route, "--yes", "--reason", "dropped", "--operator", "me"
    )
    assert restored.returncode == 0, restored.stderr
    assert run(route).returncode == 0
    check_target(target, source)
    add(source, *[("acme", key, "eu", 3, "", True) for key in (1, 2, 3)])
    assert run(route).returncode == 0  # every key deleted: an empty table
    assert target.rows("events", LOADED) == []
    add(source, ("acme", 4, "eu", 4, "new", False))
    assert run(route).returncode == 0
    check_target(target, source)


def test_a_store_lost_after_a_clickhouse_kill_before_the_ledger_row_is_restored_exactly(
    tmp_path,
):
    """Killed after the merge's INSERT, before its ledger row, then the store lost: ``state
    restore`` knows only what the ledger lists, so the next run merges that window again.
    A merge is idempotent: the merged view (``FINAL``) is exact, the ledger lists each
    batch once, and the batch the ledger lacks is the only one whose rows are there twice
    (its versions, superseded)."""
    target = Target("clickhouse", tmp_path)
    source = make_events(tmp_path)
    route = events_route(tmp_path, target, "legacy")
    add(source, ("acme", 1, "eu", 1, "new", False), ("acme", 2, "us", 1, "new", False))
    assert run(route).returncode == 0
    add(source, ("acme", 1, "eu", 2, "paid", False), ("acme", 2, "us", 2, "x", True),
        ("acme", 3, "us", 2, "new", False))  # fmt: skip
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    child = subprocess.run(
        [sys.executable, "-c", _CHILD, _SINK_MODULES["clickhouse"], "before-commit", str(route)],
        env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert child.returncode == -signal.SIGKILL, child.stderr
    [listed] = target.query('SELECT batch_id FROM "_dpone_ledger"')
    [unlisted] = {batch for batch, _ in _batches(target)} - set(listed)
    for file in tmp_path.glob("checkpoints.db*"):
        file.unlink()
    restored = run_cli("state", "restore", route, "--yes", "--reason", "lost", "--operator", "me")
    assert restored.returncode == 0, restored.stderr
    assert run(route).returncode == 0
    check_target(target, source)
    batches = [batch for (batch,) in target.query('SELECT batch_id FROM "_dpone_ledger"')]
    assert len(batches) == len(set(batches)) == 2 and unlisted not in batches
    [again] = set(batches) - set(listed)
    assert dict(_batches(target)) == {listed[0]: 2, unlisted: 3, again: 3}


def _batches(target: Target) -> list[tuple]:
    """Each merge batch's rows in the table as it is stored (ClickHouse's ``_dpone_batch``,
    every version, not ``FINAL``); [] on a target that replaces its rows in place."""
    if target.kind != "clickhouse":
        return []
    return sorted(
        target.query('SELECT "_dpone_batch", count() FROM "events" GROUP BY "_dpone_batch"')
    )


def test_an_append_route_switched_to_merge_collapses_each_key_to_its_latest_version(tmp_path):
    target = Target("sqlite", tmp_path)
    source = make_events(tmp_path)
    add(source, ("acme", 1, "eu", 1, "new", False), ("acme", 2, "eu", 1, "new", False))
    options = dict(partition_column="region", cursor_column="v", deleted_column="gone")
    route = write_route(tmp_path, target, table="events", path="staged",
                        transfer={"strategy": "incremental_append"}, partition_column="region",
                        cursor_column="v")  # fmt: skip
    assert run(route).returncode == 0
    add(source, ("acme", 1, "us", 2, "paid", False), ("acme", 2, "eu", 2, "", True))
    assert run(route).returncode == 0
    assert len(target.rows("events", ("seq",))) == 4  # every version, appended
    appending = tmp_path / "append.toml"
    appending.write_text(route.read_text())
    route = write_route(
        tmp_path, target, table="events", path="staged", primary_key=list(KEY), **options
    )
    assert run(route).returncode == 0
    merged = [(3, "acme", 1, "us", 2, "paid", None)]
    columns = ("seq", "tenant", "id", "region", "v", "status", "gone")
    assert target.rows("events", columns) == merged
    # the append route again: the merge already loaded its next windows' rows (exit 0 with
    # each new row twice before), so it is refused before the target
    add(source, ("acme", 3, "eu", 3, "new", False))
    again = run(appending)
    assert again.returncode == 3, again.stderr
    assert "replaced_by_another_route" in again.stderr and "merge route" in again.stderr
    assert target.rows("events", columns) == merged
    assert run(route).returncode == 0
    assert target.rows("events", ("seq",)) == [(3,), (5,)]


def test_a_merge_after_a_refresh_of_its_table_merges_the_whole_source_again(tmp_path, target):
    """A refresh route of the same source loads soft-deleted rows as live ones (it knows no
    deleted column) and adds that column to the table. The merge route went on from the
    refresh's watermark, so those rows stayed (exit 0); on ClickHouse the added column also
    hid the next delete. It merges the whole source again now: every key as the source says.
    On ClickHouse the refresh is refused (exit 2, nothing written): the merge route's
    ``ReplacingMergeTree`` keeps one row a key, which a refresh of a source with several
    versions of a key would not all keep."""
    source = make_events(tmp_path)
    add(source, ("acme", 1, "eu", 1, "new", False), ("acme", 2, "us", 1, "new", False))
    route = events_route(tmp_path, target, "staged")
    assert run(route).returncode == 0
    update = "UPDATE events SET v = ?, status = ?, gone = ? WHERE id = ?"
    with _sqlite(source) as db:  # one row a key: a refresh into the key's table holds it
        db.execute(update, (2, "", True, 1))
        db.commit()
    add(source, ("acme", 3, "eu", 2, "new", False))
    refresh = tmp_path / "refresh.toml"
    refresh.write_text(
        route.read_text()
        .replace('strategy = "merge"', 'strategy = "full_refresh"')
        .replace('deleted_column = "gone"\n', "")
        .replace('primary_key = ["tenant", "id"]\n', "")
    )
    refreshed = run(refresh)
    if target.kind == "clickhouse":
        assert refreshed.returncode == 2 and "does not keep every row" in refreshed.stderr
        assert run(route).returncode == 0
        check_target(target, source)
        return
    assert refreshed.returncode == 0, refreshed.stderr
    assert "gone" in target.columns("events")  # the refresh loaded the column as its own
    with _sqlite(source) as db:
        db.executemany(update, [(3, "paid", False, 2), (3, "", True, 3)])
        db.commit()
    merged = run(route)
    assert merged.returncode == 0, merged.stderr
    check_target(target, source)
    assert {row[:2] for row in target.rows("events", KEY)} == {("acme", 2)}


@pytest.mark.parametrize("path", ["legacy", "file-artifact"])
@pytest.mark.parametrize("into", ["duckdb", "postgres"])
def test_a_postgres_sources_null_key_is_refused_though_its_rows_could_be_read_in_bulk(
    tmp_path, postgres_schema, into, path
):
    """A PostgreSQL source's rows reach DuckDB and PostgreSQL targets in bulk, read by no
    Python; a merge route's rows are read by dpone, which checks every key value: a NULL key
    is refused before the target on every path, and the run after the fix merges exactly."""
    import psycopg

    dsn, schema = postgres_schema.dsn, postgres_schema.schema
    items = f'"{schema}".items'
    with psycopg.connect(dsn, autocommit=True) as db:
        db.execute(f'CREATE SCHEMA "{schema}"')
        db.execute(f"CREATE TABLE {items} (id integer, region text NOT NULL, v integer, name text)")
        db.execute(f"INSERT INTO {items} VALUES (1, 'eu', 1, 'a'), (2, 'eu', 1, 'b')")
    target = Target(into, tmp_path, postgres_schema)
    route = tmp_path / "route.toml"
    route.write_text(
        f'[source]\nkind = "postgres"\ndsn = "{postgres_url(dsn)}"\ntable = "{schema}.items"\n'
        'partition_column = "region"\ncursor_column = "v"\nprimary_key = ["id"]\n\n'
        f"[target]\n{target.section('items_copy')}\n\n"
        f'[transfer]\nstrategy = "merge"\npath = "{path}"\n\n[store]\npath = "checkpoints.db"\n',
        encoding="utf-8",
    )
    assert run(route).returncode == 0
    with psycopg.connect(dsn, autocommit=True) as db:
        db.execute(f"INSERT INTO {items} VALUES (NULL, 'eu', 2, 'x'), (3, 'eu', 2, 'c')")
        db.execute(f"UPDATE {items} SET name = 'a2', v = 2 WHERE id = 1")
    refused = run(route)
    assert refused.returncode == 2, refused.stderr
    assert "native_transfer_value_unsupported" in refused.stderr and "'id'" in refused.stderr
    assert target.rows("items_copy", ("id", "name")) == [(1, "a"), (2, "b")]
    with psycopg.connect(dsn, autocommit=True) as db:
        db.execute(f"DELETE FROM {items} WHERE id IS NULL")
    assert run(route).returncode == 0
    assert target.rows("items_copy", ("id", "name")) == [(1, "a2"), (2, "b"), (3, "c")]


# (source column type, its role, the targets that keep it as the source compares it)
_COMPARED = [
    ("numeric", "primary_key", {"postgres"}),  # 1.0 and 1.00: one key, two texts
    ("interval", "cursor_column", {"postgres"}),  # '9 days' < '10 days', not as texts
    ("citext", "primary_key", set()),  # 'abc' and 'ABC': one key to the source only
]


@pytest.mark.parametrize(("kind", "role", "kept"), _COMPARED)
@pytest.mark.parametrize("into", TARGETS)
def test_a_key_or_cursor_a_target_would_compare_otherwise_is_refused_before_it(
    tmp_path, postgres_schema, into, kind, role, kept
):
    """A PostgreSQL source's key or cursor that a target keeps as text although the source
    compares its values otherwise (or a case-insensitive ``citext``) merged two versions of
    one key, missed a delete, or kept an older version as the newer, with exit 0: it is
    refused before the target (exit 2), naming the route file's key; where the target keeps
    the type, the route merges."""
    import psycopg

    dsn, schema = postgres_schema.dsn, postgres_schema.schema
    key, cursor = ("k", "v") if role == "primary_key" else ("id", "k")
    kinds = {"k": kind, "id": "integer", "v": "integer"}
    with psycopg.connect(dsn, autocommit=True) as db:
        db.execute("CREATE EXTENSION IF NOT EXISTS citext")
        db.execute(f'CREATE SCHEMA "{schema}"')
        db.execute(
            f'CREATE TABLE "{schema}".items ({key} {kinds[key]} PRIMARY KEY,'
            f" region text NOT NULL, {cursor} {kinds[cursor]}, name text)"
        )
        row = {"numeric": "1.0", "interval": "9 days", "citext": "abc"}[kind]
        values = (row, 1) if role == "primary_key" else (1, row)
        db.execute(f"INSERT INTO \"{schema}\".items VALUES (%s, 'eu', %s, 'a')", values)
    target = Target(into, tmp_path, postgres_schema)
    route = tmp_path / "route.toml"
    route.write_text(
        f'[source]\nkind = "postgres"\ndsn = "{postgres_url(dsn)}"\ntable = "{schema}.items"\n'
        f'partition_column = "region"\ncursor_column = "{cursor}"\nprimary_key = ["{key}"]\n\n'
        f"[target]\n{target.section('items_copy')}\n\n"
        '[transfer]\nstrategy = "merge"\npath = "legacy"\n\n[store]\npath = "checkpoints.db"\n',
        encoding="utf-8",
    )
    done = run(route)
    if into in kept:
        assert done.returncode == 0, done.stderr
        assert target.rows("items_copy", ("name",)) == [("a",)]
        return
    assert done.returncode == 2, done.stderr
    assert "native_transfer_config_invalid" in done.stderr
    assert f"source.{role}" in done.stderr and row not in done.stderr
    assert not target.exists("items_copy")


@pytest.mark.parametrize("into", ["duckdb", "postgres", "clickhouse"])
def test_a_sqlite_column_of_no_type_keys_a_merge_but_orders_no_version(tmp_path, request, into):
    """A target keeps a SQLite column of no declared type as text: as a key it compares as
    its values' texts do (mixed values are refused as they are read), so it merges; as the
    cursor it would order 10 before 9, so it is refused before the target."""
    schema = request.getfixturevalue("postgres_schema") if into == "postgres" else None
    if schema is not None:
        import psycopg

        with psycopg.connect(schema.dsn, autocommit=True) as db:
            db.execute(f'CREATE SCHEMA "{schema.schema}"')
    target = Target(into, tmp_path, schema)
    with _sqlite(tmp_path / "source.db") as db:
        db.execute("CREATE TABLE items (k, region TEXT, v INTEGER, u, name TEXT)")
        db.executemany(
            "INSERT INTO items VALUES (?, 'eu', ?, ?, ?)",
            [("k1", 9, "9", "a"), ("k2", 10, "10", "b")],  # texts: a target takes them
        )
        db.commit()
    keyed = write_route(
        tmp_path, target, table="items", path="legacy", partition_column="region",
        cursor_column="v", primary_key=["k"],
    )  # fmt: skip
    assert run(keyed).returncode == 0
    assert target.rows("items", ("name",)) == [("a",), ("b",)]
    versioned = write_route(
        tmp_path, target, table="items", target_table="items_by_u", path="legacy",
        partition_column="region", cursor_column="u", primary_key=["v"],
    )  # fmt: skip
    refused = run(versioned)
    assert refused.returncode == 2, refused.stderr
    assert "source.cursor_column" in refused.stderr


# -- target tables made by hand that a merge cannot run on ----------------------------------

# (target kind, what the table is, its DDL): each merge failed inside the target call
# (a constraint violated, a missing operator, a table that is not one), blocking the route
_REFUSED = [
    ("sqlite", "a key collated NOCASE",
     "CREATE TABLE events (tenant TEXT COLLATE NOCASE, id INTEGER, region TEXT, v INTEGER,"
     " status TEXT, PRIMARY KEY (tenant, id))"),
    ("sqlite", "a key collated RTRIM, without rowid",
     "CREATE TABLE events (tenant TEXT COLLATE RTRIM, id INTEGER, region TEXT, v INTEGER,"
     " status TEXT, PRIMARY KEY (tenant, id)) WITHOUT ROWID"),
    ("duckdb", "a key collated NOCASE",
     "CREATE TABLE events (tenant VARCHAR COLLATE NOCASE, id BIGINT, region VARCHAR,"
     " v BIGINT, status VARCHAR, PRIMARY KEY (tenant, id))"),
    ("duckdb", "a view",
     "CREATE TABLE elsewhere (tenant VARCHAR, id BIGINT, region VARCHAR, v BIGINT,"
     " status VARCHAR); CREATE VIEW events AS SELECT * FROM elsewhere"),
    ("postgres", "a key of char(n), which ignores trailing spaces",
     "CREATE TABLE events (tenant char(12), id bigint, region text, v bigint, status text,"
     " PRIMARY KEY (tenant, id))"),
    ("sqlite", "a primary key narrower than the merge's",
     "CREATE TABLE events (tenant TEXT, id INTEGER PRIMARY KEY, region TEXT, v INTEGER,"
     " status TEXT)"),
    ("duckdb", "a primary key narrower than the merge's",
     "CREATE TABLE events (tenant VARCHAR, id BIGINT PRIMARY KEY, region VARCHAR,"
     " v BIGINT, status VARCHAR)"),
    ("duckdb", "a unique index narrower than the merge's",
     "CREATE TABLE events (tenant VARCHAR, id BIGINT, region VARCHAR, v BIGINT,"
     " status VARCHAR); CREATE UNIQUE INDEX by_id ON events (ID)"),
    ("sqlite", "a unique index narrower than the merge's",
     "CREATE TABLE events (tenant TEXT, id INTEGER, region TEXT, v INTEGER, status TEXT);"
     " CREATE UNIQUE INDEX by_id ON events (id)"),
    ("postgres", "a unique constraint narrower than the merge's",
     "CREATE TABLE events (tenant text, id bigint UNIQUE, region text, v bigint, status text)"),
    ("postgres", "a key of type name, which cuts a text at 63 bytes",
     "CREATE TABLE events (tenant name, id bigint, region text, v bigint, status text)"),
    ("postgres", "a key of a collation that normalises",
     "CREATE COLLATION nd3 (provider = icu, locale = 'und-u-ks-level3', deterministic = false);"
     " CREATE TABLE events (tenant text COLLATE nd3, id bigint, region text, v bigint,"
     " status text)"),
    ("duckdb", "a key collated NFC",
     "CREATE TABLE events (tenant VARCHAR COLLATE NFC, id BIGINT, region VARCHAR, v BIGINT,"
     " status VARCHAR)"),
    ("duckdb", "a key of FLOAT, which rounds an integer",
     "CREATE TABLE events (tenant VARCHAR, id FLOAT, region VARCHAR, v BIGINT, status VARCHAR)"),
    ("postgres", "a key of a type without = against the source's",
     "CREATE TABLE events (tenant text, id uuid, region text, v bigint, status text)"),
    ("clickhouse", "a plain MergeTree table (an append route's)",
     "CREATE TABLE events (tenant Nullable(String), id Nullable(Int64), region Nullable(String),"
     " v Nullable(Int64), status Nullable(String)) ENGINE = MergeTree ORDER BY tuple()"),
    ("clickhouse", "a ReplacingMergeTree ordered by part of the key",
     "CREATE TABLE events (tenant String, id Int64, region Nullable(String), v Nullable(Int64),"
     " status Nullable(String), _dpone_version UInt64, _dpone_deleted UInt8, _dpone_batch"
     " String, _dpone_rows UInt64) ENGINE = ReplacingMergeTree(_dpone_version, _dpone_deleted)"
     " ORDER BY id"),
    ("clickhouse", "a ReplacingMergeTree by its own version column",
     "CREATE TABLE events (tenant String, id Int64, region Nullable(String), v Int64,"
     " status Nullable(String)) ENGINE = ReplacingMergeTree(v) ORDER BY (tenant, id)"),
    ("clickhouse", "a ReplacingMergeTree whose key column is of another type",
     "CREATE TABLE events (tenant String, id String, region Nullable(String), v Nullable(Int64),"
     " status Nullable(String), _dpone_version UInt64, _dpone_deleted UInt8, _dpone_batch"
     " String, _dpone_rows UInt64) ENGINE = ReplacingMergeTree(_dpone_version, _dpone_deleted)"
     " ORDER BY (tenant, id)"),
    ("clickhouse", "a ReplacingMergeTree partitioned by region",
     "CREATE TABLE events (tenant String, id Int64, region String, v Nullable(Int64),"
     " status Nullable(String), _dpone_version UInt64, _dpone_deleted UInt8, _dpone_batch"
     " String, _dpone_rows UInt64) ENGINE = ReplacingMergeTree(_dpone_version, _dpone_deleted)"
     " PARTITION BY region ORDER BY (tenant, id)"),
]  # fmt: skip


def _make(target: Target, ddl: str) -> None:
    if target.kind == "sqlite":
        with _sqlite(target.folder / "target.db") as db:
            db.executescript(ddl)
    elif target.kind == "duckdb":
        import duckdb

        with contextlib.closing(duckdb.connect(str(target.folder / "target.duckdb"))) as db:
            db.execute(ddl)
    elif target.kind == "clickhouse":
        from dpone_native_transfer.connectors.clickhouse import ClickHouseSink

        with ClickHouseSink(target.folder / "chdata", "events").client() as client:
            client.command(ddl)
    else:
        import psycopg

        with psycopg.connect(target.schema.dsn, autocommit=True) as db:
            db.execute(f'SET search_path = "{target.schema.schema}"')
            db.execute(ddl)


def _merging_target(request, tmp_path, kind: str) -> Target:
    if kind != "postgres":
        return Target(kind, tmp_path)
    location = request.getfixturevalue("postgres_schema")
    _make(Target("postgres", tmp_path, location), f'CREATE SCHEMA "{location.schema}"')
    return Target("postgres", tmp_path, location)


@pytest.mark.parametrize(
    ("kind", "shape", "ddl"), _REFUSED, ids=[f"{k}: {s}" for k, s, _ in _REFUSED]
)
def test_a_target_table_a_merge_cannot_run_on_is_refused_before_the_target(
    request, tmp_path, kind, shape, ddl
):
    """Refused before the target call (exit 2, nothing written, the route not blocked):
    once the table is one a merge can run on, the same route merges exactly."""
    target = _merging_target(request, tmp_path, kind)
    _make(target, ddl)
    source = make_events(tmp_path)
    add(source, ("acme", 1, "eu", 1, "new", False), ("ACME", 1, "eu", 2, "new", False),
        ("a", 2, "us", 1, "x", False), ("a ", 2, "us", 1, "y", False))  # fmt: skip
    route = events_route(tmp_path, target, "staged")
    done = run(route)
    assert done.returncode == 2, done.stderr
    code = "view" in shape and "native_transfer_target_rows_mismatch"
    if "without =" in shape:  # bigint cannot be assigned to a uuid either: the load's insert
        assert "native_transfer_schema_changed" in done.stderr  # is asked first
        assert "column(s) id take no value from an insert" in done.stderr
        code = "native_transfer_schema_changed"
    assert (code or "native_transfer_config_invalid") in done.stderr
    named = code or "narrower" in shape or "'tenant'" in done.stderr or "'id'" in done.stderr
    named = named or (kind == "clickhouse" and "ReplacingMergeTree" in done.stderr)
    assert named and ("narrower" not in shape or "part of the merge's key" in done.stderr)
    assert "acme" not in done.stderr.lower() and "SELECT" not in done.stderr
    assert target.ledger_rows() == 0
    if "view" not in shape:
        assert target.rows("events", ("v",)) == []
    _make(target, "DROP VIEW events" if "view" in shape else "DROP TABLE events")
    assert run(route).returncode == 0
    check_target(target, source)


_COARSER_CURSOR = {
    "postgres": "CREATE TABLE t (k bigint PRIMARY KEY, p bigint, u timestamp(0), v text)",
    "duckdb": "CREATE TABLE t (k BIGINT PRIMARY KEY, p BIGINT, u TIMESTAMP_S, v VARCHAR)",
}


@pytest.mark.parametrize("kind", sorted(_COARSER_CURSOR))
def test_a_cursor_column_made_coarser_by_hand_is_refused_before_the_target(request, tmp_path, kind):
    """A hand-made cursor column that rounds (``timestamp(0)``, ``TIMESTAMP_S``) kept
    ``10:00:01`` for ``10:00:00.6``; the newer ``10:00:00.9`` then looked older, and was
    never merged (exit 0). Refused before the target, naming the column; merged exactly
    into a table of the type dpone makes."""
    target = _merging_target(request, tmp_path, kind)
    _make(target, _COARSER_CURSOR[kind])
    with _sqlite(tmp_path / "source.db") as db:
        db.execute("CREATE TABLE t (k INTEGER, p INTEGER, u TIMESTAMP, v TEXT)")
        db.execute("INSERT INTO t VALUES (1, 1, '2024-01-01 10:00:00.6', 'a')")
        db.commit()
    route = write_route(
        tmp_path, target, table="t", path="legacy", partition_column="p", cursor_column="u",
        primary_key=["k"],
    )  # fmt: skip
    done = run(route)
    assert done.returncode == 2, done.stderr
    assert "native_transfer_config_invalid" in done.stderr and "'u'" in done.stderr
    assert "does not keep every source value" in done.stderr and "10:00" not in done.stderr
    assert target.rows("t", ("k",)) == []
    _make(target, "DROP TABLE t")
    assert run(route).returncode == 0
    with _sqlite(tmp_path / "source.db") as db:
        db.execute("UPDATE t SET u = '2024-01-01 10:00:00.9', v = 'a2'")
        db.commit()
    assert run(route).returncode == 0
    assert target.rows("t", ("k", "v")) == [(1, "a2")]


_COLUMNS_MADE = ("seq Nullable(Int64), tenant Nullable(String), id Nullable(Int64), region"
                 " Nullable(String), v Nullable(Int64), status Nullable(String), gone"
                 " Nullable(Bool)")  # fmt: skip
_KEEPING_FEWER = {
    "a merge route's ReplacingMergeTree": None,
    "a hand-made SummingMergeTree": f"CREATE TABLE events ({_COLUMNS_MADE}) ENGINE ="
    " SummingMergeTree ORDER BY tuple() SETTINGS allow_nullable_key = 1",
    "a Null table": f"CREATE TABLE events ({_COLUMNS_MADE}) ENGINE = Null",
    "a Join table": f"CREATE TABLE events ({_COLUMNS_MADE}) ENGINE = Join(ANY, LEFT, id)"
    " SETTINGS join_use_nulls = 1",
    "a plain MergeTree table made by hand": f"CREATE TABLE events ({_COLUMNS_MADE}) ENGINE ="
    " MergeTree ORDER BY tuple()",
}


@pytest.mark.parametrize(
    ("shape", "strategy"),  # an append after the merge route is refused before (exit 3)
    [(shape, strategy) for shape in sorted(_KEEPING_FEWER)
     for strategy in ("full_refresh", "incremental_append") if "merge" not in shape
     or strategy == "full_refresh"],
)  # fmt: skip
def test_an_append_or_refresh_into_a_clickhouse_table_keeping_fewer_rows_is_refused(
    tmp_path, strategy, shape
):
    """A full refresh into the table a merge route made collapsed the batch's versions of a
    key at once: its count came short inside the target call, both routes were blocked, and
    a soft-deleted version stood as a live row. Now any append or refresh into a table that
    does not keep every row (exit 2, nothing written, nothing blocked); the merge route goes
    on exactly."""
    target = Target("clickhouse", tmp_path)
    source = make_events(tmp_path)
    add(source, ("acme", 1, "eu", 1, "old", False), ("acme", 1, "eu", 2, "new", False),
        ("beta", 2, "us", 1, "x", False), ("beta", 2, "us", 3, "x", True))  # fmt: skip
    ddl = _KEEPING_FEWER[shape]
    merge = events_route(tmp_path, target, "staged").rename(tmp_path / "merge.toml")
    if ddl is None:
        assert run(merge).returncode == 0
    else:
        _make(target, ddl)
    kept, ledger = target.rows("events", ("v",)), target.ledger_rows()
    plain = write_route(tmp_path, target, table="events", path="staged",
                        partition_column="region", cursor_column="v",
                        transfer={"strategy": strategy})  # fmt: skip
    done = run(plain)
    if "plain" in shape:  # keeps every row: loaded
        assert done.returncode == 0, done.stderr
        assert sorted(target.rows("events", ("v",))) == [(1,), (1,), (2,), (3,)]
        return
    assert done.returncode == 2, done.stderr
    assert "native_transfer_config_invalid" in done.stderr
    assert "does not keep every row" in done.stderr
    assert target.rows("events", ("v",)) == kept and target.ledger_rows() == ledger
    if ddl is None:
        add(source, ("acme", 1, "eu", 4, "newer", False))
        assert run(merge).returncode == 0
        check_target(target, source)


_STATUS_UNIQUE = {
    "sqlite": "CREATE TABLE events (tenant TEXT, id INTEGER, region TEXT, v INTEGER,"
    " status TEXT UNIQUE, PRIMARY KEY (tenant, id))",
    "duckdb": "CREATE TABLE events (tenant VARCHAR, id BIGINT, region VARCHAR, v BIGINT,"
    " status VARCHAR UNIQUE, PRIMARY KEY (tenant, id))",
    "postgres": "CREATE TABLE events (tenant text, id bigint, region text, v bigint,"
    " status text UNIQUE, PRIMARY KEY (tenant, id))",
}


@pytest.mark.parametrize("strategy", ["merge", "incremental_append"])
@pytest.mark.parametrize("kind", sorted(_STATUS_UNIQUE))
def test_a_constraint_of_the_target_refusing_a_row_rolls_back_and_blocks_nothing(
    request, tmp_path, kind, strategy
):
    """A hand-made table's constraint (here UNIQUE on a column not in the key) refuses a row
    inside the target call: the transaction is rolled back, so the outcome is known. It was
    reported as the driver's error (exit 1) and blocked the route for good (a retry, and
    recovery from the target, met the same refusal). Now exit 2 with the engine's code for
    the constraint, never its message (it names the value); nothing blocks; once the rows
    fit, the same route loads them exactly."""
    target = _merging_target(request, tmp_path, kind)
    appends = strategy != "merge"  # the deleted column is then a column like the others
    _make(target, _STATUS_UNIQUE[kind].replace(", PRIMARY KEY", ", gone BOOLEAN, PRIMARY KEY")
          if appends else _STATUS_UNIQUE[kind])  # fmt: skip
    source = make_events(tmp_path)
    add(source, ("acme", 1, "eu", 1, "secret-a", False), ("acme", 2, "eu", 1, "secret-b", False))
    route = events_route(tmp_path, target, "staged")
    if appends:
        route = write_route(tmp_path, target, table="events", path="staged",
                            partition_column="region", cursor_column="v",
                            transfer={"strategy": strategy})  # fmt: skip
    assert run(route).returncode == 0
    add(source, ("acme", 3, "us", 2, "secret-a", False))  # a status another row holds
    for _ in range(2):  # the same each time: refused, not blocked
        done = run(route)
        assert done.returncode == 2, done.stderr
        assert "native_transfer_target_constraint" in done.stderr
        assert "secret" not in done.stderr and "INSERT" not in done.stderr
    assert target.ledger_rows() == 1
    assert len(target.rows("events", LOADED)) == 2
    verify = run_cli("guard", "verify", route)
    assert verify.returncode == 0, verify.stdout
    _make(target, "DELETE FROM events WHERE id = 1")
    with _sqlite(source) as db:
        db.execute("DELETE FROM events WHERE id = 1")
        db.commit()
    assert run(route).returncode == 0
    if appends:
        assert target.rows("events", EVENT_COLUMNS[1:]) == ordered(
            [row[1:] for row in source_rows(source)]
        )
    else:
        check_target(target, source)


_STATUS_TYPED = {
    "duckdb": (
        "CREATE TYPE status_kind AS ENUM ('new'); CREATE TABLE events (tenant VARCHAR, id BIGINT,"
        " region VARCHAR, v BIGINT, status status_kind, PRIMARY KEY (tenant, id))",
        "ConversionException",
    ),
    "postgres": (
        "CREATE TABLE events (tenant text, id bigint, region text, v bigint,"
        " status varchar(3), PRIMARY KEY (tenant, id))",
        "SQLSTATE 22001",
    ),
}


@pytest.mark.parametrize("path", ["legacy", "staged"])
@pytest.mark.parametrize("kind", sorted(_STATUS_TYPED))
def test_a_column_type_made_by_hand_refusing_a_value_rolls_back_and_blocks_nothing(
    request, tmp_path, kind, path
):
    """A hand-made column type (an enum) is left to the engine's own conversion, which
    refuses a value inside the target call and rolls the load back: that was a foreign
    error (exit 1) and every later run blocked (exit 3). Now exit 2 with the engine's code,
    never the value; nothing blocks; once the type takes the value, the rows load exactly."""
    target = _merging_target(request, tmp_path, kind)
    ddl, code = _STATUS_TYPED[kind]
    _make(target, ddl)
    source = make_events(tmp_path)
    add(source, ("acme", 1, "eu", 1, "new", False), ("acme", 2, "eu", 1, "secret-b", False))
    route = events_route(tmp_path, target, path)
    for _ in range(2):  # the same each time: refused, not blocked
        done = run(route)
        assert done.returncode == 2, done.stderr
        assert "native_transfer_target_constraint: a constraint or column type" in done.stderr
        assert code in done.stderr and "secret" not in done.stderr
    assert target.ledger_rows() == 0 and target.rows("events", ("id",)) == []
    _make(target, "ALTER TABLE events ALTER COLUMN status TYPE VARCHAR")
    assert run(route).returncode == 0
    check_target(target, source)


@pytest.mark.parametrize("path", ["legacy", "staged"])
def test_a_postgres_type_made_by_hand_that_takes_no_text_is_refused_before_the_target(
    request, tmp_path, path
):
    """An enum made by hand takes text by its input function (COPY) but not from an
    ``INSERT ... SELECT`` of text (no assignment cast, SQLSTATE 42804): a merge, a staged
    load and a lazy plan failed inside the target call (exit 1) and blocked the route.
    Refused before the target, naming the column; loaded once the column takes text."""
    target = _merging_target(request, tmp_path, "postgres")
    _make(
        target,
        "CREATE TYPE status_kind AS ENUM ('new'); CREATE TABLE events (tenant text, id bigint,"
        " region text, v bigint, status status_kind, PRIMARY KEY (tenant, id))",
    )
    source = make_events(tmp_path)
    add(source, ("acme", 1, "eu", 1, "new", False))
    route = events_route(tmp_path, target, path)
    for _ in range(2):
        done = run(route)
        assert done.returncode == 2, done.stderr
        assert "native_transfer_schema_changed" in done.stderr and '"status"' in done.stderr
    assert target.ledger_rows() == 0 and target.rows("events", ("id",)) == []
    _make(target, "ALTER TABLE events ALTER COLUMN status TYPE text")
    assert run(route).returncode == 0
    check_target(target, source)


_COMPUTED = {
    "sqlite: generated": "CREATE TABLE events (seq INTEGER, tenant TEXT, id INTEGER, region TEXT,"
    " v INTEGER, status TEXT GENERATED ALWAYS AS (region || 'x') STORED, gone BOOLEAN)",
    "duckdb: generated": "CREATE TABLE events (seq BIGINT, tenant VARCHAR, id BIGINT, region"
    " VARCHAR, v BIGINT, status VARCHAR GENERATED ALWAYS AS (region || 'x'), gone BOOLEAN)",
    "postgres: generated": "CREATE TABLE events (seq bigint, tenant text, id bigint, region text,"
    " v bigint, status text GENERATED ALWAYS AS (region || 'x') STORED, gone boolean)",
    "postgres: identity": "CREATE TABLE events (seq bigint, tenant text, id bigint GENERATED"
    " ALWAYS AS IDENTITY, region text, v bigint, status text, gone boolean)",
    "clickhouse: materialized": "CREATE TABLE events (seq Int64, tenant String, id Int64,"
    " region String, v Int64, status String MATERIALIZED concat(region, 'x'), gone UInt8)"
    " ENGINE = MergeTree ORDER BY id",
}


@pytest.mark.parametrize("shape", sorted(_COMPUTED))
def test_a_column_the_table_computes_is_refused_before_the_target(request, tmp_path, shape):
    """A target column the table computes (generated, identity, materialized) takes no
    value from an insert: the load failed inside the target call (a binder or programming
    error, exit 1) and blocked the route. Refused before the target, naming the column;
    loaded exactly into a table where it is an ordinary column."""
    kind = shape.split(":")[0]
    target = _merging_target(request, tmp_path, kind)
    _make(target, _COMPUTED[shape])
    source = make_events(tmp_path)
    add(source, ("acme", 1, "eu", 1, "new", False), ("acme", 2, "us", 1, "old", True))
    route = write_route(tmp_path, target, table="events", path="staged",
                        partition_column="region", cursor_column="v",
                        transfer={"strategy": "incremental_append"})  # fmt: skip
    column = "id" if "identity" in shape else "status"
    for _ in range(2):  # refused each time, never blocked
        done = run(route)
        assert done.returncode == 2, done.stderr
        assert "native_transfer_schema_changed" in done.stderr
        assert f"column(s) {column} take no value from an insert" in done.stderr
    assert target.ledger_rows() == 0 and target.rows("events", ("v",)) == []
    _make(target, "DROP TABLE events")
    assert run(route).returncode == 0
    assert target.rows("events", EVENT_COLUMNS[1:]) == ordered(
        [row[1:] for row in source_rows(source)]
    )


_COLLATED_CURSOR = {
    "sqlite": "CREATE TABLE t (id INTEGER PRIMARY KEY, r TEXT, ver TEXT COLLATE NOCASE, s TEXT)",
    "duckdb": "CREATE TABLE t (id BIGINT PRIMARY KEY, r VARCHAR, ver VARCHAR COLLATE NOCASE,"
    " s VARCHAR)",
    "postgres": "CREATE TABLE t (id bigint PRIMARY KEY, r text, ver char(8), s text)",
}


@pytest.mark.parametrize("kind", sorted(_COLLATED_CURSOR))
def test_a_target_ordering_a_text_cursor_by_its_own_collation_is_refused(request, tmp_path, kind):
    """The cursor's byte order says 'a' is newer than 'B'; a target column collated NOCASE
    says older, so the merge kept the older version, exit 0 (a PostgreSQL ``char(n)`` column,
    which ignores trailing spaces, likewise). Refused before the target, naming the column;
    the table dpone makes merges it exactly."""
    target = _merging_target(request, tmp_path, kind)
    with _sqlite(tmp_path / "source.db") as db:
        db.execute("CREATE TABLE t (id INTEGER, r TEXT, ver TEXT, s TEXT)")
        db.execute("INSERT INTO t VALUES (1, 'eu', 'B', 'old')")
        db.commit()
    _make(target, _COLLATED_CURSOR[kind])
    route = write_route(tmp_path, target, table="t", path="legacy", partition_column="r",
                        cursor_column="ver", primary_key="id")  # fmt: skip
    done = run(route)
    assert done.returncode == 2, done.stderr
    assert "native_transfer_config_invalid" in done.stderr and "'ver'" in done.stderr
    assert target.rows("t", ("id", "ver", "s")) == [] and target.ledger_rows() == 0
    _make(target, "DROP TABLE t")
    assert run(route).returncode == 0
    with _sqlite(tmp_path / "source.db") as db:
        db.execute("INSERT INTO t VALUES (1, 'eu', 'a', 'new')")
        db.commit()
    assert run(route).returncode == 0
    assert target.rows("t", ("id", "ver", "s")) == [(1, "a", "new")]


_REQUIRED_EXTRA = {  # a hand-made target: one column the source lacks takes no NULL
    "sqlite": "CREATE TABLE t (id INTEGER PRIMARY KEY, r TEXT, ver INTEGER, must TEXT NOT NULL,"
    " kept TEXT NOT NULL DEFAULT 'k')",
    "duckdb": "CREATE TABLE t (id BIGINT PRIMARY KEY, r VARCHAR, ver BIGINT, must VARCHAR NOT"
    " NULL, kept VARCHAR NOT NULL DEFAULT 'k')",
    "postgres": "CREATE TABLE t (id bigint PRIMARY KEY, r text, ver bigint, must text NOT NULL,"
    " kept text NOT NULL DEFAULT 'k', made bigint GENERATED ALWAYS AS IDENTITY)",
}


@pytest.mark.parametrize("strategy", ["merge", "incremental_append"])
@pytest.mark.parametrize("kind", sorted(_REQUIRED_EXTRA))
def test_a_target_column_the_source_lacks_and_no_row_could_fill_is_refused_before_the_target(
    request, tmp_path, kind, strategy
):
    """A target column that takes no NULL and has no default, which the source does not have,
    failed every insert inside the target call (the driver's IntegrityError), and blocked
    the route. Refused before the target under either contract, naming only that column (a
    column with a default, an identity, SQLite's rowid alias are filled); once it takes
    NULL, the same route loads."""
    target = _merging_target(request, tmp_path, kind)
    with _sqlite(tmp_path / "source.db") as db:
        db.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, r TEXT, ver INTEGER)")
        db.executemany("INSERT INTO t VALUES (?, 'eu', ?)", [(1, 1), (2, 1)])
        db.commit()
    _make(target, _REQUIRED_EXTRA[kind])
    route = write_route(tmp_path, target, table="t", path="legacy", partition_column="r",
                        cursor_column="ver", transfer={"strategy": strategy})  # fmt: skip
    for contract in ("evolve", "freeze"):
        text = route.read_text().replace("[store]", f'schema_contract = "{contract}"\n[store]')
        route.with_name("contract.toml").write_text(text)
        done = run(route.with_name("contract.toml"))
        assert done.returncode == 2, done.stderr
        assert "native_transfer_schema_changed" in done.stderr
        assert '"columns": ["must"]' in done.stderr, done.stderr
        assert target.rows("t", ("id",)) == [] and target.ledger_rows() == 0
    scan = run_cli("guard", "scan", "--store", tmp_path / "checkpoints.db")
    assert scan.returncode == 0, scan.stdout + scan.stderr  # nothing blocked
    _make(target, "DROP TABLE t")
    _make(target, re.sub(r"(must \w+) NOT NULL", r"\1", _REQUIRED_EXTRA[kind]))
    assert run(route).returncode == 0
    assert target.rows("t", ("id", "must", "kept")) == [(1, None, "k"), (2, None, "k")]


@contextlib.contextmanager
def _icu_database(dsn: str) -> Iterator[str]:
    """A database of its own whose texts an ICU collation orders ('und': 'a' < 'B' < 'b')."""
    import psycopg

    name = f"icu_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(dsn, autocommit=True) as admin:
        admin.execute(f"CREATE DATABASE {name} TEMPLATE template0 LOCALE_PROVIDER icu"
                      " ICU_LOCALE 'und' LOCALE 'C'")  # fmt: skip
    try:
        yield psycopg.conninfo.make_conninfo(dsn, dbname=name)
    finally:
        with psycopg.connect(dsn, autocommit=True) as admin:
            admin.execute(f"DROP DATABASE {name} WITH (FORCE)")


@pytest.mark.parametrize("made", ["by dpone in an ICU database", "collated ICU by hand"])
@pytest.mark.parametrize("path", ["legacy", "staged"])
def test_a_postgres_target_orders_a_text_cursor_by_bytes_whatever_its_collation(
    postgres_schema, tmp_path, path, made
):
    """A database or column collated en_US or ICU ranks 'á' below 'B' and 'C' above 'b';
    the cursor's byte order (a SQLite source's windows, the other targets) says otherwise,
    and the merge kept the older version, exit 0. The merge orders the cursor by bytes."""
    with contextlib.ExitStack() as stack:
        if made.startswith("by dpone"):
            dsn = stack.enter_context(_icu_database(postgres_schema.dsn))
            postgres_schema = postgres_schema._replace(dsn=dsn)
        _ordered_by_bytes(Target("postgres", tmp_path, postgres_schema), tmp_path, path, made)


def _ordered_by_bytes(target: Target, tmp_path: Path, path: str, made: str) -> None:
    _make(target, f'CREATE SCHEMA "{target.schema.schema}"')
    if made == "collated ICU by hand":
        _make(target, 'CREATE TABLE t (id bigint PRIMARY KEY, r text, ver text COLLATE'
              ' "und-x-icu", s text)')  # fmt: skip
    with _sqlite(tmp_path / "source.db") as db:
        db.execute("CREATE TABLE t (id INTEGER, r TEXT, ver TEXT, s TEXT)")
        db.executemany("INSERT INTO t VALUES (?, 'eu', ?, ?)",
                       [(1, "B", "old"), (2, "C", "older"), (2, "b", "newer")])  # fmt: skip
        db.commit()
    route = write_route(tmp_path, target, table="t", path=path, partition_column="r",
                        cursor_column="ver", primary_key="id")  # fmt: skip
    assert run(route).returncode == 0
    assert target.rows("t", ("id", "ver", "s")) == [(1, "B", "old"), (2, "b", "newer")]
    with _sqlite(tmp_path / "source.db") as db:
        db.execute("INSERT INTO t VALUES (1, 'eu', '\u00e1', 'new')")  # above 'b', the watermark
        db.commit()
    assert run(route).returncode == 0
    assert target.rows("t", ("id", "ver", "s")) == [(1, "\u00e1", "new"), (2, "b", "newer")]


@pytest.mark.parametrize("path", ["legacy", "staged"])
def test_a_sqlite_target_made_without_rowid_merges_on_its_primary_key(tmp_path, path):
    """A ``WITHOUT ROWID`` table has no rowid to delete by: its primary key is used."""
    target = Target("sqlite", tmp_path)
    _make(
        target,
        "CREATE TABLE events (tenant TEXT, id INTEGER, region TEXT, v INTEGER, status TEXT,"
        " PRIMARY KEY (id, tenant)) WITHOUT ROWID",
    )
    source = make_events(tmp_path)
    route = events_route(tmp_path, target, path)
    add(source, ("acme", 1, "eu", 1, "new", False), ("acme", 2, "us", 1, "new", False),
        ("acme", 3, "us", 1, "new", False))  # fmt: skip
    assert run(route).returncode == 0
    add(source, ("acme", 1, "eu", 2, "paid", False), ("acme", 2, "us", 2, "x", True),
        ("acme", 4, "eu", 2, "new", False), ("acme", 3, "us", 0, "stale", False))  # fmt: skip
    assert run(route).returncode == 0, run(route).stderr
    check_target(target, source)
    assert target.rows("events", ("id", "status")) == [(1, "paid"), (3, "new"), (4, "new")]


def test_a_postgres_login_that_may_insert_but_not_delete_is_refused_before_the_target(
    request, tmp_path
):
    """An append needs SELECT and INSERT; a merge also deletes: refused, not blocked."""
    import secrets

    import psycopg

    target = _merging_target(request, tmp_path, "postgres")
    schema, password = target.schema.schema, secrets.token_hex(12)
    role = f"dpone_{secrets.token_hex(6)}"
    _make(target, f"CREATE ROLE {role} LOGIN PASSWORD '{password}'")
    try:
        _make(
            target,
            "CREATE TABLE events (seq bigint, tenant text, id bigint, region text, v bigint,"
            " status text)",
        )
        _make(target, f'GRANT USAGE, CREATE ON SCHEMA "{schema}" TO {role}')
        _make(target, f"GRANT SELECT, INSERT ON events TO {role}")
        parts = psycopg.conninfo.conninfo_to_dict(target.schema.dsn)
        url = f"postgresql://{role}:{password}@{parts['host']}:{parts['port']}/{parts['dbname']}"
        source = make_events(tmp_path)
        add(source, ("acme", 1, "eu", 1, "new", False))
        route = events_route(tmp_path, target, "legacy")
        route.write_text(route.read_text().replace(postgres_url(target.schema.dsn), url))
        done = run(route)
        assert done.returncode == 2, done.stderr
        assert "native_transfer_config_invalid" in done.stderr and "DELETE" in done.stderr
        assert password not in done.stderr and target.rows("events", LOADED) == []
        _make(target, f"GRANT DELETE ON events TO {role}")
        assert run(route).returncode == 0
        check_target(target, source)
    finally:
        _make(target, f"DROP OWNED BY {role}")
        _make(target, f"DROP ROLE {role}")


def test_a_clickhouse_merge_refuses_a_cursor_it_keeps_as_text_before_the_target(tmp_path):
    """A cursor column of no declared type (kind ``any``) is a String in ClickHouse, which
    orders ``10`` before ``9``: refused before the target call (exit 2, nothing created, the
    route not blocked); a cursor ClickHouse orders as the source does merges exactly."""
    target = Target("clickhouse", tmp_path)
    with _sqlite(tmp_path / "source.db") as db:
        db.execute("CREATE TABLE events (id INTEGER PRIMARY KEY, v, n INTEGER, status TEXT)")
        db.executemany(
            "INSERT INTO events VALUES (?, ?, ?, ?)", [(1, "9", 9, "a"), (2, "10", 10, "b")]
        )
        db.commit()
    route = write_route(tmp_path, target, table="events", path="legacy", cursor_column="v")
    done = run(route)
    assert done.returncode == 2, done.stderr
    assert "native_transfer_config_invalid" in done.stderr and "source.cursor_column" in done.stderr
    assert "SELECT" not in done.stderr and not target.exists("events")
    assert target.ledger_rows() == 0
    again = write_route(tmp_path, target, table="events", path="staged", cursor_column="n")
    assert run(again).returncode == 0
    with _sqlite(tmp_path / "source.db") as db:
        db.execute("UPDATE events SET n = 11, status = 'c' WHERE id = 1")
        db.commit()
    assert run(again).returncode == 0
    assert target.rows("events", ("id", "n", "status")) == [(1, 11, "c"), (2, 10, "b")]


def test_a_background_merge_leaves_the_last_clickhouse_batch_countable(tmp_path):
    """Every row of the last batch is its key's highest version, delete markers kept: after
    ``OPTIMIZE ... FINAL`` (a background merge, forced) the batch's rows still add up to
    what its ledger row records, while an older batch's, replaced, no longer do; the merged
    view is unchanged. A source column named like one of dpone's is refused."""
    from dpone_native_transfer.connectors.clickhouse import ClickHouseSink

    target = Target("clickhouse", tmp_path)
    source = make_events(tmp_path)
    route = events_route(tmp_path, target, "legacy")
    add(source, ("acme", 1, "eu", 1, "new", False), ("acme", 2, "us", 1, "new", False),
        ("acme", 1, "eu", 2, "paid", False), ("acme", 3, "us", 1, "new", False))  # fmt: skip
    assert run(route).returncode == 0
    add(source, ("acme", 1, "eu", 3, "shipped", False), ("acme", 2, "us", 2, "", True),
        ("acme", 3, "us", 0, "stale", False), ("acme", 4, "eu", 3, "new", False))  # fmt: skip
    assert run(route).returncode == 0
    merged = target.rows("events", LOADED)
    assert merged == expected(source_rows(source), EVENT_COLUMNS, KEY, "v")
    batches = target.query('SELECT batch_id, rows FROM "_dpone_ledger" ORDER BY seq')
    assert [rows for _, rows in batches] == [4, 3]  # the 'stale' row is below the window
    target.query("OPTIMIZE TABLE events FINAL")
    sink = ClickHouseSink(tmp_path / "chdata", "events")
    (first, _), (last, rows) = batches
    assert sink.batch_rows("_dpone_batch", last) == rows
    assert sink.batch_rows("_dpone_batch", first) == 1  # keys 1 and 2 replaced, merged away
    assert target.query("SELECT count() FROM events WHERE _dpone_deleted = 1") == [(1,)]
    assert target.rows("events", LOADED) == merged
    with _sqlite(source) as db:
        db.execute("ALTER TABLE events ADD COLUMN _dpone_version INTEGER")
        db.commit()
        db.execute("INSERT INTO events VALUES (99, 'acme', 5, 'eu', 4, 'new', 0, 7)")
        db.commit()
    done = run(route)
    assert done.returncode == 2 and "native_transfer_config_invalid" in done.stderr
    assert "'_dpone_version'" in done.stderr and target.rows("events", LOADED) == merged


def test_a_clickhouse_merge_table_meets_a_frozen_schema_contract(tmp_path):
    """dpone's four columns are not the source's, and are not taken as columns the source
    dropped: a route under ``schema_contract = "freeze"`` runs again; a new source column is
    refused before the target."""
    target = Target("clickhouse", tmp_path)
    source = make_events(tmp_path)
    route = events_route(tmp_path, target, "staged", transfer={"schema_contract": "freeze"})
    add(source, ("acme", 1, "eu", 1, "new", False))
    assert run(route).returncode == 0
    add(source, ("acme", 1, "eu", 2, "paid", False), ("acme", 2, "us", 2, "new", False))
    assert run(route).returncode == 0
    check_target(target, source)
    with _sqlite(source) as db:
        db.execute("ALTER TABLE events ADD COLUMN note TEXT")
        db.execute("INSERT INTO events VALUES (9, 'acme', 3, 'eu', 3, 'new', 0, 'n')")
        db.commit()
    done = run(route)
    assert done.returncode == 2 and "note" in done.stderr
    assert "_dpone_" not in done.stderr and target.ledger_rows() == 2


# An existing PostgreSQL or DuckDB table, and whether INSERT ... ON CONFLICT on the key can use
# one of its indexes (``postgres_sink._arbiter``, ``duckdb.sink._upserts``): then the merge
# upserts, else it deletes and inserts.
_COLUMNS = (
    "seq bigint, tenant text, id bigint, region text, v bigint, status text,"
    " note text DEFAULT 'default'"
)
_SHAPES = [
    ("postgres", "the key as primary key, another column with a default", True,
     f"CREATE TABLE events ({_COLUMNS}, PRIMARY KEY (tenant, id))"),
    ("postgres", "a unique index on the key's columns in another order", True,
     f"CREATE TABLE events ({_COLUMNS}); CREATE UNIQUE INDEX ON events (id, tenant)"),
    ("postgres", "a deferrable unique constraint on the key", False,
     f"CREATE TABLE events ({_COLUMNS}, UNIQUE (tenant, id) DEFERRABLE)"),
    ("postgres", "a partial unique index on the key", False,
     f"CREATE TABLE events ({_COLUMNS}); CREATE UNIQUE INDEX ON events (tenant, id) WHERE v > 0"),
    ("postgres", "no index", False, f"CREATE TABLE events ({_COLUMNS})"),
    ("duckdb", "the key as primary key, another column with a default", True,
     f"CREATE TABLE events ({_COLUMNS}, PRIMARY KEY (tenant, id))"),
    ("duckdb", "a unique constraint on the key's columns in another case and order", True,
     f"CREATE TABLE events ({_COLUMNS}, UNIQUE (ID, Tenant)); CREATE INDEX by_v ON events (v)"),
    # delete and insert: after an UPDATE, DuckDB 1.5 refused a key deleted and inserted again
    ("duckdb", "a unique index, not a constraint, on the key", True,
     f"CREATE TABLE events ({_COLUMNS}); CREATE UNIQUE INDEX by_key ON events (tenant, id)"),
    ("duckdb", "no index", False, f"CREATE TABLE events ({_COLUMNS})"),
    ("duckdb", "the key as primary key, a generated column", True,  # an upsert cannot set it
     f"CREATE TABLE events ({_COLUMNS}, twice bigint GENERATED ALWAYS AS (v * 2),"
     " PRIMARY KEY (tenant, id))"),
    ("postgres", "the key as primary key, a generated and an identity column", True,
     f"CREATE TABLE events ({_COLUMNS}, twice bigint GENERATED ALWAYS AS (v * 2) STORED,"
     " made bigint GENERATED ALWAYS AS IDENTITY, PRIMARY KEY (tenant, id))"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("kind", "shape", "upserts", "ddl"), _SHAPES, ids=[f"{k}: {s}" for k, s, _, _ in _SHAPES]
)
def test_an_existing_table_merges_alike_with_or_without_an_index_on_the_key(
    request, tmp_path, kind, shape, upserts, ddl
):
    """Upsert (an arbiter on exactly the key; PostgreSQL: checked at once, whole) or delete
    and insert (any other table): the same rows. A key updated holds the new version and its
    unloaded column's default, as a re-inserted row; a key whose target row is newer (its
    version raised by hand) keeps it against an update and a delete; a key untouched keeps
    what was edited into it."""
    from dpone_native_transfer.connectors import postgres_sink
    from dpone_native_transfer.connectors._sql import TableName
    from dpone_native_transfer.connectors.duckdb import sink as duckdb_sink
    from dpone_native_transfer.payloads import Merge

    target = _merging_target(request, tmp_path, kind)
    _make(target, ddl)
    if kind == "postgres":
        import psycopg

        db = psycopg.connect(target.schema.dsn)
        table, arbiter = TableName(target.schema.schema, "events"), postgres_sink._arbiter
    else:
        import duckdb

        db = duckdb.connect(str(target.folder / "target.duckdb"))
        table, arbiter = TableName(None, "events"), duckdb_sink._upserts
    with contextlib.closing(db):
        assert arbiter(db, table, Merge(key=KEY)) is upserts
        assert arbiter(db, table, Merge(key=("id",))) is False
    source = make_events(tmp_path)
    route = events_route(tmp_path, target, "legacy")
    add(source, ("a", 1, "eu", 5, "new", False), ("a", 2, "us", 5, "new", False),
        ("A", 1, "us", 5, "new", False), ("a", 3, "eu", 5, "new", False),
        ("a", 4, "eu", 5, "new", False))  # fmt: skip
    assert run(route).returncode == 0
    check_target(target, source)
    _make(target, "UPDATE events SET note = 'edited'")
    _make(target, "UPDATE events SET v = 100 WHERE tenant = 'a' AND id IN (2, 3)")
    add(source, ("a", 1, "eu", 6, "paid", False), ("A", 1, "us", 6, "x", True),
        ("a", 2, "eu", 6, "older", False), ("a", 3, "eu", 6, "older", True),
        ("b", 1, "us", 6, "new", False))  # fmt: skip
    done = run(route)
    assert done.returncode == 0, done.stderr
    assert target.rows("events", ("tenant", "id", "v", "status", "note")) == [
        ("a", 1, 6, "paid", "default"), ("a", 2, 100, "new", "edited"),
        ("a", 3, 100, "new", "edited"), ("a", 4, 5, "new", "edited"),
        ("b", 1, 6, "new", "default"),
    ]  # fmt: skip


def test_postgres_merge_upsert_and_delete_insert_leave_the_same_rows(postgres_schema, monkeypatch):
    """``postgres_sink._merge``'s three plans (one ``MERGE`` on PostgreSQL 15 and later, the
    upsert before it, delete and insert without a unique index on the key) on the same
    target rows and batch: several versions of a key, ties, NULL versions, deleted keys, a
    target row newer than the batch, a column the batch lacks, leave the same rows."""
    import psycopg

    from dpone_native_transfer.connectors import postgres_sink
    from dpone_native_transfer.connectors._sql import TableName
    from dpone_native_transfer.payloads import Merge

    schema, merge = postgres_schema.schema, Merge(key=KEY, version="v", deleted="gone")
    target = [  # tenant, id, v, status
        ("a", 1, 5, "old"), ("a", 2, 9, "newer than the batch"), ("a", 3, None, "no version"),
        ("a", 4, 1, "deleted by the batch"), ("a", 5, 7, "kept: its delete is older"),
        ("A", 1, 1, "case"), ("a", 6, 2, "untouched"),
    ]  # fmt: skip
    batch = [  # tenant, id, v, status, gone
        ("a", 1, 6, "x", False), ("a", 1, 8, "y", False), ("a", 1, 8, "z", False),
        ("a", 2, 3, "older", False), ("a", 3, None, "null again", False),
        ("a", 4, 2, "gone", True), ("a", 4, 1, "live but older", False),
        ("a", 5, 6, "gone", True), ("A", 1, None, "null version", None),
        ("b", 1, 1, "new", False), ("b", 2, 1, "new and deleted", True),
    ]  # fmt: skip
    # the first server version that merges by MERGE (this server's is 15 or later); a table
    # without a unique index on the key deletes and inserts whatever the version
    plans = {"merge": postgres_sink.MERGE_SINCE, "upsert": 10**9, "delete_insert": 0}
    found = {}
    with psycopg.connect(postgres_schema.dsn) as db:
        db.execute(f'CREATE SCHEMA "{schema}"')
        for plan, since in plans.items():
            key = "" if plan == "delete_insert" else ", PRIMARY KEY (tenant, id)"
            db.execute(
                f'CREATE TABLE "{schema}".{plan} (tenant text, id integer, v integer,'
                f" status text, note text DEFAULT 'made'{key})"
            )
            with db.cursor() as cursor:
                cursor.executemany(
                    f"INSERT INTO \"{schema}\".{plan} VALUES (%s, %s, %s, %s, 'kept')", target
                )
            db.execute("CREATE TEMP TABLE b (tenant text, id integer, v integer, status text,"
                       " gone boolean)")  # fmt: skip
            with db.cursor() as cursor:
                cursor.executemany("INSERT INTO b VALUES (%s, %s, %s, %s, %s)", batch)
            monkeypatch.setattr(postgres_sink, "MERGE_SINCE", since)
            names = ["tenant", "id", "v", "status", "gone"]
            postgres_sink._merge(db, TableName(schema, plan), TableName(None, "b"), names, merge)
            found[plan] = sorted(db.execute(f'SELECT * FROM "{schema}".{plan}').fetchall())
    assert found["merge"] == found["upsert"] == found["delete_insert"]
    assert found["merge"] == [
        ("A", 1, 1, "case", "kept"),  # the batch's NULL version is the lowest
        ("a", 1, 8, "z", "made"),  # the highest version; a tie by the status, highest first
        ("a", 2, 9, "newer than the batch", "kept"),
        ("a", 3, None, "null again", "made"),  # NULL against NULL: the batch's row
        ("a", 5, 7, "kept: its delete is older", "kept"),
        ("a", 6, 2, "untouched", "kept"),
        ("b", 1, 1, "new", "made"),
    ]


def test_a_postgres_upsert_looks_few_deleted_keys_up_and_counts_many_first(
    request, tmp_path, postgres_schema
):
    """``postgres_sink._delete_plan``: a batch deleting fewer keys than the table has pages
    looks each up in the key's index (hash and merge joins off for that DELETE, on again
    after it); one deleting more counts the winners first. Both merge exactly."""
    import psycopg

    from dpone_native_transfer.connectors import postgres_sink
    from dpone_native_transfer.connectors._merge import upsert_statements
    from dpone_native_transfer.connectors._sql import TableName
    from dpone_native_transfer.payloads import Merge

    target = _merging_target(request, tmp_path, "postgres")
    source = make_events(tmp_path)
    route = events_route(tmp_path, target, "legacy")
    add(source, *[("t", i, "eu", 1, "new", False) for i in range(3000)])
    assert run(route).returncode == 0
    merge = Merge(key=KEY, version="v", deleted="gone")
    table = TableName(postgres_schema.schema, "events")
    with psycopg.connect(postgres_schema.dsn) as db:
        db.execute("CREATE TEMP TABLE few (gone boolean)")
        db.execute("INSERT INTO few SELECT i < 3 FROM generate_series(0, 9) AS i")
        db.execute("CREATE TEMP TABLE many (gone boolean)")
        db.execute("INSERT INTO many SELECT true FROM generate_series(0, 99)")
        pages = db.execute(
            "SELECT pg_relation_size(to_regclass(%s)) / 8192", [table.sql()]
        ).fetchone()[0]
        assert 3 < pages < 50
        few = postgres_sink._delete_plan(db, table, TableName(None, "few"), merge)
        many = postgres_sink._delete_plan(db, table, TableName(None, "many"), merge)
        assert few == (postgres_sink._LOOKUPS, postgres_sink._JOINS)
        assert many == (('ANALYZE "_dpone_merge_winners"',), ())
        statements = upsert_statements('"t"', '"b"', ["tenant", "id", "v", "gone"], merge,
                                       around_delete=few)  # fmt: skip
        at = next(i for i, sql in enumerate(statements) if sql.startswith("DELETE"))
        assert statements[at - 2 : at + 3] == [*few[0], statements[at], *few[1]]
    for version, deleted in ((2, 1), (3, 400)):  # each branch in a guarded run: 1 and 58
        rows = [("t", i, "us", version, "x", i < deleted) for i in range(0, 3000, 7)]
        add(source, *rows)
        assert run(route).returncode == 0
        check_target(target, source)
