"""Issue 13: hostile input and hostile environments, each through ``dpone-transfer run``.

Every case is an attack or a new user's mistake that once changed, lost or
forged rows with exit 0; each counts the target's rows against the source.
"""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from helpers import routes

from dpone_native_transfer.testing import build_sample_source

SCRIPT = str(Path(sys.executable).parent / "dpone-transfer")


def route(folder: Path, **values: Any) -> Path:
    """The sample route's file (``helpers.routes``), naming its target kind (sqlite by default)."""
    return routes.write_route(folder, **{"kind": "sqlite", **values})


def run(route_file: Path, *, code: int = 0) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        [SCRIPT, "run", str(route_file), "--quiet"], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == code, done.stdout + done.stderr
    return done


# 1. an append never drops a target table, whatever the spelling of its name ---------------------


@pytest.mark.parametrize("stored", ["Orders_Copy", "ORDERS_COPY"])
def test_an_append_keeps_a_target_table_whose_stored_name_differs_in_case(
    tmp_path: Path, stored: str
) -> None:
    build_sample_source(tmp_path / "source.db", rows=40, partitions=2)
    with contextlib.closing(sqlite3.connect(tmp_path / "target.db")) as target:
        target.execute("ATTACH DATABASE ? AS src", (str(tmp_path / "source.db"),))
        target.execute(f'CREATE TABLE "{stored}" AS SELECT * FROM src.orders WHERE 0')
        target.executemany(
            f'INSERT INTO "{stored}" (id, region, updated_at) VALUES (?, ?, ?)',
            [(9000 + n, "history", n) for n in range(10)],
        )
        target.commit()
    run(route(tmp_path))
    with contextlib.closing(sqlite3.connect(tmp_path / "target.db")) as target:
        ids = sorted(row[0] for row in target.execute("SELECT id FROM orders_copy"))
        tables = [row[0] for row in target.execute("SELECT name FROM sqlite_master")]
    assert ids == list(range(1, 41)) + [9000 + n for n in range(10)]
    assert stored in tables and "orders_copy" not in tables


@pytest.mark.parametrize(
    "table",
    ["_dpone_ledger", "_dpone_stage_orders_copy", "_DPONE_new_orders", "_Dpone_x", "_dpone_fence"],
)
@pytest.mark.parametrize("kind", ["sqlite", "duckdb"])
def test_a_target_named_like_the_runtimes_own_tables_is_a_config_error(
    tmp_path: Path, table: str, kind: str
) -> None:
    """A target ``_dpone_stage_orders_copy`` was dropped as another route's staging table."""
    build_sample_source(tmp_path / "source.db", rows=10, partitions=2)
    target = "target.db" if kind == "sqlite" else "target.duckdb"
    done = run(route(tmp_path, kind=kind, target=target, table=table), code=2)
    assert "reserved for dpone's own tables" in done.stderr
    assert '"key": "target.table"' in done.stderr
    assert not (tmp_path / target).exists()


@pytest.mark.parametrize(
    ("kind", "table", "says"),
    [
        ("sqlite", "sqlite_stat9", "SQLite reserves for its own tables"),
        ("sqlite", "SQLITE_orders", "SQLite reserves for its own tables"),
        ("sqlite", "main.sqlite_sequence", "SQLite reserves for its own tables"),
        ("clickhouse", "o" * 194, "longer than ClickHouse can create"),  # its stage: 207
        pytest.param(  # escaped %C3%A9 each
            "clickhouse", "\u00e9" * 60, "longer than ClickHouse can create", id="utf-8"
        ),
        ("clickhouse", "d" * 200 + ".orders", "longer than ClickHouse can create"),
        ("clickhouse", "_temporary_and_external_tables.orders", "keeps for itself"),
    ],
)
def test_a_target_name_the_engine_refuses_to_create_is_a_config_error_before_any_io(
    tmp_path: Path, kind: str, table: str, says: str
) -> None:
    """Each failed inside the target call (SQLite: 'object name reserved for internal use';
    chDB: 'The max length of table name for database default is 206'), which blocked the
    route; now it is refused as the route file is read, naming target.table."""
    build_sample_source(tmp_path / "source.db", rows=10, partitions=2)
    target = routes.TARGET_FILES[kind]
    done = run(route(tmp_path, kind=kind, target=target, table=table), code=2)
    assert "native_transfer_config_invalid" in done.stderr and says in done.stderr
    assert '"key": "target.table"' in done.stderr
    assert not (tmp_path / target).exists() and not (tmp_path / "checkpoints.db").exists()


def test_the_longest_clickhouse_name_the_refusal_lets_through_is_created(tmp_path: Path) -> None:
    """The limit is ClickHouse's own: one character less than refused loads (and stages)."""
    build_sample_source(tmp_path / "source.db", rows=10, partitions=2)
    run(route(tmp_path, kind="clickhouse", target="chdata", table="o" * 193))


# 3. the route scan's summaries never diverge from the payloads -----------------------------------


def _blocked_payload(payload: str) -> str:
    """The same checkpoint, as a run whose target outcome is unknown leaves it."""
    record = json.loads(payload)
    record["status"] = "failed"
    record["diagnostics"]["target_commit_guard"]["phase"] = "target_outcome_unknown"
    return json.dumps(record, sort_keys=True)


def test_an_upsert_with_a_new_seq_and_a_stale_summary_cannot_hide_a_guard(tmp_path: Path) -> None:
    """A foreign writer moved seq and payload but left the summary: run proceeded, scan blocked."""
    build_sample_source(tmp_path / "source.db", rows=40, partitions=2)
    route_file = route(tmp_path, path="legacy")
    run(route_file)
    with contextlib.closing(sqlite3.connect(tmp_path / "checkpoints.db")) as store:
        rows = store.execute("SELECT rowid, payload FROM checkpoint_latest").fetchall()
        for rowid, payload in rows:
            store.execute(
                "UPDATE checkpoint_latest SET seq = seq + 1000, payload = ? WHERE rowid = ?",
                (_blocked_payload(payload), rowid),
            )
        store.commit()
        statuses = {row[0] for row in store.execute("SELECT status FROM checkpoint_latest")}
    assert statuses == {"failed"}, "the summary follows the payload"
    build_sample_source(tmp_path / "source.db", rows=10, partitions=2, start_id=100)
    done = run(route_file, code=3)
    assert "native_transfer_manual_reconciliation_required" in done.stderr
    scan = subprocess.run(
        [SCRIPT, "guard", "scan", str(route_file)], capture_output=True, text=True, timeout=60
    )
    assert scan.returncode == 3, "the scan and the run agree"


def test_a_payload_holding_a_key_twice_is_refused_by_the_store(tmp_path: Path) -> None:
    """SQLite's JSON reads the first of two keys and Python the last: such a row is refused."""
    build_sample_source(tmp_path / "source.db", rows=40, partitions=2)
    route_file = route(tmp_path, path="legacy")
    run(route_file)
    with contextlib.closing(sqlite3.connect(tmp_path / "checkpoints.db")) as store:
        (payload,) = store.execute("SELECT payload FROM checkpoint_latest LIMIT 1").fetchone()
        blocked = _blocked_payload(payload)
        committed_guard = json.dumps(json.loads(payload)["diagnostics"]["target_commit_guard"])
        forged = blocked.replace(
            '"target_commit_guard": ', f'"target_commit_guard": {committed_guard}, '
            '"target_commit_guard": ', 1,
        )  # fmt: skip
        assert forged.count('"target_commit_guard"') == 2
        for statement in (
            "UPDATE checkpoint_latest SET payload = ?",
            "INSERT INTO checkpoint_latest (source_table, target_table, strategy, partition_id,"
            " seq, payload) VALUES ('a', 'b', 'incremental_append', 'p', 1, ?)",
        ):
            with pytest.raises(sqlite3.IntegrityError, match="holds a key twice"):
                store.execute(statement, (forged,))
    run(route_file)  # untouched: the route is healthy, its next run loads nothing new


def test_a_checkpoint_read_with_a_key_twice_is_corrupt_not_read_either_way() -> None:
    from dpone_native_transfer import CheckpointStoreCorrupt, RouteKey
    from dpone_native_transfer.stores._records import decode_checkpoint

    text = '{"status": "committed", "status": "failed"}'
    with pytest.raises(CheckpointStoreCorrupt, match="holds a key twice"):
        decode_checkpoint(RouteKey("a", "b", "incremental_append"), "p", 1, text)


# 5. file-artifact: the sink loads exactly the verified bytes, from a private folder -------------


def test_a_planted_symlink_in_a_shared_artifact_dir_is_never_followed(tmp_path: Path) -> None:
    """Planted ``p-<id>.rows`` symlinks made a run overwrite the files they point at."""
    build_sample_source(tmp_path / "source.db", rows=40, partitions=2)
    shared = tmp_path / "shared"
    text = route(tmp_path, path="file-artifact").read_text(encoding="utf-8")
    route_file = tmp_path / "route.toml"
    route_file.write_text(text.replace("[store]", 'artifact_dir = "shared"\n\n[store]'), "utf-8")
    run(route_file)  # learn the partition ids the next identical run will use
    with contextlib.closing(sqlite3.connect(tmp_path / "checkpoints.db")) as store:
        ids = [row[0] for row in store.execute("SELECT partition_id FROM checkpoint_latest")]
    for name in ("target.db", "checkpoints.db", "checkpoints.db-wal", "checkpoints.db-shm"):
        (tmp_path / name).unlink(missing_ok=True)
    victim = tmp_path / "victim.txt"
    victim.write_text("precious", encoding="utf-8")
    planted = sorted(f"{pid}.rows" for pid in ids)
    for name in planted:
        (shared / name).symlink_to(victim)
    run(route_file)
    assert victim.read_text(encoding="utf-8") == "precious"
    with contextlib.closing(sqlite3.connect(tmp_path / "target.db")) as target:
        counts = target.execute("SELECT count(*), count(DISTINCT id) FROM orders_copy").fetchone()
    assert counts == (40, 40)
    assert sorted(p.name for p in shared.iterdir()) == planted, "nothing written beside them"


@pytest.mark.parametrize("path", ["file-artifact", "legacy"])
def test_a_file_replaced_after_its_check_is_never_loaded(tmp_path: Path, path: str) -> None:
    """The digest was checked before the target call, the file read after it: a file
    replaced in that window committed forged rows. The sink now reads what was hashed."""
    from dpone_native_transfer import (
        ArtifactInvalid,
        SQLiteCheckpointStore,
        SQLiteSink,
        SQLiteSource,
        TransferRuntime,
        TransferSpec,
    )
    from dpone_native_transfer.artifacts import write_chunks
    from dpone_native_transfer.testing import RecordingSink

    build_sample_source(tmp_path / "source.db", rows=40, partitions=2)
    work = tmp_path / "work"

    def forge() -> None:  # at the start of the target call, swap every spool file's rows
        for file in work.glob("dpone-transfer-*/*"):
            with open(file, "wb") as handle:
                write_chunks(handle, [[(9999, "forged", 1.0, 1)]])

    sink = RecordingSink(SQLiteSink(tmp_path / "target.db", "orders_copy"), observe=forge)
    spec = TransferSpec(
        source=SQLiteSource(tmp_path / "source.db", "orders", "region", "updated_at"),
        sink=sink, strategy="incremental_append", path=path, run_id="r", artifact_dir=str(work),
    )  # fmt: skip
    with SQLiteCheckpointStore(tmp_path / "checkpoints.db") as store:
        with pytest.raises(ArtifactInvalid, match="changed after it was written"):
            TransferRuntime(store).run(spec)
    assert sink.inner.rows() == [], "no forged row, and the load was rolled back whole"
    assert list(work.iterdir()) == [], "the private folder is removed after a failed run too"


# 2. lazy-plan never lets another engine filter a collated source column ------------------------


@pytest.mark.parametrize("collation", ["NOCASE", "RTRIM"])
@pytest.mark.parametrize("kind", ["duckdb", "clickhouse"])
def test_lazy_plan_carries_a_collated_partition_column_and_loads_every_row(
    tmp_path: Path, collation: str, kind: str
) -> None:
    """DuckDB and ClickHouse re-evaluated SQLite partition predicates with their own
    comparison: 20 of 30 rows were lost, checkpoints committed, exit 0. Then such a plan
    was refused (exit 2) where the other paths load every row; now lazy-plan carries the
    rows itself, as legacy does."""
    spellings = ["East", "east", "EAST"] if collation == "NOCASE" else ["East", "East ", "East  "]
    with contextlib.closing(sqlite3.connect(tmp_path / "source.db")) as source:
        source.execute(
            f"CREATE TABLE orders (id INTEGER PRIMARY KEY, region TEXT COLLATE {collation},"
            " amount REAL, updated_at INTEGER)"
        )
        source.executemany(
            "INSERT INTO orders VALUES (?, ?, 1.0, ?)",
            [(n, spellings[n % 3], 1000 + n) for n in range(1, 31)],
        )
        source.commit()
    location = "target.duckdb" if kind == "duckdb" else "target-chdb"  # chDB: a data folder
    carried = run(route(tmp_path, kind=kind, target=location, path="lazy-plan"))
    assert "loaded 30 rows" in carried.stdout
    sink = routes.make_sink(kind, tmp_path / location)
    assert sorted(row[0] for row in sink.rows()) == list(range(1, 31))


# wrong codes: what retrying cannot fix exits 2, with a clear message, before any write --------


def _mistakes(tmp_path: Path) -> dict[str, tuple[Path, list[str]]]:
    def made(name: str, **values: Any) -> Path:
        folder = tmp_path / name
        folder.mkdir()
        build_sample_source(folder / "source.db", rows=20, partitions=2)
        return route(folder, path="legacy", **values)

    cases: dict[str, tuple[Path, list[str]]] = {}
    file = made("missing-source")
    file.write_text(file.read_text().replace('path = "source.db"', 'path = "gone.db"'))
    cases["missing source file"] = (file, [f"{file.parent / 'gone.db'} for table"])
    file = made("wrong-table")
    file.write_text(file.read_text().replace('table = "orders"', 'table = "orderz"'))
    cases["wrong table"] = (file, ["source table 'orderz' does not exist"])
    file = made("wrong-column")
    file.write_text(file.read_text().replace('"region"', '"regoin"'))
    cases["wrong partition column"] = (file, ["partition column 'regoin' does not exist"])
    file = made("huge-chunks")
    huge = "chunk_rows = 9223372036854775808\n[store]"
    file.write_text(file.read_text().replace("[store]", huge))
    cases["chunk_rows of 2**63"] = (file, ["an integer from 1 to 10,000,000"])
    file = made("store-folder")
    (file.parent / "checkpoints.db").mkdir()
    cases["a folder as the store"] = (file, ["is a folder, not a store file"])
    file = made("nested")
    file.write_text("[source]\nx = " + "[" * 5000 + "]" * 5000 + "\n")
    cases["a deeply nested route file"] = (file, ["nest too deeply"])
    file = made("blob")
    with contextlib.closing(sqlite3.connect(file.parent / "source.db")) as source:
        source.execute("UPDATE orders SET region = CAST(region AS BLOB)")
        source.commit()
    cases["BLOB partition values"] = (file, ["holds a BLOB value"])
    return cases


def test_configuration_mistakes_exit_2_with_a_clear_message_and_write_nothing(
    tmp_path: Path,
) -> None:
    for name, (route_file, words) in _mistakes(tmp_path).items():
        done = run(route_file, code=2)
        assert "Traceback" not in done.stderr, name
        for word in words:
            assert word in done.stderr, (name, done.stderr)
        assert not (route_file.parent / "target.db").exists(), name


def test_a_misspelled_route_is_an_error_listing_the_known_routes(tmp_path: Path) -> None:
    build_sample_source(tmp_path / "source.db", rows=20, partitions=2)
    run(route(tmp_path, path="legacy"))
    done = subprocess.run(
        [SCRIPT, "guard", "scan", "--store", str(tmp_path / "checkpoints.db"),
         "--route", "order", "orders_copy", "incremental_append"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2
    assert "holds no route order -> orders_copy" in done.stderr
    assert "its routes: orders -> orders_copy (incremental_append)" in done.stderr


# output: a closed pipe, long diagnostics, forged audit text ------------------------------------


def _blocked_route(tmp_path: Path, partitions: int) -> Path:
    """A route whose last attempt committed in the target and then died: every partition
    blocks as of unknown outcome."""
    from dpone_native_transfer import SQLiteCheckpointStore, TransferRuntime
    from dpone_native_transfer.config import load_route_config
    from dpone_native_transfer.testing import InjectedFault, RecordingSink

    build_sample_source(tmp_path / "source.db", rows=partitions * 2, partitions=partitions)
    route_file = route(tmp_path, path="legacy")
    config = load_route_config(route_file)
    with SQLiteCheckpointStore(config.store_path) as store:
        sink = RecordingSink(config.sink, fail="after")
        with pytest.raises(InjectedFault):
            TransferRuntime(store).run(config.spec("dies", sink=sink))
    return route_file


def test_a_route_blocked_on_90_partitions_prints_a_line_per_batch_and_json_all(
    tmp_path: Path,
) -> None:
    """One 20 KB line of every partition buried the line a person needs (in an Airflow log)."""
    route_file = _blocked_route(tmp_path, 90)
    done = run(route_file, code=3)
    lines = done.stderr.splitlines()
    assert len(done.stderr) < 3000 and not any(x.startswith("diagnostics:") for x in lines)
    batches = [x for x in lines if x.startswith("  batch ")]
    assert len(batches) == 1 and "90 partitions" in batches[0], lines
    machine = subprocess.run(
        [SCRIPT, "run", str(route_file), "--json"], capture_output=True, text=True, timeout=120
    )
    assert machine.returncode == 3
    assert len(json.loads(machine.stdout)["diagnostics"]["partitions"]) == 90


def test_a_closed_output_pipe_changes_neither_the_outcome_nor_the_exit_status(
    tmp_path: Path,
) -> None:
    build_sample_source(tmp_path / "source.db", rows=40, partitions=2)
    route_file = route(tmp_path, path="legacy")
    read_end, write_end = os.pipe()
    os.close(read_end)  # nobody reads: every write is a broken pipe
    try:
        done = subprocess.run(
            [SCRIPT, "run", str(route_file)], stdout=write_end, stderr=write_end, timeout=120
        )
    finally:
        os.close(write_end)
    assert done.returncode == 0
    with contextlib.closing(sqlite3.connect(tmp_path / "target.db")) as target:
        assert target.execute("SELECT count(*) FROM orders_copy").fetchone() == (40,)


def test_audit_text_is_stored_as_given_and_printed_escaped(tmp_path: Path) -> None:
    route_file = _blocked_route(tmp_path, 2)
    forged = "checked\n  #99 2026-01-01 root resolved 1000 partitions as committed: ok\x1b[2J"
    with contextlib.closing(sqlite3.connect(tmp_path / "checkpoints.db")) as store:
        (batch,) = store.execute(
            "SELECT DISTINCT guard ->> '$.checkpoint_batch_id' FROM checkpoint_latest"
        ).fetchone()
    resolved = subprocess.run(
        [SCRIPT, "guard", "resolve", str(route_file), "--batch", batch, "--as", "committed",
         "--reason", forged, "--operator", "eve\r\nmallory", "--yes"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert resolved.returncode == 0, resolved.stdout + resolved.stderr
    with contextlib.closing(sqlite3.connect(tmp_path / "checkpoints.db")) as store:
        store.execute(  # a record written by hand, without any of its keys
            "INSERT INTO audit (source_table, target_table, strategy, source_location,"
            " target_location, record) SELECT source_table, target_table, strategy,"
            " source_location, target_location, '{}' FROM audit WHERE audit_id = 1"
        )
        store.commit()
        (record,) = store.execute("SELECT record FROM audit WHERE audit_id = 1").fetchone()
    assert json.loads(record)["reason"] == forged, "stored as given"
    shown = subprocess.run(
        [SCRIPT, "guard", "show", str(route_file)], capture_output=True, text=True, timeout=60
    )
    assert shown.returncode in (0, 3), shown.stderr
    assert "\x1b" not in shown.stdout and "\r" not in shown.stdout
    assert "#99" not in [line.strip()[:3] for line in shown.stdout.splitlines()]
    assert "checked\\n  #99" in shown.stdout and "eve\\r\\nmallory" in shown.stdout
    assert "audit: 2 records, 1 malformed" in shown.stdout  # not a repair of nothing
    assert "  #2 malformed audit record: at, forced_invalid, operator, partitions, reason, " in (
        shown.stdout
    )


def test_a_cursor_column_of_mixed_kinds_is_refused_naming_it(tmp_path: Path) -> None:
    """One TEXT value among INTEGERs became the watermark and stalled the route."""
    build_sample_source(tmp_path / "source.db", rows=20, partitions=2)
    with contextlib.closing(sqlite3.connect(tmp_path / "source.db")) as source:
        source.execute("UPDATE orders SET updated_at = 'soon' WHERE id = 7")
        source.commit()
    done = run(route(tmp_path, path="legacy"), code=2)
    assert "cursor column 'updated_at'" in done.stderr and "numbers and text" in done.stderr
    assert not (tmp_path / "target.db").exists()


def test_the_folder_a_killed_attempt_left_is_removed_by_the_next_run_on_its_table(
    tmp_path: Path,
) -> None:
    """A SIGKILLed legacy run left its spool (15 MB per 210k rows) behind forever."""
    build_sample_source(tmp_path / "source.db", rows=40, partitions=2)
    text = route(tmp_path, path="legacy").read_text(encoding="utf-8")
    route_file = tmp_path / "route.toml"
    route_file.write_text(
        text.replace("[store]", 'artifact_dir = "work"\n\n[store]\nlease_seconds = 1'), "utf-8"
    )
    work = tmp_path / "work"
    observed: list[list[str]] = []
    from dpone_native_transfer.config import load_route_config

    config = load_route_config(route_file)
    from dpone_native_transfer import SQLiteCheckpointStore, TransferRuntime
    from dpone_native_transfer.testing import RecordingSink

    sink = RecordingSink(config.sink, observe=lambda: observed.append(os.listdir(work)))
    with SQLiteCheckpointStore(config.store_path) as store:
        TransferRuntime(store, lease_seconds=1).run(config.spec("learn", sink=sink))
    (name,) = observed[0]  # the attempt's own folder, named for its target table and process
    prefix = "-".join(name.split("-")[:3])  # dpone-transfer-<table>
    dead = work / f"{prefix}-killed"  # a name that says nothing of its process: idle rule
    dead.mkdir()
    (dead / "legacy.spool").write_bytes(b"x" * 1000)
    old = time.time() - 60
    for path in (dead / "legacy.spool", dead):
        os.utime(path, (old, old))
    fresh = work / f"{prefix}-running-elsewhere"  # recent: maybe another store's attempt
    fresh.mkdir()
    other = work / "dpone-transfer-0123456789ab-other-table"
    other.mkdir()
    os.utime(other, (old, old))
    machine = name.split("-")[3].split(".")[0]  # this machine's part of the name
    gone = work / f"{prefix}-{machine}.999999999.1-recent"  # a dead process here: at once
    gone.mkdir()
    alive = work / f"{prefix}-{machine}.{os.getpid()}.{_started()}-paused"  # a live one: kept
    alive.mkdir()
    os.utime(alive, (old, old))
    build_sample_source(tmp_path / "source.db", rows=10, partitions=2, start_id=100)
    run(route_file)
    assert sorted(os.listdir(work)) == sorted([fresh.name, other.name, alive.name])


def _started() -> str:
    with open("/proc/self/stat", encoding="ascii") as stat:
        return stat.read().rpartition(")")[2].split()[19]


@pytest.mark.parametrize("path", ["legacy", "staged", "file-artifact", "lazy-plan"])
def test_target_ddl_takes_the_parsed_type_name_never_the_sources_text(
    tmp_path: Path, path: str
) -> None:
    """A declared type reported verbatim ('REAL DEFAULT (42)', 'INTEGER REFERENCES t (id)',
    CHECK, GENERATED ALWAYS AS) was copied into the target's CREATE TABLE."""
    with contextlib.closing(sqlite3.connect(tmp_path / "source.db")) as source:
        source.execute(
            "CREATE TABLE orders (id INTEGER PRIMARY KEY, region TEXT, updated_at INTEGER,"
            ' a "REAL DEFAULT (42)", b "INTEGER GENERATED ALWAYS AS (1)",'
            ' c "INTEGER REFERENCES orders (id)", d "TEXT CHECK (d = 0)")'
        )
        source.executemany(
            "INSERT INTO orders VALUES (?, ?, ?, ?, ?, ?, ?)",
            [(n, f"r{n % 2}", n, n * 0.5, n * 10, n, f"t{n}") for n in range(1, 21)],
        )
        source.commit()
    run(route(tmp_path, path=path))
    with contextlib.closing(sqlite3.connect(tmp_path / "target.db")) as target:
        (ddl,) = target.execute(
            "SELECT sql FROM sqlite_master WHERE name = 'orders_copy'"
        ).fetchone()
        rows = target.execute("SELECT id, a, b, c, d FROM orders_copy ORDER BY id").fetchall()
    for word in ("DEFAULT", "GENERATED", "REFERENCES", "CHECK"):
        assert word not in ddl.upper(), ddl
    assert rows == [(n, n * 0.5, n * 10, n, f"t{n}") for n in range(1, 21)]


_PARTITION_TYPES = {
    "DATE": lambda n: f"2024-01-0{n % 3 + 1}",
    "TIMESTAMP": lambda n: f"2024-01-01 0{n % 3}:00:00",
    "TEXT": lambda n: f"r{n % 3}",
    "INTEGER": lambda n: n % 3,
    "REAL": lambda n: n % 3 + 0.5,
    "BOOLEAN": lambda n: n % 2,
}


@pytest.mark.parametrize("decltype", sorted(_PARTITION_TYPES))
@pytest.mark.parametrize("path", ["legacy", "staged", "file-artifact", "lazy-plan"])
def test_common_partition_column_types_load_every_row_into_duckdb(
    tmp_path: Path, decltype: str, path: str
) -> None:
    """DuckDB lazy-plan failed on a DATE partition column (DATE compared with VARCHAR)."""
    value = _PARTITION_TYPES[decltype]
    with contextlib.closing(sqlite3.connect(tmp_path / "source.db")) as source:
        source.execute(
            f"CREATE TABLE orders (id INTEGER PRIMARY KEY, region {decltype}, updated_at INTEGER)"
        )
        source.executemany(
            "INSERT INTO orders VALUES (?, ?, ?)", [(n, value(n), 100 + n) for n in range(30)]
        )
        source.commit()
    done = run(route(tmp_path, kind="duckdb", target="t.duckdb", path=path))
    assert "loaded 30 rows" in done.stdout
    import duckdb

    with contextlib.closing(duckdb.connect(str(tmp_path / "t.duckdb"), read_only=True)) as db:
        ids = sorted(row[0] for row in db.execute("SELECT id FROM orders_copy").fetchall())
    assert ids == list(range(30))


def test_lazy_plan_refuses_a_typed_column_whose_text_duckdb_would_not_match(
    tmp_path: Path,
) -> None:
    """A DATE column holding '2024-01-05 ' and '2024-1-6': DuckDB's reading differs from the
    stored text, so lazy-plan carries the rows instead of losing some, and refuses them as
    the row paths do: a DATE column is carried as ISO dates only."""
    with contextlib.closing(sqlite3.connect(tmp_path / "source.db")) as source:
        source.execute("CREATE TABLE orders (id INTEGER PRIMARY KEY, region DATE, updated_at INT)")
        spellings = ["2024-01-05", "2024-01-05 ", "2024-1-6"]
        source.executemany(
            "INSERT INTO orders VALUES (?, ?, ?)", [(n, spellings[n % 3], n) for n in range(30)]
        )
        source.commit()
    for path in ("lazy-plan", "staged"):
        done = run(route(tmp_path, kind="duckdb", target="t.duckdb", path=path), code=2)
        assert "native_transfer_value_unsupported: column 'region'" in done.stderr


@pytest.mark.parametrize("watermark", [{"a": 1}, [1, 2], True])
def test_a_stored_watermark_that_is_no_plain_value_is_a_store_error_not_a_source_one(
    tmp_path: Path, watermark: Any
) -> None:
    """It was passed to the source's SQL and reported as the source failing."""
    build_sample_source(tmp_path / "source.db", rows=20, partitions=2)
    route_file = route(tmp_path, path="legacy")
    run(route_file)
    state = json.dumps({"generation": 1, "watermark": watermark})
    with contextlib.closing(sqlite3.connect(tmp_path / "checkpoints.db")) as store:
        store.execute("UPDATE source_state SET state = ?", (state,))
        store.commit()
    done = run(route_file, code=1)
    assert "native_transfer_checkpoint_store_corrupt" in done.stderr
    assert '"field": "watermark"' in done.stderr


def test_another_sqlite_database_given_as_the_store_is_a_config_error(tmp_path: Path) -> None:
    build_sample_source(tmp_path / "source.db", rows=20, partitions=2)
    route_file = route(tmp_path, path="legacy")
    build_sample_source(tmp_path / "checkpoints.db", rows=5, partitions=1)  # a user's database
    done = run(route_file, code=2)
    assert "another SQLite database, not a checkpoint store" in done.stderr
    assert not (tmp_path / "target.db").exists()
    with contextlib.closing(sqlite3.connect(tmp_path / "checkpoints.db")) as db:
        names = [row[0] for row in db.execute("SELECT name FROM sqlite_master")]
    assert names == ["orders"], "the database is left as it was"


def test_ctrl_c_exits_130_saying_interrupted_and_the_rerun_loads_every_row_once(
    tmp_path: Path,
) -> None:
    import signal

    # Indexed: each partition is read on its own, so its progress line comes as it is read and
    # most of the run is still ahead (one scan would report them all at the end, just before
    # a short load: the run could finish before the signal is sent).
    build_sample_source(tmp_path / "source.db", rows=200_000, partitions=40)
    with contextlib.closing(sqlite3.connect(tmp_path / "source.db")) as db:
        db.execute("CREATE INDEX orders_by_region ON orders (region)")
    route_file = route(tmp_path, path="legacy")
    # A shell starts a background job with SIGINT ignored, and Python then installs no
    # KeyboardInterrupt handler: a worker inheriting that would finish with exit 0. A console
    # user's Ctrl-C reaches a process with the default disposition; so does this worker.
    worker = subprocess.Popen(
        [SCRIPT, "run", str(route_file)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )  # fmt: skip
    assert worker.stderr is not None
    first = worker.stderr.readline()  # the first partition's progress line: mid-extraction
    assert first.startswith("[1/40]"), first
    worker.send_signal(signal.SIGINT)
    _, rest = worker.communicate(timeout=120)
    assert worker.returncode == 130, rest
    assert "error: interrupted" in rest and "Traceback" not in rest
    assert "before the target was called: nothing was written; a rerun is safe" in rest
    time.sleep(0.1)
    run(route_file)
    with contextlib.closing(sqlite3.connect(tmp_path / "target.db")) as target:
        counts = target.execute("SELECT count(*), count(DISTINCT id) FROM orders_copy").fetchone()
    assert counts == (200_000, 200_000)


@pytest.mark.parametrize("ignored", [False, True])
def test_sigterm_ends_a_run_as_ctrl_c_does_leaving_no_rows_in_tmp_and_no_lease(
    tmp_path: Path, ignored: bool
) -> None:
    """What a scheduler, ``timeout`` or Kubernetes sends. It used to kill the worker where it
    stood: its work folder of source rows stayed in the temp folder, and its lease held the
    table until it expired. Now: exit 143, the folder removed, and a rerun at once loads every
    row exactly once. A worker started with SIGTERM ignored still ignores it."""
    import signal

    build_sample_source(tmp_path / "source.db", rows=200_000, partitions=40)
    with contextlib.closing(sqlite3.connect(tmp_path / "source.db")) as db:
        db.execute("CREATE INDEX orders_by_region ON orders (region)")  # see the Ctrl-C test
    route_file = route(tmp_path, path="legacy")
    temp = tmp_path / "tmp"
    temp.mkdir()
    disposition = signal.SIG_IGN if ignored else signal.SIG_DFL
    worker = subprocess.Popen(
        [SCRIPT, "run", str(route_file)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, env={**os.environ, "TMPDIR": str(temp)},
        preexec_fn=lambda: signal.signal(signal.SIGTERM, disposition),
    )  # fmt: skip
    assert worker.stderr is not None
    first = worker.stderr.readline()  # the first partition's progress line: mid-extraction
    assert first.startswith("[1/40]"), first
    assert [folder.name[:15] for folder in temp.iterdir()] == ["dpone-transfer-"]
    worker.send_signal(signal.SIGTERM)
    _, rest = worker.communicate(timeout=120)
    assert "Traceback" not in rest
    if ignored:
        assert worker.returncode == 0, rest
    else:
        assert worker.returncode == 143, rest
        assert "error: terminated (SIGTERM)" in rest
        assert list(temp.iterdir()) == []
        run(route_file)  # at once: the lease was released
    with contextlib.closing(sqlite3.connect(tmp_path / "target.db")) as target:
        counts = target.execute("SELECT count(*), count(DISTINCT id) FROM orders_copy").fetchone()
    assert counts == (200_000, 200_000)


# schema-qualified target tables mean schema.table on every engine, never a dotted name ----------


@pytest.mark.parametrize("path", ["legacy", "staged", "file-artifact", "lazy-plan"])
def test_a_duckdb_target_in_a_schema_is_that_schemas_table(tmp_path: Path, path: str) -> None:
    """``raw.t_copy`` once created a table literally named "raw.t_copy" in schema main."""
    import duckdb

    build_sample_source(tmp_path / "source.db", rows=40, partitions=4)
    duck = dict(kind="duckdb", target="t.duckdb", path=path)
    assert "loaded 40 rows" in run(route(tmp_path, table="raw.t_copy", **duck)).stdout
    with contextlib.closing(duckdb.connect(str(tmp_path / "t.duckdb"))) as db:
        tables = db.execute("SELECT schema_name, table_name FROM duckdb_tables()").fetchall()
        dpone = [("main", "_dpone_fence"), ("main", "_dpone_ledger")]
        assert sorted(tables) == [*dpone, ("raw", "t_copy")]
    # the same table respelled (case, quotes) is the same route: nothing is loaded twice
    for spelling in ('RAW."T_COPY"', '"raw"."t_copy"'):
        done = run(route(tmp_path, table=spelling.replace('"', '\\"'), **duck))
        assert "loaded 0 rows" in done.stdout, spelling
    with contextlib.closing(duckdb.connect(str(tmp_path / "t.duckdb"), read_only=True)) as db:
        assert db.execute("SELECT count(*), count(DISTINCT id) FROM raw.t_copy").fetchone() == (
            40,
            40,
        )


def test_a_quoted_dotted_name_is_one_table_and_main_is_the_default_schema(tmp_path: Path) -> None:
    import duckdb

    build_sample_source(tmp_path / "source.db", rows=10, partitions=2)
    duck = dict(kind="duckdb", target="t.duckdb")
    assert "loaded 10 rows" in run(route(tmp_path, table='\\"raw.t\\"', **duck)).stdout
    assert "loaded 0 rows" in run(route(tmp_path, table='main.\\"raw.t\\"', **duck)).stdout
    with contextlib.closing(duckdb.connect(str(tmp_path / "t.duckdb"), read_only=True)) as db:
        names = db.execute("SELECT schema_name, table_name FROM duckdb_tables()").fetchall()
    assert ("main", "raw.t") in names and not any(schema == "raw" for schema, _ in names)


def test_sqlite_which_has_no_schemas_refuses_a_qualified_target_before_any_io(
    tmp_path: Path,
) -> None:
    build_sample_source(tmp_path / "source.db", rows=10, partitions=2)
    done = run(route(tmp_path, table="raw.t_copy"), code=2)
    assert "names a schema" in done.stderr and '"key": "target.table"' in done.stderr
    assert not (tmp_path / "target.db").exists()
    assert "loaded 10 rows" in run(route(tmp_path, table="main.t_copy")).stdout


@pytest.mark.parametrize("path", ["legacy", "staged", "file-artifact", "lazy-plan"])
@pytest.mark.parametrize("strategy", ["incremental_append", "full_refresh"])
def test_a_clickhouse_target_in_a_database_is_that_databases_table(
    tmp_path: Path, path: str, strategy: str
) -> None:
    from dpone_native_transfer import ClickHouseSink

    build_sample_source(tmp_path / "source.db", rows=40, partitions=4)
    ch = dict(kind="clickhouse", target="chdata", path=path, strategy=strategy)
    assert "loaded 40 rows" in run(route(tmp_path, table="raw.t_copy", **ch)).stdout
    build_sample_source(tmp_path / "source.db", rows=10, partitions=2, start_id=41)
    done = run(route(tmp_path, table="raw.t_copy", **ch))
    assert f"loaded {10 if strategy == 'incremental_append' else 50} rows" in done.stdout
    with ClickHouseSink(tmp_path / "chdata", "t").client() as client:
        tables = client.query_rows(
            "SELECT database, name FROM system.tables WHERE database IN ('default', 'raw')"
        )
        counted = client.query_rows("SELECT count(), uniqExact(id) FROM raw.t_copy")
    assert sorted(tables) == [("default", "_dpone_ledger"), ("raw", "t_copy")]
    assert [tuple(map(int, row)) for row in counted] == [(50, 50)]


@pytest.mark.parametrize("table", ["a.b.c", "raw.", ".t", 'raw."t'])
def test_a_malformed_qualified_name_is_a_config_error(tmp_path: Path, table: str) -> None:
    build_sample_source(tmp_path / "source.db", rows=10, partitions=2)
    spelled = table.replace('"', '\\"')
    done = run(route(tmp_path, kind="duckdb", target="t.duckdb", table=spelled), code=2)
    assert "is not a table name or schema.table" in done.stderr


# a store on a full or read-only disk: unavailable (retry), never corrupt, and nothing lost -------


@contextlib.contextmanager
def small_disk(folder: Path, size: str) -> Any:
    """A real tmpfs of ``size`` mounted at ``folder``. Needs root, as CI runs: fails (never
    skips) elsewhere, as the PostgreSQL tests do without a server."""
    folder.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", folder])
    if mounted.returncode != 0:
        pytest.fail("cannot mount a tmpfs here: the disk tests need root", pytrace=False)
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", folder], check=False)


def test_a_full_disk_under_the_store_is_unavailable_and_the_rerun_loads_every_row_once(
    tmp_path: Path,
) -> None:
    """A full disk was once reported as checkpoint_store_corrupt, whose runbook action
    (restore a backup) leads to duplicates; a store that could not be created was a
    raw OperationalError, leaving its half-made files behind."""
    build_sample_source(tmp_path / "source.db", rows=100, partitions=4)
    with small_disk(tmp_path / "disk", "1m") as disk:
        route_file = route(tmp_path, store=disk / "checkpoints.db")
        fill(disk / "ballast")
        done = run(route_file, code=1)  # the store cannot even be created
        assert "native_transfer_checkpoint_store_unavailable" in done.stderr
        assert "a retry may succeed" in done.stderr and "corrupt" not in done.stderr
        assert sorted(p.name for p in disk.iterdir()) == ["ballast"]  # no half-made store
        (disk / "ballast").unlink()  # the operator frees space; the scheduler retries
        assert "loaded 100 rows" in run(route_file).stdout
        build_sample_source(tmp_path / "source.db", rows=50, partitions=4, start_id=101)
        fill(disk / "ballast")
        done = run(route_file, code=1)  # the store is full in the middle of its life
        assert "native_transfer_checkpoint_store_unavailable" in done.stderr
        assert "corrupt" not in done.stderr
        (disk / "ballast").unlink()
        assert "loaded 50 rows" in run(route_file).stdout
    with contextlib.closing(sqlite3.connect(tmp_path / "target.db")) as target:
        counted = target.execute("SELECT count(*), count(DISTINCT id) FROM orders_copy")
        assert counted.fetchone() == (150, 150)


def fill(path: Path) -> None:
    """Write zeros until the disk is full."""
    with open(path, "wb", buffering=0) as handle, contextlib.suppress(OSError):
        while True:
            handle.write(b"\0" * 4096)


def test_a_read_only_store_is_unavailable_before_the_target_and_nothing_is_lost(
    tmp_path: Path,
) -> None:
    build_sample_source(tmp_path / "source.db", rows=100, partitions=4)
    with small_disk(tmp_path / "disk", "4m") as disk:
        route_file = route(tmp_path, store=disk / "checkpoints.db")
        assert "loaded 100 rows" in run(route_file).stdout
        build_sample_source(tmp_path / "source.db", rows=50, partitions=4, start_id=101)
        subprocess.run(["mount", "-o", "remount,ro", disk], check=True)
        done = run(route_file, code=1)
        assert "native_transfer_checkpoint_store_unavailable" in done.stderr
        assert "a retry may succeed" in done.stderr and "corrupt" not in done.stderr
        subprocess.run(["mount", "-o", "remount,rw", disk], check=True)
        assert "loaded 50 rows" in run(route_file).stdout
    with contextlib.closing(sqlite3.connect(tmp_path / "target.db")) as target:
        assert target.execute(
            "SELECT count(*), count(DISTINCT id) FROM orders_copy"
        ).fetchone() == (
            150,
            150,
        )


def test_a_sqlite_target_main_t_is_t_and_a_quoted_dotted_name_is_that_table(
    tmp_path: Path,
) -> None:
    """main.t_copy created a table literally named 'main.t_copy' (and loaded every row again
    beside t_copy); '"raw.t"' created a table whose name held the quotes."""
    build_sample_source(tmp_path / "source.db", rows=14, partitions=2)
    assert "loaded 14 rows" in run(route(tmp_path)).stdout
    assert "loaded 0 rows" in run(route(tmp_path, table="main.orders_copy")).stdout
    assert "loaded 0 rows" in run(route(tmp_path, table='MAIN.\\"ORDERS_COPY\\"')).stdout
    assert "loaded 14 rows" in run(route(tmp_path, table='\\"raw.t\\"')).stdout
    with contextlib.closing(sqlite3.connect(tmp_path / "target.db")) as target:
        found = target.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
        tables = {row[0] for row in found}
    assert tables == {"orders_copy", "raw.t", "_dpone_ledger", "_dpone_fence"}


@pytest.mark.parametrize(
    ("kind", "target", "table"),
    [
        ("duckdb", "raw.duckdb", "raw.orders"),  # the catalog's own name: ambiguous
        ("duckdb", "t.duckdb", "temp.orders"),
        ("duckdb", "t.duckdb", "SYSTEM.orders"),
        ("clickhouse", "chdata", "system.orders"),  # a Memory database: the rows would vanish
        ("clickhouse", "chdata", "INFORMATION_SCHEMA.orders"),
    ],
)
def test_a_schema_the_engine_keeps_for_itself_is_refused_before_any_io(
    tmp_path: Path, kind: str, target: str, table: str
) -> None:
    build_sample_source(tmp_path / "source.db", rows=10, partitions=2)
    done = run(route(tmp_path, kind=kind, target=target, table=table), code=2)
    assert "keeps for itself" in done.stderr
    assert not (tmp_path / target).exists()


def test_library_arguments_of_the_wrong_kind_are_config_errors_before_any_io(
    tmp_path: Path,
) -> None:
    """A path of bytes or None, a number for a connector, a text for the gates: each raised a
    ``TypeError`` or ``AttributeError`` (no stable code) at construction or in the run."""
    from dpone_native_transfer import (
        ConfigInvalid,
        SQLiteCheckpointStore,
        SQLiteSink,
        SQLiteSource,
        TransferSpec,
    )

    source = tmp_path / "source.db"
    build_sample_source(source, rows=10)
    for path in (None, b"source.db", 5, ""):
        with pytest.raises(ConfigInvalid, match="must be a file path"):
            SQLiteSource(path, "orders", "region")  # type: ignore[arg-type]
        with pytest.raises(ConfigInvalid, match="must be a file path"):
            SQLiteSink(path, "orders")  # type: ignore[arg-type]
        with pytest.raises(ConfigInvalid, match="must be a file path"):
            SQLiteCheckpointStore(path)  # type: ignore[arg-type]
    good = {
        "source": SQLiteSource(source, "orders", "region"),
        "sink": SQLiteSink(tmp_path / "target.db", "orders"),
        "strategy": "full_refresh",
        "path": "staged",
        "run_id": "r",
    }
    for wrong, match in (
        ({"source": 5}, "source must be a dpone Source"),
        ({"sink": str(tmp_path / "t.db")}, "sink must be a dpone Sink"),
        ({"governance": "strict"}, "governance must be a Governance"),
    ):
        with pytest.raises(ConfigInvalid, match=match):
            TransferSpec(**{**good, **wrong})
    assert not (tmp_path / "target.db").exists() and not (tmp_path / "t.db").exists()


@pytest.mark.parametrize("shared", ["source", "store"])
def test_the_library_refuses_a_target_in_the_source_or_store_file_as_the_cli_does(
    tmp_path: Path, shared: str
) -> None:
    """The route file's check was the CLI's alone: the library wrote the rows and the ledger
    into the source's file, or into the store's, where a restore of one restores both."""
    from dpone_native_transfer import (
        ConfigInvalid,
        SQLiteCheckpointStore,
        SQLiteSink,
        SQLiteSource,
        TransferRuntime,
        TransferSpec,
    )

    source = tmp_path / "source.db"
    build_sample_source(source, rows=10)
    store_file = tmp_path / "checkpoints.db"
    into = source if shared == "source" else store_file
    spec = TransferSpec(
        source=SQLiteSource(source, "orders", "region"),
        sink=SQLiteSink(into, "orders_copy"),
        strategy="full_refresh",
        path="staged",
        run_id="r",
    )
    with contextlib.closing(SQLiteCheckpointStore(store_file)) as store:
        said = "target.path is the source's" if shared == "source" else "store.path is the target's"
        with pytest.raises(ConfigInvalid, match=f"{said} own file") as raised:
            TransferRuntime(store).run(spec)
        assert raised.value.diagnostics["key"] == said.split()[0]
    with contextlib.closing(sqlite3.connect(into)) as conn:
        tables = {name for (name,) in conn.execute("SELECT name FROM sqlite_master")}
    assert "orders_copy" not in tables and "_dpone_ledger" not in tables
