"""The connector contract: what the runtime asks of a source and of a sink.

``Source`` and ``Sink`` say what every connector is; what really varies between engines
is data (``SourceFeatures``, ``SinkFeatures``), read by the runtime, never asked of a
connector's type. Four parts are optional: an engine that reads a source itself
(``Sink.engine()``, ``engine.EnginePull``), a source that is a SQLite file other
engines read (``sqlite_file.SQLiteFile``), a PostgreSQL table other engines read
(``postgres_table.PostgresTable``), and a source that writes its rows to Arrow files
in bulk (``Source.bulk()``, ``bulk.BulkRead``). A connector that cannot do what it is asked
raises ``Unsupported``; the runtime says what that means for the route (which path, what
to use instead), so no connector knows the runtime's paths.

A connector subclasses ``Source`` or ``Sink`` (both Protocols) to inherit the defaults the
members below name. ``docs/connectors.md`` is generated from these docstrings, and the
conformance kit (``testing.contract_problems``) checks a connector against them. A
connector written for the contract of release 0.1 (optional Protocols, ``ledger_batch``)
is adapted with a ``DeprecationWarning`` (``legacy.adapt_sink``, ``legacy.adapt_source``).
"""

from __future__ import annotations

import abc
import contextlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import attrs

from ...errors import ConfigInvalid

if TYPE_CHECKING:
    from ...column_types import Carry, Column
    from ...identity import TableIdentity
    from ...ledger import LedgerEntry
    from ...payloads import ColumnDifference, Merge, RowChunks, SourceShape
    from .bulk import BulkRead
    from .engine import EnginePull

__all__ = [
    "DEFAULT_CHUNK_ROWS",
    "PlanInexact",
    "Sink",
    "SinkFeatures",
    "Source",
    "SourceFeatures",
    "Unsupported",
]

# Rows per chunk a source reads and a path holds in memory, unless the route says otherwise.
DEFAULT_CHUNK_ROWS = 10_000


class Unsupported(ConfigInvalid):
    """A connector cannot do what it was asked, said in its own terms (``what``: "a staging
    table", "a plan of this source"); raised before the target. The runtime refuses the
    route with a message naming the path and what to use instead."""

    def __init__(self, what: str, **diagnostics: Any) -> None:
        super().__init__(f"this connector cannot provide {what}", diagnostics=diagnostics)
        self.what = what


class PlanInexact(ConfigInvalid):
    """``EnginePull.check_plan``: the engine would read some of the plan's values or rows
    otherwise than the row paths carry them (a kind or a stored value its reader reads
    differently, a collation, a text encoding). The lazy-plan path then carries the rows
    itself in its one target call, as legacy does, so a value gets the same outcome on
    every path. Raised elsewhere, it is the ``ConfigInvalid`` it derives from."""


@attrs.frozen(kw_only=True)
class SourceFeatures:
    """What varies between sources; the defaults are what a new source declares."""

    # ``watching_writes`` tells whether another connection wrote the source meanwhile:
    # engines then pull many partitions in groups (an engine holds each group's files open)
    watches_writes: bool = False
    # ``edge_rows`` reads an append route's cursor edge; without it (a connector of release
    # 0.1 only) the route keeps the exclusive lower bound, missing later ties at the watermark
    reads_edges: bool = True


@attrs.frozen(kw_only=True)
class SinkFeatures:
    """What varies between sinks; the defaults are what a new sink declares."""

    # the target call writes the ledger row (and the fence, rejects) in the rows' own
    # transaction, so a missing row proves the batch was not applied
    ledger_atomic: bool = True
    # the target keeps a fence (``ledger.FENCE_TABLE``): ``fence_epoch``/``advance_fence``
    # work, and the target call refuses a batch of an older lease epoch (``ledger_atomic``)
    fence: bool = True
    # ``batch_rows`` proves "not applied" only once the attempt's process is gone when an
    # insert may outlive the call that started it (a server's async insert)
    inserts_end_with_their_process: bool = True
    # the target's ledger is kept at all; False only for an adapted 0.1 sink without one
    keeps_ledger: bool = True
    # ``load`` and ``finalize_staged_load`` apply a ``payloads.Merge`` (strategy "merge") in
    # the call's one transaction; a route that merges into a sink without it is refused
    merges: bool = False
    # a column the sink stores each merged row's batch id in, counted by ``batch_rows`` as a
    # route's ``batch_column`` is: proof of a merge batch where the ledger row proves nothing
    merge_batch_column: str | None = None
    # what the target is called in messages about its values ("SQLite", "DuckDB")
    name: str = "the target"


@runtime_checkable
class Source(Protocol):
    """Where rows come from: one table, read in partitions, optionally windowed by a cursor.

    A partition is named by its *bounds*, a mapping the runtime builds from what the source
    reports (``{"partition": value}``, or a key range ``{"partition_from": a,
    "partition_below": b}``, plus the cursor window's ``cursor_after``/``cursor_upto``;
    ``payloads.bound_predicates`` says what each key selects). Every method only reads.
    """

    table: str
    partition_column: str
    cursor_column: str | None
    # with ``partition_by = "range"``: ranges of about so many rows are partitions (the
    # planner asks ``partition_ranges``); None: one partition per value
    partition_rows: int | None
    features: SourceFeatures

    @abc.abstractmethod
    def identity(self) -> TableIdentity | None:
        """The engine kind, normalized location and canonical table name; never a credential.
        The runtime keys checkpoints, state, the ledger and the lease by it. None (a 0.1
        connector only): the route is keyed by its table names."""

    @abc.abstractmethod
    def describe(self) -> SourceShape:
        """The table's columns, in the order ``read`` returns them, and their hashes."""

    @abc.abstractmethod
    def partition_values(self, *, after: Any = None, upto: Any = None) -> list[Any]:
        """The distinct partition values of the rows whose cursor is in ``(after, upto]``
        (every row when both are None), sorted, None included when a row has no value."""

    @abc.abstractmethod
    def partition_ranges(self, *, after: Any = None, upto: Any = None) -> list[dict[str, Any]]:
        """Bounds fragments ``{"partition_from": a, "partition_below": b}`` (None: unbounded)
        covering every key of the rows with a cursor in ``(after, upto]``, ordered, plus
        ``{"partition": None}`` when some have no key; ``[]`` when there is no such row."""

    @abc.abstractmethod
    def max_cursor(self, *, after: Any = None) -> Any:
        """The highest cursor value above ``after``, or None (no cursor, or no such row)."""

    @abc.abstractmethod
    def read(
        self, bounds: Mapping[str, Any], *, chunk_rows: int = DEFAULT_CHUNK_ROWS
    ) -> Iterator[list[tuple]]:
        """The rows of one partition, every column in ``describe()`` order, in chunks of at
        most ``chunk_rows`` rows."""

    @abc.abstractmethod
    def count(self, bounds: Mapping[str, Any]) -> int:
        """How many rows ``read(bounds)`` returns (governance gates on lazy plans ask it)."""

    @abc.abstractmethod
    def edge_rows(
        self, *, since: Any, upto: Any, nulls: bool, chunk_rows: int = DEFAULT_CHUNK_ROWS
    ) -> Iterator[list[tuple]]:
        """Rows (all columns, ``describe()`` order) of every partition whose cursor is in
        ``[since, upto]`` (none when ``since`` is None) or, when ``nulls``, NULL: an append
        route's cursor edge (``cursor_edge.py``)."""

    def primary_key(self) -> tuple[str, ...]:
        """The table's own primary key columns, in key order: a merge route's key when its
        route names none. The default: none (the route must name its key)."""
        return ()

    def check_key(self, key: Sequence[str]) -> None:
        """Before any row of a merge route: refuse (``ConfigInvalid``) a ``key`` whose values
        this source tells apart where a target may meet them as one (SQLite keeps a date or
        timestamp text as it is written: two spellings of one instant are two keys there and
        one in every target that holds instants). The default: nothing to refuse."""
        return None

    def read_partitions(
        self, bounds: Sequence[Mapping[str, Any]], *, chunk_rows: int = DEFAULT_CHUNK_ROWS
    ) -> Iterator[tuple[int, list[tuple]]] | None:
        """One scan of several partitions, where reading each on its own would scan the table
        each time (a partition column without an index): ``(i, rows)`` chunks, ``rows`` of
        ``bounds[i]``, each exactly the rows ``read(bounds[i])`` gives, in its order. None
        (the default) when reading each partition is as cheap, one scan cannot tell them
        apart exactly, or its statement cannot name that many; asked once per attempt."""
        return None

    def snapshot(self) -> contextlib.AbstractContextManager[None]:
        """The runtime's reads within see the table as it was on entering (the default: as
        they find it). Entered under the lease around the attempt and ended before an engine
        reads the source itself (``PathContext.read_by_engine``): read in more than one
        statement, a writer moving a row between partitions could have it loaded twice or
        not at all. Holding it may not be free (PostgreSQL's vacuum waits for it)."""
        return contextlib.nullcontext()

    def collated_columns(self) -> list[str]:
        """Columns the engine compares with a collation, so values Python tells apart may be
        equal there: a cursor edge is not tracked on such a column. The default: none."""
        return []

    def bulk(self) -> BulkRead | None:
        """The source's bulk read into Arrow files (``bulk.BulkRead``): what lets a row path
        skip reading rows in Python where the sink's engine loads such files
        (``EnginePull.reads_bulk_files``). None (the default): dpone reads every row."""
        return None

    def watching_writes(self) -> contextlib.AbstractContextManager[Callable[[], bool]]:
        """With ``features.watches_writes``: within, a check whether the source was written
        since entering, asked once. A write it reports may not have changed a row."""
        raise Unsupported("a watch of its writes")


@runtime_checkable
class Sink(Protocol):
    """The target table. Its target calls (``load``, ``finalize_staged_load`` and the engine's
    ``load_plan``) are made through the target-mutation boundary, never directly.

    A sink holds no guard code: the guard's hooks fire around its one call. What it must
    promise is that a target call either applies all of the payload's rows in one
    transaction or raises the original error untouched, and that with a ``ledger`` entry
    it records the batch in the target's ledger (``_dpone_ledger``, ``ledger.py``) in the
    same call: ``entry.row()``, the rows it set aside (``entry.rejects``,
    ``rejects.write_rejects``), after checking the fence first (``features.fence``,
    ``ledger.fence_batch``) and that the engine applied the rows it was handed
    (``entry.sent``, ``ledger.check_applied``), so a target that drops rows is rolled
    back, never believed.
    """

    table: str
    features: SinkFeatures

    @abc.abstractmethod
    def identity(self) -> TableIdentity | None:
        """The engine kind, normalized location and canonical table name; never a credential.
        None (a 0.1 connector only): the route is keyed by its table names."""

    @abc.abstractmethod
    def check_target(self) -> None:
        """Open the target as the target call will and close it again; write no row. Called
        before the path and before any read of the target (its ledger, its fence), so an
        unreachable, locked or read-only target fails before the target call, retryable,
        not as a call of unknown outcome that blocks the route. ``ConfigInvalid`` when a
        retry cannot fix it, ``TargetUnavailable`` when it may."""

    @abc.abstractmethod
    def carrier(self, column: Column) -> Carry | None:
        """How ``column``'s values reach the target exactly (``column_types.py``): applied to
        every non-NULL value as rows are read, before they are spooled, staged or exported,
        so a value the target cannot hold is refused (``ValueUnsupported``) or set aside
        before the target call. None: values pass unchanged."""

    @abc.abstractmethod
    def column_difference(self, columns: Sequence[Column]) -> ColumnDifference | None:
        """Source columns the target table lacks, target columns the source lacks (and which
        of them an insert must fill: no NULL, no default), and columns whose target type
        cannot hold the source's values, by the engine's own name matching
        (``payloads.difference`` builds it); None when the table does not exist. Reads only;
        asked before the target call (``schema_contract.py``)."""

    @abc.abstractmethod
    def add_columns(self, columns: Sequence[Column]) -> None:
        """Add ``columns`` to the target table (nullable, typed by their kind), atomically."""

    @abc.abstractmethod
    def load(self, payload: RowChunks, *, ledger: LedgerEntry | None = None) -> int:
        """Append the rows (``payload.replace``: replace the table's rows; ``payload.merge``:
        merge them on its key, with ``features.merges``) in one transaction, with the ledger
        entry when given, and return how many rows were written (merged: the rows the call
        received, every version and delete marker). Creates the table on first use. A
        ``LoadFiles`` payload's files are in the engine's format when its
        ``engine().write_load_file`` wrote them: the call then reads the files, each
        file's digest checked as it is read (or, where the engine reads it, just before)."""

    @abc.abstractmethod
    def stage(self, payload: RowChunks) -> int:
        """Fill a fresh staging table with the rows; the target table is not touched. With an
        engine that pulls files, it gets the files it pulled (``LoadFiles``), as ``load``."""

    @abc.abstractmethod
    def staged_row_count(self) -> int:
        """Rows in the staging table (the governance gate counts them)."""

    @abc.abstractmethod
    def discard_stage(self) -> None:
        """Drop the staging table; the target table is not touched."""

    @abc.abstractmethod
    def finalize_staged_load(
        self,
        *,
        replace: bool = False,
        ledger: LedgerEntry | None = None,
        merge: Merge | None = None,
    ) -> int:
        """Move the staged rows into the target table in one transaction, with the ledger
        entry when given; the rows moved (``merge``, passed only when set: merged on its key,
        the staged rows counted as ``load`` counts them)."""

    @abc.abstractmethod
    def read_ledger(self, *, partitions: bool = False) -> list[LedgerEntry]:
        """This sink's target table's ledger entries, oldest first; ``[]`` when there is no
        ledger. ``partitions=True`` also reads each entry's partition list. Reads only."""

    @abc.abstractmethod
    def row_count(self) -> int:
        """Rows in the target table now; 0 when it does not exist. Reads only (``state
        restore`` compares it with the rows the ledger records)."""

    @abc.abstractmethod
    def is_empty(self) -> bool:
        """True when the target table does not exist or holds no row; reads at most one row.
        Every run asks it when the ledger records rows: a table dropped or emptied behind the
        ledger's back is refused, never silently skipped."""

    @abc.abstractmethod
    def read_rejects(self) -> list[tuple]:
        """This target table's rows set aside (``on_bad_value = "quarantine"``): (batch id,
        partition id, row digest, column, reason, value or None). Reads only."""

    @abc.abstractmethod
    def batch_rows(self, column: str, batch_id: str) -> int:
        """Rows of the target table whose ``column`` holds ``batch_id`` (the route's
        ``batch_column``): proof of a batch's outcome where the ledger row proves nothing
        (``features.ledger_atomic`` False). Reads only."""

    def fence_epoch(self) -> int:
        """With ``features.fence``: the target table's fence, the highest lease epoch that
        reached it; 0 when it has none. Reads only."""
        return 0

    def advance_fence(self, epoch: int) -> int:
        """With ``features.fence``: raise the fence to at least ``epoch`` in a transaction of
        its own, waiting a bounded time for a load that holds it; the fence now. Once it
        returns, no batch of an older epoch can commit, so a ledger read after it proves
        whether such a batch was applied. A server with sessions may first end the loads of
        older epochs into the table still open (their worker stopped past its lease): they
        could only roll back, and their locks would keep this holder's load waiting."""
        raise Unsupported("a fence")

    def check_merge(self, merge: Merge, columns: Sequence[Column]) -> None:
        """With ``features.merges``, on a merge route, after the schema contract and before
        the target call: refuse (``ConfigInvalid``) an existing target table the merge of
        ``columns`` (the target's columns) cannot run on exactly, so the route is refused,
        not blocked by a target call that fails (or, worse, merges wrongly). Reads only; the
        default finds nothing to refuse."""
        return None

    def check_keeps_rows(self, columns: Sequence[Column]) -> None:
        """On an append or full refresh route, after the schema contract and before the
        target call: refuse (``ConfigInvalid``) an existing target table that would not keep
        every row of ``columns`` it is sent (ClickHouse's engines that collapse rows), so the
        route is refused, not blocked by a count that comes short in the target call. Reads
        only; the default finds nothing to refuse."""
        return None

    def holding_connection(self) -> contextlib.AbstractContextManager[None]:
        """Calls within may share one connection, closed on exit even when the attempt fails
        (entered under the lease around the attempt; the default holds none). A chDB
        session is slow to open, and a run makes four to six calls (figures:
        docs/performance.md, fix 35)."""
        return contextlib.nullcontext()

    def engine(self) -> EnginePull | None:
        """The engine that reads sources itself (``engine.EnginePull``): what the lazy-plan
        path needs, and what lets the other paths skip reading rows in Python. None (the
        default): dpone reads every row."""
        return None


def __getattr__(name: str) -> Any:
    """The names of the 0.1 contract (``LedgerSink``, ``PendingLedger``, ...), for one release
    more, with a ``DeprecationWarning``: ``legacy.py`` keeps them."""
    import importlib
    import warnings

    legacy = importlib.import_module(f"{__name__}.legacy")
    if name not in legacy.__all__ or name.startswith(("Legacy", "adapt_")):
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    warnings.warn(
        f"{__name__}.{name} belongs to the connector contract of release 0.1, which the next "
        "release removes (docs/connectors.md, 'Moving a 0.1 connector')",
        DeprecationWarning,
        stacklevel=2,
    )
    return getattr(legacy, name)
