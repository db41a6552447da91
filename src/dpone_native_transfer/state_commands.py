"""``dpone-transfer state restore`` and ``state reset``: a route's state, by an operator.

``restore`` rebuilds a store's view of a route from the target.

The target's ledger records every batch it applied. ``restore`` makes the
store agree with it, in one audited store transaction under the target
table's lease: a committed checkpoint for each ledger partition the store
does not already hold as committed (the store was lost, replaced or restored
from an older backup), a failed one (``not_in_target``) for each committed
partition the ledger does not hold (the target was replaced or restored from
an older backup: the next run loads it again), and the source state of the
route's last batch in the ledger. It shows what it will write and asks first
unless ``--yes``. Afterwards the next run continues where the target is: no
duplicate, no gap."""

from __future__ import annotations

import argparse
import json
from datetime import UTC, datetime
from typing import Any

from .checkpoints import (
    LEDGER_BATCH_KEY,
    FailureCode,
    PartitionCheckpoint,
    PartitionCheckpointStatus,
    RouteKey,
    Strategy,
)
from .config import RouteConfig
from .errors import (
    ConfigInvalid,
    NativeTransferError,
    StoreTargetMismatch,
    TargetUnavailable,
)
from .latest import as_latest
from .ledger import (
    UNKNOWN,
    LedgerEntry,
    Proof,
    check_store_against_target,
    ledger_overrides,
    live_entries,
    table_missing,
)
from .pipeline import load_route
from .planner import RouteDefinition, check_definition, route_definition, route_merge
from .plugins import Hooks, make_plugin_manager
from .recovery import (
    Prover,
    check_not_leased,
    forget_checkpoint,
    ledger_of,
    operator_lease,
    plan_restore,
)
from .reporting import EXIT_OK, declined, plural
from .route_status import route_status, status_line
from .source_state import DEFINITION_KEY, EDGE_KEY, SourceState, unknown_edge
from .stores import Store, new_store_file, open_store, remove_unused_store

__all__ = ["add_state_command"]

COMMITTED = PartitionCheckpointStatus.COMMITTED


def add_state_command(commands: Any, common: argparse.ArgumentParser) -> None:
    state = commands.add_parser(
        "state",
        help="a route's state in the checkpoint store: show it, or rebuild it from the target",
        description="Inspect and repair a route's state in the checkpoint store.",
    )
    actions = state.add_subparsers(title="actions", dest="action", metavar="ACTION", required=True)
    _add_show(actions, common)
    restore = _operator_action(
        actions,
        common,
        "restore",
        help="rebuild a lost or replaced store's view of a route from the target's ledger",
        description=_RESTORE_HELP,
    )
    restore.add_argument(
        "--ignore-row-count",
        action="store_true",
        help="restore although the target table's row count differs from what its ledger "
        "records (rows loaded before the ledger or by another tool, or deleted since); "
        "recorded in the audit record",
    )
    restore.set_defaults(handler=_restore_command)
    reset = _operator_action(
        actions,
        common,
        "reset",
        help="start an append route afresh: after its partition or cursor column changed, or "
        "into a table shared with another source database",
        description=_RESET_HELP,
    )
    reset.add_argument(
        "--from-now",
        action="store_true",
        help="the target keeps the rows it holds: continue after the source's highest value "
        "of the (new) cursor column now (rows at or below it are taken as loaded)",
    )
    reset.set_defaults(handler=_reset_command)


def _operator_action(
    actions: Any, common: argparse.ArgumentParser, name: str, *, help: str, description: str
) -> argparse.ArgumentParser:
    """An audited operator action on one route: its route file, store, reason and operator."""
    action = actions.add_parser(
        name,
        parents=[common],
        help=help,
        description=description,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    action.add_argument("route_file", metavar="ROUTE_FILE", help="the route file (TOML)")
    action.add_argument(
        "--store", metavar="STORE", help="checkpoint store (default: the route file's)"
    )
    action.add_argument("--reason", required=True, type=_text, metavar="TEXT", help="why")
    action.add_argument("--operator", required=True, type=_text, metavar="NAME", help="who")
    action.add_argument("--yes", action="store_true", help="do not ask for confirmation")
    return action


_RESTORE_HELP = """Rebuild the checkpoint store's view of the route of ROUTE_FILE from the target's
ledger, which records every batch the target applied: a committed checkpoint for each
ledger partition the store does not hold as committed (the store was lost, replaced or
restored from an older backup), a failed one (not_in_target) for each committed partition
the ledger does not hold (the target was replaced or restored from an older backup: the
next run loads it again), and the source state of the route's last batch in the ledger.
All in one audited store transaction under the target table's lease. It shows what it will
write and asks first; give --yes where nothing can answer (a script, a scheduler).
Afterwards the next run continues where the target is: no duplicate, no gap."""

_RESET_HELP = """Forget an append route's progress, audited, so that it starts afresh under its
route file as it is now: after its partition or cursor column changed
(native_transfer_route_changed), or, for a new route, to load a source
database into a table that holds another one's rows of an equal table name
(same_table_other_source). Every committed checkpoint of the route is
marked failed (reset) and its source state restarts. Because the next run
would then load every row again, a target table that holds rows of the route
is refused (every row counts as the route's unless the target's ledger
accounts for each as another route's): empty or refresh it first, or pass
--from-now (a route with a cursor column), which continues after the source's
current highest cursor value instead. A blocked route is refused: resolve it
first (guard scan)."""


def _add_show(actions: Any, common: argparse.ArgumentParser) -> None:
    show = actions.add_parser(
        "show",
        parents=[common],
        help="a route's state in the checkpoint store (reads only)",
        description="Show what the checkpoint store knows of the route of ROUTE_FILE: as "
        "`routes` shows it, plus the route's source state.",
    )
    show.add_argument("route_file", metavar="ROUTE_FILE", help="the route file (TOML)")
    show.add_argument(
        "--store", metavar="STORE", help="checkpoint store (default: the route file's)"
    )
    show.add_argument("--json", action="store_true", help="one JSON object")
    show.set_defaults(handler=_state_show_command)


def _state_show_command(args: argparse.Namespace) -> int:
    config = load_route(args.route_file, argument="ROUTE_FILE")
    args.route_store = config.store_path  # what a failure's suggested commands name
    store = _store(args, config, create_own=False)
    try:
        status = route_status(store, config.route, Hooks(make_plugin_manager(None)))
        state = store.load_source_state(config.route)
        running = status["lease"] is not None  # the target may be the run's, locked
        target = (
            "not compared (a run holds the route's lease: its target call may be under way)"
            if running
            else _compared_with_target(store, config)
        )
        healing = [] if running else _healing(store, config, status["blocked_batches"])
    finally:
        store.close()
    if isinstance(target, StoreTargetMismatch) and status["outcome"] != "blocked":
        status = {**status, "outcome": "blocked", "blocked_by": target.code}
    said = target if isinstance(target, str) else f"disagrees: {target}"
    if args.json:
        shown = {**status, "source_state": state, "target": said, "healing": healing}
        print(json.dumps(shown, sort_keys=True, default=str))
    else:
        print(status_line(status))
        print(f"source state: {json.dumps(state, sort_keys=True, default=str)}")
        print(f"target: {said}")
        for batch in healing:
            proof = batch["proof"]
            heals = "heals it" if proof["heals"] else "leaves it to a person"
            print(
                f"blocked batch {batch['batch_id']} ({plural(batch['partitions'], 'partition')}):"
                f" target proves {proof['verdict']} ({proof['reason']}); recovery = "
                f"from_target {heals}"
            )
    return EXIT_OK


def _healing(
    store: Store, config: RouteConfig, blocked: dict[str, list[str]]
) -> list[dict[str, Any]]:
    """Per blocked batch, what the target proves and whether ``recovery = "from_target"``
    would resolve it (reads only: the fence is not raised)."""
    if not blocked:
        return []
    latest = as_latest(store.list_latest(config.route))
    prover = Prover(config.sink, batch_column=config.batch_column, batch_route=config.route)
    found = []
    for batch, ids in blocked.items():
        if config.ledger:
            proof = prover.prove(config.route, batch, list(latest.checkpoints(ids).values()))
        else:
            proof = Proof(UNKNOWN, "the route keeps no target ledger (ledger = false)")
        found.append({"batch_id": batch, "partitions": len(ids), "proof": proof.as_dict()})
    return found


def _compared_with_target(store: Store, config: RouteConfig) -> str | StoreTargetMismatch:
    """What a run's first check would find, read only: whether the store's checkpoints and the
    target's ledger agree (``check_store_against_target``), the refusal when they do not, or
    why they were not compared. ``routes`` reads the store alone: only this sees a lost or
    restored store, or a replaced target."""
    route = config.route
    started = store.load_source_state(route) is not None
    if not config.ledger:
        return "not compared (the route keeps no target ledger: ledger = false)"
    if not route.located:
        return "not compared (the store or the target cannot say where the target is)"
    try:
        entries, reason = ledger_of(config.sink)
        if entries is None:
            return f"not compared ({reason})"
        check_store_against_target(
            route,
            as_latest(store.list_target_latest(route)),
            entries,
            overridden=lambda: ledger_overrides(store, route),
            cursor_column=config.source.cursor_column,
            target=config.sink,
            started=lambda: started,
        )
    except StoreTargetMismatch as refusal:
        return refusal
    except NativeTransferError as error:  # its message is safe: a malformed audit record's id
        return f"not compared ({error.code}: {error.message})"
    except Exception as error:  # a driver's own error: its text may hold secrets
        return f"not compared (the target cannot be reached: {type(error).__name__})"
    return "agrees with the checkpoint store"


def _text(value: str) -> str:
    if not value.strip():
        raise argparse.ArgumentTypeError("must not be empty")
    return value


def _store(args: argparse.Namespace, config: RouteConfig, *, create_own: bool) -> Any:
    """``--store``, which must exist, or the route file's store (created if ``create_own``)."""
    if args.store is not None:
        return open_store(args.store, create=False, argument="--store")
    return open_store(config.store_path, create=create_own, argument="store.path", check=True)


def _restore_command(args: argparse.Namespace) -> int:
    config = load_route(args.route_file, argument="ROUTE_FILE")
    args.route_store = config.store_path  # what a failure's suggested commands name
    route = config.route
    entries, reason = ledger_of(config.sink, partitions=True)
    if entries is None:  # a ledger kept but not readable now (locked, unreachable): retryable
        keeps = config.sink is not None and config.sink.features.keeps_ledger
        raise (TargetUnavailable if keeps else ConfigInvalid)(
            f"refusing to restore route {route.label}: {reason}; nothing was written"
            + ("; a retry may succeed" if keeps else ""),
            diagnostics={"route": route.as_dict()},
        )
    # the route file's own store is created when lost (rebuilding it is the point), and
    # removed again when nothing was written to it; a --store that does not exist is a mistake
    created = None if args.store else new_store_file(config.store_path, argument="store.path")
    store, audit_id = _store(args, config, create_own=True), None
    try:
        check_not_leased(store, route)
        # a blocked partition is decided with the guard's tools (its proof, its audit) first
        Hooks(make_plugin_manager(None)).resume_route_scan(
            route, as_latest(store.list_latest(route))
        )
        now = datetime.now(UTC)
        plan = plan_restore(
            store,
            route,
            entries,
            now=now,
            target_rows=config.sink.row_count(),
            excused=ledger_overrides(store, route, gone=True),
            ignore_row_count=args.ignore_row_count,
            target_missing=table_missing(config.sink),
        )
        source_state = plan.source_state and {
            **plan.source_state,
            **_definition(config, store, plan.definition),
        }
        restored = len(plan.checkpoints) - plan.rolled_back
        print(
            f"route {route.label}: {plural(plan.entries, 'batch')} in the target's ledger; "
            f"restore {plural(restored, 'committed checkpoint')}"
            + (
                f", mark {plural(plan.rolled_back, 'committed partition')} the target does not "
                "hold for loading again"
                if plan.rolled_back
                else ""
            )
        )
        for checkpoint in plan.checkpoints:
            bounds = json.dumps(checkpoint.partition_bounds, sort_keys=True, separators=(",", ":"))
            rows = f"{checkpoint.rows_exported:,} rows"
            status = "committed" if checkpoint.status is COMMITTED else "failed, not in target"
            print(f"  {checkpoint.partition_id}  {status}  {rows}  {bounds}")
        if source_state is not None:
            print(f"  source state: {_state(plan.previous_state)} -> {_state(source_state)}")
        if not plan.checkpoints and source_state is None:
            print("the store already agrees with the target's ledger: nothing to write")
            return EXIT_OK
        question = f"Write {plural(len(plan.checkpoints), 'checkpoint')} and one audit record?"
        if (stop := declined(question, yes=args.yes)) is not None:
            return stop
        previous = {cp.partition_id: cp for cp in plan.replaced}
        audit = {
            "at": now.isoformat(),
            "operator": args.operator,
            "reason": args.reason,
            "route": route.as_dict(),
            "resolved_as": "restored_from_target",
            "forced_invalid": False,
            "partitions": [
                {
                    "partition_id": cp.partition_id,
                    "previous_status": _status(previous.get(cp.partition_id)),
                    "previous_phase": None,
                    "previous_problem": None,
                    "new_status": cp.status.value,
                    "new_phase": None,
                    "batch_id": cp.diagnostics.get(LEDGER_BATCH_KEY),
                }
                for cp in plan.checkpoints
            ],
            "source_state": source_state,
            "ignore_row_count": args.ignore_row_count,
        }
        if plan.overrides:
            audit["ledger_overrides"] = list(plan.overrides)
        with operator_lease(store, route, operator=args.operator, action="state restore"):
            audit_id = store.apply_resolution(
                route,
                plan.checkpoints,
                audit,
                expected=plan.replaced,
                source_state=source_state,
            )
    finally:
        store.close()
        if created is not None and audit_id is None:
            remove_unused_store(created)
    print(f"wrote {plural(len(plan.checkpoints), 'checkpoint')} and audit record #{audit_id}")
    return EXIT_OK


def _route_definition(config: Any) -> RouteDefinition:
    """The route file's definition now (a merge route's key and deleted column included)."""
    source = config.source
    columns = source.describe().columns
    merge = route_merge(
        config.strategy,
        source,
        columns,
        primary_key=config.primary_key,
        deleted_column=config.deleted_column,
    )
    return route_definition(source, columns, merge)


def _definition(config: Any, store: Store, recorded: dict[str, Any] | None) -> dict[str, Any]:
    """The restored source state's definition: the route file's, refused where a run would
    refuse it (``check_definition``) against the store's recorded one and against the
    target's last batch of the route (``recorded``), so that a restore never launders a
    change a run refused (the store lost, the new definition would be all it knew)."""
    route = config.route
    definition = _route_definition(config)
    stored = SourceState(definition=(store.load_source_state(route) or {}).get(DEFINITION_KEY))
    check_definition(route, stored, store.list_latest(route), definition)
    if recorded is not None:
        check_definition(
            route,
            SourceState(definition=recorded),
            (),
            definition,
            recorded_in="its last batch in the target's ledger",
        )
    return {DEFINITION_KEY: definition.as_dict()}


def _reset_command(args: argparse.Namespace) -> int:
    config = load_route(args.route_file, argument="ROUTE_FILE")
    args.route_store = config.store_path  # what a failure's suggested commands name
    route, source = config.route, config.source
    if not route.strategy.incremental:
        raise ConfigInvalid(
            f"route {route.label} replaces its target on every run: there is nothing to reset",
            diagnostics={"route": route.as_dict()},
        )
    if args.from_now and source.cursor_column is None:
        raise ConfigInvalid(
            f"--from-now needs a cursor column; route {route.label} has none",
            diagnostics={"route": route.as_dict()},
        )
    store = _store(args, config, create_own=False)
    try:
        check_not_leased(store, route)
        latest = as_latest(store.list_latest(route))
        Hooks(make_plugin_manager(None)).resume_route_scan(route, latest)  # blocked: refused
        rows = _rows_of(config, store)
        # a merge route loading rows again merges them again: the target stays exact
        if rows and not args.from_now and route.strategy is not Strategy.MERGE:
            raise ConfigInvalid(
                f"refusing to reset route {route.label}: the target table holds "
                f"{plural(rows, 'row')}, which the next run would load again; empty or "
                "refresh the target first, or pass --from-now to continue after the source's "
                "highest cursor value; nothing was written",
                diagnostics={"route": route.as_dict(), "rows": rows},
            )
        committed = [cp for cp in latest if cp.status is COMMITTED]
        if committed and not args.from_now and route.strategy is not Strategy.MERGE:
            _refuse_missing_target(config, route)
        now = datetime.now(UTC)
        forgotten = [forget_checkpoint(cp, now, FailureCode.RESET) for cp in committed]
        previous = store.load_source_state(route)
        generation = (previous or {}).get("generation", 0)
        watermark = source.max_cursor() if args.from_now else None
        state = {
            "generation": (generation if isinstance(generation, int) else 0) + 1,
            "watermark": watermark,
            DEFINITION_KEY: _route_definition(config).as_dict(),
            **(unknown_edge(watermark) if args.from_now else {}),  # NULL-cursor rows: skipped
        }
        batches = sorted(
            {b for cp in committed if (b := cp.diagnostics.get(LEDGER_BATCH_KEY))}
            | (set() if args.from_now or rows else _held_batches(config, store))
        )
        print(
            f"route {route.label}: forget {plural(len(forgotten), 'committed partition')} "
            f"({plural(len(batches), 'ledger batch')}); source state: {_state(previous)} -> "
            f"{_state(state)}"
        )
        question = f"Reset route {route.label} and write one audit record?"
        if (stop := declined(question, yes=args.yes)) is not None:
            return stop
        audit = {
            "at": now.isoformat(),
            "operator": args.operator,
            "reason": args.reason,
            "route": route.as_dict(),
            "resolved_as": "reset",
            "forced_invalid": False,
            "partitions": [
                {
                    "partition_id": cp.partition_id,
                    "previous_status": COMMITTED.value,
                    "previous_phase": None,
                    "previous_problem": None,
                    "new_status": PartitionCheckpointStatus.FAILED.value,
                    "new_phase": None,
                    "batch_id": cp.diagnostics.get(LEDGER_BATCH_KEY),
                }
                for cp in committed
            ],
            "source_state": state,
            "from_now": args.from_now,
            "ledger_overrides": batches,  # the target may hold them: the ledger must not object
        }
        with operator_lease(store, route, operator=args.operator, action="state reset"):
            audit_id = store.apply_resolution(
                route, forgotten, audit, expected=committed, source_state=state
            )
    finally:
        store.close()
    print(f"reset route {route.label}: audit record #{audit_id}")
    return EXIT_OK


def _held_batches(config: RouteConfig, store: Store) -> set[str]:
    """The route's batches the target's ledger still holds as in the table: all gone from an
    emptied table, those a ``state reset --from-now`` kept (its checkpoints forgotten) too."""
    return {entry.batch_id for entry in _live(config, store) or () if entry.of_route(config.route)}


def _refuse_missing_target(config: RouteConfig, route: RouteKey) -> None:
    """A reset of committed partitions whose target table (or its file) is not there: it may
    be only out of reach now (a volume not mounted, a file moved aside), and once back its
    rows would all be loaded again, exit 0. ``state restore`` marks them lost instead, which
    a run checks against the target when it is back."""
    if not table_missing(config.sink):
        return
    raise ConfigInvalid(
        f"refusing to reset route {route.label}: its target table does not exist (or its "
        "database cannot be found), so whether it still holds the committed rows is unknown; "
        "if it is gone for good, mark its partitions for loading again with `dpone-transfer "
        "state restore`; nothing was written",
        diagnostics={"route": route.as_dict()},
    )


def _rows_of(config: RouteConfig, store: Store) -> int:
    """The target table's rows that may be the route's (a reset loads them again): those of
    its live ledger batches when the ledger accounts for every row (the table is shared
    with another source database's route), else all of them."""
    rows = config.sink.row_count()
    live = _live(config, store) if rows else None
    if not live or sum(entry.rows for entry in live) != rows:
        return rows
    return sum(entry.rows for entry in live if entry.of_route(config.route))


def _live(config: RouteConfig, store: Store) -> list[LedgerEntry] | None:
    """The target's ledger batches of its table that it holds now (less those operators said
    are gone); None when the route keeps no ledger or it cannot be read."""
    entries = ledger_of(config.sink)[0] if config.ledger and config.route.located else None
    return (
        None
        if not entries
        else live_entries(entries, ledger_overrides(store, config.route, gone=True))
    )


def _status(checkpoint: PartitionCheckpoint | None) -> str | None:
    return None if checkpoint is None else checkpoint.status.value


def _state(state: dict[str, Any] | None) -> str:
    """The state as JSON, its cursor edge summed up (the digests mean nothing to a reader)."""
    if state is None:
        return "none"
    edge = state.get(EDGE_KEY)
    if isinstance(edge, dict) and isinstance(edge.get("rows"), list):
        state = {
            **state,
            EDGE_KEY: {
                **edge,
                "columns": len(edge.get("columns") or ()),
                "rows": len(edge["rows"]),
            },
        }
    return json.dumps(state, sort_keys=True)
