"""Section 2d: a PostgreSQL source on the wire's terms, against the limit per target.

The issue's workload (issue 47): ``wire(id bigint, updated_at timestamptz, region text of 100
values, amount numeric(12,2), score double precision, note text)``, 2,000,000 rows
(``--quick``: 20,000), on a throwaway server (``tests/helpers/postgres_server.py``), 100
partitions of ``region`` without an index. Each round runs every contender once, in
reverse order every other round, after a warm-up round; figures are medians of 3 rounds
(``--runs`` more). Into each target, a full refresh into a fresh table and store:

- the limit, measured in the same run: into PostgreSQL, binary ``COPY ... TO STDOUT`` piped
  into ``COPY ... FROM STDIN`` of another table of the same server; into DuckDB,
  connectorx -> Arrow -> DuckDB in dlt's venv (``peers.run_connectorx``), or where that venv
  lacks connectorx, ``COPY ... TO STDOUT`` in CSV parsed by ``pyarrow.csv`` with the explicit
  schema and loaded with one ``INSERT ... SELECT`` of the Arrow stream; into
  ClickHouse (chDB), chDB's own ``INSERT INTO t SELECT * FROM postgresql(...)`` by hand, into
  a MergeTree table of the same columns in a fresh chDB folder (the floor of chDB's pulls);
- dpone's legacy, staged and file-artifact paths, guarded, which read in bulk
  (``Source.bulk()``) into PostgreSQL and DuckDB, and into chDB are pulled by chDB itself
  (``postgresql()``); and lazy-plan into chDB;
- into PostgreSQL, dpone's lazy-plan from another database of the server (a database made
  for it, with the dblink extension);
- dpone's staged path with the bulk read and the pull off: the rows as Python tuples, each
  value carried (what every path did before);
- into PostgreSQL and DuckDB, dlt 1.31's ``sql_database`` with its fastest backend here,
  connectorx (pyarrow when the dlt venv lacks it), in dlt's own venv
  (``peers.run_dlt``), in the same rounds. Target: every dpone path at most a
  third of dlt's time.

Ratio = the path's median / the limit's median; the dlt rows: dpone's path / dlt's.
"""

from __future__ import annotations

import contextlib
import io
import secrets
import subprocess
from collections.abc import Callable, Iterator
from typing import Any

from dpone_native_transfer import SQLiteCheckpointStore, TransferRuntime, TransferSpec
from dpone_native_transfer.connectors.clickhouse import ClickHouseSink
from dpone_native_transfer.connectors.duckdb import DuckDBSink
from dpone_native_transfer.connectors.postgres import PostgresSource
from dpone_native_transfer.connectors.postgres_sink import PostgresSink

from ._common import CHUNK_ROWS, Row, Sizes, log, median, scratch, timed
from .batch import _import_server_helper
from .peers import DLT_PYTHON, _dlt_missing, run_connectorx, run_dlt

PATHS = ("legacy", "staged", "file-artifact")
CHDB_PATHS = (*PATHS, "lazy-plan")  # chDB pulls from PostgreSQL itself on every path
PARTITIONS = 100
DLT_SHARE = 1 / 3  # every path at least 3x faster than dlt
DUCKDB_SCHEMA = (
    "id BIGINT, updated_at TIMESTAMPTZ, region VARCHAR, amount DECIMAL(12,2), score DOUBLE,"
    " note VARCHAR"
)


def _build(dsn: str, schema: str, rows: int, psycopg: Any) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')
        conn.execute(
            f'CREATE TABLE "{schema}".wire (id bigint PRIMARY KEY, updated_at timestamptz NOT NULL,'
            " region text NOT NULL, amount numeric(12,2), score double precision, note text)"
        )
        conn.execute(
            f'INSERT INTO "{schema}".wire SELECT i,'
            " timestamptz '2026-01-01 00:00:00+00' + i * interval '1.000001 second',"
            f" 'region-' || lpad((i % {PARTITIONS})::text, 3, '0'),"
            " round((i * 1.37)::numeric % 100000, 2), i * 0.5 + 0.25, md5(i::text)"
            f" FROM generate_series(1, {rows}) AS i"
        )
        conn.execute(f'ANALYZE "{schema}".wire')


def _limit_postgres(dsn: str, schema: str, psycopg: Any) -> float:
    """Binary COPY out of the source piped into binary COPY into a new table."""

    def copy() -> None:
        with psycopg.connect(dsn) as source, psycopg.connect(dsn) as target:
            target.execute(f'DROP TABLE IF EXISTS "{schema}".limit_copy')
            target.execute(f'CREATE TABLE "{schema}".limit_copy (LIKE "{schema}".wire)')
            reading = source.cursor().copy(f'COPY "{schema}".wire TO STDOUT (FORMAT binary)')
            writing = target.cursor().copy(f'COPY "{schema}".limit_copy FROM STDIN (FORMAT binary)')
            with reading as out, writing as into:
                for block in out:
                    into.write(block)

    return timed(copy)[0]


def _limit_connectorx(url: str, schema: str, rows: int) -> float:
    """connectorx -> Arrow -> DuckDB (``peers.run_connectorx``, in dlt's venv): the limit the
    issue measured, faster than the CSV below, which dpone's own bulk read now outruns."""
    with scratch("pg-wire-limit-connectorx") as folder:
        done = run_connectorx(url, [f'"{schema}".wire'], folder / "limit.duckdb", folder)
    if done["rows"] != rows:
        raise AssertionError(f"connectorx limit: {done['rows']} rows, not {rows}")
    return float(done["seconds"])


def _limit_duckdb(dsn: str, schema: str, psycopg: Any) -> float:
    """COPY in CSV, parsed by pyarrow.csv (explicit schema) as it streams, into DuckDB: the
    limit where connectorx is not installed."""
    import duckdb
    import pyarrow as pa
    import pyarrow.csv as csv

    types = pa.schema(
        [("id", pa.int64()), ("updated_at", pa.timestamp("us", tz="UTC")),
         ("region", pa.string()), ("amount", pa.decimal128(12, 2)), ("score", pa.float64()),
         ("note", pa.string())]
    )  # fmt: skip

    def copy(folder: Any) -> None:
        with psycopg.connect(dsn) as source:
            source.execute("SET TimeZone = 'UTC'")
            with source.cursor().copy(f'COPY "{schema}".wire TO STDOUT (FORMAT csv)') as out:
                stream = io.BufferedReader(_Blocks(iter(out)), 4 << 20)
                reader = csv.open_csv(
                    stream,
                    read_options=csv.ReadOptions(column_names=types.names, block_size=4 << 20),
                    parse_options=csv.ParseOptions(newlines_in_values=True),
                    convert_options=csv.ConvertOptions(column_types=types, null_values=[""]),
                )
                target = duckdb.connect(str(folder / "limit.duckdb"))
                try:
                    target.execute(f"CREATE TABLE t ({DUCKDB_SCHEMA})")
                    target.register("rows", reader)
                    target.execute("INSERT INTO t SELECT * FROM rows")
                finally:
                    target.close()

    with scratch("pg-wire-limit") as folder:
        return timed(lambda: copy(folder))[0]


class _Blocks(io.RawIOBase):
    def __init__(self, blocks: Any) -> None:
        self._blocks, self._rest = blocks, memoryview(b"")

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        while not self._rest:
            block = next(self._blocks, None)
            if block is None:
                return 0
            self._rest = memoryview(block).cast("B")
        size = min(len(buffer), len(self._rest))
        buffer[:size] = self._rest[:size]
        self._rest = self._rest[size:]
        return size


def _limit_chdb(dsn: str, schema: str, psycopg: Any) -> float:
    """chDB's own pull by hand: ``INSERT INTO t SELECT * FROM postgresql(...)``, the login as
    query parameters, into a fresh folder's MergeTree table."""
    import chdb.session

    parts = psycopg.conninfo.conninfo_to_dict(dsn)
    params = {
        "server": f"{parts['host']}:{parts['port']}",
        "db": parts["dbname"],
        "user": parts["user"],
        "password": parts["password"],
        "schema": schema,
    }
    source = (
        "postgresql({server:String}, {db:String}, 'wire', {user:String}, {password:String},"
        " {schema:String})"
    )
    with scratch("pg-wire-limit-chdb") as folder:
        session = chdb.session.Session(str(folder / "chdata"))
        try:
            session.query(
                "CREATE TABLE wire (id Nullable(Int64), updated_at Nullable(DateTime64(6, 'UTC')),"
                " region Nullable(String), amount Nullable(Decimal(12, 2)),"
                " score Nullable(Float64), note Nullable(String)) ENGINE = MergeTree"
                " ORDER BY tuple()"
            )
            insert = f"INSERT INTO wire SELECT * FROM {source} SETTINGS max_threads = 1"
            seconds, _ = timed(lambda: session.query(insert, params=params))
        finally:
            session.close()
    return seconds


def _dpone(
    url: str,
    schema: str,
    target: str,
    path: str,
    rows: int,
    psycopg: Any,
    *,
    bulk: bool,
    into: str | None = None,
) -> float:
    """One guarded full refresh into a fresh target: a new DuckDB file or chDB folder, or a new
    schema of the server (the target's ledger and fence live beside its table), of the
    source's database or of the one ``into`` names, dropped afterwards."""
    target_url = into or url
    with (
        scratch(f"pg-wire-{target}-{path}") as folder,
        _target_schema(target_url, psycopg) as own,
    ):
        source = PostgresSource(url, f"{schema}.wire", "region")
        if not bulk:
            source.bulk = lambda: None  # type: ignore[method-assign]
            source.engine_login = lambda: None  # type: ignore[method-assign]
        if target == "duckdb":
            sink: Any = DuckDBSink(folder / "target.duckdb", "wire_copy")
        elif target == "chdb":
            sink = ClickHouseSink(str(folder / "chdata"), "wire_copy")
        else:
            sink = PostgresSink(target_url, f"{own}.dpone_copy")
        store = SQLiteCheckpointStore(folder / "checkpoints.db")
        try:
            spec = TransferSpec(
                source=source,
                sink=sink,
                strategy="full_refresh",
                path=path,
                run_id="bench-run",
                chunk_rows=CHUNK_ROWS,
            )
            seconds, result = timed(lambda: TransferRuntime(store).run(spec))
        finally:
            store.close()
    if result.rows_loaded != rows:
        raise AssertionError(f"{target} {path}: loaded {result.rows_loaded}, expected {rows}")
    return seconds


def _dlt_backend() -> str:
    """dlt's fastest backend installed in its venv: connectorx, else pyarrow."""
    found = subprocess.run(
        [str(DLT_PYTHON), "-c", "import connectorx"], capture_output=True, timeout=120
    )
    return "connectorx" if found.returncode == 0 else "pyarrow"


def _dlt(url: str, schema: str, target: str, rows: int, backend: str, psycopg: Any) -> float:
    """dlt's ``sql_database`` of the wire table into a fresh DuckDB file or schema; the seconds
    its ``pipeline.run`` took (``peers.run_dlt``), its rows counted."""
    with scratch(f"pg-wire-dlt-{target}") as folder, _target_schema(url, psycopg) as own:
        request = {
            "source": url.replace("postgresql://", "postgresql+psycopg2://", 1),
            "schema": schema, "tables": ["wire"], "backend": backend,
            "destination": target,
            "target": str(folder / "dlt.duckdb") if target == "duckdb" else url,
            "dataset": own, "work": str(folder / "dlt"), "name": "bench_wire",
        }  # fmt: skip
        result = run_dlt(request, folder)
    if result["rows"] != rows:
        raise AssertionError(f"dlt into {target}: loaded {result['rows']}, expected {rows}")
    return float(result["seconds"])


@contextlib.contextmanager
def _other_database(url: str, psycopg: Any) -> Iterator[str]:
    """A database of the same server with the dblink extension: lazy-plan's target from
    another database (``postgres_sink._Dblink``); its URL, dropped afterwards."""
    name = f"dpone_bench_{secrets.token_hex(4)}"
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    other = url.rsplit("/", 1)[0] + f"/{name}"
    try:
        with psycopg.connect(other, autocommit=True) as conn:
            conn.execute("CREATE EXTENSION dblink")
        yield other
    finally:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@contextlib.contextmanager
def _target_schema(url: str, psycopg: Any) -> Iterator[str]:
    name = f"dpone_target_{secrets.token_hex(4)}"
    try:
        yield name
    finally:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')


def measure(sizes: Sizes) -> tuple[list[Row], dict]:
    imported = _import_server_helper()
    if isinstance(imported, str):
        print(f"section 2d skipped: {imported}", flush=True)
        return [], {"skipped": imported}
    helper, psycopg = imported
    rows = sizes.pg_wire_rows
    rounds = max(3, sizes.runs // 2)
    raw: dict[str, Any] = {"rows": rows, "partitions": PARTITIONS, "rounds": rounds}
    results: list[Row] = []
    dlt_missing = _dlt_missing()
    if dlt_missing is not None:
        print(f"section 2d: dlt rows skipped: {dlt_missing}", flush=True)
    backend = _dlt_backend() if dlt_missing is None else None
    raw["dlt"] = {"skipped": dlt_missing, "backend": backend}
    with contextlib.ExitStack() as stack:
        dsn = stack.enter_context(helper.server_dsn())
        schema = stack.enter_context(helper.isolated_schema(dsn)).schema
        _build(dsn, schema, rows, psycopg)
        url = helper.postgres_url(dsn)
        other = stack.enter_context(_other_database(url, psycopg))
        limits: dict[str, Callable[[], float]] = {
            "postgres": lambda: _limit_postgres(dsn, schema, psycopg),
            "duckdb": lambda: _limit_duckdb(dsn, schema, psycopg),
            "chdb": lambda: _limit_chdb(dsn, schema, psycopg),
        }
        if backend == "connectorx":
            limits["duckdb"] = lambda: _limit_connectorx(url, schema, rows)
        raw["duckdb limit"] = "connectorx" if backend == "connectorx" else "COPY CSV, pyarrow"
        for target, limit in limits.items():
            cases: dict[str, Callable[[], float]] = {"limit": limit}
            for path in CHDB_PATHS if target == "chdb" else PATHS:
                cases[path] = lambda path=path, target=target: _dpone(
                    url, schema, target, path, rows, psycopg, bulk=True
                )
            cases["staged, rows"] = lambda target=target: _dpone(
                url, schema, target, "staged", rows, psycopg, bulk=False
            )
            if target == "postgres":  # the server pulls from another database, through dblink
                cases["lazy-plan, another database"] = lambda: _dpone(
                    url, schema, "postgres", "lazy-plan", rows, psycopg, bulk=True, into=other
                )
            if backend is not None and target != "chdb":  # dlt has no chDB destination
                cases["dlt"] = lambda target=target: _dlt(
                    url, schema, target, rows, backend, psycopg
                )
            times: dict[str, list[float]] = {case: [] for case in cases}
            for number in range(rounds + 1):  # round 0 warms the caches
                order = list(cases) if number % 2 else list(cases)[::-1]
                for case in order:
                    seconds = cases[case]()
                    if number:
                        times[case].append(seconds)
                log(f"postgres wire into {target}: round {number} of {rounds} done")
            limit_median = median(times["limit"])
            for case in cases:
                if case == "limit":
                    continue
                value = median(times[case])
                label = f"dlt 1.31 sql_database ({backend})" if case == "dlt" else case
                results.append(
                    Row("2d PostgreSQL source, bulk",
                        f"{label} into {target} vs the limit ({rows:,} rows x 6 columns,"
                        f" {PARTITIONS} partitions)",
                        value, "s", limit_median, value / limit_median)
                )  # fmt: skip
            if "dlt" in times:
                dlt = median(times["dlt"])
                for path in PATHS:
                    share = median(times[path]) / dlt
                    results.append(
                        Row("2d PostgreSQL source, bulk",
                            f"{path} into {target} vs dlt 1.31 sql_database ({backend})",
                            median(times[path]), "s", dlt, share,
                            target=f"<= {DLT_SHARE:.2f}", met=share <= DLT_SHARE)
                    )  # fmt: skip
            raw[target] = {"seconds": times}
    raw["server"] = "the tests' throwaway server (fsync off), or DPONE_TEST_POSTGRES_DSN's"
    return results, raw
