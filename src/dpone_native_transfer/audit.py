"""The operators' audit record: the keys dpone writes, checked by every reader.

``guard resolve``, ``state restore`` and ``state reset`` each append one record
(``OperatorStore.apply_resolution``). A record without one of these keys, or
holding one of another type, was not written by dpone as it is: a reader says
so, naming the record's id and the keys, never a value, instead of reading it
as a repair of nothing or skipping the batches it lets through.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .checkpoints import RouteKey
from .errors import CheckpointStoreCorrupt

__all__ = ["audit_problems", "malformed_audit"]

_REQUIRED: Mapping[str, type] = {
    "at": str,
    "operator": str,
    "reason": str,
    "route": dict,
    "resolved_as": str,
    "forced_invalid": bool,
    "partitions": list,
}
_OPTIONAL: Mapping[str, type] = {"ledger_overrides": list, "proof": dict}


def audit_problems(record: Mapping[str, Any]) -> list[str]:
    """The keys of ``record`` missing or not as dpone writes them, sorted; none if well formed.

    Each partition is an object naming its ``partition_id`` and ``new_status``;
    ``ledger_overrides``, when present, lists batch ids.
    """
    bad = {key for key, kind in _REQUIRED.items() if not isinstance(record.get(key), kind)}
    bad |= {
        key
        for key, kind in _OPTIONAL.items()
        if key in record and not isinstance(record[key], kind)
    }
    partitions = record.get("partitions")
    if isinstance(partitions, list) and not all(map(_partition_ok, partitions)):
        bad.add("partitions")
    overrides = record.get("ledger_overrides")
    if isinstance(overrides, list) and not all(isinstance(batch, str) for batch in overrides):
        bad.add("ledger_overrides")
    return sorted(bad)


def _partition_ok(item: Any) -> bool:
    return (
        isinstance(item, dict)
        and isinstance(item.get("partition_id"), str)
        and isinstance(item.get("new_status"), str)
    )


def malformed_audit(route: RouteKey, record: Mapping[str, Any]) -> CheckpointStoreCorrupt | None:
    """The error a reader that acts on ``record`` (of ``route``) raises, or None if well formed."""
    problems = audit_problems(record)
    if not problems:
        return None
    return CheckpointStoreCorrupt(
        f"stored audit record #{record.get('audit_id')} of route {route.label} is malformed: "
        f"{', '.join(problems)} missing or not as dpone writes them",
        diagnostics={
            "route": route.as_dict(),
            "audit_id": record.get("audit_id"),
            "keys": problems,
        },
    )
