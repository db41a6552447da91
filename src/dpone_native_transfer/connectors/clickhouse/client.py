"""The client port the ClickHouse sink speaks through, and the choice of adapter by location.

A filesystem path means chDB, the embedded engine, keeping its data at that
path; a ``clickhouse://``, ``http://`` or ``https://`` URL means a server,
reached through clickhouse-connect. Both packages are imported only when a
client is opened, so importing this module needs neither.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any, Protocol
from urllib.parse import urlsplit

import attrs

from ...drivers import import_driver
from ...errors import ConfigInvalid
from ...payloads import Column

__all__ = [
    "CHDB",
    "SERVER",
    "SERVER_SCHEMES",
    "SETTINGS",
    "ClickHouseClient",
    "Location",
    "import_engine",
    "parse_location",
]

CHDB = "chdb"
SERVER = "server"
SERVER_SCHEMES = frozenset({"clickhouse", "http", "https"})

# Applied to every client. One partition per distinct value of the partition column, so a
# load may touch many partitions at once; files and rows carry ISO 8601 dates and times.
SETTINGS: Mapping[str, Any] = {
    "max_partitions_per_insert_block": 0,
    "date_time_input_format": "best_effort",
}


class ClickHouseClient(Protocol):
    """What the sink needs from ClickHouse; parameters are ``{name:Type}`` placeholders."""

    def command(self, sql: str, params: Mapping[str, Any] | None = None) -> None:
        """Run a statement that returns no rows."""

    def query_rows(self, sql: str, params: Mapping[str, Any] | None = None) -> list[tuple]:
        """Run a query; return its rows as tuples of Python values."""

    def insert_rows(
        self,
        table: str,
        columns: Sequence[Column],
        chunks: Iterable[Sequence[tuple]],
        *,
        token: str | None = None,
    ) -> int:
        """Write row chunks of ``columns`` into ``table`` (a quoted reference) as one INSERT;
        return the rows.

        ``token`` is the insert's deduplication token: repeated, the INSERT is a no-op.
        """

    def insert_file(
        self, table: str, columns: Sequence[Column], path: Path, *, token: str | None = None
    ) -> None:
        """``insert_rows`` of the rows of an Arrow stream file ``sql.write_arrow_stream``
        wrote, or chDB pulled (with one more column, its tag), whose digest the caller has
        checked."""

    def close(self) -> None:
        """Release the client; for chDB, the process's hold on the data path."""


@attrs.frozen(repr=False)
class Location:
    """Where the target lives: ``kind`` is ``chdb`` (``target`` a path) or ``server`` (a URL).

    Its repr names only the kind: a URL may carry credentials.
    """

    kind: str
    target: str

    def __repr__(self) -> str:
        return f"Location(kind={self.kind!r})"


def parse_location(location: Any) -> Location:
    """Classify a sink location; a malformed one is ``ConfigInvalid`` that never echoes it."""
    if isinstance(location, os.PathLike):
        location = os.fspath(location)
    if not isinstance(location, str) or not location.strip() or "\x00" in location:
        raise ConfigInvalid(
            "ClickHouse target location must be a filesystem path (chDB) or a "
            "clickhouse://, http:// or https:// URL",
            diagnostics={"key": "location"},
        )
    if "://" in location:
        scheme = location.split("://", 1)[0].lower()
        if scheme not in SERVER_SCHEMES:
            raise ConfigInvalid(
                "ClickHouse target URL scheme must be clickhouse, http or https",
                diagnostics={"key": "location"},
            )
        try:
            parts = urlsplit(location)
            host, _ = parts.hostname, parts.port
        except ValueError:
            host = None
        if not host:
            raise ConfigInvalid(
                "ClickHouse target URL must name a host (and a numeric port, if any)",
                diagnostics={"key": "location"},
            )
        return Location(SERVER, location)
    if "?" in location:
        raise ConfigInvalid(
            "a chDB data path must not contain '?': chDB reads what follows as options",
            diagnostics={"key": "location"},
        )
    return Location(CHDB, os.path.abspath(location))


def import_engine(module: str) -> ModuleType:
    """Import chDB or clickhouse-connect; missing, it is a ConfigInvalid naming the extra."""
    return import_driver(module, needed_by="the ClickHouse sink", key="location")
