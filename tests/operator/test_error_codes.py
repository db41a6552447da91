"""Stable error codes: each is documented, and a bug is never reported as a bad route file.

A store used after ``close()`` and a broken internal invariant are bugs in the
calling code: they carry codes of their own and exit 1, where a ``ConfigInvalid``
(exit 2) would send the operator to a route file that is fine.
"""

from __future__ import annotations

import inspect
import types
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

import dpone_native_transfer
from dpone_native_transfer import (
    AttemptState,
    ClickHouseSink,
    ConfigInvalid,
    DuckDBSink,
    InternalInvariantBroken,
    MemoryCheckpointStore,
    NativeTransferError,
    PathContractBroken,
    PostgresCheckpointStore,
    RouteKey,
    SQLiteCheckpointStore,
    SQLiteSink,
    SQLiteSource,
    StoreClosed,
    TransferRuntime,
    TransferSpec,
    errors,
)
from dpone_native_transfer.connectors import contract
from dpone_native_transfer.reporting import EXIT_FAILED, exit_code_for
from dpone_native_transfer.testing import build_sample_source
from dpone_target_commit_guard import plugin as guard

ROOT = Path(dpone_native_transfer.__file__).parents[2]
ROUTE = RouteKey("orders", "orders_copy", "incremental_append")


def stable_errors() -> list[type[NativeTransferError]]:
    """Every error class the package defines (``errors.py`` and the connector contract)."""
    return [
        value
        for module in (errors, contract)
        for value in vars(module).values()
        if inspect.isclass(value)
        and issubclass(value, NativeTransferError)
        and value is not NativeTransferError
        and value.__module__ == module.__name__
    ]


def test_every_stable_error_code_is_documented():
    documents = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    text = "\n".join(document.read_text(encoding="utf-8") for document in documents)
    classes = stable_errors()
    assert {StoreClosed, InternalInvariantBroken} <= set(classes)
    assert sorted({cls.code for cls in classes if cls.code not in text}) == []


@pytest.mark.parametrize("error", [StoreClosed, InternalInvariantBroken])
def test_a_bug_in_the_calling_code_is_not_a_bad_route_file(error):
    assert not issubclass(error, ConfigInvalid)
    assert exit_code_for(error("x")) == EXIT_FAILED
    assert error.__name__ in dpone_native_transfer.__all__


def test_a_closed_store_is_still_the_value_error_it_was_before_it_had_a_code():
    assert issubclass(StoreClosed, ValueError)


def _refused_after_close(store) -> list[StoreClosed]:
    store.close()
    refused = []
    for use in (
        lambda: list(store.list_latest(ROUTE)),
        lambda: len(store.list_target_latest(ROUTE)),
        store.lease_table,
    ):
        with pytest.raises(StoreClosed) as info:
            use()
        refused.append(info.value)
    return refused


def test_a_sqlite_store_used_after_close_says_so_with_a_stable_code(tmp_path):
    path = tmp_path / "secret-folder" / "checkpoints.db"
    path.parent.mkdir()
    for error in _refused_after_close(SQLiteCheckpointStore(path)):
        assert error.code == "native_transfer_store_closed"
        assert error.diagnostics == {"store": "SQLiteCheckpointStore"}
        assert "secret-folder" not in str(error)


def test_a_postgres_store_used_after_close_says_so_without_its_dsn(postgres_schema):
    store = PostgresCheckpointStore(postgres_schema.dsn, schema=postgres_schema.schema)
    for error in _refused_after_close(store):
        assert error.code == "native_transfer_store_closed"
        assert error.diagnostics == {"store": "PostgresCheckpointStore"}
        assert postgres_schema.dsn not in str(error)


def test_a_guard_hook_before_the_batch_was_armed_is_an_internal_invariant():
    """Unreachable through the boundary (the guard arms before any target call): a bug."""
    never_armed = types.SimpleNamespace(
        state=AttemptState(),
        transition_time=lambda: datetime(2026, 1, 1, tzinfo=UTC),
        batch=lambda *args, **kwargs: pytest.fail("a batch was built"),
    )
    with pytest.raises(InternalInvariantBroken, match="before the guard armed the batch") as info:
        guard.after_target_success(mutation=never_armed, result=None)
    assert info.value.code == "native_transfer_internal_invariant_broken"


def test_a_payload_no_sink_takes_is_the_paths_bug_before_the_target_on_every_shipped_sink(
    tmp_path,
):
    """A path handing ``load`` something else breaks the path contract (exit 1) before the
    target: nothing is written, nothing armed, and the route is not blocked."""
    build_sample_source(tmp_path / "source.db", rows=20, partitions=2)
    source = SQLiteSource(str(tmp_path / "source.db"), "orders", "region", "updated_at")
    sinks = [
        SQLiteSink(str(tmp_path / "t.db"), "orders_copy"),
        DuckDBSink(str(tmp_path / "t.duckdb"), "orders_copy"),
        ClickHouseSink(str(tmp_path / "chdb"), "orders_copy"),
    ]
    for number, sink in enumerate(sinks):
        store = MemoryCheckpointStore()
        runtime = TransferRuntime(store, paths={"rows-list": _rows_as_a_list})

        def spec(path: str, run_id: str, sink: Any = sink) -> TransferSpec:
            return TransferSpec(
                source=source, sink=sink, strategy="incremental_append", path=path, run_id=run_id
            )

        with pytest.raises(PathContractBroken) as refused:
            runtime.run(spec("rows-list", f"bad-{number}"))
        assert not isinstance(refused.value, ConfigInvalid)
        assert exit_code_for(refused.value) == EXIT_FAILED
        assert refused.value.diagnostics["path"] == "rows-list"
        assert sink.row_count() == 0
        assert runtime.run(spec("legacy", f"good-{number}")).rows_loaded == 20  # not blocked


def _rows_as_a_list(ctx: Any) -> int:
    return ctx.mutate("load", ctx.sink.load, [("a", 1)])


@pytest.mark.parametrize(
    "name", [name for name in errors.__all__ if name in {cls.__name__ for cls in stable_errors()}]
)
def test_every_error_survives_pickling_as_it_was_made(name):
    """Errors cross process boundaries (a worker pool, a result backend): the code is printed
    once however often the error is pickled, and its diagnostics and attributes are kept."""
    import pickle

    cls = getattr(errors, name)
    error = Exception.__new__(cls)
    NativeTransferError.__init__(error, "what happened", diagnostics={"route": "r"})
    error.extra = ["kept"]
    twice = pickle.loads(pickle.dumps(pickle.loads(pickle.dumps(error))))
    assert type(twice) is cls
    assert str(twice) == f"{cls.code}: what happened" == str(error)
    assert (twice.message, twice.diagnostics, twice.extra) == (
        "what happened",
        {"route": "r"},
        ["kept"],
    )
