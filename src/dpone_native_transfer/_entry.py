"""The ``dpone-transfer`` console script. Its modules take a fifth of a second to import: a
Ctrl-C meanwhile, before the command handles signals itself, ended it with a traceback, and
a SIGTERM ended it with no word at all (``--json`` printed nothing)."""

from __future__ import annotations

import json
import signal
import sys
import threading
from typing import Any

_BEFORE = "it stopped before the run started: nothing was read or written; a rerun is safe"


class _TerminatedEarly(BaseException):
    """SIGTERM while the command's modules load."""


def main() -> int:
    previous = _terminate_raises()
    try:
        from .cli import main as command
    except (KeyboardInterrupt, _TerminatedEarly) as stop:
        return _stopped(stop)
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
    try:
        return command()
    except KeyboardInterrupt as stop:  # before the command's own handling began
        return _stopped(stop)


def _terminate_raises() -> Any:
    """SIGTERM raises ``_TerminatedEarly`` while the modules load (the command installs its
    own handling next); the handler it replaced, or None when the signal is not ours to take
    (ignored, or not the main thread)."""
    if threading.current_thread() is not threading.main_thread():
        return None
    if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        return None

    def terminate(signum: int, frame: Any) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)  # a second one ends it at once
        raise _TerminatedEarly

    return signal.signal(signal.SIGTERM, terminate)


def _stopped(stop: BaseException) -> int:
    """Its line on stderr and, with ``--json``, one JSON object on stdout, as ``cli`` reports
    a stop (the codes are ``reporting``'s, not imported: it may be what was stopped)."""
    terminated = isinstance(stop, _TerminatedEarly)
    kind, code = ("terminated", 143) if terminated else ("interrupted", 130)
    message = f"{kind} (SIGTERM): {_BEFORE}" if terminated else f"{kind}: {_BEFORE}"
    print(f"error: {message}", file=sys.stderr)
    if "--json" in sys.argv[1:]:
        print(json.dumps({"error": kind, "exit_code": code, "message": message}, sort_keys=True))
    return code
