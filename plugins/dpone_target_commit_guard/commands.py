"""``dpone-transfer guard scan|show|resolve``: the operator's view of guards, and audited repairs.

Found by the CLI through the ``dpone_native_transfer.commands`` entry point,
so the runtime never imports the guard. Argument wiring and printing only:
what blocks and how a repair is written is ``operator.py``.

Output holds route identities, partition ids, statuses, phases, batch ids,
timestamps and (in ``show``) partition bounds: never SQL, row values,
credentials, connector responses or exception text. A command never creates
a checkpoint store: a missing ``--store`` is a usage error (exit 2).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime
from typing import Any

from dpone_native_transfer.checkpoints import (
    PartitionCheckpoint,
    RouteKey,
    Strategy,
    format_timestamp,
)
from dpone_native_transfer.cli import EXIT_BLOCKED, EXIT_FAILED, EXIT_OK, PROG, plural
from dpone_native_transfer.errors import ConfigInvalid
from dpone_native_transfer.stores import open_store

from .operator import (
    Finding,
    Resolution,
    audit_record,
    blocked_partitions,
    inspect_checkpoint,
    resolution_batch,
    select_blocked,
)

__all__ = ["add_guard_command"]

_EPILOG = """\
exit codes:
  0  done; for scan: nothing blocks
  1  failed, or resolve was not confirmed (nothing written)
  2  invalid command line, --store does not exist, or resolve refused (nothing written)
  3  scan: at least one partition blocks its route
"""
_SCAN_HEADERS = ("ROUTE", "PARTITION", "STATUS", "PHASE", "BATCH", "STARTED_AT", "COMPLETED_AT")
_SHOW_HEADERS = (
    "PARTITION",
    "STATUS",
    "GUARD",
    "BATCH",
    "ROWS",
    "STARTED_AT",
    "COMPLETED_AT",
    "BOUNDS",
)
_CONFIRM = ("y", "yes")


def add_guard_command(commands: Any, common: argparse.ArgumentParser) -> None:
    """Entry point of ``dpone_native_transfer.commands``: adds ``guard`` and its three actions."""
    guard = commands.add_parser(
        "guard",
        help="inspect and resolve target-commit guards that block routes (operators)",
        description="""\
Find routes blocked by a target-commit guard (scan), compare their checkpoints
with the target (show), and record an audited resolution once you have
reconciled the target by hand (resolve). Nothing is ever repaired automatically.""",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    actions = guard.add_subparsers(title="actions", dest="action", metavar="ACTION", required=True)
    _add_scan(actions, common)
    _add_show(actions, common)
    _add_resolve(actions, common)


_SCAN = """\
List every partition whose target-commit guard is unresolved or malformed,
on every route of the store (or one --route). Exits 0 when nothing blocks,
3 otherwise."""
_SHOW = """\
Show the latest checkpoint of every partition of one route, with its guard
phase and partition bounds to compare with the target, then the route's
audit records."""
_RESOLVE = """\
After you have checked the target yourself, write a new checkpoint for each
named blocked partition and append one audit record:
  --as committed             the rows are in the target: the next run skips them
  --as failed_before_target  they are not: the next run loads them
Prints what it will write and asks for confirmation unless --yes."""


def _action(
    actions: Any,
    common: argparse.ArgumentParser,
    name: str,
    handler: Any,
    *,
    route_required: bool,
    help: str,
    description: str,
) -> argparse.ArgumentParser:
    """One ``guard`` action with the options they all share: --store and --route."""
    parser = actions.add_parser(
        name,
        parents=[common],
        help=help,
        description=description,
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--store",
        required=True,
        metavar="STORE",
        help="checkpoint store: a SQLite file, a postgresql:// DSN, "
        "or env:NAME to read either from an environment variable",
    )
    parser.add_argument(
        "--route",
        nargs=3,
        required=route_required,
        metavar=("SOURCE", "TARGET", "STRATEGY"),
        help="the route" if route_required else "only this route",
    )
    parser.set_defaults(handler=handler)
    return parser


def _add_scan(actions: Any, common: argparse.ArgumentParser) -> None:
    help = "list every partition whose guard blocks its route (exit 3 if any)"
    scan = _action(
        actions, common, "scan", _scan_command, route_required=False, help=help, description=_SCAN
    )
    scan.add_argument("--json", action="store_true", help="one JSON object per line")


def _add_show(actions: Any, common: argparse.ArgumentParser) -> None:
    help = "the latest checkpoint of every partition of a route, and its audit records"
    _action(
        actions, common, "show", _show_command, route_required=True, help=help, description=_SHOW
    )


def _add_resolve(actions: Any, common: argparse.ArgumentParser) -> None:
    help = "after reconciling the target by hand, record what it holds (audited)"
    resolve = _action(
        actions,
        common,
        "resolve",
        _resolve_command,
        route_required=True,
        help=help,
        description=_RESOLVE,
    )
    which = resolve.add_mutually_exclusive_group(required=True)
    which.add_argument(
        "--partition",
        action="append",
        default=[],
        metavar="ID",
        help="a blocked partition id (repeatable)",
    )
    which.add_argument("--batch", metavar="BATCH_ID", help="every blocked partition of this batch")
    resolve.add_argument(
        "--as",
        dest="resolved_as",
        required=True,
        choices=[r.value for r in Resolution],
        help="committed: the rows are in the target; failed_before_target: they are not",
    )
    resolve.add_argument("--reason", required=True, type=_text, metavar="TEXT", help="why")
    resolve.add_argument("--operator", required=True, type=_text, metavar="NAME", help="who")
    resolve.add_argument(
        "--force-invalid",
        action="store_true",
        help="also resolve partitions whose guard is malformed",
    )
    resolve.add_argument("--yes", action="store_true", help="do not ask for confirmation")


def _text(value: str) -> str:
    if not value.strip():
        raise argparse.ArgumentTypeError("must not be empty")
    return value


# handlers -----------------------------------------------------------------------------


def _scan_command(args: argparse.Namespace) -> int:
    with _opened(args.store) as store:
        routes = _stored(store, _route(args.route)) if args.route else store.list_routes()
        # list(): unlike a run's scan, the operator's decodes and validates every payload
        findings = [
            f for route in routes for f in blocked_partitions(list(store.list_latest(route)))
        ]
    if args.json:
        for finding in findings:
            print(json.dumps(finding.as_dict(), sort_keys=True))
        print(_scan_summary(findings, routes), file=sys.stderr)
    else:
        _print_table(_SCAN_HEADERS, [_scan_row(f) for f in findings])
        print(_scan_summary(findings, routes))
    return EXIT_BLOCKED if findings else EXIT_OK


def _scan_summary(findings: Sequence[Finding], routes: Sequence[RouteKey]) -> str:
    if not findings:
        return f"nothing blocks: no unresolved or malformed guard on {plural(len(routes), 'route')}"
    return (
        f"{plural(len(findings), 'blocked partition')} on {len({f.route for f in findings})} "
        f"of {plural(len(routes), 'route')}; compare them with the target (`{PROG} guard "
        f"show`), then record what it holds with `{PROG} guard resolve`"
    )


def _scan_row(finding: Finding) -> tuple[str, ...]:
    return (finding.route.label, *_guard_cells(finding, "malformed:"), *_times(finding))


def _guard_cells(finding: Finding, malformed: str) -> tuple[str, str, str, str]:
    """Partition id, status, guard label, batch id."""
    guard = finding.guard_label(malformed)
    return (finding.partition_id, finding.status.value, guard, finding.batch_id or "-")


def _times(finding: Finding) -> tuple[str, str]:
    return (
        format_timestamp(finding.started_at) or "-",
        format_timestamp(finding.completed_at) or "-",
    )


def _show_command(args: argparse.Namespace) -> int:
    with _opened(args.store) as store:
        shown = [
            (route, list(store.list_latest(route)), store.list_audit(route))  # read while open
            for route in _stored(store, _route(args.route))
        ]
    for route, latest, audit in shown:
        findings = [inspect_checkpoint(cp) for cp in latest]
        blocked = sum(f.blocked for f in findings)
        print(
            f"route {route.label}{_where(route)}: {plural(len(latest), 'partition')}, "
            f"{blocked} blocked"
        )
        rows = [_show_row(cp, f) for cp, f in zip(latest, findings, strict=True)]
        _print_table(_SHOW_HEADERS, rows)
        print(f"audit: {plural(len(audit), 'record')}")
        for record in audit:
            _print_audit(record)
    return EXIT_OK


def _where(route: RouteKey) -> str:
    """The databases of a located route (credential-free locations), for operators."""
    if not route.located:
        return " (stored without locations)"
    return f" (source {route.source_location}, target {route.target_location})"


def _show_row(checkpoint: PartitionCheckpoint, finding: Finding) -> tuple[str, ...]:
    bounds = json.dumps(checkpoint.partition_bounds, sort_keys=True, separators=(",", ":"))
    rows = f"{checkpoint.rows_exported:,}"
    return (*_guard_cells(finding, "malformed: "), rows, *_times(finding), bounds)


def _print_audit(record: dict[str, Any]) -> None:
    print(
        f"  #{record['audit_id']} {record['at']} {record['operator']} resolved "
        f"{plural(len(record['partitions']), 'partition')} as {record['resolved_as']}"
        f"{' (forced over a malformed guard)' if record['forced_invalid'] else ''}: "
        f"{record['reason']}"
    )
    for item in record["partitions"]:
        print(f"    {_transition(item)}")


def _transition(item: dict[str, Any]) -> str:
    before = item["previous_phase"] or f"malformed:{item['previous_problem']}"
    return (
        f"{item['partition_id']}  {item['previous_status']}/{before} -> "
        f"{item['new_status']}/{item['new_phase']}  batch {item['batch_id']}"
    )


def _resolve_command(args: argparse.Namespace) -> int:
    resolved_as = Resolution(args.resolved_as)
    with _opened(args.store) as store:
        route = _blocked_route(store, _route(args.route))
        selected = select_blocked(
            store.list_latest(route),
            partition_ids=args.partition,
            batch_id=args.batch,
            force_invalid=args.force_invalid,
        )
        now = datetime.now(UTC)
        resolved = resolution_batch(selected, resolved_as, now)
        audit = audit_record(
            route,
            selected,
            resolved,
            resolved_as=resolved_as,
            operator=args.operator,
            reason=args.reason,
            now=now,
        )
        print(f"route {route.label}: resolve as {resolved_as.value}")
        for item in audit["partitions"]:
            print(f"  {_transition(item)}")
        if not (args.yes or _confirmed(len(resolved))):
            print("nothing written", file=sys.stderr)
            return EXIT_FAILED
        audit_id = store.apply_resolution(route, resolved, audit)
    print(f"wrote {plural(len(resolved), 'checkpoint')} and audit record #{audit_id}")
    return EXIT_OK


def _confirmed(count: int) -> bool:
    """Ask on stdin; anything but y/yes, an empty line or no stdin at all, is a no."""
    print(f"Write {plural(count, 'checkpoint')} and one audit record? [y/N] ", end="", flush=True)
    answer = sys.stdin.readline() if sys.stdin is not None else ""
    if not (answer.endswith("\n") and sys.stdin.isatty()):
        print()  # the answer was not echoed: end the prompt line
    return answer.strip().lower() in _CONFIRM


# helpers ------------------------------------------------------------------------------


@contextlib.contextmanager
def _opened(location: str) -> Iterator[Any]:
    """An existing store, closed afterwards; a missing SQLite file is refused, never created."""
    store = open_store(location, create=False, argument="--store")
    try:
        yield store
    finally:
        store.close()


def _stored(store: Any, named: RouteKey) -> list[RouteKey]:
    """The store's routes with these table names and strategy: one per pair of databases.

    A name that is in no route stands for itself (its reads then find nothing).
    """
    return [route for route in store.list_routes() if route.as_dict() == named.as_dict()] or [
        named
    ]


def _blocked_route(store: Any, named: RouteKey) -> RouteKey:
    """The one stored route of these names that is blocked; refuses when several are."""
    routes = _stored(store, named)
    blocked = [route for route in routes if blocked_partitions(store.list_latest(route))]
    if len(blocked) > 1:
        where = "; ".join(f"{route.label}{_where(route)}" for route in blocked)
        raise ConfigInvalid(
            f"{len(blocked)} routes with these table names are blocked, in different "
            f"databases ({where}); nothing was written: resolve them one at a time with "
            "their route file",
            diagnostics={"key": "--route", "routes": [route.as_dict() for route in blocked]},
        )
    return (blocked or routes)[0]


def _route(values: Sequence[str]) -> RouteKey:
    source, target, strategy = values
    if strategy not in Strategy._value2member_map_:
        known = ", ".join(s.value for s in Strategy)
        raise ConfigInvalid(
            f"--route STRATEGY must be one of: {known}", diagnostics={"key": "--route"}
        )
    if not source or not target:
        raise ConfigInvalid(
            "--route SOURCE and TARGET must not be empty", diagnostics={"key": "--route"}
        )
    return RouteKey(source, target, strategy)


def _print_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> None:
    if not rows:
        return
    widths = [max(len(row[i]) for row in (headers, *rows)) for i in range(len(headers))]
    for row in (headers, *rows):
        cells = (cell.ljust(width) for cell, width in zip(row, widths, strict=True))
        print("  ".join(cells).rstrip())
