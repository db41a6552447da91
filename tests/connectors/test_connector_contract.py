"""The connector contract (``connectors/contract/``): every shipped connector meets it, the
checker catches a connector that does not, a path whose connectors cannot provide what it
needs is refused before the target, on a route that stays unblocked, and a connector of the
0.1 contract is adapted, with a warning."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dpone_native_transfer import (
    ClickHouseSink,
    ConfigInvalid,
    DuckDBSink,
    PostgresSink,
    PostgresSource,
    SQLiteCheckpointStore,
    SQLiteSink,
    SQLiteSource,
    TransferRuntime,
    TransferSpec,
)
from dpone_native_transfer.connectors import contract
from dpone_native_transfer.connectors.contract.engine import EnginePull
from dpone_native_transfer.connectors.contract.sqlite_file import SQLiteFile
from dpone_native_transfer.testing import build_sample_source, capabilities_of, contract_problems
from dpone_native_transfer.testing.contract import protocol_members

SRC = Path(__file__).resolve().parents[2] / "src" / "dpone_native_transfer"


def shipped_connectors(tmp_path: Path) -> list[Any]:
    source = tmp_path / "source.db"
    build_sample_source(source, rows=8, partitions=2)
    return [
        SQLiteSource(str(source), "orders", "region", "updated_at"),
        PostgresSource("postgresql://u@127.0.0.1:1/db", "orders", "region", "updated_at"),
        SQLiteSink(str(tmp_path / "t.db"), "orders_copy"),
        DuckDBSink(str(tmp_path / "t.duckdb"), "orders_copy"),
        ClickHouseSink(str(tmp_path / "chdb"), "orders_copy"),
        PostgresSink("postgresql://u@127.0.0.1:1/db", "orders_copy"),
    ]


def test_every_shipped_connector_meets_every_part_it_claims(tmp_path):
    for connector in shipped_connectors(tmp_path):
        claimed = capabilities_of(connector)
        assert (contract.Source in claimed) != (contract.Sink in claimed), connector
        for protocol in claimed:
            assert contract_problems(connector, protocol) == [], (connector, protocol)


def test_the_shipped_sinks_declare_their_features_and_have_an_engine(tmp_path):
    sinks = [c for c in shipped_connectors(tmp_path) if isinstance(c, contract.Sink)]
    assert len(sinks) == 4
    for sink in sinks:
        assert isinstance(sink.features, contract.SinkFeatures), sink
        assert isinstance(sink.engine(), EnginePull), sink
    (chdb,) = [sink for sink in sinks if isinstance(sink, ClickHouseSink)]
    assert (chdb.features.ledger_atomic, chdb.features.fence) == (False, False)
    assert all(s.features.fence for s in sinks if s is not chdb)


def test_the_shipped_sqlite_source_is_a_file_other_engines_read(tmp_path):
    sources = [c for c in shipped_connectors(tmp_path) if isinstance(c, contract.Source)]
    assert [type(s) for s in sources if isinstance(s, SQLiteFile)] == [SQLiteSource]


class Loose:
    """A sink that gets the contract wrong in each way the checker reports."""

    table = "t"

    def load(self, rows: Any, mode: str) -> int:  # requires an argument never passed
        return 0

    def stage(self) -> int:  # takes no payload
        return 0

    staged_row_count = 3  # not a method

    def discard_stage(self) -> None: ...

    def finalize_staged_load(self, *, replace: bool) -> int:  # no default: may be left out
        return 0

    def partition_values(self, *, since: Any = None, upto: Any = None) -> list[Any]:
        return []  # `since` is not the runtime's `after`


def test_contract_problems_names_each_difference():
    problems = contract_problems(Loose(), contract.Sink)
    assert {
        "Sink.load: requires 'mode', which the runtime never passes",
        "Sink.load: takes no keyword argument 'ledger'",
        "Sink.stage: takes no positional argument 'payload'",
        "Sink.staged_row_count: not a method",
        "Sink.finalize_staged_load: requires 'replace', which the runtime may leave out",
        "Sink.finalize_staged_load: takes no keyword argument 'ledger'",
        "Sink.features: missing",
        "Sink.read_ledger: missing",
    } <= set(problems)
    assert not [p for p in problems if p.startswith(("Sink.table", "Sink.discard_stage"))]
    source_problems = contract_problems(Loose(), contract.Source)
    assert "Source.partition_values: takes no keyword argument 'after'" in source_problems
    assert "Source.describe: missing" in source_problems
    assert "Source.partition_column: missing" in source_problems


def test_keyword_catch_alls_and_extra_optional_parameters_meet_the_contract():
    class Flexible:
        table = "t"

        def load(self, payload: Any, *, verbose: bool = False, **more: Any) -> int:
            return 0

    assert not [p for p in contract_problems(Flexible(), contract.Sink) if "Sink.load" in p]


class RowsOnly:
    """A sink of the 0.1 contract with nothing but its base: ``table`` and ``load`` of a real
    SQLite sink (no staging, no engine, no ledger)."""

    def __init__(self, inner: SQLiteSink) -> None:
        self.inner = inner
        self.table = inner.table

    def load(self, payload: Any) -> int:
        return self.inner.load(payload)


@pytest.fixture
def route(tmp_path: Path) -> Iterator[tuple[SQLiteSource, SQLiteSink, SQLiteCheckpointStore]]:
    build_sample_source(tmp_path / "source.db", rows=40, partitions=4)
    source = SQLiteSource(str(tmp_path / "source.db"), "orders", "region", "updated_at")
    store = SQLiteCheckpointStore(str(tmp_path / "checkpoints.db"))
    yield source, SQLiteSink(str(tmp_path / "target.db"), "orders_copy"), store
    store.close()


def _spec(source: Any, sink: Any, path: str, run_id: str) -> TransferSpec:
    return TransferSpec(
        source=source, sink=sink, strategy="incremental_append", path=path, run_id=run_id
    )


@pytest.mark.parametrize(
    ("path", "needs"),
    [("staged", "a staging table"), ("lazy-plan", "an engine that pulls the rows itself")],
)
def test_a_path_whose_sink_lacks_its_capability_is_refused_before_the_target(route, path, needs):
    source, real_sink, store = route
    with pytest.warns(DeprecationWarning, match="contract of release 0.1"):
        sink = contract.legacy.adapt_sink(RowsOnly(real_sink))
    runtime = TransferRuntime(store)
    with pytest.raises(ConfigInvalid, match=f"cannot provide {needs}; use ") as refused:
        runtime.run(_spec(source, sink, path, "run-1"))
    assert refused.value.diagnostics["path"] == path
    assert real_sink.row_count() == 0
    assert all(cp.guard is None for cp in store.list_latest(_spec(source, sink, path, "x").route))
    # not blocked: the same sink on a path it can serve loads every row once
    assert runtime.run(_spec(source, sink, "legacy", "run-2")).rows_loaded == 40
    assert real_sink.row_count() == 40


class Delegating:
    """Not a ``SQLiteSource``: a source of its own, with the members of ``protocol`` only."""

    def __init__(self, inner: SQLiteSource, protocol: type) -> None:
        self._inner, self._members = inner, protocol_members(protocol)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_") or name not in self._members:
            raise AttributeError(name)
        return getattr(self._inner, name)


def test_lazy_plan_pulls_from_any_sqlite_file_source_not_only_the_shipped_class(route):
    source, sink, store = route
    mine = Delegating(source, SQLiteFile)
    assert not isinstance(mine, SQLiteSource) and isinstance(mine, SQLiteFile)
    result = TransferRuntime(store).run(_spec(mine, sink, "lazy-plan", "run-1"))
    assert result.rows_loaded == 40 == sink.row_count()


def test_lazy_plan_from_a_source_that_is_not_a_sqlite_file_is_refused_before_the_target(route):
    source, sink, store = route
    mine = Delegating(source, contract.Source)
    assert isinstance(mine, contract.Source) and not isinstance(mine, SQLiteFile)
    with pytest.raises(ConfigInvalid, match="reads SQLite sources only"):
        TransferRuntime(store).run(_spec(mine, sink, "lazy-plan", "run-1"))
    assert sink.row_count() == 0


def test_the_runtime_probes_no_connector_with_getattr():
    """Capabilities are Protocols: an ``isinstance`` the type checker follows, not a probe."""
    modules = ["runtime.py", "planner.py", "identity.py", "cursor_edge.py", "schema_contract.py"]
    modules += [f"paths/{p.name}" for p in (SRC / "paths").glob("*.py")]
    probes = [
        f"{module}:{node.lineno}"
        for module in modules
        for node in ast.walk(ast.parse((SRC / module).read_text(encoding="utf-8")))
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) in ("getattr", "hasattr")
    ]
    assert probes == []


def test_no_sink_tests_for_the_shipped_source_class():
    """A sink asks for the ``SQLiteFile`` part, never for ``SQLiteSource`` itself."""
    found = []
    for module in (SRC / "connectors").rglob("*.py"):
        for node in ast.walk(ast.parse(module.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "isinstance":
                names = {n.id for n in ast.walk(node.args[1]) if isinstance(n, ast.Name)}
                if "SQLiteSource" in names:
                    found.append(f"{module.name}:{node.lineno}")
    assert found == []


def test_a_positional_only_parameter_where_the_runtime_passes_a_keyword_is_a_problem():
    class PositionalOnly:
        def stage(self, payload: Any) -> int:
            return 0

        def staged_row_count(self) -> int:
            return 0

        def discard_stage(self) -> None: ...

        def finalize_staged_load(self, replace: bool = False, /) -> int:
            return 0

        def max_cursor(self, extra: Any, *, after: Any = None) -> Any:
            return None

    assert "Sink.finalize_staged_load: takes no keyword argument 'replace'" in (
        contract_problems(PositionalOnly(), contract.Sink)
    )
    assert "Source.max_cursor: requires 'extra', which the runtime never passes" in (
        contract_problems(PositionalOnly(), contract.Source)
    )


def test_odd_members_are_reported_not_raised():
    class Odd:
        load = dict  # a builtin: no signature to read

        @property
        def table(self) -> str:
            raise RuntimeError("a property that fails")

    assert capabilities_of(Odd()) == []
    assert {
        "Sink.table: raises RuntimeError when read",
        "Sink.load: its signature cannot be read (a builtin?): wrap it in a function",
    } <= set(contract_problems(Odd(), contract.Sink))
