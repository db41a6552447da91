"""The route lease: at most one attempt writes a target table at a time (ADR-0024).

An attempt takes the lease of its target table in the checkpoint store
before its route scan and gives it back after its source state is saved. The
lease is a row with an owner, a token and an expiry: a heartbeat thread
extends it while the attempt works, and a killed worker's lease simply
expires. Just before the target call the attempt confirms it still holds the
lease, so a worker that was paused past the expiry stops before the target
instead of writing beside the new holder.

The store provides the row operations (``LeaseTable``) on a connection of the
lease's own, so the heartbeat never shares the store's connection. Times are
the workers' wall clocks: they must agree to well within the lease time.
"""

from __future__ import annotations

import json
import os
import secrets
import socket
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from types import TracebackType
from typing import Any, Protocol, runtime_checkable

import attrs

from .checkpoints import RouteKey
from .errors import RouteBusy

__all__ = [
    "DEFAULT_LEASE_SECONDS",
    "Lease",
    "LeaseHolder",
    "LeaseStore",
    "LeaseTable",
    "lease_key",
    "read_holder",
]

DEFAULT_LEASE_SECONDS = 180.0


def lease_key(route: RouteKey) -> str:
    """What a lease is taken on: the target table in its database (any route writing it)."""
    return json.dumps([route.target_location or "", route.target_table])


class LeaseTable(Protocol):
    """One lease row per key, on a connection of the lease's own (see ``LeaseStore``)."""

    def take(self, key: str, token: str, expires_at: float, record: str, now: float) -> bool:
        """Write the row unless another token holds it unexpired; True when ``token`` holds it."""

    def renew(self, key: str, token: str, expires_at: float, record: str) -> bool:
        """Extend the row if ``token`` still holds it; False when it does not."""

    def release(self, key: str, token: str) -> None:
        """Delete the row if ``token`` holds it."""

    def holder(self, key: str, now: float) -> str | None:
        """The record of the unexpired holder of ``key``, or None."""

    def close(self) -> None: ...


@runtime_checkable
class LeaseStore(Protocol):
    """A store that can lease target tables; the built-in stores can."""

    def lease_table(self) -> LeaseTable:
        """Lease operations on a new connection of their own; the caller closes it."""


@attrs.frozen(kw_only=True)
class LeaseHolder:
    """Who holds a lease: safe to show (host, process, run, route, times)."""

    owner: str
    run_id: str
    route: dict[str, str]
    acquired_at: str
    heartbeat_at: str

    def as_dict(self) -> dict[str, Any]:
        return attrs.asdict(self)


def read_holder(record: str | None) -> LeaseHolder | None:
    """A lease row's record; an unreadable one still reads as held (fail closed)."""
    if record is None:
        return None
    try:
        return LeaseHolder(**json.loads(record))
    except (TypeError, ValueError):
        return LeaseHolder(owner="unknown", run_id="unknown", route={}, acquired_at="unknown",
                           heartbeat_at="unknown")  # fmt: skip


def _timestamp(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).isoformat(timespec="seconds")


class Lease:
    """The lease of one target table for one attempt; a context manager.

    ``seconds`` is how long the lease lasts without a heartbeat; the
    heartbeat renews it every sixth of that.
    """

    def __init__(
        self,
        table: LeaseTable,
        route: RouteKey,
        *,
        run_id: str,
        seconds: float = DEFAULT_LEASE_SECONDS,
        owner: str | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._table = table
        self._route = route
        self._key = lease_key(route)
        self._token = secrets.token_hex(16)
        self._seconds = seconds
        self._clock = clock
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._lost = False
        self._thread: threading.Thread | None = None
        now = clock()
        self._holder = LeaseHolder(
            owner=owner or f"{socket.gethostname()} pid {os.getpid()}",
            run_id=run_id,
            route=route.as_dict(),
            acquired_at=_timestamp(now),
            heartbeat_at=_timestamp(now),
        )

    def _record(self, now: float) -> str:
        holder = attrs.evolve(self._holder, heartbeat_at=_timestamp(now))
        return json.dumps(holder.as_dict(), sort_keys=True)

    def acquire(self) -> Lease:
        """Take the lease, or raise ``RouteBusy`` naming its holder; then start the heartbeat."""
        now = self._clock()
        try:
            with self._lock:
                taken = self._table.take(
                    self._key, self._token, now + self._seconds, self._record(now), now
                )
                holder = None if taken else read_holder(self._table.holder(self._key, now))
        except BaseException:
            self._table.close()
            raise
        if not taken:
            self._table.close()
            raise RouteBusy.held_by(self._route, holder)
        self._thread = threading.Thread(target=self._beat, name="dpone-lease", daemon=True)
        self._thread.start()
        return self

    def _beat(self) -> None:
        while not self._stop.wait(self._seconds / 6):
            try:
                self._renew()
            except Exception:  # the store is unreachable: confirm() will find the lease gone
                continue
            if self._lost:
                return

    def _renew(self) -> None:
        with self._lock:
            if self._lost or self._stop.is_set():
                return
            now = self._clock()
            if not self._table.renew(
                self._key, self._token, now + self._seconds, self._record(now)
            ):
                self._lost = True

    def confirm(self) -> None:
        """Renew now; ``RouteBusy`` if the lease expired and may be someone else's."""
        try:
            self._renew()
        except Exception:
            self._lost = True
        if self._lost:
            raise RouteBusy.lost(self._route)

    def release(self) -> None:
        """Stop the heartbeat and give the lease back (best effort: it expires anyway)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        with self._lock:
            try:
                self._table.release(self._key, self._token)
            except Exception:
                pass
            finally:
                self._table.close()

    def __enter__(self) -> Lease:
        return self.acquire()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.release()
