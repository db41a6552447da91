"""The core needs only pluggy and attrs: importing it (connectors included) loads no driver."""

from __future__ import annotations

import json
import subprocess
import sys

DRIVERS = ("duckdb", "chdb", "clickhouse_connect", "psycopg", "airflow")


def test_importing_the_package_and_its_connectors_loads_no_engine_driver():
    code = (
        "import json, sys\n"
        "import dpone_native_transfer as d\n"
        "from dpone_native_transfer.connectors import ClickHouseSink, DuckDBSink, PostgresSource\n"
        "import dpone_native_transfer.config, dpone_native_transfer.cli\n"
        f"print(json.dumps(sorted(m for m in {DRIVERS!r} if m in sys.modules)))\n"
        "print(json.dumps([d.ClickHouseSink is ClickHouseSink, d.DuckDBSink is DuckDBSink,"
        " d.PostgresSource is PostgresSource]))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    loaded, exported = map(json.loads, done.stdout.splitlines())
    assert loaded == []
    assert exported == [True, True, True]
