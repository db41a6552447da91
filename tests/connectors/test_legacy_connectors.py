"""Connectors written for the 0.1 contract keep working for one release, adapted with a
``DeprecationWarning`` (``connectors/contract/legacy.py``): a sink of optional Protocols
whose ledger row is handed with ``ledger_batch``, and a source without ``features``."""

from __future__ import annotations

import contextlib
import importlib
import warnings
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from dpone_native_transfer import (
    SQLiteCheckpointStore,
    SQLiteSink,
    SQLiteSource,
    TransferRuntime,
    TransferSpec,
)
from dpone_native_transfer.connectors.contract.legacy import LegacySink, LegacySource
from dpone_native_transfer.payloads import LoadPlan
from dpone_native_transfer.testing import assert_rows_exactly_once, build_sample_source

PATHS = ["legacy", "staged", "file-artifact", "lazy-plan"]


def _legacy_names() -> Any:
    """``PendingLedger`` as a 0.1 connector imports it: from ``connectors.contract``."""
    contract = importlib.import_module("dpone_native_transfer.connectors.contract")
    with pytest.warns(DeprecationWarning, match="contract of release 0.1"):
        return contract.PendingLedger


class OldSink:
    """A 0.1 sink: ``LedgerSink`` (``ledger_batch``, taking the row inside its call),
    ``Staging``, ``PlanPulling`` (``load`` of a plan), ``Identified``, ``TargetChecking``,
    over a real SQLite sink. No ``features``: the runtime adapts it."""

    ledger_atomic = True

    def __init__(self, real: SQLiteSink) -> None:
        self.real, self.table = real, real.table
        self._ledger = _legacy_names()()

    def identity(self) -> Any:
        return self.real.identity()

    def check_target(self) -> None:
        self.real.check_target()

    def ledger_batch(self, entry: Any) -> contextlib.AbstractContextManager[None]:
        return self._ledger.handed(entry)

    def load(self, payload: Any) -> int:
        entry = self._ledger.take()
        if isinstance(payload, LoadPlan):
            return self.real.load_plan(payload, ledger=entry)
        return self.real.load(payload, ledger=entry)

    def check_plan(self, plan: LoadPlan) -> None:
        self.real.check_plan(plan)

    def stage(self, payload: Any) -> int:
        return self.real.stage(payload)

    def staged_row_count(self) -> int:
        return self.real.staged_row_count()

    def discard_stage(self) -> None:
        self.real.discard_stage()

    def finalize_staged_load(self, *, replace: bool = False) -> int:
        return self.real.finalize_staged_load(replace=replace, ledger=self._ledger.take())

    def read_ledger(self, *, partitions: bool = False) -> list[Any]:
        return self.real.read_ledger(partitions=partitions)

    def row_count(self) -> int:
        return self.real.row_count()

    def is_empty(self) -> bool:
        return self.real.is_empty()


class OldSource:
    """A 0.1 source: the base ``Source`` and ``Identified``, ``CursorEdgeReading``, a
    ``SQLiteFile`` (what lazy-plan's SQLite engine reads), over a real SQLite source."""

    def __init__(self, real: SQLiteSource) -> None:
        self.real = real
        self.table, self.path = real.table, real.path
        self.partition_column, self.cursor_column = real.partition_column, real.cursor_column

    def identity(self) -> Any:
        return self.real.identity()

    def describe(self) -> Any:
        return self.real.describe()

    def partition_values(self, *, after: Any = None, upto: Any = None) -> list[Any]:
        return self.real.partition_values(after=after, upto=upto)

    def max_cursor(self, *, after: Any = None) -> Any:
        return self.real.max_cursor(after=after)

    def read(self, bounds: Mapping[str, Any], *, chunk_rows: int = 10_000) -> Iterator[list]:
        return self.real.read(bounds, chunk_rows=chunk_rows)

    def count(self, bounds: Mapping[str, Any]) -> int:
        return self.real.count(bounds)

    def edge_rows(self, **window: Any) -> Iterator[list]:
        return self.real.edge_rows(**window)

    def reader(self, **kwargs: Any) -> Any:
        return self.real.reader(**kwargs)

    def select_sql(self, *args: Any, **kwargs: Any) -> Any:
        return self.real.select_sql(*args, **kwargs)

    def count_sql(self, *args: Any, **kwargs: Any) -> Any:
        return self.real.count_sql(*args, **kwargs)

    def table_sql(self, *args: Any, **kwargs: Any) -> Any:
        return self.real.table_sql(*args, **kwargs)

    def range_route(self, *args: Any, **kwargs: Any) -> Any:
        return self.real.range_route(*args, **kwargs)

    def collated_columns(self) -> list[str]:
        return self.real.collated_columns()


def _spec(tmp_path: Path, path: str, run_id: str) -> TransferSpec:
    source = OldSource(SQLiteSource(str(tmp_path / "source.db"), "orders", "region", "updated_at"))
    sink = OldSink(SQLiteSink(str(tmp_path / "target.db"), "orders_copy"))
    with pytest.warns(DeprecationWarning) as warned:
        spec = TransferSpec(
            source=source, sink=sink, strategy="incremental_append", path=path, run_id=run_id
        )
    assert sorted(str(w.message).split()[1] for w in warned) == ["OldSink", "OldSource"]
    assert isinstance(spec.sink, LegacySink) and isinstance(spec.source, LegacySource)
    return spec


@pytest.mark.parametrize("path", PATHS)
def test_a_connector_of_the_0_1_contract_loads_every_row_once_with_its_ledger(tmp_path, path):
    build_sample_source(tmp_path / "source.db", rows=200, partitions=4)
    with SQLiteCheckpointStore(str(tmp_path / "checkpoints.db")) as store:
        runtime = TransferRuntime(store)
        first = runtime.run(_spec(tmp_path, path, "run-1"))
        build_sample_source(tmp_path / "source.db", rows=40, partitions=4, start_id=201)
        second = runtime.run(_spec(tmp_path, path, "run-2"))
    real = SQLiteSink(str(tmp_path / "target.db"), "orders_copy")
    ledger = real.read_ledger()
    assert [entry.batch_id for entry in ledger] == [first.batch_id, second.batch_id]
    assert [entry.rows for entry in ledger] == [200, 40]
    source = SQLiteSource(str(tmp_path / "source.db"), "orders", "region", "updated_at")
    ids = sorted(row[0] for b in source.partition_values() for c in source.read({"partition": b})
                 for row in c)  # fmt: skip
    assert_rows_exactly_once(ids, sorted(row[0] for row in real.rows()))


def test_the_adapter_turns_the_0_1_protocols_into_features(tmp_path):
    sink = OldSink(SQLiteSink(str(tmp_path / "target.db"), "orders_copy"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        adapted = LegacySink(sink)
    assert (adapted.features.keeps_ledger, adapted.features.fence) == (True, False)
    assert adapted.engine() is adapted  # a PlanPulling sink has an engine: itself, adapted
    assert adapted.pull_stage(None) is None and adapted.can_pull(None, 1) is False  # type: ignore[arg-type]


def test_a_name_that_was_never_in_the_contract_is_still_an_attribute_error():
    contract = importlib.import_module("dpone_native_transfer.connectors.contract")
    with pytest.raises(AttributeError):
        _ = contract.LegacySinkk
    with pytest.raises(AttributeError):
        _ = contract.adapt_sink  # the adapter is the runtime's, not a 0.1 name
