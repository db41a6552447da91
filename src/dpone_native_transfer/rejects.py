"""Quarantine (``[transfer] on_bad_value = "quarantine"``): rows a target cannot hold exactly
are set aside in the target, in the same transaction as their batch, instead of stopping it.

By default (``"refuse"``) a value the target cannot hold exactly stops the run before the
target (``native_transfer_value_unsupported``). With ``"quarantine"`` its row is left out of
the batch and recorded in the table ``_dpone_rejects`` of the target database: the target
table, the batch, the partition (when the row was read partition by partition), a digest of
the row, the column and why; the value itself only with ``quarantine_values = true``. The
batch's ledger row counts them (``LedgerEntry.rejected``); the clean rows load. A row set
aside at the cursor's edge is recorded there as read, so it is not read again; fixed at the
source with a new cursor value, it is loaded by the run whose window holds it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from typing import Any

import attrs

__all__ = ["ON_BAD_VALUE", "REJECTS_TABLE", "Reject", "rejects_table_sql", "write_rejects"]

ON_BAD_VALUE = ("refuse", "quarantine")
REJECTS_TABLE = "_dpone_rejects"
_COLUMNS = ("target_table", "batch_id", "partition_id", "row_digest", "column_name", "reason",
            "value")  # fmt: skip


@attrs.frozen
class Reject:
    """One row set aside: never its values, unless ``value`` was asked for."""

    partition_id: str | None
    row_digest: str
    column: str
    reason: str
    value: str | None = None

    @classmethod
    def of(
        cls, row: tuple, column: str, value: Any, *, partition_id: str | None, target: str,
        keep_value: bool,
    ) -> Reject:  # fmt: skip
        digest = "sha256:" + hashlib.sha256(repr(row).encode()).hexdigest()
        return cls(
            partition_id=partition_id,
            row_digest=digest,
            column=column,
            reason=f"{target} cannot hold the value exactly",
            value=repr(value) if keep_value else None,
        )


def rejects_table_sql(table: str, *, text: str, nullable: str | None = None, tail: str = "") -> str:
    """The CREATE of the rejects table ``table`` (quoted) in an engine's text type (``nullable``:
    its type of a text that may be NULL, where that is another type)."""
    columns = ", ".join(
        f"{name} {nullable or text}"
        if name in ("partition_id", "value")
        else f"{name} {text} NOT NULL"
        for name in _COLUMNS
    )
    return f"CREATE TABLE IF NOT EXISTS {table} ({columns}){tail}"


def write_rejects(
    insert: Callable[[str, Sequence[Sequence[Any]]], object],
    rejects: Sequence[Reject],
    *,
    target_table: str,
    batch_id: str,
    table: str,
    marker: str,
) -> None:
    """Insert the batch's rejects with ``insert(sql, rows)`` (the engine's executemany), in the
    load's transaction; the caller created the table."""
    if not rejects:
        return
    marks = ", ".join([marker] * len(_COLUMNS))
    insert(
        f"INSERT INTO {table} ({', '.join(_COLUMNS)}) VALUES ({marks})",
        [
            (target_table, batch_id, r.partition_id, r.row_digest, r.column, r.reason, r.value)
            for r in rejects
        ],
    )


def rejects_query(table: str, marker: str) -> str:
    """The SELECT of a target table's rejects, in the order they were set aside."""
    return (
        f"SELECT batch_id, partition_id, row_digest, column_name, reason, value FROM {table}"
        f" WHERE target_table = {marker}"
    )
