"""dpone-native-transfer: checkpointed table transfers guarded against duplicate appends.

The public API is re-exported here; code outside the project imports from
this module only.

Each name is imported from its module on first use (PEP 562, ``__getattr__``
below). Importing any module of the package imports this one first, and it
imports nothing of its own, so ``import dpone_native_transfer.errors`` loads
no connector, store or runtime. ``from dpone_native_transfer import X`` works
as before; type checkers read the ``TYPE_CHECKING`` imports, and never see
``__getattr__``, so a misspelt name is still an error to them.
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
from typing import TYPE_CHECKING, Any

# A library logs; its application decides what is shown (the command line: --log-level).
logging.getLogger(__name__).addHandler(logging.NullHandler())

if TYPE_CHECKING:
    __version__: str

    from .boundary import AttemptState, TargetMutation
    from .checkpoints import (
        GUARD_DIAGNOSTICS_KEY,
        LEASE_EPOCH_KEY,
        LEDGER_BATCH_KEY,
        FailureCode,
        PartitionCheckpoint,
        PartitionCheckpointStatus,
        RouteKey,
        Strategy,
        batch_id_for,
        checkpoint_from_payload,
        checkpoint_to_payload,
        format_timestamp,
    )
    from .connectors import (
        ClickHouseSink,
        DuckDBSink,
        PostgresSink,
        PostgresSource,
        SQLiteSink,
        SQLiteSource,
    )
    from .errors import (
        AccessRefused,
        ArtifactInvalid,
        CheckpointPayloadInvalid,
        CheckpointStoreAccessRefused,
        CheckpointStoreCorrupt,
        CheckpointStoreUnavailable,
        ClockInvalid,
        ConfigInvalid,
        CursorNull,
        GovernanceGateFailed,
        InternalInvariantBroken,
        LeaseLost,
        ManualReconciliationRequired,
        NativeTransferError,
        PathContractBroken,
        PluginLoadFailed,
        ResolutionConflict,
        RouteBusy,
        RouteDefinitionChanged,
        SchemaChanged,
        SourceAccessRefused,
        SourceInvalid,
        SourceMissing,
        StoreClosed,
        StoreTargetMismatch,
        TargetAccessRefused,
        TargetCommitGuardInvalid,
        TargetCommitGuardUnhandled,
        TargetRowsMismatch,
        TargetRowsUnproven,
        TargetUnavailable,
        TargetVersionUnsupported,
        ValueUnsupported,
        WorkFolderFailed,
    )
    from .events import Event, EventName
    from .hookspecs import hookimpl
    from .latest import LatestCheckpoints, as_latest
    from .paths import Governance, PathContext
    from .payloads import Column, LoadPlan, RowChunks, SourceShape
    from .plugins import entry_point_plugins
    from .recovery import TargetRecovery
    from .runtime import TransferResult, TransferRuntime, TransferSpec
    from .stores import CheckpointStore, RouteStateStore
    from .stores.memory import MemoryCheckpointStore
    from .stores.postgres import PostgresCheckpointStore
    from .stores.sqlite import SQLiteCheckpointStore

# Each public name and the module (relative to this package) that defines it.
_EXPORTS: dict[str, str] = {
    "AttemptState": "boundary",
    "TargetMutation": "boundary",
    "PartitionCheckpoint": "checkpoints",
    "PartitionCheckpointStatus": "checkpoints",
    "RouteKey": "checkpoints",
    "Strategy": "checkpoints",
    "checkpoint_from_payload": "checkpoints",
    "checkpoint_to_payload": "checkpoints",
    "GUARD_DIAGNOSTICS_KEY": "checkpoints",
    "LEDGER_BATCH_KEY": "checkpoints",
    "LEASE_EPOCH_KEY": "checkpoints",
    "FailureCode": "checkpoints",
    "batch_id_for": "checkpoints",
    "format_timestamp": "checkpoints",
    "ClickHouseSink": "connectors",
    "DuckDBSink": "connectors",
    "PostgresSink": "connectors",
    "PostgresSource": "connectors",
    "SQLiteSink": "connectors",
    "SQLiteSource": "connectors",
    "AccessRefused": "errors",
    "ArtifactInvalid": "errors",
    "CheckpointPayloadInvalid": "errors",
    "CheckpointStoreAccessRefused": "errors",
    "CheckpointStoreCorrupt": "errors",
    "CheckpointStoreUnavailable": "errors",
    "ClockInvalid": "errors",
    "ConfigInvalid": "errors",
    "CursorNull": "errors",
    "GovernanceGateFailed": "errors",
    "InternalInvariantBroken": "errors",
    "LeaseLost": "errors",
    "ManualReconciliationRequired": "errors",
    "NativeTransferError": "errors",
    "PathContractBroken": "errors",
    "PluginLoadFailed": "errors",
    "ResolutionConflict": "errors",
    "RouteBusy": "errors",
    "RouteDefinitionChanged": "errors",
    "SchemaChanged": "errors",
    "SourceInvalid": "errors",
    "SourceAccessRefused": "errors",
    "SourceMissing": "errors",
    "StoreClosed": "errors",
    "StoreTargetMismatch": "errors",
    "TargetCommitGuardInvalid": "errors",
    "TargetCommitGuardUnhandled": "errors",
    "TargetRowsMismatch": "errors",
    "TargetRowsUnproven": "errors",
    "TargetAccessRefused": "errors",
    "TargetUnavailable": "errors",
    "TargetVersionUnsupported": "errors",
    "ValueUnsupported": "errors",
    "WorkFolderFailed": "errors",
    "Event": "events",
    "EventName": "events",
    "hookimpl": "hookspecs",
    "LatestCheckpoints": "latest",
    "as_latest": "latest",
    "Governance": "paths",
    "PathContext": "paths",
    "Column": "payloads",
    "LoadPlan": "payloads",
    "RowChunks": "payloads",
    "SourceShape": "payloads",
    "entry_point_plugins": "plugins",
    "TargetRecovery": "recovery",
    "TransferResult": "runtime",
    "TransferRuntime": "runtime",
    "TransferSpec": "runtime",
    "CheckpointStore": "stores",
    "RouteStateStore": "stores",
    "MemoryCheckpointStore": "stores.memory",
    "PostgresCheckpointStore": "stores.postgres",
    "SQLiteCheckpointStore": "stores.sqlite",
}

__all__ = [
    "AccessRefused",
    "ArtifactInvalid",
    "AttemptState",
    "CheckpointPayloadInvalid",
    "CheckpointStore",
    "CheckpointStoreAccessRefused",
    "CheckpointStoreCorrupt",
    "CheckpointStoreUnavailable",
    "ClickHouseSink",
    "ClockInvalid",
    "Column",
    "ConfigInvalid",
    "CursorNull",
    "DuckDBSink",
    "Event",
    "EventName",
    "FailureCode",
    "GUARD_DIAGNOSTICS_KEY",
    "Governance",
    "GovernanceGateFailed",
    "InternalInvariantBroken",
    "LEASE_EPOCH_KEY",
    "LEDGER_BATCH_KEY",
    "LatestCheckpoints",
    "LeaseLost",
    "LoadPlan",
    "ManualReconciliationRequired",
    "MemoryCheckpointStore",
    "NativeTransferError",
    "PartitionCheckpoint",
    "PartitionCheckpointStatus",
    "PathContext",
    "PathContractBroken",
    "PluginLoadFailed",
    "PostgresCheckpointStore",
    "PostgresSink",
    "PostgresSource",
    "ResolutionConflict",
    "RouteBusy",
    "RouteDefinitionChanged",
    "RouteKey",
    "RouteStateStore",
    "RowChunks",
    "SQLiteCheckpointStore",
    "SQLiteSink",
    "SQLiteSource",
    "SchemaChanged",
    "SourceAccessRefused",
    "SourceInvalid",
    "SourceMissing",
    "SourceShape",
    "StoreClosed",
    "StoreTargetMismatch",
    "Strategy",
    "TargetAccessRefused",
    "TargetCommitGuardInvalid",
    "TargetCommitGuardUnhandled",
    "TargetMutation",
    "TargetRecovery",
    "TargetRowsMismatch",
    "TargetRowsUnproven",
    "TargetUnavailable",
    "TargetVersionUnsupported",
    "TransferResult",
    "TransferRuntime",
    "TransferSpec",
    "ValueUnsupported",
    "WorkFolderFailed",
    "as_latest",
    "batch_id_for",
    "checkpoint_from_payload",
    "checkpoint_to_payload",
    "entry_point_plugins",
    "format_timestamp",
    "hookimpl",
]


if not TYPE_CHECKING:

    def __getattr__(name: str) -> Any:
        if name == "__version__":  # pyproject's version, as installed: its one source
            from importlib import metadata

            try:
                return metadata.version("dpone-native-transfer")
            except metadata.PackageNotFoundError:  # imported from a source tree, not installed
                return "unknown"
        module = _EXPORTS.get(name)
        if module is None:  # a submodule (``dpone_native_transfer.runtime``), imported on use
            if name.startswith("_") or importlib.util.find_spec(f"{__name__}.{name}") is None:
                raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
            return importlib.import_module(f".{name}", __name__)
        value = getattr(importlib.import_module(f".{module}", __name__), name)
        globals()[name] = value  # looked up once: later reads find the module attribute
        return value

    def __dir__() -> list[str]:
        return sorted(__all__)
