"""The guard checks of the conformance kit, as plain functions a connector author can reuse.

They need no pytest: each raises ``AssertionError`` with a message that says
which promise of the guard was broken, so they read well in any runner.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Collection, Iterable, Sequence
from datetime import datetime
from typing import Any

from ..checkpoints import PartitionCheckpoint, PartitionCheckpointStatus
from ..errors import ManualReconciliationRequired
from ..events import EVENT_ORDER, Event
from .faults import guard_phase

__all__ = [
    "GUARD_PLUGIN_NAME",
    "assert_blocked_before_target",
    "assert_event_order",
    "assert_guard_registered",
    "assert_no_duplicate_rows",
    "assert_one_timestamp_per_batch",
    "assert_raises_original",
    "assert_rows_exactly_once",
    "guard_phases",
]

# The entry-point name (group ``dpone_native_transfer``) the guard plugin is registered under.
GUARD_PLUGIN_NAME = "target_commit_guard"

_SHOWN = 10  # ids quoted in a failure message; enough to recognise, short enough to read


def guard_phases(checkpoints: Iterable[PartitionCheckpoint]) -> list[str | None]:
    """Sorted guard phases of ``checkpoints`` (None for a checkpoint without a guard)."""
    return sorted((guard_phase(checkpoint) for checkpoint in checkpoints), key=str)


def assert_guard_registered(runtime: Any) -> None:
    """The runtime's plugin manager holds the guard, loaded from its entry point.

    Without it every other scenario would test the unguarded legacy lifecycle.
    """
    if not runtime.plugin_manager.has_plugin(GUARD_PLUGIN_NAME):
        raise AssertionError(
            f"the target-commit guard plugin {GUARD_PLUGIN_NAME!r} is not registered: the "
            "entry point of group 'dpone_native_transfer' is missing or blocked. Install "
            "dpone-native-transfer into this environment (pip install -e .) and build the "
            "runtime with plugins=None."
        )


def assert_raises_original(
    original: BaseException, run: Callable[[], Any], *, raised_in: str | None = None
) -> BaseException:
    """``run()`` raises the very object ``original``, not a copy or a cleanup error.

    ``raised_in`` names a function that must be in the traceback: the place
    the fault was injected, so the original traceback was kept too.
    """
    try:
        run()
    except BaseException as raised:
        if raised is not original:
            if not isinstance(raised, Exception):
                raise  # a real interrupt, not the code under test
            raise AssertionError(
                f"the original {type(original).__name__} was replaced by "
                f"{type(raised).__name__}: {raised!r}"
            ) from raised
        if raised_in is not None and raised_in not in _traceback_functions(raised):
            raise AssertionError(
                f"the traceback of the original {type(original).__name__} no longer reaches "
                f"{raised_in}(): it was re-raised from a new place"
            ) from raised
        return raised
    raise AssertionError(f"expected the original {type(original).__name__}; nothing was raised")


def _traceback_functions(error: BaseException) -> set[str]:
    names, tb = set(), error.__traceback__
    while tb is not None:
        names.add(tb.tb_frame.f_code.co_name)
        tb = tb.tb_next
    return names


def assert_blocked_before_target(run: Callable[[], Any], sink: Any) -> ManualReconciliationRequired:
    """``run()`` stops with ManualReconciliationRequired and ``sink.target_calls`` is unchanged."""
    calls = sink.target_calls
    try:
        run()
    except ManualReconciliationRequired as blocked:
        if sink.target_calls != calls:
            raise AssertionError("the retry was blocked only after it called the target") from None
        return blocked
    except Exception as other:
        raise AssertionError(
            f"expected the retry to be blocked (ManualReconciliationRequired), "
            f"it raised {type(other).__name__}"
        ) from other
    raise AssertionError(
        f"the retry was not blocked: it ran and called the target "
        f"{sink.target_calls - calls} time(s)"
    )


def assert_no_duplicate_rows(source_ids: Collection[Any], target_ids: Iterable[Any]) -> None:
    """Every row in the target is a source row, and none is there twice."""
    counts = Counter(target_ids)
    duplicated = sorted(row_id for row_id, seen in counts.items() if seen > 1)
    foreign = sorted(set(counts) - set(source_ids))
    if duplicated:
        raise AssertionError(
            f"{len(duplicated)} row(s) are in the target more than once, e.g. {duplicated[:_SHOWN]}"
        )
    if foreign:
        raise AssertionError(
            f"{len(foreign)} target row(s) are not in the source: {foreign[:_SHOWN]}"
        )


def assert_rows_exactly_once(source_ids: Collection[Any], target_ids: Iterable[Any]) -> None:
    """The target holds every source row exactly once."""
    target = list(target_ids)
    assert_no_duplicate_rows(source_ids, target)
    missing = sorted(set(source_ids) - set(target))
    if missing:
        raise AssertionError(
            f"{len(missing)} source row(s) never reached the target: {missing[:_SHOWN]}"
        )


def assert_one_timestamp_per_batch(
    batches: Iterable[Sequence[PartitionCheckpoint]],
    clock_reads: Collection[datetime] | None = None,
) -> None:
    """Each checkpoint batch carries one transition time; terminal checkpoints start as they end.

    ``clock_reads``, when given, are the injected clock's readings: every
    batch's time must be one of them, not the wall clock.
    """
    for number, batch in enumerate(batches, start=1):
        stamps = {checkpoint.started_at for checkpoint in batch}
        if len(stamps) != 1:
            raise AssertionError(f"checkpoint batch {number} carries {len(stamps)} timestamps")
        (stamp,) = stamps
        if clock_reads is not None and stamp not in clock_reads:
            raise AssertionError(f"checkpoint batch {number} was not stamped by the injected clock")
        for checkpoint in batch:
            terminal = checkpoint.status is not PartitionCheckpointStatus.EXPORTED
            expected = stamp if terminal else None
            if checkpoint.completed_at != expected:
                raise AssertionError(
                    f"checkpoint batch {number}: a {checkpoint.status.value} checkpoint has "
                    f"completed_at {checkpoint.completed_at}, expected {expected}"
                )


def assert_event_order(events: Iterable[Event]) -> None:
    """A successful run emits the milestone events once each, in ``EVENT_ORDER``."""
    names = [event.name for event in events if event.name in EVENT_ORDER]
    if names != list(EVENT_ORDER):
        raise AssertionError(f"milestone events {names} are not in the order {list(EVENT_ORDER)}")
