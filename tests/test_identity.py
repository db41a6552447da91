"""Route identity: two spellings of one table are one route; equal names elsewhere are not.

Built from the connectors themselves (no server is contacted: an identity is
computed from the configuration), so each engine's own resolution rules are
what is checked: SQLite and DuckDB fold ASCII case, PostgreSQL implies
``public.`` and keeps case, ClickHouse keeps case.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from dpone_native_transfer import DuckDBSink, PostgresSource, SQLiteSink, SQLiteSource
from dpone_native_transfer.connectors.clickhouse import ClickHouseSink
from dpone_native_transfer.identity import route_key

PASSWORD = "CANARY-PASSWORD"


def pg(url: str, table: str = "orders") -> PostgresSource:
    return PostgresSource(url, table, "region")


def test_a_sqlite_file_is_one_location_however_its_path_is_spelled(tmp_path: Path, monkeypatch):
    (tmp_path / "sub").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "sub")
    monkeypatch.chdir(tmp_path)
    spellings = ["sub/t.db", str(tmp_path / "sub" / "t.db"), "./sub/../sub/t.db", "link/t.db"]
    locations = {SQLiteSink(path, "orders").identity().location for path in spellings}
    assert len(locations) == 1
    assert SQLiteSink("other.db", "orders").identity().location not in locations
    assert str(tmp_path) not in locations.pop(), "a location is a digest, not a path"


@pytest.mark.parametrize("sink", [SQLiteSink, DuckDBSink])
def test_file_engines_fold_ascii_case_only(sink, tmp_path: Path) -> None:
    path = tmp_path / "t.db"
    tables = {sink(path, name).identity().table for name in ("Orders_Copy", "ORDERS_COPY")}
    assert tables == {"orders_copy"}
    # "Ärger" and "ÄRGER" are one table to both engines, "ärger" another
    assert sink(path, "ÄRGER").identity() == sink(path, "Ärger").identity()
    assert sink(path, "ärger").identity() != sink(path, "Ärger").identity()


def test_postgres_implies_public_and_keeps_case() -> None:
    url = "postgresql://ops@db.example:5432/warehouse"
    assert pg(url, "orders").identity() == pg(url, "public.orders").identity()
    assert pg(url, "Orders").identity().table == "public.Orders"
    assert pg(url, "sales.orders").identity().table == "sales.orders"


@pytest.mark.parametrize(
    "same",
    [
        "postgresql://ops:" + PASSWORD + "@DB.example/warehouse",
        "postgres://other@db.example:5432/warehouse?sslmode=require",
        "postgresql://db.example/?dbname=warehouse",
        "postgresql:///warehouse?host=db.example&port=5432",
    ],
)
def test_usual_spellings_of_one_postgres_database_are_one_location(same: str) -> None:
    base = pg("postgresql://ops@db.example:5432/warehouse").identity().location
    assert pg(same).identity().location == base
    assert PASSWORD not in pg(same).identity().location


@pytest.mark.parametrize(
    "other",
    [
        "postgresql://ops@db.example:5432/staging",
        "postgresql://ops@db.example:5433/warehouse",
        "postgresql://ops@replica.example:5432/warehouse",
        "postgresql://ops@db.example:5432,replica.example:5432/warehouse",
        "postgresql:///warehouse?host=/var/run/postgresql",
    ],
)
def test_another_postgres_database_is_another_location(other: str) -> None:
    base = pg("postgresql://ops@db.example:5432/warehouse").identity().location
    assert pg(other).identity().location != base


def test_a_postgres_url_without_database_means_the_users_own() -> None:
    assert (
        pg("postgresql://ops@db.example").identity()
        == pg("postgresql://ops@db.example/ops").identity()
    )


def test_clickhouse_keeps_case_and_names_the_database(tmp_path: Path) -> None:
    server = "http://ops:" + PASSWORD + "@ch.example:8123/analytics"
    sink = ClickHouseSink(server, "Orders")
    assert sink.identity().table == "Orders"
    assert sink.identity() != ClickHouseSink("http://ch.example:8123/default", "Orders").identity()
    assert PASSWORD not in sink.identity().location
    chdb = ClickHouseSink(f"chdb:{tmp_path / 'data'}", "Orders").identity()
    assert chdb.location.startswith("chdb:") and str(tmp_path) not in chdb.location


def test_a_route_key_is_located_by_both_ends(tmp_path: Path) -> None:
    source = SQLiteSource(tmp_path / "s.db", "Orders", "region")
    key = route_key(source, SQLiteSink(tmp_path / "t.db", "ORDERS_copy"), "incremental_append")
    assert (key.source_table, key.target_table) == ("orders", "orders_copy")
    assert key.source_location and key.target_location
    assert key.as_dict() == {
        "source_table": "orders",
        "target_table": "orders_copy",
        "strategy": "incremental_append",
    }
    assert os.fspath(tmp_path) not in repr(key.as_record())
