"""One dlt run for the benchmark sections, in the benchmark venv that has dlt (never ours).

``python _dlt_child.py REQUEST.json`` loads ``tables`` of ``source`` with ``sql_database``
and the request's ``backend`` into DuckDB or PostgreSQL, as dlt's users do:
``write_disposition="replace"``, or with ``merge`` set (sections 7, 10 and 12 replace;
section 11 merges) incrementally on its ``cursor`` (dlt keeps the cursor in its pipeline
state, in ``work``), the ``delete-insert`` strategy on ``primary_key`` and ``hard_delete`` as
the delete column. It prints a JSON line: the seconds ``pipeline.run`` took and the rows the
target's tables then hold.
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
        pipeline_name=request.get("name", "bench"),
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
    merge = request.get("merge")
    if merge:
        for resource in source.resources.values():
            resource.apply_hints(
                incremental=dlt.sources.incremental(merge["cursor"]),
                primary_key=merge["primary_key"],
                write_disposition={"disposition": "merge", "strategy": "delete-insert"},
                columns={merge["hard_delete"]: {"hard_delete": True}},
            )
    start = time.perf_counter()
    pipeline.run(source, **({} if merge else {"write_disposition": "replace"}))
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
