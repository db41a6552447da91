"""Checkpoint records and their JSON payloads.

A checkpoint is the latest known state of one partition of one route. The
payload format is public: stores persist it verbatim, and a payload read back
and written again is byte-for-byte the same JSON value, with or without a
target-commit guard in ``diagnostics``.
"""

from __future__ import annotations

import copy
import hashlib
import json
import math
from collections.abc import Iterable, Mapping
from datetime import datetime
from enum import StrEnum
from typing import Any

import attrs

from .errors import CheckpointPayloadInvalid
from .wording import one_line

__all__ = [
    "GUARD_DIAGNOSTICS_KEY",
    "LEDGER_BATCH_KEY",
    "FailureCode",
    "PartitionCheckpoint",
    "PartitionCheckpointStatus",
    "RouteKey",
    "Strategy",
    "batch_id_for",
    "checkpoint_from_payload",
    "checkpoint_to_payload",
    "format_timestamp",
    "partition_id_for",
    "sha256_digest",
]


class Strategy(StrEnum):
    INCREMENTAL_APPEND = "incremental_append"
    FULL_REFRESH = "full_refresh"
    MERGE = "merge"  # rows replace their key's older version (``payloads.Merge``)

    @property
    def incremental(self) -> bool:
        """Whether runs continue from the route's state (its window, its committed values),
        as an append and a merge do, rather than reloading the whole table."""
        return self is not Strategy.FULL_REFRESH


class PartitionCheckpointStatus(StrEnum):
    EXPORTED = "exported"
    COMMITTED = "committed"
    FAILED = "failed"


class FailureCode(StrEnum):
    """Bounded codes persisted as ``diagnostics["error"]``; never exception text."""

    TARGET_NOT_STARTED = "target_not_started"
    TARGET_CALL_FAILED = "target_call_failed"
    CHECKPOINT_COMMIT_FAILED = "checkpoint_commit_failed"
    # state restore: the target's ledger does not hold the committed batch (the target lost it)
    NOT_IN_TARGET = "not_in_target"
    # state reset: an operator started the route afresh; the checkpoint no longer counts
    RESET = "reset"
    # the target call raised after rolling its transaction back: nothing was applied
    TARGET_ROLLED_BACK = "target_rolled_back"


# Where a target-commit guard lives inside ``PartitionCheckpoint.diagnostics``.
GUARD_DIAGNOSTICS_KEY = "target_commit_guard"
# The batch id under which the target's ledger records the attempt (a string when present).
LEDGER_BATCH_KEY = "ledger_batch_id"
# The lease epoch of the attempt that armed the checkpoint (an int when present): the
# target's fence passed it proves that attempt can no longer commit.
LEASE_EPOCH_KEY = "lease_epoch"
# The process that armed the checkpoint (host, machine, pid, start time: ``lease.ProcessMark``):
# once it is gone, no insert of its batch is left in flight on an engine inside it (chDB).
LEASE_PROCESS_KEY = "lease_process"


def _nonempty_str(_instance: Any, attribute: attrs.Attribute, value: Any) -> None:
    if not isinstance(value, str) or not value:
        raise ValueError(f"{attribute.name} must be a non-empty string")


def _location(_instance: Any, attribute: attrs.Attribute, value: Any) -> None:
    if value is not None and (not isinstance(value, str) or not value):
        raise ValueError(f"{attribute.name} must be None or a non-empty string")


@attrs.frozen
class RouteKey:
    """Identity of a route: one source table into one target table with one strategy.

    ``source_location`` and ``target_location`` name the databases (engine kind
    plus a normalized, credential-free location, from the connectors'
    ``identity()``), so equal table names in different databases are different
    routes. A key without them is *unlocated*: written before routes had
    locations, or by a caller that gave only table names. Partition ids and
    diagnostics use the table names and strategy only (:meth:`as_dict`).
    """

    source_table: str = attrs.field(validator=_nonempty_str)
    target_table: str = attrs.field(validator=_nonempty_str)
    strategy: Strategy = attrs.field(converter=Strategy)
    source_location: str | None = attrs.field(default=None, validator=_location)
    target_location: str | None = attrs.field(default=None, validator=_location)

    def __attrs_post_init__(self) -> None:
        if (self.source_location is None) != (self.target_location is None):
            raise ValueError("a route has both locations or neither")

    @property
    def label(self) -> str:
        """How messages and operator output name the route, on one line: a control character
        in a table name is escaped (``\\n``), so it cannot split or forge a log line."""
        return f"{one_line(self.source_table)} -> {one_line(self.target_table)} ({self.strategy})"

    @property
    def located(self) -> bool:
        return self.target_location is not None

    def unlocated(self) -> RouteKey:
        """The same table names and strategy without locations (how older releases keyed it)."""
        return RouteKey(self.source_table, self.target_table, self.strategy)

    def as_dict(self) -> dict[str, str]:
        """Table names and strategy: what partition ids and diagnostics identify a route by."""
        return {
            "source_table": self.source_table,
            "target_table": self.target_table,
            "strategy": str(self.strategy),
        }

    def as_record(self) -> dict[str, str]:
        """The payload's ``route``: :meth:`as_dict`, plus the locations of a located route."""
        record = self.as_dict()
        if self.source_location is not None and self.target_location is not None:
            record["source_location"] = self.source_location
            record["target_location"] = self.target_location
        return record


@attrs.frozen(kw_only=True)
class PartitionCheckpoint:
    """Latest known state of one partition; change it with ``attrs.evolve``."""

    partition_id: str = attrs.field(validator=_nonempty_str)
    route: RouteKey
    status: PartitionCheckpointStatus = attrs.field(converter=PartitionCheckpointStatus)
    run_id: str = attrs.field(validator=_nonempty_str)
    query_hash: str
    schema_hash: str
    partition_bounds: dict[str, Any] = attrs.field(factory=dict)
    started_at: datetime | None = None
    completed_at: datetime | None = None
    rows_exported: int = 0
    diagnostics: dict[str, Any] = attrs.field(factory=dict)


def sha256_digest(value: Any) -> str:
    """``sha256:`` + 64 lowercase hex over the canonical JSON of ``value``."""
    canonical = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return "sha256:" + hashlib.sha256(canonical.encode("utf-8")).hexdigest()


def partition_id_for(route: RouteKey, query_hash: str, schema_hash: str, bounds: Mapping) -> str:
    """Deterministic partition id: the same route, query, schema and bounds give the same id."""
    digest = sha256_digest([route.as_dict(), query_hash, schema_hash, dict(bounds)])
    return "p-" + digest.removeprefix("sha256:")[:24]


def batch_id_for(run_id: str, partition_ids: Iterable[str]) -> str:
    """SHA-256 over the run id and the sorted active partition ids: one attempt's batch.

    The target-commit guard's ``checkpoint_batch_id`` and the target ledger's
    batch id are this value, so a guard and a ledger row of one attempt name each other.
    """
    return sha256_digest([run_id, sorted(partition_ids)])


def format_timestamp(value: datetime | None) -> str | None:
    return None if value is None else value.isoformat()


def checkpoint_to_payload(
    checkpoint: PartitionCheckpoint, *, copy_values: bool = True
) -> dict[str, Any]:
    """JSON-safe payload; the inverse of :func:`checkpoint_from_payload`.

    ``partition_bounds`` and ``diagnostics`` are deep copies, so the payload
    never aliases the checkpoint. A caller that serialises the payload at once
    and drops it (``json.dumps``) may pass ``copy_values=False`` to share them.
    """
    if not copy_values:
        return _payload(checkpoint, checkpoint.partition_bounds, checkpoint.diagnostics)
    return _payload(
        checkpoint,
        copy.deepcopy(checkpoint.partition_bounds),
        copy.deepcopy(checkpoint.diagnostics),
    )


def _payload(checkpoint: PartitionCheckpoint, bounds: Any, diagnostics: Any) -> dict[str, Any]:
    return {
        "partition_id": checkpoint.partition_id,
        "route": checkpoint.route.as_record(),
        "status": str(checkpoint.status),
        "run_id": checkpoint.run_id,
        "query_hash": checkpoint.query_hash,
        "schema_hash": checkpoint.schema_hash,
        "partition_bounds": bounds,
        "started_at": format_timestamp(checkpoint.started_at),
        "completed_at": format_timestamp(checkpoint.completed_at),
        "rows_exported": checkpoint.rows_exported,
        "diagnostics": diagnostics,
    }


_STATUS_VALUES = frozenset(status.value for status in PartitionCheckpointStatus)

_ROUTE_NAMES = frozenset({"source_table", "target_table", "strategy"})
_ROUTE_KEYS = (_ROUTE_NAMES, _ROUTE_NAMES | {"source_location", "target_location"})

_PAYLOAD_KEYS = frozenset(
    {
        "partition_id",
        "route",
        "status",
        "run_id",
        "query_hash",
        "schema_hash",
        "partition_bounds",
        "started_at",
        "completed_at",
        "rows_exported",
        "diagnostics",
    }
)


def _invalid(field: str, problem: str, partition_id: Any = None) -> CheckpointPayloadInvalid:
    diagnostics: dict[str, Any] = {"field": field}
    if isinstance(partition_id, str):
        diagnostics["partition_id"] = partition_id
    return CheckpointPayloadInvalid(
        f"checkpoint payload field {field!r} {problem}", diagnostics=diagnostics
    )


def _parse_timestamp(payload: Mapping, field: str) -> datetime | None:
    raw = payload[field]
    if raw is None:
        return None
    pid = payload.get("partition_id")
    if not isinstance(raw, str):
        raise _invalid(field, "must be an ISO-8601 string or null", pid)
    try:
        value = datetime.fromisoformat(raw)
    except ValueError:
        raise _invalid(field, "is not an ISO-8601 timestamp", pid) from None
    if value.utcoffset() is None or value.isoformat() != raw:
        raise _invalid(field, "must be a canonical timezone-aware ISO-8601 timestamp", pid)
    return value


def strict_json(text: str | bytes) -> Any:
    """``json.loads``, refusing an object with a key twice (ValueError).

    Readers disagree on such objects (SQLite's JSON takes the first value, Python
    the last), so a stored record holding one is malformed, never read either way.
    """
    return json.loads(text, object_pairs_hook=_unique_keys)


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result = dict(pairs)
    if len(result) != len(pairs):
        raise ValueError("a JSON object holds a key twice")
    return result


def _is_json_safe(value: Any, depth: int = 0) -> bool:
    if depth > 32:
        return False
    if value is None or isinstance(value, (bool, str)):
        return True
    if isinstance(value, int):
        try:  # json.dumps refuses ints longer than sys.get_int_max_str_digits()
            int.__repr__(value)
        except ValueError:
            return False
        return True
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, list):
        return all(_is_json_safe(item, depth + 1) for item in value)
    if isinstance(value, dict):
        return all(
            isinstance(key, str) and _is_json_safe(item, depth + 1) for key, item in value.items()
        )
    return False


def checkpoint_from_payload(
    payload: Mapping[str, Any],
    *,
    copy_values: bool = True,
    known_route: RouteKey | None = None,
) -> PartitionCheckpoint:
    """Strictly parse a payload; anything off raises ``CheckpointPayloadInvalid``.

    By default the checkpoint holds deep copies of ``partition_bounds`` and
    ``diagnostics``. A caller that owns the payload and drops it (a store that
    just ran ``json.loads``) may pass ``copy_values=False`` to take them as they
    are. When ``payload["route"]`` names exactly ``known_route``, the checkpoint
    reuses that ``RouteKey`` instead of building an equal one. Neither argument
    changes what is accepted or refused.
    """
    if not isinstance(payload, Mapping):
        raise _invalid("<payload>", "must be a JSON object")
    pid = payload.get("partition_id")
    keys = set(payload)
    if keys != _PAYLOAD_KEYS:
        missing, extra = sorted(_PAYLOAD_KEYS - keys), sorted(str(k) for k in keys - _PAYLOAD_KEYS)
        field = (missing or extra)[0]
        raise _invalid(field, "is missing" if missing else "is not part of the schema", pid)
    for field in ("partition_id", "run_id", "query_hash", "schema_hash"):
        if not isinstance(payload[field], str) or not payload[field]:
            raise _invalid(field, "must be a non-empty string", pid)
    route = payload["route"]
    if not isinstance(route, Mapping) or set(route) not in _ROUTE_KEYS:
        raise _invalid(
            "route", "must hold source_table, target_table, strategy and both or no locations", pid
        )
    if known_route is not None and _names(route, known_route):
        route_key = known_route
    else:
        try:
            route_key = RouteKey(
                route["source_table"],
                route["target_table"],
                route["strategy"],
                route.get("source_location"),
                route.get("target_location"),
            )
        except (TypeError, ValueError):
            raise _invalid("route", "has an invalid value", pid) from None
    if payload["status"] not in _STATUS_VALUES:
        raise _invalid("status", "is not a known checkpoint status", pid)
    rows = payload["rows_exported"]
    if not isinstance(rows, int) or isinstance(rows, bool) or rows < 0:
        raise _invalid("rows_exported", "must be a non-negative integer", pid)
    for field in ("partition_bounds", "diagnostics"):
        if not isinstance(payload[field], dict) or not _is_json_safe(payload[field]):
            raise _invalid(field, "must be a JSON object", pid)
    if not _valid_ledger_batch(payload["diagnostics"]):
        raise _invalid("diagnostics", f"{LEDGER_BATCH_KEY!r} must be a non-empty string", pid)
    dup = copy.deepcopy if copy_values else _same
    return PartitionCheckpoint(
        partition_id=str(pid),  # checked to be a non-empty string above
        route=route_key,
        status=payload["status"],
        run_id=payload["run_id"],
        query_hash=payload["query_hash"],
        schema_hash=payload["schema_hash"],
        partition_bounds=dup(payload["partition_bounds"]),
        started_at=_parse_timestamp(payload, "started_at"),
        completed_at=_parse_timestamp(payload, "completed_at"),
        rows_exported=rows,
        diagnostics=dup(payload["diagnostics"]),
    )


def _valid_ledger_batch(diagnostics: Mapping[str, Any]) -> bool:
    value = diagnostics.get(LEDGER_BATCH_KEY, "-")
    return isinstance(value, str) and bool(value)


def _same(value: Any) -> Any:
    return value


def _names(route: Mapping[str, Any], key: RouteKey) -> bool:
    """True when the payload route holds exactly the (plain str) values of ``key``."""
    values = tuple(route.values())
    return (
        len(values) == len(expected := key.as_record())
        and all(type(value) is str for value in values)
        and all(route.get(name) == value for name, value in expected.items())
    )
