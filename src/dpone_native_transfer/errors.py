"""Errors with stable codes and safe diagnostics.

Every error the runtime raises on purpose carries a ``code`` that scripts and
alerting can match on, and ``diagnostics`` limited to identities an operator
needs: route, partition ids, phases, batch ids, counts. Messages are built only
from those fields, never from SQL, row values, credentials, connector
responses or the text of another exception.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

__all__ = [
    "CheckpointPayloadInvalid",
    "CheckpointStoreCorrupt",
    "CheckpointStoreUnavailable",
    "ClockInvalid",
    "ConfigInvalid",
    "GovernanceGateFailed",
    "ArtifactInvalid",
    "ManualReconciliationRequired",
    "NativeTransferError",
    "PluginLoadFailed",
    "SourceInvalid",
    "TargetCommitGuardInvalid",
    "TargetCommitGuardUnhandled",
]


class NativeTransferError(Exception):
    """Base class: ``code`` is stable, ``diagnostics`` is safe to log."""

    code: ClassVar[str] = "native_transfer_error"

    def __init__(self, message: str, *, diagnostics: Mapping[str, Any] | None = None) -> None:
        self.message = message
        self.diagnostics: dict[str, Any] = dict(diagnostics or {})
        super().__init__(f"{self.code}: {message}")


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
    """The source table or one of its named columns does not exist."""

    code = "native_transfer_source_invalid"


class GovernanceGateFailed(NativeTransferError):
    """A pre-target governance gate refused the attempt; the target was not touched."""

    code = "native_transfer_governance_gate_failed"


class ArtifactInvalid(NativeTransferError):
    """An exported artifact no longer matches its recorded digest."""

    code = "native_transfer_artifact_invalid"


class PluginLoadFailed(NativeTransferError):
    """An entry-point plugin could not be loaded or implements an unknown hook."""

    code = "native_transfer_plugin_load_failed"


class TargetCommitGuardUnhandled(NativeTransferError):
    """The route carries guards but no registered plugin reads them (guard plugin missing)."""

    code = "native_transfer_target_commit_guard_unhandled"
