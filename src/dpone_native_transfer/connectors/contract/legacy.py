"""The connector contract of release 0.1, kept for one release: its connectors are adapted.

A connector written for it (a ``Source``/``Sink`` and optional runtime-checkable
Protocols, the ledger row handed with ``ledger_batch``) keeps working: ``TransferSpec``
wraps it in ``LegacySink``/``LegacySource``, which speak the current contract, and warns
once (``DeprecationWarning``). Its names stay importable from ``connectors.contract``
with the same warning. Removed in the release after next; see CHANGELOG.md.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from ...errors import ConfigInvalid, NativeTransferError
from . import DEFAULT_CHUNK_ROWS, Sink, SinkFeatures, Source, SourceFeatures, Unsupported
from .engine import EnginePull

if TYPE_CHECKING:
    from ...column_types import Carry, Column
    from ...identity import TableIdentity
    from ...ledger import LedgerEntry
    from ...payloads import (
        ColumnDifference,
        LoadFile,
        LoadFiles,
        LoadPlan,
        Merge,
        RowChunks,
        SourceShape,
    )

__all__ = [
    "CAPABILITIES",
    "BatchCounting",
    "Collating",
    "ConnectionHolding",
    "CursorEdgeReading",
    "FilePulling",
    "Fencing",
    "Identified",
    "LedgerNotWritten",
    "LedgerSink",
    "LegacySink",
    "LegacySource",
    "MergingLoadFiles",
    "NativeFiles",
    "OnePassReading",
    "PendingLedger",
    "PlanPulling",
    "Quarantining",
    "RangePartitioned",
    "SchemaEvolving",
    "Snapshotting",
    "StagePulling",
    "Staging",
    "TargetChecking",
    "ValueCarrying",
    "WriteWatching",
    "adapt_sink",
    "adapt_source",
]


@runtime_checkable
class Staging(Protocol):
    """A sink with a staging table (the ``staged`` path): rows are filled and counted there,
    outside the target, and ``finalize_staged_load`` is the one target call."""

    def stage(self, payload: RowChunks) -> int:
        """Fill a fresh staging table with the rows; the target table is not touched. A sink
        that is also ``FilePulling`` gets the files it pulled (``LoadFiles``), as ``load`` does."""

    def staged_row_count(self) -> int:
        """Rows in the staging table (the governance gate counts them)."""

    def discard_stage(self) -> None:
        """Drop the staging table; the target table is not touched."""

    def finalize_staged_load(self, *, replace: bool = False) -> int:
        """Move the staged rows into the target table in one transaction; the rows moved."""


@runtime_checkable
class NativeFiles(Protocol):
    """A sink whose engine reads a file of rows itself (an Arrow IPC stream): legacy and
    file-artifact write their rows in that format before the target call, and the call only
    reads the files (``LoadFiles``), so nothing is converted inside it."""

    def write_load_file(
        self, path: Path, columns: Sequence[Column], chunks: Iterable[Sequence[tuple]]
    ) -> LoadFile | Iterator[Sequence[tuple]]:
        """Write the (carried) chunks to the new private file ``path`` in the engine's format:
        the file written (``native``, its rows and the digest of its bytes); or, once a value
        cannot be held exactly in that format (or the engine cannot read a file at ``path``),
        every row as chunks (read back, then the rest), for the caller to keep in its own
        format. Touches nothing but the file."""

    def load(self, payload: RowChunks) -> int:
        """``Sink.load``; for ``LoadFiles``, the files in order, in one transaction: native ones
        read by the engine, each file's digest checked as it is read (or, where the engine
        reads the file itself, just before)."""


@runtime_checkable
class FilePulling(Protocol):
    """A sink whose engine can write the load files itself, from a source it reads exactly
    (DuckDB and chDB: an Arrow stream, as ``NativeFiles``; SQLite: a SQLite file): legacy,
    staged and file-artifact then take the rows of the attempt's partitions without one
    passing through Python. ``pulled_suffix`` names the files' format (``.arrows``,
    ``.sqlite``)."""

    pulled_suffix: str

    def can_pull(self, plan: LoadPlan, files: int) -> bool:
        """Whether the engine reads the plan exactly into ``files`` files (one, or one per
        bound), asked before anything else reads the rows. Reads the source only."""

    def pull_load_files(
        self, plan: LoadPlan, paths: Sequence[Path]
    ) -> tuple[list[LoadFile], list[int]] | None:
        """The rows of a plan ``can_pull`` accepted in new private files at ``paths``, in the
        format ``load`` reads: every partition in one file (one path) or one file per bound (a
        path each); and each bound's row count. None when the engine's read failed (no file
        is left): the runtime then reads the rows itself. Reads the source only, never the
        target."""


@runtime_checkable
class StagePulling(Staging, FilePulling, Protocol):
    """A ``Staging`` and ``FilePulling`` sink whose engine fills the stage from the source
    itself (chDB): staged then writes no load file."""

    def pull_stage(self, plan: LoadPlan) -> list[int] | None:
        """Fill a fresh staging table with the rows of a plan ``can_pull(plan, 1)`` accepted;
        each bound's row count. None when the engine's read failed or may differ from the one
        ``pull_load_files`` makes (no stage is left): the runtime then reads the rows itself.
        The staged path asks this instead of ``pull_load_files``. Never touches the target."""


@runtime_checkable
class MergingLoadFiles(Protocol):
    """A ``NativeFiles`` or ``FilePulling`` sink whose load takes many files worse than one
    (SQLite attaches ten databases; chDB pays for each INSERT): they are merged into one
    before the target call."""

    def merge_load_files(self, payload: LoadFiles, folder: Path) -> LoadFiles:
        """``payload`` as the load reads it: itself, or with its files in the engine's format
        merged into one new file in ``folder`` (each file's digest checked as it is read), the
        other files kept. Runs before the target call, and reads only the files."""


@runtime_checkable
class PlanPulling(Protocol):
    """A sink whose engine pulls the rows itself (the ``lazy-plan`` path): ``load`` takes a
    ``LoadPlan`` (a source and partition bounds) and no row passes through dpone."""

    def check_plan(self, plan: LoadPlan) -> None:
        """Before the target call: refuse (``ConfigInvalid``) a plan this engine cannot pull,
        such as one of an unsupported source; raise ``PlanInexact`` for one it would not read
        as the row paths carry it (a value read differently): lazy-plan then carries the
        rows itself, as legacy does."""

    def load(self, payload: RowChunks | LoadPlan) -> int:
        """``Sink.load``, and for a plan: pull its partitions in one transaction."""


@runtime_checkable
class Collating(Protocol):
    """A source whose engine compares some columns with a collation, so values Python
    tells apart may be equal there: a cursor edge is not tracked on such a column."""

    def collated_columns(self) -> list[str]:
        """The names of those columns."""


@runtime_checkable
class Identified(Protocol):
    """A source or sink that says which database and table it reads or writes.

    Without it, a route is keyed by its table names only (``RouteKey`` unlocated).
    """

    def identity(self) -> TableIdentity:
        """The engine kind, normalized location and canonical table name; never a credential."""


@runtime_checkable
class CursorEdgeReading(Protocol):
    """A source that reads an append route's cursor edge (``cursor_edge.py``) across partitions.

    Without it, an append route keeps the exclusive lower bound: a row written
    later at the watermark value, or with a NULL cursor, is never loaded.
    """

    def edge_rows(
        self, *, since: Any, upto: Any, nulls: bool, chunk_rows: int = DEFAULT_CHUNK_ROWS
    ) -> Iterator[list[tuple]]:
        """Rows (all columns, ``describe()`` order) of every partition whose cursor is in
        ``[since, upto]`` (none when ``since`` is None) or, when ``nulls``, NULL. Reads only."""


@runtime_checkable
class OnePassReading(Protocol):
    """A source that reads several partitions in one scan, where reading each on its own would
    scan the table each time (a partition column without an index to seek).

    The runtime asks it once per attempt, before the first partition is read;
    without it, or when it answers None, every partition is read on its own.
    """

    def read_partitions(
        self, bounds: Sequence[Mapping[str, Any]], *, chunk_rows: int = DEFAULT_CHUNK_ROWS
    ) -> Iterator[tuple[int, list[tuple]]] | None:
        """One scan: ``(i, rows)`` chunks, ``rows`` of the partition ``bounds[i]``, each of them
        exactly the rows ``read(bounds[i])`` gives, in its order. None when reading each
        partition is as cheap, one scan cannot tell the partitions apart exactly, or its
        statement cannot name that many (the runtime asks however many there are). Reads only."""


@runtime_checkable
class RangePartitioned(Protocol):
    """A source that cuts its table into contiguous key ranges (``partition_by = "range"``).

    With ``partition_rows`` set, the planner asks for ranges instead of partition
    values: each range is one partition and one checkpoint, so a key with many
    distinct values (an id) makes a few partitions of about that many rows.
    """

    partition_rows: int | None

    def partition_ranges(self, *, after: Any = None, upto: Any = None) -> list[dict[str, Any]]:
        """Bounds fragments ``{"partition_from": a, "partition_below": b}`` (None: unbounded)
        covering every key of the rows with a cursor in ``(after, upto]``, ordered, plus
        ``{"partition": None}`` when some have no key; ``[]`` when there is no such row."""


@runtime_checkable
class LedgerSink(Protocol):
    """A sink that keeps the target's batch ledger (``_dpone_ledger``, see ``ledger.py``).

    Writing: the runtime hands the batch's row with ``ledger_batch(entry)``
    around the one target call (``load`` or ``finalize_staged_load``, on every
    path), and that call inserts ``entry.row()`` plus the rows it applied into
    the ledger table of the target database, creating the table on first use.
    ``ledger_atomic`` says whether that row commits in the same transaction as
    the rows (then a missing row proves the batch was not applied); a sink
    without multi-table transactions writes it after the rows and sets it False.
    ``PendingLedger`` does the bookkeeping. Before the row, the same call checks
    that the engine applied the rows it was handed (``entry.sent``, when set:
    ``ledger.check_applied``), so a target that drops or adds rows is rolled back
    (``TargetRowsMismatch``) instead of believed.
    """

    ledger_atomic: bool

    def ledger_batch(self, entry: LedgerEntry) -> contextlib.AbstractContextManager[None]:
        """Hand ``entry`` to the target call made inside the ``with`` block."""

    def read_ledger(self, *, partitions: bool = False) -> list[LedgerEntry]:
        """This sink's target table's entries, oldest first; ``[]`` when there is no ledger.

        Reads only. ``partitions=True`` also reads each entry's partition list.
        """

    def row_count(self) -> int:
        """Rows in the target table now; 0 when it does not exist. Reads only.

        ``state restore`` compares it with the rows the ledger records.
        """

    def is_empty(self) -> bool:
        """True when the target table does not exist or holds no row; reads at most one row.

        Every run asks it when the ledger records rows: a table dropped or
        emptied behind the ledger's back is refused, never silently skipped.
        """


@runtime_checkable
class Fencing(Protocol):
    """A ``LedgerSink`` whose target keeps a fence (``ledger.FENCE_TABLE``): per target table,
    the highest lease epoch that reached it.

    Its target call checks and raises the fence in its own transaction, before the ledger
    row, for an entry with an ``epoch`` (``ledger.fence_batch``): a batch of an older epoch
    (a worker paused past its lease) is rolled back with ``LeaseLost``, applying nothing.
    Only a target whose ledger row commits with the rows (``ledger_atomic``) can fence.
    """

    def fence_epoch(self) -> int:
        """The target table's fence; 0 when it has none. Reads only."""

    def advance_fence(self, epoch: int) -> int:
        """Raise the fence to at least ``epoch`` in a transaction of its own, waiting a bounded
        time for a load that holds it; the fence now. Writes only the fence record: once it
        returns, no batch of an older epoch can commit, so a ledger read after it proves
        whether such a batch was applied."""


@runtime_checkable
class BatchCounting(Protocol):
    """A sink that counts a batch's rows by the route's ``batch_column`` (the batch id stored in
    every row it loads): proof of a batch's outcome where the ledger row proves nothing
    (ClickHouse, whose ledger row follows the rows). All the batch's rows there: applied;
    none, and no insert of it left in flight (``inserts_end_with_their_process`` and the
    attempt's process gone): not applied."""

    inserts_end_with_their_process: bool

    def batch_rows(self, column: str, batch_id: str) -> int:
        """Rows of the target table whose ``column`` holds ``batch_id``. Reads only."""


@runtime_checkable
class Quarantining(Protocol):
    """A ``LedgerSink`` that writes the rows a batch set aside (``on_bad_value =
    "quarantine"``: ``entry.rejects``) to ``rejects.REJECTS_TABLE`` of the target database,
    in the target call, with its ledger row (``rejects.write_rejects``), and reads them back."""

    def read_rejects(self) -> list[tuple]:
        """This target table's rows set aside: (batch id, partition id, row digest, column,
        reason, value or None). Reads only."""


@runtime_checkable
class TargetChecking(Protocol):
    """A sink that opens its target before the target call (``check_target``).

    The runtime calls it before the path, outside the armed window, so a target
    that cannot be reached (a missing folder, a file that is not a database, a
    lock another process holds, a server that does not answer) fails the attempt
    before the target, retryable, instead of as a call of unknown outcome that
    blocks the route. What changes after the check still fails inside the call.
    """

    def check_target(self) -> None:
        """Open the target as the target call will and close it again; write no row.
        ``ConfigInvalid`` when a retry cannot fix it, ``TargetUnavailable`` when it may."""


@runtime_checkable
class ConnectionHolding(Protocol):
    """A sink that may keep one connection to its engine for a whole attempt.

    Otherwise each call opens and closes its own: a chDB session is slow to open
    and close, and a run makes four to six calls (figures: docs/performance.md,
    fix 35). The runtime enters ``holding_connection`` under the route's lease,
    around the attempt; the sink's calls outside it (``state show``, a second
    run) open their own.
    It does not promise that a connection is opened at all, nor which call
    opens it: whichever first needs one, with that call's own error handling.
    """

    def holding_connection(self) -> contextlib.AbstractContextManager[None]:
        """Calls within share one connection, closed on exit even when the attempt fails."""


@runtime_checkable
class Snapshotting(Protocol):
    """A source that can read one snapshot of its table for a whole attempt.

    The runtime enters ``snapshot`` under the route's lease, around the attempt: the
    planning, the counts and every read it makes itself. Read in more than one statement
    (a read per partition, an index seek each), a writer that moves a row from one
    partition to another meanwhile could have it loaded twice or not at all. The runtime
    ends it before an engine reads the source itself (a target pulling it, lazy-plan's
    copy: ``PathContext.read_by_engine``), which reads it as it is then; its reads after
    an engine's read it keeps do too, and after one it throws away it enters a new one for
    its own. It does not promise reads made in another thread, nor that holding it is
    free: the source keeps a transaction open (PostgreSQL's vacuum waits for it).
    """

    def snapshot(self) -> contextlib.AbstractContextManager[None]:
        """The runtime's reads within see the table as it was on entering; on exit, as now."""


@runtime_checkable
class WriteWatching(Protocol):
    """A source that tells whether another connection wrote it meanwhile.

    An engine that holds a file open per partition pulls more partitions than it may hold
    open in groups (``open_files_allowed()``), a read of the source each: a row moved from
    a partition not yet pulled into one already pulled would be lost, or the other way
    loaded twice. The runtime keeps such a pull only when the source says no write came
    while it ran, and pulls in groups only from such a source; else dpone reads the rows.
    It does not promise that a write it reports changed a row (dpone then reads them all
    the same), nor that watching is free (SQLite's watch holds a read transaction)."""

    def watching_writes(self) -> contextlib.AbstractContextManager[Callable[[], bool]]:
        """Within, a check whether the source was written since entering; asked once."""


@runtime_checkable
class ValueCarrying(Protocol):
    """A sink that says how each column's values reach it exactly (``column_types.py``).

    The runtime applies ``carrier(column)`` to every non-NULL value of that
    column as rows are read from the source, before they are spooled, staged or
    exported: so a value the target cannot hold exactly is refused with
    ``ValueUnsupported`` before the target call, on every row path. None means
    values pass unchanged. Lazy plans are read by the sink's engine: its
    ``check_plan`` raises ``PlanInexact`` for what it would not read the same
    way, and lazy-plan then carries those rows as legacy does.
    """

    def carrier(self, column: Column) -> Carry | None:
        """The conversion of ``column``'s values, or None; ValueError/TypeError refuses one."""


@runtime_checkable
class SchemaEvolving(Protocol):
    """A sink that compares the target table's columns with the source's, and adds columns.

    The runtime calls both before the target mutation (``schema_contract.py``),
    so a new source column never fails inside the armed target call.
    """

    def column_difference(self, columns: Sequence[Column]) -> ColumnDifference | None:
        """Source columns the target table lacks, target columns the source lacks, and
        columns whose target type cannot hold the source's values, by the engine's own name
        matching (``payloads.difference`` builds it); None when the table does not exist.
        Reads only."""

    def add_columns(self, columns: Sequence[Column]) -> None:
        """Add ``columns`` to the target table (nullable, typed by their kind), atomically."""


class LedgerNotWritten(NativeTransferError):
    """A ledger sink's target call returned without writing the batch's ledger row (a bug)."""

    code = "native_transfer_ledger_not_written"


class PendingLedger:
    """The ledger row handed to a sink for its target call; a sink keeps one.

    ``handed(entry)`` is the sink's ``ledger_batch``; its target call takes the
    row with ``take()`` inside its transaction. A target call that returns
    without taking it raises ``LedgerNotWritten``, so the attempt is recorded as
    of unknown outcome rather than as committed without a ledger row.
    """

    def __init__(self) -> None:
        self._entry: LedgerEntry | None = None
        self._taken = False

    @contextlib.contextmanager
    def handed(self, entry: LedgerEntry) -> Iterator[None]:
        self._entry, self._taken = entry, False
        try:
            yield
            if not self._taken:
                raise LedgerNotWritten(
                    f"the sink of target table {entry.target_table!r} returned without "
                    "writing the batch's ledger row",
                    diagnostics={"batch_id": entry.batch_id},
                )
        finally:
            self._entry = None

    def take(self) -> LedgerEntry | None:
        """The handed row (None outside ``handed``), marked as written."""
        self._taken = self._entry is not None
        return self._entry

    def peek(self) -> LedgerEntry | None:
        """The handed row, not yet taken (its fence is checked first thing)."""
        return self._entry


# The 0.1 optional capabilities, in the order release 0.1 documented them.
CAPABILITIES: tuple[type, ...] = tuple(
    globals()[name]
    for name in (
        "Identified", "Staging", "PlanPulling", "NativeFiles", "FilePulling", "StagePulling",
        "MergingLoadFiles", "Collating", "OnePassReading", "Snapshotting", "WriteWatching",
        "RangePartitioned", "CursorEdgeReading", "TargetChecking", "ConnectionHolding",
        "ValueCarrying", "SchemaEvolving", "LedgerSink", "Fencing", "BatchCounting",
        "Quarantining",
    )
)  # fmt: skip

_WARNING = (
    "{what} {name} is written for the connector contract of release 0.1, which the next "
    "release removes: subclass dpone_native_transfer.connectors.contract.{base} "
    "(docs/connectors.md, 'Moving a 0.1 connector')"
)


def _deprecated(what: str, connector: object, base: str) -> None:
    name = type(connector).__name__
    warnings.warn(_WARNING.format(what=what, name=name, base=base), DeprecationWarning, 3)


def _speaks_current(connector: object) -> bool:
    return isinstance(getattr(connector, "features", None), SinkFeatures | SourceFeatures)


def _connector(what: str, connector: object, base: str) -> None:
    """A 0.1 connector has its table's name at least; anything else (a path, a number) is
    refused here, not by an ``AttributeError`` in the middle of a run."""
    if not isinstance(getattr(connector, "table", None), str):
        raise ConfigInvalid(
            f"{what} must be a dpone {base} (a connector of one table), not "
            f"{type(connector).__name__}",
            diagnostics={"argument": what},
        )
    _deprecated(what, connector, base)


def adapt_source(source: Any) -> Any:
    """``source`` as the current contract has it: itself, or a 0.1 source wrapped."""
    if _speaks_current(source) or isinstance(source, LegacySource):
        return source
    _connector("source", source, "Source")
    return LegacySource(source)


def adapt_sink(sink: Any) -> Any:
    """``sink`` as the current contract has it: itself, or a 0.1 sink wrapped."""
    if _speaks_current(sink) or isinstance(sink, LegacySink):
        return sink
    _connector("sink", sink, "Sink")
    return LegacySink(sink)


class LegacySource(Source):
    """A 0.1 source in the current contract: what it lacks has the current defaults."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.features = SourceFeatures(
            watches_writes=isinstance(inner, WriteWatching),
            reads_edges=isinstance(inner, CursorEdgeReading),
        )

    def __getattr__(self, name: str) -> Any:  # its own members (a SQLite file's, say)
        return getattr(self.inner, name)

    @property
    def table(self) -> str:  # type: ignore[override]
        return self.inner.table

    @property
    def partition_column(self) -> str:  # type: ignore[override]
        return self.inner.partition_column

    @property
    def cursor_column(self) -> str | None:  # type: ignore[override]
        return self.inner.cursor_column

    @property
    def partition_rows(self) -> int | None:  # type: ignore[override]
        return getattr(self.inner, "partition_rows", None)

    def identity(self) -> TableIdentity | None:
        return self.inner.identity() if isinstance(self.inner, Identified) else None

    def describe(self) -> SourceShape:
        return self.inner.describe()

    def partition_values(self, *, after: Any = None, upto: Any = None) -> list[Any]:
        return self.inner.partition_values(after=after, upto=upto)

    def partition_ranges(self, *, after: Any = None, upto: Any = None) -> list[dict[str, Any]]:
        return self.inner.partition_ranges(after=after, upto=upto)

    def max_cursor(self, *, after: Any = None) -> Any:
        return self.inner.max_cursor(after=after)

    def read(
        self, bounds: Mapping[str, Any], *, chunk_rows: int = DEFAULT_CHUNK_ROWS
    ) -> Iterator[list[tuple]]:
        return self.inner.read(bounds, chunk_rows=chunk_rows)

    def count(self, bounds: Mapping[str, Any]) -> int:
        return self.inner.count(bounds)

    def edge_rows(
        self, *, since: Any, upto: Any, nulls: bool, chunk_rows: int = DEFAULT_CHUNK_ROWS
    ) -> Iterator[list[tuple]]:
        if not isinstance(self.inner, CursorEdgeReading):
            raise Unsupported("a read of its cursor edge")
        return self.inner.edge_rows(since=since, upto=upto, nulls=nulls, chunk_rows=chunk_rows)

    def read_partitions(
        self, bounds: Sequence[Mapping[str, Any]], *, chunk_rows: int = DEFAULT_CHUNK_ROWS
    ) -> Iterator[tuple[int, list[tuple]]] | None:
        if not isinstance(self.inner, OnePassReading):
            return None
        return self.inner.read_partitions(bounds, chunk_rows=chunk_rows)

    def snapshot(self) -> contextlib.AbstractContextManager[None]:
        if isinstance(self.inner, Snapshotting):
            return self.inner.snapshot()
        return contextlib.nullcontext()

    def collated_columns(self) -> list[str]:
        return self.inner.collated_columns() if isinstance(self.inner, Collating) else []

    def watching_writes(self) -> contextlib.AbstractContextManager[Callable[[], bool]]:
        if not isinstance(self.inner, WriteWatching):
            raise Unsupported("a watch of its writes")
        return self.inner.watching_writes()


class LegacySink(Sink, EnginePull):
    """A 0.1 sink in the current contract: its optional Protocols become features, its
    ``ledger_batch`` takes the entry the runtime passes, and what it lacks is refused with
    ``Unsupported`` (the staged path without ``Staging``) or left to dpone."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        ledger = isinstance(inner, LedgerSink)
        self.features = SinkFeatures(
            ledger_atomic=bool(getattr(inner, "ledger_atomic", True)),
            fence=ledger and isinstance(inner, Fencing),
            inserts_end_with_their_process=bool(
                getattr(inner, "inserts_end_with_their_process", True)
            ),
            keeps_ledger=ledger,
            name=type(inner).__name__.removesuffix("Sink"),
        )
        self.pulled_suffix = getattr(inner, "pulled_suffix", "")

    def __getattr__(self, name: str) -> Any:  # its own members
        return getattr(self.inner, name)

    @property
    def table(self) -> str:  # type: ignore[override]
        return self.inner.table

    def _has(self, capability: type, what: str) -> Any:
        if not isinstance(self.inner, capability):
            raise Unsupported(what)
        return self.inner

    def _with_ledger(self, ledger: LedgerEntry | None, call: Callable[[], int]) -> int:
        if ledger is None or not isinstance(self.inner, LedgerSink):
            return call()
        with self.inner.ledger_batch(ledger):
            return call()

    def identity(self) -> TableIdentity | None:
        return self.inner.identity() if isinstance(self.inner, Identified) else None

    def check_target(self) -> None:
        if isinstance(self.inner, TargetChecking):
            self.inner.check_target()

    def carrier(self, column: Column) -> Carry | None:
        return self.inner.carrier(column) if isinstance(self.inner, ValueCarrying) else None

    def column_difference(self, columns: Sequence[Column]) -> ColumnDifference | None:
        if not isinstance(self.inner, SchemaEvolving):
            return None
        return self.inner.column_difference(columns)

    def add_columns(self, columns: Sequence[Column]) -> None:
        self._has(SchemaEvolving, "new columns").add_columns(columns)

    def load(self, payload: RowChunks, *, ledger: LedgerEntry | None = None) -> int:
        return self._with_ledger(ledger, lambda: self.inner.load(payload))

    def stage(self, payload: RowChunks) -> int:
        return self._has(Staging, "a staging table").stage(payload)

    def staged_row_count(self) -> int:
        return self._has(Staging, "a staging table").staged_row_count()

    def discard_stage(self) -> None:
        self._has(Staging, "a staging table").discard_stage()

    def finalize_staged_load(
        self,
        *,
        replace: bool = False,
        ledger: LedgerEntry | None = None,
        merge: Merge | None = None,
    ) -> int:
        if merge is not None:  # ``features.merges`` is False: a route never asks
            raise Unsupported("a merge on a key")
        staging = self._has(Staging, "a staging table")
        return self._with_ledger(ledger, lambda: staging.finalize_staged_load(replace=replace))

    def read_ledger(self, *, partitions: bool = False) -> list[LedgerEntry]:
        if not isinstance(self.inner, LedgerSink):
            return []
        return self.inner.read_ledger(partitions=partitions)

    def row_count(self) -> int:
        return self._has(LedgerSink, "a count of its rows").row_count()

    def is_empty(self) -> bool:
        return self._has(LedgerSink, "a count of its rows").is_empty()

    def read_rejects(self) -> list[tuple]:
        return self.inner.read_rejects() if isinstance(self.inner, Quarantining) else []

    def batch_rows(self, column: str, batch_id: str) -> int:
        return self._has(BatchCounting, "a count of a batch's rows").batch_rows(column, batch_id)

    def fence_epoch(self) -> int:
        return self.inner.fence_epoch() if self.features.fence else 0

    def advance_fence(self, epoch: int) -> int:
        return self._has(Fencing, "a fence").advance_fence(epoch)

    def holding_connection(self) -> contextlib.AbstractContextManager[None]:
        if isinstance(self.inner, ConnectionHolding):
            return self.inner.holding_connection()
        return contextlib.nullcontext()

    def engine(self) -> EnginePull | None:
        engines = (PlanPulling, FilePulling, NativeFiles, MergingLoadFiles)
        return self if any(isinstance(self.inner, kind) for kind in engines) else None

    def check_plan(self, plan: LoadPlan) -> None:
        self._has(PlanPulling, "an engine that pulls the rows itself").check_plan(plan)

    def load_plan(self, plan: LoadPlan, *, ledger: LedgerEntry | None = None) -> int:
        pulling = self._has(PlanPulling, "an engine that pulls the rows itself")
        return self._with_ledger(ledger, lambda: pulling.load(plan))

    def can_pull(self, plan: LoadPlan, files: int) -> bool:
        return isinstance(self.inner, FilePulling) and self.inner.can_pull(plan, files)

    def pull_load_files(
        self, plan: LoadPlan, paths: Sequence[Path]
    ) -> tuple[list[LoadFile], list[int]] | None:
        return self.inner.pull_load_files(plan, paths)

    def pull_stage(self, plan: LoadPlan) -> list[int] | None:
        return self.inner.pull_stage(plan) if isinstance(self.inner, StagePulling) else None

    def write_load_file(
        self, path: Path, columns: Sequence[Column], chunks: Iterable[Sequence[tuple]]
    ) -> LoadFile | Iterator[Sequence[tuple]]:
        if not isinstance(self.inner, NativeFiles):
            return iter(chunks)
        return self.inner.write_load_file(path, columns, chunks)

    def merge_load_files(self, payload: LoadFiles, folder: Path) -> LoadFiles:
        if not isinstance(self.inner, MergingLoadFiles):
            return payload
        return self.inner.merge_load_files(payload, folder)
