"""pytest plugin of the pause matrix: one row per case, reported at the end of the session.

``tests/recovery/test_pause_matrix.py`` registers it (``pytest_plugins``) and fills a row per
case through the ``pause_matrix`` fixture. At the end of the session the table and a
headline are printed and written to ``reports/pause-matrix.json`` and
``reports/pause-matrix.md`` under the rootdir (``reports/`` is git-ignored). A
session that ran no pause-matrix case writes nothing.
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

__all__ = ["PauseMatrix", "PauseRun", "pause_matrix"]

_MATRIX = pytest.StashKey["PauseMatrix"]()
_COLUMNS = (
    ("paused at", "point"),
    ("path", "path"),
    ("target", "target"),
    ("store", "store"),
    ("B manual", "b_manual"),
    ("B from_target", "b_from_target"),
    ("A resumed", "a_outcome"),
    ("A applied", "a_applied"),
    ("blocked after A", "blocked_after_a"),
    ("final runs", "final"),
    ("duplicates", "duplicates"),
    ("lost", "lost"),
    ("seconds", "seconds"),
    ("result", "result"),
)


@attrs.define(kw_only=True)
class PauseRun:
    """One case: worker A stopped at ``point``, B ran, A resumed, then the final runs."""

    point: str
    path: str
    target: str
    store: str
    b_manual: str = "-"  # exit status and code of B's plain run while A was stopped
    b_from_target: str = "-"  # and of B's run with recovery = from_target, if it ran
    a_outcome: str = "-"  # A's exit status and code once resumed
    a_applied: str = "-"  # whether A's batch is in the target (its ledger row)
    blocked_after_a: str = "-"  # partitions blocked once A ended
    final: str = "-"  # the final runs' exit statuses (manual, then from_target if blocked)
    duplicates: int | None = None
    lost: int | None = None
    seconds: float = 0.0
    result: str = "not finished"

    def cell(self, key: str) -> str:
        value = getattr(self, key)
        return "-" if value is None else str(value)


@attrs.define
class PauseMatrix:
    runs: list[PauseRun] = attrs.Factory(list)

    @contextlib.contextmanager
    def run(self, point: str, path: str, target: str, store: str) -> Iterator[PauseRun]:
        """A row that says "pass" only if the block inside finished without an exception."""
        row = PauseRun(point=point, path=path, target=target, store=store)
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
            row.seconds = round(time.perf_counter() - began, 1)

    def headline(self) -> str:
        duplicates = sum(run.duplicates or 0 for run in self.runs)
        lost = sum(run.lost or 0 for run in self.runs)
        applied = sum(run.a_applied == "yes" for run in self.runs)
        failed = sum(run.result != "pass" for run in self.runs)
        line = (
            f"pause matrix: {len(self.runs)} cases: {duplicates} duplicate rows, {lost} lost "
            f"rows; the resumed worker's batch applied in {applied}, refused in "
            f"{len(self.runs) - applied}"
        )
        return line + (f"; {failed} FAILED" if failed else "")

    def table(self) -> list[list[str]]:
        return [[run.cell(key) for _, key in _COLUMNS] for run in self.runs]

    def markdown(self) -> str:
        headers = [title for title, _ in _COLUMNS]
        lines = [f"# Pause matrix\n\n{self.headline()}\n", _md_row(headers)]
        lines.append(_md_row(["---"] * len(headers)))
        lines.extend(_md_row(row) for row in self.table())
        seconds = sum(run.seconds for run in self.runs)
        return "\n".join(lines) + f"\n\n{len(self.runs)} cases in {seconds:.1f} s\n"

    def as_json(self) -> dict[str, Any]:
        return {
            "headline": self.headline(),
            "seconds": round(sum(run.seconds for run in self.runs), 1),
            "runs": [attrs.asdict(run) for run in self.runs],
        }


def _md_row(cells: list[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def _aligned(rows: list[list[str]]) -> list[str]:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return ["  ".join(map(str.ljust, row, widths)).rstrip() for row in rows]


def pytest_configure(config: pytest.Config) -> None:
    config.stash[_MATRIX] = PauseMatrix()


@pytest.fixture
def pause_matrix(request: pytest.FixtureRequest) -> PauseMatrix:
    return request.config.stash[_MATRIX]


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    matrix = config.stash.get(_MATRIX, None)
    if matrix is None or not matrix.runs:
        return
    folder = Path(config.rootpath, "reports")
    folder.mkdir(exist_ok=True)
    (folder / "pause-matrix.json").write_text(json.dumps(matrix.as_json(), indent=2) + "\n")
    (folder / "pause-matrix.md").write_text(matrix.markdown())
    terminalreporter.section("pause matrix")
    for line in _aligned([[title for title, _ in _COLUMNS], *matrix.table()]):
        terminalreporter.write_line(line)
    terminalreporter.write_line(f"written to {folder / 'pause-matrix.md'} and .json")
    terminalreporter.write_line(matrix.headline(), bold=True)
