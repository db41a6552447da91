"""Route files naming each engine: ``dpone-transfer run`` on DuckDB and ClickHouse (chDB) targets
and a PostgreSQL source, on the real engines; and the errors a route file can get about kinds."""

from __future__ import annotations

import contextlib
import importlib.util
import json
import sqlite3
import subprocess
import sys
from pathlib import Path

import duckdb
import psycopg
import pytest
from helpers.postgres_server import postgres_url

from dpone_native_transfer import ConfigInvalid
from dpone_native_transfer.config import load_route_config, route_config_from_mapping
from dpone_native_transfer.connectors.clickhouse import ClickHouseSink
from dpone_native_transfer.connectors.duckdb import DuckDBSink
from dpone_native_transfer.connectors.postgres import PostgresSource
from dpone_native_transfer.testing import build_sample_source

SCRIPT = str(Path(sys.executable).parent / "dpone-transfer")

ROUTE = """\
[source]
{source}
table = "orders"
partition_column = "region"
cursor_column = "updated_at"

[target]
{target}
table = "orders_copy"

[transfer]
strategy = "incremental_append"
path = "{path}"

[store]
path = "checkpoints.db"
"""
SQLITE_SOURCE = 'path = "source.db"'


def route_file(folder: Path, *, source: str = SQLITE_SOURCE, target: str, path: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    file = folder / "route.toml"
    file.write_text(ROUTE.format(source=source, target=target, path=path), encoding="utf-8")
    return file


def run(file: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [SCRIPT, "run", str(file), "--quiet", *extra], capture_output=True, text=True, timeout=300
    )


def source_ids(folder: Path) -> list[int]:
    with contextlib.closing(sqlite3.connect(folder / "source.db")) as db:
        return [row[0] for row in db.execute("SELECT id FROM orders ORDER BY id")]


def duckdb_ids(path: Path) -> list[int]:
    with contextlib.closing(duckdb.connect(str(path), read_only=True)) as db:
        return [row[0] for row in db.execute("SELECT id FROM orders_copy ORDER BY id").fetchall()]


@pytest.mark.parametrize("path", ["legacy", "staged", "file-artifact", "lazy-plan"])
def test_a_duckdb_route_runs_from_its_route_file(tmp_path, path):
    build_sample_source(tmp_path / "source.db", rows=300, partitions=3)
    file = route_file(tmp_path, target='kind = "duckdb"\npath = "target.duckdb"', path=path)
    assert isinstance(load_route_config(file).sink, DuckDBSink)
    first = run(file)
    assert first.returncode == 0, first.stderr
    build_sample_source(tmp_path / "source.db", rows=50, partitions=3, start_id=301)
    second = run(file)
    assert second.returncode == 0, second.stderr
    assert duckdb_ids(tmp_path / "target.duckdb") == source_ids(tmp_path)


# ``dpone-transfer run`` in a process where importing pandas sends the process SIGTERM.
SIGTERM_WHILE_PANDAS_IMPORTS = """
import importlib.abc, importlib.util, os, signal, sys, time

class SignalledImport(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name, path=None, target=None):
        return importlib.util.spec_from_loader(name, self) if name == "pandas" else None

    def create_module(self, spec):
        return None

    def exec_module(self, module):
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(30)  # the handler raises here

sys.meta_path.insert(0, SignalledImport())
from dpone_native_transfer.cli import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.parametrize("path", ["legacy", "staged", "file-artifact"])
def test_a_sigterm_while_pandas_imports_for_duckdb_stops_the_run(tmp_path, path):
    """DuckDB imports pandas (when installed) the first time it is handed Python data (a bound
    parameter, Arrow rows), inside its own code, which swallowed what a signal's handler
    raised meanwhile: the run went on and ended with exit 0. A path that hands DuckDB rows
    imports pandas first, before the target call, so the SIGTERM ends the run (143) there,
    and the next run loads every row once. (Lazy-plan hands it none: the test below.)"""
    build_sample_source(tmp_path / "source.db", rows=300, partitions=3)
    file = route_file(tmp_path, target='kind = "duckdb"\npath = "target.duckdb"', path=path)
    stopped = subprocess.run(
        [sys.executable, "-c", SIGTERM_WHILE_PANDAS_IMPORTS, "run", str(file), "--quiet"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert stopped.returncode == 143
    assert stopped.stderr == (
        "error: terminated (SIGTERM): it stopped before the target was called: nothing was "
        "written; a rerun is safe\n"
    )
    done = run(file)
    assert done.returncode == 0, done.stderr
    assert duckdb_ids(tmp_path / "target.duckdb") == source_ids(tmp_path)


# ``dpone-transfer run``, then whether pandas was imported, on stderr's last line.
RUN_AND_TELL_PANDAS = """
import sys
from dpone_native_transfer.cli import main
try:
    code = main(sys.argv[1:])
finally:
    print("pandas imported:", "pandas" in sys.modules, file=sys.stderr)
sys.exit(code)
"""


@pytest.mark.parametrize("path", ["staged", "lazy-plan"])
def test_a_duckdb_run_binds_no_parameter_and_imports_pandas_only_to_hand_over_rows(tmp_path, path):
    """DuckDB imports pandas (0.3-0.5 s) at a process's first bound parameter, so dpone's
    statements carry their values as literals (``connect.inline``): a run imports pandas only
    where it hands DuckDB rows itself (staged; the test above), never on lazy-plan, where
    DuckDB reads the source, nor on a run with nothing new. The table's name holds a quote:
    the ledger's literal must still find its rows, or the cross-check refuses."""
    build_sample_source(tmp_path / "source.db", rows=300, partitions=3)
    file = route_file(tmp_path, target='kind = "duckdb"\npath = "target.duckdb"', path=path)
    text = file.read_text(encoding="utf-8").replace('"orders_copy"', "\"O'Brien's copy\"")
    file.write_text(text, encoding="utf-8")
    command = [sys.executable, "-c", RUN_AND_TELL_PANDAS, "run", str(file), "--quiet"]
    first = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert first.returncode == 0, first.stderr
    assert "loaded 300 rows" in first.stdout
    handed = path != "lazy-plan"  # rows handed to DuckDB as Arrow
    assert first.stderr.splitlines()[-1] == f"pandas imported: {handed}"
    again = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr
    assert "committed 0 partitions" in again.stdout and "loaded 0 rows" in again.stdout
    assert again.stderr.splitlines()[-1] == "pandas imported: False"
    sink = load_route_config(file).sink
    assert [entry.rows for entry in sink.read_ledger()] == [300]
    assert sink.fence_epoch() >= 1 and sink.row_count() == 300


def test_a_clickhouse_route_on_chdb_runs_from_its_route_file(tmp_path):
    build_sample_source(tmp_path / "source.db", rows=300, partitions=3)
    file = route_file(tmp_path, target='kind = "clickhouse"\npath = "chdata"', path="staged")
    sink = load_route_config(file).sink
    assert isinstance(sink, ClickHouseSink) and sink.partition_by == "region"
    done = run(file)
    assert done.returncode == 0, done.stderr
    ids = sorted(row[0] for row in load_route_config(file).sink.rows())
    assert ids == source_ids(tmp_path)


def test_a_postgres_source_route_reads_the_dsn_from_the_environment(tmp_path, postgres_schema):
    with contextlib.closing(psycopg.connect(postgres_schema.dsn, autocommit=True)) as db:
        db.execute(f'CREATE SCHEMA "{postgres_schema.schema}"')
        db.execute(
            f'CREATE TABLE "{postgres_schema.schema}".orders'
            " (id int PRIMARY KEY, region text, amount numeric(10, 2), updated_at int)"
        )
        db.execute(
            f'INSERT INTO "{postgres_schema.schema}".orders'
            " SELECT i, 'region-' || (i % 3), i * 1.25, 1000 + i FROM generate_series(1, 90) i"
        )
    file = route_file(
        tmp_path,
        source='kind = "postgres"\ndsn = "env:DPONE_TEST_SOURCE"',
        target='path = "target.db"',
        path="legacy",
    )
    text = file.read_text().replace(
        'table = "orders"', f'table = "{postgres_schema.schema}.orders"'
    )
    file.write_text(text)
    url = postgres_url(postgres_schema.dsn)
    env_done = subprocess.run(
        [SCRIPT, "run", str(file), "--quiet"],
        capture_output=True,
        text=True,
        timeout=300,
        env={"DPONE_TEST_SOURCE": url, "PATH": "/usr/bin:/bin"},
    )
    assert env_done.returncode == 0, env_done.stderr
    assert url not in env_done.stdout + env_done.stderr
    with contextlib.closing(sqlite3.connect(tmp_path / "target.db")) as db:
        assert [r[0] for r in db.execute("SELECT id FROM orders_copy ORDER BY id")] == list(
            range(1, 91)
        )


def test_a_mapping_route_builds_the_same_connectors(tmp_path, monkeypatch):
    monkeypatch.setenv("DPONE_TEST_SOURCE", "postgresql://u:secret@127.0.0.1:1/db")
    config = route_config_from_mapping(
        {
            "source": {
                "kind": "postgres",
                "dsn": "env:DPONE_TEST_SOURCE",
                "table": "orders",
                "partition_column": "region",
            },
            "target": {"kind": "duckdb", "path": "t.duckdb", "table": "orders_copy"},
            "transfer": {"strategy": "full_refresh", "path": "legacy"},
            "store": {"path": "c.db"},
        },
        base_dir=tmp_path,
    )
    assert isinstance(config.source, PostgresSource)
    assert config.sink.path == str(tmp_path / "t.duckdb")
    assert "secret" not in repr(config.source)


def test_a_postgres_source_without_a_partition_column_is_told_what_to_name(tmp_path, monkeypatch):
    """A SQLite table's rowid is found by itself; a server's table is not looked up before a
    run, so its route names the column (the README's example leaves it out)."""
    monkeypatch.setenv("DPONE_TEST_SOURCE", "postgresql://u:secret@127.0.0.1:1/db")
    route = {
        "source": {"kind": "postgres", "dsn": "env:DPONE_TEST_SOURCE", "table": "orders"},
        "target": {"kind": "duckdb", "path": "t.duckdb", "table": "orders_copy"},
        "transfer": {"strategy": "full_refresh", "path": "legacy"},
        "store": {"path": "c.db"},
    }
    with pytest.raises(ConfigInvalid) as info:
        route_config_from_mapping(route, base_dir=tmp_path)
    assert info.value.diagnostics == {"key": "source.partition_column"}
    assert "is required for a postgres source" in info.value.message
    assert "integer primary key" in info.value.message


KIND_ERRORS = [
    # (source lines, target lines, key, what the message says)
    (SQLITE_SOURCE, 'kind = "oracle"\npath = "t.db"', "target.kind", "one of: sqlite, duckdb"),
    ('kind = "postgres"\npath = "s.db"', 'path = "t.db"', "source.path", "is not used by"),
    ('kind = "postgres"', 'path = "t.db"', "source.dsn", "is required for kind 'postgres'"),
    (SQLITE_SOURCE, 'kind = "duckdb"\nurl = "x"', "target.url", "is not used by"),
    (SQLITE_SOURCE, 'kind = "clickhouse"', "target.path", "(target.path or target.url)"),
    (SQLITE_SOURCE, 'kind = "clickhouse"\npath = "a"\nurl = "b"', "target.path", "not both"),
    (SQLITE_SOURCE, 'table_x = 1\npath = "t.db"', "target.table_x", "is not a known key"),
]


@pytest.mark.parametrize(("source", "target", "key", "says"), KIND_ERRORS)
def test_kind_problems_name_their_key(tmp_path, source, target, key, says):
    file = route_file(tmp_path, source=source, target=target, path="legacy")
    with pytest.raises(ConfigInvalid) as info:
        load_route_config(file)
    assert info.value.diagnostics["key"] == key
    assert says in info.value.message


@pytest.mark.parametrize(
    ("kind", "module", "extra"),
    [("duckdb", "duckdb", "duckdb"), ("clickhouse", "clickhouse_connect", "clickhouse")],
)
def test_a_missing_extra_is_named_with_its_install_line(tmp_path, monkeypatch, kind, module, extra):
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == module else real(name, *a)
    )
    file = route_file(tmp_path, target=f'kind = "{kind}"\npath = "t"', path="legacy")
    with pytest.raises(ConfigInvalid) as info:
        load_route_config(file)
    assert info.value.diagnostics["key"] == "target.kind"
    assert f"pip install 'dpone-native-transfer[{extra}]'" in info.value.message


def test_a_clickhouse_url_from_an_unset_variable_is_refused_by_name(tmp_path, monkeypatch):
    monkeypatch.delenv("DPONE_NO_SUCH_URL", raising=False)
    file = route_file(
        tmp_path, target='kind = "clickhouse"\nurl = "env:DPONE_NO_SUCH_URL"', path="legacy"
    )
    with pytest.raises(ConfigInvalid) as info:
        load_route_config(file)
    assert info.value.diagnostics == {"key": "target.url"}
    assert json.dumps(info.value.diagnostics)


# -- locations given by the caller (Airflow's connections) take precedence over the file ------


def test_given_locations_replace_the_files_own_and_stay_out_of_the_repr(tmp_path):
    (tmp_path / "elsewhere").mkdir()
    build_sample_source(tmp_path / "elsewhere" / "shop.db", rows=10, partitions=2)
    file = route_file(tmp_path, target='path = "t.db"', path="legacy")
    store = "postgresql://u:secret@127.0.0.1:1/dpone"
    config = load_route_config(
        file,
        locations={
            "source": {"path": str(tmp_path / "elsewhere" / "shop.db")},
            "target": {"path": "w.db"},  # relative: to the route file's folder, as in the file
            "store": {"path": store},
        },
    )
    assert config.source.path == config.source_location == str(tmp_path / "elsewhere" / "shop.db")
    assert config.sink.path == config.target_location == str(tmp_path / "w.db")
    assert config.store_path == store
    assert "secret" not in repr(config)
    # A mapping without a [store] section gets one from the given location.
    sections = {
        "source": {"path": "s.db", "table": "orders", "partition_column": "region"},
        "target": {"path": "t.db", "table": "orders_copy"},
        "transfer": {"strategy": "full_refresh", "path": "legacy"},
    }
    mapped = route_config_from_mapping(
        sections, base_dir=tmp_path, locations={"store": {"path": "c.db"}}
    )
    assert mapped.store_path == str(tmp_path / "c.db")
    assert "store" not in sections
    with pytest.raises(ConfigInvalid) as info:
        route_config_from_mapping(sections, locations={"gates": {"path": "x"}})
    assert info.value.diagnostics == {"key": "gates"}


def test_a_location_given_for_a_kind_that_takes_another_key_is_refused_by_that_key(tmp_path):
    file = route_file(tmp_path, target='path = "t.db"', path="legacy")
    with pytest.raises(ConfigInvalid) as info:
        load_route_config(file, locations={"source": {"dsn": "postgresql://u:CANARY@h/db"}})
    assert info.value.diagnostics == {"key": "source.dsn"}
    assert "is not used by source.kind = 'sqlite'" in info.value.message
    assert "CANARY" not in str(info.value)
