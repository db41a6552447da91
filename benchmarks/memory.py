"""Section 5: peak RSS of the legacy and file-artifact paths at two row counts, into SQLite,
DuckDB and chDB.

Each measurement is a fresh child process (``python -m benchmarks._memory_child``)
that runs one guarded transfer into a fresh target and store and prints its
own peak RSS (``VmHWM`` from /proc/self/status). The small and large row
counts alternate (A B A B ...). Memory is flat when the peak at the large
count is within 20% of the peak at the small count. The child that only
imports the runtime and the guard gives the interpreter's own floor; into
DuckDB and chDB, a child that runs the engine's own copy of the same rows, in
one statement, gives the engine's (a diagnostic row).
"""

from __future__ import annotations

import json
import subprocess
import sys

from ._common import REPO, Row, Sizes, log, median, scratch, source_db

MEMORY_PATHS = ("legacy", "file-artifact")
MEMORY_TARGETS = ("sqlite", "duckdb", "chdb")
ENGINES = {"duckdb": "DuckDB", "chdb": "chDB"}  # their own copy is measured too
FLAT_LIMIT = 1.2


def child(path: str, rows: int, partitions: int, target: str = "sqlite") -> dict:
    source = source_db(rows, partitions) if path != "idle" else REPO
    with scratch(f"memory-{path}") as folder:
        completed = subprocess.run(
            [
                sys.executable,
                "-m",
                "benchmarks._memory_child",
                path,
                str(source),
                str(folder),
                str(rows),
                target,
            ],
            cwd=REPO,
            capture_output=True,
            text=True,
            check=False,
        )
    if completed.returncode != 0:
        raise RuntimeError(f"memory child failed:\n{completed.stderr}")
    return json.loads(completed.stdout)


def measure(sizes: Sizes) -> tuple[list[Row], dict]:
    small, large = sizes.memory_rows
    partitions = sizes.memory_partitions
    for rows in (small, large):
        source_db(rows, partitions)
    idle = [child("idle", 0, partitions)["vmhwm_kib"] / 1024 for _ in range(sizes.runs)]
    rows_out: list[Row] = []
    raw: dict = {"runs": sizes.runs, "partitions": partitions, "idle_mib": idle, "paths": {}}
    for target in MEMORY_TARGETS:
        for path in (*MEMORY_PATHS, *(("native",) if target in ENGINES else ())):
            samples: dict[int, list[dict]] = {small: [], large: []}
            for run in range(sizes.runs):
                log(f"memory: {target} {path} run {run + 1}/{sizes.runs}")
                order = (small, large) if run % 2 == 0 else (large, small)
                for rows in order:
                    samples[rows].append(child(path, rows, partitions, target))
            peak = {n: [s["vmhwm_kib"] / 1024 for s in samples[n]] for n in samples}
            seconds = {n: [s["seconds"] for s in samples[n]] for n in samples}
            ratio = median([b / a for a, b in zip(peak[small], peak[large], strict=True)])
            into = "" if target == "sqlite" else f" into {target}"
            native = path == "native"
            what = f"{ENGINES[target]}'s own copy (diagnostic)" if native else f"{path}{into}"
            rows_out.append(
                Row(
                    section="5 memory",
                    case=f"{what}: peak RSS at {large:,} rows vs {small:,} rows"
                    f" ({'copy' if native else 'transfer'} {median(seconds[large]):.1f} s vs"
                    f" {median(seconds[small]):.1f} s; interpreter alone {median(idle):.1f} MiB)",
                    value=median(peak[large]),
                    unit="MiB",
                    baseline=median(peak[small]),
                    ratio=ratio,
                    target=None if native else f"<= {FLAT_LIMIT}",
                    met=None if native else ratio <= FLAT_LIMIT,
                )
            )
            key = path if target == "sqlite" else f"{target} {path}"
            raw["paths"][key] = {
                str(n): {"peak_mib": peak[n], "seconds": seconds[n]} for n in samples
            }
    return rows_out, raw
