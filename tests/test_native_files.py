"""legacy and file-artifact into DuckDB and chDB: the rows are written, before the target call,
in the format the engine reads itself (an Arrow IPC stream, ``NativeFiles``), and the target
call only reads those files. Real engines; the wrappers only watch or inject a fault."""

from __future__ import annotations

import errno
import math
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from helpers.routes import Route, make_sink

from dpone_native_transfer import SQLiteSource
from dpone_native_transfer.artifacts import file_sha256
from dpone_native_transfer.errors import ArtifactInvalid
from dpone_native_transfer.payloads import LoadFiles
from dpone_native_transfer.testing import assert_rows_exactly_once

KINDS = ["duckdb", "clickhouse"]
FILE_PATHS = ["legacy", "file-artifact"]


class Watching:
    """The real sink; ``before_load(payload)`` runs at the start of every load."""

    def __init__(self, inner: Any, before_load: Callable[[Any], None]) -> None:
        self.inner, self.before_load = inner, before_load

    def load(self, payload: Any) -> int:
        self.before_load(payload)
        return self.inner.load(payload)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def _route(tmp_path: Path, kind: str, before_load: Callable[[Any], None]) -> Route:
    sink = Watching(make_sink(kind, tmp_path / f"target-{kind}"), before_load)
    return Route(tmp_path, kind=kind, sink=sink)


@pytest.mark.parametrize("path", FILE_PATHS)
@pytest.mark.parametrize("kind", KINDS)
def test_the_target_call_reads_arrow_files_written_before_it(tmp_path, kind, path):
    seen: list[LoadFiles] = []

    def check(payload: Any) -> None:
        assert isinstance(payload, LoadFiles) and payload.files
        for file in payload.files:  # every file is already whole, in the engine's format
            assert file.native and file.path.suffix == ".arrows"
            with pa.OSFile(str(file.path)) as handle:
                assert pa.ipc.open_stream(handle).read_all().num_rows == file.rows
            assert file_sha256(file.path) == file.sha256
        seen.append(payload)

    route = _route(tmp_path, kind, check)
    try:
        result = route.runtime().run(route.spec(path))
        [payload] = seen
        assert result.rows_loaded == sum(file.rows for file in payload.files) == 120
        assert_rows_exactly_once(route.source_ids(), route.target_ids())
        if path == "file-artifact":  # one file per partition, its digest in its checkpoint
            recorded = {cp.diagnostics["artifact_sha256"] for cp in route.latest()}
            assert recorded == {file.sha256 for file in payload.files}
            assert len(payload.files) == 4
    finally:
        route.real_store.close()


class NaNSource(SQLiteSource):
    """The real source, with a NaN amount in region-001 (SQLite itself cannot hold one)."""

    def read(self, bounds: Any, *, chunk_rows: int = 10_000) -> Iterator[list[tuple]]:
        for chunk in super().read(bounds, chunk_rows=chunk_rows):
            yield [(i, r, math.nan if r == "region-001" else a, u) for i, r, a, u in chunk]

    def read_partitions(self, bounds: Any, *, chunk_rows: int = 10_000) -> None:
        return None  # the NaN is added by read only


def test_a_value_arrow_cannot_hold_keeps_its_file_in_the_runtime_format(tmp_path):
    """DuckDB gets a NaN as the text ``'nan'`` (its binding would make a float NaN NULL), which
    an Arrow double cannot hold: that partition's file is a spool file, the others Arrow."""
    seen: list[LoadFiles] = []
    route = _route(tmp_path, "duckdb", seen.append)
    route.source = NaNSource(str(route.source_path), "orders", "region", "updated_at")
    try:
        assert route.runtime().run(route.spec("file-artifact")).rows_loaded == 120
        [payload] = seen
        native = {file.path.stem: file.native for file in payload.files}
        by_region = {cp.partition_bounds["partition"]: cp.partition_id for cp in route.latest()}
        assert native == {pid: region != "region-001" for region, pid in by_region.items()}
        amounts = {row[0]: row[2] for row in route.target_rows() if row[1] == "region-001"}
        assert amounts and all(math.isnan(amount) for amount in amounts.values())
    finally:
        route.real_store.close()


@pytest.mark.parametrize("path", FILE_PATHS)
@pytest.mark.parametrize("kind", KINDS)
def test_an_artifact_changed_before_the_engine_reads_it_loads_nothing(tmp_path, kind, path):
    """Bytes appended after the stream's end: the engine would read the same rows, yet the
    digest differs. DuckDB hashes what it reads; chDB's files are checked just before."""
    tampering = [False]

    def tamper(payload: Any) -> None:
        if tampering[0]:
            with open(payload.files[-1].path, "ab") as handle:
                handle.write(b"\0" * 8)

    route = _route(tmp_path, kind, tamper)
    try:
        route.runtime().run(route.spec(path, run_id="r1"))
        route.add_rows(40)
        tampering[0] = True
        with pytest.raises(ArtifactInvalid) as caught:
            route.runtime().run(route.spec(path, run_id="r2"))
        assert set(caught.value.diagnostics) == {"file"}
        assert caught.value.diagnostics["file"].endswith(".arrows")
        assert len(route.target_ids()) == 120  # nothing of the second load
    finally:
        route.real_store.close()


class FullDisk:
    """The real sink, whose native file write fails half way with ENOSPC."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def write_load_file(self, path: Path, columns: Any, chunks: Any) -> Any:
        def half() -> Iterator[Any]:
            iterator = iter(chunks)
            yield next(iterator)
            raise OSError(errno.ENOSPC, "No space left on device")

        return self.inner.write_load_file(path, columns, half())

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


@pytest.mark.parametrize("path", FILE_PATHS)
@pytest.mark.parametrize("kind", KINDS)
def test_a_full_disk_fails_before_the_target_and_the_retry_loads_once(tmp_path, kind, path):
    """The load file is written before the target call, so a full disk never blocks the route."""
    real = make_sink(kind, tmp_path / f"target-{kind}")
    route = Route(tmp_path, kind=kind, sink=FullDisk(real))
    try:
        with pytest.raises(OSError) as caught:
            route.runtime().run(route.spec(path, run_id="r1"))
        assert caught.value.errno == errno.ENOSPC
        assert route.sink.target_calls == 0
        route.sink.inner = real  # space again
        assert route.runtime().run(route.spec(path, run_id="r2")).rows_loaded == 120
        assert route.sink.target_calls == 1
        assert_rows_exactly_once(route.source_ids(), route.target_ids())
    finally:
        route.real_store.close()
