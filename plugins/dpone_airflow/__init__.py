"""Apache Airflow adapter: ``NativeTransferOperator`` and the provider metadata Airflow reads.

Outside the runtime domain on purpose: ``dpone_native_transfer`` never imports
Airflow. This package imports nothing itself, because Airflow reads
``provider.py`` while Airflow is itself being imported; only ``operator.py``
imports Airflow. ``task.py`` holds the operator's logic, Airflow-free.
"""

from __future__ import annotations

__all__: list[str] = []
