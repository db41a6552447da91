"""The small real route the tests run on, as Python objects (``Route``) or as a route file.

One route, one set of file names: ``build_sample_source``'s ``orders`` table in
``source.db`` (partitioned by ``region``, cursor ``updated_at``) is copied to
``orders_copy`` in the target (``target.db``, ``target.duckdb`` or ``chdata``,
by target kind), with its checkpoints in ``checkpoints.db``. ``Route`` builds
it in-process on real files; ``write_route`` writes the route file
``dpone-transfer run`` reads, and ``Route.route_file`` the file of a
``Route``'s own files.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from dpone_native_transfer import (
    ClickHouseSink,
    DuckDBSink,
    PostgresSink,
    SQLiteCheckpointStore,
    SQLiteSink,
    SQLiteSource,
    TransferRuntime,
    TransferSpec,
)
from dpone_native_transfer.testing import FaultyStore, RecordingSink, StepClock, build_sample_source

PATHS = ("legacy", "staged", "file-artifact", "lazy-plan")
TARGET_FILES = {"sqlite": "target.db", "duckdb": "target.duckdb", "clickhouse": "chdata"}
# Every shipped sink. A PostgreSQL target is a server (a URL, not a file): see
# tests/connectors/test_connectors_postgres_sink.py for its routes.
SINKS = {
    "sqlite": SQLiteSink,
    "duckdb": DuckDBSink,
    "clickhouse": ClickHouseSink,
    "postgres": PostgresSink,
}
ROUTE_FILE = "route.toml"

# The route file's sections, in the order they are written; a value of None leaves the key out.
SECTIONS: dict[str, dict[str, Any]] = {
    "source": {
        "path": "source.db",
        "table": "orders",
        "partition_column": "region",
        "cursor_column": "updated_at",
    },
    "target": {"kind": None, "path": None, "table": "orders_copy"},
    "transfer": {"strategy": "incremental_append", "path": "staged"},
    "store": {"path": "checkpoints.db"},
}


class Literal(str):
    """A route-file value written as it is, as TOML text: ``Literal("1e20")`` is a float."""


def make_sink(kind: str, location: str | Path, table: str = "orders_copy") -> Any:
    """The real sink of target ``kind`` (ClickHouse partitioned by ``region``); ``location``
    is a file or folder, or a PostgreSQL URL."""
    options = {"partition_by": "region"} if kind == "clickhouse" else {}
    return SINKS[kind](str(location), table, **options)


class NotPulling:
    """The real sink whose engine pulls nothing: the runtime reads the rows itself, as it does
    from a source the engine cannot read (a test of the row paths' own reading)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def engine(self) -> Any:
        return self  # the sink's engine, through this wrapper

    def can_pull(self, plan: Any, files: int) -> bool:
        return False

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


class Route:
    """One route on real files: source table -> target table, with a real checkpoint store.

    ``kind`` picks the target (SQLite, DuckDB or chDB); ``source`` and ``sink``
    replace the sample source and the target of that kind. ``rows=None`` (or a
    ``source``) builds no sample source; ``open_store=False`` leaves the store
    unopened (``real_store`` and ``store`` are None), for a test that damages it first.
    """

    def __init__(
        self,
        tmp: Path,
        *,
        rows: int | None = 120,
        partitions: int = 4,
        kind: str = "sqlite",
        source: Any = None,
        sink: Any = None,
        open_store: bool = True,
    ) -> None:
        tmp.mkdir(parents=True, exist_ok=True)
        self.tmp = tmp
        self.kind = kind
        self.source_path = tmp / "source.db"
        self.target_path = tmp / TARGET_FILES[kind]
        if source is None and rows is not None:
            build_sample_source(self.source_path, rows=rows, partitions=partitions)
        if source is None:
            source = SQLiteSource(str(self.source_path), "orders", "region", "updated_at")
        self.source = source
        self.sink = RecordingSink(sink if sink is not None else make_sink(kind, self.target_path))
        self.store_path = tmp / "checkpoints.db"
        self.real_store = SQLiteCheckpointStore(str(self.store_path)) if open_store else None
        self.store = FaultyStore(self.real_store) if open_store else None
        self.clock = StepClock()

    def runtime(self, **kwargs) -> TransferRuntime:
        kwargs.setdefault("clock", self.clock)
        return TransferRuntime(self.store, **kwargs)

    def spec(self, path: str, run_id: str = "run-1", **kwargs) -> TransferSpec:
        kwargs.setdefault("strategy", "incremental_append")
        kwargs.setdefault("chunk_rows", 16)
        return TransferSpec(source=self.source, sink=self.sink, path=path, run_id=run_id, **kwargs)

    def latest(self):
        return self.real_store.list_latest(self.spec("legacy").route)

    def target_ids(self) -> list[int]:
        return sorted(row[0] for row in self.sink.inner.rows())

    def source_ids(self) -> list[int]:
        with sqlite3.connect(self.source_path) as connection:
            ids = sorted(row[0] for row in connection.execute("SELECT id FROM orders"))
        connection.close()
        return ids

    def source_rows(self) -> list[tuple]:
        with sqlite3.connect(self.source_path) as connection:
            rows = connection.execute("SELECT * FROM orders ORDER BY id").fetchall()
        connection.close()
        return rows

    def target_rows(self) -> list[tuple]:
        return sorted(self.sink.inner.rows())

    def add_rows(self, rows: int = 30) -> None:
        """New source rows, with ids (and cursors) above every earlier one."""
        start = max(row[0] for row in self.source_rows()) + 1
        build_sample_source(self.source_path, rows=rows, partitions=4, start_id=start)

    def route_file(self, **options: Any) -> Path:
        """The route file of this route's files, so ``dpone-transfer run`` can resume it."""
        kind = None if self.kind == "sqlite" else self.kind
        return write_route(self.tmp, kind=kind, **options)


def route_text(
    *,
    path: str = "staged",
    strategy: str = "incremental_append",
    kind: str | None = None,
    target: str | Path | None = None,
    table: str = "orders_copy",
    store: str | Path = "checkpoints.db",
    source: Mapping[str, Any] | None = None,
    sections: Mapping[str, Mapping[str, Any]] | None = None,
) -> str:
    """The route file of the sample route, with the keys a test changes.

    ``path``, ``strategy``: the ``[transfer]`` keys; ``kind`` (left out when None),
    ``target`` (its ``path``, by default the file of ``kind``) and ``table``: the
    ``[target]`` keys; ``store``: the store's path; ``source``: keys of ``[source]``
    added or replaced; ``sections``: keys of any section, added or replaced (new
    sections, such as ``gates``, come last). A key whose value is None is left out.
    A string is written between double quotes exactly as given, so a test can
    write a TOML escape itself, and a ``Literal`` as it is; sections are separated
    by a blank line.
    """
    merged = {name: dict(keys) for name, keys in SECTIONS.items()}
    merged["source"].update(source or {})
    merged["target"].update(kind=kind, path=target or TARGET_FILES[kind or "sqlite"], table=table)
    merged["transfer"].update(strategy=strategy, path=path)
    merged["store"].update(path=store)
    for name, keys in (sections or {}).items():
        merged.setdefault(name, {}).update(keys)
    blocks = []
    for name, keys in merged.items():
        lines = [f"{key} = {_toml(value)}" for key, value in keys.items() if value is not None]
        blocks.append("\n".join([f"[{name}]", *lines]) + "\n")
    return "\n".join(blocks)


def write_route(
    folder: Path,
    *,
    rows: int | None = None,
    partitions: int = 4,
    name: str = ROUTE_FILE,
    **options: Any,
) -> Path:
    """Write ``route_text(**options)`` to ``folder/name``; with ``rows``, build the sample
    source (``rows`` rows in ``partitions`` regions) first. Returns the route file."""
    folder.mkdir(parents=True, exist_ok=True)
    if rows is not None:
        build_sample_source(folder / "source.db", rows=rows, partitions=partitions)
    route_file = folder / name
    route_file.write_text(route_text(**options), encoding="utf-8")
    return route_file


def _toml(value: Any) -> str:
    if isinstance(value, Literal):
        return str(value)
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    return f'"{value}"'


def transfer_once(
    folder: Path, source: Any, sink: Any, *, path: str, strategy: str, run_id: str = "r"
) -> Any:
    """One guarded run of ``source`` into ``sink``, its checkpoints in ``folder``."""
    store = SQLiteCheckpointStore(str(folder / "checkpoints.db"))
    try:
        spec = TransferSpec(source=source, sink=sink, strategy=strategy, path=path, run_id=run_id)
        return TransferRuntime(store).run(spec)
    finally:
        store.close()


class MovingRows:
    """Mixed in before a real source: it reads a partition at a time, and after its first
    read ``move(value)`` (another connection writing the source) runs once."""

    moved = False

    def move(self, done: Any) -> None:
        raise NotImplementedError

    def read_partitions(self, bounds: Any, **kwargs: Any) -> Any:
        return None

    def read(self, bounds: Any, *, chunk_rows: int = 10_000) -> Any:
        yield from super().read(bounds, chunk_rows=chunk_rows)  # type: ignore[misc]
        if not self.moved:
            self.moved = True
            self.move(bounds["partition"])
