"""The SQLite sink: one target table of a SQLite file, each load in a single durable
transaction with its ledger row (and fence, rejects).

Every call opens its own connection and closes it before returning, so other workers and
child processes can use the same file between calls. Identifiers are always quoted and
values always bound as parameters. Errors raised here on purpose name tables and columns
only, never the file path or a sqlite message. Its engine pulls SQLite sources itself
(``pulls.py``).
"""

from __future__ import annotations

import contextlib
import os
import re
import sqlite3
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from ...artifacts import check_digest, file_sha256, read_chunks
from ...column_types import Carry, finite_double, sqlite_kind
from ...errors import ConfigInvalid, TargetBusy, TargetRowsMismatch
from ...identity import TableIdentity, file_location, fold_ascii
from ...ledger import (
    FENCE_TABLE,
    LEDGER_TABLE,
    LedgerEntry,
    advance_fence,
    check_applied,
    check_ledger_columns,
    fence_batch,
    fence_first,
    ledger_query,
    ledger_table_sql,
    read_fence,
)
from ...payloads import Column, LoadFile, LoadFiles, LoadPlan, Merge, RowChunks
from ...rejects import REJECTS_TABLE, rejects_query, rejects_table_sql, write_rejects
from .._merge import (
    LOOSE_KEY,
    LOOSE_VERSION,
    MERGE_BATCH,
    NARROWER,
    asks,
    key_constraint,
    loosely_compared_key,
    loosely_ordered_version,
    merge_statements,
    narrower_unique,
    refuse_text_compared,
    unmergeable,
)
from .._sql import (
    OWN_TABLES,
    STAGE_PREFIX,
    ColumnDifference,
    FileTarget,
    before_commit,
    check_target_folder,
    check_target_table,
    check_writable,
    difference,
    load_failures,
    own_name_taken,
    parse_table,
    refuse_folded_twins,
    refuse_reserved_prefix,
    refuse_schema,
    unavailable,
)
from .._sql import quote as _quote
from ..contract import PlanInexact, SinkFeatures
from ..contract.engine import EnginePull
from ..contract.sqlite_file import SQLiteFile
from ..sqlite_reading import narrow_plan, pulled_file
from .common import (
    TIMEOUT,
    column_list,
    file_uri,
    parsed_type,
    source_invalid,
    sqlite_type,
    table_columns,
)
from .pulls import PULLED_TABLE, merge_pulled, pull_each, pull_one

__all__ = ["SQLiteSink"]


def _column_sql(column: Column) -> str:
    """Column definition for CREATE TABLE, from fixed or parsed type names only."""
    return f"{_quote(column.name)} {sqlite_type(column)}".rstrip()


_PRIMARY_KEY = "SELECT name, pk FROM pragma_table_info(?) WHERE pk > 0"
# The columns an insert must fill: NOT NULL without a default, less an INTEGER PRIMARY KEY of
# its own (the rowid's alias, which SQLite fills).
_REQUIRED = """SELECT name FROM pragma_table_info(?1) WHERE "notnull" AND dflt_value IS NULL
    AND NOT (pk = 1 AND upper(type) = 'INTEGER'
             AND (SELECT count(*) FROM pragma_table_info(?1) WHERE pk > 0) = 1)"""


class SQLiteSink(FileTarget, EnginePull):
    """Writes one target table of a SQLite file, each load in a single durable transaction,
    with its ledger row (and fence, rejects) in that transaction. Its engine pulls SQLite
    sources itself (``ATTACH``)."""

    features = SinkFeatures(name="SQLite", merges=True)
    pulled_suffix = ".sqlite"  # a SQLite file of one table

    def __init__(self, path: str | os.PathLike[str], table: str) -> None:
        check_target_table(table)
        hint = 'a SQLite file is one schema; a name holding a dot is written quoted: "raw.t"'
        name = parse_table(table, default_schema="main")
        refuse_schema(name, engine="SQLite", hint=hint)
        refuse_reserved_prefix(name.name, "sqlite_", engine="SQLite", part="table", fold=True)
        super().__init__(path, name.name)  # main.t is t; "raw.t" is the table raw.t

    def identity(self) -> TableIdentity:
        """The file's resolved path; SQLite matches table names case-insensitively (ASCII)."""
        return TableIdentity(file_location("sqlite", self.path), fold_ascii(self.table))

    @property
    def _stage(self) -> str:
        return STAGE_PREFIX + self.table

    def _stage_sql(self) -> str:
        return _quote(self._stage)

    def check_target(self) -> None:
        """Before the target call: the folder exists and an existing file is a database this
        process can lock for writing now (``BEGIN EXCLUSIVE``, rolled back: a reader holding
        the file longer than the timeout would make the load's commit fail)."""
        check_target_folder(self.path, self.table)
        check_writable(self.path, self.table)
        if not os.path.isfile(self.path):
            return
        try:
            with self._connect() as conn:
                conn.execute("BEGIN EXCLUSIVE")
                conn.execute("PRAGMA schema_version").fetchone()
                (rewriting,) = conn.execute(_REWRITING, (self.table, self.table)).fetchone()
                made = conn.execute(_MADE_AS, (self.table,)).fetchone()
                taken = conn.execute(_OWN_NAME_TAKEN, OWN_TABLES).fetchone()
                conn.execute("ROLLBACK")
        except sqlite3.Error:
            raise unavailable(self.table) from None
        if taken:
            raise own_name_taken(self.table, taken[0])
        rewriting += _replacing(made[0] if made else None)
        if rewriting:
            raise TargetRowsMismatch.rewriting(self.table, rewriting)

    def check_merge(self, merge: Merge, columns: Sequence[Column]) -> None:
        """A unique index on part of the key, or a key compared by a looser collation than the
        batch's (``NOCASE``, ``RTRIM``), would meet two batch keys as one: both inserted, the
        index violated inside the target call. (A view or a trigger is refused for every
        strategy, by ``check_target``.) A key or cursor kept as text is refused whatever the
        table (``refuse_text_compared``)."""
        refuse_text_compared(
            merge, columns, kept_as_text=lambda c: sqlite_type(c) == "TEXT", target="SQLite"
        )
        if not os.path.isfile(self.path) or not asks(merge, columns):
            return
        with self._reader() as conn:
            if not table_columns(conn, self.table):
                return
            if narrower_unique(_uniques(conn, self.table), merge, fold=fold_ascii):
                raise unmergeable(self.table, NARROWER)

            def count(sql: str) -> int:
                return int(conn.execute(sql).fetchone()[0])

            column = loosely_compared_key(count, _quote(self.table), merge, columns)
            version = loosely_ordered_version(count, _quote(self.table), merge, columns)
        if column is not None:
            raise unmergeable(self.table, LOOSE_KEY, column=column)
        if version is not None:
            raise unmergeable(self.table, LOOSE_VERSION, column=version)

    @contextlib.contextmanager
    def _connect(self) -> Iterator[sqlite3.Connection]:
        """Autocommit connection with FULL sync; transactions are explicit."""
        check_target_folder(self.path, self.table)
        uri = file_uri(self.path, read_only=False)
        with contextlib.closing(
            sqlite3.connect(uri, uri=True, timeout=TIMEOUT, isolation_level=None)
        ) as conn:
            conn.execute("PRAGMA synchronous=FULL")
            yield conn

    def column_difference(self, columns: Sequence[Column]) -> ColumnDifference | None:
        """SQLite matches column names case-insensitively (ASCII). A column
        takes a source column of its kind, or any value when it has no type (``any``): SQLite's
        affinity would convert the others (``'12'`` into an INTEGER column becomes 12)."""
        refuse_folded_twins(columns, self.table, engine="SQLite")
        with self._reader() as conn:
            existing = [] if conn is None else table_columns(conn, self.table)
            required = [] if conn is None else [n for (n,) in conn.execute(_REQUIRED, [self.table])]
            generated = (
                [] if conn is None else [n for (n,) in conn.execute(_GENERATED, [self.table])]
            )
        pairs = [(column.name, column.decltype) for column in existing]

        def takes(column: Column, declared: str) -> bool:
            kind = sqlite_kind(declared)
            return kind in (column.kind, "any") or parsed_type(declared) == sqlite_type(column)

        return difference(
            pairs, columns, fold=fold_ascii, takes=takes, required=required, unwritable=generated
        )

    def add_columns(self, columns: Sequence[Column]) -> None:
        with self._connect() as conn, _transaction(conn, self.table):
            for column in columns:
                conn.execute(f"ALTER TABLE {_quote(self.table)} ADD COLUMN {_column_sql(column)}")

    def carrier(self, column: Column) -> Carry | None:
        """A NaN is refused: SQLite would store it as NULL. Other values are SQLite's own."""
        return finite_double if column.kind == "real" else None

    def _refused(self) -> contextlib.AbstractContextManager[None]:
        """Around a target call's transaction: a constraint refusing a row (a ``STRICT``
        table's type too), or a value too big, rolled back; any other SQLite error before
        the COMMIT (a full disk) rolled it back too (``load_failures``)."""
        refusals = (sqlite3.IntegrityError, sqlite3.DataError)
        return load_failures(self.table, sqlite3.Error, refusals, _error_name)

    def load(self, payload: RowChunks, *, ledger: LedgerEntry | None = None) -> int:
        """Write the payload in one transaction and return the rows written."""
        with self._refused(), self._connect() as conn, _transaction(conn, self.table):
            _fence_first(conn, ledger)
            if payload.merge is not None:
                return _record(conn, ledger, _merge_rows(conn, self.table, payload))
            _prepare_target(conn, self.table, payload.columns, replace=payload.replace)
            rows = _insert(conn, self.table, payload)
            return _record(conn, ledger, rows)

    def engine(self) -> SQLiteSink:
        return self

    def can_pull(self, plan: LoadPlan, files: int) -> bool:
        """From a SQLite source, into one load file or one per partition. SQLite copies each
        value as it stores it, so nothing is misread. Not a narrow cursor window: the copy
        reads each partition through the partition column's index where there is one, and
        dpone reads the window through the cursor's (``narrow_plan``)."""
        return isinstance(plan.source, SQLiteFile) and not narrow_plan(plan)

    def pull_load_files(
        self, plan: LoadPlan, paths: Sequence[Path]
    ) -> tuple[list[LoadFile], list[int]] | None:
        """SQLite copies the plan's partitions from the source into new SQLite
        files (``pull_one``, ``pull_each``), with each bound's count; None when that fails. Each
        value is copied as SQLite stores it, as lazy-plan copies it: a text that is not UTF-8
        too, which the paths that read through Python refuse."""
        try:
            counts = pull_one(plan, paths[0]) if len(paths) == 1 else pull_each(plan, paths)
        except (sqlite3.Error, OSError):
            counts = None
        if counts is None:
            for path in paths:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path)
            return None
        rows = [sum(counts)] if len(paths) == 1 else counts
        files = [
            LoadFile(path=path, rows=count, sha256=file_sha256(path), native=True)
            for path, count in zip(paths, rows, strict=True)
        ]
        return files, counts

    def merge_load_files(self, payload: LoadFiles, folder: Path) -> LoadFiles:
        """More pulled files than SQLite attaches at once (one per partition) are copied, in
        order, into one new ``merged.sqlite`` in ``folder`` by a connection of their own, each
        file's digest checked before SQLite reads it and after; the merged file is digested
        once closed, and loaded as any pulled file. A SQLite error writing it (a full disk)
        is the work folder's: an ``OSError``."""
        return merge_pulled(payload, folder)

    def read_ledger(self, *, partitions: bool = False) -> list[LedgerEntry]:
        """The ledger entries of this target table, oldest first.

        The connection may write, though this reads only: a read-only one cannot
        roll back the hot journal a killed load leaves, and would refuse the file.
        """
        if not os.path.isfile(self.path):
            return []
        try:
            with contextlib.closing(
                sqlite3.connect(file_uri(self.path, read_only=False), uri=True, timeout=TIMEOUT)
            ) as conn:
                columns = table_columns(conn, LEDGER_TABLE)
                if not columns:
                    return []
                check_ledger_columns({column.name for column in columns})
                rows = conn.execute(
                    ledger_query("?", partitions=partitions), (self.identity().table,)
                ).fetchall()
        except sqlite3.Error:
            raise unavailable(self.table, to="have its ledger read") from None
        return [LedgerEntry.from_row(*row) for row in rows]

    def read_rejects(self) -> list[tuple]:
        """This table's rows set aside, oldest first. Reads only."""
        with self._reader() as conn:
            if conn is None or not table_columns(conn, REJECTS_TABLE):
                return []
            sql = rejects_query(_quote(REJECTS_TABLE), "?") + " ORDER BY rowid"
            return conn.execute(sql, (self.identity().table,)).fetchall()

    def fence_epoch(self) -> int:
        """The target table's fence in ``_dpone_fence``; 0 without one."""
        if not os.path.isfile(self.path):
            return 0
        try:
            with contextlib.closing(
                sqlite3.connect(file_uri(self.path, read_only=False), uri=True, timeout=TIMEOUT)
            ) as conn:
                return read_fence(_query(conn), self.identity().table, **_fence_at(conn))
        except sqlite3.Error:
            raise unavailable(self.table, to="have its fence read") from None

    def advance_fence(self, epoch: int) -> int:
        """Raise the fence to ``epoch`` in a transaction of its own."""
        try:
            with self._connect() as conn, _transaction(conn, self.table):
                return advance_fence(_query(conn), self.identity().table, epoch, **_FENCE)
        except sqlite3.Error:
            raise unavailable(self.table, to="have its fence raised") from None

    def check_plan(self, plan: LoadPlan) -> None:
        """Refuse a plan this sink cannot pull, before anything touches the target: SQLite
        attaches only a source whose text encoding is the target's (a UTF-16 source failed
        inside the target call, with SQLite's own error)."""
        source = pulled_file(plan, engine="SQLite", table=self.table)
        with source.reader() as conn:
            encoding = conn.execute("PRAGMA encoding").fetchone()[0]
        try:
            with self._reader() as conn:
                target = "UTF-8" if conn is None else conn.execute("PRAGMA encoding").fetchone()[0]
        except sqlite3.Error:  # the load reports what is wrong with the target
            return
        if encoding != target:
            raise PlanInexact(
                f"SQLite table {self.table!r} cannot attach the source database: its text is "
                f"{encoding} and the target's {target}",
                diagnostics={"table": self.table},
            )

    def load_plan(self, payload: LoadPlan, *, ledger: LedgerEntry | None = None) -> int:
        """Pull the plan's partitions into the target in one transaction (``ATTACH``)."""
        source = pulled_file(payload, engine="SQLite", table=self.table)
        statements = [
            source.select_sql(bounds, schema="src", columns=payload.columns)
            for bounds in payload.bounds
        ]
        if not os.path.isfile(source.path):
            raise source_invalid(
                f"source database for table {source.table!r} does not exist", table=source.table
            )
        prefix = f"INSERT INTO {_quote(self.table)} ({column_list(payload.columns)}) "
        with self._refused(), self._connect() as conn:
            conn.execute("ATTACH DATABASE ? AS src", (file_uri(source.path, read_only=True),))
            try:
                with _transaction(conn, self.table):
                    _fence_first(conn, ledger)
                    _prepare_target(conn, self.table, payload.columns, replace=payload.replace)
                    whole = source.table_sql(
                        payload.bounds, conn=conn, schema="src", columns=payload.columns
                    )
                    if whole is not None:
                        statements = [whole]
                    rows = sum(conn.execute(prefix + sql, p).rowcount for sql, p in statements)
                    return _record(conn, ledger, rows)
            finally:
                with contextlib.suppress(sqlite3.Error):
                    conn.execute("DETACH DATABASE src")

    def stage(self, payload: RowChunks) -> int:
        """Fill a fresh staging table beside the target, from rows or from load files (as
        ``load``); the target is not touched."""
        with self._connect() as conn, _transaction(conn, self.table):
            conn.execute(f"DROP TABLE IF EXISTS {_quote(self._stage)}")
            _create_table(conn, self._stage, payload.columns)
            return _insert(conn, self._stage, payload)

    def staged_row_count(self) -> int:
        with self._reader() as conn:
            return 0 if conn is None else _row_count(conn, self._stage)

    def finalize_staged_load(
        self,
        *,
        replace: bool = False,
        ledger: LedgerEntry | None = None,
        merge: Merge | None = None,
    ) -> int:
        """Move staged rows into the target and drop the staging table, in one transaction.

        When the target does not exist, or ``replace`` is set and the target is
        exactly what this sink would create (same definition, no index, and no
        view or trigger in the database), the staging table is renamed to the
        target instead of copying its rows: same columns, types and rows.
        Otherwise the rows are copied (appended, or after emptying the target). ``merge``:
        the staged rows are merged into the target on its key (``_merge``), then dropped.
        """
        with self._refused(), self._connect() as conn, _transaction(conn, self.table):
            _fence_first(conn, ledger)
            columns = table_columns(conn, self._stage)
            if not columns:
                raise ConfigInvalid(
                    f"no staged load exists for target table {self.table!r}",
                    diagnostics={"table": self.table},
                )
            if merge is not None:
                staged = _row_count(conn, self._stage)
                _merge(conn, self.table, columns, merge, batch=self._stage)
                return _record(conn, ledger, staged)
            if self._stage_can_become_target(conn, columns, replace=replace):
                moved = _row_count(conn, self._stage)
                if replace:  # an append never drops the target
                    conn.execute(f"DROP TABLE IF EXISTS {_quote(self.table)}")
                conn.execute(f"ALTER TABLE {_quote(self._stage)} RENAME TO {_quote(self.table)}")
                return _record(conn, ledger, moved)
            _prepare_target(conn, self.table, columns, replace=replace)
            names = column_list(columns)
            moved = conn.execute(
                f"INSERT INTO {_quote(self.table)} ({names})"
                f" SELECT {names} FROM {_quote(self._stage)} ORDER BY rowid"
            ).rowcount
            conn.execute(f"DROP TABLE {_quote(self._stage)}")
            return _record(conn, ledger, moved)

    def _stage_can_become_target(
        self, conn: sqlite3.Connection, columns: Sequence[Column], *, replace: bool
    ) -> bool:
        """True when renaming the staging table gives the same target as copying into it."""
        schema = conn.execute("SELECT type, name, tbl_name, sql FROM sqlite_master").fetchall()
        if any(kind in ("view", "trigger") for kind, *_ in schema):
            return False  # a rename re-parses them; keep the plain copy
        definitions = ", ".join(_column_sql(column) for column in columns)
        # SQLite resolves table names case-insensitively (ASCII): so does this lookup
        tables = {fold_ascii(name): sql for kind, name, _, sql in schema if kind == "table"}
        stage, target = fold_ascii(self._stage), fold_ascii(self.table)
        if tables.get(stage) != f"CREATE TABLE {_quote(self._stage)} ({definitions})":
            return False
        if target not in tables:
            return True
        indexed = any(kind == "index" and fold_ascii(tbl) == target for kind, _, tbl, _ in schema)
        if not replace or indexed:
            return False
        return tables[target] == f"CREATE TABLE {_quote(self.table)} ({definitions})"

    def row_count(self) -> int:
        with self._reader() as conn:
            return 0 if conn is None else _row_count(conn, self.table)

    def batch_rows(self, column: str, batch_id: str) -> int:
        """Rows whose ``column`` holds ``batch_id``; 0 without it."""
        with self._reader() as conn:
            names = [] if conn is None else [c.name for c in table_columns(conn, self.table)]
            if column not in names:
                return 0
            sql = f"SELECT count(*) FROM {_quote(self.table)} WHERE {_quote(column)} = ?"
            return int(conn.execute(sql, (batch_id,)).fetchone()[0])

    def is_empty(self) -> bool:
        with self._reader() as conn:
            if conn is None or not table_columns(conn, self.table):
                return True
            return conn.execute(f"SELECT 1 FROM {_quote(self.table)} LIMIT 1").fetchone() is None

    def rows(self) -> list[tuple]:
        with self._reader() as conn:
            if conn is None or not table_columns(conn, self.table):
                return []
            return conn.execute(f"SELECT * FROM {_quote(self.table)} ORDER BY rowid").fetchall()


@contextlib.contextmanager
def _transaction(conn: sqlite3.Connection, table: str) -> Iterator[None]:
    """BEGIN IMMEDIATE ... COMMIT; any exception, even a BaseException, rolls back and re-raises.

    Another writer holding the file past ``TIMEOUT`` (SQLite's busy error at ``BEGIN``, or at
    ``COMMIT``, which then leaves the transaction open to roll back) is ``TargetBusy``: the
    load applied nothing, so the guard does not block the route. Another error at ``COMMIT``
    proves nothing (one after the commit point, a journal that cannot be removed, still
    reports an error) and is re-raised as it is."""
    try:
        with before_commit(sqlite3.Error):  # no transaction began: nothing applied
            conn.execute("BEGIN IMMEDIATE")
    except sqlite3.OperationalError as error:
        if _busy(error):
            raise TargetBusy.waited(table, TIMEOUT) from None
        raise
    try:
        with before_commit(sqlite3.Error):  # no COMMIT ran: nothing of it is applied
            yield
        conn.execute("COMMIT")
    except BaseException as error:
        if conn.in_transaction:
            with contextlib.suppress(sqlite3.Error):
                conn.execute("ROLLBACK")
        if isinstance(error, sqlite3.OperationalError) and _busy(error):
            if not conn.in_transaction:  # rolled back: nothing of it applied
                raise TargetBusy.waited(table, TIMEOUT) from None
        raise


def _error_name(error: sqlite3.Error) -> str:
    """SQLite's code for ``error`` (``SQLITE_FULL``), never its message."""
    return getattr(error, "sqlite_errorname", None) or type(error).__name__


def _busy(error: sqlite3.OperationalError) -> bool:
    """SQLite's busy or locked error (its extended codes too)."""
    name = getattr(error, "sqlite_errorname", "") or ""
    return name.startswith(("SQLITE_BUSY", "SQLITE_LOCKED"))


# dpone's own tables' names, held by a view, an index or a trigger (``own_name_taken``).
_OWN_NAME_TAKEN = (
    "SELECT name FROM sqlite_master WHERE type <> 'table' AND name COLLATE NOCASE IN (?, ?, ?)"
)
# What may change the rows a load hands the target: any trigger on the table (SQLite's fire
# on INSERT, DELETE or UPDATE, BEFORE or AFTER), or a view of its name (INSTEAD OF triggers).
_REWRITING = (
    "SELECT count(*) FROM sqlite_master WHERE (type = 'trigger' AND tbl_name = ? COLLATE NOCASE)"
    " OR (type = 'view' AND name = ? COLLATE NOCASE)"
)
_MADE_AS = "SELECT sql FROM sqlite_master WHERE type = 'table' AND name = ? COLLATE NOCASE"
# A table's generated columns (hidden 2: virtual, 3: stored), which table_info leaves out.
_GENERATED = "SELECT name FROM pragma_table_xinfo(?, 'main') WHERE hidden IN (2, 3)"
_COMMENTS = re.compile(r"--[^\n]*|/\*.*?(?:\*/|$)", re.DOTALL)
_REPLACE = re.compile(r"\bON\s+CONFLICT\s+REPLACE\b", re.IGNORECASE)


def _replacing(sql: str | None) -> int:
    """The ``ON CONFLICT REPLACE`` clauses of a table's ``CREATE TABLE``: a row meeting such
    a ``UNIQUE`` or ``PRIMARY KEY`` deletes the row it meets, and a NULL meeting such a ``NOT
    NULL`` becomes the column's default, and SQLite counts neither as a change (the load
    applied 3 rows where the table lost one). One in a quoted name or default is counted
    too: refused, never believed."""
    return len(_REPLACE.findall(_COMMENTS.sub(" ", sql or "")))


_FENCE_AT: dict[str, Any] = {"table": _quote(FENCE_TABLE), "marker": "?"}
_FENCE: dict[str, Any] = {**_FENCE_AT, "text": "TEXT NOT NULL", "integer": "INTEGER NOT NULL"}


def _fence_at(conn: sqlite3.Connection) -> dict[str, Any]:
    """``read_fence``'s and ``fence_first``'s fence and ledger tables, each where it exists."""
    fence = _FENCE_AT["table"] if table_columns(conn, FENCE_TABLE) else None
    return {**_FENCE_AT, "table": fence, "ledger": lambda: _ledger_at(conn)}


def _ledger_at(conn: sqlite3.Connection) -> str | None:
    return _quote(LEDGER_TABLE) if table_columns(conn, LEDGER_TABLE) else None


def _fence_first(conn: sqlite3.Connection, entry: LedgerEntry | None) -> None:
    if entry is not None:
        fence_first(_query(conn), entry, **_fence_at(conn))


def _query(conn: sqlite3.Connection) -> Callable[[str, Sequence[Any]], list[tuple[Any, ...]]]:
    return lambda sql, params: conn.execute(sql, params).fetchall()


def _record(conn: sqlite3.Connection, ledger: LedgerEntry | None, rows: int) -> int:
    """Inside the load's transaction: check the rows applied and the fence, then write the
    batch's ledger row; returns ``rows``."""
    if ledger is not None:
        check_applied(ledger, rows)
        fence_batch(_query(conn), ledger, **_FENCE, ledger=lambda: _ledger_at(conn))
        conn.execute(
            ledger_table_sql(
                _quote(LEDGER_TABLE),
                seq="INTEGER PRIMARY KEY",
                integer="INTEGER NOT NULL",
                text="TEXT NOT NULL",
            )
        )
        target, batch, entry, partitions = ledger.row()
        conn.execute(
            f"INSERT INTO {_quote(LEDGER_TABLE)} (target_table, batch_id, rows, entry, partitions)"
            " VALUES (?, ?, ?, ?, ?)",
            (target, batch, rows, entry, partitions),
        )
        if ledger.rejects:
            conn.execute(rejects_table_sql(_quote(REJECTS_TABLE), text="TEXT"))
            write_rejects(conn.executemany, ledger.rejects, target_table=target, batch_id=batch,
                          table=_quote(REJECTS_TABLE), marker="?")  # fmt: skip
    return rows


def _create_table(
    conn: sqlite3.Connection, table: str, columns: Sequence[Column], *, create: str = "CREATE TABLE"
) -> None:
    if not columns:
        raise ConfigInvalid("at least one column is required")
    definitions = ", ".join(_column_sql(column) for column in columns)
    conn.execute(f"{create} IF NOT EXISTS {_quote(table)} ({definitions})")


def _merge_rows(conn: sqlite3.Connection, table: str, payload: RowChunks) -> int:
    """A merge route's load: the batch's rows into a temporary table, then merged into the
    target on its key; the rows the batch holds (what the call was sent)."""
    assert payload.merge is not None
    conn.execute(f"DROP TABLE IF EXISTS temp.{_quote(MERGE_BATCH)}")
    _create_table(conn, MERGE_BATCH, payload.columns, create="CREATE TEMP TABLE")
    rows = _insert(conn, MERGE_BATCH, payload)
    _merge(conn, table, payload.columns, payload.merge, batch=MERGE_BATCH)
    return rows


def _merge(
    conn: sqlite3.Connection, table: str, columns: Sequence[Column], merge: Merge, *, batch: str
) -> None:
    """Merge ``batch`` into ``table`` (``_merge.merge_statements``), creating the table with
    the key as its PRIMARY KEY when it does not exist."""
    target = merge.target_columns(columns)
    definitions = ", ".join(_column_sql(column) for column in target) + key_constraint(merge)
    conn.execute(f"CREATE TABLE IF NOT EXISTS {_quote(table)} ({definitions})")
    names, row_id = [column.name for column in columns], _row_id(conn, table)
    for statement in merge_statements(_quote(table), _quote(batch), names, merge, row_id=row_id):
        conn.execute(statement)


def _uniques(conn: sqlite3.Connection, table: str) -> list[list[str]]:
    """The table's unique column sets: its primary key, and each unique index's columns (an
    expression's column is None and makes the set no key)."""
    primary = conn.execute(_PRIMARY_KEY, (table,)).fetchall()
    found = [[name for name, _ in sorted(primary, key=lambda row: row[1])]]
    for _, index, unique, *_ in conn.execute("SELECT * FROM pragma_index_list(?)", (table,)):
        names = [row[2] for row in conn.execute("SELECT * FROM pragma_index_info(?)", (index,))]
        if unique and None not in names:
            found.append(names)
    return found


def _row_id(conn: sqlite3.Connection, table: str) -> list[str]:
    """What identifies a row of ``table`` to a delete: its rowid, or, in a table made
    ``WITHOUT ROWID`` (which has none), its primary key's columns (unique, never NULL)."""
    try:
        conn.execute(f"SELECT rowid FROM {_quote(table)} LIMIT 0")
    except sqlite3.OperationalError:
        found = conn.execute(_PRIMARY_KEY, (table,)).fetchall()
        return [_quote(name) for name, _ in sorted(found, key=lambda row: row[1])]
    return ["rowid"]


def _prepare_target(
    conn: sqlite3.Connection, table: str, columns: Sequence[Column], *, replace: bool
) -> None:
    _create_table(conn, table, columns)
    if replace:
        conn.execute(f"DELETE FROM {_quote(table)}")


def _insert(conn: sqlite3.Connection, table: str, payload: RowChunks) -> int:
    """Insert the payload's rows, in this connection's transaction: a pulled SQLite file
    (``LoadFile.native``) by one ``INSERT ... SELECT`` from it, attached read-only, its digest
    checked before SQLite reads it and again after, before the load commits (a file changed
    in between fails the load); other rows as chunks. More pulled files than SQLite attaches
    at once were merged before the target call (``merge_load_files``)."""
    names = column_list(payload.columns)
    marks = ", ".join("?" * len(payload.columns))
    insert = f"INSERT INTO {_quote(table)} ({names}) VALUES ({marks})"
    if not isinstance(payload, LoadFiles) or not any(file.native for file in payload.files):
        return sum(conn.executemany(insert, chunk).rowcount for chunk in payload.chunks)
    rows = 0
    for number, file in enumerate(payload.files):
        if not file.native:
            chunks = read_chunks(file.path, file.sha256)
            rows += sum(conn.executemany(insert, chunk).rowcount for chunk in chunks)
            continue
        check_digest(file.path, file.sha256)
        schema = f"dpone_load_{number}"
        try:
            conn.execute(
                f"ATTACH DATABASE ? AS {schema}", (file_uri(str(file.path), read_only=True),)
            )
            rows += conn.execute(
                f"INSERT INTO {_quote(table)} ({names}) SELECT {names} FROM {schema}.{PULLED_TABLE}"
                " ORDER BY rowid"
            ).rowcount
        except sqlite3.DatabaseError:
            check_digest(file.path, file.sha256)  # a file changed while it was read says so
            raise
        check_digest(file.path, file.sha256)
    return rows


def _row_count(conn: sqlite3.Connection, table: str) -> int:
    if not table_columns(conn, table):
        return 0
    return conn.execute(f"SELECT COUNT(*) FROM {_quote(table)}").fetchone()[0]
