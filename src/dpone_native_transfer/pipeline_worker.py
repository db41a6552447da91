"""A pipeline's worker process: ``python -m dpone_native_transfer.pipeline_worker``, started
by ``pipeline_run.run_tables`` with ``workers = "processes"`` (``pipeline_run.serve``).

SIGINT and SIGTERM are caught before anything else is imported: from then on either stops
the table running at its next step before the guard arms, never in the middle of an
import."""

from __future__ import annotations

import signal
import threading

STOP = threading.Event()
for _signum in (signal.SIGINT, signal.SIGTERM):
    signal.signal(_signum, lambda *_: STOP.set())

from .pipeline_run import serve  # noqa: E402  (after the handlers)

if __name__ == "__main__":
    serve(STOP)
