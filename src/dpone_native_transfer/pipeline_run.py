"""Running a pipeline's tables: each an ordinary guarded run, at most ``jobs`` at once.

A table's run is ``application.transfer`` on its route, exactly as
``dpone-transfer run`` runs a route file: its own lease, checkpoints, ledger
and guard. One table failing or blocked does not stop the others. Tables that
write one target table (shards fanned in) form one queue, run one after
another by one worker, so that their lease never turns one of them away.

The workers are threads of this process, or worker processes (``WORKERS``;
``auto`` chooses by ``chosen_workers``; docs/pipelines.md has the measurement:
threads win on small runs and share a DuckDB file, which one process at a
time may open; processes win into PostgreSQL once each table's Python work
adds up, one interpreter lock per process). With processes, the first job
runs in this process, already started, and each other job in a worker
process (``python -m dpone_native_transfer.pipeline_worker``) that runs its
tables one after another exactly as a thread does (``serve``), each table
sent to it and its outcome sent back pickled. A signal
stops the run as it stops a single route: no table starts after it, and each
running table raises KeyboardInterrupt at its next step before the guard
arms (a partition read, the plan done), so it unwinds through its own
clean-up (its work folder removed, its lease released) with nothing armed; a
table past that point finishes its target call and its checkpoints. The
result says which tables finished. A second Ctrl-C stops waiting for them (a
second SIGTERM kills, as for a route).
"""

from __future__ import annotations

import contextlib
import logging
import os
import pickle
import queue
import signal
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import attrs

from .application import transfer
from .drivers import holding_connections
from .errors import ConfigInvalid, NativeTransferError
from .events import EventName
from .plugins import Hooks, make_plugin_manager
from .reporting import (
    EXIT_BLOCKED,
    EXIT_CONFIG,
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_TERMINATED,
    Reached,
    blocked_until_reconciled,
    exit_code_for,
)
from .route_status import route_status
from .stores import open_store
from .wording import one_line, plural

if TYPE_CHECKING:
    from .events import Event
    from .pipeline import PipelineTable
    from .runtime import TransferResult

__all__ = [
    "DEFAULT_JOBS",
    "MAX_JOBS",
    "PROCESS_ROWS",
    "WORKERS",
    "PipelineResult",
    "TableRun",
    "chosen_workers",
    "pipeline_summary",
    "pipeline_summary_lines",
    "run_tables",
    "serve",
    "table_progress_line",
]

# One worker per core, at most 8: the tables' I/O overlaps (figures: docs/pipelines.md).
DEFAULT_JOBS = max(1, min(8, os.cpu_count() or 1))
MAX_JOBS = 64

SUCCEEDED, FAILED, BLOCKED = "succeeded", "failed", "blocked"
# Where a stopped run's tables stop: before the guard arms. A table past it finishes its
# target call and promotion, so that a stop never leaves a table blocked by itself.
_STOPS = frozenset(
    {
        EventName.ROUTE_SCANNED,
        EventName.MANY_PARTITIONS,
        EventName.PARTITION_EXTRACTED,
        EventName.PARTITION_PLANNED,
        EventName.PRE_TARGET_DONE,
    }
)
INTERRUPTED, NOT_RUN = "interrupted", "not run"

WORKERS = ("auto", "threads", "processes")
# ``auto`` runs the tables of a PostgreSQL target in processes from this many source rows in
# all (the catalog's estimates): enough work to pay for the workers' start (docs/pipelines.md).
PROCESS_ROWS = 100_000


@attrs.frozen
class TableRun:
    """One table's outcome in a pipeline run (``as_dict``: its line of ``run --json``)."""

    table: str
    target_table: str
    outcome: str  # succeeded, failed, blocked, interrupted, not run
    route: dict[str, Any]
    committed_partitions: int = 0
    skipped_partitions: int = 0
    rows_loaded: int = 0
    seconds: float = 0.0
    batch_id: str | None = None
    path: str | None = None  # the path that ran (``auto``'s choice); None: no target call
    error: str | None = None  # the stable code, or a foreign error's type name
    exit_code: int = EXIT_OK  # what ``dpone-transfer run`` of the table alone would exit with
    left_blocked: str | None = None  # the block this failure left (``Reached.left_blocked``)
    failure: BaseException | None = attrs.field(default=None, eq=False, repr=False)

    def as_dict(self) -> dict[str, Any]:
        shown = attrs.asdict(self, filter=lambda field, _: field.name != "failure")
        shown["seconds"] = round(self.seconds, 3)
        if isinstance(self.failure, NativeTransferError):
            shown["message"] = self.failure.message
        return shown


@attrs.frozen
class PipelineResult:
    """Every selected table's run, in the pipeline's order; ``interrupted``: the signal that
    stopped the run (re-raised by the caller once it has reported), else None."""

    tables: tuple[TableRun, ...]
    seconds: float
    jobs: int
    workers: str = "threads"
    interrupted: BaseException | None = attrs.field(default=None, eq=False)

    @property
    def exit_code(self) -> int:
        """The run's exit status: 130 or 143 when a signal stopped it (``interrupted``: the
        CLI's SIGTERM is a ``BaseException`` other than ``KeyboardInterrupt``), else 3 if a
        table is blocked, else 1 if one failed (or did not finish) in a way a retry may mend,
        else 2 if one's route is invalid (no retry mends it), else 0."""
        if self.interrupted is not None:
            ctrl_c = isinstance(self.interrupted, KeyboardInterrupt)
            return EXIT_INTERRUPTED if ctrl_c else EXIT_TERMINATED
        outcomes = {run.outcome for run in self.tables}
        if BLOCKED in outcomes:
            return EXIT_BLOCKED
        if outcomes <= {SUCCEEDED}:
            return EXIT_OK
        failed = [run for run in self.tables if run.outcome != SUCCEEDED]
        return EXIT_CONFIG if all(run.exit_code == EXIT_CONFIG for run in failed) else EXIT_FAILED

    def totals(self) -> dict[str, Any]:
        counted = {name: 0 for name in (SUCCEEDED, FAILED, BLOCKED, INTERRUPTED, NOT_RUN)}
        for run in self.tables:
            counted[run.outcome] += 1
        return {
            "tables": len(self.tables),
            **counted,
            "rows_loaded": sum(run.rows_loaded for run in self.tables),
            "seconds": round(self.seconds, 3),
            "jobs": self.jobs,
            "workers": self.workers,
            "exit_code": self.exit_code,
        }


Report = Callable[[str, int, "PipelineTable", TableRun | None], None]
# One table's run: the table, and the events listener that stops it when the run stops.
RunTable = Callable[["PipelineTable", Callable[["Event"], None]], tuple["TransferResult", float]]


def run_tables(
    tables: Sequence[PipelineTable],
    run_id: str,
    *,
    jobs: int = DEFAULT_JOBS,
    recovery: str | None = None,
    report: Report | None = None,
    run_table: RunTable | None = None,
    workers: str = "threads",
) -> PipelineResult:
    """Run ``tables`` with at most ``jobs`` at once; never raises for a table's failure.

    ``report(event, number, table, run)`` is called as a table starts (``"started"``, its
    number in start order, no run) and ends (``"ended"``, with its run). ``run_table``
    replaces ``transfer`` for one table (tests wrap the real store or sink with it; threads
    only). ``workers``: ``threads``, or ``processes``: each job but the first in a worker
    process (``_Worker``), the first in this process, whose interpreter is started and
    imported already (``chosen_workers`` says which the tables allow). A signal
    (KeyboardInterrupt, or the CLI's SIGTERM) stops every running table, and is returned as
    ``interrupted``.
    """
    if workers not in ("threads", "processes") or (workers == "processes" and run_table):
        raise ValueError("workers must be 'threads', or 'processes' without run_table")

    def default_run(
        table: PipelineTable, events: Callable[[Event], None]
    ) -> tuple[TransferResult, float]:
        return transfer(table.config, run_id, events=events, recovery=recovery)

    run_one = run_table or default_run
    started = time.perf_counter()
    pending: queue.SimpleQueue[list[PipelineTable]] = queue.SimpleQueue()
    groups = _queues(tables)
    for group in groups:
        pending.put(group)
    runs: dict[str, TableRun] = {}
    begun: set[str] = set()  # tables started: one a second Ctrl-C left running was interrupted
    lock, stop = threading.Lock(), threading.Event()
    numbers = iter(range(1, len(tables) + 1))

    slots = max(1, min(jobs, len(groups)))
    if slots == 1:
        workers = "threads"  # the one job runs in this process: no worker process starts
    left, finished = [slots], threading.Event()

    processes: list[_Worker] = []

    def work(slot: int) -> None:
        worker, table = None, None
        try:
            while not stop.is_set():
                try:
                    group = pending.get_nowait()
                except queue.Empty:
                    return
                for table in group:
                    with lock:
                        if stop.is_set():
                            return
                        number = next(numbers)
                        begun.add(table.name)
                        # the first slot runs in this process, already started and imported
                        if slot and workers == "processes" and (worker is None or worker.ended):
                            worker = _Worker(run_id, recovery)  # a worker killed: another
                            processes.append(worker)
                    if report is not None:
                        report("started", number, table, None)
                    if worker is None:
                        outcome = _run(table, run_one, stop)
                    else:
                        outcome = worker.run(table, stop)
                    with lock:
                        runs[table.name] = outcome
                    if report is not None:
                        report("ended", number, table, outcome)
        except BaseException as error:  # a report or a worker that failed: every table stops,
            stop.set()  # and the one it was running says with what (it said nothing before)
            if table is not None:
                with lock:
                    runs.setdefault(table.name, _broke(table, error))
        finally:
            if worker is not None:
                worker.close()
            with lock:
                left[0] -= 1
                if not left[0]:
                    finished.set()

    def stop_processes(how: signal.Signals) -> None:
        with lock:
            for worker in processes:
                worker.signal(how)

    interrupted: BaseException | None = None
    # an embedded target's file opened once for all its tables, the plugins found once
    with holding_connections():
        for n in range(slots):
            threading.Thread(target=work, args=(n,), name=f"dpone-table-{n}", daemon=True).start()
        try:  # no Thread.join: a signal landing in it can mark a running thread as ended
            while not finished.wait(0.1):
                pass
        except BaseException as signal_raised:  # KeyboardInterrupt, or the CLI's SIGTERM
            interrupted = signal_raised
            stop.set()
            stop_processes(signal.SIGTERM)  # each stops its table as a thread would
            try:
                while not finished.wait(0.1):
                    pass
            except KeyboardInterrupt:  # a second Ctrl-C: report what is known now
                stop_processes(signal.SIGKILL)  # as the threads, which end with this process
    with lock:
        ran, started_ones = dict(runs), set(begun)
    ended = [
        ran.get(table.name)
        or TableRun(
            table.name,
            table.config.sink.table,
            INTERRUPTED if table.name in started_ones else NOT_RUN,
            table.config.route.as_dict(),
        )
        for table in tables
    ]
    return PipelineResult(
        tables=tuple(ended),
        seconds=time.perf_counter() - started,
        jobs=slots,
        workers=workers,
        interrupted=interrupted,
    )


def _queues(tables: Sequence[PipelineTable]) -> list[list[PipelineTable]]:
    """One queue per target table, in file order; the largest first, so that a long table
    does not start last while the other workers idle (rows unknown count as none)."""
    groups: dict[str, list[PipelineTable]] = {}
    for table in tables:
        groups.setdefault(table.group, []).append(table)
    return sorted(groups.values(), key=lambda group: -sum(t.rows or 0 for t in group))


def _broke(table: PipelineTable, error: BaseException) -> TableRun:
    """The run of a table whose worker thread failed around it, not in its transfer."""
    config = table.config
    return TableRun(
        table.name,
        config.sink.table,
        FAILED,
        config.route.as_dict(),
        error=type(error).__name__,
        exit_code=EXIT_FAILED,
        failure=error,
    )


def _run(table: PipelineTable, run_one: RunTable, stop: threading.Event) -> TableRun:
    """One table's run, its failure kept as its outcome."""
    config = table.config
    shown = {
        "table": table.name,
        "target_table": config.sink.table,
        "route": config.route.as_dict(),
    }
    started, reached = time.perf_counter(), Reached()

    def stopping(event: Event) -> None:
        reached.saw(event)
        if stop.is_set() and event.name in _STOPS:
            raise KeyboardInterrupt  # the listener's one way to stop its run: not an Exception

    try:
        result, seconds = run_one(table, stopping)
    except BaseException as error:
        seconds = time.perf_counter() - started
        if stop.is_set() or not isinstance(error, Exception):  # an engine may wrap the stop
            return TableRun(**shown, outcome=INTERRUPTED, seconds=seconds, error=None)
        code = exit_code_for(error)
        return TableRun(
            **shown,
            outcome=BLOCKED if code == EXIT_BLOCKED else FAILED,
            seconds=seconds,
            error=error.code if isinstance(error, NativeTransferError) else type(error).__name__,
            exit_code=code,
            left_blocked=reached.left_blocked(error),
            failure=error,
        )
    return TableRun(
        **shown,
        outcome=SUCCEEDED,
        committed_partitions=len(result.committed_partition_ids),
        skipped_partitions=len(result.skipped_partition_ids),
        rows_loaded=result.rows_loaded,
        seconds=seconds,
        batch_id=result.batch_id,
        path=result.path,
    )


# -- worker processes ---------------------------------------------------------------------------


def chosen_workers(tables: Sequence[PipelineTable], jobs: int, workers: str = "auto") -> str:
    """``threads`` or ``processes`` for ``workers`` (``WORKERS``), or ConfigInvalid naming
    ``--workers`` when processes cannot run these tables: a DuckDB file or a chDB folder is
    opened by one process at a time. ``auto``: processes into PostgreSQL when more than one
    job can run and the tables hold ``PROCESS_ROWS`` rows or more in all, else threads.
    Each table's own work in Python (its checks, plan, checkpoints; every row, from SQLite)
    holds one interpreter's lock, so threads of one process share one core for it; a
    worker process starts an interpreter, which small runs do not pay back."""
    from .connectors import ClickHouseSink, DuckDBSink, PostgresSink

    one_process = [t.name for t in tables if isinstance(t.config.sink, DuckDBSink | ClickHouseSink)]
    if workers == "processes" and one_process:
        raise ConfigInvalid(
            f"--workers processes cannot run table {one_process[0]!r}: its target (a DuckDB "
            "file or a chDB folder) is opened by one process at a time; use --workers threads",
            diagnostics={"argument": "--workers", "table": one_process[0]},
        )
    if workers != "auto":
        return workers
    into_server = all(isinstance(t.config.sink, PostgresSink) for t in tables)
    rows = sum(t.rows or 0 for t in tables)
    queues = len({t.group for t in tables})
    return (
        "processes"
        if jobs > 1 and queues > 1 and into_server and rows >= PROCESS_ROWS
        else "threads"
    )


_PACKAGE = __name__.rpartition(".")[0]


def _blocked_now(table: PipelineTable) -> str | None:
    """After a worker process ended without answering (killed inside its target call, say),
    whether the table's route is blocked now, as its store tells (``route_status``): the
    events that tell it of a run that raised (``Reached.left_blocked``) died with it."""
    config = table.config
    try:
        store = open_store(config.store_path, create=False, argument="store.path")
    except Exception:  # no store yet, or none to reach: nothing it could block
        return None
    try:
        status = route_status(store, config.route, Hooks(make_plugin_manager(None)))
    except Exception:
        return None
    finally:
        store.close()
    if status["blocked_by"] is None:
        return None
    return blocked_until_reconciled("the worker process ended, and the store now blocks its route")


class _Worker:
    """A worker process (``serve``), started for a worker thread's first table and closed
    when the thread has no more: one interpreter start and one set of kept connections per
    worker, not per table. Its standard input takes the run's settings, then a pickled
    table at a time; it answers each with the table's pickled ``TableRun``. Its standard
    error is this process's."""

    def __init__(self, run_id: str, recovery: str | None) -> None:
        paths = [os.path.abspath(path) for path in sys.path if path]  # this process's modules
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}
        level = logging.getLogger(_PACKAGE).getEffectiveLevel()
        self._settings: tuple[str, str | None, int] | None = (run_id, recovery, level)
        self._process: subprocess.Popen[bytes] | None = None
        with contextlib.suppress(OSError):  # none: each table it gets fails (``run``)
            self._process = subprocess.Popen(
                [sys.executable, "-m", "dpone_native_transfer.pipeline_worker"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                env=env,
                start_new_session=True,  # a terminal's Ctrl-C reaches this process, which
            )  # passes it on (``signal``) once the worker's handlers are in place

    def _send(self, value: Any) -> None:
        assert self._process is not None and self._process.stdin is not None
        pickle.dump(value, self._process.stdin, protocol=pickle.HIGHEST_PROTOCOL)
        self._process.stdin.flush()

    def run(self, table: PipelineTable, stop: threading.Event) -> TableRun:
        """The table's run in the worker; a worker that did not start, or ended without
        answering (killed, out of memory), is the table's failure, or its interruption when
        the run was stopped."""
        started = time.perf_counter()
        try:
            if self._settings is not None:
                self._send(self._settings)
                self._settings = None
            self._send(table)
            assert self._process is not None and self._process.stdout is not None
            ran: TableRun = pickle.load(self._process.stdout)
        except Exception:  # OSError, EOFError: the worker is gone
            self.signal(signal.SIGKILL)  # if it is not quite gone yet: ``ended`` from now on
            if self._process is not None:
                self._process.wait()
            config = table.config
            return TableRun(
                table.name,
                config.sink.table,
                INTERRUPTED if stop.is_set() else FAILED,
                config.route.as_dict(),
                seconds=time.perf_counter() - started,
                error=None if stop.is_set() else "WorkerProcessEnded",
                exit_code=EXIT_FAILED,
                left_blocked=None if stop.is_set() else _blocked_now(table),
            )
        if isinstance(ran.failure, _Foreign):
            ran = attrs.evolve(ran, failure=ran.failure.standing_in())
        return ran

    @property
    def ended(self) -> bool:
        return self._process is None or self._process.poll() is not None

    def signal(self, how: signal.Signals) -> None:
        """SIGTERM: stop its table (``pipeline_worker``; before its handlers are in place,
        the worker ends at once, without a word); SIGKILL: end it now."""
        if self._process is not None:
            with contextlib.suppress(OSError):  # it ended already
                self._process.send_signal(how)

    def close(self) -> None:
        """No more tables: the worker ends once its standard input closes."""
        if self._process is None:
            return
        with contextlib.suppress(OSError):
            self._process.stdin.close()  # type: ignore[union-attr]
        self._process.wait()
        self._process.stdout.close()  # type: ignore[union-attr]


class _Foreign(Exception):
    """A table's failure that does not pickle, sent by its type's name (all a pipeline
    reports of an error that is not dpone's: its text may hold SQL, rows or secrets)."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.name = name

    def standing_in(self) -> Exception:
        """An exception whose type has the failure's name, and its frames as a note."""
        stand_in = type(self.name, (Exception,), {})()
        stand_in.__notes__ = list(getattr(self, "__notes__", ()))
        return stand_in


def _sendable(run: TableRun) -> TableRun:
    """``run`` as it pickles: its failure with the worker's frames as a note (``--traceback``
    shows them), or a ``_Foreign`` in its place."""
    failure = run.failure
    if failure is None:
        return run
    frames = "".join(traceback.format_tb(failure.__traceback__))
    try:
        pickle.loads(pickle.dumps(failure))  # some exceptions pickle but do not load
    except Exception:
        failure = _Foreign(type(failure).__name__)
    failure.add_note(f"in the pipeline's worker process {os.getpid()}:\n{frames}")
    return attrs.evolve(run, failure=failure)


def serve(stop: threading.Event) -> None:
    """A worker process's loop (``_Worker``): each table sent runs as a worker thread runs
    it (``_run``); ``stop``, set by a signal (``pipeline_worker``), stops the table running
    at its next step before the guard arms, as it stops a thread's. The process ends when
    its standard input does, or when the pipeline's process, killed, no longer reads its
    answers."""
    answers = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # what anything else prints goes to standard error, not into the answers
    requests = sys.stdin.buffer
    run_id, recovery, level = pickle.load(requests)
    logger = logging.getLogger(_PACKAGE)  # its records as the pipeline's process shows them
    logger.setLevel(level)
    logger.addHandler(logging.StreamHandler(sys.stderr))
    logging.getLogger().addHandler(logging.NullHandler())  # a driver's text: not on stderr

    def run_one(table: PipelineTable, events: Callable[[Event], None]) -> tuple[Any, float]:
        return transfer(table.config, run_id, events=events, recovery=recovery)

    with holding_connections():
        while True:
            try:
                table = pickle.load(requests)
            except EOFError:
                return
            try:
                pickle.dump(_sendable(_run(table, run_one, stop)), answers)
                answers.flush()
            except BrokenPipeError:  # the pipeline's process is gone: its table ran guarded,
                os.dup2(os.open(os.devnull, os.O_WRONLY), answers.fileno())  # nobody to tell
                return


# -- pipelines ----------------------------------------------------------------------------------

_TABLE_HEADERS = (
    "TABLE", "TARGET", "OUTCOME", "PATH", "COMMITTED", "SKIPPED", "ROWS", "SECONDS", "ERROR",
)  # fmt: skip


def table_progress_line(number: int, of: int, name: str, run: TableRun | None) -> str:
    """A pipeline's line as a table starts (``run`` None) or ends."""
    where = f"[{number}/{of}] {one_line(name)}"
    if run is None:
        return f"{where}: started"
    if run.outcome == "succeeded":
        committed = plural(run.committed_partitions, "partition")
        return (
            f"{where} -> {one_line(run.target_table)}: committed {committed}, skipped "
            f"{run.skipped_partitions:,}, loaded {plural(run.rows_loaded, 'row')} in "
            f"{run.seconds:.2f} s"
        )
    return f"{where}: {run.outcome}" + (f" ({run.error})" if run.error else "")


def pipeline_summary_lines(result: PipelineResult, run_id: str) -> list[str]:
    """The closing summary: a row per table, then the totals."""
    rows = [
        (
            one_line(run.table),
            one_line(run.target_table),
            run.outcome,
            run.path or "-",
            f"{run.committed_partitions:,}",
            f"{run.skipped_partitions:,}",
            f"{run.rows_loaded:,}",
            f"{run.seconds:.2f}",
            run.error or "-",
        )
        for run in result.tables
    ]
    widths = [
        max(len(cell) for cell in column) for column in zip(_TABLE_HEADERS, *rows, strict=True)
    ]
    lines = [
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        for row in (_TABLE_HEADERS, *rows)
    ]
    totals = result.totals()
    counted = ", ".join(
        f"{totals[name]:,} {name}"
        for name in ("succeeded", "failed", "blocked", "interrupted", "not run")
        if totals[name] or name == "succeeded"
    )
    lines.append(
        f"{plural(totals['tables'], 'table')}: {counted}; "
        f"loaded {plural(totals['rows_loaded'], 'row')} in {result.seconds:.2f} s "
        f"with {plural(result.jobs, 'job')}"
        f"{' in worker processes' if result.workers == 'processes' else ''} (run {run_id})"
    )
    return lines


def pipeline_summary(result: PipelineResult, run_id: str) -> dict[str, Any]:
    """``run --json`` of a pipeline: an object per table, and the totals; the one object a
    stop by a signal prints too (``stopped``: ``interrupted`` or ``terminated``), each table it
    stopped with the run's exit status (a table that did not finish did not exit 0)."""
    stopped = {INTERRUPTED, NOT_RUN} if result.interrupted is not None else set()
    shown = {
        "run_id": run_id,
        "tables": [
            {**run.as_dict(), "exit_code": result.exit_code} if run.outcome in stopped
            else run.as_dict()
            for run in result.tables
        ],
        "totals": result.totals(),
    }  # fmt: skip
    if result.interrupted is not None:
        ctrl_c = isinstance(result.interrupted, KeyboardInterrupt)
        shown["stopped"] = "interrupted" if ctrl_c else "terminated"
    return shown
