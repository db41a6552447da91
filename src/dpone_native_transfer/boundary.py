"""The one target-mutation boundary: the only place a sink is called.

Every transfer path hands its target call to :meth:`TargetBoundary.run`,
which fires the hooks around it in a fixed order. Process state for the
attempt lives on the :class:`TargetMutation`, never in module globals.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import TypeVar

import attrs

from .events import EventName, EventRecorder
from .mutation import AttemptState, TargetMutation
from .plugins import Hooks

__all__ = ["AttemptState", "TargetBoundary", "TargetMutation"]

T = TypeVar("T")


@attrs.define(eq=False)
class TargetBoundary:
    """Fires the target hooks around exactly one target call."""

    hooks: Hooks
    events: EventRecorder

    def run(self, mutation: TargetMutation, invoke: Callable[[], T]) -> T:
        """before-hook (a raise is a veto), the call, then the error or success hook.

        A veto or a target error fires ``on_target_error`` and then re-raises
        the original exception object with its traceback, whatever the error
        hooks and the event listener do.
        """
        try:
            self.hooks.before_target_mutation(mutation)
        except BaseException as veto:
            self._report_error(mutation, veto, EventName.TARGET_VETOED)
            raise
        if mutation.state.armed:
            self.events.emit(
                EventName.GUARD_ARMED,
                batch_id=mutation.state.batch_id,
                partitions=len(mutation.candidates),
            )
        mutation.state.target_started = True
        self.events.emit(EventName.TARGET_STARTED, operation=mutation.operation)
        try:
            result = invoke()
        except BaseException as error:
            self._report_error(mutation, error, EventName.TARGET_FAILED)
            raise
        mutation.state.target_succeeded = True
        self.events.emit(EventName.TARGET_SUCCEEDED, operation=mutation.operation)
        self.hooks.after_target_success(mutation, result)
        self.events.emit(
            EventName.CHECKPOINTS_COMMITTED, partitions=len(mutation.state.committed_ids)
        )
        return result

    def _report_error(self, mutation: TargetMutation, error: BaseException, event: str) -> None:
        """Emit ``event`` and fire ``on_target_error``; nothing raised here replaces ``error``.

        A failing error hook is recorded as ``error_hook_failed`` (its type only).
        Even ``KeyboardInterrupt`` from a hook or the listener is swallowed here:
        the caller re-raises the original, which is what it must see.
        """
        with contextlib.suppress(BaseException):
            self.events.emit(event, error_type=type(error).__name__)
        try:
            self.hooks.on_target_error(mutation, error)
        except BaseException as hook_error:
            with contextlib.suppress(BaseException):
                self.events.emit(EventName.ERROR_HOOK_FAILED, error_type=type(hook_error).__name__)
