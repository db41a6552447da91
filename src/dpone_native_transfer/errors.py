"""Errors with stable codes and safe diagnostics.

Every error the runtime raises on purpose carries a ``code`` that scripts and
alerting can match on, and ``diagnostics`` limited to identities an operator
needs: route, partition ids, phases, batch ids, counts. Messages are built only
from those fields, never from SQL, row values, credentials, connector
responses or the text of another exception.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar, Protocol, TypeVar

__all__ = [
    "AccessRefused",
    "CheckpointPayloadInvalid",
    "CheckpointStoreAccessRefused",
    "CheckpointStoreCorrupt",
    "CheckpointStoreUnavailable",
    "ClockInvalid",
    "ConfigInvalid",
    "CursorNull",
    "GovernanceGateFailed",
    "ArtifactInvalid",
    "InternalInvariantBroken",
    "LeaseFenced",
    "LeaseLost",
    "ManualReconciliationRequired",
    "NativeTransferError",
    "PathContractBroken",
    "PluginLoadFailed",
    "ResolutionConflict",
    "RouteDefinitionChanged",
    "SchemaChanged",
    "RouteBusy",
    "SourceAccessRefused",
    "SourceInvalid",
    "SourceMissing",
    "StoreClosed",
    "StoreTargetMismatch",
    "TargetAccessRefused",
    "TargetBusy",
    "TargetConstraintRefused",
    "TargetRowsMismatch",
    "TargetRowsUnproven",
    "TargetCommitGuardInvalid",
    "TargetCommitGuardUnhandled",
    "TargetUnavailable",
    "TargetVersionUnsupported",
    "ValueUnsupported",
    "WorkFolderFailed",
    "driver_error",
    "with_driver_error",
]

_E = TypeVar("_E", bound="NativeTransferError")


class _Route(Protocol):
    """What an error names a route by (``checkpoints.RouteKey``): errors import nothing."""

    @property
    def target_table(self) -> str: ...

    @property
    def label(self) -> str: ...

    def as_dict(self) -> dict[str, Any]: ...


class NativeTransferError(Exception):
    """Base class: ``code`` is stable, ``diagnostics`` is safe to log."""

    code: ClassVar[str] = "native_transfer_error"
    # False on errors a sink raises only after rolling its transaction back: they prove the
    # target call applied nothing (the guard records ``failed_before_target``, not unknown).
    applied: ClassVar[bool | None] = None

    def __init__(self, message: str, *, diagnostics: Mapping[str, Any] | None = None) -> None:
        self.message = message
        self.diagnostics: dict[str, Any] = dict(diagnostics or {})
        super().__init__(f"{self.code}: {message}")

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickled (to a worker process, a result backend) as made: the message once, the
        diagnostics kept, whatever the subclass's constructor takes; never the driver's error
        that ``with_driver_error`` kept, whose text may hold a host, a user or SQL."""
        state = {key: value for key, value in self.__dict__.items() if key != _DRIVER_ERROR}
        return (_rebuilt, (type(self), self.message, self.diagnostics), state)


_DRIVER_ERROR = "_driver_error"


def with_driver_error(error: _E, driver: BaseException) -> _E:
    """``error``, keeping the driver's own exception it was made from for ``--traceback`` alone.

    Not as ``__cause__`` or ``__context__``: every traceback (Airflow's task log too) prints
    the chain, and the driver's text may hold the host, the user, the database or SQL. It is
    not pickled either. ``driver_error`` gives it back.
    """
    setattr(error, _DRIVER_ERROR, driver)
    return error


def driver_error(error: BaseException) -> BaseException | None:
    """The driver's exception ``with_driver_error`` kept on ``error``, if any."""
    found = getattr(error, _DRIVER_ERROR, None)
    return found if isinstance(found, BaseException) else None


def _rebuilt(cls: type[NativeTransferError], message: str, diagnostics: dict[str, Any]) -> Any:
    error = Exception.__new__(cls)
    NativeTransferError.__init__(error, message, diagnostics=diagnostics)
    return error


class ManualReconciliationRequired(NativeTransferError):
    """A route carries an unresolved target-commit guard; an operator must reconcile it."""

    code = "native_transfer_manual_reconciliation_required"


class TargetCommitGuardInvalid(NativeTransferError):
    """A guard payload is malformed, of an unknown version, or contradicts its status."""

    code = "native_transfer_target_commit_guard_invalid"


class CheckpointPayloadInvalid(NativeTransferError):
    """A checkpoint payload does not follow the checkpoint schema."""

    code = "native_transfer_checkpoint_payload_invalid"


class CheckpointStoreCorrupt(NativeTransferError):
    """The checkpoint store cannot be read as a store (bad file, bad row)."""

    code = "native_transfer_checkpoint_store_corrupt"


class CheckpointStoreUnavailable(NativeTransferError):
    """The checkpoint store cannot be used now: its server cannot be reached, is busy or went
    away, or its file is locked, full or read-only (exit 1). A server that refused the login,
    the database or a privilege is the subclass ``CheckpointStoreAccessRefused`` (exit 2).

    Its message and diagnostics never hold the DSN, host, user, password or the
    driver's text: a DSN carries credentials.
    """

    code = "native_transfer_checkpoint_store_unavailable"


class AccessRefused(Exception):  # noqa: N818 - a marker, like the errors it marks
    """A server (or a file) refused this login: authentication failed, the database does not
    exist, or the login lacks a privilege it needs. A configuration mistake a retry cannot
    fix (exit 2): the errors it marks keep their component's code (``SourceAccessRefused``,
    ``TargetAccessRefused``, ``CheckpointStoreAccessRefused``), and their diagnostics name the
    ``failure`` and the server's ``sqlstate`` (or ``clickhouse_code``), never its text."""


class CheckpointStoreAccessRefused(CheckpointStoreUnavailable, AccessRefused):
    """The checkpoint store's server refused the login or a privilege (exit 2). Same code as
    ``CheckpointStoreUnavailable``."""


class ClockInvalid(NativeTransferError):
    """The injected clock returned something other than an aware UTC datetime."""

    code = "native_transfer_clock_invalid"


class ConfigInvalid(NativeTransferError):
    """A route configuration or spec is malformed; the message names the bad key."""

    code = "native_transfer_config_invalid"


class SourceInvalid(NativeTransferError):
    """The source cannot be read: it is missing, or it could not be reached or read now."""

    code = "native_transfer_source_invalid"


class SourceMissing(SourceInvalid):
    """The source file, table or a named column does not exist: a configuration mistake that
    a retry cannot fix (exit 2). Same code as ``SourceInvalid``."""


class SourceAccessRefused(SourceInvalid, AccessRefused):
    """The source's server refused the login, has no such database, or the login may not read
    the table (exit 2). Same code as ``SourceInvalid``."""


class ValueUnsupported(SourceInvalid):
    """A source value the target cannot hold exactly (a decimal with more digits than its
    column, a NaN SQLite would store as NULL, ...): refused before the target call, naming
    the column and never the value. A retry cannot fix it (exit 2)."""

    code = "native_transfer_value_unsupported"


class GovernanceGateFailed(NativeTransferError):
    """A pre-target governance gate refused the attempt; the target was not touched."""

    code = "native_transfer_governance_gate_failed"


class ArtifactInvalid(NativeTransferError):
    """An exported artifact no longer matches its recorded digest."""

    code = "native_transfer_artifact_invalid"


class WorkFolderFailed(NativeTransferError):
    """The run's work folder (``artifact_dir``) could not be written or read before the target
    call: a full disk, a quota, a read-only or vanished folder. Nothing was written to the
    target and the route is not blocked; a retry after freeing the folder is safe."""

    code = "native_transfer_work_folder_failed"


class TargetUnavailable(NativeTransferError):
    """The target database cannot be opened or read now (locked, unreachable); a retry may
    succeed. Nothing was written."""

    code = "native_transfer_target_unavailable"


class TargetBusy(TargetUnavailable):
    """Another writer held the target file past the wait when the load began or committed, and
    the load was rolled back: nothing applied, so the route is not blocked (exit 1, as
    ``TargetUnavailable``, whose code it has). A retry may succeed."""

    applied: ClassVar[bool | None] = False

    @classmethod
    def waited(
        cls,
        target_table: str,
        seconds: float,
        *,
        held: str = "another writer held its database file",
    ) -> TargetBusy:
        """``held``: who held what past the wait (no value, SQL or path)."""
        return cls(
            f"target table {target_table!r}: {held} for more than {seconds:g} s; the load was "
            "rolled back and applied nothing; a retry may succeed",
            diagnostics={"target_table": target_table},
        )


class TargetVersionUnsupported(ConfigInvalid):
    """The target database is a file (DuckDB) or a data folder (chDB) the installed engine
    cannot read because of its version: written by a newer engine, or by one so old that it
    needs migrating. No retry can succeed, so it is refused before the target (exit 2), naming
    both versions and what to install; nothing was written."""

    code = "native_transfer_target_version_unsupported"
    applied = False  # raised only before the engine opened the target


class TargetAccessRefused(TargetUnavailable, AccessRefused):
    """The target's server refused the login, has no such database, or the login lacks a
    privilege (exit 2); nothing was written. Same code as ``TargetUnavailable``."""


class TargetPrivilegeRefused(TargetAccessRefused):
    """The login lacked a privilege a statement of the load needed (SQLSTATE ``42501``: to
    create the schema's ledger or fence table, say) inside the load's transaction, which
    the server aborted and the sink rolled back: nothing applied, the route not blocked
    (exit 2, as ``TargetAccessRefused``)."""

    applied: ClassVar[bool | None] = False

    @classmethod
    def rolled_back(cls, target_table: str) -> TargetPrivilegeRefused:
        return cls(
            f"the login of target table {target_table!r} lacks a privilege the load needed "
            "(SQLSTATE 42501: INSERT on the table, CREATE on its schema where the table or "
            "the schema's _dpone_ledger or _dpone_fence does not exist yet); the load was "
            "rolled back and nothing was applied: grant it, then run again",
            diagnostics={"target_table": target_table, "sqlstate": "42501"},
        )


class TargetRolledBack(TargetUnavailable):
    """A statement of the load failed before its COMMIT was sent (a statement timeout, a
    session ended, a feature the table refuses): the server cannot have committed it, and
    the sink rolled back; nothing applied, the route not blocked (exit 1, a retry may
    succeed). An error at the COMMIT itself is not this one: its outcome is unknown."""

    applied: ClassVar[bool | None] = False

    @classmethod
    def failed(cls, target_table: str, cause: str) -> TargetRolledBack:
        """``cause``: the engine's code for the failure (``SQLSTATE 57014``,
        ``OutOfMemoryException``), never its message."""
        return cls(
            f"a statement of the load into target table {target_table!r} failed before its "
            f"commit ({cause}); the load was rolled back and nothing was applied; a retry may "
            "succeed",
            diagnostics={"target_table": target_table, "cause": cause},
        )


class PluginLoadFailed(NativeTransferError):
    """An entry-point plugin could not be loaded or implements an unknown hook."""

    code = "native_transfer_plugin_load_failed"


class TargetCommitGuardUnhandled(NativeTransferError):
    """The route carries guards but no registered plugin reads them (guard plugin missing)."""

    code = "native_transfer_target_commit_guard_unhandled"


class RouteBusy(NativeTransferError):
    """Another attempt holds the lease of the target table; a later retry may succeed."""

    code = "native_transfer_route_busy"

    @classmethod
    def held_by(cls, route: _Route, holder: Any) -> RouteBusy:
        """Named by its holder: who, since when, whether it is alive, and when it expires."""
        if holder is None:
            who = "another attempt"
        else:
            process = holder.process
            if process is None:
                alive = "its process is unknown (an older release)"
            elif process.on_this_machine():
                alive = (
                    "its process on this machine is gone"
                    if process.gone()
                    else "its process on this machine is alive (running, or paused)"
                )
            else:
                alive = "it runs on another machine"
            who = (
                f"{holder.owner} (run {holder.run_id}, route "
                f"{holder.route.get('source_table')} -> {holder.route.get('target_table')}) "
                f"since {holder.acquired_at}, last heartbeat {holder.heartbeat_at}; {alive}; "
                f"its lease expires at {holder.expires_at} unless its heartbeat renews it"
            )
        return cls(
            f"target table {route.target_table!r} is being written by {who}; "
            "nothing was read or written; retry when that attempt has ended",
            diagnostics={
                "route": route.as_dict(),
                "holder": None if holder is None else holder.as_dict(),
            },
        )


class LeaseLost(RouteBusy):
    """The attempt no longer holds its target table's lease (it was paused past it, or the
    store was unreachable), so another attempt may hold it: the store refused its write, or
    it noticed before its target call, and it stopped. It does not say whether a target call
    it made had committed (``applied`` None): if so, its batch stays armed and the next run
    proves it from the target's ledger. A retry may succeed (exit 1)."""

    code = "native_transfer_lease_lost"

    @classmethod
    def lost(cls, route: _Route) -> LeaseLost:
        return cls(
            f"the lease on target table {route.target_table!r} was lost (the worker was "
            "paused past it or the store was unreachable) and another attempt may hold it; "
            "this attempt stopped without writing to the checkpoint store (a target call it "
            "had committed stays armed, and the next run proves it from the target's "
            "ledger); a retry may succeed",
            diagnostics={"route": route.as_dict(), "lease": "lost"},
        )


class LeaseFenced(LeaseLost):
    """The target's fence refused the batch inside its own transaction: a newer holder of the
    lease reached the target first. The sink rolled back: nothing was applied (exit 1)."""

    applied: ClassVar[bool | None] = False

    @classmethod
    def fenced(cls, target_table: str, batch_id: str) -> LeaseFenced:
        return cls(
            f"target table {target_table!r} refused this batch: a newer holder of its lease "
            "reached the target first (this worker was paused past it); the load was "
            "rolled back and applied nothing; a retry may succeed",
            diagnostics={"target_table": target_table, "batch_id": batch_id, "lease": "fenced"},
        )


class TargetRowsMismatch(NativeTransferError):
    """The target applied another number of rows than the batch sent (a trigger or rule that
    drops or adds rows, a constraint that ignores some), so the sink rolled its transaction
    back: nothing applied, the route not blocked. A retry meets the same cause (exit 2)."""

    code = "native_transfer_target_rows_mismatch"
    applied: ClassVar[bool | None] = False

    @classmethod
    def counted(cls, target_table: str, batch_id: str, *, sent: int, applied: int) -> Any:
        return cls(
            f"target table {target_table!r} applied {applied:,} rows of the {sent:,} the batch "
            "sent (a trigger, rule or constraint on it dropped or added rows); the load was "
            "rolled back and nothing was applied; remove the cause, then run again",
            diagnostics={"target_table": target_table, "batch_id": batch_id, "sent": sent,
                         "applied": applied},
        )  # fmt: skip

    @classmethod
    def rewriting(cls, target_table: str, found: int) -> TargetRowsMismatch:
        """Refused before the target: the table has triggers or rules (or is a view), row-level
        security policies that apply to the login, or SQLite ``ON CONFLICT REPLACE`` clauses,
        that may drop, add, hide or change the rows an insert or a refresh's delete is
        handed."""
        return cls(
            f"target table {target_table!r} has {found} trigger(s), rule(s), view definitions, "
            "row-level security policies or ON CONFLICT REPLACE clauses that run on inserts or "
            "deletes and may drop, add, hide or change the rows dpone loads, so what it applies "
            "could not be proven; nothing was written: remove or disable them (or load with a "
            "login they do not apply to), or load into a table without them",
            diagnostics={"target_table": target_table, "rewriting": found},
        )


class TargetRowsUnproven(TargetRowsMismatch):
    """A target without transactions (ClickHouse) holds another number of new rows than the
    batch sent, counted after its insert: nothing can be rolled back, so what it applied is
    unknown and the guard blocks the route until the target is reconciled (exit 2 now)."""

    applied = None

    @classmethod
    def counted(cls, target_table: str, batch_id: str, *, sent: int, applied: int) -> Any:
        return cls(
            f"target table {target_table!r} gained {applied:,} rows where the batch sent "
            f"{sent:,} (another writer, a deduplicated insert, or an engine that merges rows); "
            "this target cannot roll back, so the route is blocked until an operator "
            "reconciles it (`dpone-transfer guard verify`)",
            diagnostics={"target_table": target_table, "batch_id": batch_id, "sent": sent,
                         "applied": applied},
        )  # fmt: skip


class TargetConstraintRefused(TargetRowsMismatch):
    """A constraint of the target table (unique, not null, check, foreign key; a SQLite
    ``INTEGER PRIMARY KEY`` that takes only integers) or a column's type made by hand (an
    enum, ``varchar(n)``) refused a row of the load inside its transaction, which the sink
    rolled back: nothing applied, the route not blocked. A retry meets the same cause (exit
    2). Said only by a sink that rolls back (not ClickHouse)."""

    code = "native_transfer_target_constraint"

    @classmethod
    def refused(cls, target_table: str, *, constraint: str) -> TargetConstraintRefused:
        """``constraint``: the engine's code for the kind refused (``SQLITE_CONSTRAINT_UNIQUE``,
        SQLSTATE ``23505``), never its message, which names values."""
        return cls(
            f"a constraint or column type of target table {target_table!r} refused a row of "
            f"the batch ({constraint}); the load was rolled back and nothing was applied: "
            "change the table's constraint or column type, or the source's rows, then run "
            "again",
            diagnostics={"target_table": target_table, "constraint": constraint},
        )


class StoreTargetMismatch(NativeTransferError):
    """The checkpoint store and the target's ledger disagree about what the target holds.

    ``diagnostics["mismatch"]`` says which way: ``target_ahead_of_store``,
    ``store_ahead_of_target`` or ``replaced_by_another_route``.
    """

    code = "native_transfer_store_target_mismatch"


class RouteDefinitionChanged(ConfigInvalid):
    """An append route's partition or cursor column differs from the one its committed state
    was built with: its windows and partitions would now cover other rows, so a run would
    append some twice or skip others. Refused before the target (exit 2)."""

    code = "native_transfer_route_changed"


class SchemaChanged(ConfigInvalid):
    """The source's columns differ from the target table's in a way the route's schema
    contract does not allow; refused before the target (exit 2)."""

    code = "native_transfer_schema_changed"


class CursorNull(ConfigInvalid):
    """An append route's cursor column holds NULLs that ``on_null_cursor = "error"`` refuses:
    no window would ever load them. Refused before the target (exit 2)."""

    code = "native_transfer_cursor_null"


class PathContractBroken(NativeTransferError):
    """A transfer path broke the boundary's contract: it returned without reaching the target,
    tried to reach it twice, or handed the sink a payload it does not take. A bug in the
    path, not in the route file (exit 1)."""

    code = "native_transfer_path_contract_broken"


class StoreClosed(NativeTransferError, ValueError):
    """A checkpoint store was used after ``close()``: a bug in the calling code, not in the
    route file (exit 1). Nothing was read or written by that call. Still a ``ValueError``,
    which is what a closed store raised before it had a code."""

    code = "native_transfer_store_closed"

    @classmethod
    def used(cls, store: object) -> StoreClosed:
        kind = type(store).__name__  # the class, never the location: a DSN holds credentials
        return cls(
            f"this {kind} is closed: it was used after close(); open the store again",
            diagnostics={"store": kind},
        )


class InternalInvariantBroken(NativeTransferError):
    """dpone (or a first-party plugin) found one of its own invariants broken: a bug, not a
    problem of the route file or the data (exit 1). The message names the invariant."""

    code = "native_transfer_internal_invariant_broken"


class ResolutionConflict(ConfigInvalid):
    """An operator repair was refused: a checkpoint it would replace changed meanwhile."""

    code = "native_transfer_resolution_conflict"

    @classmethod
    def changed(cls, route: _Route, partition_ids: list[str]) -> ResolutionConflict:
        return cls(
            f"refusing to write: {len(partition_ids)} partition(s) of route {route.label} "
            "changed since they were shown (a run or another operator wrote them); nothing "
            "was written; look again and repeat",
            diagnostics={"route": route.as_dict(), "partition_ids": partition_ids},
        )
