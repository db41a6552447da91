"""One dlt run for the peers section, in the benchmark venv that has dlt (never ours).

``python _dlt_child.py SOURCE.db TABLE TARGET.duckdb WORKDIR`` loads the table
with ``sql_database``'s pyarrow backend into DuckDB and prints a JSON line:
the seconds ``pipeline.run`` took and the rows the target table then holds.
"""

from __future__ import annotations

import json
import os
import sys
import time


def main() -> None:
    source, table, target, work = sys.argv[1:5]
    os.environ["DLT_DATA_DIR"] = work
    os.environ["RUNTIME__LOG_LEVEL"] = "WARNING"
    import dlt
    from dlt.sources.sql_database import sql_table

    pipeline = dlt.pipeline(
        pipeline_name="bench",
        destination=dlt.destinations.duckdb(target),
        dataset_name="bench",
        pipelines_dir=os.path.join(work, "pipelines"),
    )
    resource = sql_table(credentials=f"sqlite:///{source}", table=table, backend="pyarrow")
    start = time.perf_counter()
    pipeline.run(resource, write_disposition="replace")
    seconds = time.perf_counter() - start
    import duckdb

    with duckdb.connect(target, read_only=True) as conn:
        rows = conn.execute(f'SELECT count(*) FROM bench."{table}"').fetchone()[0]
    print(json.dumps({"seconds": seconds, "rows": rows, "dlt": dlt.__version__}))


if __name__ == "__main__":
    main()
