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

from dpone_native_transfer.errors import ConfigInvalid
from dpone_native_transfer.testing.conformance import GuardConformance

DOCS = Path(__file__).resolve().parents[2] / "docs"
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
        "| 2 | b | `GuardConformance.test_no_such_thing`, "
        "`tests/architecture/test_docs.py::test_gone` |\n"
        "| 3 | c | `tests/no_such_file.py::test_x`, `docs/gen_reference.py::main` |\n"
    )
    rows = design_case_rows(table)
    assert sorted(rows) == [1, 2, 3]
    assert missing_tests([name for names in rows.values() for name in names]) == [
        "GuardConformance.test_no_such_thing",
        "tests/architecture/test_docs.py::test_gone",
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


# -- every dpone-transfer command line the docs name exists --------------------------

DOC_FILES = [DOCS.parent / "README.md", *sorted(DOCS.glob("*.md"))]


def named_command_lines(markdown: str) -> list[str]:
    """What follows ``dpone-transfer`` in each inline code span and each code-block line."""
    blocks = re.findall(r"```[^\n]*\n(.*?)```", markdown, flags=re.S)
    prose = re.sub(r"```[^\n]*\n.*?```", "", markdown, flags=re.S)
    pieces = [*re.findall(r"`([^`\n]+)`", prose), *"\n".join(blocks).splitlines()]
    return [rest for piece in pieces for rest in re.findall(r"dpone-transfer\b([^`]*)", piece)]


def command_problem(line: str) -> str | None:
    """Why ``dpone-transfer <line>`` is not a command of the parser, or None.

    Words are followed down the subcommands (``scan/show`` names each of them); every
    ``--option`` must then be one the command takes. A ``...`` stands for anything: the
    check stops there."""
    from dpone_native_transfer.cli import build_parser

    parser = build_parser()
    try:
        words = shlex.split(line)
    except ValueError:
        words = line.split()
    for word in words:
        if word == "...":
            return None
        choices = next((a.choices for a in parser._actions if a.nargs == "A..."), None)
        if choices is not None and not word.startswith("-"):
            names = re.split(r"[/|]", word)
            if missing := [name for name in names if name not in choices]:
                return f"no command {missing[0]!r}"
            parser = choices[names[0]]
        elif word.lstrip("[(").startswith("--"):
            option = word.lstrip("[(").rstrip("]);,.").split("=")[0]
            if option not in parser._option_string_actions:
                return f"{parser.prog} takes no {option}"
    return None


def test_every_command_line_the_docs_name_exists():
    problems = [
        f"{path.name}: dpone-transfer{line} -> {problem}"
        for path in DOC_FILES
        for line in named_command_lines(path.read_text(encoding="utf-8"))
        if (problem := command_problem(line))
    ]
    assert problems == []


def test_the_command_check_catches_invented_commands_and_options():
    text = (
        "Run `dpone-transfer pipeline drop` or `dpone-transfer state reset r.toml --all`;\n"
        "```sh\ndpone-transfer guard scan --store s.db --json\n"
        "dpone-transfer state reset r.toml [--from-now] --reason x --operator y\n"
        "dpone-transfer guard ... --anything\n"
        "dpone-transfer guard scan/shows\n```\n"
    )
    lines = named_command_lines(text)
    assert [command_problem(line) for line in lines] == [
        "no command 'pipeline'",
        "dpone-transfer state reset takes no --all",
        None,
        None,
        None,
        "no command 'shows'",
    ]


# -- every route-file key the docs name exists ---------------------------------------


def route_key_problems(markdown: str) -> list[str]:
    """``[section] key`` (and ``= "value"``) in inline code that the route file refuses."""
    from dpone_native_transfer import config

    problems = []
    for section, key, value in re.findall(r"`\[(\w+)\] (\w+)(?: = \"([^\"]*)\")?", markdown):
        keys = config._SCHEMA.get(section, (False, {}))[1]
        if key not in keys:
            problems.append(f"[{section}] {key}")
        elif value:
            try:
                config._check_value(f"{section}.{key}", keys[key][0], value)
            except ConfigInvalid:
                problems.append(f'[{section}] {key} = "{value}"')
    return problems


def test_every_route_key_the_docs_name_exists():
    problems = [
        f"{path.name}: {problem}"
        for path in DOC_FILES
        for problem in route_key_problems(path.read_text(encoding="utf-8"))
    ]
    assert problems == []


def test_the_route_key_check_catches_invented_keys_and_values():
    text = (
        '`[transfer] schema = "evolve"`, `[transfer] strategy = "upsert"`, `[sink] path`,\n'
        '`[transfer] schema_contract = "freeze"`, `[target] kind = "duckdb"`, `[store] path`'
    )
    assert route_key_problems(text) == [
        "[transfer] schema",
        '[transfer] strategy = "upsert"',
        "[sink] path",
    ]
