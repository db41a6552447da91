"""finalize_staged_load renames the staging table only when that equals copying into the target."""

from __future__ import annotations

import sqlite3

import pytest

from dpone_native_transfer.connectors.sqlite import SQLiteSink
from dpone_native_transfer.payloads import Column, RowChunks

COLUMNS = (Column("id", "INTEGER"), Column("name", "TEXT"), Column('odd"name', ""))


def _schema(path):
    with sqlite3.connect(path) as conn:
        rows = conn.execute("SELECT type, name, sql FROM sqlite_master ORDER BY name").fetchall()
    conn.close()
    return rows


def _finalize(sink, rows, *, replace):
    sink.stage(RowChunks(columns=COLUMNS, chunks=[rows], replace=replace))
    return sink.finalize_staged_load(replace=replace)


@pytest.mark.parametrize("replace", [False, True])
def test_a_new_target_gets_the_staged_rows_and_the_sinks_own_definition(tmp_path, replace):
    path = tmp_path / "t.db"
    sink = SQLiteSink(path, 'ta"rget')
    assert _finalize(sink, [(1, "a", None), (2, "b", b"x")], replace=replace) == 2
    assert sink.rows() == [(1, "a", None), (2, "b", b"x")]
    assert _schema(path) == [
        ("table", 'ta"rget', 'CREATE TABLE "ta""rget" ("id" INTEGER, "name" TEXT, "odd""name")')
    ]


def test_replace_then_append_then_replace(tmp_path):
    sink = SQLiteSink(tmp_path / "t.db", "target")
    _finalize(sink, [(1, "a", None)], replace=False)
    assert _finalize(sink, [(2, "b", None)], replace=True) == 1
    assert _finalize(sink, [(3, "c", None)], replace=False) == 1
    assert sink.rows() == [(2, "b", None), (3, "c", None)]
    assert sink.staged_row_count() == 0


def test_replace_keeps_an_operator_index_and_a_custom_definition(tmp_path):
    path = tmp_path / "t.db"
    with sqlite3.connect(path) as conn:
        conn.execute('CREATE TABLE target (id INTEGER PRIMARY KEY, name TEXT, "odd""name")')
        conn.execute("CREATE INDEX by_name ON target (name)")
        conn.execute("INSERT INTO target VALUES (9, 'old', NULL)")
    conn.close()
    before = _schema(path)
    sink = SQLiteSink(path, "target")
    assert _finalize(sink, [(1, "a", None)], replace=True) == 1
    assert sink.rows() == [(1, "a", None)]
    assert _schema(path) == before
