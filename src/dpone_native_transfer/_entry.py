"""The ``dpone-transfer`` console script. Its modules take a fifth of a second to import: a
Ctrl-C meanwhile, before the command handles signals itself, ended it with a traceback."""

from __future__ import annotations

import sys


def main() -> int:
    try:
        from .cli import main as command

        return command()
    except KeyboardInterrupt:  # before the command's own handling began: nothing was touched
        print(
            "error: interrupted: it stopped before the run started: nothing was read or "
            "written; a rerun is safe",
            file=sys.stderr,
        )
        return 130  # reporting.EXIT_INTERRUPTED, not imported: it may be what was stopped
