"""``on_bad_value = "quarantine"``: one bad value no longer holds up a whole table.

Ten rows whose REAL column holds ``'N-151'`` stopped the route (exit 2, nothing loaded) until
the source was fixed. Refusing stays the default; quarantined, the clean rows load, the ten
go to ``_dpone_rejects`` in the same transaction as their batch, counted in its ledger row,
and once fixed at the source (a new cursor value) they load, each once.
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
from pathlib import Path

import pytest
from helpers.cli import run_cli
from helpers.routes import PATHS, write_route

from dpone_native_transfer.config import load_route_config

TARGETS = {"duckdb": "target.duckdb", "clickhouse": "chdata"}
BAD = "N-151"


def _spoil(source: Path, ids: range) -> None:
    with contextlib.closing(sqlite3.connect(source)) as db:
        db.executemany("UPDATE orders SET amount = ? WHERE id = ?", [(BAD, i) for i in ids])
        db.commit()


def _fix(source: Path, ids: range) -> None:
    """The rows fixed at the source, their cursor moved on (as an update stamps them)."""
    with contextlib.closing(sqlite3.connect(source)) as db:
        top = db.execute("SELECT max(updated_at) FROM orders").fetchone()[0]
        db.executemany(
            "UPDATE orders SET amount = 1.5, updated_at = ? WHERE id = ?",
            [(top + n, i) for n, i in enumerate(ids, start=1)],
        )
        db.commit()


def _route(tmp_path: Path, kind: str, path: str, **transfer: object) -> Path:
    return write_route(
        tmp_path,
        rows=120,
        path=path,
        kind=kind,
        sections={"transfer": transfer} if transfer else None,
    )


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("kind", sorted(TARGETS))
def test_quarantined_rows_wait_aside_and_load_once_when_fixed(
    kind: str, path: str, tmp_path: Path
) -> None:
    route_file = _route(tmp_path, kind, path, on_bad_value="quarantine")
    _spoil(tmp_path / "source.db", range(1, 11))
    done = run_cli("run", route_file, "--json")
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    assert (summary["rows_loaded"], summary["rows_quarantined"]) == (110, 10)
    config = load_route_config(route_file)
    sink = config.sink
    [entry] = sink.read_ledger()
    assert (entry.rows, entry.rejected) == (110, 10)
    rejects = sink.read_rejects()
    assert len(rejects) == 10 and {row[0] for row in rejects} == {entry.batch_id}
    assert {row[3] for row in rejects} == {"amount"} and {row[5] for row in rejects} == {None}
    assert len({row[2] for row in rejects}) == 10  # a digest per row, never a value
    shown = run_cli("rejects", "show", route_file)
    assert shown.returncode == 0 and "10 rows set aside" in shown.stdout
    assert BAD not in shown.stdout + done.stdout + done.stderr

    again = run_cli("run", route_file, "--json")  # nothing new: nothing set aside again
    assert json.loads(again.stdout)["rows_quarantined"] == 0
    _fix(tmp_path / "source.db", range(1, 11))
    fixed = json.loads(run_cli("run", route_file, "--json").stdout)
    assert (fixed["rows_loaded"], fixed["rows_quarantined"]) == (10, 0)
    ids = sorted(row[0] for row in sink.rows())
    assert ids == list(range(1, 121))


def test_refusing_stays_the_default_and_values_are_kept_only_when_asked(tmp_path: Path) -> None:
    refused_route = _route(tmp_path / "refuse", "duckdb", "legacy")
    _spoil(tmp_path / "refuse" / "source.db", range(1, 11))
    refused = run_cli("run", refused_route)
    assert refused.returncode == 2 and "native_transfer_value_unsupported" in refused.stderr
    assert load_route_config(refused_route).sink.rows() == []

    kept_route = _route(
        tmp_path / "kept", "duckdb", "legacy", on_bad_value="quarantine", quarantine_values=True
    )
    _spoil(tmp_path / "kept" / "source.db", range(1, 4))
    assert run_cli("run", kept_route).returncode == 0
    rejects = load_route_config(kept_route).sink.read_rejects()
    assert [row[5] for row in rejects] == [repr(BAD)] * 3
    shown = run_cli("rejects", "show", kept_route, "--json")
    assert [item["value"] for item in json.loads(shown.stdout)] == [repr(BAD)] * 3


def test_on_postgres_the_rejects_commit_with_their_batch(
    tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    import psycopg
    from helpers.postgres_server import postgres_url
    from helpers.routes import Route

    from dpone_native_transfer import PostgresSink

    location = request.getfixturevalue("postgres_schema")
    with contextlib.closing(psycopg.connect(location.dsn, autocommit=True)) as conn:
        conn.execute(f'CREATE SCHEMA "{location.schema}"')
    sink = PostgresSink(postgres_url(location.dsn), f"{location.schema}.orders_copy")
    route = Route(tmp_path, sink=sink)
    _spoil(route.source_path, range(1, 6))
    result = route.runtime().run(route.spec("staged", on_bad_value="quarantine"))
    assert (result.rows_loaded, result.rows_quarantined) == (115, 5)
    [entry] = sink.read_ledger()
    assert entry.rejected == 5 and len(sink.read_rejects()) == 5
    assert sorted(row[0] for row in sink.rows()) == list(range(6, 121))
