"""Test support for this project and for connector authors.

``faults`` wraps real stores and sinks to inject failures; ``assertions``
holds the guard checks the conformance kit makes, as plain functions. The
pytest kit itself, :class:`~.conformance.GuardConformance`, lives in
``dpone_native_transfer.testing.conformance`` and is not imported here, so
importing this package (the CLI demo does) never needs pytest.
"""

from __future__ import annotations

from .assertions import (
    GUARD_PLUGIN_NAME,
    assert_blocked_before_target,
    assert_event_order,
    assert_guard_registered,
    assert_no_duplicate_rows,
    assert_one_timestamp_per_batch,
    assert_raises_original,
    assert_rows_exactly_once,
    guard_phases,
)
from .contract import capabilities_of, contract_problems
from .faults import (
    FaultyStore,
    InjectedFault,
    RecordingSink,
    StepClock,
    build_sample_source,
    guard_phase,
    phase_batch,
)

__all__ = [
    "FaultyStore",
    "GUARD_PLUGIN_NAME",
    "InjectedFault",
    "RecordingSink",
    "StepClock",
    "assert_blocked_before_target",
    "assert_event_order",
    "assert_guard_registered",
    "assert_no_duplicate_rows",
    "assert_one_timestamp_per_batch",
    "assert_raises_original",
    "assert_rows_exactly_once",
    "build_sample_source",
    "capabilities_of",
    "contract_problems",
    "guard_phase",
    "guard_phases",
    "phase_batch",
]
