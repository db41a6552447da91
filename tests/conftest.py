"""The fixtures of every test: a small real route (``helpers.routes.Route``), the path
under test, a SQLite store's path, the statements chDB is given, and the PostgreSQL
server of the store tests. What
the tests share that is not a fixture lives in the ``helpers`` package."""

from __future__ import annotations

import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.register_assert_rewrite("helpers")  # before the first import of the package

from helpers import postgres_server  # noqa: E402
from helpers.routes import PATHS, Route  # noqa: E402

pytest_plugins = ["pytester"]


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--shard",
        default=None,
        help="I/N: run only the tests whose node id hashes to shard I of N (tests/shards.py)",
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """With ``--shard I/N``, keep the tests of shard I: each module's tests are dealt to the
    shards in turn, starting at a shard its name hashes to. A module's tests are alike (a
    matrix is one function's parameters), so every shard gets a like share of each: closer
    to even than hashing each test (from one run's durations, the slower of two shards:
    1,285 s against 1,319 s)."""
    shard = config.getoption("--shard")
    if not shard:
        return
    index, count = (int(part) for part in shard.split("/"))
    dealt: dict[str, int] = {}
    kept, dropped = [], []
    for item in items:
        module = item.nodeid.split("::")[0]
        turn = dealt.setdefault(module, zlib.crc32(module.encode()))
        dealt[module] = turn + 1
        (kept if turn % count == index else dropped).append(item)
    config.hook.pytest_deselected(items=dropped)
    items[:] = kept


@pytest.fixture
def route(tmp_path):
    made = Route(tmp_path)
    yield made
    made.real_store.close()


@pytest.fixture(params=PATHS)
def path(request) -> str:
    return request.param


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    """A SQLite store's path in a folder (not created) whose name no store error may show."""
    return tmp_path / "secret-location" / "checkpoints.sqlite3"


@pytest.fixture
def chdb_statements(monkeypatch) -> list[str]:
    """Every statement chDB's client runs (``command``), in order; each still runs."""
    from dpone_native_transfer.connectors.clickhouse import chdb_client

    statements: list[str] = []
    real_command = chdb_client.ChdbClient.command

    def command(self: Any, sql: str, params: Any = None) -> None:
        statements.append(sql)
        real_command(self, sql, params)

    monkeypatch.setattr(chdb_client.ChdbClient, "command", command)
    return statements


@pytest.fixture(scope="session")
def postgres_dsn() -> Iterator[str]:
    """A PostgreSQL server for the session: DPONE_TEST_POSTGRES_DSN, or a throwaway one.

    Started only when a test asks for it; fails (never skips) when there is none.
    """
    with postgres_server.server_dsn() as dsn:
        yield dsn


@pytest.fixture
def postgres_schema(postgres_dsn: str) -> Iterator[postgres_server.PostgresLocation]:
    """The server and a schema of this test's own, dropped after the test."""
    with postgres_server.isolated_schema(postgres_dsn) as location:
        yield location
