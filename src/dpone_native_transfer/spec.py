"""TransferSpec: one route's transfer, and the one check of each of its options.

The route file (``config.py``) and the Python API (``TransferSpec``) check an option
with the same function, ``check_option``: one rule per option, in one place, naming
the route-file key. Below the planner and the runtime, above the connector contract:
a spec names its connectors and how to run them, nothing about how a run goes.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable, Mapping
from typing import Any

import attrs

from .checkpoints import RouteKey, Strategy
from .connectors.contract import DEFAULT_CHUNK_ROWS, Sink, Source
from .connectors.contract.legacy import adapt_sink, adapt_source
from .errors import ConfigInvalid, GovernanceGateFailed
from .rejects import ON_BAD_VALUE

__all__ = [
    "BUILTIN_PATH_NAMES",
    "TRANSFER_PATHS",
    "MAX_CHUNK_ROWS",
    "MAX_GATE_ROWS",
    "NULL_CURSOR_POLICIES",
    "RECOVERY_MODES",
    "SCHEMA_CONTRACTS",
    "Governance",
    "TransferSpec",
    "check_option",
    "route_key",
    "type_name",
]

TRANSFER_PATHS = ("legacy", "staged", "file-artifact", "lazy-plan")  # the four that move rows
BUILTIN_PATH_NAMES = (*TRANSFER_PATHS, "auto")  # auto: one of the four, chosen per table
# Rows held in memory per chunk at most: beyond it a chunk is no longer a bounded buffer
# (and 2**63 overflowed the drivers).
MAX_CHUNK_ROWS = 10_000_000
MAX_GATE_ROWS = 2**63 - 1  # a row count SQL engines hold; a larger gate could never fail
_INT64_MAX = 2**63 - 1  # the largest integer a SQL engine holds
_WEEK = 7 * 24 * 3600
MIN_LEASE_SECONDS = 1  # the heartbeat renews every sixth of a lease: below it, one slow write
NULL_CURSOR_POLICIES = ("error", "load_once")  # what an append does with NULL cursors
SCHEMA_CONTRACTS = ("evolve", "freeze")  # what a run does when the source's columns change
RECOVERY_MODES = ("manual", "from_target")  # who resolves a batch a crash left blocked

# The numeric kinds: (integers only, lowest, highest), both included.
_NUMBERS: Mapping[str, tuple[bool, int, int]] = {
    "positive": (True, 1, MAX_CHUNK_ROWS),  # rows held in memory per chunk, or per range
    "parallel": (True, 1, 64),  # connections a PostgreSQL source's bulk read uses at once
    "count": (True, 0, MAX_GATE_ROWS),  # a row-count gate
    "lag": (False, 0, _INT64_MAX),  # cursor units: at most an integer cursor's whole range
    "seconds": (False, MIN_LEASE_SECONDS, _WEEK),  # a lease, renewed every sixth of it
}
# The kinds of one of a few words.
_WORDS: Mapping[str, tuple[str, ...]] = {
    "strategy": tuple(sorted(str(strategy) for strategy in Strategy)),
    "schema_contract": SCHEMA_CONTRACTS,
    "on_null_cursor": NULL_CURSOR_POLICIES,
    "recovery": RECOVERY_MODES,
    "on_bad_value": ON_BAD_VALUE,
    "partition_by": ("range", "value"),
}
_TYPES = (
    (bool, "a boolean"),
    (int, "an integer"),
    (float, "a float"),
    (str, "a string"),
    (dict, "a table"),
    (list, "an array"),
    (datetime.date | datetime.time, "a date or time"),
)


def type_name(value: Any) -> str:
    """What a value is, as a route file's reader says it (TOML's words)."""
    return next((name for kind, name in _TYPES if isinstance(value, kind)), type(value).__name__)


def check_option(key: str, kind: str, value: Any) -> None:
    """``value`` is a valid ``kind`` (a number in its range, one of its words, a boolean, a
    name), or ``ConfigInvalid`` naming ``key``: the one check of every option."""
    if kind == "key":
        _check_key(key, value)
        return
    if kind == "bool":
        if not isinstance(value, bool):
            raise _invalid(key, f"must be true or false, not {type_name(value)}")
        return
    if kind in _NUMBERS:
        integer, low, high = _NUMBERS[kind]
        what = "an integer" if integer else "a number"
        if isinstance(value, bool) or not isinstance(value, int if integer else int | float):
            raise _invalid(key, f"must be {what}, not {type_name(value)}")
        if not low <= value <= high:  # NaN is within no range
            raise _invalid(key, f"must be {what} from {low:,} to {high:,}")
        return
    if not isinstance(value, str):
        raise _invalid(key, f"must be a string, not {type_name(value)}")
    if not value.strip() or "\x00" in value:
        raise _invalid(key, "must be a non-empty string without NUL characters")
    if kind in _WORDS and value not in _WORDS[kind]:
        raise _invalid(key, f"must be one of: {', '.join(_WORDS[kind])}")


def _as_key(value: Any) -> Any:
    """A key as the spec holds it: a tuple of names (one name given alone is a key of one)."""
    if isinstance(value, str):
        return (value,)
    return tuple(value) if isinstance(value, list) else value


def _check_key(key: str, value: Any) -> None:
    """A key: a column name, or a non-empty list (a tuple, from Python) of distinct names."""
    names = [value] if isinstance(value, str) else value
    if not isinstance(names, list | tuple) or not names:
        raise _invalid(key, f"must be a column name or a non-empty array of them, not "
                       f"{type_name(value)}")  # fmt: skip
    for name in names:
        check_option(key, "name", name)
    if len(set(names)) != len(names):
        raise _invalid(key, "must not name a column twice")


def _invalid(key: str, problem: str) -> ConfigInvalid:
    return ConfigInvalid(f"{key} {problem}", diagnostics={"key": key})


def _option(key: str, kind: str) -> Callable[[Any, Any, Any], None]:
    """An attrs validator running ``check_option`` (None: the option is not set)."""

    def validate(_instance: Any, _attribute: Any, value: Any) -> None:
        if value is not None:
            check_option(key, kind, value)

    return validate


@attrs.frozen(kw_only=True)
class Governance:
    """Pre-target gates. A failed gate stops the attempt before the target and writes nothing."""

    min_rows: int | None = attrs.field(default=None, validator=_option("gates.min_rows", "count"))
    max_rows: int | None = attrs.field(default=None, validator=_option("gates.max_rows", "count"))

    @property
    def enabled(self) -> bool:
        return self.min_rows is not None or self.max_rows is not None

    def check(self, route: RouteKey, rows: int) -> None:
        too_few = self.min_rows is not None and rows < self.min_rows
        too_many = self.max_rows is not None and rows > self.max_rows
        if too_few or too_many:
            raise GovernanceGateFailed(
                "the row-count gate refused the attempt before any target I/O",
                diagnostics={
                    "route": route.as_dict(),
                    "gate": "min_rows" if too_few else "max_rows",
                    "rows": rows,
                    "limit": self.min_rows if too_few else self.max_rows,
                },
            )


def _strategy(value: Any) -> Strategy:
    check_option("transfer.strategy", "strategy", value)
    return Strategy(value)


def route_key(source: Source, sink: Sink, strategy: Strategy | str) -> RouteKey:
    """The route of a source and a sink: located when both report an ``identity()``.

    A connector without one (written before identities) gives an unlocated key of the
    table names as configured, keyed as older releases did.
    """
    read, written = adapt_source(source).identity(), adapt_sink(sink).identity()
    if read is None or written is None:
        return RouteKey(source.table, sink.table, strategy)
    return RouteKey(read.table, written.table, strategy, read.location, written.location)


def _governance(spec: Any, attribute: Any, value: Any) -> None:
    if not isinstance(value, Governance):
        raise ConfigInvalid(
            f"governance must be a Governance (the gates), not {type(value).__name__}",
            diagnostics={"argument": "governance"},
        )


@attrs.frozen(kw_only=True)
class TransferSpec:
    """One route's transfer: which source, which sink, how, and under which run id."""

    source: Source = attrs.field(converter=adapt_source)  # a 0.1 connector is adapted
    sink: Sink = attrs.field(converter=adapt_sink)
    strategy: Strategy = attrs.field(converter=_strategy)
    path: str
    run_id: str
    governance: Governance = attrs.field(factory=Governance, validator=_governance)
    chunk_rows: int = attrs.field(
        default=DEFAULT_CHUNK_ROWS, validator=_option("transfer.chunk_rows", "positive")
    )
    artifact_dir: str | None = None
    ledger: bool = True
    schema_contract: str = attrs.field(
        default="evolve", validator=_option("transfer.schema_contract", "schema_contract")
    )
    lag: float = attrs.field(default=0, validator=_option("source.lag", "lag"))
    on_null_cursor: str = attrs.field(
        default="error", validator=_option("source.on_null_cursor", "on_null_cursor")
    )
    # "from_target": the route scan first resolves blocked batches the target proves
    recovery: str = attrs.field(default="manual", validator=_option("guard.recovery", "recovery"))
    # a column of the target that holds each row's batch id (None: none); row paths only
    batch_column: str | None = attrs.field(
        default=None, validator=_option("target.batch_column", "name")
    )
    # "quarantine": a row the target cannot hold exactly goes to _dpone_rejects, not a stop
    on_bad_value: str = attrs.field(
        default="refuse", validator=_option("transfer.on_bad_value", "on_bad_value")
    )
    quarantine_values: bool = False  # the rejects table keeps the refused value (repr) too
    # strategy "merge": the key (None: the source table's own primary key), and the column
    # whose true value deletes its key from the target (never loaded)
    primary_key: tuple[str, ...] | None = attrs.field(
        default=None, converter=_as_key, validator=_option("source.primary_key", "key")
    )
    deleted_column: str | None = attrs.field(
        default=None, validator=_option("source.deleted_column", "name")
    )

    def __attrs_post_init__(self) -> None:
        self._check_merge()
        if not (isinstance(self.run_id, str) and self.run_id.strip() and self.run_id.isprintable()):
            raise ConfigInvalid(  # printed in summaries, `routes`, `state show`: one line each
                "the run id must be printable text (no newline, tab or control character)",
                diagnostics={"argument": "--run-id"},
            )
        if self.batch_column is not None and self.path == "lazy-plan":
            raise _invalid(
                "target.batch_column",
                "needs dpone to read the rows (legacy, staged or file-artifact): on lazy-plan "
                "the target's engine reads them itself",
            )
        needs_ledger = {
            "target.batch_column": self.batch_column is not None,
            "transfer.on_bad_value": self.on_bad_value == "quarantine",
        }
        for key, needed in needs_ledger.items():
            if needed and not self.ledger:
                raise _invalid(key, "needs the target's ledger (ledger = true): it records "
                               "the batch with its rows")  # fmt: skip

    def _check_merge(self) -> None:
        """A merge's options only on a merge route, and a merge only into a sink that merges
        (``SinkFeatures.merges``), without a batch column: a batch's merged rows may be
        replaced by a later batch's, so the column cannot count what the batch applied."""
        merging = self.strategy is Strategy.MERGE
        for key, given in (
            ("source.primary_key", self.primary_key is not None),
            ("source.deleted_column", self.deleted_column is not None),
        ):
            if given and not merging:
                raise _invalid(key, 'is used only by [transfer] strategy = "merge"')
        if not merging:
            return
        if not self.sink.features.merges:
            raise _invalid(
                "transfer.strategy",
                f'= "merge" needs a target that merges, and this one ({self.sink.features.name}) '
                "does not; use a SQLite, DuckDB, PostgreSQL or ClickHouse target, or another "
                "strategy",
            )
        if self.batch_column is not None:
            raise _invalid(
                "target.batch_column",
                "cannot count a merge route's batches (a later batch replaces a batch's rows): "
                "leave it out; the ledger row proves each batch",
            )

    @property
    def route(self) -> RouteKey:
        """The route of the source, sink and strategy, located by their ``identity()``."""
        return route_key(self.source, self.sink, self.strategy)
