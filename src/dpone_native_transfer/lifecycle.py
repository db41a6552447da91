"""The built-in, unguarded checkpoint lifecycle (legacy behaviour).

It answers the firstresult target hooks last, so an installed guard handles
them first and this one only runs when no guard is registered.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import attrs

from .checkpoints import FailureCode, PartitionCheckpointStatus
from .hookspecs import hookimpl

if TYPE_CHECKING:
    from .boundary import TargetMutation

__all__ = ["UnguardedLifecycle"]


@attrs.define(eq=False)
class UnguardedLifecycle:
    # trylast: the built-in must answer after any plugin that handles these hooks.
    @hookimpl(trylast=True)
    def after_target_success(self, mutation: TargetMutation, result: Any) -> bool:
        batch = mutation.batch(PartitionCheckpointStatus.COMMITTED, at=mutation.transition_time())
        mutation.store.upsert_many(batch)
        mutation.state.committed_ids = frozenset(mutation.partition_ids)
        return True

    @hookimpl(trylast=True)
    def on_target_error(self, mutation: TargetMutation, error: BaseException) -> bool:
        if not mutation.state.target_started:
            return True  # vetoed: the target was never called, nothing to record
        batch = mutation.batch(
            PartitionCheckpointStatus.FAILED,
            at=mutation.transition_time(),
            diagnostics={"error": FailureCode.TARGET_CALL_FAILED.value},
        )
        mutation.store.upsert_many(batch)
        return True
