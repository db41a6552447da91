"""The route lease: at most one attempt writes a target table at a time (ADR-0024).

An attempt takes the lease of its target table in the checkpoint store
before its route scan and gives it back after its source state is saved. The
lease is a row with an owner, a token, an expiry and an epoch: a heartbeat
thread extends it while the attempt works, and a killed worker's lease
expires, or is taken at once by a worker on the same host that sees its
process gone (``ProcessMark``).

Each take of a key's lease gets a new *epoch* (kept in the store, never
reused): one more than the key's last, or the clock's milliseconds when that is
more (``clock_epoch``), so a store restored from a backup, or lost and made
again, does not hand out again an epoch a worker stopped meanwhile holds. The
target's fence (``ledger.py``) refuses a batch of an older epoch inside its
own transaction, so a worker paused past its lease can never apply a stale
batch. Every checkpoint the attempt writes is written only while it
still holds the lease, checked in the same store transaction
(``HeldStore``): a paused worker arms nothing.

The store provides the row operations (``LeaseTable``) on a connection of the
lease's own, so the heartbeat never shares the store's connection. Expiry uses
the workers' wall clocks: they must agree to well within the lease time.
"""

from __future__ import annotations

import functools
import json
import os
import secrets
import socket
import threading
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from types import TracebackType
from typing import Any, Protocol, runtime_checkable

import attrs

from .checkpoints import PartitionCheckpoint, RouteKey
from .errors import LeaseLost, RouteBusy

__all__ = [
    "DEFAULT_LEASE_SECONDS",
    "HeldStore",
    "Lease",
    "LeaseClaim",
    "LeaseHolder",
    "LeaseStore",
    "LeaseTable",
    "ProcessMark",
    "clock_epoch",
    "lease_key",
    "read_holder",
]

DEFAULT_LEASE_SECONDS = 180.0


def clock_epoch(now: float) -> int:
    """The lowest epoch a lease taken at ``now`` gets: the clock's milliseconds. A store that
    forgot its epochs (restored from an older backup, lost and made again) handed out the
    next one again, which a worker that took it and stopped before its target call still
    held: the restored store's run and that worker both applied their batch (exit 0, then
    the rows twice). Workers' clocks agree to well within a lease (the module docstring),
    and a store is not restored and run again within that; milliseconds, so that a key's
    takes do not run ahead of the clock (its epoch then is one more than its last)."""
    return max(1, int(now * 1000))


def lease_key(route: RouteKey) -> str:
    """What a lease is taken on: the target table in its database (any route writing it)."""
    return json.dumps([route.target_location or "", route.target_table])


class LeaseTable(Protocol):
    """One lease row per key, on a connection of the lease's own (see ``LeaseStore``)."""

    def take(
        self,
        key: str,
        token: str,
        expires_at: float,
        record: str,
        now: float,
        *,
        replacing: str | None = None,
    ) -> int | None:
        """Write the row unless another token holds it unexpired (a holder whose record is
        exactly ``replacing``, a dead one, is taken over); the lease's new epoch, one more
        than the key's last or ``clock_epoch(now)`` if more, when ``token`` holds it, else
        None."""

    def raise_epoch(self, key: str, token: str, epoch: int) -> int | None:
        """Raise the epoch of the lease ``token`` holds to at least ``epoch``; the epoch now,
        or None when ``token`` no longer holds it."""

    def renew(self, key: str, token: str, expires_at: float, record: str) -> bool:
        """Extend the row if ``token`` still holds it; False when it does not."""

    def release(self, key: str, token: str) -> None:
        """Free the row if ``token`` holds it; the key's epoch is kept."""

    def holder(self, key: str, now: float) -> str | None:
        """The record of the unexpired holder of ``key``, or None."""

    def holders(self, now: float) -> list[str]:
        """The records of every unexpired lease (``routes`` lists a route that only runs)."""

    def close(self) -> None: ...


@attrs.frozen
class LeaseClaim:
    """What a store checks in the transaction of a write made under a lease (``HeldStore``)."""

    key: str
    token: str


@runtime_checkable
class LeaseStore(Protocol):
    """A store that can lease target tables; the built-in stores can."""

    def lease_table(self) -> LeaseTable:
        """Lease operations on a new connection of their own; the caller closes it."""

    def upsert_many(
        self, checkpoints: Sequence[PartitionCheckpoint], *, holding: LeaseClaim | None = None
    ) -> None:
        """``CheckpointStore.upsert_many``; with ``holding``, only while that claim holds its
        lease unexpired, checked in the same transaction: else ``LeaseLost``, nothing written."""


@attrs.frozen(kw_only=True)
class ProcessMark:
    """Which process on which machine holds a lease: the host's name, an id of this kernel
    boot and process namespace (containers on one machine share a name or a boot, not
    both with a namespace), the process id and its start time, so that a reused pid is
    not taken for the holder. Safe to show."""

    host: str
    machine: str  # boot id and pid namespace; "" where the system does not say
    pid: int
    started: str  # the process's start time since boot, in clock ticks; "" when unknown

    @classmethod
    def here(cls) -> ProcessMark:
        return cls(
            host=socket.gethostname(), machine=_machine(), pid=os.getpid(), started=_own_start()
        )

    def as_dict(self) -> dict[str, Any]:
        return attrs.asdict(self)

    def on_this_machine(self) -> bool:
        mine = ProcessMark.here()
        return bool(self.machine) and (self.host, self.machine) == (mine.host, mine.machine)

    def gone(self) -> bool:
        """True only when this machine's holder process certainly no longer runs (a paused
        process runs; a zombie does not)."""
        if not self.on_this_machine() or self.pid <= 0:
            return False
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return True
        except OSError:  # another user's process: it exists
            pass
        started = _started(str(self.pid))
        return bool(self.started) and started != self.started


@functools.cache
def _machine() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as handle:
            boot = handle.read().strip()
        return f"{boot}/{os.readlink('/proc/self/ns/pid')}"
    except OSError:
        return ""


_own_starts: dict[int, str] = {}


def _own_start() -> str:
    """This process's start time, read once per process (by pid: a fork is another
    process): it never changes, and reading ``/proc/self/stat`` of a process with many
    threads costs milliseconds, twice per table of a pipeline."""
    pid = os.getpid()
    if pid not in _own_starts:
        _own_starts[pid] = _started("self")
    return _own_starts[pid]


def _started(pid: str) -> str:
    """The start time of process ``pid`` in clock ticks since boot; "" when unknown, "gone"
    when it is a zombie (it ran)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as handle:
            fields = handle.read().rpartition(")")[2].split()
    except OSError:
        return ""
    return "gone" if fields[0] == "Z" else fields[19]


@attrs.frozen(kw_only=True)
class LeaseHolder:
    """Who holds a lease: safe to show (host, process, run, route, times, epoch)."""

    owner: str
    run_id: str
    route: dict[str, str]
    acquired_at: str
    heartbeat_at: str
    expires_at: str = "unknown"
    process: ProcessMark | None = None
    epoch: int | None = None

    def as_dict(self) -> dict[str, Any]:
        return attrs.asdict(self)


_UNREADABLE = LeaseHolder(
    owner="unknown", run_id="unknown", route={}, acquired_at="unknown", heartbeat_at="unknown"
)


def read_holder(record: str | None) -> LeaseHolder | None:
    """A lease row's record; an unreadable one still reads as held (fail closed)."""
    if record is None:
        return None
    try:
        fields = json.loads(record)
        process = fields.pop("process", None)
        return LeaseHolder(**fields, process=None if process is None else ProcessMark(**process))
    except (TypeError, ValueError, AttributeError):
        return _UNREADABLE


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
        self.epoch = 0  # set when taken
        now = clock()
        process = ProcessMark.here()
        self._holder = LeaseHolder(
            owner=owner or f"{process.host} pid {process.pid}",
            run_id=run_id,
            route=route.as_dict(),
            acquired_at=_timestamp(now),
            heartbeat_at=_timestamp(now),
            process=process,
        )

    @property
    def claim(self) -> LeaseClaim:
        return LeaseClaim(self._key, self._token)

    @property
    def process(self) -> ProcessMark:
        """The process holding this lease (this one)."""
        assert self._holder.process is not None  # set in __init__
        return self._holder.process

    def _record(self, now: float) -> str:
        holder = attrs.evolve(
            self._holder,
            heartbeat_at=_timestamp(now),
            expires_at=_timestamp(now + self._seconds),
            epoch=self.epoch or None,
        )
        return json.dumps(holder.as_dict(), sort_keys=True)

    def acquire(self) -> Lease:
        """Take the lease, or raise ``RouteBusy`` naming its holder; then start the heartbeat.

        A holder on this machine whose process is gone is taken over at once; one
        elsewhere only once its lease expired.
        """
        try:
            with self._lock:
                epoch, holder = self._take()
        except BaseException:
            self._table.close()
            raise
        if epoch is None:
            self._table.close()
            raise RouteBusy.held_by(self._route, holder)
        self.epoch = epoch
        self._renew()  # the record now names the epoch too
        self._thread = threading.Thread(target=self._beat, name="dpone-lease", daemon=True)
        self._thread.start()
        return self

    def _take(self) -> tuple[int | None, LeaseHolder | None]:
        now = self._clock()
        expires, record = now + self._seconds, self._record(now)
        epoch = self._table.take(self._key, self._token, expires, record, now)
        if epoch is not None:
            return epoch, None
        held = self._table.holder(self._key, now)
        holder = read_holder(held)
        if held is not None and holder is not None and holder.process and holder.process.gone():
            epoch = self._table.take(self._key, self._token, expires, record, now, replacing=held)
            if epoch is not None:
                return epoch, None
            holder = read_holder(self._table.holder(self._key, now))
        return None, holder

    def raise_epoch(self, epoch: int) -> None:
        """Make this lease's epoch at least ``epoch`` (the target's fence is there already: a
        store that was replaced or restored counts from lower); ``LeaseLost`` if it is lost."""
        if epoch <= self.epoch:
            return
        with self._lock:
            raised = None if self._lost else self._table.raise_epoch(self._key, self._token, epoch)
        if raised is None:
            self._lost = True
            raise LeaseLost.lost(self._route)
        self.epoch = raised

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

    @property
    def lost(self) -> bool:
        """Whether the lease is known lost, or cannot be renewed now (renews to find out)."""
        try:
            self._renew()
        except Exception:
            self._lost = True
        return self._lost

    def confirm(self) -> None:
        """Renew now; ``LeaseLost`` if the lease expired and may be someone else's."""
        if self.lost:
            raise LeaseLost.lost(self._route)

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


class HeldStore:
    """The checkpoint store as an attempt under a lease writes it: every write (checkpoints,
    resolutions, evidence, source state) is made only while the lease is held, checked in the
    write's own store transaction (``LeaseLost`` otherwise, nothing written), so a worker
    paused past its lease writes nothing over the next holder's records. Reads pass through.
    """

    def __init__(self, store: LeaseStore, lease: Lease) -> None:
        self._store: Any = store
        self._claim = lease.claim

    def upsert(self, checkpoint: PartitionCheckpoint) -> None:
        self.upsert_many([checkpoint])

    def upsert_many(self, checkpoints: Sequence[PartitionCheckpoint]) -> None:
        self._store.upsert_many(checkpoints, holding=self._claim)

    def save_source_state(self, route: RouteKey, state: dict[str, Any]) -> None:
        self._store.save_source_state(route, state, holding=self._claim)

    def record_evidence(self, route: RouteKey, run_id: str, record: dict[str, Any]) -> None:
        self._store.record_evidence(route, run_id, record, holding=self._claim)

    def apply_resolution(self, route: RouteKey, *args: Any, **kwargs: Any) -> int:
        return int(self._store.apply_resolution(route, *args, **kwargs, holding=self._claim))

    def __getattr__(self, name: str) -> Any:
        """Reads (``list_latest``, ``list_target_latest``, ``load_source_state``, ...)."""
        return getattr(self._store, name)
