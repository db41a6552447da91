"""``dpone-transfer`` run in this process, so that coverage measures it, and its path."""

from __future__ import annotations

import contextlib
import io
import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

SCRIPT = str(Path(sys.executable).parent / "dpone-transfer")  # the installed console script


def run_cli(*args: object, env: Mapping[str, str] | None = None) -> subprocess.CompletedProcess:
    """``dpone-transfer ARGS`` in this process (so coverage measures it), with ``env`` added to
    the environment for the call; returns what a subprocess run would."""
    from dpone_native_transfer import cli

    out, err = io.StringIO(), io.StringIO()
    saved = {key: os.environ.get(key) for key in env or {}}
    os.environ.update(env or {})
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = cli.main([str(arg) for arg in args])
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    return subprocess.CompletedProcess(list(args), code, out.getvalue(), err.getvalue())
