"""The docs match the code: the hook reference is the hookspec docstrings, and the
recovery runbook's command lines still print what the runbook shows."""

from __future__ import annotations

import re
import runpy
import shlex
import sqlite3
import subprocess
import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parent.parent / "docs"
generator = runpy.run_path(str(DOCS / "gen_reference.py"))


def test_every_hookspec_is_documented_with_its_exact_signature_and_docstring():
    text = (DOCS / "hooks.md").read_text(encoding="utf-8")
    functions = generator["hookspec_functions"]()
    assert len(functions) == 4
    for function in functions:
        assert generator["signature_text"](function) in text, function.__name__
        assert function.__doc__ and generator["inspect"].getdoc(function) in text


def test_the_generated_hook_reference_is_up_to_date():
    assert generator["main"](["--check"]) == 0, "run: python docs/gen_reference.py"


# -- the recovery runbook runs as written -----------------------------------


BIN = Path(sys.executable).parent
TIMESTAMP = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?\+00:00")
DURATION = re.compile(r"\b\d+\.\d\d s\b")


def console_sessions(markdown: str) -> list[tuple[str, list[str], int]]:
    """(command, expected output lines, expected exit status) for every `$ ` line."""
    steps: list[tuple[str, list[str], int]] = []
    for block in re.findall(r"```console\n(.*?)```", markdown, flags=re.S):
        for line in block.splitlines():
            if line.startswith("$ "):
                steps.append((line[2:], [], 0))
            elif match := re.fullmatch(r"\[exit (\d+)\]", line):
                command, output, _ = steps[-1]
                steps[-1] = (command, output, int(match.group(1)))
            else:
                steps[-1][1].append(line)
    return steps


def normalise(line: str) -> str:
    line = DURATION.sub("<seconds> s", TIMESTAMP.sub("<time>", line))
    return " ".join(line.split())


def run_step(command: str, cwd: Path) -> tuple[list[str], int]:
    argv = shlex.split(command)
    if argv[0] == "rm":  # the store is lost
        for name in argv[1:]:
            (cwd / name).unlink()
        return [], 0
    if argv[0] == "sqlite3":  # the operator's own database client; the stdlib stands in for it
        with sqlite3.connect(cwd / argv[1]) as connection:
            rows = connection.execute(argv[2]).fetchall()
        connection.close()
        return ["|".join(str(value) for value in row) for row in rows], 0
    done = subprocess.run(
        [str(BIN / argv[0]), *argv[1:]],
        cwd=cwd,
        capture_output=True,
        text=True,
        check=False,
    )
    return (done.stdout + done.stderr).splitlines(), done.returncode


def matches(expected: list[str], actual: list[str]) -> bool:
    """Line by line after normalising; a `...` line stands for any number of lines."""
    pattern = "".join(
        r"(?:[^\n]*\n)*?" if line == "..." else re.escape(normalise(line)) + r"\n"
        for line in expected
    )
    text = "".join(normalise(line) + "\n" for line in actual)
    return re.fullmatch(pattern, text) is not None


def test_the_recovery_runbook_commands_still_produce_the_documented_output(tmp_path):
    steps = console_sessions((DOCS / "checkpoints-and-recovery.md").read_text(encoding="utf-8"))
    assert len(steps) >= 8
    for command, expected, status in steps:
        actual, code = run_step(command, tmp_path)
        assert code == status, f"{command!r} exited {code}, the runbook says {status}"
        assert matches(expected, actual), f"{command!r} printed:\n" + "\n".join(actual)


# -- the performance page shows the committed results ------------------------


def test_the_performance_table_is_the_committed_results_file():
    """docs/performance.md carries the table of benchmarks/results/latest.json, as generated."""
    repo = DOCS.parent
    table = subprocess.run(
        [sys.executable, "-m", "benchmarks", "--markdown", "benchmarks/results/latest.json"],
        cwd=repo,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert table.count("\n") > 10
    assert table in (DOCS / "performance.md").read_text(encoding="utf-8")
