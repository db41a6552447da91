"""SQL text the engine connectors share: quoted identifiers and one partition's WHERE condition.

SQLite, DuckDB and PostgreSQL quote identifiers the same way (double
quotes, doubled inside), so one rule serves all three. Values never become
SQL text: a condition comes with its parameters.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from ..errors import ConfigInvalid
from ..identity import fold_ascii
from ..payloads import UPTO_OR_NULL, Predicate, bound_predicates

__all__ = ["WINDOW_OPERATORS", "bounds_where", "quote", "render_predicates"]


def quote(name: Any) -> str:
    """Quote an identifier; NUL cannot be quoted, so it is a configuration error."""
    if not isinstance(name, str) or not name or "\x00" in name:
        raise ConfigInvalid("identifier must be a non-empty string without NUL characters")
    return '"' + name.replace('"', '""') + '"'


# The runtime's own tables in a target database (its ledger, staging tables) start so.
RESERVED_PREFIX = "_dpone_"


def check_target_table(table: Any) -> None:
    """Refuse a target table the runtime could mistake for one of its own (any ASCII case).

    A target named ``_dpone_stage_orders`` would be dropped as the staging table
    of ``orders``; one named ``_dpone_ledger`` would be written as the ledger.
    """
    quote(table)
    if fold_ascii(table).startswith(RESERVED_PREFIX):
        raise ConfigInvalid(
            f"target table {table!r} starts with {RESERVED_PREFIX!r}, which is reserved for "
            "dpone's own tables (the ledger and staging tables); choose another name",
            diagnostics={"key": "target.table"},
        )


_COMPARISONS = frozenset({"=", ">", "<="})
# The operators of a cursor window; the others select a partition value.
WINDOW_OPERATORS = frozenset({">", "<=", UPTO_OR_NULL})


def bounds_where(
    bounds: Mapping[str, Any],
    *,
    partition_column: str,
    cursor_column: str | None,
    marker: str,
    name: Callable[[str], str] = quote,
) -> tuple[str, list[Any]]:
    """The condition selecting one partition's rows, with ``marker`` placeholders, and its values.

    Bad bounds raise ``ConfigInvalid`` from ``payloads.bound_predicates``.
    """
    predicates = bound_predicates(
        bounds, partition_column=partition_column, cursor_column=cursor_column
    )
    return render_predicates(predicates, marker=marker, name=name)


def render_predicates(
    predicates: Iterable[Predicate], *, marker: str, name: Callable[[str], str] = quote
) -> tuple[str, list[Any]]:
    """``predicates`` joined by AND; ``name`` renders a column (a dialect may need more)."""
    conditions: list[str] = []
    params: list[Any] = []
    for predicate in predicates:
        column = name(predicate.column)
        if predicate.op == "IS NULL":
            conditions.append(f"{column} IS NULL")
        elif predicate.op == UPTO_OR_NULL:
            conditions.append(f"({column} <= {marker} OR {column} IS NULL)")
            params.append(predicate.value)
        elif predicate.op in _COMPARISONS:
            conditions.append(f"{column} {predicate.op} {marker}")
            params.append(predicate.value)
        else:
            raise ConfigInvalid("a partition bound uses an operator this connector cannot render")
    return " AND ".join(conditions), params
