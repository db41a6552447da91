"""A DAG that copies several tables with dpone: Airflow connections, templating, mapping.

One mapped task per route file (``.expand(route=[...])``); each route file
names only its tables, because the databases come from Airflow connections
(``shop_db``, ``warehouse_db``, ``dpone_store``), which take precedence over
the files' own locations. The route paths are Jinja templates, rendered on the
worker. The tests run this very file under real Airflow (``tests/operator/test_airflow.py``).
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

from airflow.sdk import DAG

from dpone_airflow.operator import NativeTransferOperator

with DAG(
    dag_id="shop_copy",
    schedule="@daily",
    start_date=datetime(2026, 1, 1, tzinfo=UTC),
    catchup=False,
    max_active_runs=1,  # one run of a route at a time: the guard does not exclude workers
    default_args={"retries": 2},  # safe: the guard stops a retry that could append twice
    params={"routes": str(Path(__file__).parent / "routes")},
) as dag:
    NativeTransferOperator.partial(
        task_id="copy",
        source_conn_id="shop_db",
        target_conn_id="warehouse_db",
        store_conn_id="dpone_store",
        max_active_tis_per_dag=1,  # the routes share one SQLite target file
    ).expand(
        route=["{{ params.routes }}/orders.toml", "{{ params.routes }}/customers.toml"],
    )
