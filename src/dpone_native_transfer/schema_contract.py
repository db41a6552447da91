"""Schema contracts: what a run does when the source's columns and the target table's differ.

Checked before the target mutation, outside the armed window, so a
difference never blocks a route. ``evolve`` (the default) adds a new source
column to the target table, with the type the sink maps its kind to, and
loads NULL into a target column the source no longer has; ``freeze`` stops the
run on any difference. Under both, a column whose target type cannot hold the
source's values (the source column was retyped) stops the run, and so does a target
column the source lacks that takes no NULL and has no default (every insert would fail
inside the target call, and block the route). Modelled on
dlt's schema contracts; the name leaves ``schema`` free for the target's
database schema.
"""

from __future__ import annotations

from collections.abc import Sequence

from .checkpoints import RouteKey, Strategy
from .connectors.contract import Sink
from .errors import SchemaChanged
from .payloads import Column

__all__ = ["apply_schema_contract"]


def apply_schema_contract(
    route: RouteKey, sink: Sink, columns: Sequence[Column], contract: str
) -> list[str]:
    """Make the target table take ``columns`` under ``contract``; returns the columns added.

    A target table that does not exist yet is left to the load (which creates the
    table from ``columns``).
    """
    difference = sink.column_difference(columns)
    if not difference:
        return []
    added, dropped, retyped = difference.added, difference.dropped, difference.retyped
    if difference.unwritable:  # either contract: every insert would fail in the target call
        raise SchemaChanged(
            f"route {route.label}: the target table's column(s) "
            f"{_names(difference.unwritable)} take no value from an insert (computed by the "
            "table: generated, identity or materialized; or of a type made by hand that the "
            "load's type cannot be assigned to), and the source has such a column; nothing "
            "was written. Load into a table where they are ordinary columns",
            diagnostics={"route": route.as_dict(), "columns": difference.unwritable,
                         "contract": contract},
        )  # fmt: skip
    if retyped:  # either contract: the engine would convert the values, or fail in the call
        fix = (
            "Drop the target table: this route, a full refresh, makes it again with the "
            "source's types as it loads every row"
            if route.strategy is Strategy.FULL_REFRESH
            else "Alter the target table, or put the old type back"
        )
        raise SchemaChanged(
            f"route {route.label}: the target table's type of column(s) {_names(retyped)} "
            "cannot hold every value of the source column's type (the source column was "
            f"retyped, or the table was made with a narrower type); nothing was written. {fix}",
            diagnostics={"route": route.as_dict(), "columns": retyped, "contract": contract},
        )
    if difference.required:  # either contract: no row could be inserted without them
        raise SchemaChanged(
            f"route {route.label}: the target table's column(s) {_names(difference.required)} "
            "take no NULL and have no default, and the source has no such column, so no row "
            "could be inserted; nothing was written. Give them a default or allow NULL there, "
            "or load another table",
            diagnostics={"route": route.as_dict(), "columns": difference.required,
                         "contract": contract},
        )  # fmt: skip
    if contract == "freeze":
        names = [column.name for column in added] + list(dropped)
        raise SchemaChanged(
            f"route {route.label}: the source's columns differ from the target table's "
            f"(new in the source: {_names([c.name for c in added])}; gone from the source: "
            f"{_names(dropped)}) and the route's schema_contract is freeze; nothing was "
            'written. Change the target table, or set [transfer] schema_contract = "evolve"',
            diagnostics={"route": route.as_dict(), "columns": names, "contract": contract},
        )
    if added:
        sink.add_columns(added)
    return [column.name for column in added]


def _names(names: Sequence[str]) -> str:
    return ", ".join(names) if names else "none"
