"""One dlt merge run for the merge section, in the benchmark venv that has dlt.

``python _dlt_merge_child.py REQUEST.json`` reads the SQLite source's ``orders`` table
incrementally on ``updated_at`` (dlt keeps the cursor in its pipeline state, in ``work``)
and merges it into DuckDB or PostgreSQL as dlt's users do: ``write_disposition`` merge
with the ``delete-insert`` strategy, ``primary_key="id"``, and ``is_deleted`` as the
``hard_delete`` column. It prints a JSON line: the seconds ``pipeline.run`` took and the
rows the target table then holds.
"""

from __future__ import annotations

import json
import os
import sys
import time


def main() -> None:
    request = json.loads(open(sys.argv[1]).read())
    os.environ["DLT_DATA_DIR"] = request["work"]
    os.environ["RUNTIME__LOG_LEVEL"] = "WARNING"
    import dlt
    from dlt.sources.sql_database import sql_table

    if request["destination"] == "duckdb":
        destination = dlt.destinations.duckdb(request["target"])
    else:
        destination = dlt.destinations.postgres(request["target"])
    pipeline = dlt.pipeline(
        pipeline_name="bench_merge",
        destination=destination,
        dataset_name=request["dataset"],
        pipelines_dir=os.path.join(request["work"], "pipelines"),
    )
    orders = sql_table(
        credentials=request["source"],
        table="orders",
        incremental=dlt.sources.incremental("updated_at"),
        backend="pyarrow",
    )
    orders.apply_hints(
        primary_key="id",
        write_disposition={"disposition": "merge", "strategy": "delete-insert"},
        columns={"is_deleted": {"hard_delete": True}},
    )
    start = time.perf_counter()
    pipeline.run(orders)
    seconds = time.perf_counter() - start
    table = f'"{request["dataset"]}"."orders"'
    if request["destination"] == "duckdb":
        import duckdb

        with duckdb.connect(request["target"], read_only=True) as conn:
            rows = conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0]
    else:
        import psycopg2

        with psycopg2.connect(request["target"]) as conn, conn.cursor() as cursor:
            cursor.execute(f"SELECT count(*) FROM {table}")
            rows = cursor.fetchone()[0]
    print(json.dumps({"seconds": seconds, "rows": rows, "dlt": dlt.__version__}))


if __name__ == "__main__":
    main()
