"""The built-in, unguarded checkpoint lifecycle (legacy behaviour).

Every implementation of the target hooks runs; this one records only a
batch that no plugin armed, so a guard that armed the batch owns its
checkpoints and this lifecycle owns the rest.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import attrs

from .checkpoints import FailureCode, PartitionCheckpointStatus
from .hookspecs import hookimpl

if TYPE_CHECKING:
    from .mutation import TargetMutation

__all__ = ["UnguardedLifecycle"]


@attrs.define(eq=False)
class UnguardedLifecycle:
    # trylast: the built-in runs after every plugin's implementation.
    @hookimpl(trylast=True)
    def after_target_success(self, mutation: TargetMutation, result: Any) -> None:
        if mutation.state.armed:
            return  # the plugin that armed the batch promotes it
        batch = mutation.batch(PartitionCheckpointStatus.COMMITTED, at=mutation.transition_time())
        mutation.store.upsert_many(batch)
        mutation.state.committed_ids = frozenset(mutation.partition_ids)

    @hookimpl(trylast=True)
    def on_target_error(self, mutation: TargetMutation, error: BaseException) -> None:
        if mutation.state.armed or not mutation.state.target_started:
            return  # the arming plugin records it; or vetoed: the target was never called
        batch = mutation.batch(
            PartitionCheckpointStatus.FAILED,
            at=mutation.transition_time(),
            diagnostics={"error": FailureCode.TARGET_CALL_FAILED.value},
        )
        mutation.store.upsert_many(batch)
