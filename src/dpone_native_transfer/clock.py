"""The injected clock: one read per checkpoint batch, always an aware UTC datetime."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta

from .checkpoints import RouteKey
from .errors import ClockInvalid

__all__ = ["Clock", "read_clock", "system_clock"]

Clock = Callable[[], datetime]


def system_clock() -> datetime:
    return datetime.now(UTC)


def read_clock(clock: Clock, *, route: RouteKey, run_id: str) -> datetime:
    """Read ``clock`` once; a naive or non-UTC value is refused, never guessed at."""
    value = clock()
    if not isinstance(value, datetime) or value.utcoffset() != timedelta(0):
        raise ClockInvalid(
            "the clock must return a timezone-aware UTC datetime",
            diagnostics={"route": route.as_dict(), "run_id": run_id},
        )
    return value
