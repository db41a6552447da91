"""The hook contract between the runtime and its plugins.

This module is the reference: each hookspec's docstring is the contract and
``docs/hooks.md`` is checked against it. Plugins implement hooks with
``hookimpl``; only the runtime declares them. Importing this module has no
side effects.

The three target hooks share one argument, ``mutation`` (a
:class:`~dpone_native_transfer.boundary.TargetMutation`), and are fired only
by the runtime's one target-mutation boundary, in this order::

    before_target_mutation(mutation)          a raise is a veto: the target is not called
    <target call>
    on_target_error(mutation, error)          after a veto, or if the target call raised
    after_target_success(mutation, result)    if it returned
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pluggy

if TYPE_CHECKING:
    from .checkpoints import RouteKey
    from .latest import LatestCheckpoints
    from .mutation import TargetMutation
    from .recovery import TargetRecovery

__all__ = ["PROJECT_NAME", "hookimpl"]

PROJECT_NAME = "dpone_native_transfer"

hookimpl = pluggy.HookimplMarker(PROJECT_NAME)
_hookspec = pluggy.HookspecMarker(PROJECT_NAME)


@_hookspec
def resume_route_scan(
    route: RouteKey, checkpoints: LatestCheckpoints, recovery: TargetRecovery | None
) -> bool | None:
    """Inspect every latest checkpoint of a route before any resume decision.

    Called once per run, after the route's lease is taken and before the
    runtime plans partitions, even when the current plan turns out empty.
    ``checkpoints`` holds the latest checkpoint of every partition ever
    written for ``route``, whatever its query, schema, run or partition id,
    and those of every other route writing the same target table in the
    same database (any source, strategy or spelling), and of routes stored
    without locations whose target table has the same name (ignoring ASCII
    case): a superset of the route, so a guard left on the target table by
    any of them is seen. Each checkpoint's ``route`` says whose it is.
    It is a :class:`~dpone_native_transfer.LatestCheckpoints`: a
    sequence whose iteration decodes every checkpoint, and whose
    ``guard_groups()`` / ``in_group()`` let a guard judge each distinct
    (status, guard) pair once and decode only the checkpoints it reports.

    ``recovery`` is None unless the route runs with ``recovery = "from_target"``.
    Then it is a :class:`~dpone_native_transfer.recovery.TargetRecovery`: an
    implementation may resolve blocked batches whose outcome the target proves,
    before it decides what still blocks: ``recovery.prove(route, batch_id,
    checkpoints)`` says what the target's ledger proves of one batch (advancing
    the target's fence first when that is what proves "not applied"), and a
    resolution is written with ``recovery.store.apply_resolution`` and an audit
    record naming ``recovery.operator``, ``recovery.run_id`` and the proof, and
    reported with ``recovery.healed(...)``. ``recovery.latest()`` reads the target
    table's checkpoints again afterwards. Nothing but the fence record is
    written to the target, and no target mutation is made, while anything blocks.

    Raise a :class:`~dpone_native_transfer.NativeTransferError` to stop the
    run before any extraction or target I/O. Return ``True`` to say the
    implementation understood the route's guard records (the runtime refuses
    to run a route carrying guards that no plugin claimed); return ``None``
    otherwise. All implementations are called.
    """


@_hookspec
def before_target_mutation(mutation: TargetMutation) -> None:
    """Prepare for the target call; called immediately before it.

    ``mutation`` describes the active partitions (``mutation.candidates``),
    the store and the clock. Pre-target work (extraction, staging,
    governance) is complete. A raise is a veto: the target is not called,
    ``on_target_error`` fires with ``mutation.state.target_started`` False,
    and the exception reaches the caller unchanged. All implementations are
    called; the first raise stops the rest.
    """


@_hookspec
def after_target_success(mutation: TargetMutation, result: Any) -> None:
    """Record that the target call returned ``result`` (promote checkpoints).

    ``mutation.state.target_succeeded`` is already ``True``. Every
    implementation is called, whatever another one returns or raises, so no
    plugin can skip another's promotion; the first raise is re-raised after all
    have run, and the run stops before evidence and source state are written.
    The built-in unguarded lifecycle promotes only a batch no plugin armed
    (``mutation.state.armed`` False). An implementation that handles a failed
    promotion must re-raise the original exception object. Wrappers are
    refused at registration. After this hook every candidate must be in
    ``mutation.state.committed_ids``, or the run stops.
    """


@_hookspec
def on_target_error(mutation: TargetMutation, error: BaseException) -> None:
    """Record that the target mutation failed (best effort).

    Fired in two cases, told apart by ``mutation.state.target_started``:
    ``False`` when a ``before_target_mutation`` implementation vetoed the
    mutation (the target was not called), ``True`` when the target call
    raised ``error``; an ``error`` whose class says ``applied is False``
    (``LeaseLost`` from the target's fence, ``TargetRowsMismatch``) was raised
    by the sink after rolling its transaction back: nothing was applied. Every
    implementation is called, like
    ``after_target_success``; the built-in unguarded lifecycle records only a
    batch no plugin armed. The boundary re-raises ``error`` itself, unchanged,
    after this hook; whatever an implementation raises (even
    ``KeyboardInterrupt``) is recorded as an ``error_hook_failed`` event (its
    type only) and swallowed.
    """
