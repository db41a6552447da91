"""Fault injection around real parts, for this project's tests and for connector authors.

Every wrapper delegates to a real store or sink and only adds the failure you
ask for, so a test exercises the real code paths up to the injected fault.
"""

from __future__ import annotations

import functools
import sqlite3
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import attrs

from ..checkpoints import GUARD_DIAGNOSTICS_KEY, PartitionCheckpoint, RouteKey
from ..connectors._sql import quote

__all__ = [
    "FaultyStore",
    "InjectedFault",
    "RecordingSink",
    "StepClock",
    "build_sample_source",
    "guard_phase",
    "phase_batch",
]


class InjectedFault(RuntimeError):
    """The error the wrappers raise unless a test supplies its own object."""


def guard_phase(checkpoint: PartitionCheckpoint) -> str | None:
    guard = checkpoint.diagnostics.get(GUARD_DIAGNOSTICS_KEY)
    return guard.get("phase") if isinstance(guard, dict) else None


BatchMatcher = Callable[[Sequence[PartitionCheckpoint]], bool]


def phase_batch(phase: str | None) -> BatchMatcher:
    """Matches a checkpoint batch whose first item carries guard ``phase`` (None = no guard)."""
    return lambda batch: bool(batch) and guard_phase(batch[0]) == phase


@attrs.define(eq=False)
class _PlannedFault:
    matches: BatchMatcher
    keep: int
    error: BaseException


class FaultyStore:
    """A real store that can fail the k-th write of a chosen batch, or its reads.

    ``batches`` records every ``upsert_many`` call as the tuple it was given,
    so tests can check what each batch held and when it was stamped.
    """

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.batches: list[tuple[PartitionCheckpoint, ...]] = []
        self._write_faults: list[_PlannedFault] = []
        self._read_errors: list[BaseException | None] = []
        self._state_errors: dict[str, BaseException] = {}

    def fail_batch(
        self, matches: BatchMatcher, *, keep: int = 0, error: BaseException | None = None
    ) -> BaseException:
        """The next matching batch durably writes its first ``keep`` items, then raises."""
        error = error or InjectedFault("injected checkpoint write failure")
        self._write_faults.append(_PlannedFault(matches, keep, error))
        return error

    def fail_reads(
        self, count: int = 1, *, skip: int = 0, error: BaseException | None = None
    ) -> BaseException:
        """After ``skip`` good reads of latest checkpoints, the next ``count`` raise ``error``.

        Reads are ``list_target_latest`` and ``list_latest`` calls, in order. A run
        makes two before the target (the route scan's target table, then the route),
        so ``skip=2`` fails the guard's reconciliation read after a partial commit.
        """
        error = error or InjectedFault("injected checkpoint read failure")
        self._read_errors.extend([None] * skip + [error] * count)
        return error

    def fail_state_write(self, which: str, error: BaseException | None = None) -> BaseException:
        """Fail the next ``record_evidence`` (``which="evidence"``) or ``save_source_state``."""
        error = error or InjectedFault(f"injected {which} write failure")
        self._state_errors[which] = error
        return error

    def upsert(self, checkpoint: PartitionCheckpoint) -> None:
        self.upsert_many([checkpoint])

    def upsert_many(self, checkpoints: Sequence[PartitionCheckpoint], **held: Any) -> None:
        batch = tuple(checkpoints)
        self.batches.append(batch)
        for fault in self._write_faults:
            if fault.matches(batch):
                self._write_faults.remove(fault)
                for checkpoint in batch[: fault.keep]:
                    self.inner.upsert(checkpoint)
                raise fault.error
        self.inner.upsert_many(batch, **held)

    def _read(self) -> None:
        if self._read_errors and (error := self._read_errors.pop(0)) is not None:
            raise error

    def list_latest(self, route: RouteKey) -> list[PartitionCheckpoint]:
        self._read()
        return self.inner.list_latest(route)

    def list_target_latest(self, route: RouteKey) -> list[PartitionCheckpoint]:
        self._read()
        return self.inner.list_target_latest(route)

    def __getattr__(self, name: str) -> Any:
        """The store's other capabilities (target scope, adoption, leases, operator port)."""
        return getattr(self.inner, name)

    def load_source_state(self, route: RouteKey) -> dict[str, Any] | None:
        return self.inner.load_source_state(route)

    def save_source_state(self, route: RouteKey, state: dict[str, Any], **held: Any) -> None:
        """``held``: the lease the write is made under (``HeldStore``), passed on."""
        if "source_state" in self._state_errors:
            raise self._state_errors.pop("source_state")
        self.inner.save_source_state(route, state, **held)

    def record_evidence(
        self, route: RouteKey, run_id: str, record: dict[str, Any], **held: Any
    ) -> None:
        if "evidence" in self._state_errors:
            raise self._state_errors.pop("evidence")
        self.inner.record_evidence(route, run_id, record, **held)

    def list_evidence(self, route: RouteKey) -> list[dict[str, Any]]:
        return self.inner.list_evidence(route)


class RecordingSink:
    """A real sink that counts target calls and can raise before or after delegating.

    ``target_calls`` counts ``load``, ``finalize_staged_load`` and its engine's
    ``load_plan``: the calls that mutate the target table. ``fail="before"`` raises without touching
    the target; ``fail="after"`` lets the real call commit, then raises, the
    case where the target holds the rows but dpone cannot know it.
    ``observe``, if given, is called at the start of every target call and its
    result appended to ``observations``: what the world looked like (say, how
    many checkpoint batches were durable) at the moment the target was reached.
    """

    TARGET_METHODS = ("load", "finalize_staged_load", "load_plan")

    def __init__(
        self,
        inner: Any,
        *,
        fail: str | None = None,
        error: BaseException | None = None,
        observe: Callable[[], Any] | None = None,
    ):
        if fail not in (None, "before", "after"):
            raise ValueError("fail must be None, 'before' or 'after'")
        self.inner = inner
        self.fail = fail
        self.error = error or InjectedFault("injected target failure")
        self.observe = observe
        self.target_calls = 0
        self.calls: list[str] = []
        self.observations: list[Any] = []

    def engine(self) -> Any:
        """The inner sink's engine; one that is the sink itself is this recorder, so that its
        ``load_plan`` is counted and fails as told."""
        engine = self.inner.engine()
        return self if engine is self.inner else engine

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(self.inner, name)
        if name not in self.TARGET_METHODS:
            return attribute

        @functools.wraps(attribute)
        def target_call(*args: Any, **kwargs: Any) -> Any:
            self.target_calls += 1
            self.calls.append(name)
            if self.observe is not None:
                self.observations.append(self.observe())
            if self.fail == "before":
                raise self.error
            result = attribute(*args, **kwargs)
            if self.fail == "after":
                raise self.error
            return result

        return target_call


class StepClock:
    """An injected clock that moves ``step`` forward on every read and records the reads.

    Because every read differs, a batch whose checkpoints share one timestamp
    proves the batch read the clock once.
    """

    def __init__(self, start: datetime | None = None, step: timedelta = timedelta(seconds=1)):
        self.now = start or datetime(2026, 1, 1, tzinfo=UTC)
        self.step = step
        self.reads: list[datetime] = []

    def __call__(self) -> datetime:
        self.now += self.step
        self.reads.append(self.now)
        return self.now


def build_sample_source(
    path: str | Path,
    *,
    table: str = "orders",
    rows: int = 1_000,
    partitions: int = 4,
    start_id: int = 1,
) -> None:
    """Create (or extend) a SQLite table ``(id, region, amount, updated_at)``.

    ``region`` takes ``partitions`` distinct values; ``updated_at`` grows with
    ``id`` so it works as an incremental cursor. Calling it again with a
    higher ``start_id`` appends new rows, as a live source would.
    """
    quoted = quote(table)
    with sqlite3.connect(path) as connection:
        connection.execute(
            f"CREATE TABLE IF NOT EXISTS {quoted} "
            "(id INTEGER PRIMARY KEY, region TEXT NOT NULL, amount REAL, updated_at INTEGER)"
        )
        connection.executemany(
            f"INSERT INTO {quoted} VALUES (?, ?, ?, ?)",
            (
                (i, f"region-{i % partitions:03d}", round(i * 1.25, 2), 1_000_000 + i)
                for i in range(start_id, start_id + rows)
            ),
        )
    connection.close()
