"""The docs match the code: the hook reference is the hookspec docstrings, the
recovery runbook's command lines still print what the runbook shows, and every test
the design-case table of docs/hooks.md names exists."""

from __future__ import annotations

import ast
import re
import runpy
import shlex
import sqlite3
import subprocess
import sys
from pathlib import Path

from dpone_native_transfer.testing.conformance import GuardConformance

DOCS = Path(__file__).resolve().parent.parent / "docs"
KIT_TESTS = {name for name in dir(GuardConformance) if name.startswith("test_")}
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


# -- the design-case table names tests that exist ----------------------------

CASE_TABLE = "### Which test proves each required case"
CASE_ROW = re.compile(r"^\| (\d+) \| [^|]+ \| ([^|]+) \|$", re.M)


def design_case_rows(markdown: str) -> dict[int, list[str]]:
    """Case number -> the tests its row of the hooks.md table names."""
    table = markdown.split(CASE_TABLE, 1)[1]
    return {int(n): re.findall(r"`([^`]+)`", tests) for n, tests in CASE_ROW.findall(table)}


def defined_tests(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return {
        node.name
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef) and node.name.startswith("test_")
    }


def missing_tests(names: list[str]) -> list[str]:
    """The names in ``names`` that are neither a kit test nor a test function of the file."""
    missing = []
    for name in names:
        if name.startswith("GuardConformance."):
            found = name.removeprefix("GuardConformance.") in KIT_TESTS
        else:
            file, _, function = name.partition("::")
            path = DOCS.parent / file
            found = file.startswith("tests/") and path.is_file() and function in defined_tests(path)
        if not found:
            missing.append(name)
    return missing


def test_every_design_case_names_tests_that_exist():
    rows = design_case_rows((DOCS / "hooks.md").read_text(encoding="utf-8"))
    assert sorted(rows) == list(range(1, 12)), "one row per required case, 1 to 11"
    assert all(rows.values()), "every case names at least one test"
    assert missing_tests([name for names in rows.values() for name in names]) == []


def test_the_case_table_check_catches_a_test_that_is_gone():
    table = (
        f"{CASE_TABLE}\n\n| # | Case | Tests |\n|---|---|---|\n"
        "| 1 | a | `GuardConformance.test_happy_run_arms_before_the_one_target_call` |\n"
        "| 2 | b | `GuardConformance.test_no_such_thing`, `tests/test_docs.py::test_gone` |\n"
        "| 3 | c | `tests/no_such_file.py::test_x`, `docs/gen_reference.py::main` |\n"
    )
    rows = design_case_rows(table)
    assert sorted(rows) == [1, 2, 3]
    assert missing_tests([name for names in rows.values() for name in names]) == [
        "GuardConformance.test_no_such_thing",
        "tests/test_docs.py::test_gone",
        "tests/no_such_file.py::test_x",
        "docs/gen_reference.py::main",
    ]


def test_every_document_the_code_and_docs_point_to_exists():
    """Code, README and docs name documents by path (``docs/x.md``) or link (``](x.md)``): a
    doc that was merged or renamed leaves such a pointer dangling."""
    root = DOCS.parent
    texts = [
        *(root / "src").rglob("*.py"),
        *(root / "plugins").rglob("*.py"),
        root / "README.md",
        *DOCS.glob("*.md"),
    ]
    missing = []
    for file in texts:
        text = file.read_text(encoding="utf-8")
        named = re.findall(r"\bdocs/[\w./-]+\.md\b", text)
        if file.parent == DOCS:
            named += [f"docs/{link}" for link in re.findall(r"\]\(([\w.-]+\.md)", text)]
        missing += [f"{file.relative_to(root)} -> {n}" for n in named if not (root / n).is_file()]
    assert missing == []
