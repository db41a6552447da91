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

``DPONE_TEST_JOBS`` sets the number of processes at once (default: the machine's cores, at
most 4); arguments are passed to every pytest.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path


def _echo(shard: int, stream: object) -> None:
    for line in stream:  # type: ignore[attr-defined]
        sys.stdout.write(f"[{shard}] {line}")
        sys.stdout.flush()


ROUNDS = 2
ROOT = Path(__file__).resolve().parents[1]


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

    def lane(first: int) -> None:
        for shard in range(first, shards, jobs):
            process = subprocess.Popen(
                [*coverage, "run", "-p", "-m", "pytest", f"--shard={shard}/{shards}", *arguments],
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
            _echo(shard, process.stdout)
            codes[shard] = process.wait()

    lanes = [threading.Thread(target=lane, args=(first,)) for first in range(jobs)]
    for running in lanes:
        running.start()
    for running in lanes:
        running.join()
    subprocess.run([*coverage, "combine", "-q"], check=True)
    statuses = [codes.get(shard, 1) for shard in range(shards)]  # a lane that died: failed
    print(f"shards: {shards} ({jobs} at once), exit statuses {statuses}")
    # pytest's 5 (no tests collected) in a shard is no failure when another shard ran tests
    failed = [code for code in statuses if code not in (0, 5)]
    return max(failed) if failed else min(statuses)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
