"""The limit of a PostgreSQL source into DuckDB (issue 47): connectorx -> Arrow -> DuckDB, in
the benchmark venv that has connectorx (dlt's; never ours).

``python _connectorx_child.py REQUEST.json`` reads each of ``tables`` (``schema.table``) of
the server at ``url`` with ``connectorx.read_sql(return_type="arrow")``, in turn, and creates
it in the DuckDB file ``target`` from that Arrow table; nothing else (no state, no guard).
It prints a JSON line: the seconds and the rows the target's tables then hold.
"""

from __future__ import annotations

import json
import sys
import time


def main() -> None:
    request = json.loads(open(sys.argv[1]).read())
    import connectorx
    import duckdb

    start = time.perf_counter()
    target = duckdb.connect(request["target"])
    try:
        for number, table in enumerate(request["tables"]):
            query = f"SELECT * FROM {table}"
            rows = connectorx.read_sql(request["url"], query, return_type="arrow")
            target.register("rows", rows)
            target.execute(f"CREATE TABLE t{number} AS SELECT * FROM rows")
            target.unregister("rows")
        seconds = time.perf_counter() - start
        loaded = sum(
            target.execute(f"SELECT count(*) FROM t{n}").fetchone()[0]
            for n in range(len(request["tables"]))
        )
    finally:
        target.close()
    print(json.dumps({"seconds": seconds, "rows": loaded}))


if __name__ == "__main__":
    main()
