"""``dpone-transfer guard scan|show|verify|resolve``: the operator's view of guards, and repairs.

Found by the CLI through the ``dpone_native_transfer.commands`` entry point,
so the runtime never imports the guard. Argument wiring and printing only:
what blocks and how a repair is written is ``policy.py``; what the target's
ledger proves is ``dpone_native_transfer.ledger`` and ``recovery``.

Every action takes ``--store`` (with ``--route`` naming a route by its table
names and strategy) or a route file, whose store, route and target it uses.

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

import attrs

from dpone_native_transfer import (
    LEDGER_BATCH_KEY,
    ConfigInvalid,
    PartitionCheckpoint,
    RouteBusy,
    RouteKey,
    StoreTargetMismatch,
    Strategy,
    TargetUnavailable,
    as_latest,
    format_timestamp,
)
from dpone_native_transfer.audit import audit_problems
from dpone_native_transfer.config import RouteConfig
from dpone_native_transfer.lease import lease_key
from dpone_native_transfer.ledger import (
    APPLIED,
    NOT_APPLIED,
    UNKNOWN,
    LedgerEntry,
    Proof,
    check_store_against_target,
    ledger_overrides,
    live_entries,
)
from dpone_native_transfer.pipeline import load_route
from dpone_native_transfer.recovery import Prover, check_not_leased, operator_lease
from dpone_native_transfer.reporting import (
    EXIT_BLOCKED,
    EXIT_FAILED,
    EXIT_OK,
    PROG,
    declined,
    plural,
)
from dpone_native_transfer.stores import Store, open_store

from .policy import (
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
  0  done; for scan and verify: nothing blocks
  1  failed, resolve was not declined, or an attempt holds the route's lease (nothing written)
  2  invalid command line, --store does not exist, or resolve refused (nothing written)
  3  scan, verify: something blocks the route
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


_VERIFY_HEADERS = (
    "ROUTE", "BATCH", "PARTITIONS", "PHASES", "TARGET", "ROWS", "APPLIED_AT", "HEALS_BY_ITSELF"
)  # fmt: skip


def add_guard_command(commands: Any, common: argparse.ArgumentParser) -> None:
    """Entry point of ``dpone_native_transfer.commands``: adds ``guard`` and its actions."""
    guard = commands.add_parser(
        "guard",
        help="inspect and resolve target-commit guards that block routes (operators)",
        description="""\
Find routes blocked by a target-commit guard (scan), see what the target's
ledger proves about them (verify), compare their checkpoints with the target
(show), and record an audited resolution (resolve), from the ledger's proof
or after reconciling the target by hand. Nothing is repaired automatically.""",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    actions = guard.add_subparsers(title="actions", dest="action", metavar="ACTION", required=True)
    _add_scan(actions, common)
    _add_show(actions, common)
    _add_verify(actions, common)
    _add_resolve(actions, common)


_SCAN = """\
List every partition whose target-commit guard is unresolved or malformed,
on every route of the store (or one route). Exits 0 when nothing blocks,
3 otherwise."""
_SHOW = """\
Show the latest checkpoint of every partition of one route, with its guard
phase and partition bounds to compare with the target, then the route's
audit records."""
_VERIFY = """\
For each blocked batch, what the target's ledger proves: applied (with its
rows and time), not applied, or unknown (no ledger, a target without
transactions, or a target that cannot be read); then whether the store and
the target disagree otherwise. Reads only. Exits 0 when nothing blocks, 3
otherwise. The store does not say where a target is: give the route file
to read the target's ledger (with --store alone, every proof is unknown)."""
_RESOLVE = """\
Write a new checkpoint for each named blocked partition and append one audit
record:
  --from-target              as the target's ledger proves: committed when the
                             batch was applied, failed_before_target when not
  --as committed             the rows are in the target: the next run skips them
  --as failed_before_target  they are not: the next run loads them
An --as that the ledger contradicts is refused unless --force. Refused while
an attempt holds the route's lease, and if a named partition changed since it
was shown. Prints what it will write and asks for confirmation unless --yes."""


def _action(
    actions: Any,
    common: argparse.ArgumentParser,
    name: str,
    handler: Any,
    *,
    help: str,
    description: str,
) -> argparse.ArgumentParser:
    """One ``guard`` action with what they all share: a route file, or --store and --route."""
    parser = actions.add_parser(
        name,
        parents=[common],
        help=help,
        description=description,
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "route_file",
        nargs="?",
        metavar="ROUTE_FILE",
        help="a route file: its store, its route and its target (instead of --route)",
    )
    parser.add_argument(
        "--store",
        metavar="STORE",
        help="checkpoint store: a SQLite file, a postgresql:// DSN, "
        "or env:NAME to read either from an environment variable (default: the route file's)",
    )
    parser.add_argument(
        "--route",
        nargs=3,
        metavar=("SOURCE", "TARGET", "STRATEGY"),
        help="the route, by its table names and strategy",
    )
    parser.set_defaults(handler=handler)
    return parser


def _add_scan(actions: Any, common: argparse.ArgumentParser) -> None:
    help = "list every partition whose guard blocks its route (exit 3 if any)"
    scan = _action(actions, common, "scan", _scan_command, help=help, description=_SCAN)
    scan.add_argument("--json", action="store_true", help="one JSON object per line")


def _add_show(actions: Any, common: argparse.ArgumentParser) -> None:
    help = "the latest checkpoint of every partition of a route, and its audit records"
    show = _action(actions, common, "show", _show_command, help=help, description=_SHOW)
    show.add_argument("--blocked", action="store_true", help="only the blocked partitions")
    show.add_argument(
        "--limit", type=_limit, metavar="N", help="at most N partitions (the first, by id)"
    )
    show.add_argument(
        "--json",
        action="store_true",
        help="one JSON object per partition and line, then one per audit record",
    )


def _add_verify(actions: Any, common: argparse.ArgumentParser) -> None:
    help = "what the target's ledger proves about each blocked batch (exit 3 if any)"
    verify = _action(actions, common, "verify", _verify_command, help=help, description=_VERIFY)
    verify.add_argument("--json", action="store_true", help="one JSON object per line")


def _add_resolve(actions: Any, common: argparse.ArgumentParser) -> None:
    help = "record what the target holds for blocked partitions (audited)"
    resolve = _action(actions, common, "resolve", _resolve_command, help=help, description=_RESOLVE)
    which = resolve.add_mutually_exclusive_group(required=True)
    which.add_argument(
        "--partition",
        action="append",
        default=[],
        metavar="ID",
        help="a blocked partition id (repeatable)",
    )
    which.add_argument("--batch", metavar="BATCH_ID", help="every blocked partition of this batch")
    how = resolve.add_mutually_exclusive_group(required=True)
    how.add_argument(
        "--as",
        dest="resolved_as",
        choices=[r.value for r in Resolution],
        help="committed: the rows are in the target; failed_before_target: they are not",
    )
    how.add_argument(
        "--from-target",
        action="store_true",
        help="as the target's ledger proves; refused where it proves nothing",
    )
    resolve.add_argument("--reason", required=True, type=_text, metavar="TEXT", help="why")
    resolve.add_argument("--operator", required=True, type=_text, metavar="NAME", help="who")
    resolve.add_argument(
        "--force-invalid",
        action="store_true",
        help="also resolve partitions whose guard is malformed",
    )
    resolve.add_argument(
        "--force",
        action="store_true",
        help="resolve with --as even where the target's ledger proves otherwise (recorded)",
    )
    resolve.add_argument("--yes", action="store_true", help="do not ask for confirmation")


def _text(value: str) -> str:
    if not value.strip():
        raise argparse.ArgumentTypeError("must not be empty")
    return value


@attrs.frozen(kw_only=True)
class _Target:
    """What an action works on: the store, and a route file's route or the names of --route."""

    store: str
    named: RouteKey | None = None
    config: RouteConfig | None = None
    argument: str = "--store"  # where the store was given, for its errors

    def routes(self, store: Store) -> list[RouteKey]:
        """The routes meant: the route file's (and its twin stored without locations), or the
        store's routes of the --route names, or every route of the store."""
        known = store.list_routes()
        if self.config is not None:
            route = self.config.route
            return [route, *(r for r in known if r == route.unlocated())]
        if self.named is not None:
            found = [r for r in known if r.as_dict() == self.named.as_dict()]
            if not found:  # a misspelled name must not read as "nothing blocks"
                labels = sorted(route.label for route in known)
                shown = "; ".join(labels[:20]) + (
                    f"; and {len(labels) - 20} more" if len(labels) > 20 else ""
                )
                raise ConfigInvalid(
                    f"the store holds no route {self.named.label}; its routes: "
                    + (shown or "none"),
                    diagnostics={"key": "--route", "known_routes": len(labels)},
                )
            return found
        return known

    def sink(self, route: RouteKey) -> Any:
        """The route's target, to read its ledger: only a route file says where it is, for its
        own route and the others writing its target table (``blocking``)."""
        if self.config is not None and lease_key(route) == lease_key(self.config.route):
            return self.config.sink
        return None

    def blocking(self, store: Store, routes: Sequence[RouteKey]) -> list[RouteKey]:
        """The other routes writing the route file's target table that hold blocked batches:
        a run of its route is refused by them, so ``verify`` of the file shows them too (it
        said "nothing blocks", exit 0, while the run exited 3)."""
        if self.config is None:
            return []
        table = lease_key(self.config.route)
        return [
            route
            for route in store.list_routes()
            if route not in routes
            and lease_key(route) == table
            and blocked_partitions(list(store.list_latest(route)))
        ]

    def prover(self, route: RouteKey, *, epoch: int = 0, advance: bool = False) -> Prover:
        """What the route's target proves; with ``advance``, for a lease of ``epoch``. The
        route file's batch column counts only its own route's rows."""
        config = self.config
        column = None if config is None else config.batch_column
        mine = None if config is None else config.route
        sink = self.sink(route)
        return Prover(sink, epoch=epoch, advance=advance, batch_column=column, batch_route=mine)


def _target(args: argparse.Namespace, *, route_required: bool) -> _Target:
    if args.route_file is not None:
        if args.route is not None:
            raise ConfigInvalid(
                "give a route file or --route, not both", diagnostics={"key": "--route"}
            )
        config = load_route(args.route_file, argument="ROUTE_FILE")
        argument = "--store" if args.store else "store.path"  # else the route file's
        return _Target(store=args.store or config.store_path, config=config, argument=argument)
    if args.store is None:
        raise ConfigInvalid(
            "give a route file, or --store (and --route)", diagnostics={"key": "--store"}
        )
    if args.route is None and route_required:
        raise ConfigInvalid(
            "give a route file, or --route SOURCE TARGET STRATEGY",
            diagnostics={"key": "--route"},
        )
    return _Target(store=args.store, named=None if args.route is None else _route(args.route))


# handlers -----------------------------------------------------------------------------


def _running(store: Store, routes: Sequence[RouteKey]) -> list[RouteKey]:
    """The routes a run holds the lease of: their armed partitions are that run's, under way,
    not blocked (a holder on this host whose process is gone does not count). ``scan`` and
    ``verify`` called them blocked, and ``verify`` opened a DuckDB target under the run,
    whose own open then failed for the lock."""
    running = []
    for route in routes:
        try:
            check_not_leased(store, route)
        except RouteBusy:
            running.append(route)
    return running


def _say_running(running: Sequence[RouteKey]) -> None:
    for route in running:
        print(
            f"in progress: route {route.label}: a run holds its lease; its armed partitions "
            "are that run's, not compared",
            file=sys.stderr,
        )


def _in_progress(running: Sequence[RouteKey]) -> str:
    """The summary's note of the routes ``_running`` left out."""
    return f" ({plural(len(running), 'route')} in progress, not compared)" if running else ""


def _scan_command(args: argparse.Namespace) -> int:
    target = _target(args, route_required=False)
    with _opened(target) as store:
        routes = target.routes(store)
        running = _running(store, routes)
        # list(): unlike a run's scan, the operator's decodes and validates every payload
        findings = [
            f
            for route in routes
            if route not in running
            for f in blocked_partitions(list(store.list_latest(route)))
        ]
    if args.json:
        for finding in findings:
            print(json.dumps(finding.as_dict(), sort_keys=True))
        print(_scan_summary(findings, routes) + _in_progress(running), file=sys.stderr)
    else:
        _print_table(_SCAN_HEADERS, [_scan_row(f) for f in findings])
        print(_scan_summary(findings, routes) + _in_progress(running))
    _say_running(running)
    return EXIT_BLOCKED if findings else EXIT_OK


def _scan_summary(findings: Sequence[Finding], routes: Sequence[RouteKey]) -> str:
    if not findings:
        return f"nothing blocks: no unresolved or malformed guard on {plural(len(routes), 'route')}"
    return (
        f"{plural(len(findings), 'blocked partition')} on {len({f.route for f in findings})} "
        f"of {plural(len(routes), 'route')}; see what the target's ledger proves with "
        f"`{PROG} guard verify`, then record it with `{PROG} guard resolve`"
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
    target = _target(args, route_required=True)
    with _opened(target) as store:
        shown = [
            (route, list(store.list_latest(route)), store.list_audit(route))  # read while open
            for route in target.routes(store)
        ]
    for route, latest, audit in shown:
        findings = [inspect_checkpoint(cp) for cp in latest]
        blocked = sum(f.blocked for f in findings)
        pairs = [
            (cp, f) for cp, f in zip(latest, findings, strict=True) if f.blocked or not args.blocked
        ]
        listed = pairs[: args.limit] if args.limit is not None else pairs
        if args.json:
            for checkpoint, finding in listed:
                bounds = {"partition_bounds": checkpoint.partition_bounds}
                print(
                    json.dumps(
                        {**finding.as_dict(), **bounds, "rows": checkpoint.rows_exported},
                        sort_keys=True,
                        default=str,
                    )
                )
            for record in audit:
                print(json.dumps({"audit": _audit_json(record)}, sort_keys=True, default=str))
            continue
        print(f"route {route.label}: {plural(len(latest), 'partition')}, {blocked} blocked")
        print(f"  {_where(route)}")
        _print_table(_SHOW_HEADERS, [_show_row(cp, f) for cp, f in listed])
        if len(listed) < len(pairs):
            print(f"({len(pairs) - len(listed):,} more not shown: --limit {args.limit})")
        malformed = sum(1 for record in audit if audit_problems(record))
        counted = f", {malformed} malformed" if malformed else ""
        print(f"audit: {plural(len(audit), 'record')}{counted}")
        for record in audit:
            _print_audit(record)
    return EXIT_OK


def _limit(value: str) -> int:
    if not value.isdigit() or int(value) < 1:
        raise argparse.ArgumentTypeError("must be a whole number of at least 1")
    return int(value)


def _where(route: RouteKey) -> str:
    """The databases of a route (credential-free locations), for operators."""
    if not route.located:
        return "stored without locations (written before routes named their databases)"
    return f"source {route.source_location}, target {route.target_location}"


def _show_row(checkpoint: PartitionCheckpoint, finding: Finding) -> tuple[str, ...]:
    bounds = json.dumps(checkpoint.partition_bounds, sort_keys=True, separators=(",", ":"))
    rows = f"{checkpoint.rows_exported:,}"
    return (*_guard_cells(finding, "malformed: "), rows, *_times(finding), bounds)


def _audit_json(record: dict[str, Any]) -> dict[str, Any]:
    """A record as ``show --json`` prints it; a malformed one by its id and bad keys only."""
    problems = audit_problems(record)
    return {"audit_id": record.get("audit_id"), "malformed": problems} if problems else record


def _print_audit(record: dict[str, Any]) -> None:
    """One audit record; a malformed one (written by hand: a key missing or of another type)
    by its id and the bad keys only. Every text is printed escaped, so a newline or an ANSI
    escape in a reason cannot forge lines."""
    problems = audit_problems(record)
    if problems:
        print(
            f"  #{_shown(record.get('audit_id'))} malformed audit record: "
            f"{', '.join(problems)} missing or not as dpone writes them"
        )
        return
    partitions = record["partitions"]
    forced = " (forced over a malformed guard)" if record.get("forced_invalid") else ""
    against = " (forced against the ledger)" if record.get("ledger_overrides") else ""
    print(
        f"  #{_shown(record.get('audit_id'))} {_shown(record.get('at'))} "
        f"{_shown(record.get('operator'))} resolved {plural(len(partitions), 'partition')} as "
        f"{_shown(record.get('resolved_as'))}{forced}{against}: {_shown(record.get('reason'))}"
    )
    for item in partitions:
        print(f"    {_transition(item)}")


def _shown(value: Any) -> str:
    """``value`` as one safe line: control characters escaped, ``?`` when missing."""
    if value is None:
        return "?"
    return json.dumps(str(value), ensure_ascii=False)[1:-1]


def _transition(item: dict[str, Any]) -> str:
    problem = item.get("previous_problem")
    before = item.get("previous_phase") or (f"malformed:{problem}" if problem else "no guard")
    return (
        f"{_shown(item.get('partition_id'))}  {_shown(item.get('previous_status') or 'absent')}"
        f"/{_shown(before)} -> {_shown(item.get('new_status'))}"
        f"/{_shown(item.get('new_phase') or 'no guard')}  batch {_shown(item.get('batch_id'))}"
    )


# verify -------------------------------------------------------------------------------


@attrs.frozen(kw_only=True)
class _BatchProof:
    route: RouteKey
    batch_id: str | None  # None: malformed guards, which name no batch
    findings: tuple[Finding, ...]
    proof: Proof

    def as_dict(self) -> dict[str, Any]:
        return {
            "route": self.route.as_dict(),
            "batch_id": self.batch_id,
            "partition_ids": [f.partition_id for f in self.findings],
            "phases": sorted({f.guard_label() for f in self.findings}),
            "proof": self.proof.as_dict(),
        }

    def row(self) -> tuple[str, ...]:
        rows = "-" if self.proof.rows is None else f"{self.proof.rows:,}"
        return (
            self.route.label,
            self.batch_id or "-",
            str(len(self.findings)),
            ",".join(sorted({f.guard_label() for f in self.findings})),
            self.proof.verdict,
            rows,
            self.proof.applied_at or "-",
            "yes" if self.proof.heals else "no",
        )


def _proofs(
    store: Store, target: _Target, route: RouteKey, prover: Prover | None = None
) -> tuple[list[_BatchProof], list[LedgerEntry] | None, str | None]:
    """Each blocked batch of ``route`` with what the target proves (``prover``: by default,
    reading only), the ledger itself, and why it could not be read (None when it was).

    A partition is grouped by its guard's batch id; for a malformed guard, by the
    ledger batch its checkpoint names or the ledger entry listing the partition.
    """
    latest = {cp.partition_id: cp for cp in store.list_latest(route)}
    prover = prover or target.prover(route)
    entries = prover.entries()
    listed = {
        part.partition_id: entry.batch_id
        for entry in sorted(entries or (), key=lambda entry: entry.seq)
        if entry.of_route(route)
        for part in entry.partitions
    }
    batches: dict[str | None, list[Finding]] = {}
    for finding in blocked_partitions(list(latest.values())):
        pid = finding.partition_id
        batch = finding.batch_id or latest[pid].diagnostics.get(LEDGER_BATCH_KEY) or listed.get(pid)
        batches.setdefault(batch, []).append(finding)
    proofs = []
    for batch_id, items in batches.items():
        if batch_id is None:
            proof = Proof(UNKNOWN, "a malformed guard names no batch")
        else:
            proof = prover.prove(route, batch_id, [latest[f.partition_id] for f in items])
        proofs.append(
            _BatchProof(route=route, batch_id=batch_id, findings=tuple(items), proof=proof)
        )
    return proofs, prover.entries(), prover.reason


def _mismatch(
    store: Store,
    target: _Target,
    route: RouteKey,
    entries: list[LedgerEntry] | None,
    blocked: set[str],
) -> StoreTargetMismatch | None:
    """Section 3's cross-check, as a run would make it once nothing blocks (reads only)."""
    if entries is None or not route.located:
        return None
    try:
        check_store_against_target(
            route,
            as_latest(store.list_target_latest(route)),
            entries,
            overridden=lambda: ledger_overrides(store, route) | blocked,
            target=target.sink(route),
        )
    except StoreTargetMismatch as mismatch:
        return mismatch
    return None


def _verify_command(args: argparse.Namespace) -> int:
    target = _target(args, route_required=False)
    proofs: list[_BatchProof] = []
    mismatches: list[tuple[RouteKey, StoreTargetMismatch]] = []
    unchecked: list[tuple[RouteKey, str]] = []  # a ledger target that could not be read
    miscounted: list[dict[str, Any]] = []  # applied batches the target holds another count of
    with _opened(target) as store:
        routes = target.routes(store)
        routes = [*routes, *target.blocking(store, routes)]
        running = _running(store, routes)
        routes = [route for route in routes if route not in running]
        read = [(route, *_proofs(store, target, route)) for route in routes]
        proofs = [proof for _, found, _, _ in read for proof in found]
        # every route's blocked batch, as a run stops at any of them before the cross-check
        blocked = {p.batch_id for p in proofs if p.batch_id is not None}
        for route, _, entries, reason in read:
            mismatch = _mismatch(store, target, route, entries, blocked)
            if mismatch is not None:
                mismatches.append((route, mismatch))
            sink = target.sink(route)
            ledgered = sink is not None and sink.features.keeps_ledger
            if entries is None and route.located and ledgered:
                unchecked.append((route, reason or "the target cannot be read"))
            miscounted += _miscounted(store, target, route, entries or [])
    if args.json:
        for item in proofs:
            print(json.dumps(item.as_dict(), sort_keys=True))
        for route, mismatch in mismatches:
            print(json.dumps(_mismatch_dict(route, mismatch), sort_keys=True))
        for count in miscounted:
            print(json.dumps(count, sort_keys=True))
        summary = _verify_summary(proofs, mismatches, routes, len(unchecked))
        print(summary + _in_progress(running), file=sys.stderr)
    else:
        _print_table(_VERIFY_HEADERS, [item.row() for item in proofs])
        for item in proofs:
            if item.proof.verdict == UNKNOWN:
                print(f"  {item.batch_id or 'malformed'}: unknown: {item.proof.reason}")
        for _, mismatch in mismatches:
            kind = mismatch.diagnostics.get("mismatch")
            print(f"mismatch: {kind}: {mismatch.code}: {mismatch.message}")
        for count in miscounted:
            print(
                f"count: batch {count['batch_id']}: the ledger records "
                f"{plural(count['ledger_rows'], 'row')}, the target holds {count['target_rows']:,} "
                "of it (its batch column): rows were deleted or added behind dpone's back"
            )
        print(_verify_summary(proofs, mismatches, routes, len(unchecked)) + _in_progress(running))
    for route, reason in unchecked:
        print(
            f"not checked: route {route.label}: store and target were not compared: {reason}; "
            "a run would stop there too",
            file=sys.stderr,
        )
    _say_running(running)
    if proofs or mismatches or miscounted:
        return EXIT_BLOCKED
    return EXIT_FAILED if unchecked else EXIT_OK


def _miscounted(
    store: Store, target: _Target, route: RouteKey, entries: Sequence[LedgerEntry]
) -> list[dict[str, Any]]:
    """Each applied batch of ``route`` whose rows the target holds in another number than its
    ledger row records, where the target can tell: a route with a ``batch_column``."""
    sink, config = target.sink(route), target.config
    column = None if config is None else config.batch_column
    if column is None or config is None or route != config.route:  # not another route's
        return []
    found = []
    for entry in live_entries(entries, ledger_overrides(store, route)):
        if not entry.of_route(route):
            continue
        held = sink.batch_rows(column, entry.batch_id)
        if held != entry.rows:
            found.append({"route": route.as_dict(), "batch_id": entry.batch_id,
                          "ledger_rows": entry.rows, "target_rows": held})  # fmt: skip
    return found


def _mismatch_dict(route: RouteKey, mismatch: StoreTargetMismatch) -> dict[str, Any]:
    return {
        "route": route.as_dict(),
        "mismatch": mismatch.diagnostics.get("mismatch"),
        "code": mismatch.code,
        "batch_ids": mismatch.diagnostics.get("batch_ids", []),
    }


def _verify_summary(
    proofs: Sequence[_BatchProof],
    mismatches: Sequence[tuple[RouteKey, StoreTargetMismatch]],
    routes: Sequence[RouteKey],
    unchecked: int = 0,
) -> str:
    """``unchecked``: routes whose target could not be read (not said to agree)."""
    if not proofs and not mismatches and unchecked:
        return (
            f"no blocked batch; store and target agree on "
            f"{plural(len(routes) - unchecked, 'route')}, and {plural(unchecked, 'route')} "
            "could not be compared (below)"
        )
    if not proofs and not mismatches:
        return (
            f"nothing blocks: no blocked batch and store and target agree on "
            f"{plural(len(routes), 'route')}"
        )
    counts = {
        verdict: sum(p.proof.verdict == verdict for p in proofs)
        for verdict in (APPLIED, NOT_APPLIED, UNKNOWN)
    }
    text = (
        f"{plural(len(proofs), 'blocked batch')} ({counts[APPLIED]} applied, "
        f"{counts[NOT_APPLIED]} not applied, {counts[UNKNOWN]} unknown), "
        f"{plural(len(mismatches), 'store/target mismatch')}"
    )
    if counts[APPLIED] or counts[NOT_APPLIED]:
        text += f"; record what is proven with `{PROG} guard resolve ... --from-target`"
    if counts[UNKNOWN]:
        text += "; compare the rest with the target by hand (`guard show`)"
    return text + "; exit 3"


# resolve ------------------------------------------------------------------------------


def _resolve_command(args: argparse.Namespace) -> int:
    target = _target(args, route_required=True)
    with _opened(target) as store:
        route = _blocked_route(store, target.routes(store))
        check_not_leased(store, route)
        selected = select_blocked(
            list(store.list_latest(route)),
            partition_ids=args.partition,
            batch_id=args.batch,
            force_invalid=args.force_invalid,
        )
        # Proven under the lease: --from-target may raise the target's fence past the blocked
        # attempt (its epoch is below this lease's), which is what proves it absent for good.
        with operator_lease(store, route, operator=args.operator, action="guard resolve") as held:
            prover = (
                target.prover(route, epoch=getattr(held, "epoch", 0), advance=True)
                if args.from_target
                else target.prover(route)  # reads only
            )
            proofs, entries, reason = _proofs(store, target, route, prover)
        if prover.unreadable and args.from_target:
            raise TargetUnavailable(
                f"refusing --from-target: {reason}, so it proves nothing now; nothing was "
                "written; retry when the target can be read",
                diagnostics={"route": route.as_dict(), "key": "--from-target"},
            )
        if prover.unreadable and not args.force:
            raise TargetUnavailable(
                f"refusing --as {args.resolved_as}: {reason}, so the resolution cannot be "
                "checked against it now; nothing was written; retry when the target can be "
                "read, or repeat with --force after checking the target yourself",
                diagnostics={"route": route.as_dict(), "key": "--force"},
            )
        listed = None if entries is None else {e.batch_id for e in entries if e.of_route(route)}
        groups, overrides = _decide(selected, proofs, args, listed)
        now = datetime.now(UTC)
        resolved = [
            checkpoint
            for resolution, items in groups
            for checkpoint in resolution_batch(items, resolution, now)
        ]
        ordered = [item for _, items in groups for item in items]
        chosen = {cp.partition_id for cp, _ in ordered}
        touched = [p for p in proofs if chosen & {f.partition_id for f in p.findings}]
        audit = audit_record(
            route,
            ordered,
            resolved,
            resolved_as="from_target" if args.from_target else args.resolved_as,
            operator=args.operator,
            reason=args.reason,
            now=now,
            proofs={p.batch_id: p.proof.as_dict() for p in touched if p.batch_id},
            overrides=overrides,
        )
        unchecked = any(p.proof.verdict == UNKNOWN for p in touched)
        print(
            f"route {route.label}: resolve as {audit['resolved_as']}"
            + (" (unchecked: the target's ledger proves nothing here)" if unchecked else "")
        )
        for item in audit["partitions"]:
            print(f"  {_transition(item)}")
        if overrides:
            forced = " (--force)" if args.force else ""
            print(f"  against the target's ledger{forced}: {', '.join(overrides)}")

        question = f"Write {plural(len(resolved), 'checkpoint')} and one audit record?"
        if (stop := declined(question, yes=args.yes)) is not None:
            return stop
        with operator_lease(store, route, operator=args.operator, action="guard resolve"):
            audit_id = store.apply_resolution(
                route, resolved, audit, expected=[cp for cp, _ in ordered]
            )
    print(f"wrote {plural(len(resolved), 'checkpoint')} and audit record #{audit_id}")
    return EXIT_OK


def _decide(
    selected: Sequence[tuple[PartitionCheckpoint, Finding]],
    proofs: Sequence[_BatchProof],
    args: argparse.Namespace,
    listed: set[str] | None = None,
) -> tuple[list[tuple[Resolution, list[tuple[PartitionCheckpoint, Finding]]]], list[str]]:
    """How the selected partitions are resolved, and the batches resolved against the ledger
    (``listed``: the batches the target's ledger holds for the route, None unread)."""
    of = {f.partition_id: p for p in proofs for f in p.findings}

    def verdict(item: tuple[PartitionCheckpoint, Finding]) -> str:
        return of[item[1].partition_id].proof.verdict

    if args.from_target:
        unproven = {of[cp.partition_id] for cp, f in selected if verdict((cp, f)) == UNKNOWN}
        if unproven:
            reasons = "; ".join(f"{p.batch_id or 'no batch'}: {p.proof.reason}" for p in unproven)
            raise ConfigInvalid(
                "refusing --from-target: the target's ledger proves nothing about "
                f"{plural(len(unproven), 'batch')} ({reasons}); nothing was written; compare "
                "them with the target by hand and resolve them with --as",
                diagnostics={
                    "key": "--from-target",
                    "batch_ids": sorted(str(p.batch_id) for p in unproven),
                },
            )
        groups = [
            (Resolution.COMMITTED, [item for item in selected if verdict(item) == APPLIED]),
            (
                Resolution.FAILED_BEFORE_TARGET,
                [item for item in selected if verdict(item) == NOT_APPLIED],
            ),
        ]
        unlisted = sorted(
            {
                str(of[cp.partition_id].batch_id)
                for cp, _ in selected
                if of[cp.partition_id].proof.unlisted
            }
        )  # applied by the batch column's count, though the ledger lacks the row
        return [(resolution, items) for resolution, items in groups if items], unlisted
    resolution = Resolution(args.resolved_as)
    contrary = NOT_APPLIED if resolution is Resolution.COMMITTED else APPLIED
    against = sorted(
        {str(of[cp.partition_id].batch_id) for cp, f in selected if verdict((cp, f)) == contrary}
    )
    if against and not args.force:
        raise ConfigInvalid(
            f"refusing --as {resolution.value}: the target's ledger proves "
            f"{plural(len(against), 'batch')} {contrary.replace('_', ' ')} "
            f"({', '.join(against)}); nothing was written; use --from-target, or repeat with "
            "--force after checking the target yourself",
            diagnostics={"key": "--force", "batch_ids": against},
        )
    # committed by hand, a batch the ledger lacks (on ClickHouse its row follows the rows, so a
    # kill between them leaves it out) is recorded against the ledger, as --from-target records
    # one its batch column proves: else the next run refuses the store as ahead of the target
    missing: set[str] = set()
    if resolution is Resolution.COMMITTED and listed is not None:
        batches = {of[cp.partition_id].batch_id for cp, _ in selected}
        missing = {batch for batch in batches if batch is not None} - listed
    return [(resolution, list(selected))], sorted({*against, *missing})


# helpers ------------------------------------------------------------------------------


@contextlib.contextmanager
def _opened(target: _Target) -> Iterator[Any]:
    """An existing store, closed afterwards; a missing SQLite file is refused, never created."""
    store = open_store(target.store, create=False, argument=target.argument)
    try:
        yield store
    finally:
        store.close()


def _blocked_route(store: Store, routes: Sequence[RouteKey]) -> RouteKey:
    """The one route of ``routes`` that is blocked (else the first); refuses when several are."""
    blocked = [route for route in routes if blocked_partitions(store.list_latest(route))]
    if len(blocked) > 1:
        where = "; ".join(f"{route.label}: {_where(route)}" for route in blocked)
        raise ConfigInvalid(
            f"{len(blocked)} routes with these table names are blocked, in different "
            f"databases ({where}); nothing was written: resolve them one at a time with "
            "their route file",
            diagnostics={"key": "--route", "routes": [route.as_dict() for route in blocked]},
        )
    return (blocked or list(routes))[0]


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
