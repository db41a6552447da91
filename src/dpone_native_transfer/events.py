"""Run events: a name plus safe fields, so callers and tests can see the order of work."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from enum import StrEnum
from typing import Any

import attrs

_log = logging.getLogger(__name__)

__all__ = ["EVENT_ORDER", "Event", "EventName", "EventRecorder"]


class EventName(StrEnum):
    """Every event a run emits; each is its own name as a string (``"route_scanned"``)."""

    ROUTE_SCANNED = "route_scanned"
    STATE_REALIGNED = "state_realigned"  # continued after another route's full refresh
    GUARD_HEALED = "guard_healed"  # recovery = from_target resolved a batch the target proved
    SCHEMA_EVOLVED = "schema_evolved"  # new source columns were added to the target table
    CURSOR_EDGE_UNTRACKED = "cursor_edge_untracked"  # a part of the edge record was dropped
    MANY_PARTITIONS = "many_partitions"  # partitioning by value made very many partitions
    PARTITION_EXTRACTED = "partition_extracted"
    PARTITION_PLANNED = "partition_planned"  # lazy-plan: a partition the engine will pull
    PRE_TARGET_DONE = "pre_target_done"
    GUARD_ARMED = "guard_armed"
    TARGET_VETOED = "target_vetoed"
    TARGET_STARTED = "target_started"
    TARGET_SUCCEEDED = "target_succeeded"
    TARGET_FAILED = "target_failed"
    ERROR_HOOK_FAILED = "error_hook_failed"
    CHECKPOINTS_COMMITTED = "checkpoints_committed"
    EVIDENCE_WRITTEN = "evidence_written"
    SOURCE_STATE_ADVANCED = "source_state_advanced"
    LISTENER_FAILED = "listener_failed"  # recorded, never forwarded to the listener


# The order a successful guarded run emits its milestone events in, on every path.
EVENT_ORDER = (
    EventName.ROUTE_SCANNED,
    EventName.PRE_TARGET_DONE,
    EventName.GUARD_ARMED,
    EventName.TARGET_STARTED,
    EventName.TARGET_SUCCEEDED,
    EventName.CHECKPOINTS_COMMITTED,
    EventName.EVIDENCE_WRITTEN,
    EventName.SOURCE_STATE_ADVANCED,
)


@attrs.frozen
class Event:
    name: str
    fields: Mapping[str, Any] = attrs.field(factory=dict)


@attrs.define(eq=False)
class EventRecorder:
    """Collects a run's events and forwards each to an optional listener.

    A listener observes; it never changes the run. Whatever it raises (an
    ``Exception``) is recorded as a ``listener_failed`` event with its type and
    logged, and the run goes on. (``KeyboardInterrupt`` and ``SystemExit`` stop
    the run as they would anywhere else; the boundary's error path swallows
    even those, so the original error always wins.)
    """

    listener: Callable[[Event], None] | None = None
    events: list[Event] = attrs.field(factory=list)

    def emit(self, name: str, **fields: Any) -> None:
        event = Event(name, fields)
        self.events.append(event)
        if self.listener is None:
            return
        try:
            self.listener(event)
        except Exception as error:
            failed = {"event": name, "error_type": type(error).__name__}
            self.events.append(Event(EventName.LISTENER_FAILED, failed))
            _log.warning("an event listener raised %s at %s; ignored", failed["error_type"], name)

    def names(self) -> list[str]:
        return [event.name for event in self.events]
