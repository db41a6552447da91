"""Engine versions: each extra is a range whose lowest version CI installs, DuckDB files of
other storage versions, and DuckDB without a sqlite_scanner extension it can load.

CI runs this file in three environments (docs/connectors.md, 'Engine versions'): `make test`
(the newest versions the ranges allow, with DuckDB 1.5.5, the newest that has a scanner
wheel), the lowest supported versions (`.ci/lowest-versions.txt`) and the newest DuckDB, which
has no scanner wheel, with the scanner of an older DuckDB left installed (`.ci/versions`).
Where the installed DuckDB decides the outcome, each test asserts the outcome of that version.
"""

from __future__ import annotations

import contextlib
import gzip
import importlib.metadata
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import duckdb
import pytest
from helpers.cli import run_cli
from helpers.routes import Route, write_route
from packaging.requirements import Requirement
from packaging.version import Version

import dpone_native_transfer
from dpone_native_transfer import DuckDBSink, TargetVersionUnsupported
from dpone_native_transfer.connectors import duckdb as duckdb_module
from dpone_native_transfer.reporting import exit_code_for
from dpone_native_transfer.testing import build_sample_source

ROOT = Path(dpone_native_transfer.__file__).parents[2]
FILES = Path(__file__).parent / "data" / "duckdb-storage"
INSTALLED = Version(duckdb.__version__)
SCANNER = "duckdb-extension-sqlite-scanner"
ENGINE_EXTRAS = ("postgres", "clickhouse", "duckdb", "airflow")


def extras() -> dict[str, list[Requirement]]:
    with open(ROOT / "pyproject.toml", "rb") as file:
        project = tomllib.load(file)["project"]
    return {
        name: [Requirement(text) for text in project["optional-dependencies"][name]]
        for name in ENGINE_EXTRAS
    }


def lowest_pins() -> dict[str, Version]:
    """``.ci/lowest-versions.txt``: the versions the lowest-versions CI step installs."""
    pins = {}
    for line in (ROOT / ".ci" / "lowest-versions.txt").read_text(encoding="utf-8").splitlines():
        line = line.split("#")[0].strip()
        if line:
            name, version = line.split("==")
            pins[name.strip()] = Version(version)
    return pins


def test_every_engine_extra_is_a_range_whose_lowest_version_ci_installs():
    """An exact pin (duckdb==1.5.5) downgraded the user's newer DuckDB and refused newer
    ones; a floor CI never installed claimed support nobody tested."""
    pins = lowest_pins()
    documented = (ROOT / "docs" / "connectors.md").read_text(encoding="utf-8")
    for extra, requirements in extras().items():
        for requirement in requirements:
            operators = {spec.operator for spec in requirement.specifier}
            assert "==" not in operators and ">=" in operators, (extra, str(requirement))
            (floor,) = [Version(s.version) for s in requirement.specifier if s.operator == ">="]
            assert pins[requirement.name] == floor, (extra, str(requirement))
            row = rf"\| `{re.escape(requirement.name)}` \| {pins[requirement.name]} \|"
            assert re.search(row, documented), f"docs/connectors.md: no row {row}"
    named = {r.name for requirements in extras().values() for r in requirements}
    assert SCANNER not in named  # it requires its own DuckDB exactly: it would downgrade
    assert set(pins) - named == {SCANNER, "psycopg-binary"}  # installed beside the extras


def test_the_installed_engines_are_in_their_ranges():
    """Whatever CI environment runs this file has versions the ranges allow."""
    checked = []
    for requirements in extras().values():
        for requirement in requirements:
            with contextlib.suppress(importlib.metadata.PackageNotFoundError):
                version = importlib.metadata.version(requirement.name)
                assert requirement.specifier.contains(version), (str(requirement), version)
                checked.append(requirement.name)
    assert {"duckdb", "pyarrow"} <= set(checked)


# --- DuckDB files of other storage versions ------------------------------------------------


def warehouse(folder: Path, written_by: str) -> Path:
    """The DuckDB file ``written_by`` that DuckDB version (``notes``: ids 1, 2, 3), as the
    route's target file; see tests/data/duckdb-storage/make.py."""
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / "warehouse.duckdb"
    with gzip.open(FILES / f"written-by-{written_by}.duckdb.gz") as packed, open(target, "wb") as f:
        shutil.copyfileobj(packed, f)
    return target


def storage_version(path: Path) -> int:
    """The storage version in a DuckDB file's main header."""
    head = path.read_bytes()[:20]
    assert head[8:12] == b"DUCK"
    return int.from_bytes(head[12:20], "little")


def route_into(target: Path, *, path: str = "staged") -> Path:
    return write_route(target.parent, rows=40, kind="duckdb", target=target.name, path=path)


def refused(result, folder: Path) -> str:
    """The stderr of a run refused for its target's storage version (exit 2)."""
    assert result.returncode == 2, result.stderr
    assert "error: native_transfer_target_version_unsupported: " in result.stderr
    assert "Traceback" not in result.stderr
    assert str(folder) not in result.stderr + result.stdout  # never the path
    assert "IO Error" not in result.stderr and "Trying to read" not in result.stderr  # DuckDB's
    return result.stderr


def test_a_file_older_than_every_supported_duckdb_is_refused_with_exit_2(tmp_path):
    """DuckDB 0.8.1 wrote storage version 51, which no DuckDB since 0.9 reads. It was
    `native_transfer_target_unavailable` ("locked or damaged"), exit 1: a scheduler retried
    it forever."""
    target = warehouse(tmp_path, "0.8.1")
    before = target.read_bytes()
    file = route_into(target)
    for _ in range(2):  # refused before the target: nothing armed, the route is not blocked
        stderr = refused(run_cli("run", file), tmp_path)
    assert "a DuckDB file of storage version 51 written by an older DuckDB" in stderr
    assert f"which the installed DuckDB {duckdb.__version__} cannot read" in stderr
    assert "EXPORT DATABASE" in stderr and "IMPORT DATABASE" in stderr
    assert '"storage_version": 51' in stderr
    assert target.read_bytes() == before
    sink = DuckDBSink(str(target), "orders_copy")
    with pytest.raises(TargetVersionUnsupported) as caught:
        sink.check_target()
    assert exit_code_for(caught.value) == 2
    with pytest.raises(TargetVersionUnsupported):
        sink.read_ledger()


def test_a_file_written_by_duckdb_2_0_1_is_read_by_2_x_and_refused_by_1_x(tmp_path):
    """DuckDB 2.0.1 writes storage version 999 (its format named in the database header),
    which DuckDB 1.x cannot read."""
    target = warehouse(tmp_path, "2.0.1")
    file = route_into(target)
    result = run_cli("run", file)
    if INSTALLED >= Version("2.0.1"):
        assert result.returncode == 0, result.stderr
        with contextlib.closing(duckdb.connect(str(target), read_only=True)) as db:
            assert db.execute("SELECT count(*) FROM orders_copy").fetchone() == (40,)
            assert db.execute("SELECT id FROM notes ORDER BY id").fetchall() == [(1,), (2,), (3,)]
        return
    stderr = refused(result, tmp_path)
    assert (
        "is a DuckDB file of storage version 999 written by DuckDB 2.0.1, which the installed "
        f"DuckDB {duckdb.__version__} cannot read: pip install 'duckdb>=2.0.1'; nothing was "
        "written"
    ) in stderr
    assert storage_version(target) == 999


@pytest.mark.parametrize("path", ["legacy", "lazy-plan"])
def test_a_file_written_by_the_lowest_supported_duckdb_is_read_and_keeps_its_version(
    tmp_path, path
):
    """An older file opened by a newer DuckDB: every supported DuckDB (1.3.0 to 2.0.1) reads
    and writes a 1.3.0 file without migrating it, so DuckDB 1.3.0 still reads it after."""
    if path == "lazy-plan" and not scanner_loads():
        path = "staged"  # without a scanner lazy-plan is refused (tested below)
    target = warehouse(tmp_path, "1.3.0")
    result = run_cli("run", route_into(target, path=path))
    assert result.returncode == 0, result.stderr
    with contextlib.closing(duckdb.connect(str(target), read_only=True)) as db:
        assert db.execute("SELECT count(*) FROM orders_copy").fetchone() == (40,)
        assert db.execute("SELECT id FROM notes ORDER BY id").fetchall() == [(1,), (2,), (3,)]
    assert storage_version(target) == 64


def test_a_file_locked_by_another_process_is_unavailable_whatever_its_storage_version(tmp_path):
    """A lock is no version problem: exit 1, a retry may succeed. The 1.3.0 file's storage
    version (64) is not the one DuckDB 2.x writes (999): only DuckDB's refusal of that version
    tells the two apart."""
    target = warehouse(tmp_path, "1.3.0")
    file = route_into(target)
    hold = "import duckdb, sys, time; c = duckdb.connect(sys.argv[1]); print('held', flush=True)"
    holder = subprocess.Popen(
        [sys.executable, "-c", hold + "; time.sleep(60)", str(target)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline() == "held\n"
        result = run_cli("run", file)
    finally:
        holder.kill()
        holder.wait()
        holder.stdout.close()
    assert result.returncode == 1, result.stderr
    assert "error: native_transfer_target_unavailable: " in result.stderr
    assert run_cli("run", file).returncode == 0


# --- DuckDB without a sqlite_scanner extension it can load ---------------------------------


def scanner_loads() -> bool:
    """Whether the installed scanner wheel has this DuckDB's extension file."""
    try:
        duckdb_module._sqlite_extension(duckdb)
    except dpone_native_transfer.ConfigInvalid:
        return False
    return True


@pytest.fixture
def without_scanner(monkeypatch):
    """No scanner this DuckDB can load: as installed where there is none (the newest DuckDB
    beside an older DuckDB's scanner), else its package made unimportable. Returns the
    version of the scanner wheel installed, or None."""
    if scanner_loads():
        monkeypatch.setitem(sys.modules, "duckdb_extension_sqlite_scanner", None)
    assert not scanner_loads()
    try:
        return importlib.metadata.version(SCANNER)
    except importlib.metadata.PackageNotFoundError:
        return None


def test_lazy_plan_into_duckdb_without_its_scanner_says_what_to_install(tmp_path, without_scanner):
    """Refused before the target (exit 2, the target file never made), naming the DuckDB
    version, the scanner found and the pip command."""
    file = write_route(tmp_path, rows=40, kind="duckdb", path="lazy-plan")
    result = run_cli("run", file)
    assert result.returncode == 2, result.stderr
    assert "error: native_transfer_config_invalid: lazy-plan into DuckDB needs DuckDB's " in (
        result.stderr
    )
    found = f"{SCANNER} {without_scanner} is installed" if without_scanner else f"{SCANNER} is not"
    assert f"of the installed DuckDB {duckdb.__version__} ({found}" in result.stderr
    assert f"pip install '{SCANNER}=={duckdb.__version__}'" in result.stderr
    assert "use legacy, staged or file-artifact" in result.stderr
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "target.duckdb").exists()


@pytest.mark.parametrize("path", ["legacy", "staged", "file-artifact"])
def test_the_other_paths_read_the_rows_in_python_without_the_scanner(
    tmp_path, without_scanner, path
):
    """With a scanner DuckDB writes the load files of legacy and file-artifact itself from
    SQLite; without one the runtime reads the rows, and every row arrives once."""
    route = Route(tmp_path, kind="duckdb")
    pulls = watch_pulls(route.sink.inner)
    route.runtime().run(route.spec(path, run_id="first"))
    route.add_rows(25)
    route.runtime().run(route.spec(path, run_id="second"))
    assert route.target_ids() == route.source_ids()
    assert route.target_rows() == route.source_rows()
    if path != "staged":  # staged asks too, but only for its own files
        assert pulls and not any(pulls)


def test_with_its_scanner_duckdb_reads_sqlite_itself(tmp_path):
    """Where the installed scanner loads (make test, the lowest versions), legacy's load file
    is DuckDB's own pull; where it does not, the guard above holds."""
    if not scanner_loads():
        assert INSTALLED > Version("1.5.5") or importlib.metadata.version(SCANNER) != str(INSTALLED)
        return
    assert importlib.metadata.version(SCANNER) == duckdb.__version__
    route = Route(tmp_path, kind="duckdb")
    pulls = watch_pulls(route.sink.inner)
    route.runtime().run(route.spec("legacy"))
    assert route.target_ids() == route.source_ids()
    assert pulls == [True]


def watch_pulls(sink: DuckDBSink) -> list[bool]:
    """Each answer of the sink's ``can_pull``: whether DuckDB reads the source itself."""
    answers: list[bool] = []
    can_pull = sink.can_pull
    sink.can_pull = lambda plan, files: answers.append(can_pull(plan, files)) or answers[-1]
    return answers


# --- a chDB data folder opened by a newer chDB ---------------------------------------------


def test_a_chdb_folder_a_newer_chdb_opened_is_refused_before_chdb_opens_it(tmp_path):
    """The folder records no version, and an older chDB sets aside every part a newer one
    wrote (ClickHouse 25.8 on 26.9's: detached/broken-on-start_*), its tables then empty, with
    no error. dpone records the newest chdb-core that opened the folder, and refuses an older
    one before it opens it. The newer version is written into the record as a newer chDB
    would leave it: no chdb-core newer than the one installed here exists."""
    file = write_route(tmp_path, rows=40, kind="clickhouse", path="staged")
    folder = tmp_path / "chdata"
    assert run_cli("run", file).returncode == 0
    installed = importlib.metadata.version("chdb-core")
    record = folder / "dpone-chdb-version"
    assert record.read_text(encoding="ascii") == installed + "\n"
    newer = f"{Version(installed).major + 1}.1.0"
    record.write_text(newer + "\n", encoding="ascii")
    result = run_cli("run", file)
    assert result.returncode == 2, result.stderr
    assert "error: native_transfer_target_version_unsupported: the chDB data folder was last " in (
        result.stderr
    )
    assert f"opened by chdb-core {newer}, newer than the installed chdb-core {installed}" in (
        result.stderr
    )
    assert f"pip install 'chdb-core>={newer}'; nothing was written" in result.stderr
    assert str(tmp_path) not in result.stderr + result.stdout
    assert record.read_text(encoding="ascii") == newer + "\n"
    record.write_text("26.7.3\n", encoding="ascii")  # an older chDB's: read, then recorded
    build_sample_source(tmp_path / "source.db", rows=10, partitions=4, start_id=41)
    result = run_cli("run", file, "--quiet")
    assert result.returncode == 0, result.stderr
    assert "loaded 10 rows" in result.stdout
    assert record.read_text(encoding="ascii") == installed + "\n"
    assert not list(folder.rglob("broken-on-start_*"))
