"""A DAG that moves a whole pipeline with dpone: one mapped task per table, spread over workers.

The first task lists the pipeline's tables (it reads the source's catalog, so it
runs on a worker, not while the DAG is parsed); ``copy`` maps one
``NativeTransferOperator`` over them. Each table's task is its own guarded run:
a blocked table fails only its own task, and Airflow retries only it. The
checkpoint store is PostgreSQL (``env:DPONE_STORE``), shared by every worker. The
tests run this very file under real Airflow (``tests/test_airflow.py``).
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

from airflow.sdk import DAG, task

from dpone_airflow.operator import NativeTransferOperator, pipeline_tables

PIPELINE = str(Path(__file__).parent / "pipelines" / "shop.toml")

with DAG(
    dag_id="shop_pipeline",
    schedule="@hourly",
    start_date=datetime(2026, 1, 1, tzinfo=UTC),
    catchup=False,
    max_active_runs=1,  # one run of each table at a time; the lease refuses a second anyway
    default_args={"retries": 2},  # safe: the guard stops a retry that could append twice
) as dag:
    tables = task(pipeline_tables, task_id="tables")(PIPELINE)
    NativeTransferOperator.partial(task_id="copy", pipeline=PIPELINE).expand(table=tables)
