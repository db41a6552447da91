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
from dpone_native_transfer.spec import route_key

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


# --- this machine's server under its usual spellings (found by an attacker: 1,000 duplicates) ---


def _hosts_file_loopback_names() -> list[str]:
    """Names other than ``localhost`` that this machine's hosts file maps to a loopback
    address (its own name, ``ip6-localhost``, ...), as resolution answers them now."""
    import ipaddress
    import socket

    names = []
    with open("/etc/hosts") as hosts:
        for line in hosts:
            address, *aliases = line.partition("#")[0].split() or [""]
            try:
                loopback = ipaddress.ip_address(address).is_loopback
            except ValueError:
                continue
            for name in aliases if loopback else ():
                try:
                    resolved = {info[4][0] for info in socket.getaddrinfo(name, None)}
                except OSError:
                    continue
                if name != "localhost" and all(
                    ipaddress.ip_address(a.partition("%")[0]).is_loopback for a in resolved
                ):
                    names.append(name)
    return names


@pytest.mark.parametrize(
    "same",
    [
        "postgresql://ops@127.0.0.1:5432/warehouse",
        "postgresql://ops@127.0.0.2/warehouse",
        "postgresql://ops@[::1]:5432/warehouse",
        "postgresql://ops@[::ffff:127.0.0.1]/warehouse",
        "postgresql://ops@LocalHost/warehouse",
        "postgresql:///warehouse",  # no host: libpq's default unix socket
        "postgresql:///warehouse?host=/var/run/postgresql",  # a socket directory
        "postgresql://%2Ftmp:5432/warehouse",
        "postgresql:///warehouse?hostaddr=127.0.0.1",
        "postgresql://ops@db.invalid/warehouse?hostaddr=127.0.0.1",  # libpq dials the address
        *(f"postgresql://ops@{name}/warehouse" for name in _hosts_file_loopback_names()),
    ],
)
def test_this_machines_server_is_one_location_however_it_is_reached(same: str) -> None:
    base = pg("postgresql://ops@localhost:5432/warehouse").identity()
    assert pg(same).identity() == base


@pytest.mark.parametrize(
    "other",
    [
        "postgresql://ops@localhost:5433/warehouse",
        "postgresql://ops@127.0.0.1/staging",
        "postgresql:///warehouse?host=/var/run/postgresql&port=5433",
        "postgresql://ops@db.invalid/warehouse",  # does not resolve: another machine's, at once
        "postgresql://ops@10.0.0.5/warehouse",
    ],
)
def test_this_machines_other_servers_and_other_machines_stay_apart(other: str) -> None:
    base = pg("postgresql://ops@127.0.0.1:5432/warehouse").identity()
    assert pg(other).identity() != base


def test_a_spelling_of_this_machine_kept_its_location_where_it_was_localhost() -> None:
    """``localhost`` and no host were ``localhost`` before too: their stores need no step."""
    import hashlib

    before = "postgres:" + hashlib.sha256(b"postgres\0localhost:5432/warehouse").hexdigest()[:24]
    for url in ("postgresql://ops@localhost/warehouse", "postgresql:///warehouse"):
        assert pg(url).identity().location == before


def test_a_clickhouse_server_on_this_machine_is_one_location() -> None:
    spellings = ["http://127.0.0.1:8123/analytics", "http://localhost:8123/analytics",
                 "http://[::1]:8123/analytics"]  # fmt: skip
    assert len({ClickHouseSink(url, "t").identity() for url in spellings}) == 1
    assert (
        ClickHouseSink("http://127.0.0.1:8124/analytics", "t").identity()
        != ClickHouseSink(spellings[0], "t").identity()
    )
