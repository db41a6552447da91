"""Server adapter: a ClickHouse server through clickhouse-connect (HTTP interface).

UNVERIFIED: no test runs against a real server (docs/connectors.md, "The server route is
UNVERIFIED").
The driver's automatic query retries are turned off, so an INSERT is never
re-sent behind the guard's back.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from ...payloads import Column
from .client import SETTINGS, import_engine
from .sql import dedup_token, encode_json_rows, quote, read_arrow_stream

__all__ = ["ServerClient"]


class ServerClient:
    """clickhouse-connect client for one URL; server-side ``{name:Type}`` parameters."""

    def __init__(self, url: str) -> None:
        driver = import_engine("clickhouse_connect")
        self._client = driver.get_client(
            dsn=url, settings=dict(SETTINGS), query_retries=0, autogenerate_session_id=False
        )

    def command(self, sql: str, params: Mapping[str, Any] | None = None) -> None:
        self._client.command(sql, parameters=dict(params) if params else None)

    def query_rows(self, sql: str, params: Mapping[str, Any] | None = None) -> list[tuple]:
        result = self._client.query(sql, parameters=dict(params) if params else None)
        return [tuple(row) for row in result.result_rows]

    def insert_rows(
        self,
        table: str,
        columns: Sequence[Column],
        chunks: Iterable[Sequence[tuple]],
        *,
        token: str | None = None,
    ) -> int:
        counted = [0]

        def blocks() -> Iterator[bytes]:
            for chunk in chunks:
                counted[0] += len(chunk)
                if data := encode_json_rows(chunk):
                    yield data

        self._client.raw_insert(
            table,
            [quote(column.name) for column in columns],
            blocks(),
            settings=_deduplicated(token),
            fmt="JSONCompactEachRow",
        )
        return counted[0]

    def insert_file(
        self, table: str, columns: Sequence[Column], path: Path, *, token: str | None = None
    ) -> None:
        """The file's rows, sent as JSON like ``insert_rows``: the server cannot read it."""
        self.insert_rows(table, columns, read_arrow_stream(path), token=token)

    def close(self) -> None:
        self._client.close()


def _deduplicated(token: str | None) -> dict[str, Any]:
    """The settings ``sql.insert_settings`` gives an INSERT, for clickhouse-connect."""
    return {"insert_deduplication_token": dedup_token(token)}
