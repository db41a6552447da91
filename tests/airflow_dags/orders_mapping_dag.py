"""The second DAG of tests/operator/test_airflow.py: the route given as a mapping, and retries=2.

The checkpoint store is PostgreSQL, named by the workers' environment
(``env:DPONE_STORE``), as for tries that may land on different workers. The
source and target live in ``data/`` next to this file; the test copies both
into a fresh Airflow DAGs folder and makes the first try fail before the target.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

from airflow.sdk import DAG

from dpone_airflow.operator import NativeTransferOperator

ROUTE = {
    "source": {
        "path": "source.db",
        "table": "orders",
        "partition_column": "region",
        "cursor_column": "updated_at",
    },
    "target": {"path": "target.db", "table": "orders_copy"},
    "transfer": {"strategy": "incremental_append", "path": "file-artifact", "chunk_rows": 50},
    "store": {"path": "env:DPONE_STORE"},
}

with DAG(
    dag_id="orders_copy_mapping",
    schedule=None,
    start_date=datetime(2026, 1, 1, tzinfo=UTC),
    catchup=False,
    max_active_runs=1,
) as dag:
    NativeTransferOperator(
        task_id="copy_orders",
        route=ROUTE,
        route_base_dir=str(Path(__file__).parent / "data"),
        retries=2,
    )
