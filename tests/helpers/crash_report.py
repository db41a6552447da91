"""pytest plugin of the crash matrix: one row per run, reported at the end of the session.

``tests/recovery/test_crash_matrix.py`` registers it (``pytest_plugins``) and fills a
row per run through the ``crash_matrix`` fixture. At the end of the session
the table and a headline are printed and written to ``reports/crash-matrix.json``
and ``reports/crash-matrix.md`` under the rootdir (``reports/`` is git-ignored).
A session that ran no crash-matrix test writes nothing.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
import pytest

__all__ = ["CrashMatrix", "CrashRun", "crash_matrix"]

_MATRIX = pytest.StashKey["CrashMatrix"]()
_COLUMNS = (
    ("kill point", "kill_point"),
    ("path", "path"),
    ("target", "target"),
    ("store", "store"),
    ("recovery", "recovery"),
    ("next attempt", "outcome"),
    ("blocked by", "blocked_by"),
    ("operator found", "resolved_as"),
    ("healed by itself", "healed"),
    ("operator steps", "operator_steps"),
    ("attempts", "attempts"),
    ("target rows", "target_rows"),
    ("duplicates", "duplicates"),
    ("result", "result"),
)


@attrs.define(kw_only=True)
class CrashRun:
    """One cell of the matrix: a kill, then the automatic attempts until the route is whole."""

    kill_point: str
    path: str
    target: str
    store: str
    recovery: str  # manual, or from_target
    outcome: str = "-"  # the first attempt after the kill: "blocked", "healed" or "complete"
    blocked_by: str = "-"  # the guard phases that blocked it, e.g. "4 armed"
    resolved_as: str = "-"  # what the operator recorded after counting the target's rows
    healed: str = "-"  # what the first attempt resolved itself, e.g. "4 not_applied"
    operator_steps: int = 0  # resolutions an operator had to record
    attempts: int = 0
    target_rows: int | None = None  # after the last attempt
    duplicates: int | None = None  # worst COUNT(*) - COUNT(DISTINCT id) seen in the target
    seconds: float = 0.0
    result: str = "not finished"

    def cell(self, key: str) -> str:
        value = getattr(self, key)
        return "-" if value is None else str(value)


@attrs.define
class CrashMatrix:
    runs: list[CrashRun] = attrs.Factory(list)

    @contextlib.contextmanager
    def run(
        self, kill_point: str, path: str, target: str, store: str, recovery: str
    ) -> Iterator[CrashRun]:
        """A row that says "pass" only if the block inside finished without an exception."""
        row = CrashRun(
            kill_point=kill_point, path=path, target=target, store=store, recovery=recovery
        )
        self.runs.append(row)
        began = time.perf_counter()
        try:
            yield row
        except BaseException as error:
            row.result = f"FAIL: {type(error).__name__}"
            raise
        else:
            row.result = "pass"
        finally:
            row.seconds = round(time.perf_counter() - began, 3)

    def headline(self) -> str:
        def count(what: str, attribute: str) -> str:
            values = {getattr(run, attribute) for run in self.runs}
            return f"{len(values)} {what if len(values) != 1 else what.rstrip('s')}"

        duplicates = sum(run.duplicates or 0 for run in self.runs)
        outcomes = [run.outcome for run in self.runs]
        failed = sum(run.result != "pass" for run in self.runs)
        shape = " x ".join(
            (
                count("kill points", "kill_point"),
                count("paths", "path"),
                count("targets", "target"),
                count("stores", "store"),
                count("recoveries", "recovery"),
            )
        )
        line = (
            f"crash matrix: {len(self.runs)} runs ({shape}): {duplicates} duplicate rows; "
            f"{outcomes.count('blocked')} blocked, {outcomes.count('healed')} healed by "
            f"themselves, {outcomes.count('complete')} complete"
        )
        return line + (f"; {failed} FAILED" if failed else "")

    def per_target(self) -> list[str]:
        """One line per target and recovery: how many kills healed by themselves (the first
        attempt resolved a blocked batch the target proved and completed), how many needed
        nothing, how many stayed blocked for an operator."""
        lines = []
        for target in dict.fromkeys(run.target for run in self.runs):
            for recovery in dict.fromkeys(run.recovery for run in self.runs):
                runs = [r for r in self.runs if (r.target, r.recovery) == (target, recovery)]
                if not runs:
                    continue
                outcomes = [run.outcome for run in runs]
                steps = sum(run.operator_steps for run in runs)
                duplicates = sum(run.duplicates or 0 for run in runs)
                lines.append(
                    f"target {target}, recovery {recovery}: {len(runs)} kills; "
                    f"{outcomes.count('healed')} healed by themselves, "
                    f"{outcomes.count('complete')} needed nothing, "
                    f"{outcomes.count('blocked')} blocked until an operator acted "
                    f"({steps} operator steps); {duplicates} duplicate rows"
                )
        return lines

    def table(self) -> list[list[str]]:
        return [[run.cell(key) for _, key in _COLUMNS] for run in self.runs]

    def markdown(self) -> str:
        headers = [title for title, _ in _COLUMNS]
        summary = "".join(f"- {line}\n" for line in self.per_target())
        lines = [f"# Crash matrix\n\n{self.headline()}\n\n{summary}", _md_row(headers)]
        lines.append(_md_row(["---"] * len(headers)))
        lines.extend(_md_row(row) for row in self.table())
        seconds = sum(run.seconds for run in self.runs)
        return "\n".join(lines) + f"\n\n{len(self.runs)} runs in {seconds:.1f} s\n"

    def as_json(self) -> dict[str, Any]:
        return {
            "headline": self.headline(),
            "per_target": self.per_target(),
            "seconds": round(sum(run.seconds for run in self.runs), 3),
            "runs": [attrs.asdict(run) for run in self.runs],
        }


def _md_row(cells: list[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def _aligned(rows: list[list[str]]) -> list[str]:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return ["  ".join(map(str.ljust, row, widths)).rstrip() for row in rows]


def pytest_configure(config: pytest.Config) -> None:
    config.stash[_MATRIX] = CrashMatrix()


@pytest.fixture
def crash_matrix(request: pytest.FixtureRequest) -> CrashMatrix:
    return request.config.stash[_MATRIX]


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    matrix = config.stash.get(_MATRIX, None)
    if matrix is None or not matrix.runs:
        return
    folder = Path(config.rootpath, "reports")
    folder.mkdir(exist_ok=True)
    (folder / "crash-matrix.json").write_text(json.dumps(matrix.as_json(), indent=2) + "\n")
    (folder / "crash-matrix.md").write_text(matrix.markdown())
    terminalreporter.section("crash matrix")
    for line in _aligned([[title for title, _ in _COLUMNS], *matrix.table()]):
        terminalreporter.write_line(line)
    terminalreporter.write_line(f"written to {folder / 'crash-matrix.md'} and .json")
    for line in matrix.per_target():
        terminalreporter.write_line(line)
    terminalreporter.write_line(matrix.headline(), bold=True)
