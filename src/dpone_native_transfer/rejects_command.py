"""``dpone-transfer rejects show ROUTE_FILE``: the rows a route set aside (quarantine). Reads only.

Each row the target could not hold exactly, under ``on_bad_value = "quarantine"``, is in
the target's ``_dpone_rejects`` table: its batch, partition, a digest of the row, the column
and why, and its value only where the route keeps values (``quarantine_values``).
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from .pipeline import load_route
from .reporting import EXIT_OK, plural

__all__ = ["add_rejects_command"]

_KEYS = ("batch_id", "partition_id", "row_digest", "column", "reason", "value")


def add_rejects_command(commands: Any, common: argparse.ArgumentParser) -> None:
    rejects = commands.add_parser(
        "rejects",
        help='the rows a route set aside in its target (on_bad_value = "quarantine")',
        description="Rows a target could not hold exactly, set aside in its _dpone_rejects "
        "table instead of stopping the run.",
    )
    actions = rejects.add_subparsers(
        title="actions", dest="action", metavar="ACTION", required=True
    )
    show = actions.add_parser(
        "show",
        parents=[common],
        help="list the rows set aside in the target table of ROUTE_FILE (reads only)",
        description="List the rows set aside in the target table of ROUTE_FILE, by any "
        "route writing it, oldest first: batch, partition, a digest of the row, the column "
        "and why (the value only with quarantine_values = true). A row fixed and loaded "
        "since stays listed under the batch that set it aside.",
    )
    show.add_argument("route_file", metavar="ROUTE_FILE", help="the route file (TOML)")
    show.add_argument("--json", action="store_true", help="one JSON array")
    show.set_defaults(handler=_show)


def _show(args: argparse.Namespace) -> int:
    config = load_route(args.route_file, argument="ROUTE_FILE")
    found = [dict(zip(_KEYS, row, strict=True)) for row in config.sink.read_rejects()]
    if args.json:
        print(json.dumps(found, sort_keys=True, default=str))
        return EXIT_OK
    print(
        f"route {config.route.label}: {plural(len(found), 'row')} set aside in its target "
        "table (by any route writing it)"
    )
    for item in found:
        value = "" if item["value"] is None else f"  value {item['value']}"
        print(
            f"  batch {item['batch_id']}  partition {item['partition_id'] or '-'}  "
            f"row {item['row_digest']}  column {item['column']!r}: {item['reason']}{value}"
        )
    return EXIT_OK
