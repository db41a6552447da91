"""Run the suite as one pytest process per core, each under coverage, and combine them.

``make test`` runs this: the suite is a few thousand tests of real engines, one process
at a time leaves a core idle, and CI has a time limit. Each process takes the tests whose
node id hashes to its shard (``--shard I/N``, tests/conftest.py): stable, and even enough
because the slow modules are parametrised into many small tests. Every process's output
is passed through, prefixed with its shard; the exit status is the worst of them.

``DPONE_TEST_JOBS`` sets the number of processes (default: the machine's cores, at most 4);
arguments are passed to every pytest.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading


def _echo(shard: int, stream: object) -> None:
    for line in stream:  # type: ignore[attr-defined]
        sys.stdout.write(f"[{shard}] {line}")
        sys.stdout.flush()


def main(arguments: list[str]) -> int:
    jobs = int(os.environ.get("DPONE_TEST_JOBS") or min(os.cpu_count() or 1, 4))
    coverage = [sys.executable, "-m", "coverage"]
    subprocess.run([*coverage, "erase"], check=True)
    if jobs == 1:
        return subprocess.run([*coverage, "run", "-m", "pytest", *arguments]).returncode
    processes = [
        subprocess.Popen(
            [*coverage, "run", "-p", "-m", "pytest", f"--shard={shard}/{jobs}", *arguments],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for shard in range(jobs)
    ]
    echoes = [
        threading.Thread(target=_echo, args=(shard, process.stdout))
        for shard, process in enumerate(processes)
    ]
    for echo in echoes:
        echo.start()
    codes = [process.wait() for process in processes]
    for echo in echoes:
        echo.join()
    subprocess.run([*coverage, "combine", "-q"], check=True)
    print(f"shards: {jobs}, exit statuses {codes}")
    # pytest's 5 (no tests collected) in a shard is no failure when another shard ran tests
    failed = [code for code in codes if code not in (0, 5)]
    return max(failed) if failed else min(codes)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
