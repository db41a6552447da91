"""Errors with stable codes and safe diagnostics.

Every error the runtime raises on purpose carries a ``code`` that scripts and
alerting can match on, and ``diagnostics`` limited to identities an operator
needs: route, partition ids, phases, batch ids, counts. Messages are built only
from those fields, never from SQL, row values, credentials, connector
responses or the text of another exception.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:
    from .checkpoints import RouteKey
    from .lease import LeaseHolder

__all__ = [
    "CheckpointPayloadInvalid",
    "CheckpointStoreCorrupt",
    "CheckpointStoreUnavailable",
    "ClockInvalid",
    "ConfigInvalid",
    "CursorNull",
    "GovernanceGateFailed",
    "ArtifactInvalid",
    "InternalInvariantBroken",
    "LeaseLost",
    "ManualReconciliationRequired",
    "NativeTransferError",
    "PathContractBroken",
    "PluginLoadFailed",
    "ResolutionConflict",
    "RouteDefinitionChanged",
    "SchemaChanged",
    "RouteBusy",
    "SourceInvalid",
    "SourceMissing",
    "StoreClosed",
    "StoreTargetMismatch",
    "TargetRowsMismatch",
    "TargetRowsUnproven",
    "TargetCommitGuardInvalid",
    "TargetCommitGuardUnhandled",
    "TargetUnavailable",
    "TargetVersionUnsupported",
    "ValueUnsupported",
    "WorkFolderFailed",
]


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
        diagnostics kept, whatever the subclass's constructor takes."""
        return (_rebuilt, (type(self), self.message, self.diagnostics), self.__dict__)


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
    """The checkpoint store's server cannot be reached, refused the credentials, or went away.

    Its message and diagnostics never hold the DSN, host, user, password or the
    driver's text: a DSN carries credentials.
    """

    code = "native_transfer_checkpoint_store_unavailable"


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


class TargetVersionUnsupported(ConfigInvalid):
    """The target database is a file (DuckDB) or a data folder (chDB) the installed engine
    cannot read because of its version: written by a newer engine, or by one so old that it
    needs migrating. No retry can succeed, so it is refused before the target (exit 2), naming
    both versions and what to install; nothing was written."""

    code = "native_transfer_target_version_unsupported"
    applied = False  # raised only before the engine opened the target


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
    def held_by(cls, route: RouteKey, holder: LeaseHolder | None) -> RouteBusy:
        who = (
            "another attempt"
            if holder is None
            else f"{holder.owner} (run {holder.run_id}, route "
            f"{holder.route.get('source_table')} -> {holder.route.get('target_table')}) "
            f"since {holder.acquired_at}, last heartbeat {holder.heartbeat_at}"
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
    store was unreachable), so another attempt may hold it: it stopped where it noticed,
    having armed nothing, or was refused by the target's fence inside its own transaction
    (nothing applied). The route is not blocked by it; a retry may succeed (exit 1)."""

    code = "native_transfer_lease_lost"
    applied: ClassVar[bool | None] = False

    @classmethod
    def lost(cls, route: RouteKey) -> LeaseLost:
        return cls(
            f"the lease on target table {route.target_table!r} was lost (the worker was "
            "paused past it or the store was unreachable) and another attempt may hold it; "
            "this attempt applied nothing to the target and stopped; a retry may succeed",
            diagnostics={"route": route.as_dict(), "lease": "lost"},
        )

    @classmethod
    def fenced(cls, target_table: str, batch_id: str) -> LeaseLost:
        return cls(
            f"target table {target_table!r} refused this batch: a newer holder of its lease "
            "reached the target first (this worker was paused past its lease); the load was "
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
        """Refused before the target: the table has triggers or rules (or is a view) that may
        drop, add or change the rows an insert or a refresh's delete is handed."""
        return cls(
            f"target table {target_table!r} has {found} trigger(s), rule(s) or view definitions "
            "that run on inserts or deletes and may drop, add or change the rows dpone loads, "
            "so what it applies could not be proven; nothing was written: remove or disable "
            "them, or load into a table without them",
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
    def changed(cls, route: RouteKey, partition_ids: list[str]) -> ResolutionConflict:
        return cls(
            f"refusing to write: {len(partition_ids)} partition(s) of route {route.label} "
            "changed since they were shown (a run or another operator wrote them); nothing "
            "was written; look again and repeat",
            diagnostics={"route": route.as_dict(), "partition_ids": partition_ids},
        )
