"""SQL text the engine connectors share: quoted identifiers and one partition's WHERE condition.

DuckDB and PostgreSQL quote identifiers exactly as SQLite does (double
quotes, doubled inside), so the one rule of ``connectors.sqlite`` serves all
three. Values never become SQL text: a condition comes with its parameters.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..errors import ConfigInvalid
from ..payloads import bound_predicates
from .sqlite import _quote as quote

__all__ = ["bounds_where", "quote"]

_COMPARISONS = frozenset({"=", ">", "<="})


def bounds_where(
    bounds: Mapping[str, Any],
    *,
    partition_column: str,
    cursor_column: str | None,
    marker: str,
    name: Any = quote,
) -> tuple[str, list[Any]]:
    """The condition selecting one partition's rows, with ``marker`` placeholders, and its values.

    ``name`` renders a column reference (a dialect may need more than quoting).
    Bad bounds raise ``ConfigInvalid`` from ``payloads.bound_predicates``.
    """
    conditions: list[str] = []
    params: list[Any] = []
    for predicate in bound_predicates(
        bounds, partition_column=partition_column, cursor_column=cursor_column
    ):
        column = name(predicate.column)
        if predicate.op == "IS NULL":
            conditions.append(f"{column} IS NULL")
        elif predicate.op in _COMPARISONS:
            conditions.append(f"{column} {predicate.op} {marker}")
            params.append(predicate.value)
        else:
            raise ConfigInvalid("a partition bound uses an operator this connector cannot render")
    return " AND ".join(conditions), params
