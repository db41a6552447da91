"""What the runtime asks of connectors beyond the basics: optional, typed capabilities.

Each capability is a runtime-checkable Protocol; the runtime uses a
capability when the connector has it and behaves as before when it does not.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:
    from ..identity import TableIdentity
    from ..ledger import LedgerEntry

__all__ = ["Identified", "LedgerSink"]


@runtime_checkable
class Identified(Protocol):
    """A source or sink that says which database and table it reads or writes.

    Without it, a route is keyed by its table names only (``RouteKey`` unlocated).
    """

    def identity(self) -> TableIdentity:
        """The engine kind, normalized location and canonical table name; never a credential."""


@runtime_checkable
class LedgerSink(Protocol):
    """A sink that keeps the target's batch ledger (``_dpone_ledger``, see ``ledger.py``).

    Writing: when a load payload (``RowChunks``, ``LoadPlan``, ``ArtifactFiles``)
    carries ``ledger``, or ``finalize_staged_load`` is given ``ledger=``, the
    sink inserts ``ledger.row()`` plus the rows it applied into the ledger table
    of the target database, creating the table on first use. ``ledger_atomic``
    says whether that row commits in the same transaction as the rows (then a
    missing row proves the batch was not applied); a sink without multi-table
    transactions writes it after the rows and sets it False.
    """

    ledger_atomic: bool

    def read_ledger(self, *, partitions: bool = False) -> list[LedgerEntry]:
        """This sink's target table's entries, oldest first; ``[]`` when there is no ledger.

        Reads only. ``partitions=True`` also reads each entry's partition list.
        """
