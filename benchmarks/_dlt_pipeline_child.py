"""One dlt run of many tables for the pipelines section, in the benchmark venv that has dlt.

``python _dlt_pipeline_child.py REQUEST.json`` loads ``tables`` of the source with
``sql_database(table_names=...)`` and the requested backend into DuckDB or PostgreSQL
(``write_disposition="replace"``) and prints a JSON line: the seconds ``pipeline.run``
took and the rows the target's tables then hold.
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
    from dlt.sources.sql_database import sql_database

    if request["destination"] == "duckdb":
        destination = dlt.destinations.duckdb(request["target"])
    else:
        destination = dlt.destinations.postgres(request["target"])
    pipeline = dlt.pipeline(
        pipeline_name="bench_pipeline",
        destination=destination,
        dataset_name=request["dataset"],
        pipelines_dir=os.path.join(request["work"], "pipelines"),
    )
    source = sql_database(
        credentials=request["source"],
        schema=request.get("schema"),
        table_names=request["tables"],
        backend=request["backend"],
    )
    start = time.perf_counter()
    pipeline.run(source, write_disposition="replace")
    seconds = time.perf_counter() - start
    count = " + ".join(
        f'(SELECT count(*) FROM "{request["dataset"]}"."{t}")' for t in request["tables"]
    )
    if request["destination"] == "duckdb":
        import duckdb

        with duckdb.connect(request["target"], read_only=True) as conn:
            rows = conn.execute(f"SELECT {count}").fetchone()[0]
    else:
        import psycopg2

        with psycopg2.connect(request["target"]) as conn, conn.cursor() as cursor:
            cursor.execute(f"SELECT {count}")
            rows = cursor.fetchone()[0]
    print(json.dumps({"seconds": seconds, "rows": rows, "dlt": dlt.__version__}))


if __name__ == "__main__":
    main()
