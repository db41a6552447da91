"""A many-table source and its pipeline file, for the pipeline tests and the benchmark.

``build_tables`` makes ``count`` tables ``t01``, ``t02``... in a SQLite file (the
sample source's layout: ``id`` INTEGER PRIMARY KEY, ``region``, ``amount``,
``updated_at`` growing with ``id``); ``copy_to_postgres`` copies them into a
PostgreSQL schema. ``write_pipeline`` writes a pipeline file whose tables mix
every strategy, partitioning and path: what each table does is ``PLANS``.
"""

from __future__ import annotations

import json
import sqlite3
from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from dpone_native_transfer.testing import build_sample_source

# Per table number (1-based) modulo 4: the table's own settings in the pipeline file.
PLANS: tuple[dict[str, Any], ...] = (
    {},  # key ranges of id, appending above the highest id loaded (the defaults)
    {"partition_column": "region", "cursor_column": "updated_at", "path": "legacy"},
    {"strategy": "full_refresh", "path": "file-artifact"},
    {"cursor_column": "updated_at", "partition_rows": 40, "path": "lazy-plan"},
)


def table_name(number: int) -> str:
    return f"t{number:02d}"


def build_tables(path: Path, count: int, rows: int, *, start_id: int = 1) -> list[str]:
    names = [table_name(n) for n in range(1, count + 1)]
    for name in names:
        build_sample_source(path, table=name, rows=rows, partitions=4, start_id=start_id)
    return names


def plan_of(name: str) -> dict[str, Any]:
    return PLANS[(int(name[1:]) - 1) % len(PLANS)]


def write_pipeline(
    path: Path,
    *,
    source: Mapping[str, Any],
    target: Mapping[str, Any],
    store: str,
    tables: list[str] | str,
    settings: Mapping[str, Mapping[str, Any]] | None = None,
    defaults: Mapping[str, Any] | None = None,
    lease_seconds: float | None = None,
) -> Path:
    """A pipeline file: ``tables`` (names or patterns) and each table's ``settings``."""
    lease = {} if lease_seconds is None else {"lease_seconds": lease_seconds}
    sections: dict[str, Mapping[str, Any]] = {
        "pipeline": {"tables": [tables] if isinstance(tables, str) else tables},
        "source": source,
        "target": target,
        "store": {"path": store, **lease},
        "defaults": {"strategy": "incremental_append", "path": "staged", **(defaults or {})},
    }
    lines = []
    for name, table in sections.items():
        lines.append(f"[{name}]")
        lines += [f"{key} = {json.dumps(value)}" for key, value in table.items()]
    for name, own in (settings or {}).items():
        lines.append(f"[tables.{json.dumps(name)}]")
        lines += [f"{key} = {json.dumps(value)}" for key, value in own.items()]
    path.write_text("\n".join(lines) + "\n")
    return path


def sqlite_ids(path: Path, table: str) -> Counter[int]:
    with sqlite3.connect(path) as conn:
        found = Counter(row[0] for row in conn.execute(f'SELECT id FROM "{table}"'))
    conn.close()
    return found


def duckdb_ids(path: Path, table: str) -> Counter[int]:
    import duckdb

    conn = duckdb.connect(str(path), read_only=True)
    try:
        return Counter(row[0] for row in conn.execute(f'SELECT id FROM "{table}"').fetchall())
    finally:
        conn.close()


def postgres_ids(dsn: str, table: str) -> Counter[int]:
    import psycopg

    schema, _, name = table.rpartition(".")
    relation = f'"{schema}"."{name}"' if schema else f'"{name}"'
    with psycopg.connect(dsn) as conn:
        return Counter(row[0] for row in conn.execute(f"SELECT id FROM {relation}"))


def copy_to_postgres(source: Path, dsn: str, schema: str, names: list[str]) -> None:
    """The SQLite tables ``names``, as they are, into ``schema`` (created if missing)."""
    import psycopg

    with psycopg.connect(dsn) as conn, sqlite3.connect(source) as lite:
        conn.execute(f'CREATE SCHEMA IF NOT EXISTS "{schema}"')
        for name in names:
            relation = f'"{schema}"."{name}"'
            conn.execute(
                f"CREATE TABLE IF NOT EXISTS {relation} (id bigint PRIMARY KEY, region text "
                "NOT NULL, amount double precision, updated_at bigint)"
            )
            high = conn.execute(f"SELECT coalesce(max(id), 0) FROM {relation}").fetchone()[0]
            rows = lite.execute(f'SELECT * FROM "{name}" WHERE id > ?', (high,)).fetchall()
            with conn.cursor() as cursor:
                cursor.executemany(f"INSERT INTO {relation} VALUES (%s, %s, %s, %s)", rows)
            conn.execute(f"ANALYZE {relation}")
    lite.close()
