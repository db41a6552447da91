"""What the runtime asks of connectors beyond the basics: optional, typed capabilities.

Each capability is a runtime-checkable Protocol; the runtime uses a
capability when the connector has it and behaves as before when it does not.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from ..errors import NativeTransferError

if TYPE_CHECKING:
    from ..column_types import Carry
    from ..identity import TableIdentity
    from ..ledger import LedgerEntry
    from ..payloads import Column
    from ._sql import ColumnDifference

__all__ = [
    "CursorEdgeReading",
    "Identified",
    "LedgerNotWritten",
    "LedgerSink",
    "PendingLedger",
    "RangePartitioned",
    "SchemaEvolving",
    "TargetChecking",
    "ValueCarrying",
]


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
        self, *, since: Any, upto: Any, nulls: bool, chunk_rows: int = 10_000
    ) -> Iterator[list[tuple]]:
        """Rows (all columns, ``describe()`` order) of every partition whose cursor is in
        ``[since, upto]`` (none when ``since`` is None) or, when ``nulls``, NULL. Reads only."""


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
    ``PendingLedger`` does the bookkeeping.
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
class ValueCarrying(Protocol):
    """A sink that says how each column's values reach it exactly (``column_types.py``).

    The runtime applies ``carrier(column)`` to every non-NULL value of that
    column as rows are read from the source, before they are spooled, staged or
    exported: so a value the target cannot hold exactly is refused with
    ``ValueUnsupported`` before the target call, on every row path. None means
    values pass unchanged. Lazy plans are read by the sink's engine, which must
    refuse (``check_plan``) what it would not read the same way.
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
        matching (``_sql.difference`` builds it); None when the table does not exist. Reads only."""

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
