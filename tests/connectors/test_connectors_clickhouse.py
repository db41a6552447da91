"""ClickHouse target on real chDB (persistent data paths under tmp_path): every path, the guard.

No mocks: the engine is chDB 4.4 in this process. chDB serves one data path
per process at a time, so a sink holds a session only for one call, or for
one run's attempt; a test that opens a session itself closes it before the
next call.
The clickhouse-connect server adapter cannot run without a server: only what
needs none (locations, secrecy, the missing-extra error) is tested here.
The guard's fault scenarios run on this sink in the conformance kit
(``tests/guard/test_conformance.py::TestKitClickHouse``, every path); what is here is
ClickHouse's own, and the unguarded and ledger-only contrast.
"""

from __future__ import annotations

import contextlib
import datetime
import decimal
import functools
import math
import socket
import sqlite3
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import attrs
import pytest
from helpers.routes import PATHS, Route

from dpone_native_transfer import (
    LEDGER_BATCH_KEY,
    ManualReconciliationRequired,
    StoreTargetMismatch,
)
from dpone_native_transfer.column_types import postgres_kind
from dpone_native_transfer.connectors._sql import TableName
from dpone_native_transfer.connectors.clickhouse import (
    ClickHouseSink,
    Location,
    open_client,
    parse_location,
)
from dpone_native_transfer.connectors.clickhouse.server_client import ServerClient
from dpone_native_transfer.connectors.clickhouse.sql import (
    column_type,
    create_table_sql,
    encode_json_rows,
    partition_id_literal,
    quote,
    where_sql,
)
from dpone_native_transfer.connectors.sqlite import SQLiteSource
from dpone_native_transfer.errors import (
    ArtifactInvalid,
    ConfigInvalid,
    InternalInvariantBroken,
    NativeTransferError,
    SourceInvalid,
)
from dpone_native_transfer.payloads import (
    Column,
    LoadFiles,
    LoadPlan,
    Predicate,
    RowChunks,
    bound_predicates,
)
from dpone_native_transfer.recovery import Prover
from dpone_native_transfer.testing import (
    InjectedFault,
    RecordingSink,
    assert_blocked_before_target,
    assert_guard_registered,
    assert_no_duplicate_rows,
    build_sample_source,
)

STRATEGIES = ("incremental_append", "full_refresh")
REGIONS = {f"region-{i:03d}" for i in range(4)}


@pytest.fixture
def ch_route(tmp_path):
    made = Route(tmp_path, kind="clickhouse")
    yield made
    made.real_store.close()


def _tables(sink: ClickHouseSink) -> dict[str, tuple[str, str]]:
    """Tables of the sink's database: name -> (engine, partition key)."""
    with sink.client() as client:
        rows = client.query_rows(
            "SELECT name, engine, partition_key FROM system.tables"
            " WHERE database = currentDatabase()"
        )
    return {name: (engine, key) for name, engine, key in rows}


def _partitions(sink: ClickHouseSink, table: str | None = None) -> set:
    with sink.client() as client:
        rows = client.query_rows(
            "SELECT DISTINCT partition FROM system.parts"
            " WHERE database = currentDatabase() AND table = {t:String} AND active",
            {"t": table or sink.table},
        )
    return {row[0] for row in rows}


# --- every path, both strategies, guarded ------------------------------------------------------


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_guarded_transfer_writes_exact_rows_into_partitioned_mergetree(ch_route, path, strategy):
    runtime = ch_route.runtime()
    assert_guard_registered(runtime)
    first = runtime.run(ch_route.spec(path, strategy=strategy))
    assert first.rows_loaded == 120
    assert ch_route.target_rows() == ch_route.source_rows()

    ch_route.add_rows(30)
    second = runtime.run(ch_route.spec(path, run_id="run-2", strategy=strategy))
    assert second.rows_loaded == (150 if strategy == "full_refresh" else 30)
    assert ch_route.target_rows() == ch_route.source_rows()
    assert len(ch_route.target_rows()) == 150

    sink = ch_route.sink.inner
    assert _tables(sink) == {  # no stage or fresh table left; the ledger beside the target
        "orders_copy": ("MergeTree", "region"),
        "_dpone_ledger": ("MergeTree", ""),
    }
    assert _partitions(sink) == REGIONS
    assert ch_route.sink.target_calls == 2


# --- what the guard adds on ClickHouse ---------------------------------------------------------


def test_partial_commit_then_retry_duplicates_unguarded_and_is_blocked_guarded(tmp_path, path):
    """Unguarded and without the ledger the retry appends every row again; the guard blocks it,
    and so does the ledger alone: its row proves the batch applied, the store says failed."""
    arms = {
        "unguarded": (Route(tmp_path / "unguarded", kind="clickhouse"), [], False),
        "ledger only": (Route(tmp_path / "ledger", kind="clickhouse"), [], True),
        "guarded": (Route(tmp_path / "guarded", kind="clickhouse"), None, True),
    }
    try:
        outcomes = {}
        for name, (route, plugins, ledger) in arms.items():
            runtime = route.runtime(plugins=plugins)
            route.sink.fail = "after"  # the load commits in ClickHouse, then the worker fails
            with pytest.raises(InjectedFault):
                runtime.run(route.spec(path, ledger=ledger))
            assert len(route.target_rows()) == 120
            route.sink.fail = None
            retry = functools.partial(runtime.run, route.spec(path, "run-2", ledger=ledger))
            if name == "guarded":
                blocked = assert_blocked_before_target(retry, route.sink)
                assert isinstance(blocked, ManualReconciliationRequired)
            elif name == "ledger only":
                with pytest.raises(StoreTargetMismatch) as refused:
                    retry()
                assert refused.value.diagnostics["mismatch"] == "store_contradicts_target"
            else:
                retry()
            ids = Counter(row[0] for row in route.target_rows())
            outcomes[name] = sum(seen - 1 for seen in ids.values())

        assert outcomes == {"unguarded": 120, "ledger only": 0, "guarded": 0}
        assert [route.sink.target_calls for route, _, _ in arms.values()] == [2, 1, 1]
        guarded = arms["guarded"][0]
        assert_no_duplicate_rows(guarded.source_ids(), (r[0] for r in guarded.target_rows()))
    finally:
        for route, _, _ in arms.values():
            route.real_store.close()


def test_the_ledger_row_follows_the_rows_and_a_repeated_batch_inserts_nothing(tmp_path, path):
    """What is proven on ClickHouse: a ledger row means applied; the same batch again is a no-op."""
    route = Route(tmp_path, kind="clickhouse")
    try:
        result = route.runtime().run(route.spec(path))
        sink = route.sink.inner
        [entry] = sink.read_ledger(partitions=True)
        assert (entry.batch_id, entry.rows) == (result.batch_id, 120)
        assert sink.features.ledger_atomic is False
        absent = "sha256:" + "1" * 64  # a batch armed with the ledger that the ledger lacks
        armed = [
            attrs.evolve(cp, diagnostics={**cp.diagnostics, LEDGER_BATCH_KEY: absent})
            for cp in route.latest()
        ]
        proof = Prover(sink, epoch=99, advance=True).prove(route.spec(path).route, absent, armed)
        assert (proof.verdict, proof.heals) == ("unknown", False)
        if path in ("legacy", "lazy-plan"):  # the same INSERTs can be repeated as they were
            again = attrs.evolve(entry, seq=0, rows=0)
            load = _append(sink, route, path)
            load(ledger=again)
            assert len(route.target_rows()) == 120, "the repeated inserts were deduplicated"
            assert len(sink.read_ledger()) == 2, "the ledger records each call"
            another = attrs.evolve(again, batch_id="sha256:" + "0" * 64)
            _append(sink, route, path)(ledger=another)
            assert len(route.target_rows()) == 240, "equal rows of another batch are kept"
            third = attrs.evolve(another, batch_id="sha256:" + "1" * 64)
            _append(sink, route, path)(ledger=third)  # no content deduplication either
            assert len(route.target_rows()) == 360
    finally:
        route.real_store.close()


def _append(sink: Any, route: Route, path: str) -> Any:
    """The run's target call again, the same rows as the path under test hands them, waiting
    for its ``ledger=``."""
    columns = route.source.describe().columns
    bounds = tuple(cp.partition_bounds for cp in sorted(route.latest(), key=_in_batch_order))
    if path == "lazy-plan":
        plan = LoadPlan(source=route.source, columns=columns, bounds=bounds)
        return functools.partial(sink.load_plan, plan)
    rows = [row for b in bounds for chunk in route.source.read(b) for row in chunk]
    return functools.partial(sink.load, RowChunks(columns=columns, chunks=[rows]))


def _in_batch_order(checkpoint: Any) -> Any:
    return checkpoint.partition_bounds["partition"]


# --- chDB: one data path per process at a time -------------------------------------------------


@pytest.mark.parametrize("files", [1, 4])
def test_a_pull_is_cut_into_the_blocks_python_writes_and_repeated_inserts_nothing(
    tmp_path, monkeypatch, files
):
    """chDB's pulled files are rewritten in the ``ARROW_BLOCK_ROWS``-row batches the runtime
    writes (a retried INSERT deduplicates by block number): a partition's pulled file holds
    the batches of the file written from its read through Python; and the same pulled load of
    the run's batch again inserts nothing, while under another batch it inserts every row."""
    from dpone_native_transfer.connectors.clickhouse import pulls as ch_pulls
    from dpone_native_transfer.connectors.clickhouse import sql as ch_sql

    monkeypatch.setattr(ch_sql, "ARROW_BLOCK_ROWS", 7)
    monkeypatch.setattr(ch_pulls, "ARROW_BLOCK_ROWS", 7)
    route = Route(tmp_path, kind="clickhouse")
    try:
        result = route.runtime().run(route.spec("legacy" if files == 1 else "file-artifact"))
        sink, columns = route.sink.inner, route.source.describe().columns
        bounds = tuple(cp.partition_bounds for cp in sorted(route.latest(), key=_in_batch_order))
        plan = LoadPlan(source=route.source, columns=columns, bounds=bounds)
        assert sink.can_pull(plan, files)
        paths = [tmp_path / f"pulled-{index}.arrows" for index in range(files)]
        pulled, counts = sink.pull_load_files(plan, paths)
        assert counts == [30, 30, 30, 30] and sum(file.rows for file in pulled) == 120
        for index, file in enumerate(pulled):
            batches = _batches(file.path)
            assert [len(batch) for batch in batches] == [7] * (file.rows // 7) + (
                [file.rows % 7] if file.rows % 7 else []
            )
            if files > 1:  # one partition's rows, as Python reads and writes them
                written = ch_sql.write_arrow_stream(
                    tmp_path / f"written-{index}.arrows",
                    columns,
                    route.source.read(bounds[index]),
                    table="t",
                )
                assert batches == _batches(written.path)
        [entry] = sink.read_ledger(partitions=True)
        payload = LoadFiles(columns=columns, chunks=(), replace=False, files=tuple(pulled))
        if files > 1:
            payload = sink.merge_load_files(payload, tmp_path)
        assert sink.load(payload, ledger=attrs.evolve(entry, seq=0, rows=0)) == 120
        assert len(route.target_rows()) == 120 == result.rows_loaded, "deduplicated"
        another = attrs.evolve(entry, seq=0, rows=0, batch_id="sha256:" + "0" * 64)
        sink.load(payload, ledger=another)
        assert len(route.target_rows()) == 240
    finally:
        route.real_store.close()


def _refresh_pull(tmp_path: Path, rows: int, values: str, bounds: tuple) -> tuple:
    """chDB's pull of a full refresh's ``bounds`` from a new ``t(id, p)`` of ``rows`` rows whose
    ``p`` cycles through ``values``, one file per bound: the sink, the columns and the pull."""
    source_path = tmp_path / "source.db"
    with sqlite3.connect(source_path) as db:
        db.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, p TEXT)")
        db.executemany(
            "INSERT INTO t VALUES (?, ?)", [(i, values[i % len(values)]) for i in range(rows)]
        )
    db.close()
    source = SQLiteSource(str(source_path), "t", "p")
    columns = source.describe().columns
    plan = LoadPlan(source=source, columns=columns, bounds=bounds, replace=True)
    sink = ClickHouseSink(tmp_path / "chdata", "t")
    assert sink.can_pull(plan, len(bounds))
    paths = [tmp_path / f"{index}.arrows" for index in range(len(bounds))]
    return sink, columns, sink.pull_load_files(plan, paths)


def test_a_full_refresh_keeps_each_pulled_file_as_written_an_empty_one_too(tmp_path):
    """A full refresh's pulled files are kept as chDB wrote them, tag included: one per
    bound, a bound of no row an empty stream; each file's rows and digest are what it holds,
    and the files, merged, load each row once into the table they replace."""
    import pyarrow as pa

    from dpone_native_transfer.artifacts import file_sha256

    bounds = ({"partition": "b"}, {"partition": "none"}, {"partition": "a"})
    sink, columns, (files, counts) = _refresh_pull(tmp_path, 50, "ab", bounds)
    assert counts == [file.rows for file in files] == [25, 0, 25]
    for file, wanted in zip(files, ("b", None, "a"), strict=True):
        assert file_sha256(file.path) == file.sha256 and file.path.stat().st_mode & 0o077 == 0
        with pa.OSFile(str(file.path)) as handle:
            table = pa.ipc.open_stream(handle).read_all()
        assert "__dpone_bound" in table.column_names
        assert set(table.column("p").to_pylist()) == {wanted} - {None}
    payload = LoadFiles(columns=columns, chunks=(), replace=True, files=tuple(files))
    assert sink.load(sink.merge_load_files(payload, tmp_path)) == 50
    assert sink.rows() == [(i, "ab"[i % 2]) for i in range(50)]


def _messages(path: Path) -> list[bytes]:
    """An Arrow stream file's IPC messages, as bytes: its schema, then its batches."""
    import pyarrow as pa

    with pa.OSFile(str(path)) as handle:
        messages = pa.ipc.MessageReader.open_stream(handle)
        return [message.serialize().to_pybytes() for message in messages]


def test_a_merge_copies_each_pulled_batch_as_written_and_refuses_what_does_not_concatenate(
    tmp_path,
):
    """file-artifact's files are merged message by message: the merged file is the first
    file's schema, then every file's batches byte for byte (chDB's compression kept), in
    order, holding every row. A file of another schema, or of dictionary batches,
    is refused as a broken invariant; a file changed after its digest was taken (longer, cut
    or emptied) as changed. Nothing is loaded."""
    import pyarrow as pa

    from dpone_native_transfer.artifacts import file_sha256
    from dpone_native_transfer.payloads import LoadFile

    bounds = ({"partition": "c"}, {"partition": "a"}, {"partition": "b"})
    sink, columns, (files, _) = _refresh_pull(tmp_path, 60, "abc", bounds)
    payload = LoadFiles(columns=columns, chunks=(), replace=True, files=tuple(files))

    def folder(name: str) -> Path:
        (tmp_path / name).mkdir()
        return tmp_path / name

    [merged] = sink.merge_load_files(payload, folder("merged")).files
    pulled = [_messages(file.path) for file in files]
    assert _messages(merged.path) == pulled[0][:1] + [m for each in pulled for m in each[1:]]
    assert merged.rows == 60 and file_sha256(merged.path) == merged.sha256
    with pa.OSFile(str(files[0].path)) as handle:
        schema = pa.ipc.open_stream(handle).schema

    def refused(index: int, table: Any) -> LoadFiles:
        path = tmp_path / f"other-{index}.arrows"
        with pa.OSFile(str(path), "wb") as handle, pa.ipc.new_stream(handle, table.schema) as out:
            out.write_table(table)
        other = LoadFile(path=path, rows=table.num_rows, sha256=file_sha256(path), native=True)
        return attrs.evolve(payload, files=(*files[:index], other, *files[index + 1 :]))

    rows = pa.table({name: [None] for name in schema.names}, schema=schema)
    renamed = rows.rename_columns([*schema.names[:-1], "other"])
    encoded = rows.set_column(1, schema.names[1], pa.array(["a"]).dictionary_encode())
    for index, table in ((1, renamed), (0, encoded)):  # the first file's schema is the merge's
        with pytest.raises(InternalInvariantBroken) as caught:
            sink.merge_load_files(refused(index, table), folder(f"refused-{index}"))
        assert caught.value.diagnostics == {"table": "t"}
    whole = files[1].path.read_bytes()
    for number, changed in enumerate((whole + b"\0" * 8, whole[:-20], b"")):
        files[1].path.write_bytes(changed)  # after its digest was taken: longer, or cut
        with pytest.raises(ArtifactInvalid) as caught:
            sink.merge_load_files(payload, folder(f"changed-{number}"))
        assert caught.value.diagnostics == {"file": files[1].path.name}
    assert not sink.rows()


def test_a_plan_takes_as_few_statements_as_its_conditions_allow(
    tmp_path, chdb_statements, monkeypatch
):
    """Bounds a lookup finds (a full refresh's listed values here) take one statement up to
    2,048, whatever else: pulled by chDB into one file or one per partition, within the
    open-file allowance. OR-ed conditions (an append's values not loaded yet) take 256 a
    statement: a pull of more is read through Python, and lazy-plan cuts them. Before,
    any plan of more than 256 was read through Python: 52 s for 1,000 partitions of 1M rows
    into chDB (legacy), against 1.3 s pulled."""
    from dpone_native_transfer.connectors.clickhouse import sink as sink_module

    source_path = tmp_path / "many.db"
    with sqlite3.connect(source_path) as db:
        db.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, p INTEGER)")
        db.executemany("INSERT INTO t VALUES (?, ?)", [(i, i) for i in range(2049)])
    source = SQLiteSource(str(source_path), "t", "p")
    columns = source.describe().columns

    def plan(count: int, *, replace: bool) -> LoadPlan:
        bounds = tuple({"partition": i} for i in range(count))
        return LoadPlan(source=source, columns=columns, bounds=bounds, replace=replace)

    sink = ClickHouseSink(tmp_path / "chdata", "t", partition_by="p")
    assert not sink.can_pull(plan(257, replace=False), 1)
    assert sink.can_pull(plan(256, replace=False), 256)
    assert not sink.can_pull(plan(2049, replace=True), 1)
    refresh = plan(257, replace=True)
    with monkeypatch.context() as patched:
        patched.setattr(sink_module, "open_files_allowed", lambda: 256)
        assert not sink.can_pull(refresh, 257) and sink.can_pull(refresh, 1)
    assert sink.can_pull(refresh, 257)
    paths = [tmp_path / f"{index}.arrows" for index in range(257)]
    files, counts = sink.pull_load_files(refresh, paths)
    assert counts == [file.rows for file in files] == [1] * 257
    assert [_batches(file.path)[0][0]["p"] for file in files] == list(range(257))
    chdb_statements.clear()
    for count, replace, inserts in ((2048, True, 1), (2049, True, 9), (257, False, 2)):
        loading = ClickHouseSink(tmp_path / f"lazy-{count}-{replace}", "t")
        assert loading.load_plan(plan(count, replace=replace)) == count
        assert loading.rows() == [(i, i) for i in range(count)]
        reads = [sql for sql in chdb_statements if "FROM sqlite(" in sql]
        assert len(reads) == inserts, count
        chdb_statements.clear()


def test_lazy_plan_statements_stay_within_what_chdb_parses_or_fail_before_the_target(
    tmp_path, chdb_statements
):
    """OR-ed conditions are cut by their length as well as their count: with a partition
    column named in 1,000 characters, 256 conditions made a statement longer than chDB's
    max_query_size, which failed inside the target call and blocked the route. A statement
    that cannot be made short enough (a column name of 100,000 characters) is refused
    before the target call, and the route is not blocked."""
    long = "p" + "x" * 999
    source_path = tmp_path / "long.db"
    with sqlite3.connect(source_path) as db:
        db.execute(f'CREATE TABLE t (id INTEGER PRIMARY KEY, "{long}" INTEGER)')
        db.executemany("INSERT INTO t VALUES (?, ?)", [(i, i % 300) for i in range(600)])
    source = SQLiteSource(str(source_path), "t", long)
    columns = source.describe().columns
    bounds = tuple({"partition": i} for i in range(300))  # an append's: OR-ed, not looked up
    sink = ClickHouseSink(tmp_path / "chdata", "t")
    assert sink.load_plan(LoadPlan(source=source, columns=columns, bounds=bounds)) == 600
    assert sink.rows() == sorted((i, i % 300) for i in range(600))
    reads = [sql for sql in chdb_statements if "FROM sqlite(" in sql]
    assert len(reads) > 2 and all(len(sql.encode()) < 262_144 for sql in reads)

    huge = "q" * 100_000
    with sqlite3.connect(source_path) as db:
        db.execute(f'CREATE TABLE h (id INTEGER PRIMARY KEY, "{huge}" INTEGER)')
        db.executemany("INSERT INTO h VALUES (?, ?)", [(i, i % 3) for i in range(6)])
    route = Route(tmp_path / "route", kind="clickhouse", sink=ClickHouseSink(tmp_path / "h", "h"))
    route.source = SQLiteSource(str(source_path), "h", huge)
    try:
        for run_id in ("r1", "r2"):  # the same refusal again: nothing was left unresolved
            with pytest.raises(ConfigInvalid) as caught:
                route.runtime().run(route.spec("lazy-plan", run_id=run_id))
            assert caught.value.diagnostics["table"] == "h"
            assert caught.value.diagnostics["path"] == "lazy-plan"
            assert huge not in str(caught.value)
        assert route.sink.rows() == []
    finally:
        route.real_store.close()


# A refresh's source: rows of values outside the plan, NULL keys, cursors above the window's top
# and NULL cursors (which a refresh's window keeps).
_REFRESH_SOURCE = (
    "CREATE TABLE t (id INTEGER PRIMARY KEY, p {kind}, c INTEGER);"
    "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 60)"
    " INSERT INTO t SELECT i, CASE WHEN i % 11 = 0 THEN NULL ELSE {value} END,"
    " CASE WHEN i % 7 = 0 THEN NULL ELSE i END FROM n;"
)


@pytest.mark.parametrize("kind", ["TEXT", "INTEGER", "ranges"])
@pytest.mark.parametrize("window", [False, True])
@pytest.mark.parametrize("replace", [False, True])
@pytest.mark.parametrize("null_key", [False, True])
def test_chdb_reads_of_a_plan_keep_its_rows_by_lookup_or_by_condition_alike(
    tmp_path, chdb_statements, kind, window, replace, null_key
):
    """A full refresh's plan (``replace``) is every partition listed, and an append's in a
    cursor window every partition listed in it, so chDB keeps their rows by a lookup of each
    row's value instead of pushing the plan's conditions down to SQLite. Both ways,
    lazy-plan's load and the pull keep exactly the rows SQLite's read of each bound selects
    (not a value outside the plan, a NULL key unless planned, or a cursor outside the
    window), and the pull counts each bound's rows as that read does."""
    texts = "CASE i % 5 WHEN 0 THEN 'a''b' WHEN 1 THEN '' WHEN 2 THEN 'ü' WHEN 3 THEN 'x\\y'"
    texts += " ELSE 'k' END"
    value = {"TEXT": texts, "INTEGER": "i % 5 - 2", "ranges": "i * 3 - 20"}[kind]
    with sqlite3.connect(tmp_path / "source.db") as db:
        db.executescript(
            _REFRESH_SOURCE.format(kind="TEXT" if kind == "TEXT" else "INTEGER", value=value)
        )
    source = SQLiteSource(
        str(tmp_path / "source.db"), "t", "p", cursor_column="c" if window else None
    )
    parts: list[dict[str, Any]] = [
        {"partition": v} for v in {"TEXT": ["a'b", "", "x\\y"], "INTEGER": [-2, 0, 2]}.get(kind, [])
    ]
    if kind == "ranges":  # contiguous, given out of order; keys from 100 on are outside them
        cuts = [(7, 40), (None, 7), (40, 100)]
        parts = [{"partition_from": low, "partition_below": high} for low, high in cuts]
    refresh_top = {"cursor_upto": 45, "cursor_nulls": True}  # NULL cursors kept
    top = (refresh_top if replace else {"cursor_after": 10, "cursor_upto": 45}) if window else {}
    keys = [*([{"partition": None}] if null_key else []), *parts]
    bounds = tuple({**key, **top} for key in keys)
    plan = LoadPlan(
        source=source, columns=source.describe().columns, bounds=bounds, replace=replace
    )
    expected = [[row for chunk in source.read(bound) for row in chunk] for bound in bounds]
    wanted = sorted(row for rows in expected for row in rows)
    assert 0 < len(wanted) < 50, "the source has rows outside the plan"
    sink = ClickHouseSink(tmp_path / "chdata", "t")
    assert sink.load_plan(plan) == len(wanted)
    assert sink.rows() == wanted
    assert sink.can_pull(plan, 1)
    [pulled], counts = sink.pull_load_files(plan, [tmp_path / "pulled.arrows"])
    assert counts == [len(rows) for rows in expected]
    batches, names = _batches(pulled.path), [column.name for column in plan.columns]
    read = sorted(tuple(row[name] for name in names) for batch in batches for row in batch)
    assert read == wanted
    # a refresh's one file is kept as chDB wrote it, tag included; an append's is rewritten
    assert all(("__dpone_bound" in row) is replace for batch in batches for row in batch)
    reads = [sql for sql in chdb_statements if "FROM sqlite(" in sql]
    assert len(reads) == 2
    looked_up = replace or window  # a refresh's plan, or one cursor window's
    assert all(("!= -1" in sql) is looked_up for sql in reads)
    assert "multiIf(" not in reads[1], "the pull tags each row by the lookup, a NULL key too"


def _batches(path: Path) -> list[list[dict]]:
    import pyarrow as pa

    with pa.OSFile(str(path)) as handle:
        return [batch.to_pylist() for batch in pa.ipc.open_stream(handle)]


def test_two_routes_with_different_data_paths_run_one_after_the_other(tmp_path):
    first = Route(tmp_path / "one", kind="clickhouse")
    second = Route(tmp_path / "two", rows=40, kind="clickhouse")
    try:
        first.runtime().run(first.spec("legacy"))
        second.runtime().run(second.spec("lazy-plan", strategy="full_refresh"))
        assert first.target_path != second.target_path
        assert (first.target_path / "metadata").is_dir() and (
            second.target_path / "metadata"
        ).is_dir()
        # each path reopened afterwards still holds its own rows
        assert first.target_rows() == first.source_rows() and len(first.source_rows()) == 120
        assert second.target_rows() == second.source_rows() and len(second.source_rows()) == 40
        first.add_rows(10)
        first.runtime().run(first.spec("staged", run_id="run-2"))
        assert first.target_rows() == first.source_rows()
        assert second.target_rows() == second.source_rows()
        # and a new process finds the data at the path
        script = (
            "import sys; from chdb import session; s = session.Session(sys.argv[1]);"
            " print(s.query('SELECT count() FROM orders_copy').bytes().decode().strip()); s.close()"
        )
        count = subprocess.run(
            [sys.executable, "-c", script, str(first.target_path)],
            capture_output=True, text=True, check=True, timeout=120,
        )  # fmt: skip
        assert count.stdout.strip() == "130"
    finally:
        first.real_store.close()
        second.real_store.close()


def _count_sessions(monkeypatch: pytest.MonkeyPatch) -> Counter:
    """Counts of chDB sessions opened and closed by the sink's client, from now on."""
    from dpone_native_transfer.connectors.clickhouse import chdb_client

    counts: Counter = Counter()
    real_init, real_close = chdb_client.ChdbClient.__init__, chdb_client.ChdbClient.close

    def init(self: Any, path: str) -> None:
        real_init(self, path)
        counts["opened"] += 1

    def close(self: Any) -> None:
        if getattr(self, "_session", None) is not None:
            counts["closed"] += 1
        real_close(self)

    monkeypatch.setattr(chdb_client.ChdbClient, "__init__", init)
    monkeypatch.setattr(chdb_client.ChdbClient, "close", close)
    return counts


@pytest.mark.parametrize("path", PATHS)
def test_a_run_holds_one_chdb_session_and_closes_it_even_when_it_fails(tmp_path, path, monkeypatch):
    """Every call of an attempt shares one session (``ConnectionHolding``), closed when the
    run ends, failed or not: another data path then opens in this process. Calls outside a
    run open their own."""
    from chdb import session

    route = Route(tmp_path, kind="clickhouse")
    try:
        counts = _count_sessions(monkeypatch)
        route.runtime().run(route.spec(path))
        assert counts == Counter(opened=1, closed=1)
        assert route.target_rows() == route.source_rows()
        route.add_rows(5)
        route.sink.fail = "after"  # the rows land, then the call raises
        counts.clear()
        with pytest.raises(Exception, match="injected"):
            route.runtime().run(route.spec(path, run_id="run-2"))
        assert counts == Counter(opened=1, closed=1)
        other = session.Session(str(tmp_path / "another-path"))  # none is left open
        other.close()
        assert route.sink.row_count() == 125  # its own session, opened and closed
        assert counts == Counter(opened=2, closed=2)
    finally:
        route.real_store.close()


def test_another_process_cannot_take_the_data_path_between_a_runs_calls(tmp_path):
    """As the target call begins (its own client not yet asked for), the run still holds the
    session its earlier calls opened: another process trying to open the data path then is
    told it is in use, where with a session per call it got the path and could hold it
    through the load."""
    script = (
        "import sys\n"
        "from dpone_native_transfer.connectors.clickhouse.chdb_client import ChdbClient\n"
        "try:\n"
        "    ChdbClient(sys.argv[1]).close()\n"
        "    print('opened')\n"
        "except Exception as error:\n"
        "    print(getattr(error, 'code', type(error).__name__))\n"
    )
    route = Route(tmp_path, kind="clickhouse")

    def other_process() -> str:
        done = subprocess.run(
            [sys.executable, "-c", script, str(route.target_path)],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        return done.stdout.strip()

    route.sink.observe = other_process
    try:
        route.runtime().run(route.spec("legacy"))
        assert route.sink.observations == ["native_transfer_target_unavailable"]
        assert other_process() == "opened"  # released when the run ended
        assert route.target_rows() == route.source_rows()
    finally:
        route.real_store.close()


def test_a_session_held_on_another_path_is_a_safe_config_error(tmp_path):
    from chdb import session

    held = session.Session(str(tmp_path / "held"))
    sink = ClickHouseSink(tmp_path / "secret-place", "t")
    try:
        with pytest.raises(ConfigInvalid) as caught:
            sink.row_count()
    finally:
        held.close()
    assert "one data path per process" in str(caught.value)
    assert "secret-place" not in str(caught.value) and "held" not in str(caught.value)
    assert caught.value.__cause__ is None
    assert sink.row_count() == 0  # released: the same sink now opens its path


# --- sink behaviour on chDB --------------------------------------------------------------------

ORDERS = (Column("id", "INTEGER"), Column("region", "TEXT"), Column("amount", "REAL"))


def _sink(tmp_path: Path, table: str = "t", partition_by: str | None = "region") -> ClickHouseSink:
    return ClickHouseSink(tmp_path / "chdata", table, partition_by=partition_by)


def _chunks(*rows, replace: bool = False, columns=ORDERS) -> RowChunks:
    return RowChunks(columns=columns, chunks=[list(rows)], replace=replace)


class Boom(Exception):
    pass


def _failing(*rows):
    yield list(rows)
    raise Boom


def test_full_refresh_swaps_a_fresh_table_in_and_keeps_the_target_when_it_fails(tmp_path):
    sink = _sink(tmp_path)
    assert sink.load(_chunks((1, "a", 1.0), (2, "b", 2.0))) == 2
    assert sink.load(_chunks((3, "c", 3.0), replace=True)) == 1
    assert sink.rows() == [(3, "c", 3.0)]
    boom_payload = RowChunks(columns=ORDERS, chunks=_failing((9, "z", 9.0)), replace=True)
    with pytest.raises(Boom):
        sink.load(boom_payload)
    assert sink.rows() == [(3, "c", 3.0)]
    assert set(_tables(sink)) == {"t"}


def test_failed_append_stream_commits_nothing_on_a_small_load(tmp_path):
    """chDB cancels a streamed INSERT that fails before finish(); nothing of it is committed."""
    sink = _sink(tmp_path)
    sink.load(_chunks((1, "a", 1.0)))
    with pytest.raises(Boom):
        sink.load(RowChunks(columns=ORDERS, chunks=_failing((2, "a", 2.0), (3, "b", 3.0))))
    assert sink.rows() == [(1, "a", 1.0)]


def test_null_partition_values_have_their_own_partition(tmp_path):
    source_db = tmp_path / "source.db"
    with sqlite3.connect(source_db) as connection:
        connection.execute("CREATE TABLE s (id INTEGER, region TEXT, cur INTEGER)")
        connection.executemany(
            "INSERT INTO s VALUES (?, ?, ?)",
            [(1, None, 10), (2, "", 20), (3, "a", 30), (4, None, 40), (5, "O'B\\r", 50)],
        )
    connection.close()
    source = SQLiteSource(source_db, "s", "region", "cur")
    shape = source.describe()
    sink = _sink(tmp_path)
    bounds = tuple({"partition": value} for value in source.partition_values())
    assert sink.load_plan(LoadPlan(source=source, columns=shape.columns, bounds=bounds)) == 5
    assert _partitions(sink) == {"ᴺᵁᴸᴸ", "", "a", "O'B\\r"}  # how system.parts shows NULL
    # replace through partitions: the NULL partition is replaced, '' and 'a' are dropped
    sink.stage(RowChunks(columns=shape.columns, chunks=[[(6, None, 60), (7, "O'B\\r", 70)]]))
    assert sink.finalize_staged_load(replace=True) == 2
    assert sink.rows() == [(6, None, 60), (7, "O'B\\r", 70)]
    windowed = LoadPlan(
        source=source,
        columns=shape.columns,
        bounds=({"partition": None, "cursor_after": 10, "cursor_upto": 40},),
    )
    assert sink.load_plan(windowed) == 1
    assert sink.rows() == [(4, None, 40), (6, None, 60), (7, "O'B\\r", 70)]


@pytest.mark.parametrize("table", ["star*", "q?", "brace{a,b}", "db.t*"])
def test_chdb_refuses_a_table_name_it_would_read_as_a_file_path_pattern(tmp_path, table):
    """chDB reads such a name as a file path pattern, so every statement on the table failed,
    the first inside the target call (the route was blocked): refused before, exit 2."""
    with pytest.raises(ConfigInvalid) as caught:
        ClickHouseSink(str(tmp_path / "chdb"), table)
    assert caught.value.diagnostics == {"key": "target.table"}
    ClickHouseSink(str(tmp_path / "chdb"), table.replace("*", "").replace("?", "").replace("{", ""))


def test_staged_finalize_appends_and_manages_the_stage(tmp_path):
    sink = _sink(tmp_path)
    assert sink.staged_row_count() == 0
    with pytest.raises(ConfigInvalid):
        sink.finalize_staged_load()
    assert sink.stage(_chunks((1, "a", 1.0), (2, "b", 2.0))) == 2
    assert sink.staged_row_count() == 2 and sink.row_count() == 0
    assert sink.finalize_staged_load() == 2
    assert sink.stage(_chunks((3, "a", 3.0))) == 1
    assert sink.finalize_staged_load() == 1
    assert [row[0] for row in sink.rows()] == [1, 2, 3]
    sink.stage(_chunks((4, "c", 4.0)))
    sink.discard_stage()
    assert sink.staged_row_count() == 0
    with pytest.raises(Boom):
        sink.stage(RowChunks(columns=ORDERS, chunks=_failing((5, "a", 5.0))))
    assert set(_tables(sink)) == {"t"}
    assert sink.row_count() == 3


def test_unpartitioned_target_and_replace_of_its_single_partition(tmp_path):
    sink = _sink(tmp_path, partition_by=None)
    sink.stage(_chunks((1, "a", 1.0)))
    sink.finalize_staged_load(replace=True)
    sink.stage(_chunks((2, "b", 2.0)))
    assert sink.finalize_staged_load(replace=True) == 1
    assert sink.rows() == [(2, "b", 2.0)]
    assert _tables(sink) == {"t": ("MergeTree", "")}


def test_types_round_trip_with_nullable_clickhouse_types(tmp_path):
    columns = (
        Column("i", "INTEGER"),
        Column("t", "TEXT"),
        Column("r", "REAL"),
        Column("b", "BLOB"),
        Column("f", "BOOLEAN"),
        Column("d", "DATE"),
        Column("ts", "TIMESTAMP"),
        Column("n", "NUMERIC(12, 2)"),
        Column("x", "NUMERIC"),
    )
    tricky = "é\t\n\\\"'`\x00 \u2028 😀"
    rows = [
        (2**63 - 1, tricky, math.inf, b"\x00\xff\xfe raw", True, "2024-02-29",
         "2024-01-02T03:04:05.123456+02:00", decimal.Decimal("12.34"), 1.5),
        (-(2**63), "", -0.0, b"utf8 \xc3\xa9", False, datetime.date(1900, 1, 1),
         datetime.datetime(2024, 1, 2, 3, 4, 5, tzinfo=datetime.UTC), 7, None),
        (None, None, math.nan, None, None, None, None, None, None),
    ]  # fmt: skip
    sink = _sink(tmp_path, partition_by="t")
    assert sink.load(RowChunks(columns=columns, chunks=[rows])) == 3
    with sink.client() as client:
        types = client.query_rows(
            "SELECT type FROM system.columns WHERE database = currentDatabase()"
            " AND table = 't' ORDER BY position"
        )
    assert [t for (t,) in types] == [
        "Nullable(Int64)", "Nullable(String)", "Nullable(Float64)", "Nullable(String)",
        "Nullable(Bool)", "Nullable(Date32)", "Nullable(DateTime64(6, 'UTC'))",
        "Nullable(Decimal(12, 2))", "Nullable(Float64)",
    ]  # fmt: skip
    got = {row[0]: row for row in sink.rows()}
    utc = datetime.UTC
    top, bottom, nulls = got[2**63 - 1], got[-(2**63)], got[None]
    assert top[1] == tricky and top[2] == math.inf and top[4] is True
    assert top[3].encode("utf-8", "surrogateescape") == b"\x00\xff\xfe raw"
    assert top[5:] == (
        datetime.date(2024, 2, 29),
        datetime.datetime(2024, 1, 2, 1, 4, 5, 123456, tzinfo=datetime.UTC),
        decimal.Decimal("12.34"),
        1.5,
    )
    assert bottom[1:] == (
        "", -0.0, "utf8 é", False, datetime.date(1900, 1, 1),
        datetime.datetime(2024, 1, 2, 3, 4, 5, tzinfo=utc), decimal.Decimal("7.00"), None,
    )  # fmt: skip
    assert math.isnan(nulls[2]) and nulls[:2] == (None, None) and set(nulls[3:]) == {None}


def test_string_parameters_round_trip_through_chdb(tmp_path):
    values = ["plain", "", "\\", "\\N", "a\\tb", "tab\there", "line\nbreak", "cr\r", "'\"`",
              "\x00nul", "{x:String}", "é😀", "\\\\n"]  # fmt: skip
    with _sink(tmp_path).client() as client:
        for value in values:
            assert client.query_rows("SELECT {p:String}", {"p": value}) == [(value,)]
        assert client.query_rows("SELECT {i:Int64}, {f:Float64}", {"i": -(2**63), "f": 0.1}) == [
            (-(2**63), 0.1)
        ]


def _odd_source(tmp_path: Path, table: str, partition: str) -> SQLiteSource:
    with sqlite3.connect(tmp_path / "odd's.db") as connection:
        quoted = ['"' + name.replace('"', '""') + '"' for name in (table, "the id", partition)]
        connection.execute(f"CREATE TABLE {quoted[0]} ({quoted[1]} INTEGER, {quoted[2]} TEXT)")
        connection.executemany(
            f"INSERT INTO {quoted[0]} VALUES (?, ?)",
            [(1, "x`y"), (2, "a\\b"), (3, "x`y"), (4, "q'r\n\x00z"), (5, 'd"q')],
        )
    connection.close()
    return SQLiteSource(tmp_path / "odd's.db", table, partition)


def test_awkward_identifiers_and_values(tmp_path):
    source = _odd_source(tmp_path, "my `odd` t'é; --", "p` '[$?]")
    shape = source.describe()
    sink = ClickHouseSink(tmp_path / "ch data's", "copy `of` it\\", partition_by="p` '[$?]")
    bounds = tuple({"partition": value} for value in source.partition_values())
    assert sink.load_plan(LoadPlan(source=source, columns=shape.columns, bounds=bounds)) == 5
    assert sink.rows() == [
        (1, "x`y"), (2, "a\\b"), (3, "x`y"), (4, "q'r\n\x00z"), (5, 'd"q')
    ]  # fmt: skip
    sink.stage(RowChunks(columns=shape.columns, chunks=source.read({"partition": "a\\b"})))
    assert sink.finalize_staged_load(replace=True) == 1
    assert sink.rows() == [(2, "a\\b")]


@pytest.mark.parametrize("bad", ["p\\", 'p"', "p\n", "p\t"])
def test_lazy_plan_refuses_identifiers_the_sqlite_function_misquotes(tmp_path, bad):
    """ClickHouse's sqlite() reads a column named with a backslash as a string (silently)."""
    source = _odd_source(tmp_path, "t", bad)
    plan = LoadPlan(source=source, columns=source.describe().columns, bounds=({"partition": 1},))
    with pytest.raises(ConfigInvalid) as caught:
        _sink(tmp_path, partition_by=None).load_plan(plan)
    assert caught.value.diagnostics == {"table": "t", "identifier": bad}
    assert not (tmp_path / "chdata").exists()
    staged = _sink(tmp_path, partition_by=bad)  # the other paths quote it themselves
    columns = source.describe().columns
    staged.stage(RowChunks(columns=columns, chunks=source.read({"partition": "x`y"})))
    assert staged.finalize_staged_load() == 2
    assert staged.rows() == [(1, "x`y"), (3, "x`y")]


def test_lazy_plan_reads_the_source_without_writing_to_it(ch_route):
    before = ch_route.source_path.read_bytes()
    ch_route.runtime().run(ch_route.spec("lazy-plan"))
    assert ch_route.source_path.read_bytes() == before


def test_lazy_plan_over_a_non_sqlite_source_fails_before_the_target(tmp_path):
    class OtherSource:
        table, partition_column, cursor_column, path = "orders", "region", None, "x"

    sink = _sink(tmp_path)
    plan = LoadPlan(source=OtherSource(), columns=ORDERS, bounds=({"partition": "a"},))
    with pytest.raises(ConfigInvalid) as caught:
        sink.load_plan(plan)
    assert "SQLite sources only" in str(caught.value)
    assert not (tmp_path / "chdata").exists()  # chDB never opened the data path


def test_lazy_plan_with_a_missing_source_file_is_source_invalid(tmp_path):
    build_sample_source(tmp_path / "gone.db", rows=4)
    source = SQLiteSource(tmp_path / "gone.db", "orders", "region")
    columns = source.describe().columns
    (tmp_path / "gone.db").unlink()
    with pytest.raises(SourceInvalid) as caught:
        _sink(tmp_path).load_plan(
            LoadPlan(source=source, columns=columns, bounds=({"partition": 1},))
        )
    # issue 13: the resolved path of a missing source is shown (not secret), never in diagnostics
    assert str(tmp_path / "gone.db") in str(caught.value)
    assert "gone.db" not in str(caught.value.diagnostics)
    assert not (tmp_path / "gone.db").exists()


def test_config_errors_come_before_the_target_and_never_show_paths(tmp_path):
    sink = _sink(tmp_path, partition_by="nope")
    with pytest.raises(ConfigInvalid) as caught:
        sink.load(_chunks((1, "a", 1.0)))
    assert caught.value.diagnostics == {"table": "t", "column": "nope"}
    with pytest.raises(ConfigInvalid):
        _sink(tmp_path).load(_chunks((1, "a", 1.0), columns=(Column("a\x00", "INT"),) * 3))
    with pytest.raises(ConfigInvalid) as folder:
        ClickHouseSink(tmp_path / "no-such" / "data", "t").row_count()
    assert "no-such" not in str(folder.value)
    assert not (tmp_path / "chdata").exists()


def test_a_value_json_cannot_carry_is_a_config_error(tmp_path):
    with pytest.raises(ConfigInvalid) as caught:
        encode_json_rows([(1, object())])
    assert "object" not in str(caught.value)


# --- the server adapter's clickhouse-connect calls, on clickhouse-connect's chdb backend --------


class ConnectDrivenSink(ClickHouseSink):
    """The real sink and its server adapter; clickhouse-connect's client runs on ``chdb://``.

    This drives every clickhouse-connect call the server adapter makes (get_client, server-side
    parameters, command, query, raw_insert from a generator and from a file) through the real
    driver, with chDB as its backend instead of HTTP. It says nothing about HTTP or a server.
    One client serves the whole test: clickhouse-connect's chdb client takes ~0.8 s to open.
    """

    def __init__(self, data_path: Path, table: str, **kwargs) -> None:
        super().__init__("http://server-adapter.invalid", table, **kwargs)
        self.adapter = ServerClient(f"chdb://{data_path}")

    @contextlib.contextmanager
    def client(self):
        yield self.adapter


def test_server_adapter_runs_every_path_through_clickhouse_connect(tmp_path):
    route = Route(tmp_path, kind="clickhouse")
    sink = ConnectDrivenSink(tmp_path / "connect-data", "orders_copy", partition_by="region")
    route.sink = RecordingSink(sink)
    try:
        for number, path in enumerate(PATHS):
            if number:
                route.add_rows(10)
            result = route.runtime().run(route.spec(path, run_id=f"run-{number}"))
            assert result.rows_loaded == (120 if number == 0 else 10)
            assert route.target_rows() == route.source_rows()
        route.add_rows(5)
        route.runtime().run(route.spec("staged", run_id="refresh", strategy="full_refresh"))
        route.runtime().run(route.spec("lazy-plan", run_id="refresh", strategy="full_refresh"))
        assert route.target_rows() == route.source_rows() and len(route.source_rows()) == 155
        assert _tables(sink) == {
            "orders_copy": ("MergeTree", "region"),
            "_dpone_ledger": ("MergeTree", ""),
        }
        assert _partitions(sink) == REGIONS
        adapter = sink.adapter
        adapter.command("CREATE TABLE b (s Nullable(String)) ENGINE = MergeTree ORDER BY tuple()")
        blob = [Column("s", "BLOB")]
        assert adapter.insert_rows("b", blob, [[(b"\x00\xff\xfe",), ("\u00e9".encode(),)]]) == 2
        assert adapter.query_rows("SELECT hex(s) FROM b ORDER BY s") == [("00FFFE",), ("C3A9",)]
        for value in ("tab\there", "a\\b", "line\nbreak", "'\"`", "\x00", "{x:String}"):
            assert adapter.query_rows("SELECT {p:String}", {"p": value}) == [(value,)]
    finally:
        sink.adapter.close()
        route.real_store.close()


# --- SQL rendering, locations, secrecy (no engine) ---------------------------------------------


def test_quote_escapes_backticks_and_backslashes_and_refuses_nul():
    assert quote("a`b\\c d") == "`a\\`b\\\\c d`"
    for bad in ("", "a\x00b", None, 3):
        with pytest.raises(ConfigInvalid):
            quote(bad)
    with pytest.raises(ConfigInvalid):
        ClickHouseSink("data", "bad\x00table")
    with pytest.raises(ConfigInvalid):
        ClickHouseSink("data", "t", partition_by="p\x00")


@pytest.mark.parametrize(
    ("decltype", "expected"),
    [
        ("INTEGER", "Nullable(Int64)"),
        ("BIGSERIAL", "Nullable(Float64)"),  # NUMERIC affinity in SQLite: no INT in the name
        ("VARCHAR(20)", "Nullable(String)"),
        ("REAL", "Nullable(Float64)"),
        ("BLOB", "Nullable(String)"),
        ("", "Nullable(String)"),
        ("UUID", "Nullable(String)"),
        ("TIME", "Nullable(String)"),
        ("BOOLEAN", "Nullable(Bool)"),
        ("DATE", "Nullable(Date32)"),
        ("TIMESTAMP WITH TIME ZONE", "Nullable(DateTime64(6, 'UTC'))"),
        ("NUMERIC(12, 2)", "Nullable(Decimal(12, 2))"),
        ("DECIMAL(5)", "Nullable(Decimal(5, 0))"),
        ("NUMERIC", "Nullable(Float64)"),
        ("NUMERIC(99, 2)", "Nullable(Float64)"),
        ("MONEY", "Nullable(Float64)"),
    ],
)
def test_column_types_follow_the_sqlite_kind(decltype, expected):
    assert column_type(Column("c", decltype)) == expected


@pytest.mark.parametrize(
    ("decltype", "expected"),
    [
        ("numeric", "Nullable(String)"),  # an exact decimal of any size stays its text
        ("numeric(12,2)", "Nullable(Decimal(12, 2))"),
        ("numeric(99,2)", "Nullable(String)"),
        ("interval", "Nullable(String)"),
        ("time without time zone", "Nullable(String)"),
        ("timestamp with time zone", "Nullable(DateTime64(6, 'UTC'))"),
        ("double precision", "Nullable(Float64)"),
        ("jsonb", "Nullable(String)"),
        ("integer[]", "Nullable(String)"),
    ],
)
def test_postgres_columns_get_the_type_of_their_kind(decltype, expected):
    assert column_type(Column("c", decltype, postgres_kind(decltype))) == expected


def test_create_table_sql_partitions_by_the_nullable_column():
    sql = create_table_sql(TableName("raw", "t"), ORDERS, "region")
    assert sql.startswith("CREATE TABLE IF NOT EXISTS `raw`.`t` (")
    assert sql.endswith(
        "ENGINE = MergeTree PARTITION BY `region` ORDER BY tuple() SETTINGS allow_nullable_key = 1,"
        " non_replicated_deduplication_window = 1000"
    )
    assert create_table_sql(TableName(None, "t"), ORDERS, None).endswith(
        "ENGINE = MergeTree ORDER BY tuple() SETTINGS non_replicated_deduplication_window = 1000"
    )


def test_where_sql_uses_typed_parameters_only():
    predicates = bound_predicates(
        {"partition": "O'B", "cursor_after": 5, "cursor_upto": 9.5},
        partition_column="region",
        cursor_column="cur",
    )
    assert where_sql(predicates, prefix="b0_") == (
        "`region` = {b0_0:String} AND `cur` > {b0_1:Int64} AND `cur` <= {b0_2:Float64}",
        {"b0_0": "O'B", "b0_1": 5, "b0_2": 9.5},
    )
    null = bound_predicates({"partition": None}, partition_column="region", cursor_column=None)
    assert where_sql(null, prefix="p") == ("`region` IS NULL", {})
    for bad in (True, b"x", 2**63, [1]):
        with pytest.raises(ConfigInvalid):
            where_sql([Predicate("c", "=", bad)], prefix="p")
    with pytest.raises(InternalInvariantBroken):  # bounds never make one: a bug, not config
        where_sql([Predicate("c", "; DROP", 1)], prefix="p")
    with pytest.raises(ConfigInvalid):
        where_sql([], prefix="p")


def test_partition_ids_are_checked_before_they_are_inlined():
    assert partition_id_literal("-3528") == "'-3528'"
    hashed = "2b16b490a87466b6a6d34fd9027f3c3d"
    assert partition_id_literal(hashed) == f"'{hashed}'"
    for bad in ("a'b", "", "a b", None):
        with pytest.raises(ConfigInvalid):
            partition_id_literal(bad)


def test_locations_choose_the_adapter(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert parse_location("data/ch") == Location("chdb", str(tmp_path / "data" / "ch"))
    assert parse_location(tmp_path / "x").kind == "chdb"
    for url in (
        "clickhouse://u:p@host:8123/db",
        "http://host",
        "HTTPS://u@host:8443/db",
    ):
        assert parse_location(url) == Location("server", url)
    for bad in ("", "  ", None, "a\x00b", "postgres://u:pw@host/db", "http:///db",
                "http://host:notaport/db", "data?mode=ro", "https://[::1/db"):  # fmt: skip
        with pytest.raises(ConfigInvalid) as caught:
            parse_location(bad)
        if isinstance(bad, str) and bad.strip():
            assert bad not in str(caught.value) and "pw" not in str(caught.value)


def test_repr_never_shows_the_location():
    url = "https://bob:s3cretpw@ch.example.internal:8443/warehouse"
    sink = ClickHouseSink(url, "orders_copy", partition_by="region")
    shown = repr(sink) + repr(parse_location(url))
    assert shown == "ClickHouseSink(table='orders_copy', engine='server')Location(kind='server')"
    assert sink.kind == "server" and "s3cretpw" not in str(vars(sink).keys())
    assert "secret-dir" not in repr(ClickHouseSink("/tmp/secret-dir/ch", "t"))


def test_unreachable_server_raises_the_driver_error_without_credentials():
    """UNVERIFIED against a real server; this only shows what a refused connection gives."""
    with socket.socket() as probe:  # a loopback port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    sink = ClickHouseSink(f"http://bob:s3cretpw@127.0.0.1:{port}/db", "t")
    with pytest.raises(Exception) as caught:
        sink.row_count()
    assert not isinstance(caught.value, NativeTransferError)
    assert type(caught.value).__module__.startswith("clickhouse_connect")
    assert "s3cretpw" not in str(caught.value) and "s3cretpw" not in repr(caught.value.args)


@pytest.mark.parametrize(
    ("module", "location"), [("chdb.session", "data"), ("clickhouse_connect", "http://h")]
)
def test_missing_extra_names_the_install_command(monkeypatch, tmp_path, module, location):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setitem(sys.modules, module, None)  # what an environment without the extra gives
    with pytest.raises(ConfigInvalid) as caught:
        open_client(parse_location(location))
    assert "pip install 'dpone-native-transfer[clickhouse]'" in str(caught.value)
    assert "http://h" not in str(caught.value)
