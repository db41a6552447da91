"""The target knows what it holds: route identity, the batch ledger, the store/target cross-check.

Each scenario is one of the ordinary operations that used to exit 0 with a
duplicate or an empty target. It runs through ``dpone-transfer`` on real
SQLite (and DuckDB) files and counts target rows against the source: every
source row exactly once, or a refusal before the target with the named code.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sqlite3
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from helpers.routes import write_route

from dpone_native_transfer import (
    SQLiteCheckpointStore,
    TransferRuntime,
)
from dpone_native_transfer.config import load_route_config
from dpone_native_transfer.lease import Lease
from dpone_native_transfer.testing import (
    FaultyStore,
    InjectedFault,
    RecordingSink,
    build_sample_source,
    phase_batch,
)

SCRIPT = str(Path(sys.executable).parent / "dpone-transfer")
MISMATCH, BUSY = "native_transfer_store_target_mismatch", "native_transfer_route_busy"
BLOCKED = "native_transfer_manual_reconciliation_required"
KINDS = ("sqlite", "duckdb")


def dpone(*args: Any, cwd: Path | None = None, stdin: str = "") -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [SCRIPT, *map(str, args)], cwd=cwd, input=stdin, capture_output=True, text=True,
        timeout=120,
    )  # fmt: skip


class Site:
    """A source, a target and a checkpoint store in one folder, and route files naming them."""

    def __init__(self, folder: Path, *, kind: str = "sqlite", rows: int = 120) -> None:
        self.folder = folder
        self.kind = kind
        self.source = folder / "source.db"
        build_sample_source(self.source, rows=rows, partitions=4)
        self.next_id = rows + 1

    def target_file(self, name: str = "target") -> Path:
        return self.folder / (f"{name}.db" if self.kind == "sqlite" else f"{name}.duckdb")

    def route(self, name: str = "route.toml", **values: Any) -> Path:
        """A route file (``helpers.routes``) naming this folder's files; ``cursor=""`` has no
        cursor column, ``ledger=False`` turns the target's ledger off."""
        fields = {
            "source": self.source,
            "source_table": "orders",
            "cursor": "updated_at",
            "kind": self.kind,
            "target": self.target_file(),
            "table": "orders_copy",
            "ledger": None,
            "strategy": "incremental_append",
            "path": "legacy",
            "store": self.folder / "checkpoints.db",
            **values,
        }
        source = {"path": fields["source"], "table": fields["source_table"]}
        return write_route(
            self.folder,
            name=name,
            kind=fields["kind"],
            target=fields["target"],
            table=fields["table"],
            strategy=fields["strategy"],
            path=fields["path"],
            store=fields["store"],
            source={**source, "cursor_column": fields["cursor"] or None},
            sections={"target": {"ledger": fields["ledger"]}, "transfer": {"chunk_rows": 16}},
        )

    def run(self, route: Path, *, code: int = 0) -> subprocess.CompletedProcess[str]:
        # --log-level debug: a refusal prints its whole diagnostics line, which tests read
        done = dpone("run", route, "--quiet", "--log-level", "debug")
        assert done.returncode == code, f"exit {done.returncode}: {done.stdout}{done.stderr}"
        return done

    def add_rows(self, count: int = 40) -> None:
        build_sample_source(self.source, rows=count, partitions=4, start_id=self.next_id)
        self.next_id += count

    def source_ids(self) -> list[int]:
        with contextlib.closing(sqlite3.connect(self.source)) as db:
            return sorted(row[0] for row in db.execute("SELECT id FROM orders"))

    def target_ids(self, target: Path | None = None, table: str = "orders_copy") -> list[int]:
        target = target or self.target_file()
        if not target.exists():
            return []
        if self.kind == "duckdb":
            import duckdb

            with contextlib.closing(duckdb.connect(str(target), read_only=True)) as db:
                return sorted(row[0] for row in db.execute(f'SELECT id FROM "{table}"').fetchall())
        with contextlib.closing(sqlite3.connect(target)) as db:
            return sorted(row[0] for row in db.execute(f'SELECT id FROM "{table}"'))

    def exactly_once(self, target: Path | None = None) -> None:
        ids = self.target_ids(target)
        assert Counter(ids) == Counter(self.source_ids()), (len(ids), len(self.source_ids()))


@pytest.fixture(params=KINDS)
def site(request: pytest.FixtureRequest, tmp_path: Path) -> Site:
    return Site(tmp_path, kind=request.param)


@pytest.fixture
def sqlite_site(tmp_path: Path) -> Site:
    return Site(tmp_path)


def refused(done: subprocess.CompletedProcess[str], code: str) -> dict[str, Any]:
    """The diagnostics of a refusal with ``code``."""
    assert f"error: {code}:" in done.stderr, done.stderr
    line = next(line for line in done.stderr.splitlines() if line.startswith("diagnostics: "))
    return json.loads(line.removeprefix("diagnostics: "))


def restore(route: Path) -> subprocess.CompletedProcess[str]:
    done = dpone("state", "restore", route, "--reason", "store lost", "--operator", "ops", "--yes")
    assert done.returncode == 0, done.stdout + done.stderr
    return done


# 1. route identity names the databases --------------------------------------------------------


def test_pointing_a_route_at_another_target_database_loads_that_one_whole(site: Site) -> None:
    first = site.route()
    site.run(first)
    other = site.target_file("other")
    site.run(site.route("other.toml", target=other))
    site.exactly_once(other)
    site.exactly_once()
    site.add_rows()
    site.run(first)
    site.exactly_once()
    assert len(site.target_ids(other)) == 120, "the other target got only its own run"


def test_a_mistyped_source_file_is_a_missing_source_not_another_sources_route(site: Site) -> None:
    """The target held this table's batches, so the route of the missing file was refused as
    another source's (exit 3), suggesting `state restore` or `state reset` for a typo."""
    site.run(site.route())
    typo = site.route("typo.toml", source=site.folder / "sourse.db")
    done = site.run(typo, code=2)
    assert "native_transfer_source_invalid" in done.stderr and "does not exist" in done.stderr
    assert "state reset" not in done.stderr and not (site.folder / "sourse.db").exists()
    site.exactly_once()


def test_shards_with_equal_table_names_share_one_store_and_each_loads(tmp_path: Path) -> None:
    """Two source databases, equal table names, one store: two routes, and fan-in works once
    an operator says the second shard's rows are not the first's (they could be: below)."""
    site = Site(tmp_path)
    shard = tmp_path / "shard-2.db"
    build_sample_source(shard, rows=50, partitions=4, start_id=1001)
    own = [site.route("a.toml", target=tmp_path / "a.db"), site.route(
        "b.toml", source=shard, target=tmp_path / "b.db")]  # fmt: skip
    for route in own:
        site.run(route)
    assert site.target_ids(tmp_path / "a.db") == site.source_ids()
    assert site.target_ids(tmp_path / "b.db") == list(range(1001, 1051))
    fan_in = [site.route("c.toml", target=tmp_path / "all.db"), site.route(
        "d.toml", source=shard, target=tmp_path / "all.db")]  # fmt: skip
    site.run(fan_in[0])
    done = site.run(fan_in[1], code=3)
    assert refused(done, MISMATCH)["mismatch"] == "same_table_other_source"
    assert "state reset" in done.stderr and "state restore" in done.stderr
    started = dpone("state", "reset", fan_in[1], "--reason", "shard 2 of orders",
                    "--operator", "ops", "--yes")  # fmt: skip
    assert started.returncode == 0, started.stdout + started.stderr
    for _ in range(2):
        for route in fan_in:
            site.run(route)
    assert site.target_ids(tmp_path / "all.db") == sorted(
        site.source_ids() + list(range(1001, 1051))
    )


def test_a_copy_of_the_source_database_is_refused_until_its_history_is_adopted(
    sqlite_site: Site,
) -> None:
    """A route reading a copy (a replica, a moved file, the server under another name) of the
    source another route loaded into the same table appended all 120 rows again, exit 0."""
    site = sqlite_site
    site.run(site.route())
    replica = site.folder / "replica.db"
    shutil.copy(site.source, replica)
    route = site.route("replica.toml", source=replica)
    done = site.run(route, code=3)
    diagnostics = refused(done, MISMATCH)
    assert diagnostics["mismatch"] == "same_table_other_source"
    assert len(diagnostics["batch_ids"]) == 1
    # the commands name the route file the run was given; no other path is shown
    assert f"state restore {route} " in done.stderr
    assert str(site.folder) not in done.stderr.replace(str(route), "ROUTE_FILE")
    assert "target: disagrees: " in dpone("state", "show", route).stdout  # as the run does
    site.exactly_once()
    restore(route)
    assert site.run(route).stdout.startswith("committed 0 partitions, skipped 0, loaded 0 rows")
    site.source = replica  # the copy is the source from now on
    site.add_rows()
    assert "loaded 40 rows" in site.run(route).stdout
    site.exactly_once()


def test_a_full_refresh_from_a_copy_of_the_source_is_not_refused(sqlite_site: Site) -> None:
    site = sqlite_site
    site.run(site.route())
    replica = site.folder / "replica.db"
    shutil.copy(site.source, replica)
    site.run(site.route("replica.toml", source=replica, strategy="full_refresh"))
    site.exactly_once()


def test_two_engines_with_equal_table_names_share_one_store(tmp_path: Path) -> None:
    site = Site(tmp_path)
    into_sqlite = site.route("s.toml")
    into_duckdb = site.route("d.toml", kind="duckdb", target=tmp_path / "target.duckdb")
    for route in (into_sqlite, into_duckdb, into_sqlite, into_duckdb):
        site.run(route)
    site.exactly_once()
    duck = Site.__new__(Site)
    duck.__dict__.update(site.__dict__, kind="duckdb")
    duck.exactly_once(tmp_path / "target.duckdb")


# 2 and 3. the store is lost, replaced or restored: the target's ledger refuses it -----------------


def _lose_by_deleting(site: Site, route: Path) -> Path:
    for name in ("checkpoints.db", "checkpoints.db-wal", "checkpoints.db-shm"):
        (site.folder / name).unlink(missing_ok=True)
    return route


def _lose_by_replacing_with_an_empty_store(site: Site, route: Path) -> Path:
    _lose_by_deleting(site, route)
    SQLiteCheckpointStore(site.folder / "checkpoints.db").close()
    return route


def _lose_by_moving_the_route_file(site: Site, route: Path) -> Path:
    """The route file moves to a new folder; its store is relative, so a new one is made."""
    (site.folder / "moved").mkdir()
    return site.route("moved/route.toml", store="checkpoints.db")


LOSSES = {
    "deleted": _lose_by_deleting,
    "replaced-by-an-empty-store": _lose_by_replacing_with_an_empty_store,
    "moved-with-the-route-file": _lose_by_moving_the_route_file,
}


@pytest.mark.parametrize("loss", sorted(LOSSES))
def test_a_lost_store_is_refused_then_restored_from_the_target(site: Site, loss: str) -> None:
    route = site.route()
    site.run(route)
    site.add_rows()
    route = LOSSES[loss](site, route)
    before = site.target_ids()
    done = site.run(route, code=3)
    diagnostics = refused(done, MISMATCH)
    assert diagnostics["mismatch"] == "target_ahead_of_store"
    assert "state restore" in done.stderr
    assert site.target_ids() == before, "nothing was written"
    restore(route)
    ran = site.run(route)
    assert ran.stdout.startswith("committed 4 partitions, skipped 0, loaded 40 rows")
    site.exactly_once()


def test_a_store_restored_from_a_backup_taken_before_the_killed_run(sqlite_site: Site) -> None:
    """The runbook's old advice for a corrupt store: restore a backup. The ledger knows better."""
    site = sqlite_site
    route = site.route()
    site.run(route)
    backup = site.folder / "backup.db"
    shutil.copy(site.folder / "checkpoints.db", backup)
    site.add_rows()
    config = load_route_config(route)
    with SQLiteCheckpointStore(config.store_path) as store:  # the target commits, the worker dies
        faulty = FaultyStore(store)
        faulty.fail_batch(phase_batch("target_outcome_unknown"), error=OSError("killed"))
        sink = RecordingSink(config.sink, fail="after")
        with pytest.raises(InjectedFault):
            TransferRuntime(faulty).run(config.spec("killed-run", sink=sink))
    shutil.copy(backup, site.folder / "checkpoints.db")
    done = site.run(route, code=3)
    assert refused(done, MISMATCH)["mismatch"] == "target_ahead_of_store"
    site.exactly_once()  # the killed run's rows are there once; nothing was appended
    restore(route)
    assert site.run(route).stdout.startswith("committed 0 partitions")
    site.exactly_once()


def test_a_store_copied_without_its_wal_file(sqlite_site: Site) -> None:
    site = sqlite_site
    route = site.route()
    site.run(route)
    site.add_rows()
    store_file = site.folder / "checkpoints.db"
    with contextlib.closing(sqlite3.connect(store_file)) as keep_the_wal:
        keep_the_wal.execute("SELECT 1 FROM checkpoint_latest").fetchall()
        site.run(route)  # its commits stay in the -wal file while another connection is open
        shutil.copy(store_file, site.folder / "copied.db")
    for suffix in ("", "-wal", "-shm"):
        Path(f"{store_file}{suffix}").unlink(missing_ok=True)
    shutil.move(site.folder / "copied.db", store_file)
    site.add_rows()
    done = site.run(route, code=3)
    assert refused(done, MISMATCH)["mismatch"] == "target_ahead_of_store"
    restore(route)
    site.run(route)
    site.exactly_once()


def _target_files(site: Site) -> list[Path]:
    target = site.target_file()
    return [target, *(Path(f"{target}{suffix}") for suffix in ("-wal", "-journal", ".wal"))]


@pytest.mark.parametrize("strategy", ["incremental_append", "full_refresh"])
def test_a_target_replaced_by_an_empty_one_is_refused_then_loaded_again(
    site: Site, strategy: str
) -> None:
    route = site.route(strategy=strategy)
    site.run(route)
    site.add_rows()
    site.run(route)
    for file in _target_files(site):
        file.unlink(missing_ok=True)
    done = site.run(route, code=3)
    assert refused(done, MISMATCH)["mismatch"] == "store_ahead_of_target"
    assert "guard verify" in done.stderr and "state restore" in done.stderr
    assert site.target_ids() == []
    restored = restore(route)
    assert "mark 8 committed partitions the target does not hold for loading again" in (
        restored.stdout
    ), restored.stdout
    assert "loaded 160 rows" in site.run(route).stdout, "one run loads the lost windows"
    site.exactly_once()
    site.run(route)
    site.exactly_once()


def test_a_target_restored_from_an_older_backup_loads_what_it_lost(site: Site) -> None:
    """The warehouse is rolled back to last night: the rows loaded since are loaded again."""
    route = site.route()
    site.run(route)
    backup = site.folder / "backup"
    backup.mkdir()
    for file in _target_files(site):
        if file.exists():
            shutil.copy(file, backup / file.name)
    site.add_rows()
    site.run(route)
    site.add_rows(20)
    site.run(route)
    for file in _target_files(site):
        file.unlink(missing_ok=True)
        if (backup / file.name).exists():
            shutil.copy(backup / file.name, file)
    assert len(site.target_ids()) == 120
    done = site.run(route, code=3)
    assert refused(done, MISMATCH)["mismatch"] == "store_ahead_of_target"
    restored = restore(route)
    assert "source state:" in restored.stdout
    site.run(route)
    site.exactly_once()


def test_a_copied_folder_is_refused_then_restored_without_a_duplicate(sqlite_site: Site) -> None:
    """Source, target and store copied elsewhere: a new route, whose target holds old batches."""
    site = sqlite_site
    site.run(site.route())
    copy = Site.__new__(Site)
    copy.__dict__.update(site.__dict__, folder=site.folder / "copy")
    shutil.copytree(site.folder, copy.folder, ignore=shutil.ignore_patterns("copy"))
    copy.source = copy.folder / "source.db"
    route = copy.route()
    copy.add_rows()
    assert refused(copy.run(route, code=3), MISMATCH)["mismatch"] == "target_ahead_of_store"
    restore(route)
    copy.run(route)
    copy.exactly_once()


# respelling, renaming and strategy switches on a blocked route ---------------------------------


def _block(site: Site, route: Path) -> None:
    """The target committed, then the run died before recording it: the route blocks."""
    site.run(route)
    site.add_rows()
    config = load_route_config(route)
    with SQLiteCheckpointStore(config.store_path) as store:
        faulty = FaultyStore(store)
        faulty.fail_batch(phase_batch("target_outcome_unknown"), error=OSError("killed"))
        with pytest.raises(InjectedFault):
            TransferRuntime(faulty).run(
                config.spec("dies", sink=RecordingSink(config.sink, fail="after"))
            )


@pytest.mark.parametrize(
    "change",
    [
        {"table": "Orders_Copy"},
        {"table": "ORDERS_COPY"},
        {"strategy": "full_refresh"},
        {"path": "staged"},
        {"cursor": ""},
    ],
    ids=["Orders_Copy", "ORDERS_COPY", "full_refresh", "other-path", "no-cursor"],
)
def test_a_blocked_target_table_stays_blocked_however_the_route_is_respelled(
    site: Site, change: dict[str, str]
) -> None:
    route = site.route()
    _block(site, route)
    before = site.target_ids()
    done = site.run(site.route("changed.toml", **change), code=3)
    assert f"error: {BLOCKED}:" in done.stderr
    assert site.target_ids() == before


def test_verify_of_a_route_shows_the_block_another_route_of_its_table_left(site: Site) -> None:
    """A refresh route's batch of unknown outcome blocks the append route of its table: the
    append's run exited 3, while ``guard verify`` of the append's file said "nothing blocks"
    (exit 0). It shows that batch, proven from the target, and the append's own
    ``--recovery from_target`` run heals it, as its error says."""
    append, refresh = site.route(), site.route("refresh.toml", strategy="full_refresh")
    site.run(append)
    _block(site, refresh)
    blocked = site.run(append, code=3)
    assert "left by route(s) writing the same target table" in blocked.stderr
    verified = dpone("guard", "verify", append, "--json")
    assert verified.returncode == 3, verified.stderr
    found = [json.loads(line) for line in verified.stdout.splitlines()]
    proofs = [item for item in found if "proof" in item]
    assert [(p["route"]["strategy"], p["proof"]["verdict"]) for p in proofs] == [
        ("full_refresh", "applied")
    ], found
    site.run(append, code=3)  # manual recovery: still blocked
    healed = dpone("run", append, "--recovery", "from_target", "--quiet")
    assert healed.returncode == 0, healed.stderr
    site.exactly_once()


def test_a_batch_column_proves_only_its_own_routes_batches(tmp_path: Path) -> None:
    """Two routes append into one ClickHouse table; A has a batch column, B none. B's batch,
    applied, blocked: A's ``--recovery from_target`` counted it by A's column (0 rows) and
    resolved it as not applied, audited ("as the target's ledger proves"). It is left for
    B's own proof now: ClickHouse's ledger row proves nothing without B's column."""
    files = {}
    for name, table, start, extra in (
        ("a", "oa", 0, 'batch_column = "ab"\n'),
        ("b", "ob", 1000, ""),
    ):
        folder = tmp_path / name
        folder.mkdir()
        with contextlib.closing(sqlite3.connect(folder / "source.db")) as db:
            db.execute(f"CREATE TABLE {table} (id INTEGER PRIMARY KEY, region TEXT, at INTEGER)")
            rows = [(start + i, "eu" if i % 2 else "us", i) for i in range(1, 11)]
            db.executemany(f"INSERT INTO {table} VALUES (?, ?, ?)", rows)
            db.commit()
        files[name] = folder / "route.toml"
        files[name].write_text(
            f'[source]\npath = "source.db"\ntable = "{table}"\npartition_column = "region"\n'
            'cursor_column = "at"\n\n[target]\nkind = "clickhouse"\npath = "../chdata"\n'
            f'table = "orders_copy"\n{extra}\n[transfer]\nstrategy = "incremental_append"\n'
            'path = "legacy"\n\n[store]\npath = "../checkpoints.db"\n'
        )
        assert dpone("run", files[name], "--quiet").returncode == 0
    with contextlib.closing(sqlite3.connect(tmp_path / "b" / "source.db")) as db:
        db.executemany(
            "INSERT INTO ob VALUES (?, 'eu', ?)", [(2000 + i, 100 + i) for i in range(5)]
        )
        db.commit()

    # B's batch committed, its promotion failed, in a process now gone (a ClickHouse batch no
    # row of which is found heals only once the process that armed it is gone)
    child = (
        "import sys\n"
        "from dpone_native_transfer.application import transfer\n"
        "from dpone_native_transfer.pipeline import load_route\n"
        "from dpone_native_transfer.testing import FaultyStore, InjectedFault, phase_batch\n"
        "def failing(real):\n"
        "    faulty = FaultyStore(real)\n"
        "    faulty.fail_batch(phase_batch('checkpoint_committed'), error=InjectedFault('x'))\n"
        "    return faulty\n"
        "try:\n"
        "    transfer(load_route(sys.argv[1]), 'applied', wrap_store=failing)\n"
        "except InjectedFault:\n"
        "    sys.exit(7)\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    blocked = subprocess.run([sys.executable, "-c", child, str(files["b"])], env=env)
    assert blocked.returncode == 7
    healed = dpone("run", files["a"], "--recovery", "from_target", "--quiet")
    assert healed.returncode == 3, healed.stdout + healed.stderr
    assert "resolved as" not in healed.stdout + healed.stderr
    with contextlib.closing(sqlite3.connect(tmp_path / "checkpoints.db")) as store:
        assert store.execute("SELECT count(*) FROM audit").fetchone() == (0,)
    verified = dpone("guard", "verify", files["b"], "--json")
    (proof,) = [json.loads(line) for line in verified.stdout.splitlines() if '"proof"' in line]
    assert proof["proof"]["verdict"] == "applied" and proof["route"]["source_table"] == "ob"
    assert dpone("run", files["b"], "--quiet").returncode == 3  # still B's to resolve


def test_a_renamed_source_table_does_not_bypass_the_guard(sqlite_site: Site) -> None:
    site = sqlite_site
    _block(site, site.route())
    with contextlib.closing(sqlite3.connect(site.source)) as db:
        db.execute("ALTER TABLE orders RENAME TO orders_v2")
        db.commit()
    before = site.target_ids()
    done = site.run(site.route("renamed.toml", source_table="orders_v2"), code=3)
    assert f"error: {BLOCKED}:" in done.stderr
    assert "left by route(s) writing the same target table" in done.stderr
    assert site.target_ids() == before


def test_incremental_then_a_full_refresh_then_incremental_again_continues(site: Site) -> None:
    """The 'repair' refresh records how far it loaded; the incremental route continues there."""
    incremental, refresh = site.route(), site.route("refresh.toml", strategy="full_refresh")
    site.run(incremental)
    site.add_rows()
    site.run(refresh)
    site.exactly_once()
    site.add_rows()
    ran = site.run(incremental)
    assert ran.stdout.startswith("committed 4 partitions, skipped 0, loaded 40 rows")
    site.exactly_once()
    site.add_rows()
    site.run(incremental)
    site.exactly_once()


def test_a_cursorless_append_after_another_routes_refresh_is_refused(sqlite_site: Site) -> None:
    site = sqlite_site
    append = site.route(cursor="")
    site.run(append)
    site.run(site.route("refresh.toml", cursor="", strategy="full_refresh"))
    build_sample_source(site.source, rows=10, partitions=6, start_id=site.next_id)  # new regions
    done = site.run(append, code=3)
    assert refused(done, MISMATCH)["mismatch"] == "replaced_by_another_route"
    assert Counter(site.target_ids()) == Counter(range(1, 121))


# 4. the lease ----------------------------------------------------------------------------------


def test_two_runs_of_one_route_at_once_never_load_twice(sqlite_site: Site) -> None:
    site = sqlite_site
    site.add_rows(20_000)
    route = site.route()
    first = subprocess.Popen([SCRIPT, "run", str(route), "--quiet"], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)  # fmt: skip
    time.sleep(0.3)
    second = dpone("run", route, "--quiet")
    out, err = first.communicate(timeout=120)
    codes = sorted([first.returncode, second.returncode])
    assert codes in ([0, 0], [0, 1]), (first.returncode, err, second.returncode, second.stderr)
    if codes == [0, 1]:
        assert BUSY in err + second.stderr
        assert "is being written by" in err + second.stderr
    site.exactly_once()


def test_resolve_refuses_while_an_attempt_holds_the_lease(sqlite_site: Site) -> None:
    site = sqlite_site
    route = site.route()
    _block(site, route)
    config = load_route_config(route)
    batch = _blocked_batch(route)  # verify leaves a route out while a run holds its lease
    with SQLiteCheckpointStore(config.store_path) as store:
        with Lease(store.lease_table(), config.route, run_id="still-running", seconds=60):
            done = dpone(
                "guard", "resolve", route, "--batch", batch, "--from-target",
                "--reason", "r", "--operator", "o", "--yes",
            )  # fmt: skip
    assert done.returncode == 1, done.stderr
    assert BUSY in done.stderr and "still-running" in done.stderr


def test_resolve_left_at_its_prompt_refuses_if_the_route_changed_meanwhile(
    sqlite_site: Site,
) -> None:
    """Compare-and-set: what the operator confirmed must still be what the store holds."""
    site = sqlite_site
    route = site.route()
    _block(site, route)
    batch = _blocked_batch(route)
    args = [SCRIPT, "guard", "resolve", str(route), "--batch", batch, "--from-target",
            "--reason", "r", "--operator", "slow"]  # fmt: skip
    waiting = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)  # fmt: skip
    assert waiting.stdout is not None and waiting.stdin is not None
    shown = [waiting.stdout.readline() for _ in range(5)]  # flushed with the prompt
    assert shown[0].startswith("route orders -> orders_copy"), shown
    assert all("-> committed/checkpoint_committed" in line for line in shown[1:]), shown
    fast = dpone("guard", "resolve", route, "--batch", batch, "--from-target",
                 "--reason", "r", "--operator", "fast", "--yes")  # fmt: skip
    assert fast.returncode == 0, fast.stderr
    site.run(route)  # a run commits after the operator's view was printed
    out, err = waiting.communicate("y\n", timeout=60)
    assert waiting.returncode == 2, out + err
    assert "native_transfer_resolution_conflict" in err
    site.exactly_once()


def _blocked_batch(route: Path) -> str:
    done = dpone("guard", "verify", route, "--json")
    assert done.returncode == 3, done.stderr
    return json.loads(done.stdout.splitlines()[0])["batch_id"]


# 5. proof-backed recovery ----------------------------------------------------------------------


def test_verify_proves_a_blocked_batch_applied_and_resolve_from_target_heals_it(site: Site) -> None:
    route = site.route()
    _block(site, route)
    verified = dpone("guard", "verify", route, "--json")
    assert verified.returncode == 3
    [proof] = [json.loads(line) for line in verified.stdout.splitlines()]
    assert proof["proof"]["verdict"] == "applied" and proof["proof"]["rows"] == 40
    store_only = dpone("guard", "verify", "--store", site.folder / "checkpoints.db", "--json")
    assert json.loads(store_only.stdout.splitlines()[0])["proof"]["verdict"] == "unknown"
    wrong = dpone("guard", "resolve", route, "--batch", proof["batch_id"], "--as",
                  "failed_before_target", "--reason", "r", "--operator", "o", "--yes")  # fmt: skip
    assert wrong.returncode == 2 and "--force" in wrong.stderr
    done = dpone("guard", "resolve", route, "--batch", proof["batch_id"], "--from-target",
                 "--reason", "ledger", "--operator", "o", "--yes")  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert dpone("guard", "verify", route).returncode == 0
    assert site.run(route).stdout.startswith("committed 0 partitions, skipped 4, loaded 0 rows")
    site.exactly_once()
    with SQLiteCheckpointStore(site.folder / "checkpoints.db") as store:
        [record] = store.list_audit(load_route_config(route).route)
    assert record["resolved_as"] == "from_target"
    assert record["proof"][proof["batch_id"]]["verdict"] == "applied"


def test_a_batch_resolved_unchecked_against_the_ledger_is_restored_from_it(site: Site) -> None:
    """Resolved as not applied by ``--store``/``--route`` (unchecked) though the ledger holds
    it: every run refused the store as contradicting the target, and both commands the
    advice and the runbook named were refused too (a dead end). ``state restore`` records
    what the ledger proves, and the advice names it."""
    route = site.route()
    _block(site, route)
    batch = _blocked_batch(route)
    names = load_route_config(route).route
    unchecked = dpone(
        "guard", "resolve", "--store", site.folder / "checkpoints.db", "--route",
        names.source_table, names.target_table, str(names.strategy), "--batch", batch,
        "--as", "failed_before_target", "--reason", "r", "--operator", "o", "--yes",
    )  # fmt: skip
    assert unchecked.returncode == 0, unchecked.stderr
    refused = site.run(route, code=3)
    assert "store_contradicts_target" in refused.stderr and "state restore" in refused.stderr
    restore(route)
    assert "loaded 0 rows" in site.run(route).stdout
    site.exactly_once()
    site.add_rows()
    assert "loaded 40 rows" in site.run(route).stdout
    site.exactly_once()


def test_a_target_locked_for_now_is_retryable_for_the_commands_that_read_its_ledger(
    tmp_path: Path,
) -> None:
    """Another process holds the DuckDB file: ``guard resolve --from-target`` and ``state
    restore`` said ``config_invalid`` (exit 2, "a retry will not help"), where a run and
    ``resolve --as`` say ``target_unavailable`` (exit 1)."""
    site = Site(tmp_path, kind="duckdb")
    route = site.route()
    _block(site, route)
    batch = _blocked_batch(route)
    holder = subprocess.Popen(
        [sys.executable, "-c", "import duckdb, sys, time\n"
         "db = duckdb.connect(sys.argv[1]); print('held', flush=True); time.sleep(60)",
         str(site.target_file())],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        proven = dpone("guard", "resolve", route, "--batch", batch, "--from-target",
                       "--reason", "r", "--operator", "o", "--yes")  # fmt: skip
        assert proven.returncode == 1 and "native_transfer_target_unavailable" in proven.stderr
        _lose_by_deleting(site, route)
        done = dpone("state", "restore", route, "--reason", "r", "--operator", "o", "--yes")
        assert done.returncode == 1 and "native_transfer_target_unavailable" in done.stderr
    finally:
        holder.kill()
        holder.communicate()


def test_an_emptied_table_reset_after_a_reset_from_now_excuses_every_batch_it_lost(
    site: Site,
) -> None:
    """``state reset --from-now`` forgets the route's checkpoints and keeps their rows; the
    table emptied later and reset again excused only the batches the store still held, so a
    restore after a lost store counted the forgotten ones as held and refused a table that
    held exactly the source's rows."""
    route = site.route()
    site.run(route)
    keep = ("state", "reset", route, "--from-now", "--reason", "r", "--operator", "o", "--yes")
    assert dpone(*keep).returncode == 0
    site.add_rows()
    site.run(route)
    _sql(site, "DELETE FROM orders_copy")
    emptied = dpone("state", "reset", route, "--reason", "emptied", "--operator", "o", "--yes")
    assert emptied.returncode == 0, emptied.stderr
    site.run(route)
    site.exactly_once()
    _lose_by_deleting(site, route)
    restore(route)
    assert "loaded 0 rows" in site.run(route).stdout
    site.exactly_once()


def test_restore_leaves_a_blocked_batch_to_the_guards_tools(site: Site) -> None:
    route = site.route()
    _block(site, route)
    done = dpone("state", "restore", route, "--reason", "r", "--operator", "o", "--yes")
    assert done.returncode == 3 and "native_transfer_manual_reconciliation_required" in done.stderr
    reset = dpone("state", "reset", route, "--reason", "r", "--operator", "o", "--yes")
    for refused in (done, reset):  # the commands it suggests name the route file's store
        assert "<checkpoint store>" not in refused.stderr
        assert f"--store {site.folder / 'checkpoints.db'}" in refused.stderr


def test_verify_proves_a_batch_that_never_reached_the_target_not_applied(site: Site) -> None:
    route = site.route()
    site.run(route)
    site.add_rows()
    config = load_route_config(route)
    with SQLiteCheckpointStore(config.store_path) as store:
        with pytest.raises(InjectedFault):
            TransferRuntime(store).run(
                config.spec("fails", sink=RecordingSink(config.sink, fail="before"))
            )
    [proof] = [
        json.loads(line) for line in dpone("guard", "verify", route, "--json").stdout.splitlines()
    ]
    assert proof["proof"]["verdict"] == "not_applied"
    done = dpone("guard", "resolve", route, "--batch", proof["batch_id"], "--from-target",
                 "--reason", "ledger", "--operator", "o", "--yes")  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "-> failed/failed_before_target" in done.stdout
    assert site.run(route).stdout.startswith("committed 4 partitions, skipped 0, loaded 40 rows")
    site.exactly_once()


# the ledger can be turned off --------------------------------------------------------------------


def test_ledger_false_keeps_no_ledger_and_behaves_as_before(sqlite_site: Site) -> None:
    """The documented trade-off: without the ledger, a lost store appends everything again."""
    site = sqlite_site
    route = site.route(ledger=False)
    site.run(route)
    with contextlib.closing(sqlite3.connect(site.target_file())) as db:
        tables = {row[0] for row in db.execute("SELECT name FROM sqlite_master")}
    assert "_dpone_ledger" not in tables
    _lose_by_deleting(site, route)
    site.run(route)
    assert Counter(site.target_ids()) == Counter(site.source_ids() * 2)


# stores written by release 0.1 -------------------------------------------------------------------

RELEASE_0_1 = Path(__file__).parents[1] / "data" / "release-0.1"


def _release_0_1(tmp_path: Path, name: str) -> Site:
    for suffix in ("source.db", "target.db", "checkpoints.db"):
        shutil.copy(RELEASE_0_1 / f"{name}-{suffix}", tmp_path / suffix)
    site = Site.__new__(Site)
    site.__dict__.update(folder=tmp_path, kind="sqlite", source=tmp_path / "source.db")
    site.next_id = max(site.source_ids()) + 1
    return site


def test_a_healthy_route_of_release_0_1_continues_without_a_duplicate(tmp_path: Path) -> None:
    site = _release_0_1(tmp_path, "healthy")
    route = site.route()
    assert site.run(route).stdout.startswith("committed 0 partitions")
    site.add_rows()
    assert site.run(route).stdout.startswith("committed 4 partitions, skipped 0, loaded 40 rows")
    site.exactly_once()


def test_a_blocked_route_of_release_0_1_stays_blocked_until_resolved(tmp_path: Path) -> None:
    site = _release_0_1(tmp_path, "blocked")
    route = site.route(path="staged")
    before = site.target_ids()
    assert f"error: {BLOCKED}:" in site.run(route, code=3).stderr
    assert site.target_ids() == before
    [proof] = [
        json.loads(line) for line in dpone("guard", "verify", route, "--json").stdout.splitlines()
    ]
    assert proof["proof"]["verdict"] == "unknown", "0.1 wrote no ledger: only a person can tell"
    done = dpone("guard", "resolve", route, "--batch", proof["batch_id"], "--as", "committed",
                 "--reason", "rows 121-160 counted", "--operator", "o", "--yes")  # fmt: skip
    assert done.returncode == 0, done.stderr
    site.run(route)
    site.exactly_once()
    site.add_rows()
    site.run(route)
    site.exactly_once()


# the ledger is trusted only as far as the target agrees (found by attacking issue 12) ---------


def _hot_journal(target: Path) -> None:
    """Leave the SQLite target as a load SIGKILLed mid-transaction leaves it: a hot journal."""
    snapshot = target.with_name("snapshot.db")
    with contextlib.closing(sqlite3.connect(target, isolation_level=None)) as db:
        db.execute("PRAGMA cache_size=1")  # spill pages, so the journal is written
        db.execute("BEGIN IMMEDIATE")
        db.executemany(
            "INSERT INTO orders_copy (id, region) VALUES (?, ?)",
            [(10**6 + n, "x" * 200) for n in range(5000)],
        )
        shutil.copy(target, snapshot)
        shutil.copy(f"{target}-journal", f"{snapshot}-journal")
        db.execute("ROLLBACK")
    Path(f"{snapshot}-journal").replace(f"{target}-journal")
    snapshot.replace(target)


def test_a_hot_journal_left_by_a_killed_load_is_rolled_back_not_refused(sqlite_site: Site) -> None:
    """A read-only ledger read cannot roll a hot journal back: every run exited 2 for good."""
    site = sqlite_site
    route = site.route()
    site.run(route)
    _hot_journal(site.target_file())
    assert Path(f"{site.target_file()}-journal").exists()
    verify = dpone("guard", "verify", route)
    assert verify.returncode == 0, verify.stdout + verify.stderr
    site.add_rows()
    site.run(route)
    site.exactly_once()


def test_verify_never_says_agree_when_the_ledger_holds_a_forged_row(site: Site) -> None:
    route = site.route()
    site.run(route)
    _sql(site, "INSERT INTO _dpone_ledger VALUES (99, 'orders_copy', 'b', 1, 'garbage', '[]')")
    done = dpone("guard", "verify", route)
    assert done.returncode == 3 and "ledger_unreadable" in done.stderr, done.stdout + done.stderr
    assert "agree" not in done.stdout
    assert refused(site.run(route, code=3), MISMATCH)["mismatch"] == "ledger_unreadable"


def test_a_table_named_as_the_ledger_without_its_columns_is_refused_not_read(site: Site) -> None:
    route = site.route()
    site.run(route)
    _sql(site, "DROP TABLE _dpone_ledger", "CREATE TABLE _dpone_ledger (seq INTEGER, note TEXT)")
    done = dpone("guard", "verify", route)
    assert done.returncode == 3 and "ledger_unreadable" in done.stderr, done.stdout + done.stderr
    assert refused(site.run(route, code=3), MISMATCH)["mismatch"] == "ledger_unreadable"
    site.exactly_once()


def _sql(site: Site, *statements: str) -> None:
    target = site.target_file()
    if site.kind == "duckdb":
        import duckdb

        with contextlib.closing(duckdb.connect(str(target))) as db:
            for statement in statements:
                db.execute(statement)
        return
    with contextlib.closing(sqlite3.connect(target)) as db:
        for statement in statements:
            db.execute(statement)
        db.commit()


@pytest.mark.parametrize("how", ["DROP TABLE orders_copy", "DELETE FROM orders_copy",
                                 "ALTER TABLE orders_copy RENAME TO orders_old"])  # fmt: skip
def test_a_target_table_dropped_or_emptied_inside_its_database_is_refused_then_reloaded(
    site: Site, how: str
) -> None:
    """The ledger still lists batches of a table that lost them: a run used to load only new
    rows, 120 missing, exit 0."""
    route = site.route()
    site.run(route)
    _sql(site, how)
    site.add_rows()
    done = site.run(route, code=3)
    assert refused(done, MISMATCH)["mismatch"] == "target_emptied"
    assert "state restore" in done.stderr
    verify = dpone("guard", "verify", route)
    assert verify.returncode == 3 and "target_emptied" in verify.stdout
    restored = restore(route)
    assert "mark 4 committed partitions the target does not hold" in restored.stdout
    site.run(route)
    site.exactly_once()
    site.add_rows(8)
    site.run(route)
    site.exactly_once()


def test_restore_refuses_a_ledger_that_no_longer_accounts_for_the_rows(site: Site) -> None:
    """The ledger table dropped, its rows kept: restoring from it duplicated all 120."""
    route = site.route()
    site.run(route)
    _sql(site, "DROP TABLE _dpone_ledger")
    assert refused(site.run(route, code=3), MISMATCH)["mismatch"] == "store_ahead_of_target"
    done = dpone("state", "restore", route, "--reason", "r", "--operator", "o", "--yes")
    assert done.returncode == 2 and "holds 120 rows but its ledger records 0" in done.stderr
    site.exactly_once()


def test_restore_refuses_a_ledger_that_was_off_for_a_while(sqlite_site: Site) -> None:
    """ledger = false, then true, then the store is lost: the ledger misses 40 rows."""
    site = sqlite_site
    site.run(site.route())
    site.add_rows()
    site.run(site.route(ledger=False))
    site.add_rows()
    route = site.route()
    site.run(route)
    _lose_by_deleting(site, route)
    assert refused(site.run(route, code=3), MISMATCH)["mismatch"] == "target_ahead_of_store"
    done = dpone("state", "restore", route, "--reason", "r", "--operator", "o", "--yes")
    assert done.returncode == 2 and "holds 200 rows but its ledger records 160" in done.stderr
    assert site.target_ids() == site.source_ids()[: len(site.target_ids())]


def test_a_refusal_names_the_other_routes_whose_batches_the_store_lost(sqlite_site: Site) -> None:
    site = sqlite_site
    appends, refresh = site.route(), site.route("refresh.toml", strategy="full_refresh")
    site.run(appends)
    site.run(refresh)
    site.add_rows()
    site.run(appends)
    _lose_by_deleting(site, appends)
    done = site.run(appends, code=3)
    assert "orders -> orders_copy (full_refresh)" in done.stderr
    restore(appends)
    restore(refresh)
    site.run(appends)
    site.exactly_once()


def test_restore_rebuilds_a_store_file_that_is_gone(sqlite_site: Site) -> None:
    site = sqlite_site
    route = site.route()
    site.run(route)
    site.add_rows()
    _lose_by_deleting(site, route)
    restore(route)  # no run in between: the store file does not exist
    assert site.run(route).stdout.startswith("committed 4 partitions, skipped 0, loaded 40 rows")
    site.exactly_once()


def test_a_restore_that_writes_nothing_leaves_no_store_file_behind(sqlite_site: Site) -> None:
    """A lost store: a restore declined, or refused, made an empty store file and left it."""
    site = sqlite_site
    route = site.route()
    site.run(route)
    store = _lose_by_deleting(site, route).parent / "checkpoints.db"
    declined = dpone("state", "restore", route, "--reason", "r", "--operator", "o", stdin="n\n")
    assert declined.returncode != 0 and "Write 4 checkpoints" in declined.stdout
    assert not store.exists()
    _sql(site, "DROP TABLE _dpone_ledger")
    refused = dpone("state", "restore", route, "--reason", "r", "--operator", "o", "--yes")
    assert refused.returncode == 2 and not store.exists()


# an emptied target started over, then the store is lost: the target remembers the excusal -------


@pytest.mark.parametrize("start_over", ["state reset", "state restore"])
def test_an_emptied_target_started_over_then_a_lost_store_is_restored(
    site: Site, start_over: str
) -> None:
    """The table emptied on purpose, the route started over, a run loaded every row again, then
    the store was lost: `state restore` refused on the row count (it counted the batches the
    operator had excused, whose excusal lived only in the lost store), with
    --ignore-row-count wrote nothing, and every run pointed back at it: no way out."""
    route = site.route()
    site.run(route)
    site.add_rows()
    site.run(route)
    _sql(site, "DELETE FROM orders_copy")
    assert refused(site.run(route, code=3), MISMATCH)["mismatch"] == "target_emptied"
    action = start_over.split()[1]
    done = dpone("state", action, route, "--reason", "emptied on purpose", "--operator", "ops",
                 "--yes")  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "loaded 160 rows" in site.run(route).stdout
    site.exactly_once()
    _lose_by_deleting(site, route)
    assert refused(site.run(route, code=3), MISMATCH)["mismatch"] == "target_ahead_of_store"
    restored = restore(route)
    assert "restore 4 committed checkpoints" in restored.stdout, restored.stdout
    assert site.run(route).stdout.startswith("committed 0 partitions, skipped 0, loaded 0 rows")
    assert dpone("guard", "verify", route).returncode == 0
    site.add_rows()
    assert "loaded 40 rows" in site.run(route).stdout
    site.exactly_once()  # 200 rows, each once: none lost, none twice


def test_a_route_reset_from_now_keeps_its_rows_counted_when_the_store_is_lost(
    sqlite_site: Site,
) -> None:
    """`state reset --from-now` excuses the route's batches but the table keeps their rows: a
    later entry must not record them as gone, or a restore would count 40 of 160 rows. A
    restore on the whole store refused the partitions the reset forgot as "blocked"."""
    site = sqlite_site
    route = site.route()
    site.run(route)
    done = dpone("state", "reset", route, "--from-now", "--reason", "r", "--operator", "o",
                 "--yes")  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    site.add_rows()
    assert "loaded 40 rows" in site.run(route).stdout
    kept = restore(route)  # the store is whole: the reset's forgotten partitions stay so
    assert "the store already agrees with the target's ledger" in kept.stdout, kept.stdout
    _lose_by_deleting(site, route)
    restore(route)
    assert site.run(route).stdout.startswith("committed 0 partitions, skipped 0, loaded 0 rows")
    site.add_rows()
    site.run(route)
    site.exactly_once()
