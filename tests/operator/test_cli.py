"""The dpone-transfer console script, run as an operator or a scheduler would run it.

Most tests start the installed script in a subprocess, so the entry point, the
exit codes and what reaches stdout/stderr are the real ones. Finer config and
failure cases call ``main`` or ``load_route_config`` in-process.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path

import pytest
from helpers import routes

import dpone_native_transfer
from dpone_native_transfer import (
    ConfigInvalid,
    Governance,
    GovernanceGateFailed,
    ManualReconciliationRequired,
    SourceInvalid,
    Strategy,
    TargetCommitGuardInvalid,
    TargetCommitGuardUnhandled,
    cli,
)
from dpone_native_transfer import demo as demo_story
from dpone_native_transfer.config import load_route_config
from dpone_native_transfer.spec import type_name
from dpone_native_transfer.testing import build_sample_source

SCRIPT = str(Path(sys.executable).parent / "dpone-transfer")
PATHS = ("legacy", "staged", "file-artifact", "lazy-plan")
SECRET = "password=hunter2"

# The sample route (helpers.routes) with this module's transfer options and gates.
CLI_SECTIONS = {
    "transfer": {"chunk_rows": 16, "artifact_dir": "artifacts"},
    "gates": {"min_rows": 1, "max_rows": 5000000},
}


def dpone(*args: str | Path, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [SCRIPT, *map(str, args)], cwd=cwd, capture_output=True, text=True, timeout=120
    )


def route_text(path: str = "staged", *, cursor: bool = True) -> str:
    source = None if cursor else {"cursor_column": None}
    return routes.route_text(path=path, source=source, sections=CLI_SECTIONS)


def make_route(folder: Path, path: str = "staged", *, cursor: bool = True, rows: int = 120) -> Path:
    source = None if cursor else {"cursor_column": None}
    return routes.write_route(folder, rows=rows, path=path, source=source, sections=CLI_SECTIONS)


def query(path: Path, sql: str) -> list[tuple]:
    with contextlib.closing(sqlite3.connect(path)) as connection:
        return connection.execute(sql).fetchall()


def ids(path: Path, table: str) -> list[int]:
    return [row[0] for row in query(path, f"SELECT id FROM {table} ORDER BY id")]


# demo --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def demo(tmp_path_factory) -> tuple[subprocess.CompletedProcess[str], Path]:
    """The demo, run once in an empty folder with the default --workdir."""
    cwd = tmp_path_factory.mktemp("demo")
    return dpone("demo", cwd=cwd), cwd / "demo-work"


def test_demo_tells_the_story_and_passes(demo):
    done, workdir = demo
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    headings = [line for line in lines if line[:1].isdigit()]
    assert [heading[:2] for heading in headings] == ["1.", "2.", "3.", "4.", "5."]
    assert f"   reuse it:   dpone-transfer run {Path('demo-work') / 'route.toml'}" in lines
    first_run = "   committed 8 partitions, skipped 0, loaded 20,000 rows in "
    assert any(line.startswith(first_run) for line in lines)
    assert "   the run failed with InjectedFault: the original exception surfaced" in lines
    assert "   guard phases in the store: checkpoint_committed 11, checkpoint_incomplete 5" in lines
    assert "   blocked: native_transfer_manual_reconciliation_required" in lines
    assert "   the target was not called" in lines
    assert "   source rows 25,000 | target rows 25,000 | duplicate ids 0" in lines
    assert lines[-1].startswith("demo passed")
    assert sorted(p.name for p in workdir.iterdir()) == [
        "checkpoints.db",
        "route.toml",
        "source.db",
        "target.db",
    ]


def test_running_the_demo_route_afterwards_is_blocked_with_exit_3(demo):
    _, workdir = demo
    before = ids(workdir / "target.db", "orders_copy")
    route = workdir / "route.toml"
    done = dpone("run", route, "--run-id", "airflow-retry")
    assert done.returncode == cli.EXIT_BLOCKED
    assert done.stdout == ""
    error, batch, *rest = done.stderr.splitlines()
    assert error.startswith("error: native_transfer_manual_reconciliation_required: route orders")
    assert f"--store {workdir / 'checkpoints.db'} --route" in error  # the store it ran with
    assert batch.startswith("  batch sha256:") and "5 partitions (5 checkpoint_incomplete)" in batch
    assert any(f"guard verify {route}" in line for line in rest), rest
    assert not any(line.startswith("diagnostics:") for line in rest)  # one line per batch
    machine = dpone("run", route, "--run-id", "airflow-retry", "--json")
    assert machine.returncode == cli.EXIT_BLOCKED
    details = json.loads(machine.stdout)
    assert details["error"] == "native_transfer_manual_reconciliation_required"
    assert details["diagnostics"]["phases"] == ["checkpoint_incomplete"]
    assert len(details["diagnostics"]["partitions"]) == 5
    assert ids(workdir / "target.db", "orders_copy") == before


def test_demo_replaces_only_its_own_files(tmp_path, capsys):
    workdir = tmp_path / "work"
    workdir.mkdir()
    (workdir / "notes.txt").write_text("mine")
    (workdir / "target.db-wal").write_bytes(b"stale")
    assert cli.main(["demo", "--workdir", str(workdir)]) == 0
    assert cli.main(["demo", "--workdir", str(workdir)]) == 0, "a second demo starts afresh"
    assert (workdir / "notes.txt").read_text() == "mine"
    assert "duplicate ids 0" in capsys.readouterr().out


def test_demo_fails_when_its_story_does_not_hold(tmp_path, capsys, monkeypatch):
    """Without the injected fault there is nothing to block: the demo must say so and exit 1."""
    monkeypatch.setattr(demo_story, "phase_batch", lambda phase: lambda batch: False)
    assert cli.main(["demo", "--workdir", str(tmp_path)]) == cli.EXIT_FAILED
    out = capsys.readouterr().out
    assert "demo FAILED:" in out
    assert "   - step 3 did not fail although a checkpoint failure was injected" in out
    assert "   - the retry was not blocked" in out


# run ---------------------------------------------------------------------------------


@pytest.mark.parametrize("path", PATHS)
def test_run_copies_every_row_once_and_a_rerun_skips_everything(tmp_path, path):
    data = tmp_path / "data"
    route_file = make_route(data, path, cursor=False)
    source_ids = ids(data / "source.db", "orders")

    done = dpone("run", Path("data") / "route.toml", "--run-id", "first", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("committed 4 partitions, skipped 0, loaded 120 rows in ")
    assert done.stdout.rstrip().endswith(
        f"(route orders -> orders_copy, incremental_append, path {path}, run first)"
    )
    progress = done.stderr.splitlines()
    assert [line[:5] for line in progress[:4]] == ["[1/4]", "[2/4]", "[3/4]", "[4/4]"]
    assert " extracted 30 rows (30 rows so far, " in progress[0]
    assert progress[4] == ("target: finalize_staged_load" if path == "staged" else "target: load")
    assert ids(data / "target.db", "orders_copy") == source_ids
    if path == "file-artifact":  # made under artifact_dir, and removed with the run
        assert (data / "artifacts").is_dir() and list((data / "artifacts").iterdir()) == []

    again = dpone("run", route_file, "--run-id", "second")
    assert again.returncode == 0, again.stderr
    assert again.stdout.startswith("committed 0 partitions, skipped 4, loaded 0 rows in ")
    assert again.stderr == ""
    assert ids(data / "target.db", "orders_copy") == source_ids


def test_run_with_a_cursor_loads_only_new_rows(tmp_path):
    route_file = make_route(tmp_path)
    assert dpone("run", route_file, "--quiet").returncode == 0
    idle = dpone("run", route_file, "--quiet")
    assert idle.stdout.startswith("committed 0 partitions, skipped 0, loaded 0 rows")
    build_sample_source(tmp_path / "source.db", rows=10, partitions=4, start_id=1_000)
    done = dpone("run", route_file, "--quiet")
    assert done.returncode == 0
    assert done.stderr == ""
    assert done.stdout.startswith("committed 4 partitions, skipped 0, loaded 10 rows")
    assert ids(tmp_path / "target.db", "orders_copy") == ids(tmp_path / "source.db", "orders")


def test_default_run_id_is_utc_time_and_random(tmp_path):
    done = dpone("run", make_route(tmp_path), "--quiet")
    run_id = done.stdout.rstrip().rsplit("run ", 1)[1].rstrip(")")
    prefix, stamp, suffix = run_id.split("-")
    assert prefix == "run" and len(stamp) == 16 and stamp.endswith("Z") and stamp[8] == "T"
    assert len(suffix) == 6 and int(suffix, 16) >= 0
    assert cli.new_run_id() != cli.new_run_id()


def test_run_in_process_prints_the_summary(tmp_path, capsys):
    route_file = make_route(tmp_path, "legacy")
    assert cli.main(["run", str(route_file), "--run-id", "in-process"]) == 0
    captured = capsys.readouterr()
    assert captured.out.startswith("committed 4 partitions, skipped 0, loaded 120 rows")
    assert "[4/4] partition region=region-003 (p-" in captured.err


# failures ----------------------------------------------------------------------------


def secret_route(folder: Path) -> Path:
    """A real failure inside the target call whose sqlite message carries a secret: a column
    of the target table the load does not fill defaults to a function, named by the secret,
    that SQLite does not know (it says so at the first insert)."""
    route_file = make_route(folder, "legacy")
    with contextlib.closing(sqlite3.connect(folder / "target.db")) as connection:
        connection.execute(
            "CREATE TABLE orders_copy (id INTEGER, region TEXT, amount REAL, updated_at INTEGER,"
            f' note TEXT DEFAULT ("{SECRET}"()))'
        )
    return route_file


def test_a_constraint_refusing_rows_is_named_by_its_code_and_blocks_nothing(tmp_path):
    """A constraint (named by the secret) refusing the rows inside the target call: the load
    was rolled back, so exit 2 and the next run is not blocked; SQLite's code for the
    constraint is named, never its message or the constraint's name."""
    route_file = make_route(tmp_path, "legacy")
    with contextlib.closing(sqlite3.connect(tmp_path / "target.db")) as connection:
        connection.execute(
            "CREATE TABLE orders_copy (id INTEGER, region TEXT, amount REAL, updated_at INTEGER,"
            f' CONSTRAINT "{SECRET}" CHECK (amount < 0))'
        )
    for _ in range(2):
        done = dpone("run", route_file)
        assert done.returncode == cli.EXIT_CONFIG
        assert "native_transfer_target_constraint" in done.stderr
        assert "SQLITE_CONSTRAINT_CHECK" in done.stderr
        assert SECRET not in done.stderr + done.stdout


@pytest.mark.parametrize("path", ["legacy", "staged", "file-artifact", "lazy-plan"])
@pytest.mark.parametrize(
    ("region", "constraint"),
    [
        ("region TEXT UNIQUE ON CONFLICT REPLACE", ""),
        ("region TEXT NOT NULL /* x */ On\n Conflict   replace DEFAULT 'zz'", ""),
        ("region TEXT", ", PRIMARY KEY (region) ON CONFLICT REPLACE"),
    ],
    ids=["unique", "not-null", "table-key"],
)
def test_a_sqlite_table_replacing_on_conflict_is_refused_before_the_target(
    tmp_path, path, region, constraint
):
    """SQLite's ``ON CONFLICT REPLACE`` deletes the row a new one meets (or turns a NULL
    into the default) and counts neither as a change: the load said 120 rows applied where
    the table held 4, exit 0. Refused before the target; loaded once the clause is gone."""
    route_file = make_route(tmp_path, path)
    target = tmp_path / "target.db"
    with contextlib.closing(sqlite3.connect(target)) as connection:
        connection.execute(
            f"CREATE TABLE orders_copy (id INTEGER, {region}, amount REAL, updated_at INTEGER"
            f"{constraint})"
        )
    done = dpone("run", route_file)
    assert done.returncode == cli.EXIT_CONFIG, done.stderr
    assert "native_transfer_target_rows_mismatch" in done.stderr
    assert "ON CONFLICT REPLACE" in done.stderr
    assert query(target, "SELECT count(*) FROM orders_copy") == [(0,)]
    with contextlib.closing(sqlite3.connect(target)) as connection:
        connection.execute("DROP TABLE orders_copy")
    assert dpone("run", route_file).returncode == 0
    assert ids(target, "orders_copy") == ids(tmp_path / "source.db", "orders")


def test_a_failure_before_the_commit_is_named_by_its_code_and_blocks_nothing(tmp_path):
    """SQLite's error at the load's first insert (its text holds the secret) came before the
    COMMIT, so nothing was applied: it was reported as a foreign error and blocked the route;
    it is named by SQLite's code now, and the retry meets the same failure, not a block."""
    route_file = secret_route(tmp_path)
    for _ in range(2):
        done = dpone("run", route_file)
        assert done.returncode == cli.EXIT_FAILED
        assert done.stderr.splitlines()[-2] == (
            "error: native_transfer_target_unavailable: a statement of the load into target "
            "table 'orders_copy' failed before its commit (SQLITE_ERROR); the load was rolled "
            "back and nothing was applied; a retry may succeed"
        )
        assert SECRET not in done.stderr + done.stdout


ARMED = ("route_scanned", "guard_armed", "target_started")


@pytest.mark.parametrize(
    ("seen", "error", "left"),
    [
        ((*ARMED, "target_failed"), OSError(), "whether it applied the batch is not known"),
        (("route_scanned", "partition_extracted"), OSError(), None),  # before the target
        (("route_scanned", "target_started", "target_failed"), OSError(), None),  # unguarded
        ((*ARMED, "target_succeeded"), OSError(), "the store did not record it"),
        ((*ARMED, "target_succeeded", "checkpoints_committed"), OSError(), None),
        # the sink's own word that its transaction rolled back: failed, not blocked
        ((*ARMED, "target_failed"), "rows_mismatch", None),
        ((*ARMED, "target_failed"), "unavailable", "whether it applied the batch is not known"),
        ((*ARMED, "target_failed"), "blocked", None),  # the block's own error says it
    ],
)
def test_a_failure_says_what_it_left_blocked_only_when_it_left_a_block(seen, error, left):
    from dpone_native_transfer.errors import TargetRowsMismatch, TargetUnavailable
    from dpone_native_transfer.events import Event
    from dpone_native_transfer.reporting import Named, Reached, failure_lines

    if isinstance(error, str):
        error = {
            "rows_mismatch": TargetRowsMismatch,
            "unavailable": TargetUnavailable,
            "blocked": ManualReconciliationRequired,
        }[error]("x")
    reached = Reached()
    for name in seen:
        reached.saw(Event(name))
    said = reached.left_blocked(error)
    assert (said is None) == (left is None)
    if said is not None:
        assert left in said and "the route is blocked until it is reconciled" in said
        assert failure_lines(error, Named(), left_blocked=said)[1] == f"  {said}"


def test_a_drivers_own_log_record_stays_off_the_console(tmp_path, monkeypatch, capsys):
    """psycopg logs a lost connection's text as a warning while it unwinds a COPY; with no
    handler of the application's, Python's last-resort handler printed it on stderr."""
    import logging

    from dpone_native_transfer.connectors.sqlite import SQLiteSink

    route_file = make_route(tmp_path, "legacy")
    original = SQLiteSink.load

    def load(self, *args, **kwargs):
        logging.getLogger("psycopg").warning("error ignored terminating %s", SECRET)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(SQLiteSink, "load", load)
    monkeypatch.setattr(logging.getLogger(), "handlers", [])  # as outside pytest: none
    assert cli.main(["run", str(route_file)]) == 0
    assert SECRET not in capsys.readouterr().err


def test_traceback_flag_shows_the_drivers_own_failure(tmp_path):
    done = dpone("run", secret_route(tmp_path), "--traceback")
    assert done.returncode == cli.EXIT_FAILED
    assert "Traceback (most recent call last)" in done.stderr
    assert "the driver's own error it was made from" in done.stderr
    assert SECRET in done.stderr  # --traceback alone shows the driver's text


def test_native_failure_prints_code_and_diagnostics(tmp_path, capsys):
    route_file = make_route(tmp_path)
    route_file.write_text(route_text().replace("min_rows = 1", "min_rows = 1000"))
    assert cli.main(["run", str(route_file), "--quiet"]) == cli.EXIT_FAILED
    error, diagnostics = capsys.readouterr().err.splitlines()
    assert error.startswith(f"error: {GovernanceGateFailed.code}: ")
    assert json.loads(diagnostics.removeprefix("diagnostics: "))["gate"] == "min_rows"
    assert query(tmp_path / "target.db", "SELECT COUNT(*) FROM sqlite_master") == [(0,)]


def test_store_in_a_missing_folder_is_a_config_error(tmp_path, capsys):
    route_file = make_route(tmp_path)
    route_file.write_text(route_text().replace('"checkpoints.db"', '"missing/checkpoints.db"'))
    assert cli.main(["run", str(route_file)]) == cli.EXIT_CONFIG
    err = capsys.readouterr().err
    assert '"key": "store.path"' in err
    assert str(tmp_path) not in err


@pytest.mark.parametrize(
    ("error", "code"),
    [
        (ConfigInvalid("x"), 2),
        (ManualReconciliationRequired("x"), 3),
        (TargetCommitGuardInvalid("x"), 3),
        (TargetCommitGuardUnhandled("x"), 3),
        (SourceInvalid("x"), 1),
        (OSError("x"), 1),
    ],
)
def test_exit_codes(error, code):
    assert cli.exit_code_for(error) == code


def test_version_and_usage_errors(capsys):
    version = dpone("--version")
    assert version.returncode == 0
    assert version.stdout.strip() == f"dpone-transfer {dpone_native_transfer.__version__}"
    assert dpone_native_transfer.__version__ == metadata.version("dpone-native-transfer")
    assert dpone().returncode == 2
    assert cli.main(["run"]) == 2
    assert cli.main(["run", "x.toml", "--run-id", " "]) == 2
    assert "the run id must not be empty" in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv",
    [["run", "--json"], ["run", "x.toml", "--json", "--log-level", "loud"], ["state", "--json"]],
)
def test_a_usage_error_under_json_is_one_json_object(capsys, argv):
    assert cli.main(argv) == 2
    out, err = capsys.readouterr()
    shown = json.loads(out)  # one object, nothing else on stdout
    assert shown["error"] == "native_transfer_config_invalid"
    assert shown["message"] in err and "usage:" in err
    assert cli.main([arg for arg in argv if arg != "--json"]) == 2
    assert capsys.readouterr().out == ""  # without --json, stdout stays empty


# route files -------------------------------------------------------------------------

BAD_ROUTES = {
    "unknown key": (("[transfer]\n", '[transfer]\ncolour = "red"\n'), "transfer.colour"),
    "missing key": (('table = "orders"\n', ""), "source.table"),
    "wrong type": (("chunk_rows = 16", "chunk_rows = true"), "transfer.chunk_rows"),
    "bad enum": (('path = "{path}"', 'path = "stagd"'), "transfer.path"),
    "min > max": (("max_rows = 5000000", "max_rows = 0"), "gates.min_rows"),
}


@pytest.mark.parametrize("case", sorted(BAD_ROUTES))
def test_bad_route_file_names_the_dotted_key(tmp_path, case):
    (old, new), key = BAD_ROUTES[case]
    text = route_text().replace(old.replace("{path}", "staged"), new, 1)
    assert text != route_text()
    (tmp_path / "route.toml").write_text(text)
    done = dpone("run", tmp_path / "route.toml")
    assert done.returncode == cli.EXIT_CONFIG
    error, diagnostics = done.stderr.splitlines()
    assert error.startswith(f"error: native_transfer_config_invalid: {key} ")
    assert json.loads(diagnostics.removeprefix("diagnostics: ")) == {"key": key}
    assert str(tmp_path) not in done.stderr
    if case == "bad enum":
        assert error.endswith("must be one of: auto, file-artifact, lazy-plan, legacy, staged")
    if case == "wrong type":
        assert error.endswith("must be an integer, not a boolean")
    assert not (tmp_path / "checkpoints.db").exists()


def test_toml_syntax_error_gives_line_and_column_not_the_path(tmp_path):
    (tmp_path / "route.toml").write_text(route_text().replace('path = "staged"', 'path = "staged'))
    done = dpone("run", tmp_path / "route.toml")
    assert done.returncode == cli.EXIT_CONFIG
    error, diagnostics = done.stderr.splitlines()
    assert error.startswith(
        "error: native_transfer_config_invalid: the file given as ROUTE is not valid TOML: "
    )
    assert "(at line 13, column " in error
    assert json.loads(diagnostics.removeprefix("diagnostics: "))["line"] == 13
    assert str(tmp_path) not in done.stderr


def test_missing_route_file_names_the_argument_not_the_path(tmp_path):
    done = dpone("run", tmp_path / "secret-name" / "route.toml")
    assert done.returncode == cli.EXIT_CONFIG
    assert done.stderr.splitlines() == [
        "error: native_transfer_config_invalid: the file given as ROUTE does not exist",
        'diagnostics: {"argument": "ROUTE"}',
    ]


@pytest.mark.parametrize("kind", ["a device", "a pipe", "over 16 MiB"])
def test_a_route_file_that_is_no_regular_file_is_refused_before_it_is_read(tmp_path, kind):
    """``/dev/zero`` as a route file grew memory until the kernel killed dpone (or
    ``MemoryError``, exit 1), and a pipe waited for a writer: refused, exit 2, unread."""
    if kind == "a device":
        path = Path("/dev/zero")
    elif kind == "a pipe":
        path = tmp_path / "route.toml"
        os.mkfifo(path)
    else:
        path = tmp_path / "route.toml"
        with open(path, "wb") as big:
            big.truncate((16 << 20) + 1)
    for command in (("run", path), ("state", "show", path), ("guard", "scan", path)):
        done = dpone(*command)
        assert done.returncode == cli.EXIT_CONFIG, (command, done.stderr)
        assert "is not a route or pipeline file (a device, a pipe or over 16 MiB)" in done.stderr


def test_discover_force_never_reads_a_device_as_the_pipeline_file_to_replace(tmp_path):
    source = tmp_path / "shop.db"
    build_sample_source(source, rows=5, partitions=1)
    done = dpone("discover", source, "--write", "/dev/full", "--force")
    assert done.returncode == cli.EXIT_CONFIG and "--force replaces only" in done.stderr


def test_a_foreign_failure_under_json_is_still_one_object_on_stdout(tmp_path, monkeypatch):
    """``--json`` printed nothing on stdout for an error that is not dpone's own (an engine's
    ``OperationalError``): a scheduler parsing stdout found no object. It is named by its
    type alone, as on stderr (its text may hold SQL or rows)."""
    from helpers.cli import run_cli

    from dpone_native_transfer.runtime import TransferRuntime

    def fails(self, spec):
        raise RuntimeError("SELECT secret FROM rows")

    monkeypatch.setattr(TransferRuntime, "run", fails)
    done = run_cli("run", make_route(tmp_path), "--json")
    assert done.returncode == 1
    shown = json.loads(done.stdout)
    assert shown["error"] == "transfer_failed" and shown["exception"] == "RuntimeError"
    assert "secret" not in done.stdout + done.stderr


def test_a_target_file_name_longer_than_the_file_system_allows_is_a_config_error(tmp_path):
    """It failed inside a staged load's stage with SQLite's ``OperationalError`` (exit 1)."""
    route = make_route(tmp_path)
    text = route.read_text().replace('path = "target.db"', f'path = "{"x" * 300}.db"')
    route.write_text(text)
    done = dpone("run", route, "--json")
    assert done.returncode == cli.EXIT_CONFIG, done.stderr
    assert json.loads(done.stdout)["diagnostics"]["key"] == "target.path"


def test_a_run_id_or_a_partition_value_holding_a_newline_cannot_forge_a_line(tmp_path):
    """``--run-id $'x\\nerror: ...'`` was accepted and printed as it is in the summary,
    ``routes`` and ``state show``; a partition value's newline split its progress line."""
    from dpone_native_transfer import TransferSpec
    from dpone_native_transfer.errors import ConfigInvalid
    from dpone_native_transfer.payloads import bounds_label

    route = make_route(tmp_path)
    done = dpone("run", route, "--run-id", "x\nerror: native_transfer_forged")
    assert done.returncode == cli.EXIT_CONFIG and "no newline or control character" in done.stderr
    with pytest.raises(ConfigInvalid):
        config = load_route_config(route)
        TransferSpec(source=config.source, sink=config.sink, strategy="full_refresh",
                     path="legacy", run_id="x\x1b[31m")  # fmt: skip
    assert bounds_label({"partition": "eu\nerror: x"}, "re\tgion") == "re\\tgion=eu\\nerror: x"


def write(tmp_path: Path, text: str) -> Path:
    route_file = tmp_path / "route.toml"
    route_file.write_text(text, encoding="utf-8")
    return route_file


def config_error(tmp_path: Path, text: str) -> ConfigInvalid:
    with pytest.raises(ConfigInvalid) as info:
        load_route_config(write(tmp_path, text))
    return info.value


@pytest.mark.parametrize(
    ("old", "new", "key", "says"),
    [
        ("[gates]", "[gate]", "gate", "is not a known section; known: source, target,"),
        ("[source]\n", 'tags = ["a"]\n[source]\n', "tags", "is not a known section"),
        ("[target]\n", '[target]\n"odd key" = 1\n', 'target."odd key"', "is not a known key"),
        ("[store]\npath", "[store.extra]\nx = 1\n[store]\npath", "store.extra", "known: path"),
        ('path = "checkpoints.db"', "", "store.path", "is required but missing"),
        ("chunk_rows = 16", "chunk_rows = 0", "transfer.chunk_rows", "from 1 to 10,000,000"),
        ("chunk_rows = 16", "chunk_rows = -5", "transfer.chunk_rows", "from 1 to 10,000,000"),
        ("chunk_rows = 16", "chunk_rows = 1.5", "transfer.chunk_rows", "not a float"),
        ("chunk_rows = 16", 'chunk_rows = "16"', "transfer.chunk_rows", "not a string"),
        ("min_rows = 1", "min_rows = false", "gates.min_rows", "not a boolean"),
        ("min_rows = 1", "min_rows = -1", "gates.min_rows", "must be an integer from 0 to"),
        ("max_rows = 5000000", "max_rows = 1979-05-27", "gates.max_rows", "not a date or time"),
        ('table = "orders"', 'table = ""', "source.table", "must be a non-empty string"),
        ('table = "orders"', 'table = "a\\u0000b"', "source.table", "without NUL"),
        ('table = "orders"', "table = 7", "source.table", "must be a string, not an integer"),
        ('table = "orders"', "table = [1]", "source.table", "not an array"),
        ("incremental_append", "append", "transfer.strategy", "one of: full_refresh, incremental"),
    ],
)
def test_route_file_problems_name_their_key(tmp_path, old, new, key, says):
    text = route_text()
    assert old in text
    error = config_error(tmp_path, text.replace(old, new, 1))
    assert error.diagnostics["key"] == key
    assert error.message.startswith(f"{key} ")
    assert says in error.message


INT64_MAX = "9,223,372,036,854,775,807"
# (section line, key = value, what the message says): every number of a route file, checked
# by one rule. A gate beyond 2**63 was taken silently; an integer lag beyond it failed the run
# with OverflowError; a lease of 1e-300 seconds renewed itself without pause.
NUMBERS = [
    ("[gates]", "max_rows = 18446744073709551616", f"must be an integer from 0 to {INT64_MAX}"),
    ("[gates]", "min_rows = 9223372036854775808", f"must be an integer from 0 to {INT64_MAX}"),
    ("[gates]", "max_rows = true", "must be an integer, not a boolean"),
    ("[gates]", "max_rows = 1e400", "must be an integer, not a float"),  # TOML: infinity
    ("[gates]", "max_rows = nan", "must be an integer, not a float"),
    ("[transfer]", "chunk_rows = 10000001", "must be an integer from 1 to 10,000,000"),
    ("[transfer]", "chunk_rows = 16.0", "must be an integer, not a float"),
    ("[source]", "partition_rows = 0", "must be an integer from 1 to 10,000,000"),
    ("[source]", "partition_rows = false", "must be an integer, not a boolean"),
    ("[source]", "lag = -1", f"must be a number from 0 to {INT64_MAX}"),
    ("[source]", "lag = 9223372036854775808", f"must be a number from 0 to {INT64_MAX}"),
    ("[source]", "lag = 1e400", f"must be a number from 0 to {INT64_MAX}"),
    ("[source]", "lag = nan", f"must be a number from 0 to {INT64_MAX}"),
    ("[source]", "lag = true", "must be a number, not a boolean"),
    ("[store]", "lease_seconds = 1e-300", "must be a number from 1 to 604,800"),
    ("[store]", "lease_seconds = 604801", "must be a number from 1 to 604,800"),
    ("[store]", "lease_seconds = inf", "must be a number from 1 to 604,800"),
    ("[store]", "lease_seconds = nan", "must be a number from 1 to 604,800"),
    ("[store]", "lease_seconds = false", "must be a number, not a boolean"),
    ("[store]", 'lease_seconds = "60"', "must be a number, not a string"),
]


@pytest.mark.parametrize(("section", "line", "says"), NUMBERS)
def test_every_number_of_a_route_file_is_range_checked_naming_its_key(
    tmp_path, section, line, says
):
    text = re.sub(r"(chunk|min|max)_rows = \d+\n", "", route_text())  # each given once below
    assert section in text
    error = config_error(tmp_path, text.replace(f"{section}\n", f"{section}\n{line}\n", 1))
    key = f"{section.strip('[]')}.{line.split(' = ')[0]}"
    assert error.diagnostics == {"key": key}
    assert error.message == f"{key} {says}"


@pytest.mark.parametrize("line", ["lag = 9223372036854775807", "lag = 0.5", "lease_seconds = 1"])
def test_the_range_ends_are_taken(tmp_path, line):
    section = "[store]" if line.startswith("lease") else "[source]"
    load_route_config(write(tmp_path, route_text().replace(section, f"{section}\n{line}", 1)))


@pytest.mark.parametrize("value", [2**63, -1, True, 1.0])
def test_a_gate_given_to_the_library_is_checked_as_the_route_file_checks_it(value):
    says = "from 0 to" if type(value) is int else f"not {type_name(value)}"
    with pytest.raises(ConfigInvalid, match=f"gates.max_rows must be an integer,? {says}") as info:
        Governance(max_rows=value)
    assert info.value.diagnostics == {"key": "gates.max_rows"}
    assert Governance(min_rows=0, max_rows=2**63 - 1).enabled


def test_missing_or_non_table_section_is_named(tmp_path):
    without_store = route_text().replace('[store]\npath = "checkpoints.db"\n', "")
    assert config_error(tmp_path, without_store).message == "store section is missing"
    not_a_table = 'store = "checkpoints.db"\n' + without_store
    assert config_error(tmp_path, not_a_table).message == (
        "store must be a table ([store]), not a string"
    )


def test_unreadable_route_files_name_the_argument(tmp_path):
    (tmp_path / "binary.toml").write_bytes(b"\xff\xfe[source]")
    with pytest.raises(ConfigInvalid, match="given as ROUTE is not valid TOML: it is not UTF-8"):
        load_route_config(tmp_path / "binary.toml")
    with pytest.raises(ConfigInvalid, match="given as --config is a directory") as info:
        load_route_config(tmp_path, argument="--config")
    assert info.value.diagnostics == {"argument": "--config"}


def test_paths_are_relative_to_the_route_file(tmp_path, monkeypatch):
    route_file = make_route(tmp_path / "routes")
    monkeypatch.chdir(tmp_path)
    config = load_route_config(os.path.relpath(route_file))
    folder = tmp_path / "routes"
    assert config.source.path == str(folder / "source.db")
    assert config.sink.path == str(folder / "target.db")
    assert config.store_path == str(folder / "checkpoints.db")
    assert config.artifact_dir == str(folder / "artifacts")
    assert (config.source.table, config.source.partition_column) == ("orders", "region")
    assert config.source.cursor_column == "updated_at"
    assert (config.strategy, config.path, config.chunk_rows) == (
        Strategy.INCREMENTAL_APPEND,
        "staged",
        16,
    )
    assert (config.governance.min_rows, config.governance.max_rows) == (1, 5_000_000)


def test_optional_keys_have_defaults_and_absolute_paths_stay(tmp_path):
    store = tmp_path / "elsewhere" / "store.db"
    text = (
        route_text(cursor=False)
        .replace("chunk_rows = 16\n", "")
        .replace('artifact_dir = "artifacts"\n', "")
        .replace("[gates]\nmin_rows = 1\nmax_rows = 5000000\n", "")
        .replace('"checkpoints.db"', json.dumps(str(store)))
    )
    config = load_route_config(write(tmp_path, text))
    assert config.chunk_rows == 10_000
    assert config.artifact_dir is None
    assert config.source.cursor_column is None
    assert not config.governance.enabled
    assert config.store_path == str(store)
    spec = config.spec("r-1")
    assert (spec.run_id, spec.sink, spec.chunk_rows) == ("r-1", config.sink, 10_000)
    assert config.route.as_dict() == {
        "source_table": "orders",
        "target_table": "orders_copy",
        "strategy": "incremental_append",
    }


@pytest.mark.parametrize("module", ["dpone_native_transfer", "dpone_native_transfer.cli"])
def test_python_dash_m_runs_the_command(module):
    done = subprocess.run(
        [sys.executable, "-m", module, "--version"], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("dpone-transfer ")


@pytest.fixture
def ctrl_c_as_in_a_terminal() -> Iterator[None]:
    """Python's own Ctrl-C handler, as a terminal's process has it: a shell's background job
    (``pytest &``) inherits SIGINT ignored, which the command rightly leaves alone."""
    import signal

    inherited = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, inherited)


@pytest.mark.usefixtures("ctrl_c_as_in_a_terminal")
@pytest.mark.parametrize("wrapped", [False, True])
@pytest.mark.parametrize("sent", ["SIGTERM", "SIGINT"])
def test_a_signal_is_reported_as_itself_even_when_an_engine_wrapped_it_in_its_own_error(
    monkeypatch, capsys, wrapped, sent
):
    """A SIGTERM or Ctrl-C that lands in an engine's query or in Python code it runs comes
    back as the engine's own error (DuckDB raises RuntimeError "Query interrupted"): the
    command still says it was terminated (143) or interrupted (130). The process's own
    handlers are put back after the command."""
    import argparse
    import signal
    import time

    signum = getattr(signal, sent)

    def command(args: argparse.Namespace) -> int:
        try:
            os.kill(os.getpid(), signum)
            time.sleep(5)  # the handler raises here
        except BaseException:
            if wrapped:
                raise RuntimeError("the engine's own error") from None
            raise
        return 0

    parser = argparse.ArgumentParser()
    parser.set_defaults(handler=command, log_level="warning", traceback=False)
    monkeypatch.setattr(cli, "build_parser", lambda: parser)
    before = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    code, said = (143, "terminated (SIGTERM)") if sent == "SIGTERM" else (130, "interrupted")
    assert cli.main([]) == code
    assert f"error: {said}\n" in capsys.readouterr().err
    assert (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)) == before


def test_the_exit_codes_of_the_help_are_the_readmes():
    """The codes a scheduler sees, listed alike by ``--help`` and the README."""
    helped = dict(re.findall(r"^\s+(\d+)\s+(.+)$", cli._EPILOG, re.M))
    readme = (Path(__file__).parents[2] / "README.md").read_text(encoding="utf-8")
    documented = set(re.findall(r"`(\d{1,3})`", readme.split("Exit codes:", 1)[1][:1500]))
    assert set(helped) == documented == {"0", "1", "2", "3", "130", "143"}


def test_a_slow_run_says_its_rate_and_a_confirmation_without_a_terminal_says_yes(tmp_path):
    route = routes.write_route(tmp_path, rows=1, partitions=1, path="legacy")
    done = dpone("run", route)
    assert done.returncode == 0 and " 0 rows/s" not in done.stdout + done.stderr
    assert re.search(r"loaded 1 row in [\d.]+ s, [\d.e+-]+ rows/s", done.stdout), done.stdout
    closed = subprocess.run(
        [str(Path(sys.executable).parent / "dpone-transfer"), "state", "reset", str(route),
         "--reason", "r", "--operator", "o", "--from-now"],
        stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert closed.returncode == 2, closed.stderr
    assert "repeat with --yes" in closed.stderr and "nothing written" in closed.stderr


# ``dpone-transfer`` (its console script's function) where importing the command's modules
# is interrupted, as a Ctrl-C in the first fifth of a second does.
CTRL_C_WHILE_THE_COMMAND_IMPORTS = """
import importlib.abc, sys

class Interrupted(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "dpone_native_transfer.cli":
            raise KeyboardInterrupt
        return None

sys.meta_path.insert(0, Interrupted())
from dpone_native_transfer._entry import main
sys.exit(main())
"""


SIGTERM_WHILE_THE_COMMAND_IMPORTS = """
import importlib.abc, os, signal, sys

class Terminated(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "dpone_native_transfer.cli":
            os.kill(os.getpid(), signal.SIGTERM)
        return None

sys.meta_path.insert(0, Terminated())
from dpone_native_transfer._entry import main
sys.exit(main())
"""


def test_a_sigterm_while_the_command_starts_says_so_and_json_gets_its_object(tmp_path):
    """A scheduler's SIGTERM in the first fifth of a second ended the command with no word,
    and ``--json`` printed nothing to parse."""
    route_file = make_route(tmp_path)
    done = subprocess.run(
        [sys.executable, "-c", SIGTERM_WHILE_THE_COMMAND_IMPORTS, "run", str(route_file), "--json"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == cli.EXIT_TERMINATED
    message = (
        "terminated (SIGTERM): it stopped before the run started: nothing was read or written;"
        " a rerun is safe"
    )
    assert done.stderr == f"error: {message}\n"
    assert json.loads(done.stdout) == {
        "error": "terminated", "exit_code": cli.EXIT_TERMINATED, "message": message
    }  # fmt: skip
    assert not (tmp_path / "target.db").exists()


@pytest.mark.parametrize("stop", ["terminated", "interrupted"])
@pytest.mark.parametrize("pipeline", [False, True], ids=["route", "pipeline"])
def test_a_run_with_json_stopped_before_its_summary_prints_one_json_object(
    tmp_path, capsys, monkeypatch, stop, pipeline
):
    """A SIGTERM (or Ctrl-C) before a pipeline's first table started, or during a route's
    run, printed its line on stderr and nothing on stdout: ``--json`` promises one object."""
    route_file = make_route(tmp_path)
    if pipeline:
        route_file = tmp_path / "pipeline.toml"
        route_file.write_text(
            f'[pipeline]\ntables = ["orders"]\n[source]\npath = "{tmp_path / "source.db"}"\n'
            f'[target]\npath = "{tmp_path / "target.db"}"\n[store]\npath = "s.db"\n'
        )
    raised = cli._Terminated if stop == "terminated" else KeyboardInterrupt

    def stopped(*args, **kwargs):
        raise raised

    monkeypatch.setattr(cli, "load_pipeline" if pipeline else "transfer", stopped)
    code = cli.main(["run", str(route_file), "--json"])
    captured = capsys.readouterr()
    assert code == (cli.EXIT_TERMINATED if stop == "terminated" else cli.EXIT_INTERRUPTED)
    assert json.loads(captured.out) == {
        "error": stop, "exit_code": code, "message": captured.err.strip().removeprefix("error: ")
    }  # fmt: skip
    assert captured.err.startswith(f"error: {stop}")
    assert not (tmp_path / "target.db").exists()


def test_a_ctrl_c_while_the_command_starts_ends_it_without_a_traceback(tmp_path):
    route_file = make_route(tmp_path)
    done = subprocess.run(
        [sys.executable, "-c", CTRL_C_WHILE_THE_COMMAND_IMPORTS, "run", str(route_file)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == cli.EXIT_INTERRUPTED
    assert done.stderr == (
        "error: interrupted: it stopped before the run started: nothing was read or written;"
        " a rerun is safe\n"
    )
    assert not (tmp_path / "target.db").exists()
