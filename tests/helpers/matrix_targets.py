"""The databases of one case of the crash and pause matrices, per target kind.

A ``Place`` says where one case's route lives: its SQLite source file and its
target (a SQLite or DuckDB file, a chDB data folder, or a table in a PostgreSQL
schema of the case's own). A ClickHouse merge route's rows are read as a reader
sees them, from its merged view (``FINAL``). lazy-plan into PostgreSQL pulls a
PostgreSQL source of the same database only, so that case's source is a
PostgreSQL copy of the sample table in the target's schema. A ``Place`` is
JSON-safe: the test hands it to the child process (``crash_child.py``), which
builds the same real source and sink from it. Rows are counted with each
engine's own client, never through dpone.
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import attrs

from dpone_native_transfer import (
    ClickHouseSink,
    DuckDBSink,
    PostgresSink,
    RouteKey,
    SQLiteSink,
    SQLiteSource,
)
from dpone_native_transfer.spec import route_key
from dpone_native_transfer.testing import build_sample_source

__all__ = [
    "SOURCE_TABLE",
    "BATCH_COLUMN",
    "CRASH_TARGET_KINDS",
    "TARGET_KINDS",
    "TARGET_TABLE",
    "Place",
]

TARGET_KINDS = ("sqlite", "duckdb", "postgres")  # the pause matrix's
CRASH_TARGET_KINDS = (*TARGET_KINDS, "clickhouse")  # the crash matrix's: chDB too
# A ClickHouse append route's column of each row's batch id (``target.batch_column``): its
# ledger row follows the rows, so only a count of them proves a batch (lazy-plan refuses it).
BATCH_COLUMN = "loaded_batch"
SOURCE_TABLE, TARGET_TABLE = "orders", "orders_copy"
_FILES = {"sqlite": "target.db", "duckdb": "target.duckdb", "clickhouse": "chdata"}
# Route-file environment variables holding the PostgreSQL URLs (never in a file).
TARGET_URL_ENV, STORE_URL_ENV = "DPONE_MATRIX_TARGET_URL", "DPONE_MATRIX_STORE_URL"


@attrs.frozen(kw_only=True)
class Place:
    """Where one case's route lives. ``url`` and ``schema``: the PostgreSQL target's server
    (a ``postgresql://`` URL, as the sink and a route file take it) and its schema."""

    target: str  # sqlite | duckdb | postgres | clickhouse
    path: str  # the transfer path
    folder: str  # the source file and a target file go here
    url: str | None = None
    schema: str | None = None
    merge: bool = False  # a merge route on ``id``, its source's ``gone`` column deleting
    composite: bool = False  # a merge route on (``tenant``, ``id``): an id under two tenants
    source: str = "sqlite"  # or "postgres": the sample's copy in ``schema`` of ``url``

    def as_dict(self) -> dict[str, Any]:
        return attrs.asdict(self)

    @classmethod
    def from_dict(cls, fields: Mapping[str, Any]) -> Place:
        return cls(**fields)

    # --- the route ----------------------------------------------------------------------

    @property
    def pg_source(self) -> bool:
        """True when the source is the PostgreSQL copy: asked for, or lazy-plan into
        PostgreSQL. A merge route's lazy-plan carries the rows as legacy does
        (``paths/lazy_plan.py``): SQLite's."""
        if self.source == "postgres":
            return True
        return self.target == "postgres" and self.path == "lazy-plan" and not self.merge

    @property
    def source_path(self) -> Path:
        return Path(self.folder) / "source.db"

    @property
    def target_path(self) -> Path:
        return Path(self.folder) / _FILES[self.target]

    @property
    def target_table(self) -> str:
        return f"{self.schema}.{TARGET_TABLE}" if self.target == "postgres" else TARGET_TABLE

    @property
    def respelt_target_table(self) -> str:
        """Another spelling of the target table that the engine resolves to the same table
        (SQLite and DuckDB fold ASCII case); PostgreSQL's and ClickHouse's names are
        case-sensitive."""
        if self.target in ("postgres", "clickhouse"):
            return self.target_table
        return TARGET_TABLE.upper()

    def make_source(self) -> Any:
        if self.pg_source:
            from dpone_native_transfer import PostgresSource

            return PostgresSource(self.url, f"{self.schema}.{SOURCE_TABLE}", "region", "updated_at")
        return SQLiteSource(str(self.source_path), SOURCE_TABLE, "region", "updated_at")

    def make_sink(self, table: str | None = None) -> Any:
        table = table or self.target_table
        if self.target == "sqlite":
            return SQLiteSink(str(self.target_path), table)
        if self.target == "duckdb":
            return DuckDBSink(str(self.target_path), table)
        if self.target == "clickhouse":  # as a route file makes it
            return ClickHouseSink(str(self.target_path), table, partition_by="region")
        return PostgresSink(str(self.url), table)

    @property
    def route(self) -> RouteKey:
        return route_key(self.make_source(), self.make_sink(), self.spec_options()["strategy"])

    def spec_options(self) -> dict[str, Any]:
        """The strategy (and a merge route's key and deleted column, a ClickHouse append
        route's batch column) of the case's spec."""
        if self.merge:
            return {"strategy": "merge", "primary_key": self.key, "deleted_column": "gone"}
        if self.target == "clickhouse" and self.path != "lazy-plan":
            return {"strategy": "incremental_append", "batch_column": BATCH_COLUMN}
        return {"strategy": "incremental_append"}

    @property
    def proves_every_kill(self) -> bool:
        """Whether the target proves what any kill left, applied or not: a ledger written with
        the rows, or (ClickHouse) the rows counted by a batch column, a merge route's own or
        ``BATCH_COLUMN``. A ClickHouse append route on lazy-plan has neither: its ledger row
        proves a batch applied, its absence nothing."""
        return not (self.target == "clickhouse" and not self.merge and self.path == "lazy-plan")

    @property
    def key(self) -> tuple[str, ...]:
        """A row's identity: the merge key, or ``id``."""
        return ("tenant", "id") if self.composite else ("id",)

    @property
    def _columns(self) -> str:
        """A merge route's loaded columns, key first (what ``target_rows`` compares)."""
        return ", ".join((*self.key, "region", "amount", "updated_at"))

    # --- a merge route's rows -----------------------------------------------------------------

    def add_deleted_column(self) -> None:
        """The SQLite source's ``gone`` column, 0 for every row (merge cases read SQLite); a
        composite route's source is keyed on (``tenant``, ``id``), its tenants ``a`` and
        ``A`` (by the id's parity), so that new keys can repeat an id under the other case."""
        with contextlib.closing(sqlite3.connect(self.source_path)) as db:
            db.execute(f"ALTER TABLE {SOURCE_TABLE} ADD COLUMN gone INTEGER NOT NULL DEFAULT 0")
            if self.composite:
                db.executescript(
                    f"CREATE TABLE keyed (tenant TEXT NOT NULL, id INTEGER NOT NULL, region TEXT"
                    " NOT NULL, amount REAL, updated_at INTEGER, gone INTEGER NOT NULL,"
                    " PRIMARY KEY (tenant, id));"
                    " INSERT INTO keyed SELECT CASE id % 2 WHEN 0 THEN 'a' ELSE 'A' END, id,"
                    f" region, amount, updated_at, gone FROM {SOURCE_TABLE};"
                    f" DROP TABLE {SOURCE_TABLE}; ALTER TABLE keyed RENAME TO {SOURCE_TABLE};"
                )
            db.commit()

    def change_source(self, *, every: int) -> None:
        """A run's worth of changes, each at a new cursor value: every ``every``-th id
        updated (every other one moved to the next region, as a key changing partition),
        every ``every``-th id from the middle deleted (``gone``), and as many new keys: new
        ids, or (composite) those updated ids under their tenant's other case. Called again
        with a larger ``every``, it changes again some keys the first call changed."""
        with contextlib.closing(sqlite3.connect(self.source_path)) as db:
            top, size, regions = db.execute(
                f"SELECT max(updated_at), max(id), count(DISTINCT region) FROM {SOURCE_TABLE}"
            ).fetchone()
            ids = range(1, size + 1, every)
            for n, row_id in enumerate(ids):
                moved = f"region-{(row_id + n % 2) % regions:03d}"
                db.execute(
                    f"UPDATE {SOURCE_TABLE} SET amount = amount + 0.5, region = ?,"
                    " updated_at = ? WHERE id = ?",
                    (moved, top + 1 + n, row_id),
                )
            for n, row_id in enumerate(range(every // 2 + 1, size + 1, every)):
                db.execute(
                    f"UPDATE {SOURCE_TABLE} SET gone = 1, updated_at = ? WHERE id = ?",
                    (top + 1 + n, row_id),
                )
            new = [
                (size + n + 1, f"region-{n % regions:03d}", 9.5, top + 1 + n)
                for n in range(len(ids))
            ]
            if self.composite:  # ('A', 1) updated above, ('a', 1) a new key (or, made by
                # an earlier change, updated)
                db.executemany(
                    f"INSERT OR REPLACE INTO {SOURCE_TABLE} SELECT"
                    " CASE tenant WHEN 'a' THEN 'A' ELSE 'a'"
                    f" END, id, ?, 9.5, ?, 0 FROM {SOURCE_TABLE} WHERE id = ?",
                    [(row[1], row[3], row_id) for row_id, row in zip(ids, new, strict=True)],
                )
            else:
                db.executemany(
                    f"INSERT INTO {SOURCE_TABLE} (id, region, amount, updated_at, gone)"
                    " VALUES (?, ?, ?, ?, 0)",
                    new,
                )
            db.commit()

    def merged_rows(self) -> list[tuple]:
        """What a merge route's target must hold: each key's (only) source row, less the
        deleted ones, without the deleted column; sorted."""
        with contextlib.closing(sqlite3.connect(self.source_path)) as db:
            sql = f"SELECT {self._columns} FROM {SOURCE_TABLE} WHERE gone = 0"
            return sorted(db.execute(sql).fetchall())

    def top_cursor(self) -> int:
        with contextlib.closing(sqlite3.connect(self.source_path)) as db:
            return int(db.execute(f"SELECT max(updated_at) FROM {SOURCE_TABLE}").fetchone()[0])

    def window_merged(self, held: list[tuple], *, after: int, upto: int) -> list[tuple]:
        """The rows ``held`` with the source's rows of the cursor window (``after``,
        ``upto``] merged in, as they are now (a key whose row moved past the window keeps its
        ``held`` row): what a retry of that window's batch leaves. Sorted."""
        rows = {row[: len(self.key)]: row for row in held}
        sql = (
            f"SELECT {self._columns}, gone FROM {SOURCE_TABLE}"
            " WHERE updated_at > ? AND updated_at <= ?"
        )
        with contextlib.closing(sqlite3.connect(self.source_path)) as db:
            for *row, gone in db.execute(sql, (after, upto)).fetchall():
                key = tuple(row[: len(self.key)])
                rows.pop(key, None)
                if not gone:
                    rows[key] = tuple(row)
        return sorted(rows.values())

    def target_rows(self) -> list[tuple]:
        """The target's (key, region, amount, updated_at) rows, sorted; [] without a table."""
        sql = f"SELECT {self._columns} FROM {TARGET_TABLE}"
        if self.target == "sqlite":
            if not _sqlite_ids(self.target_path, TARGET_TABLE, "id"):
                return []
            with contextlib.closing(sqlite3.connect(self.target_path)) as db:
                return sorted(db.execute(sql).fetchall())
        if self.target == "duckdb":
            with self._duckdb() as conn:
                if conn is None or not _duckdb_has(conn, TARGET_TABLE):
                    return []
                return sorted(conn.execute(sql).fetchall())
        if self.target == "clickhouse":
            return sorted(self._clickhouse(self._columns))
        if not self.target_ids():
            return []
        return sorted(self._admin(sql.replace(" FROM ", f' FROM "{self.schema}".')))

    def build_source(self, *, rows: int, partitions: int) -> None:
        """The sample source (``build_sample_source``), copied into PostgreSQL for a
        PostgreSQL source; the PostgreSQL target's schema is made here too."""
        build_sample_source(self.source_path, rows=rows, partitions=partitions)
        if self.target != "postgres" and not self.pg_source:
            return
        self._admin(f'CREATE SCHEMA IF NOT EXISTS "{self.schema}"')
        if not self.pg_source:
            return
        key = "bigint" if self.source == "postgres" else "integer"  # bigint: the target's type
        self._admin(
            f'CREATE TABLE "{self.schema}".{SOURCE_TABLE} (id {key} PRIMARY KEY, region text'
            " NOT NULL, amount double precision, updated_at bigint)"
        )
        with contextlib.closing(sqlite3.connect(self.source_path)) as db:
            sample = db.execute(f"SELECT * FROM {SOURCE_TABLE}").fetchall()
        with self._postgres() as conn:
            conn.cursor().executemany(
                f'INSERT INTO "{self.schema}".{SOURCE_TABLE} VALUES (%s, %s, %s, %s)', sample
            )

    def route_text(self, *, store: str, chunk_rows: int, lease_seconds: float) -> str:
        """The route file ``dpone-transfer run`` reads for this case. A PostgreSQL target (and
        source) and a PostgreSQL store are named by environment variables (``run_env``)."""
        if self.pg_source:
            source = (
                f'kind = "postgres"\ndsn = "env:{TARGET_URL_ENV}"\n'
                f'table = "{self.schema}.{SOURCE_TABLE}"\n'
            )
        else:
            source = f'path = "{self.source_path}"\ntable = "{SOURCE_TABLE}"\n'
        if self.target == "postgres":
            target = f'kind = "postgres"\ndsn = "env:{TARGET_URL_ENV}"\n'
        else:
            target = f'kind = "{self.target}"\npath = "{self.target_path}"\n'
        store_path = f"env:{STORE_URL_ENV}" if store.startswith("postgresql://") else store
        strategy = "incremental_append"
        if self.merge:
            strategy = "merge"
            source += f'primary_key = {json.dumps(list(self.key))}\ndeleted_column = "gone"\n'
        return (
            f'[source]\n{source}partition_column = "region"\ncursor_column = "updated_at"\n\n'
            f'[target]\n{target}table = "{self.target_table}"\n\n'
            f'[transfer]\nstrategy = "{strategy}"\npath = "{self.path}"\n'
            f"chunk_rows = {chunk_rows}\n\n"
            f'[store]\npath = "{store_path}"\nlease_seconds = {lease_seconds}\n'
        )

    def run_env(self, store: str) -> dict[str, str]:
        """The environment variables the route file names."""
        env = {TARGET_URL_ENV: self.url} if self.url else {}
        if store.startswith("postgresql://"):
            env[STORE_URL_ENV] = store
        return env

    # --- what the databases hold ----------------------------------------------------------

    def source_ids(self) -> list[int]:
        if self.pg_source:
            rows = self._admin(f'SELECT id FROM "{self.schema}".{SOURCE_TABLE}')
            return sorted(row[0] for row in rows)
        return _sqlite_ids(self.source_path, SOURCE_TABLE, self._key)

    @property
    def _key(self) -> str:
        return ", ".join(self.key)

    def target_ids(self) -> list[Any]:
        """Every key in the target table (an id, or a composite key's tuple), sorted,
        duplicates kept; [] when it does not exist."""
        if self.target == "sqlite":
            return _sqlite_ids(self.target_path, TARGET_TABLE, self._key)
        if self.target == "duckdb":
            with self._duckdb() as conn:
                if conn is None or not _duckdb_has(conn, TARGET_TABLE):
                    return []
                rows = conn.execute(f"SELECT {self._key} FROM {TARGET_TABLE}").fetchall()
                return _keys(rows)
        if self.target == "clickhouse":
            return _keys(self._clickhouse(self._key))
        table = f'"{self.schema}".{TARGET_TABLE}'
        if not self._admin("SELECT to_regclass(%s)", (table,))[0][0]:
            return []
        return _keys(self._admin(f"SELECT {self._key} FROM {table}"))

    def target_partition_ids(self, bounds: Mapping[str, Any]) -> list[int]:
        """The ids the target holds in one partition's ``bounds`` (region and cursor window)."""
        source = set(self._bounded_source_ids(bounds))
        return [row_id for row_id in self.target_ids() if row_id in source]

    def _bounded_source_ids(self, bounds: Mapping[str, Any]) -> list[int]:
        sql, params = f"SELECT id FROM {SOURCE_TABLE} WHERE region = ?", [bounds["partition"]]
        for operator, key in ((">", "cursor_after"), ("<=", "cursor_upto")):
            if bounds.get(key) is not None:
                sql += f" AND updated_at {operator} ?"
                params.append(bounds[key])
        with contextlib.closing(sqlite3.connect(self.source_path)) as db:
            return [row[0] for row in db.execute(sql, params)]

    def source_partition_ids(self, bounds: Mapping[str, Any]) -> list[int]:
        return sorted(self._bounded_source_ids(bounds))

    # --- clients ----------------------------------------------------------------------------

    @contextlib.contextmanager
    def _postgres(self) -> Iterator[Any]:
        import psycopg

        with contextlib.closing(psycopg.connect(str(self.url), autocommit=True)) as conn:
            yield conn

    def _admin(self, sql: str, params: Any = None) -> list[tuple]:
        with self._postgres() as conn:
            cursor = conn.execute(sql, params)
            return cursor.fetchall() if cursor.description else []

    def _clickhouse(self, columns: str) -> list[tuple]:
        """``columns`` of every target row, in a chDB session of its own, closed before it
        returns (a run opens the path); a merge route's table read as a reader must, with
        ``FINAL``; [] without a table."""
        if not self.target_path.is_dir():
            return []
        with self.make_sink().client() as client:
            found = client.query_rows(
                "SELECT engine FROM system.tables WHERE database = currentDatabase()"
                " AND name = {t:String}",
                {"t": TARGET_TABLE},
            )
            if not found:
                return []
            final = " FINAL" if found[0][0] == "ReplacingMergeTree" else ""
            rows = client.query_rows(f"SELECT {columns} FROM {TARGET_TABLE}{final}")
        return [tuple(row) for row in rows]

    @contextlib.contextmanager
    def _duckdb(self) -> Iterator[Any]:
        """A read-write connection (a killed load's WAL is replayed), closed at once after."""
        if not self.target_path.is_file():
            yield None
            return
        import duckdb

        conn = duckdb.connect(str(self.target_path))
        try:
            yield conn
        finally:
            conn.close()

    def drop_postgres_schema(self) -> None:
        if self.target == "postgres" or self.pg_source:
            with self._postgres() as conn:
                conn.execute("SET lock_timeout = '10s'")
                conn.execute(f'DROP SCHEMA IF EXISTS "{self.schema}" CASCADE')


def _duckdb_has(conn: Any, table: str) -> bool:
    found = conn.execute(
        "SELECT count(*) FROM information_schema.tables WHERE lower(table_name) = ?", [table]
    ).fetchone()
    return bool(found[0])


def _keys(rows: list[tuple]) -> list[Any]:
    """Each row's key: its one value, or the tuple of a composite key's; sorted."""
    return sorted(row[0] if len(row) == 1 else tuple(row) for row in rows)


def _sqlite_ids(db: Path, table: str, key: str = "id") -> list[Any]:
    """A read-write connection, so that a hot journal a kill left behind is rolled back."""
    if not db.is_file():
        return []
    with contextlib.closing(sqlite3.connect(db)) as connection:
        sql = "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ? COLLATE NOCASE"
        if connection.execute(sql, (table,)).fetchone() is None:
            return []
        return _keys(connection.execute(f'SELECT {key} FROM "{table}"').fetchall())
