"""An Airflow DAG that copies ``orders`` with dpone, hourly, with Airflow's own retries.

Copy this file into your DAGs folder and its route file into ``routes/``
next to it (the route is read by the task on the worker, not when the DAG is
parsed). The tests run this very file under real Airflow
(``tests/operator/test_airflow.py``), so it cannot drift from the code.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

from airflow.sdk import DAG

from dpone_airflow.operator import NativeTransferOperator

ROUTES = Path(__file__).parent / "routes"

with DAG(
    dag_id="orders_copy",
    schedule="@hourly",
    start_date=datetime(2026, 1, 1, tzinfo=UTC),
    catchup=False,
    max_active_runs=1,  # one run of a route at a time: the guard does not exclude workers
    default_args={"retries": 2},  # safe: the guard stops a retry that could append twice
) as dag:
    NativeTransferOperator(task_id="copy_orders", route=ROUTES / "orders.toml")
