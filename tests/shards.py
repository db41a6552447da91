"""Run the suite as one pytest process per core, each under coverage, and combine them.

``make test`` runs this: the suite is a few thousand tests of real engines, one process
at a time leaves a core idle, and CI has a time limit. Each process takes its shard of every
module's tests (``--shard I/N``, tests/conftest.py): stable, and even because the slow
modules are parametrised into many small tests. Every process's output
is passed through, prefixed with its shard; the exit status is the worst of them.

Each core runs ``ROUNDS`` shards, one after the other, each in a new process: chDB 4.4
leaves about six threads and eight open files behind every session it closes
(docs/connectors.md): one process running half the suite's chDB tests reached the 20,000
open files this machine allows; a quarter of the suite peaked at 14,324 open files and
6,103 threads (every thread takes one of the machine's 32,768 process ids).

Each shard's files (pytest's ``tmp_path`` folders, and every ``TMPDIR`` folder: work
folders, the throwaway PostgreSQL server) are on a tmpfs where the machine has one with room
(``/dev/shm``; ``DPONE_TEST_SCRATCH`` names another folder, or ``-`` the default temporary
folder), and removed once the shard passes. The suite's SQLite stores and targets commit
durably: a test of many small runs took 52.6 s on this machine's disk and 47.7 s on its
tmpfs alone, and 94 s on the disk beside another shard; a fresh clone's ``.ci/run`` took
1,415 s with the shards on tmpfs, 1,747 s without. A shard takes about 550 MB there.

``DPONE_TEST_JOBS`` sets the number of processes at once (default: the machine's cores, at
most 4); arguments are passed to every pytest.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path


def _echo(shard: int, stream: object) -> None:
    for line in stream:  # type: ignore[attr-defined]
        sys.stdout.write(f"[{shard}] {line}")
        sys.stdout.flush()


ROUNDS = 2
ROOT = Path(__file__).resolve().parents[1]
TMPFS = Path("/dev/shm")
ROOM = 8 << 30  # free bytes the tmpfs needs: two shards at once, and room to spare


def _scratch() -> str | None:
    """Where the shards' files go (the docstring above); None: the default temporary folder."""
    chosen = os.environ.get("DPONE_TEST_SCRATCH")
    if chosen:
        return None if chosen == "-" else chosen
    if TMPFS.is_dir() and os.access(TMPFS, os.W_OK) and shutil.disk_usage(TMPFS).free > ROOM:
        return str(TMPFS)
    return None


def main(arguments: list[str]) -> int:
    jobs = int(os.environ.get("DPONE_TEST_JOBS") or min(os.cpu_count() or 1, 4))
    shards = jobs * ROUNDS
    # Where PYTHONDONTWRITEBYTECODE is set (this CI's machine sets it), no import writes a
    # .pyc, so every child process compiled the project's modules again: 0.68 s against
    # 0.43 s to start a crash-matrix child. compileall writes them whatever it says.
    folders = [str(ROOT / folder) for folder in ("src", "plugins", "tests")]
    subprocess.run([sys.executable, "-m", "compileall", "-q", *folders], check=True)
    coverage = [sys.executable, "-m", "coverage"]
    subprocess.run([*coverage, "erase"], check=True)
    codes: dict[int, int] = {}
    scratch = _scratch()

    def lane(first: int) -> None:
        for shard in range(first, shards, jobs):
            command = [*coverage, "run", "-p", "-m", "pytest", f"--shard={shard}/{shards}"]
            env, folder = None, None
            if scratch is not None:
                folder = tempfile.mkdtemp(prefix=f"dpone-shard{shard}-", dir=scratch)
                os.chmod(folder, 0o755)  # the PostgreSQL server's user reaches its folder in it
                env = {**os.environ, "TMPDIR": folder}
                command.append(f"--basetemp={folder}/pytest")
            process = subprocess.Popen(
                [*command, *arguments],
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                env=env,
            )
            _echo(shard, process.stdout)
            codes[shard] = process.wait()
            if folder is not None and codes[shard] in (0, 5):  # a failure's files are kept
                shutil.rmtree(folder, ignore_errors=True)

    lanes = [threading.Thread(target=lane, args=(first,)) for first in range(jobs)]
    for running in lanes:
        running.start()
    for running in lanes:
        running.join()
    subprocess.run([*coverage, "combine", "-q"], check=True)
    statuses = [codes.get(shard, 1) for shard in range(shards)]  # a lane that died: failed
    where = "the default temporary folder" if scratch is None else scratch
    print(f"shards: {shards} ({jobs} at once, files in {where}), exit statuses {statuses}")
    # pytest's 5 (no tests collected) in a shard is no failure when another shard ran tests
    failed = [code for code in statuses if code not in (0, 5)]
    return max(failed) if failed else min(statuses)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
