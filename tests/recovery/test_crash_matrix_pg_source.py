"""Hard-kill crash matrix with a PostgreSQL source (issue 47): SIGKILL a real guarded
transfer at every kill point while it reads PostgreSQL in bulk, then recover.

The SQLite-source matrix (``test_crash_matrix.py``, whose route, attempts and checks
this file reuses) covers the targets and paths; here the source is the sample table's
copy in PostgreSQL (``Place(source="postgres")``), on the reads that matrix never runs:

- into DuckDB on file-artifact: ``COPY (SELECT ...) TO STDOUT`` as CSV, converted into
  Arrow files, one per partition (``PostgresSource.write_arrow_files``);
- into PostgreSQL on staged: the source's binary ``COPY`` bytes in one file, copied into
  the stage as they are (``write_copy_file``; the target's columns are the source's types);
- into SQLite on legacy: the rows, partition by partition (SQLite loads no bulk files).

The ``extraction`` kill falls inside the bulk read's ``COPY`` (``CrashPostgresSource``:
after its first block or batch, before it ends), so a child that read otherwise is not
killed there and the case fails. Every kill point x both recoveries: 0 duplicate rows,
0 lost, blocked only where the kill leaves an armed batch, healed from the target's ledger
with ``recovery = "from_target"``, exactly as with a SQLite source.

The cut, for CI's time (``cases``): ``extraction`` on the three routes, each later kill
point (the source read by then) on one of them in turn, per recovery: 22 runs, every route
with both recoveries and most kill points. The whole product, 54 runs, passed once
(docs/reliability.md).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from helpers.crash_child import KILL_POINTS
from helpers.matrix_targets import Place
from helpers.postgres_server import postgres_url
from test_crash_matrix import (
    PARTITIONS,
    RECOVERIES,
    ROWS,
    CrashRoute,
    check_recovery,
    expected,
    recover,
)

from dpone_native_transfer.testing import assert_rows_exactly_once
from dpone_target_commit_guard.policy import blocked_partitions

if TYPE_CHECKING:
    from helpers.crash_report import CrashMatrix

pytest_plugins = ["helpers.crash_report"]

ROUTES = (("duckdb", "file-artifact"), ("postgres", "staged"), ("sqlite", "legacy"))


@pytest.fixture
def pg_source_route(tmp_path: Path, postgres_dsn: str) -> Iterator[Any]:
    """``make(target, path)``: the matrix's route from a PostgreSQL copy of the sample table,
    in a schema of the case's own (the PostgreSQL target's table beside it), dropped after."""
    made: list[Place] = []

    def make(target: str, path: str) -> CrashRoute:
        url, schema = postgres_url(postgres_dsn), f"crash_{os.urandom(6).hex()}"
        place = Place(
            target=target, path=path, folder=str(tmp_path), url=url, schema=schema,
            source="postgres",
        )  # fmt: skip
        made.append(place)
        place.build_source(rows=ROWS, partitions=PARTITIONS)
        return CrashRoute(place=place, store=f"sqlite:{tmp_path / 'checkpoints.db'}", tmp=tmp_path)

    yield make
    for place in made:
        place.drop_postgres_schema()


def cases() -> list[Any]:
    """``extraction`` on every route; each later kill point on one route, turning per
    recovery, so each route meets both recoveries."""
    made = []
    for number, point in enumerate(KILL_POINTS):
        for turn, recovery in enumerate(RECOVERIES):
            routes = ROUTES if point == "extraction" else [ROUTES[(number + turn) % len(ROUTES)]]
            for target, path in routes:
                name = f"{point}-{path}-{target}-{recovery}"
                made.append(pytest.param(point, target, path, recovery, id=name))
    return made


@pytest.mark.parametrize(("kill_point", "target", "path", "recovery"), cases())
def test_hard_kill_of_a_postgres_bulk_read_route_then_retry_never_duplicates(
    kill_point: str,
    target: str,
    path: str,
    recovery: str,
    pg_source_route: Any,
    crash_matrix: CrashMatrix,
) -> None:
    route = pg_source_route(target, path)
    want = expected(kill_point, path)
    with crash_matrix.run(kill_point, path, f"{target} from postgres", "sqlite", recovery) as row:
        route.run_child(kill_point)
        route.check_target(row)
        attempts = recover(route, recovery, row)
        check_recovery(route, want, recovery, attempts, row)
        last = attempts[-1]
        assert last.target_calls == want.target_calls
        assert row.duplicates == 0
        assert len(route.place.source_ids()) == ROWS
        assert_rows_exactly_once(route.place.source_ids(), route.place.target_ids())
        with route.opened_store() as store:
            assert blocked_partitions(store.list_latest(route.route)) == []
            state = store.load_source_state(route.route)
        assert state["generation"] == 1 and state["watermark"] == 1_000_000 + ROWS
