"""Airflow's provider metadata for this package (entry point ``apache_airflow_provider``).

Airflow calls :func:`get_provider_info` while it reads its own configuration,
so this module must import neither Airflow nor the operator: a plain dict only.
"""

from __future__ import annotations

from importlib import metadata
from typing import Any

__all__ = ["OPERATOR_MODULE", "PACKAGE_NAME", "get_provider_info"]

PACKAGE_NAME = "dpone-native-transfer"
OPERATOR_MODULE = "dpone_airflow.operator"
_INTEGRATION = "dpone native transfer"


def get_provider_info() -> dict[str, Any]:
    """The provider dict Airflow validates against its ``provider_info.schema.json``."""
    return {
        "package-name": PACKAGE_NAME,
        "name": "dpone native transfer",
        "description": "Checkpointed, guarded table transfers: NativeTransferOperator runs a "
        "route, and the target-commit guard stops retries from appending rows twice.",
        "versions": [_version()],
        "integrations": [
            {
                "integration-name": _INTEGRATION,
                "external-doc-url": "https://pypi.org/project/dpone-native-transfer/",
                "tags": ["software"],
            }
        ],
        "operators": [{"integration-name": _INTEGRATION, "python-modules": [OPERATOR_MODULE]}],
    }


def _version() -> str:
    try:
        return metadata.version(PACKAGE_NAME)
    except metadata.PackageNotFoundError:  # pragma: no cover - only from a bare source tree
        return "0+unknown"
