"""ClickHouse target: ``ClickHouseSink`` over a small client port with two adapters.

A filesystem path means chDB (the embedded engine, data at that path); a
``clickhouse://`` or ``http(s)://`` URL means a server via clickhouse-connect.
Neither package is imported until a client is opened (extra ``clickhouse``).
"""

from __future__ import annotations

from .client import ClickHouseClient, Location, parse_location
from .sink import ClickHouseSink, open_client

__all__ = ["ClickHouseClient", "ClickHouseSink", "Location", "open_client", "parse_location"]
