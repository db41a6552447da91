"""Running a configured route: what the command line, the demo and the Airflow adapter share.

``transfer`` opens the route's checkpoint store, runs one attempt through
``TransferRuntime`` and closes the store; ``new_run_id`` names a run when the
caller has none. Nothing here parses arguments or prints: each caller reports
the result its own way, with the lines of ``reporting.py``.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from .drivers import holding_connections
from .runtime import TransferResult, TransferRuntime
from .stores import open_store

if TYPE_CHECKING:
    from .config import RouteConfig
    from .events import Event

__all__ = ["new_run_id", "transfer"]


def new_run_id() -> str:
    """``run-<UTC time>-<random>``: the run id when the caller gives none."""
    return f"run-{datetime.now(UTC):%Y%m%dT%H%M%SZ}-{secrets.token_hex(3)}"


def transfer(
    config: RouteConfig,
    run_id: str,
    *,
    events: Callable[[Event], None] | None = None,
    wrap_store: Callable[[Any], Any] | None = None,
    sink: Any = None,
    unguarded: bool = False,
    recovery: str | None = None,
) -> tuple[TransferResult, float]:
    """One run of a configured route; returns the result and its duration in seconds.

    The guard comes from its entry point (``plugins=None``) unless ``unguarded``
    (``plugins=[]``); ``recovery`` overrides the route's ``[guard] recovery``; the store
    is always closed. An embedded target's file is opened once for the run, not once per
    call (``holding_connections``).
    """
    started = time.perf_counter()
    store = open_store(config.store_path, create=True, argument="store.path")
    try:
        runtime = TransferRuntime(
            store if wrap_store is None else wrap_store(store),
            events=events,
            lease_seconds=config.lease_seconds,
            plugins=[] if unguarded else None,
        )
        with holding_connections():
            result = runtime.run(config.spec(run_id, sink=sink, recovery=recovery))
    finally:
        store.close()
    return result, time.perf_counter() - started
