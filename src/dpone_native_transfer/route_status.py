"""``dpone-transfer routes`` and ``state show``: what a store knows of each route. Reads only.

A route is shown by its identity (tables, strategy, and the credential-free
locations its connectors report), its last successful run (the evidence
record), the latest outcome, its watermark and generation, whether the route
scan hooks (the guard) would block it now, and who holds its lease.
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from datetime import UTC, datetime
from typing import Any

from .checkpoints import RouteKey
from .errors import StoreTargetMismatch
from .latest import as_latest
from .lease import LeaseHolder, lease_key, read_holder
from .plugins import Hooks, make_plugin_manager
from .reporting import BLOCKING_ERRORS, EXIT_OK, plural
from .stores import Store, open_store

__all__ = ["add_routes_command", "route_status", "status_line"]


def route_status(store: Store, route: RouteKey, hooks: Hooks) -> dict[str, Any]:
    """One route's status as a JSON-safe object (the ``--json`` lines)."""
    latest = as_latest(store.list_latest(route))
    checkpoints = list(latest)
    blocked_by = None
    blocked: dict[str, list[str]] = {}
    try:
        hooks.resume_route_scan(route, latest)
    except BLOCKING_ERRORS as refusal:
        blocked_by = refusal.code
        for item in refusal.diagnostics.get("partitions", []):
            if item.get("batch_id"):
                blocked.setdefault(item["batch_id"], []).append(item["partition_id"])
    evidence = store.list_evidence(route)
    last = evidence[-1] if evidence else None
    state = store.load_source_state(route) or {}
    newest = max(checkpoints, key=_when, default=None)
    lease = _holder(store, route)
    if lease is not None and newest is not None and newest.run_id == lease.get("run_id"):
        outcome = "running"  # its armed partitions are its own, as ``guard scan`` says
        blocked_by, blocked = None, {}
    elif blocked_by is not None:
        outcome = "blocked"
    elif newest is None and last is None:
        outcome = "never run"
    elif newest is None or (last is not None and _succeeded_since(newest, last)):
        outcome = "succeeded"  # a run with nothing to load writes evidence, no checkpoint
    else:
        outcome = "failed"
    return {
        "route": route.as_dict(),
        "source_location": route.source_location,
        "target_location": route.target_location,
        "outcome": outcome,
        "blocked_by": blocked_by,
        "blocked_batches": {batch: sorted(ids) for batch, ids in sorted(blocked.items())},
        "last_success": None if last is None else _run(last),
        "latest_run_id": None if newest is None else newest.run_id,
        "partitions": dict(sorted(Counter(str(cp.status) for cp in checkpoints).items())),
        "watermark": state.get("watermark"),
        "generation": state.get("generation"),
        "lease": lease,
    }


def _when(checkpoint: Any) -> datetime:
    return checkpoint.completed_at or checkpoint.started_at or datetime.min.replace(tzinfo=UTC)


def _succeeded_since(newest: Any, evidence: dict[str, Any]) -> bool:
    """Whether the last success came after the newest checkpoint: a checkpoint written after it
    is a run that failed since (or runs now)."""
    try:
        completed = datetime.fromisoformat(str(evidence.get("completed_at")))
        return _when(newest) <= completed
    except (ValueError, TypeError):  # no time, or one without a zone: the run ids tell
        return newest.run_id == evidence.get("run_id")


def _run(evidence: dict[str, Any]) -> dict[str, Any]:
    keys = ("run_id", "path", "batch_id", "rows_loaded", "completed_at")
    return {key: evidence.get(key) for key in keys}


def _holder(store: Store, route: RouteKey) -> dict[str, Any] | None:
    table = store.lease_table()
    try:
        record = table.holder(lease_key(route), datetime.now(UTC).timestamp())
    finally:
        table.close()
    holder = _live(read_holder(record))
    return None if holder is None else holder.as_dict()


def _live(holder: LeaseHolder | None) -> LeaseHolder | None:
    """``holder``, unless it is a process on this machine that is gone: the next run takes
    its lease at once (``check_not_leased``), so it is shown as no holder."""
    if holder is not None and holder.process is not None and holder.process.gone():
        return None
    return holder


def status_line(status: dict[str, Any]) -> str:
    """One route for people: outcome first, then what the next run starts from."""
    route = RouteKey(**status["route"])
    parts = [f"{route.label}: {status['outcome']}"]
    if status["blocked_by"] == StoreTargetMismatch.code:
        parts.append(f"blocked by {status['blocked_by']} (the target line says why)")
    elif status["blocked_by"]:
        parts.append(f"blocked by {status['blocked_by']} (guard scan shows what blocks it)")
    last = status["last_success"]
    if last is not None:
        parts.append(
            f"last success {last['run_id']} at {last['completed_at']}, "
            f"{plural(last['rows_loaded'] or 0, 'row')}"
        )
    counts = ", ".join(f"{count:,} {name}" for name, count in status["partitions"].items())
    parts.append(f"partitions: {counts or 'none'}")
    if status["watermark"] is not None or status["generation"] is not None:
        parts.append(f"watermark {status['watermark']!r}, generation {status['generation']}")
    if status["lease"] is not None:
        lease = status["lease"]
        parts.append(
            f"lease held by {lease['owner']} (run {lease['run_id']}), expires at "
            f"{lease.get('expires_at', 'unknown')} unless renewed"
        )
    return "; ".join(parts)


def _print(statuses: list[dict[str, Any]], as_json: bool) -> None:
    """One line per route, or one JSON array (``[]`` when the store holds none)."""
    if as_json:
        print(json.dumps(statuses, sort_keys=True, default=str))
        return
    if not statuses:
        print("the store holds no route and no lease")
    for status in statuses:
        print(status_line(status))


def _leased_only(store: Store, listed: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Routes the store knows only by a lease: their first run holds it now."""
    table = store.lease_table()
    try:
        records = table.holders(datetime.now(UTC).timestamp())
    finally:
        table.close()
    known = [status["route"] for status in listed]
    found = []
    for record in records:
        holder = _live(read_holder(record))
        if holder is None or not holder.route or holder.route in known:
            continue
        known.append(holder.route)
        found.append({
            "route": holder.route, "source_location": None, "target_location": None,
            "outcome": "never run", "blocked_by": None, "blocked_batches": {},
            "last_success": None, "latest_run_id": None, "partitions": {},
            "watermark": None, "generation": None, "lease": holder.as_dict(),
        })  # fmt: skip
    return found


def add_routes_command(commands: Any, common: argparse.ArgumentParser) -> None:
    routes = commands.add_parser(
        "routes",
        parents=[common],
        help="every route in a checkpoint store: last run, outcome, watermark, lease (reads only)",
        description="List every route the checkpoint store holds, with its identity (no "
        "credentials), last successful run, latest outcome, watermark and generation, whether "
        "the guard blocks it, and who holds its lease.",
    )
    routes.add_argument(
        "--store",
        required=True,
        metavar="STORE",
        help="checkpoint store: a SQLite file, a postgresql:// DSN, or env:NAME",
    )
    routes.add_argument("--json", action="store_true", help="one JSON array of routes")
    routes.set_defaults(handler=_routes_command)


def _routes_command(args: argparse.Namespace) -> int:
    store = open_store(args.store, create=False, argument="--store")
    try:
        hooks = Hooks(make_plugin_manager(None))
        statuses = [route_status(store, route, hooks) for route in store.list_routes()]
        _print([*statuses, *_leased_only(store, statuses)], args.json)
    finally:
        store.close()
    return EXIT_OK
