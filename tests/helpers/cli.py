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


def kill_while_copying(
    route: Path, *, dsn: str, who: tuple[str, str], env: Mapping[str, str], cwd: Path | None = None
) -> None:
    """Run ``dpone-transfer run ROUTE`` and SIGKILL it once the server shows its ``COPY``
    active in ``pg_stat_activity`` (``who``: the column and value that find the session, e.g.
    ``("usename", role)``); fails if the run ends first."""
    import signal
    import time

    import psycopg

    column, value = who
    copying = f"SELECT count(*) FROM pg_stat_activity WHERE {column} = %s"
    copying += " AND query LIKE 'COPY%%' AND state = 'active'"
    command = [SCRIPT, "run", str(route), "--quiet"]
    child = subprocess.Popen(command, env={**os.environ, **env}, cwd=cwd)
    try:
        with contextlib.closing(psycopg.connect(dsn, autocommit=True)) as db:
            deadline = time.monotonic() + 120
            while not db.execute(copying, (value,)).fetchone()[0]:
                assert child.poll() is None, "the run ended before its COPY was seen"
                assert time.monotonic() < deadline
                time.sleep(0.005)
        child.kill()
    finally:
        child.wait(timeout=60)
    assert child.returncode == -signal.SIGKILL
