"""EnginePull: a target engine that reads a source itself (``Sink.engine()``).

What the lazy-plan path needs (``check_plan``, ``load_plan``: no row passes through
dpone), and what lets the other paths skip reading rows in Python: the engine writes
the load files (``pull_load_files``) or fills the stage (``pull_stage``) from the source,
writes load files in its own format (``write_load_file``) and merges them
(``merge_load_files``). Each member but the plan's two has a default that does nothing
the runtime would miss: dpone then reads, writes or keeps the rows itself.
"""

from __future__ import annotations

import abc
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:
    from ...column_types import Column
    from ...ledger import LedgerEntry
    from ...payloads import LoadFile, LoadFiles, LoadPlan

__all__ = ["EnginePull"]


@runtime_checkable
class EnginePull(Protocol):
    """An engine that reads sources itself; every read is of the source, never the target,
    except ``load_plan``, which is a target call."""

    # the format of the files ``pull_load_files`` writes (".arrows", ".sqlite"); "" none
    pulled_suffix: str = ""
    # ``pull_stage`` fills the stage itself: the staged path then writes no load file
    stages: bool = False
    # ``Sink.load`` and ``Sink.stage`` load the Arrow files a source writes in bulk
    # (``bulk.BulkRead``), each value exactly as its ``_arrow.exact_type`` holds it
    reads_bulk_files: bool = False

    @abc.abstractmethod
    def check_plan(self, plan: LoadPlan) -> None:
        """Before the target call: ``Unsupported`` for a plan this engine cannot pull (such as
        one of a source it cannot read); ``PlanInexact`` for one it would not read as the row
        paths carry it (a value read differently): lazy-plan then carries the rows itself."""

    @abc.abstractmethod
    def load_plan(self, plan: LoadPlan, *, ledger: LedgerEntry | None = None) -> int:
        """The target call of lazy-plan: pull the plan's partitions in one transaction, with
        the ledger entry when given (as ``Sink.load``); the rows written."""

    def can_pull(self, plan: LoadPlan, files: int) -> bool:
        """Whether the engine reads the plan exactly into ``files`` files (one, or one per
        bound), asked before anything else reads the rows. Reads the source only. The
        default: never."""
        return False

    def copy_types(self, columns: Sequence[Column]) -> list[str] | None:
        """The PostgreSQL types (``format_type()``'s spelling) of the target columns a load of
        ``columns`` writes, in their order, when the engine loads files in PostgreSQL's
        binary ``COPY`` format (``BulkRead.write_copy_file``): a source whose columns have
        exactly those types hands over its bytes unchanged. Reads the target only. None
        (the default): the engine takes no such file."""
        return None

    def pull_load_files(
        self, plan: LoadPlan, paths: Sequence[Path]
    ) -> tuple[list[LoadFile], list[int]] | None:
        """The rows of a plan ``can_pull`` accepted in new private files at ``paths``, in the
        format ``Sink.load`` reads: every partition in one file (one path) or one file per
        bound (a path each); and each bound's row count. None when the engine's read failed
        (no file is left): the runtime then reads the rows itself."""
        return None

    def pull_stage(self, plan: LoadPlan) -> list[int] | None:
        """With ``stages``: fill a fresh staging table with the rows of a plan
        ``can_pull(plan, 1)`` accepted; each bound's row count. None when the engine's read
        failed or may differ from the one ``pull_load_files`` makes (no stage is left): the
        runtime then stages the rows it reads. Never touches the target."""
        return None

    def write_load_file(
        self, path: Path, columns: Sequence[Column], chunks: Iterable[Sequence[tuple]]
    ) -> LoadFile | Iterator[Sequence[tuple]]:
        """Write the (carried) chunks to the new private file ``path`` in the engine's own
        format (an Arrow IPC stream): the file written (``native``, its rows and the digest
        of its bytes). Or, once a value cannot be held exactly in that format (or the engine
        cannot read a file at ``path``), every row as chunks (read back, then the rest), for
        the caller to keep in its own format: the default, for every row. Touches nothing
        but the file."""
        return iter(chunks)

    def merge_load_files(self, payload: LoadFiles, folder: Path) -> LoadFiles:
        """``payload`` as the load reads it best: itself (the default), or with its files in
        the engine's format merged into one new file in ``folder`` (each file's digest
        checked as it is read), for an engine that takes many files worse than one (SQLite
        attaches ten databases; chDB pays for each INSERT). Runs before the target call."""
        return payload
