"""SQL text the engine connectors share: quoted identifiers and one partition's WHERE condition.

SQLite, DuckDB and PostgreSQL quote identifiers the same way (double
quotes, doubled inside), so one rule serves all three. Values never become
SQL text: a condition comes with its parameters.
"""

from __future__ import annotations

import abc
import contextlib
import errno
import os
import re
import tempfile
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import attrs

from ..drivers import file_path, refused_write
from ..errors import (
    ConfigInvalid,
    InternalInvariantBroken,
    SourceMissing,
    TargetConstraintRefused,
    TargetRolledBack,
    TargetUnavailable,
    with_driver_error,
)
from ..identity import fold_ascii
from ..ledger import FENCE_TABLE, LEDGER_TABLE
from ..payloads import (
    RANGE_EDGES,
    UPTO_OR_NULL,
    Column,
    ColumnDifference,
    Predicate,
    SourceShape,
    bound_predicates,
    cursor_window,
    difference,
)
from ..rejects import REJECTS_TABLE
from .contract import Sink, Source, SourceFeatures

if TYPE_CHECKING:
    pass

__all__ = [
    "RESERVED_PREFIX",
    "STAGE_PREFIX",
    "ColumnDifference",  # payloads', kept here for the connectors
    "before_commit",
    "load_failures",
    "OWN_TABLES",
    "own_name_taken",
    "unwritable",
    "FileTarget",
    "RANGE_EDGES",
    "WINDOW_OPERATORS",
    "TableName",
    "TableSource",
    "bounds_where",
    "check_chunk_rows",
    "check_target_folder",
    "check_writable",
    "difference",
    "edge_where",
    "identifier",
    "integer_range_starts",
    "one_window_ranges",
    "parse_table",
    "partition_predicate_count",
    "quote",
    "range_cuts_sql",
    "range_partitions",
    "ranges_run_on",
    "refuse_reserved_prefix",
    "refuse_reserved_schema",
    "render_predicates",
    "unavailable",
]


def identifier(name: Any) -> str:
    """``name``, if a dialect can quote it: NUL cannot be quoted, so it is a configuration error."""
    if not isinstance(name, str) or not name or "\x00" in name:
        raise ConfigInvalid("identifier must be a non-empty string without NUL characters")
    return name


def quote(name: Any) -> str:
    """An identifier in double quotes (SQLite, PostgreSQL, DuckDB)."""
    return '"' + identifier(name).replace('"', '""') + '"'


@attrs.frozen
class TableName:
    """A target table: its name, and its schema when the route names one."""

    schema: str | None
    name: str

    def sql(self, quoted: Callable[[str], str] = quote) -> str:
        """The quoted, qualified reference (``quoted``: the engine's identifier quoting)."""
        table = quoted(self.name)
        return table if self.schema is None else f"{quoted(self.schema)}.{table}"

    def sibling(self, prefix: str) -> TableName:
        """A table of the runtime's own beside this one (same schema), e.g. its staging table."""
        return TableName(self.schema, prefix + self.name)

    def canonical(self, *, fold: bool = True) -> str:
        """The table's key in a route identity, folded (``fold``) as the engine folds names.

        An unqualified plain name is its (folded) self, as before schemas were read;
        otherwise each part is quoted, so ``"a.b"`` and ``a.b`` never share a key.
        """
        same: Callable[[str], str] = fold_ascii if fold else str
        if self.schema is None and not {".", '"'} & set(self.name):
            return same(self.name)
        parts = [self.name] if self.schema is None else [self.schema, self.name]
        return ".".join(quote(same(part)) for part in parts)


_QUOTED_PART = re.compile(r'"((?:[^"]|"")+)"')


def parse_table(table: Any, *, default_schema: str | None = None) -> TableName:
    """``schema.table`` or ``table``; a part holding a dot or a quote is written quoted.

    ``raw.orders`` is table ``orders`` in schema ``raw``; ``"raw.orders"`` is one
    table of that name. A schema equal to ``default_schema`` (any ASCII case) is
    dropped, so ``main.orders`` and ``orders`` are the same DuckDB table.
    """
    quote(table)
    if "." not in table:
        return TableName(None, table)  # any name without a dot is taken as written
    parts: list[str] = []
    rest = table
    while True:
        match = _QUOTED_PART.match(rest) if rest.startswith('"') else None
        if match is not None:
            parts.append(match[1].replace('""', '"'))
            rest = rest[match.end() :]
        else:
            part, dot, tail = rest.partition(".")
            if not part or '"' in part:
                raise _bad_table(table)
            parts.append(part)
            rest = dot + tail
        if not rest:
            break
        if not rest.startswith(".") or len(parts) == 2:
            raise _bad_table(table)
        rest = rest[1:]
    if len(parts) == 1:
        return TableName(None, parts[0])
    schema, name = parts
    if default_schema is not None and fold_ascii(schema) == fold_ascii(default_schema):
        return TableName(None, name)
    return TableName(schema, name)


def _bad_table(table: str) -> ConfigInvalid:
    return ConfigInvalid(
        f"target table {table!r} is not a table name or schema.table (quote a part that "
        'holds a dot: "my.table")',
        diagnostics={"key": "target.table"},
    )


def refuse_reserved_schema(table: TableName, reserved: Iterable[str], *, engine: str) -> None:
    """A schema the engine keeps for itself (its catalog, a temporary or system schema) is a
    config error: a table there would vanish, or its name would be ambiguous."""
    if table.schema is not None and fold_ascii(table.schema) in {fold_ascii(r) for r in reserved}:
        raise ConfigInvalid(
            f"target table {table.schema}.{table.name} names a schema {engine} keeps for "
            "itself (a system, temporary or catalog name); choose another schema",
            diagnostics={"key": "target.table"},
        )


def refuse_reserved_prefix(
    name: str, prefix: str, *, engine: str, part: str, fold: bool = False
) -> None:
    """A ``part`` (table or schema) name starting with ``prefix`` (in any ASCII case if
    ``fold``), which the engine keeps for its own objects (SQLite's ``sqlite_`` tables,
    PostgreSQL's ``pg_`` schemas), is a config error: creating it would fail inside the
    target call, and so block the route."""
    if (fold_ascii(name) if fold else name).startswith(prefix):
        raise ConfigInvalid(
            f"target {part} {name!r} starts with {prefix!r}, which {engine} reserves for its "
            f"own {part}s; choose another name",
            diagnostics={"key": "target.table"},
        )


def refuse_schema(table: TableName, *, engine: str, hint: str) -> None:
    """For an engine without schemas in a table name: a qualified name is a config error."""
    if table.schema is not None:
        raise ConfigInvalid(
            f"target table {table.schema}.{table.name} names a schema, which {engine} target "
            f"tables cannot: {hint}",
            diagnostics={"key": "target.table"},
        )


# The runtime's own tables in a target database (its ledger, staging tables) start so;
# the staging table of ``orders`` is ``_dpone_stage_orders``.
RESERVED_PREFIX = "_dpone_"
STAGE_PREFIX = RESERVED_PREFIX + "stage_"


def check_target_table(table: Any) -> None:
    """Refuse a target table the runtime could mistake for one of its own (any ASCII case).

    A target named ``_dpone_stage_orders`` would be dropped as the staging table
    of ``orders``; one named ``_dpone_ledger`` would be written as the ledger
    (``_dpone_fence`` is kept for a target-side fence). A sink refuses the names
    its engine keeps for itself (``refuse_reserved_prefix``, ``refuse_reserved_schema``).
    """
    quote(table)
    if fold_ascii(parse_table(table).name).startswith(RESERVED_PREFIX):
        raise ConfigInvalid(
            f"target table {table!r} starts with {RESERVED_PREFIX!r}, which is reserved for "
            "dpone's own tables (the ledger, the fence and staging tables); choose another name",
            diagnostics={"key": "target.table"},
        )


_COMPARISONS = frozenset({"=", ">", ">=", "<", "<="})
# The operators of a cursor window; the others select a partition value.
WINDOW_OPERATORS = frozenset({">", "<=", UPTO_OR_NULL})


def bounds_where(
    bounds: Mapping[str, Any],
    *,
    partition_column: str,
    cursor_column: str | None,
    marker: str | Callable[[Predicate], str],
    name: Callable[[str], str] = quote,
) -> tuple[str, list[Any]]:
    """The condition selecting one partition's rows, with ``marker`` placeholders, and its values.

    Bad bounds raise ``ConfigInvalid`` from ``payloads.bound_predicates``.
    """
    predicates = bound_predicates(
        bounds, partition_column=partition_column, cursor_column=cursor_column
    )
    return render_predicates(predicates, marker=marker, name=name)


def refuse_folded_twins(columns: Sequence[Column], table: str, *, engine: str) -> None:
    """Two source columns whose names ``engine`` takes for one (SQLite and DuckDB compare
    names ignoring ASCII case: a PostgreSQL source's ``v`` and ``"V"``): the table cannot be
    made, and the load failed inside the target call, exit 1, "a retry may succeed"."""
    seen: dict[str, str] = {}
    for column in columns:
        other = seen.setdefault(fold_ascii(column.name), column.name)
        if other != column.name:
            raise ConfigInvalid(
                f"source columns {other!r} and {column.name!r} are one name to {engine}, which "
                "compares names ignoring case; rename one (a view of the source), or load "
                "into PostgreSQL or ClickHouse",
                diagnostics={"table": table, "columns": [other, column.name]},
            )


def check_target_folder(path: str, table: str) -> None:
    """A file target's folder must exist, and its path must not be a folder: the target call
    would fail inside the armed window."""
    if not os.path.isdir(os.path.dirname(os.path.abspath(path))):
        raise ConfigInvalid(
            f"folder of the target database for table {table!r} does not exist",
            diagnostics={"table": table},
        )
    if os.path.exists(path) and not os.path.isfile(path):
        what = "a folder" if os.path.isdir(path) else "a device, a pipe or a socket"
        raise ConfigInvalid(
            f"the target database path of table {table!r} is {what}, not a database file",
            diagnostics={"table": table},
        )
    folder = os.path.dirname(os.path.abspath(path))
    if len(os.path.basename(path).encode()) > os.pathconf(folder, "PC_NAME_MAX"):
        raise ConfigInvalid(  # the engine failed to open it, inside a staged load's stage
            f"the target database file of table {table!r} has a name longer than its file "
            "system allows; choose a shorter one",
            diagnostics={"table": table, "key": "target.path"},
        )


def check_writable(path: str, table: str) -> None:
    """A target file, or chDB's folder, this process may not write (permissions, an immutable
    flag, a read-only file system) is a configuration a retry cannot fix: refused before the
    target (exit 2), not reported as a busy database. The folder is probed too: the engines
    write their journals beside the file."""
    folder = path if os.path.isdir(path) else os.path.dirname(os.path.abspath(path))
    found = refused_write(path) if os.path.isfile(path) else None  # never opened: see there
    if found is None:
        try:
            tempfile.TemporaryFile(dir=folder).close()
        except OSError as error:
            found = error.errno
    if found in (errno.EACCES, errno.EPERM, errno.EROFS):
        # the class a server's refused privilege has too (``drivers.ServerFailure``)
        denied = {"failure": "permission_denied"} if found != errno.EROFS else {}
        raise ConfigInvalid(
            f"the target database of table {table!r} is read-only (its file or folder: "
            "permissions, an immutable flag or a read-only file system); nothing was written",
            diagnostics={"table": table, "key": "target.path", "errno": errno.errorcode[found],
                         **denied},
        )  # fmt: skip


# dpone's own tables beside a target: its ledger, its fence and its rejects.
OWN_TABLES = (LEDGER_TABLE, FENCE_TABLE, REJECTS_TABLE)


def own_name_taken(table: str, name: str) -> ConfigInvalid:
    """A view (or another object that is not a table) named as dpone's own ledger, fence or
    rejects table: its load failed inside the target call, and "a retry may succeed" was
    never true. Found before the target call."""
    return ConfigInvalid(
        f"the target database of table {table!r} has a view or another object that is not a "
        f"table named {name!r}, the name of dpone's own table beside the target; drop or "
        "rename it; nothing was written",
        diagnostics={"table": table, "name": name},
    )


def unavailable(table: str, *, to: str = "be opened for writing") -> TargetUnavailable:
    """The error of a target that cannot be opened now, found before the target call."""
    return TargetUnavailable(
        f"the target database of table {table!r} cannot {to} now (locked by another process, "
        "unreachable, read-only, damaged or not a database); nothing was written",
        diagnostics={"table": table},
    )


def unwritable(
    table: str,
    columns: Sequence[Column],
    *,
    name: Callable[[str], str],
    type_of: Callable[[Column], str],
    prepares: Callable[[str], bool],
) -> list[str]:
    """The names of ``columns`` that an ``INSERT INTO table ... SELECT`` of the types dpone
    makes for them cannot write (a column the table computes; a type the load's cannot be
    assigned to), as the engine's ``prepares(statement)`` (a ``PREPARE``, which checks the
    statement and runs nothing) says: all at once, then one by one when that fails."""

    def writes(group: Sequence[Column]) -> bool:
        names = ", ".join(name(column.name) for column in group)
        values = ", ".join(f"CAST(NULL AS {type_of(column)})" for column in group)
        return prepares(f"INSERT INTO {table} ({names}) SELECT {values}")

    if not columns or writes(columns):
        return []
    return [column.name for column in columns if not writes([column])]


@contextlib.contextmanager
def load_failures(
    table: str,
    errors: type[BaseException],
    refusals: tuple[type[BaseException], ...],
    code: Callable[[Any], str],
) -> Iterator[None]:
    """Around a load's transaction (outside it: rolled back first), the driver's errors whose
    outcome is known, each named by ``code(error)``, never its text:

    - ``refusals``, a constraint of the table or a column's type refusing a row (integrity
      and data errors: a statement's, or the commit's, so nothing was applied), become
      ``TargetConstraintRefused``;
    - any other of ``errors`` raised before the COMMIT was sent (``before_commit``) becomes
      ``TargetRolledBack``: a transaction that never got a COMMIT applied nothing.

    Any other error, raised at the COMMIT, propagates unchanged: its outcome is unknown."""
    try:
        yield
    except refusals as error:
        refused = TargetConstraintRefused.refused(table, constraint=code(error))
        raise with_driver_error(refused, error) from None
    except errors as error:
        if not getattr(error, _BEFORE_COMMIT, False):
            raise
        raise with_driver_error(TargetRolledBack.failed(table, code(error)), error) from None


_BEFORE_COMMIT = "_dpone_before_commit"


@contextlib.contextmanager
def before_commit(errors: type[BaseException]) -> Iterator[None]:
    """Inside a load's transaction, around all but its COMMIT: marks the driver's ``errors``
    raised there for ``load_failures``."""
    try:
        yield
    except errors as error:
        setattr(error, _BEFORE_COMMIT, True)
        raise


def range_cuts_sql(
    key: str, relation: str, window: Sequence[str], marker: str, *, modulo: str = "%"
) -> str:
    """The first key of every ``rows``-th row (``marker``) but the first, in key order, among
    the rows with a key and in the cursor ``window``: where ranges of about ``rows`` rows cut.
    ``modulo`` is the driver's spelling of ``%`` (psycopg: ``%%``)."""
    where = " AND ".join([f"{key} IS NOT NULL", *window])
    return (
        f"SELECT k FROM (SELECT {key} AS k, row_number() OVER (ORDER BY {key}) AS n"
        f" FROM {relation} WHERE {where}) AS dpone_ranges"
        f" WHERE n {modulo} {marker} = 1 AND n > 1 ORDER BY k"
    )


def range_partitions(cuts: Sequence[Any], *, keyed: bool, has_null: bool) -> list[dict[str, Any]]:
    """Contiguous ranges ``[from, below)`` between ``cuts`` covering every key (the first and
    last unbounded) when rows have a key, and the NULL key's partition when one has none."""
    edges = [None, *dict.fromkeys(cuts), None]  # equal cuts of a repeated key: one edge
    pairs = zip(edges, edges[1:], strict=False)
    ranges = [{"partition_from": low, "partition_below": high} for low, high in pairs]
    return ([{"partition": None}] if has_null else []) + (ranges if keyed else [])


def partition_predicate_count(bounds: Mapping[str, Any]) -> int:
    """How many of ``bound_predicates(bounds)`` select the partition; the cursor window's
    predicates follow them."""
    if "partition" in bounds:
        return 1
    return sum(bounds.get(edge) is not None for edge in RANGE_EDGES) or 1


def ranges_run_on(ranges: Sequence[Mapping[str, Any]]) -> bool:
    """Whether key ranges, in order, run from the lowest key to the highest, each starting
    where the one before ends: together they hold every key (``range_partitions``)."""
    edges = [None, *(edge for b in ranges for edge in (b.get(e) for e in RANGE_EDGES)), None]
    return all(edges[i] == edges[i + 1] for i in range(0, len(edges), 2))


def one_window_ranges(
    bounds: Sequence[Mapping[str, Any]],
) -> tuple[list[int], int | None] | None:
    """The indexes of the key ranges in ``bounds``, and of the NULL key's partition (or None),
    when there are two or more bounds, all in the same cursor window, none other than these."""
    ranges = [i for i, b in enumerate(bounds) if "partition_from" in b]
    others = [i for i, b in enumerate(bounds) if "partition_from" not in b]
    if len(bounds) < 2 or not ranges or len(others) > 1:
        return None
    if any(bounds[i].get("partition", 0) is not None for i in others):
        return None
    windows = [repr(sorted(cursor_window(b).items())) for b in bounds]
    if any(window != windows[0] for window in windows):
        return None  # by repr: 0 and False, or 1 and True, are not the same bound
    return ranges, (others[0] if others else None)


def integer_range_starts(
    ranges: Sequence[Mapping[str, Any]],
) -> tuple[list[int], int | None] | None:
    """Each range's first key (Int64's lowest for one open below), and the last range's end,
    when ``ranges`` are integer key ranges that, in order, each start where the one before
    ends; else None. A key's range is then the one of the greatest start at or below it."""
    edges = [(r.get("partition_from"), r.get("partition_below")) for r in ranges]
    if any("partition" in r for r in ranges) or any(
        edge is not None and type(edge) is not int for pair in edges for edge in pair
    ):
        return None
    lowest = -(2**63)
    ordered = sorted(edges, key=lambda pair: lowest if pair[0] is None else pair[0])
    if any(
        ordered[n][1] is None or ordered[n][1] != ordered[n + 1][0] for n in range(len(ordered) - 1)
    ):
        return None  # a gap, an overlap or an inner range open at one end
    starts = [lowest if low is None else low for low, _ in edges]
    if len(set(starts)) < len(starts):
        return None
    return starts, ordered[-1][1]


def edge_where(
    cursor: str, marker: str, since: Any, upto: Any, nulls: bool
) -> tuple[str, list[Any]]:
    """The condition selecting a cursor edge's rows in every partition (``cursor_edge.py``):
    a cursor in ``[since, upto]`` (when ``since`` is given), or NULL (when ``nulls``)."""
    conditions, params = [], []
    if since is not None and upto is not None:
        conditions.append(f"({cursor} >= {marker} AND {cursor} <= {marker})")
        params += [since, upto]
    if nulls:
        conditions.append(f"{cursor} IS NULL")
    return " OR ".join(conditions), params


def render_predicates(
    predicates: Iterable[Predicate],
    *,
    marker: str | Callable[[Predicate], str],
    name: Callable[[str], str] = quote,
) -> tuple[str, list[Any]]:
    """``predicates`` joined by AND, and the value of each placeholder, in order.

    ``name`` renders a column and ``marker`` a placeholder (a dialect may need
    more: ClickHouse names and types each one, from the predicate).
    """
    conditions: list[str] = []
    params: list[Any] = []
    for predicate in predicates:
        column = name(predicate.column)
        if predicate.op in ("IS NULL", "IS NOT NULL"):
            conditions.append(f"{column} {predicate.op}")
            continue
        if predicate.op != UPTO_OR_NULL and predicate.op not in _COMPARISONS:
            raise InternalInvariantBroken(
                f"a partition bound of column {predicate.column!r} uses an operator no "
                "connector renders (bounds come from payloads.bound_predicates only)",
                diagnostics={"column": predicate.column},
            )
        value = marker if isinstance(marker, str) else marker(predicate)
        if predicate.op == UPTO_OR_NULL:
            conditions.append(f"({column} <= {value} OR {column} IS NULL)")
        else:
            conditions.append(f"{column} {predicate.op} {value}")
        params.append(predicate.value)
    return " AND ".join(conditions), params


class TableSource(Source):
    """What the SQL sources share: one table, its partition and cursor columns, and the checks
    every read makes on them, with the same errors on every engine."""

    features = SourceFeatures()

    def __init__(
        self,
        table: str,
        partition_column: str,
        cursor_column: str | None = None,
        *,
        partition_rows: int | None = None,
    ) -> None:
        self.table = table
        self.partition_column = partition_column
        self.cursor_column = cursor_column
        self.partition_rows = partition_rows  # ranges of about so many rows; None: by value
        self._described: tuple[Column, ...] | None = None  # by ``_described_columns``

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(table={self.table!r}, "
            f"partition_column={self.partition_column!r})"
        )

    def describe(self) -> SourceShape:
        """Each engine's source describes its table (and calls ``_check_columns``)."""
        raise NotImplementedError

    def _described_columns(self) -> tuple[Column, ...]:
        """The columns of the last ``describe()``: the runtime's, at the start of each run, so
        that every read of the run takes the columns its shape and hashes name, and none
        describes the table again (a connection and a catalog query per partition)."""
        if self._described is None:
            self._described = tuple(self.describe().columns)
        return self._described

    def _check_columns(self, columns: Sequence[Column]) -> None:
        """``SourceMissing`` unless the table exists and has the route's columns; remembers them
        (``_described_columns``)."""
        if not columns:
            raise SourceMissing(
                f"source table {self.table!r} does not exist", diagnostics={"table": self.table}
            )
        names = {column.name for column in columns}
        for role, name in (("partition", self.partition_column), ("cursor", self.cursor_column)):
            if name is not None and name not in names:
                raise SourceMissing(
                    f"{role} column {name!r} does not exist in source table {self.table!r}",
                    diagnostics={"table": self.table, "column": name},
                )
        self._described = tuple(columns)

    def _single_values(
        self, bounds: Sequence[Mapping[str, Any]], chunk_rows: Any
    ) -> tuple[list[Predicate], tuple[Predicate, ...]] | None:
        """Each bound's partition predicate and the cursor window they share, when one scan
        can split them (``OnePassReading``): two or more bounds, each one partition value
        (``=`` or ``IS NULL``), all in the same window. None for key ranges, mixed windows,
        or one bound. A bad ``chunk_rows`` is refused first, as a read refuses it."""
        check_chunk_rows(chunk_rows)
        predicates = [
            bound_predicates(
                b, partition_column=self.partition_column, cursor_column=self.cursor_column
            )
            for b in bounds
        ]
        window = predicates[0][1:] if predicates else ()
        if (
            len(bounds) < 2
            or not all(  # by repr: 2**53 and 2.0**53 differ in SQL
                p[0].op in ("=", "IS NULL") and repr(p[1:]) == repr(window) for p in predicates
            )
        ):
            return None
        return [p[0] for p in predicates], window

    def _cursor(self, purpose: str = "") -> str:
        """The cursor column, which a windowed read needs."""
        if self.cursor_column is None:
            raise ConfigInvalid(
                f"source table {self.table!r} has no cursor column{purpose}",
                diagnostics={"table": self.table},
            )
        return self.cursor_column


def check_chunk_rows(chunk_rows: Any) -> int:
    if isinstance(chunk_rows, bool) or not isinstance(chunk_rows, int) or chunk_rows < 1:
        raise ConfigInvalid("chunk_rows must be a positive integer")
    return chunk_rows


class FileTarget(Sink):
    """What the file-backed sinks (SQLite, DuckDB) share: one target table in one file, whose
    ledger row commits in the load's own transaction, and a file not there yet reads as an
    empty target."""

    def __init__(self, path: str | os.PathLike[str], table: str) -> None:
        self.path = file_path(path)
        self.table = table

    def __repr__(self) -> str:
        return f"{type(self).__name__}(table={self.table!r})"

    @abc.abstractmethod
    def _connect(self) -> contextlib.AbstractContextManager[Any]:
        """A writing connection to the file, closed after the ``with`` block."""

    @abc.abstractmethod
    def _stage_sql(self) -> str:
        """The staging table's name in the engine's SQL."""

    def _reader(self) -> contextlib.AbstractContextManager[Any]:
        """Connection for read-only helpers, or None when the file does not exist yet."""
        if not os.path.isfile(self.path):
            return contextlib.nullcontext(None)
        return self._connect()

    def discard_stage(self) -> None:
        if not os.path.isfile(self.path):
            return
        with self._connect() as conn:
            conn.execute(f"DROP TABLE IF EXISTS {self._stage_sql()}")
