"""One guarded transfer in a child process that kills or stops itself at a chosen point.

Run by ``tests/recovery/test_crash_matrix.py`` (SIGKILL) and ``tests/recovery/test_pause_matrix.py``
(SIGSTOP) as::

    python tests/helpers/crash_child.py --store sqlite:PATH|postgres:DSN:SCHEMA '<json>'

The JSON names the case's databases (a ``helpers.matrix_targets.Place``: a SQLite
source, a SQLite, DuckDB, ClickHouse (chDB) or PostgreSQL target), the run id, the point, the signal
(``kill``: SIGKILL; ``stop``: SIGSTOP, the process resumes when the test sends
SIGCONT), the lease's length and a marker file. Every part is the real one: the
checkpoint store, the source and sink, and the guard from its entry point. Thin
wrappers add only the signal; just before it, the child writes the point's name to
the marker file, so the test can tell "stopped where asked" from "stopped elsewhere".
Each point fires once.

A stopped child that is resumed finishes its run as ``dpone-transfer run`` would:
exit 0, or the CLI's exit code for its error, whose code and message it prints on
stderr (``error: CODE: message``) with its safe diagnostics (``diagnostics: JSON``) and
its ``applied`` attribute (``applied: True|False|None``: what the error says of the
target).

The points, in the order a run reaches them, and the seam each uses:

- ``after-lease``: the route scan's first read of the store: the lease was just taken;
- ``extraction``: row paths: the source, once the 2nd partition's extraction has begun
  (after its first chunk was handed on), or partway through the SQLite target's pull
  statement (SQLite's progress handler), or once DuckDB's pull wrote its files (a
  ClickHouse route of the matrix reads its rows itself: a batch column, or a merge);
  lazy-plan, which extracts inside the target call: when the sink is handed the plan,
  before it opens the target;
- ``armed-batch-partial``: the store writes the armed batch item by item with
  the real store's ``upsert`` and dies after the first (the store port promises
  no atomicity, so such a store is legal);
- ``after-armed-batch``: right after the armed ``upsert_many`` returned;
- ``target-before-commit``: the sink's engine module's ``_record`` returned: inside the
  load's transaction, every row and the ledger row written and the fence checked,
  right before COMMIT. ClickHouse has no transaction, and its ``_record`` writes the
  ledger row after the rows: there it dies as ``_record`` is called, the rows written
  and the ledger row not (only the rows' batch column can prove the batch);
- ``target-before-ledger`` (pauses only): as the engine module's ``_record`` is called:
  the rows written, the ledger row and its lock not;
- ``target-after-commit``: right after the real sink method returned, before
  the boundary learns of it;
- ``after-target-success``: a plugin's ``after_target_success``, called before
  the guard's promotion;
- ``promotion-partial``: the committed batch, written item by item, dies after
  the first;
- ``after-promotion``: ``record_evidence`` is called (evidence not written);
- ``after-evidence``: ``save_source_state`` is called (evidence written).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import multiprocessing
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

import attrs

if __package__ in (None, ""):  # run as a script: the tests folder holds its package
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dpone_native_transfer import (  # noqa: E402
    ClickHouseSink,
    DuckDBSink,
    PartitionCheckpoint,
    PostgresSink,
    PostgresSource,
    RouteKey,
    SQLiteCheckpointStore,
    SQLiteSink,
    SQLiteSource,
    TransferRuntime,
    TransferSpec,
    hookimpl,
)
from dpone_native_transfer.lease import Lease  # noqa: E402
from dpone_native_transfer.reporting import exit_code_for  # noqa: E402
from dpone_native_transfer.testing import phase_batch  # noqa: E402
from helpers.matrix_targets import SOURCE_TABLE, TARGET_TABLE, Place  # noqa: E402

__all__ = [
    "CHUNK_ROWS",
    "KILL_POINTS",
    "PAUSE_POINTS",
    "SOURCE_TABLE",
    "TARGET_TABLE",
    "open_store",
    "transfer_spec",
]

KILL_POINTS = (
    "extraction",
    "armed-batch-partial",
    "after-armed-batch",
    "target-before-commit",
    "target-after-commit",
    "after-target-success",
    "promotion-partial",
    "after-promotion",
    "after-evidence",
)
# Every step between the lease's take and the target's commit.
PAUSE_POINTS = ("after-lease", "extraction", "after-armed-batch", "target-before-commit")
# As ``_record`` is called: the rows written, the ledger row and its lock not (one test's).
POINTS = frozenset({*KILL_POINTS, *PAUSE_POINTS, "target-before-ledger"})
CHUNK_ROWS = 100  # several chunks per partition, so a kill can fall between two of them
NOT_REACHED = 4  # exit status of a killing child that finished without reaching its point
SIGNALS = {"kill": signal.SIGKILL, "stop": signal.SIGSTOP}

_ARMED, _COMMITTED = phase_batch("armed"), phase_batch("checkpoint_committed")


def transfer_spec(
    source: Any, sink: Any, *, path: str, run_id: str, chunk_rows: int = CHUNK_ROWS, **options: Any
) -> TransferSpec:
    """The matrices' route: orders -> orders_copy on updated_at, incremental_append unless
    ``options`` name another strategy (``Place.spec_options``)."""
    options = {"strategy": "incremental_append", **options}
    return TransferSpec(
        source=source, sink=sink, path=path, run_id=run_id, chunk_rows=chunk_rows, **options
    )


def open_store(choice: str) -> Any:
    """``sqlite:PATH`` or ``postgres:DSN:SCHEMA`` (the schema is after the last colon)."""
    kind, _, rest = choice.partition(":")
    if kind == "sqlite" and rest:
        return SQLiteCheckpointStore(rest)
    if kind == "postgres" and rest.count(":") >= 1:
        from dpone_native_transfer.stores.postgres import PostgresCheckpointStore

        dsn, _, schema = rest.rpartition(":")
        return PostgresCheckpointStore(dsn, schema=schema)
    raise ValueError("--store must be sqlite:PATH or postgres:DSN:SCHEMA")


@attrs.define
class Killer:
    """Knows the one point of this child; ``at(point)`` signals there, once, and nowhere else."""

    point: str
    marker: Path
    signum: int = signal.SIGKILL
    fired: bool = False

    def at(self, point: str) -> None:
        if point == self.point and not self.fired:
            self.fired = True
            with _heartbeats_held(self.signum):
                self.marker.write_text(point)  # written and closed before the signal
                os.kill(os.getpid(), self.signum)  # SIGSTOP: resumed here by the test's SIGCONT


_LEASES: list[Lease] = []  # every lease this child took (``_recording_leases``)


def _recording_leases() -> None:
    """Record each lease the run takes, so that a stop can wait out its heartbeat."""
    acquire = Lease.acquire

    @functools.wraps(acquire)
    def recorded(self: Lease) -> Lease:
        _LEASES.append(self)
        return acquire(self)

    Lease.acquire = recorded  # type: ignore[method-assign]


@contextlib.contextmanager
def _heartbeats_held(signum: int) -> Iterator[None]:
    """For a stop, each lease's heartbeat lock held across it: the process stops between
    two renewals, never inside one, whose store transaction would hold a SQLite store's
    write lock until the test resumes it (a real pause can; the matrix asks what the
    paused attempt does, not what a locked store does)."""
    with contextlib.ExitStack() as held:
        if signum == signal.SIGSTOP:
            for lease in _LEASES:
                held.enter_context(lease._lock)
        yield


class CrashSource(SQLiteSource):
    """The real SQLite source; it signals once the 2nd partition's extraction has begun."""

    def __init__(self, inner: SQLiteSource, killer: Killer) -> None:
        super().__init__(inner.path, inner.table, inner.partition_column, inner.cursor_column)
        self.killer = killer
        self.partitions = 0

    def read(self, bounds: Mapping[str, Any], *, chunk_rows: int = 10_000) -> Iterator[list]:
        chunks = super().read(bounds, chunk_rows=chunk_rows)
        if "cursor_from" in bounds:  # a read of a window's top rows, not extraction
            return chunks
        self.partitions += 1
        return self._first_chunk_then_kill(chunks) if self.partitions == 2 else chunks

    def read_partitions(self, bounds: Any, *, chunk_rows: int = 10_000) -> Iterator[Any] | None:
        """One scan for every partition (an unindexed column): dies once rows of a 2nd one came."""
        scan = super().read_partitions(bounds, chunk_rows=chunk_rows)
        return None if scan is None else self._second_partition_then_kill(scan)

    def _second_partition_then_kill(self, scan: Iterator[Any]) -> Iterator[Any]:
        seen: set[int] = set()
        for index, rows in scan:
            yield index, rows
            seen.add(index)
            if len(seen) == 2:
                self.killer.at("extraction")

    def _first_chunk_then_kill(self, chunks: Iterator[list]) -> Iterator[list]:
        yield next(chunks)
        self.killer.at("extraction")  # the path has taken the first chunk and asks for more
        yield from chunks

    def table_sql(self, bounds: Any, *, conn: Any, **kwargs: Any) -> tuple[str, tuple] | None:
        """A pull's one statement for every partition (legacy and staged into SQLite): dies
        partway through it, SQLite's progress handler calling as the statement runs."""
        whole = super().table_sql(bounds, conn=conn, **kwargs)
        if whole is not None:
            conn.set_progress_handler(lambda: self.killer.at("extraction"), 1_000)
        return whole

    def select_sql(self, bounds: Mapping[str, Any], **kwargs: Any) -> tuple[str, tuple]:
        """A pull of one statement per partition (file-artifact into SQLite), before the
        target call: dies when the 2nd partition's query is asked for."""
        if "cursor_from" in bounds:  # a read of a window's top rows, not extraction
            return super().select_sql(bounds, **kwargs)
        self.partitions += 1
        if self.partitions == 2:
            self.killer.at("extraction")
        return super().select_sql(bounds, **kwargs)


class CrashPostgresSource(PostgresSource):
    """The real PostgreSQL source; it signals inside its bulk read's ``COPY ... TO STDOUT``,
    once the first block (binary) or batch (CSV into Arrow) is taken and before the COPY
    ends; or, into a target that loads no bulk files (``in_rows``), once its read of rows
    handed on the 2nd partition's first chunk. A run that reads otherwise is not killed."""

    killer: Killer
    in_rows = False
    partitions = 0

    def read(self, bounds: Mapping[str, Any], *, chunk_rows: int = 10_000) -> Iterator[list]:
        chunks = super().read(bounds, chunk_rows=chunk_rows)
        if "cursor_from" in bounds or not self.in_rows:  # top rows, or not the expected read
            return chunks
        self.partitions += 1
        return _first_then_kill(chunks, self.killer) if self.partitions == 2 else chunks

    def read_partitions(self, bounds: Any, *, chunk_rows: int = 10_000) -> Iterator[Any] | None:
        """One scan for every partition: dies once it came (rows of each are in its chunks)."""
        scan = super().read_partitions(bounds, chunk_rows=chunk_rows)
        if scan is None or not self.in_rows:
            return scan
        return _first_then_kill(scan, self.killer)

    def _copied(self, *args: Any) -> Iterator[Any]:
        return _first_then_kill(super()._copied(*args), self.killer)

    def _repeatable(self, work: Any) -> Any:
        return super()._repeatable(lambda conn: work(_KillingCopies(conn, self.killer)))


class _KillingCopies:
    """A source connection whose ``COPY ... TO STDOUT`` dies after its first block."""

    def __init__(self, conn: Any, killer: Killer) -> None:
        self._conn, self._killer = conn, killer

    def cursor(self) -> Any:
        cursor, killer = self._conn.cursor(), self._killer

        class Copying:
            def copy(self, statement: str, params: Any = None) -> Any:
                return _KilledCopy(cursor.copy(statement, params), killer)

            def __getattr__(self, name: str) -> Any:
                return getattr(cursor, name)

        return Copying()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._conn, name)


@contextlib.contextmanager
def _KilledCopy(copy: Any, killer: Killer) -> Iterator[Any]:  # noqa: N802
    with copy as blocks:
        yield _first_then_kill(iter(blocks), killer)


def _first_then_kill(items: Iterator[Any], killer: Killer) -> Iterator[Any]:
    for number, item in enumerate(items):
        yield item
        if number == 0:
            killer.at("extraction")  # the read has handed on its first part, and goes on


def crash_source(place: Place, killer: Killer) -> Any:
    """The place's source with its extraction seam (``CrashSource``, ``CrashPostgresSource``)."""
    if not place.pg_source:
        return CrashSource(place.make_source(), killer)
    source = CrashPostgresSource(
        str(place.url), f"{place.schema}.{SOURCE_TABLE}", "region", "updated_at"
    )
    source.killer, source.in_rows = killer, place.target == "sqlite"
    return source


class TargetSeams:
    """Mixed in before a real sink: it signals when handed a plan to pull (lazy-plan's
    extraction), after DuckDB's pull, and right after the target call returned."""

    killer: Killer

    def load(self, payload: Any, **ledger: Any) -> int:
        return self._target_call(super().load, payload, **ledger)  # type: ignore[misc]

    def load_plan(self, plan: Any, **ledger: Any) -> int:
        self.killer.at("extraction")  # the sink pulls the rows itself, from now on
        return self._target_call(super().load_plan, plan, **ledger)  # type: ignore[misc]

    def finalize_staged_load(self, **kwargs: Any) -> int:
        return self._target_call(super().finalize_staged_load, **kwargs)  # type: ignore[misc]

    def pull_load_files(self, plan: Any, paths: Any) -> Any:
        pulled = super().pull_load_files(plan, paths)  # type: ignore[misc]
        self.killer.at("extraction")  # DuckDB's pull has no seam of ours while it reads
        return pulled

    def _target_call(self, call: Any, *args: Any, **kwargs: Any) -> int:
        rows = call(*args, **kwargs)
        self.killer.at("target-after-commit")
        return rows


class SQLiteSeams(TargetSeams, SQLiteSink):
    pass


class DuckDBSeams(TargetSeams, DuckDBSink):
    pass


class PostgresSeams(TargetSeams, PostgresSink):
    pass


class ClickHouseSeams(TargetSeams, ClickHouseSink):
    pass


_SEAMS = {
    "sqlite": SQLiteSeams,
    "duckdb": DuckDBSeams,
    "postgres": PostgresSeams,
    "clickhouse": ClickHouseSeams,
}
_ENGINES = {
    "sqlite": "dpone_native_transfer.connectors.sqlite.sink",
    "duckdb": "dpone_native_transfer.connectors.duckdb.sink",
    "postgres": "dpone_native_transfer.connectors.postgres_sink",
    "clickhouse": "dpone_native_transfer.connectors.clickhouse.sink",
}


def crash_sink(place: Place, killer: Killer) -> Any:
    """The real sink of ``place`` with the seams; for ``target-before-commit`` its engine
    module's ``_record`` (called inside every load's transaction, last) signals after it;
    ClickHouse's (the ledger row, after the rows) as it is called."""
    if place.target == "postgres":
        seamed = PostgresSeams(place.url, place.target_table)
    elif place.target == "clickhouse":  # as ``Place.make_sink`` makes it
        seamed = ClickHouseSeams(str(place.target_path), place.target_table, partition_by="region")
    else:
        seamed = _SEAMS[place.target](str(place.target_path), place.target_table)
    seamed.killer = killer
    if killer.point in ("target-before-commit", "target-before-ledger"):
        module = sys.modules[_ENGINES[place.target]]
        record = module._record
        before = place.target == "clickhouse" or killer.point == "target-before-ledger"

        @functools.wraps(record)
        def _record(*args: Any, **kwargs: Any) -> int:
            if before:
                killer.at(killer.point)
            rows = record(*args, **kwargs)
            killer.at(killer.point)
            return rows

        module._record = _record
    return seamed


class CrashStore:
    """The real checkpoint store; it dies inside or after a chosen write."""

    def __init__(self, inner: Any, killer: Killer) -> None:
        self.inner = inner
        self.killer = killer

    def upsert(self, checkpoint: PartitionCheckpoint) -> None:
        self.upsert_many([checkpoint])

    def upsert_many(self, checkpoints: Sequence[PartitionCheckpoint], **held: Any) -> None:
        batch = tuple(checkpoints)
        if _ARMED(batch):
            self._write(batch, held, partial="armed-batch-partial")
            self.killer.at("after-armed-batch")
        elif _COMMITTED(batch):
            self._write(batch, held, partial="promotion-partial")
        else:
            self.inner.upsert_many(batch, **held)

    def _write(
        self, batch: tuple[PartitionCheckpoint, ...], held: dict[str, Any], *, partial: str
    ) -> None:
        """The batch; or, in a child that dies at ``partial``, its first item, then death.

        Item by item is how a store without transactions writes a batch. ``held``: the
        lease the write is made under (``HeldStore``).
        """
        if self.killer.point == partial:
            self.inner.upsert(batch[0])
            self.killer.at(partial)
        self.inner.upsert_many(batch, **held)

    def list_latest(self, route: RouteKey) -> list[PartitionCheckpoint]:
        self.killer.at("after-lease")
        return self.inner.list_latest(route)

    def list_target_latest(self, route: RouteKey) -> list[PartitionCheckpoint]:
        """The route scan's first read (the store is target-scoped): the lease is held."""
        self.killer.at("after-lease")
        return self.inner.list_target_latest(route)

    def load_source_state(self, route: RouteKey) -> dict[str, Any] | None:
        return self.inner.load_source_state(route)

    def record_evidence(
        self, route: RouteKey, run_id: str, record: dict[str, Any], **held: Any
    ) -> None:
        self.killer.at("after-promotion")
        self.inner.record_evidence(route, run_id, record, **held)

    def save_source_state(self, route: RouteKey, state: dict[str, Any], **held: Any) -> None:
        self.killer.at("after-evidence")
        self.inner.save_source_state(route, state, **held)

    def __getattr__(self, name: str) -> Any:
        """The store's other capabilities (target scope, adoption, leases) pass through."""
        return getattr(self.inner, name)

    def list_evidence(self, route: RouteKey) -> list[dict[str, Any]]:
        return self.inner.list_evidence(route)


@attrs.define(eq=False)
class KillBeforePromotion:
    """A plugin beside the guard whose ``after_target_success`` dies before the guard's runs."""

    killer: Killer

    # tryfirst: this must run before the guard's promotion, which is firstresult
    @hookimpl(tryfirst=True)
    def after_target_success(self, mutation: Any, result: Any) -> None:
        self.killer.at("after-target-success")


def plugins_for(killer: Killer) -> list[object] | None:
    """None (the guard from its entry point, as in production), or the guard plus the killer.

    An explicit list replaces the entry points, so the guard is loaded from
    its entry point by hand.
    """
    if killer.point != "after-target-success":
        return None
    guard = metadata.entry_points(group="dpone_native_transfer")["target_commit_guard"].load()
    return [guard, KillBeforePromotion(killer)]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store", required=True, metavar="sqlite:PATH|postgres:DSN:SCHEMA")
    parser.add_argument(
        "case",
        type=json.loads,
        help="JSON: place, run_id, point, signal, lease_seconds, marker; chunk_rows, ledger",
    )
    args = parser.parse_args(argv)
    case = args.case
    if case["point"] not in POINTS:
        parser.error(f"unknown point {case['point']!r}")
    place = Place.from_dict(case["place"])
    killer = Killer(case["point"], Path(case["marker"]), SIGNALS[case["signal"]])
    _recording_leases()
    source = place.make_source()
    # lazy-plan's extraction is the sink's (``TargetSeams``); it carries a merge route's rows
    # as legacy does, read from the source
    if place.path != "lazy-plan" or place.merge:
        source = crash_source(place, killer)
    spec = transfer_spec(
        source,
        crash_sink(place, killer),
        path=place.path,
        run_id=case["run_id"],
        chunk_rows=case.get("chunk_rows", CHUNK_ROWS),
        ledger=case.get("ledger", True),
        **place.spec_options(),
    )
    real_store = open_store(args.store)
    try:
        TransferRuntime(
            CrashStore(real_store, killer),
            plugins=plugins_for(killer),
            lease_seconds=case["lease_seconds"],
        ).run(spec)
    except Exception as error:  # as ``dpone-transfer run`` reports it
        if case["signal"] == "kill":
            raise
        print(f"error: {error}", file=sys.stderr)
        diagnostics = getattr(error, "diagnostics", {})
        print(f"diagnostics: {json.dumps(diagnostics, default=str)}", file=sys.stderr)
        print(f"applied: {getattr(error, 'applied', None)}", file=sys.stderr)
        return exit_code_for(error)
    finally:
        real_store.close()
    if case["signal"] == "kill":
        print(f"the run finished without reaching point {killer.point!r}", file=sys.stderr)
        return NOT_REACHED
    return 0


# The crash matrix starts hundreds of these children. Each would import the package again
# (0.3-0.4 s, half a child's time); ``run_forked`` forks each from one interpreter, started
# once per test process, that has imported it: a child is still a process of its own, killed
# for real, with nothing of the test's process in it. DuckDB and chDB start threads when
# imported, which a fork would not carry, so each child imports them itself.
_FORKS = multiprocessing.get_context("forkserver")
_FORKS.set_forkserver_preload(["helpers.crash_child", "psycopg"])


class Forked:
    """A forked child (``start_forked``), used as a ``subprocess.Popen`` is: its pid, exit
    status (negative for a signal), wait and kill; its standard output and error are one
    file, ``output``."""

    def __init__(self, process: Any, output: Path) -> None:
        self._process, self.output = process, output

    @property
    def pid(self) -> int:
        return int(self._process.pid)

    @property
    def returncode(self) -> int | None:
        return self._process.exitcode

    def poll(self) -> int | None:
        return self._process.exitcode

    def wait(self, timeout: float | None = None) -> int:
        """The exit status; ``subprocess.TimeoutExpired`` past ``timeout``, still running."""
        self._process.join(timeout)
        if self._process.exitcode is None:
            raise subprocess.TimeoutExpired(f"forked {self.pid}", timeout or 0)
        return int(self._process.exitcode)

    def kill(self) -> None:
        """SIGKILL (which ends a stopped process too), and wait for it."""
        if self._process.exitcode is None:
            self._process.kill()
        self._process.join()

    def text(self) -> str:
        return self.output.read_text()


def start_forked(
    argv: Sequence[str], env: Mapping[str, str], output: Path, *, cli: bool = False
) -> Forked:
    """``python crash_child.py *argv`` (``cli``: ``dpone-transfer *argv``) with ``env``, its
    standard output and error in ``output``, forked warm (see ``_FORKS``)."""
    child = _FORKS.Process(target=_forked_main, args=(list(argv), dict(env), str(output), cli))
    child.start()
    return Forked(child, output)


def run_forked(
    argv: Sequence[str], env: Mapping[str, str], output: Path, timeout: float
) -> int | None:
    """``start_forked`` to its end: the exit status; None past ``timeout`` (killed)."""
    child = start_forked(argv, env, output)
    try:
        return child.wait(timeout)
    except subprocess.TimeoutExpired:
        child.kill()
        return None


def _forked_main(argv: list[str], env: dict[str, str], output: str, cli: bool) -> None:
    descriptor = os.open(output, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.dup2(descriptor, 1)
    os.dup2(descriptor, 2)
    os.environ.clear()
    os.environ.update(env)
    tempfile.tempdir = None  # TMPDIR is the case's
    if cli:
        from dpone_native_transfer._entry import main as command

        sys.argv = ["dpone-transfer", *argv]
        sys.exit(command())
    sys.exit(main(argv))


if __name__ == "__main__":
    sys.exit(main())
