"""dpone-native-transfer: checkpointed table transfers guarded against duplicate appends.

The public API is re-exported here; code outside the project imports from
this module only.
"""

from __future__ import annotations

from .boundary import AttemptState, TargetMutation
from .checkpoints import (
    PartitionCheckpoint,
    PartitionCheckpointStatus,
    RouteKey,
    Strategy,
    checkpoint_from_payload,
    checkpoint_to_payload,
)
from .connectors import ClickHouseSink, DuckDBSink, PostgresSource, SQLiteSink, SQLiteSource
from .errors import (
    ArtifactInvalid,
    CheckpointPayloadInvalid,
    CheckpointStoreCorrupt,
    CheckpointStoreUnavailable,
    ClockInvalid,
    ConfigInvalid,
    CursorNull,
    GovernanceGateFailed,
    ManualReconciliationRequired,
    NativeTransferError,
    PathContractBroken,
    PluginLoadFailed,
    ResolutionConflict,
    RouteBusy,
    RouteDefinitionChanged,
    SchemaChanged,
    SourceInvalid,
    SourceMissing,
    StoreTargetMismatch,
    TargetCommitGuardInvalid,
    TargetCommitGuardUnhandled,
    TargetUnavailable,
    ValueUnsupported,
)
from .events import Event, EventName
from .hookspecs import hookimpl
from .paths import Governance, PathContext
from .payloads import Column, LoadPlan, RowChunks, SourceShape
from .plugins import entry_point_plugins
from .runtime import TransferResult, TransferRuntime, TransferSpec
from .stores import CheckpointStore, RouteStateStore
from .stores.memory import MemoryCheckpointStore
from .stores.postgres import PostgresCheckpointStore
from .stores.sqlite import SQLiteCheckpointStore

__all__ = [
    "ArtifactInvalid",
    "AttemptState",
    "CheckpointPayloadInvalid",
    "CheckpointStore",
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
    "Governance",
    "GovernanceGateFailed",
    "LoadPlan",
    "ManualReconciliationRequired",
    "MemoryCheckpointStore",
    "NativeTransferError",
    "PathContractBroken",
    "PartitionCheckpoint",
    "PartitionCheckpointStatus",
    "PathContext",
    "PluginLoadFailed",
    "PostgresCheckpointStore",
    "PostgresSource",
    "ResolutionConflict",
    "RouteBusy",
    "RouteDefinitionChanged",
    "SchemaChanged",
    "RouteKey",
    "RouteStateStore",
    "RowChunks",
    "SQLiteCheckpointStore",
    "SQLiteSink",
    "SQLiteSource",
    "SourceInvalid",
    "SourceMissing",
    "SourceShape",
    "StoreTargetMismatch",
    "Strategy",
    "TargetCommitGuardInvalid",
    "TargetCommitGuardUnhandled",
    "TargetUnavailable",
    "TargetMutation",
    "TransferResult",
    "TransferRuntime",
    "TransferSpec",
    "ValueUnsupported",
    "checkpoint_from_payload",
    "checkpoint_to_payload",
    "entry_point_plugins",
    "hookimpl",
]
