"""The optional engine drivers, and the PostgreSQL connection settings stores and sources share.

The core needs only pluggy and attrs: each driver is an extra, imported when a
connector or store first connects, so a missing one is a ``ConfigInvalid``
naming the extra to install, never an ``ImportError``.
"""

from __future__ import annotations

import importlib
import os
from types import ModuleType
from typing import Any

from .errors import ConfigInvalid

__all__ = [
    "CONNECT_TIMEOUT_SECONDS",
    "EXTRAS",
    "POSTGRES_SCHEMES",
    "import_driver",
    "install_hint",
    "postgres_connect",
    "resolve_env",
]

# the module each optional extra installs
EXTRAS = {"psycopg": "postgres", "duckdb": "duckdb", "chdb": "clickhouse"}
EXTRAS["clickhouse_connect"] = "clickhouse"

POSTGRES_SCHEMES = ("postgresql://", "postgres://")
CONNECT_TIMEOUT_SECONDS = 10  # used when the DSN sets no connect_timeout (libpq waits forever)


def install_hint(extra: str) -> str:
    return f"pip install 'dpone-native-transfer[{extra}]'"


def import_driver(module: str, *, needed_by: str, key: str = "driver") -> ModuleType:
    """``module`` (``"chdb.session"``: a submodule), or ``ConfigInvalid`` naming its extra."""
    package = module.split(".")[0]
    try:
        return importlib.import_module(module)
    except ImportError:
        raise ConfigInvalid(
            f"{needed_by} needs the {package} package: {install_hint(EXTRAS[package])}",
            diagnostics={"key": key, "package": package},
        ) from None


def postgres_connect(driver: Any, dsn: str, *, what: str) -> Any:
    """Connect to ``dsn`` outside autocommit, with a connect timeout unless the DSN sets one.

    A DSN the driver cannot parse is ``ConfigInvalid`` naming ``what`` (the
    parser's message quotes the DSN, password included, so it is dropped); the
    driver's own connection errors are raised for the caller to translate.
    """
    params = None
    if isinstance(dsn, str):
        try:
            params = driver.conninfo.conninfo_to_dict(dsn)
        except driver.Error:
            params = None
    if params is None:
        raise ConfigInvalid(f"the {what} DSN cannot be parsed", diagnostics={"key": "dsn"})
    extra = {} if "connect_timeout" in params else {"connect_timeout": CONNECT_TIMEOUT_SECONDS}
    return driver.connect(dsn, autocommit=False, **extra)


def resolve_env(location: str, *, argument: str) -> str:
    """``location``, or the value of the environment variable it names as ``env:NAME``.

    Errors name ``argument`` and the variable, never a value: it may hold a password.
    """
    if not location.startswith("env:"):
        return location
    variable = location.removeprefix("env:")
    value = os.environ.get(variable, "")
    if not value:
        named = {"argument" if argument.startswith("-") else "key": argument}
        raise ConfigInvalid(
            f"{argument} names environment variable {variable!r}, which is not set",
            diagnostics=named,
        )
    return value
