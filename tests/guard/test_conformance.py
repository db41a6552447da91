"""The conformance kit: the four built-in paths and the bulk-copy example pass it through
the same entry a connector author uses, and it catches a path that skips the boundary."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from types import ModuleType
from typing import ClassVar

import attrs
import pytest
from helpers.postgres_server import postgres_url
from helpers.routes import SINKS, TARGET_FILES, make_sink

import dpone_native_transfer.connectors as connectors
import dpone_native_transfer.testing as testing
from dpone_native_transfer import (
    ManualReconciliationRequired,
    PartitionCheckpoint,
    PartitionCheckpointStatus,
    RouteKey,
    SQLiteCheckpointStore,
    TransferRuntime,
)
from dpone_native_transfer.runtime import BUILTIN_PATHS
from dpone_native_transfer.testing import faults
from dpone_native_transfer.testing.conformance import GuardConformance

TESTS = Path(__file__).resolve().parents[1]
EXAMPLES = TESTS.parent / "docs" / "examples"
KIT_TESTS = {name for name in dir(GuardConformance) if name.startswith("test_")}


def load_example(name: str) -> ModuleType:
    """Import a docs/examples module by file, without putting docs/ on sys.path."""
    spec = importlib.util.spec_from_file_location(f"docs_examples_{name}", EXAMPLES / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


bulk_copy = load_example("bulk_copy_path")


# -- the same entry for every path ------------------------------------------


class BuiltinPath(GuardConformance):
    """A built-in path under a name of its own, so the runtime can only find it through paths=."""

    builtin: ClassVar[str]

    @pytest.fixture
    def transfer_path(self):
        return BUILTIN_PATHS[self.builtin]


class TestKitLegacy(BuiltinPath):
    path_name, builtin = "kit-legacy", "legacy"


class TestKitStaged(BuiltinPath):
    path_name, builtin = "kit-staged", "staged"


class TestKitFileArtifact(BuiltinPath):
    path_name, builtin = "kit-file-artifact", "file-artifact"


class TestKitLazyPlan(BuiltinPath):
    path_name, builtin = "kit-lazy-plan", "lazy-plan"


class TestKitAuto(BuiltinPath):
    path_name, builtin = "kit-auto", "auto"


class TestKitBulkCopy(GuardConformance):
    path_name = "kit-bulk-copy"

    @pytest.fixture
    def transfer_path(self):
        return bulk_copy.bulk_copy_path


# Every path the engine sinks run the kit on: all the built-in ones.
ENGINE_PATHS = sorted(BUILTIN_PATHS)


class EngineSink(GuardConformance):
    """The kit with another engine's sink, through its ``make_sink`` seam, on every path."""

    sink_kind: ClassVar[str]

    @pytest.fixture(params=ENGINE_PATHS)
    def transfer_path(self, request):
        return BUILTIN_PATHS[request.param]

    @pytest.fixture
    def make_sink(self, tmp_path):
        return make_sink(self.sink_kind, tmp_path / TARGET_FILES[self.sink_kind])


class TestKitDuckDB(EngineSink):
    path_name, sink_kind = "kit-duckdb", "duckdb"


class TestKitClickHouse(EngineSink):
    path_name, sink_kind = "kit-chdb", "clickhouse"


# Sinks whose lazy-plan cannot pull the kit's SQLite source: they run every row path here, and
# their lazy-plan from their own engine in their own tests.
ROW_PATHS_ONLY = {"postgres": "connectors/test_connectors_postgres_sink.py"}


class TestKitPostgres(EngineSink):
    path_name, sink_kind = "kit-postgres", "postgres"

    @pytest.fixture(params=[path for path in ENGINE_PATHS if path != "lazy-plan"])
    def transfer_path(self, request):
        return BUILTIN_PATHS[request.param]

    @pytest.fixture
    def make_sink(self, postgres_schema):
        table = f"{postgres_schema.schema}.orders_copy"
        return make_sink("postgres", postgres_url(postgres_schema.dsn), table)


def test_every_builtin_path_has_a_kit_class():
    covered = {cls.builtin for cls in BuiltinPath.__subclasses__()}
    assert covered == set(BUILTIN_PATHS)
    assert not {cls.path_name for cls in BuiltinPath.__subclasses__()} & set(BUILTIN_PATHS)


def test_the_kit_runs_on_every_shipped_sink_on_every_path():
    """SQLite is the kit's default sink (the BuiltinPath classes, one per path); every other
    sink the package ships has an EngineSink class, which runs every built-in path (but
    lazy-plan for a sink that pulls only from its own engine: ROW_PATHS_ONLY)."""
    shipped = {getattr(connectors, name) for name in connectors.__all__ if name.endswith("Sink")}
    assert set(SINKS.values()) == shipped, "helpers.routes.SINKS must name every shipped sink"
    engines = EngineSink.__subclasses__()
    assert sorted(cls.sink_kind for cls in engines) == sorted(set(SINKS) - {"sqlite"})
    every_path = {cls.sink_kind: "transfer_path" not in vars(cls) for cls in engines}
    assert every_path == {kind: kind not in ROW_PATHS_ONLY for kind in every_path}
    assert all((TESTS / test).is_file() for test in ROW_PATHS_ONLY.values())
    assert ENGINE_PATHS == sorted(BUILTIN_PATHS)
    assert all("make_sink" not in vars(cls) for cls in BuiltinPath.__subclasses__())


# -- the kit catches an unguarded path --------------------------------------

# What the unguarded variant breaks, and the kit's words for it. The route scan
# still blocks its retries after a partial commit (that is path-independent),
# so the kit fails it exactly on the scenarios about the first target call.
CAUGHT = {
    "test_happy_run_arms_before_the_one_target_call": "the armed one, must be durable",
    "test_partial_arm_never_calls_the_target_and_retry_succeeds": "without a durable guard",
    "test_target_applying_then_raising_blocks_retry": "guard phases of the durable",
    "test_target_raising_before_applying_marks_outcome_unknown": "guard phases of the durable",
}


LEDGER_TESTS = {name for name in KIT_TESTS if "ledger" in name or "lost_store" in name}


def run_kit(
    pytester: pytest.Pytester, test_file: Path, *, skips: set[str] = frozenset()
) -> dict[str, pytest.TestReport]:
    """Run one kit test module in a sub-run beside a copy of the example; outcome per kit test.

    Only the tests named in ``skips`` may skip (the ledger tests, when the kit runs without it).
    """
    pytester.makepyfile(
        bulk_copy_path=(EXAMPLES / "bulk_copy_path.py").read_text(encoding="utf-8"),
        **{"test_" + test_file.stem.removeprefix("test_"): test_file.read_text(encoding="utf-8")},
    )
    recorder = pytester.inline_run("-p", "no:cacheprovider")
    passed, skipped, failed = recorder.listoutcomes()
    assert {report.nodeid.rsplit("::", 1)[-1] for report in skipped} == skips
    return {report.nodeid.rsplit("::", 1)[-1]: report for report in passed + failed + skipped}


def test_the_documented_five_lines_pass_the_kit_on_the_example(pytester):
    reports = run_kit(pytester, EXAMPLES / "test_bulk_copy_path.py")
    assert set(reports) == KIT_TESTS
    assert [name for name, report in reports.items() if not report.passed] == []


def test_the_kit_catches_the_unguarded_variant(pytester):
    """With the ledger off, the guard's own scenarios catch it."""
    reports = run_kit(pytester, TESTS / "helpers" / "unguarded_bulk_copy.py", skips=LEDGER_TESTS)
    assert set(reports) == KIT_TESTS
    failed = {name for name, report in reports.items() if report.failed}
    assert failed == set(CAUGHT)
    for name, why in CAUGHT.items():
        assert why in str(reports[name].longrepr), name


# -- the package stays importable without pytest ----------------------------


@pytest.mark.parametrize("name", faults.__all__)
def test_names_of_the_old_testing_module_are_still_exported(name):
    assert getattr(testing, name) is getattr(faults, name)
    assert name in testing.__all__


def test_importing_testing_and_the_cli_never_imports_pytest():
    code = (
        "import sys, dpone_native_transfer.cli, dpone_native_transfer.testing;"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('pytest', '_pytest')"
        " or m.endswith('.conformance')))"
    )
    completed = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert completed.stdout.strip() == "[]"


# -- the assertion helpers fail where they should ---------------------------


def test_assert_guard_registered_names_the_missing_entry_point(tmp_path):
    store = SQLiteCheckpointStore(str(tmp_path / "checkpoints.db"))
    try:
        with pytest.raises(AssertionError, match="'target_commit_guard' is not registered"):
            testing.assert_guard_registered(TransferRuntime(store, plugins=[]))
        testing.assert_guard_registered(TransferRuntime(store))
    finally:
        store.close()


@pytest.mark.parametrize(
    ("target", "problem"),
    [([1, 2, 2, 3], "more than once"), ([1, 2, 3, 9], "not in the source"), ([1, 2], "never")],
)
def test_row_assertions_name_the_problem(target, problem):
    with pytest.raises(AssertionError, match=problem):
        testing.assert_rows_exactly_once([1, 2, 3], target)


def test_no_duplicate_rows_allows_missing_rows_only():
    testing.assert_no_duplicate_rows([1, 2, 3], [1])
    with pytest.raises(AssertionError, match="more than once"):
        testing.assert_no_duplicate_rows([1, 2, 3], [1, 1])


def test_assert_raises_original_refuses_a_replacement_and_a_moved_traceback():
    original = testing.InjectedFault("original")

    def replaced():
        raise RuntimeError("cleanup failed")

    def reraised_from_here():
        raise original

    with pytest.raises(AssertionError, match="replaced by RuntimeError"):
        testing.assert_raises_original(original, replaced)
    with pytest.raises(AssertionError, match="nothing was raised"):
        testing.assert_raises_original(original, lambda: None)
    with pytest.raises(AssertionError, match="no longer reaches upsert_many"):
        testing.assert_raises_original(original, reraised_from_here, raised_in="upsert_many")
    assert testing.assert_raises_original(original, reraised_from_here) is original


@attrs.define
class CountingSink:
    target_calls: int = 0


def test_assert_blocked_before_target_refuses_a_run_that_reached_the_target():
    sink = CountingSink()

    def reaches_target():
        sink.target_calls += 1

    def blocked_late():
        sink.target_calls += 1
        raise ManualReconciliationRequired("late")

    with pytest.raises(AssertionError, match="not blocked"):
        testing.assert_blocked_before_target(reaches_target, sink)
    with pytest.raises(AssertionError, match="only after it called the target"):
        testing.assert_blocked_before_target(blocked_late, sink)


def checkpoint(status: str, started: int, completed: int | None) -> PartitionCheckpoint:
    at = [datetime(2026, 1, 1, 0, 0, second, tzinfo=UTC) for second in (started, completed or 0)]
    return PartitionCheckpoint(
        partition_id=f"p-{started:024x}",
        route=RouteKey("orders", "orders_copy", "incremental_append"),
        status=PartitionCheckpointStatus(status),
        run_id="run-1",
        query_hash="sha256:" + "a" * 64,
        schema_hash="sha256:" + "b" * 64,
        partition_bounds={"partition": "p"},
        started_at=at[0],
        completed_at=None if completed is None else at[1],
    )


@pytest.mark.parametrize(
    ("batch", "problem"),
    [
        ([checkpoint("committed", 1, 1), checkpoint("committed", 2, 2)], "2 timestamps"),
        ([checkpoint("committed", 1, 2)], "completed_at"),
        ([checkpoint("exported", 1, 1)], "completed_at"),
    ],
)
def test_assert_one_timestamp_per_batch_names_the_problem(batch, problem):
    testing.assert_one_timestamp_per_batch([[checkpoint("exported", 1, None)]])
    with pytest.raises(AssertionError, match=problem):
        testing.assert_one_timestamp_per_batch([batch])


def test_assert_one_timestamp_per_batch_wants_the_injected_clock():
    batch = [checkpoint("committed", 1, 1)]
    testing.assert_one_timestamp_per_batch([batch], [batch[0].started_at])
    with pytest.raises(AssertionError, match="injected clock"):
        testing.assert_one_timestamp_per_batch([batch], [])


def test_with_the_ledger_on_the_unguarded_variant_also_fails_for_want_of_its_ledger_row(
    pytester, tmp_path
):
    """Its fake target call cannot take the batch's ledger entry: every run that reaches it
    is refused at ``mutate``, before arming (it wrote its rows behind the boundary's back)."""
    text = (TESTS / "helpers" / "unguarded_bulk_copy.py").read_text(encoding="utf-8")
    copy = tmp_path / "unguarded_bulk_copy.py"
    copy.write_text(text.replace("ledger = False", "ledger = True"), encoding="utf-8")
    reports = run_kit(pytester, copy)
    failed = {name for name, report in reports.items() if report.failed}
    assert set(CAUGHT) <= failed
    missing_row = {n for n in failed if "takes no ledger entry" in str(reports[n].longrepr)}
    assert "test_the_ledger_records_each_applied_batch_once" in missing_row
    assert len(missing_row) >= 5
