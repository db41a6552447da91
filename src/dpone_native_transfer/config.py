"""Route configuration files: one TOML file describes one route.

``[source] kind`` is ``sqlite`` (default) or ``postgres``; ``[target] kind``
is ``sqlite`` (default), ``duckdb``, ``clickhouse`` or ``postgres``. The engines other than
SQLite are optional extras: a route naming one that is not installed is
refused when the file is loaded, with the ``pip install`` line to run.

Every problem is a :class:`ConfigInvalid` whose message names the bad key as
a dotted path (``transfer.path``) and whose ``diagnostics["key"]`` holds it,
so an operator can fix the file without reading code. Messages never echo
configured values or the file's absolute path: both can be secret.
"""

from __future__ import annotations

import importlib.util
import os
import re
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs

from .checkpoints import RouteKey, Strategy
from .connectors.contract import DEFAULT_CHUNK_ROWS, Sink, Source
from .drivers import EXTRAS, POSTGRES_SCHEMES, install_hint, resolve_env
from .errors import ConfigInvalid
from .lease import DEFAULT_LEASE_SECONDS
from .spec import BUILTIN_PATH_NAMES, Governance, TransferSpec, check_option, route_key, type_name
from .wording import one_line

__all__ = ["DEFAULT_CHUNK_ROWS", "RouteConfig", "load_route_config", "route_config_from_mapping"]


_REQUIRED, _OPTIONAL = True, False
_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")
_TOML_POSITION = re.compile(r"\(at line (\d+), column (\d+)\)")

_SCHEMA: Mapping[str, tuple[bool, Mapping[str, tuple[str, bool]]]] = {
    "source": (
        _REQUIRED,
        {
            "kind": ("source_kind", _OPTIONAL),
            "path": ("file", _OPTIONAL),  # sqlite
            "dsn": ("secret", _OPTIONAL),  # postgres: a postgresql:// URL or env:NAME
            "table": ("name", _REQUIRED),
            "partition_column": ("name", _OPTIONAL),  # default: the integer primary key
            "partition_by": ("partition_by", _OPTIONAL),  # "value" | "range"
            "partition_rows": ("positive", _OPTIONAL),  # rows per range (default 100,000)
            "cursor_column": ("name", _OPTIONAL),
            "lag": ("lag", _OPTIONAL),  # cursor units re-read for late rows (cursor_edge.py)
            "on_null_cursor": ("on_null_cursor", _OPTIONAL),
            "primary_key": ("key", _OPTIONAL),  # merge: default the table's own primary key
            "deleted_column": ("name", _OPTIONAL),  # merge: true deletes the row's key
            "parallel": ("parallel", _OPTIONAL),  # postgres: connections a bulk read uses
        },
    ),
    "target": (
        _REQUIRED,
        {
            "kind": ("target_kind", _OPTIONAL),
            "path": ("file", _OPTIONAL),  # sqlite, duckdb; clickhouse: the chDB data folder
            "url": ("secret", _OPTIONAL),  # clickhouse server: clickhouse:// or http(s)://
            "dsn": ("secret", _OPTIONAL),  # postgres: a postgresql:// URL or env:NAME
            "table": ("name", _REQUIRED),
            "ledger": ("bool", _OPTIONAL),  # the target's batch ledger (default on)
            "batch_column": ("name", _OPTIONAL),  # a column holding each row's batch id
        },
    ),
    "transfer": (
        _REQUIRED,
        {
            "strategy": ("strategy", _REQUIRED),
            "path": ("path", _REQUIRED),
            "chunk_rows": ("positive", _OPTIONAL),
            "artifact_dir": ("file", _OPTIONAL),
            "schema_contract": ("schema_contract", _OPTIONAL),
            "on_bad_value": ("on_bad_value", _OPTIONAL),  # "refuse" | "quarantine"
            "quarantine_values": ("bool", _OPTIONAL),  # the rejects table keeps the values
        },
    ),
    "store": (
        _REQUIRED,
        {"path": ("file", _REQUIRED), "lease_seconds": ("seconds", _OPTIONAL)},
    ),
    "gates": (_OPTIONAL, {"min_rows": ("count", _OPTIONAL), "max_rows": ("count", _OPTIONAL)}),
    # "from_target": a run first resolves blocked batches the target's ledger proves
    "guard": (_OPTIONAL, {"recovery": ("recovery", _OPTIONAL)}),
}


@attrs.frozen
class _Kind:
    """One ``kind`` a route file may name: where it is, which extra it needs, its class."""

    keys: tuple[str, ...]  # its location keys; a route gives exactly one
    connector: str  # "module:Class", imported only when a route names the kind
    driver: str | None = None  # the module its extra installs (``drivers.EXTRAS``)
    range_key: str | None = None  # "module:function" (location, table) -> the key, if none named
    partitioned: bool = False  # the sink is told the source's partition column

    def make(self, location: str, table: str, *args: Any, **kwargs: Any) -> Any:
        return _imported(self.connector)(location, table, *args, **kwargs)


def _imported(reference: str) -> Any:
    module, name = reference.split(":")
    return getattr(importlib.import_module(module), name)


DEFAULT_KIND = "sqlite"
_CONNECTORS = "dpone_native_transfer.connectors"
_SOURCE_KINDS: Mapping[str, _Kind] = {
    "sqlite": _Kind(
        ("path",),
        f"{_CONNECTORS}.sqlite:SQLiteSource",
        range_key=f"{_CONNECTORS}.sqlite:integer_primary_key",
    ),
    "postgres": _Kind(("dsn",), f"{_CONNECTORS}.postgres:PostgresSource", driver="psycopg"),
}
_TARGET_KINDS: Mapping[str, _Kind] = {
    "sqlite": _Kind(("path",), f"{_CONNECTORS}.sqlite:SQLiteSink"),
    "duckdb": _Kind(("path",), f"{_CONNECTORS}.duckdb:DuckDBSink", driver="duckdb"),
    "clickhouse": _Kind(
        ("path", "url"),
        f"{_CONNECTORS}.clickhouse:ClickHouseSink",
        driver="clickhouse_connect",
        partitioned=True,
    ),
    "postgres": _Kind(("dsn",), f"{_CONNECTORS}.postgres_sink:PostgresSink", driver="psycopg"),
}
_LOCATION_KEYS = {"source": ("path", "dsn"), "target": ("path", "url", "dsn")}
# The keys a caller's ``locations`` replace (a scheduler's connections: see _with_locations).
_OVERRIDABLE = {**_LOCATION_KEYS, "store": ("path",)}

# The route file's own words; every other kind is ``spec.check_option``'s.
_WORDS: Mapping[str, tuple[str, ...]] = {
    "path": tuple(sorted(BUILTIN_PATH_NAMES)),
    "source_kind": tuple(_SOURCE_KINDS),
    "target_kind": tuple(_TARGET_KINDS),
}
DEFAULT_PARTITION_ROWS = 100_000


@attrs.frozen(kw_only=True, eq=False)
class RouteConfig:
    """A validated route: ready-made connectors plus how to run them and where to checkpoint."""

    source: Any  # the kind's class: SQLiteSource or PostgresSource
    sink: Any  # SQLiteSink, DuckDBSink, ClickHouseSink or PostgresSink
    strategy: Strategy
    path: str
    governance: Governance
    chunk_rows: int
    artifact_dir: str | None
    store_path: str = attrs.field(repr=False)  # a DSN may hold a password
    ledger: bool = True
    lease_seconds: float = DEFAULT_LEASE_SECONDS
    schema_contract: str = "evolve"
    lag: float = 0
    on_null_cursor: str = "error"
    recovery: str = "manual"
    batch_column: str | None = None
    on_bad_value: str = "refuse"
    quarantine_values: bool = False
    primary_key: tuple[str, ...] | None = None
    deleted_column: str | None = None
    # Where the source and target are, resolved (a DSN may hold a password: never log them).
    source_location: str = attrs.field(default="", repr=False)
    target_location: str = attrs.field(default="", repr=False)

    @property
    def label(self) -> str:
        return f"{one_line(self.source.table)} -> {one_line(self.sink.table)}"

    @property
    def route(self) -> RouteKey:
        """The route, located by the source's and target's databases."""
        return route_key(self.source, self.sink, self.strategy)

    def spec(self, run_id: str, *, sink: Any = None, recovery: str | None = None) -> TransferSpec:
        """The transfer spec for one run; ``sink`` replaces the configured one (tests, demo),
        ``recovery`` the route file's ``[guard] recovery``."""
        return TransferSpec(
            source=self.source,
            sink=self.sink if sink is None else sink,
            strategy=self.strategy,
            path=self.path,
            run_id=run_id,
            governance=self.governance,
            chunk_rows=self.chunk_rows,
            artifact_dir=self.artifact_dir,
            ledger=self.ledger,
            schema_contract=self.schema_contract,
            lag=self.lag,
            on_null_cursor=self.on_null_cursor,
            recovery=self.recovery if recovery is None else recovery,
            batch_column=self.batch_column,
            on_bad_value=self.on_bad_value,
            quarantine_values=self.quarantine_values,
            primary_key=self.primary_key,
            deleted_column=self.deleted_column,
        )


def load_route_config(
    path: str | os.PathLike[str],
    *,
    argument: str = "ROUTE",
    locations: Mapping[str, Mapping[str, str]] | None = None,
) -> RouteConfig:
    """Read and validate a route file; ``argument`` names it in errors instead of its path.

    ``locations`` (``{"source": {"dsn": ...}}``) replace the file's location keys. A
    pipeline file's table (``PIPELINE::TABLE``) is read by ``pipeline.load_route``, which
    reads either.
    """
    raw = _read_toml(Path(path), argument)
    if "pipeline" in raw or "tables" in raw:
        raise ConfigInvalid(
            f"{argument} is a pipeline file: name one of its tables as {argument}::TABLE",
            diagnostics={"argument": argument},
        )
    document = _with_locations(raw, locations)
    sections = _validated(document)
    folder = Path(os.path.abspath(path)).parent
    return _build(sections, folder)


def route_config_from_mapping(
    document: Mapping[str, Any],
    *,
    base_dir: str | os.PathLike[str] | None = None,
    locations: Mapping[str, Mapping[str, str]] | None = None,
) -> RouteConfig:
    """Validate a route given as a mapping with the route file's layout (e.g. from a DAG).

    Relative files resolve against ``base_dir`` (default: the working directory);
    ``locations`` replace location keys, as for :func:`load_route_config`.
    """
    if not isinstance(document, Mapping):
        raise ConfigInvalid("a route must be a mapping of sections", diagnostics={})
    plain = {name: _plain(table) for name, table in document.items()}
    sections = _validated(_with_locations(plain, locations))
    return _build(sections, Path(os.path.abspath(base_dir or os.getcwd())))


def _plain(table: Any) -> Any:
    return dict(table) if isinstance(table, Mapping) else table


def _with_locations(
    document: dict[str, Any], locations: Mapping[str, Mapping[str, str]] | None
) -> dict[str, Any]:
    """The document with each section's location keys replaced by ``locations``' ones.

    How a scheduler's connections take precedence over the file: the section's
    own ``path``/``dsn``/``url`` go, the given keys come in, and the result is
    validated like the file (a section missing from the file is made).
    """
    merged = dict(document)
    for section, keys in (locations or {}).items():
        if section not in _OVERRIDABLE:
            raise _invalid(_dotted(section), "is not a section whose location can be given")
        table = merged.get(section, {})
        if isinstance(table, dict):
            kept = {k: v for k, v in table.items() if k not in _OVERRIDABLE[section]}
            merged[section] = {**kept, **keys}
    return merged


_MAX_FILE_BYTES = 16 << 20  # a route or pipeline file's; a larger file is not one


class NotAFile(OSError):
    """A path that is not a regular file of at most ``_MAX_FILE_BYTES``: a device, a pipe, a
    socket (``/dev/zero`` as a route file grew memory until the kernel killed dpone)."""


def read_toml_file(path: str | os.PathLike[str]) -> dict[str, Any]:
    """A route or pipeline file's TOML; ``NotAFile`` for anything but a regular file of at
    most 16 MiB (checked before it is opened: opening a pipe waits for a writer)."""
    if os.path.isdir(path):
        raise IsADirectoryError(path)
    if not os.path.isfile(path):
        os.stat(path)  # FileNotFoundError, PermissionError as they are
        raise NotAFile(path)
    with open(path, "rb") as handle:
        data = handle.read(_MAX_FILE_BYTES + 1)
    if len(data) > _MAX_FILE_BYTES:
        raise NotAFile(path)
    return tomllib.loads(data.decode("utf-8"))


def _read_toml(path: Path, argument: str) -> dict[str, Any]:
    where = {"argument": argument}
    try:
        return read_toml_file(path)
    except FileNotFoundError:
        problem = "does not exist"
    except IsADirectoryError:
        problem = "is a directory, not a file"
    except NotAFile:
        problem = "is not a route or pipeline file (a device, a pipe or over 16 MiB)"
    except PermissionError:
        problem = "cannot be read (permission denied)"
    except OSError:
        problem = "cannot be read"
    except UnicodeDecodeError:
        problem = "is not valid TOML: it is not UTF-8 text"
    except RecursionError:
        problem = "is not a route or pipeline file: its tables or arrays nest too deeply"
    except tomllib.TOMLDecodeError as exc:
        position = _toml_position(exc)
        raise ConfigInvalid(
            f"the file given as {argument} is not valid TOML: {exc}",
            diagnostics={**where, **position},
        ) from None
    raise ConfigInvalid(f"the file given as {argument} {problem}", diagnostics=where)


def _toml_position(exc: tomllib.TOMLDecodeError) -> dict[str, int | None]:
    """Line and column of a TOML error (attributes from Python 3.14, the message before)."""
    line, column = getattr(exc, "lineno", None), getattr(exc, "colno", None)
    if line is None and (match := _TOML_POSITION.search(str(exc))):
        line, column = int(match[1]), int(match[2])
    return {} if line is None else {"line": line, "column": column}


def _dotted(*keys: str) -> str:
    return ".".join(key if _BARE_KEY.fullmatch(key) else _quoted(key) for key in keys)


def _quoted(key: str) -> str:
    escaped = key.replace("\\", "\\\\").replace('"', '\\"')
    return '"' + "".join(c if c.isprintable() else f"\\u{ord(c):04x}" for c in escaped) + '"'


def _invalid(key: str, message: str) -> ConfigInvalid:
    return ConfigInvalid(f"{key} {message}", diagnostics={"key": key})


def _validated(document: dict[str, Any]) -> dict[str, dict[str, Any]]:
    for name in document:
        if not isinstance(name, str):
            raise ConfigInvalid("route section names must be strings", diagnostics={})
        if name not in _SCHEMA:
            raise _invalid(_dotted(name), f"is not a known section; known: {', '.join(_SCHEMA)}")
    sections = {}
    for name, (required, keys) in _SCHEMA.items():
        if name not in document:
            if required:
                raise _invalid(name, "section is missing")
            continue
        table = document[name]
        if not isinstance(table, dict):
            raise _invalid(name, f"must be a table ([{name}]), not {type_name(table)}")
        sections[name] = _validated_section(name, table, keys)
    _check_gates(sections.get("gates", {}))
    _check_kind("source", sections["source"], _SOURCE_KINDS[_kind_name(sections["source"])])
    _check_kind("target", sections["target"], _TARGET_KINDS[_kind_name(sections["target"])])
    return sections


def _kind_name(table: Mapping[str, Any]) -> str:
    return table.get("kind", DEFAULT_KIND)


def _location(table: Mapping[str, Any], folder: Path, section: str) -> str:
    """A file relative to the route file's folder, or a URL (``env:NAME`` resolved)."""
    if "path" in table:
        return _resolve(folder, table["path"])
    key = "dsn" if "dsn" in table else "url"
    return resolve_env(table[key], argument=f"{section}.{key}")


def _check_kind(section: str, table: Mapping[str, Any], spec: _Kind) -> None:
    """Exactly one location key the kind takes, and the kind's extra installed."""
    kind, takes, module = _kind_name(table), spec.keys, spec.driver
    for key in _LOCATION_KEYS[section]:
        if key in table and key not in takes:
            raise _invalid(f"{section}.{key}", f"is not used by {section}.kind = {kind!r}")
    given = [key for key in takes if key in table]
    if len(given) != 1:
        keys = " or ".join(f"{section}.{key}" for key in takes)
        problem = "is required" if not given else "must be given alone, not both"
        raise _invalid(f"{section}.{takes[0]}", f"({keys}) {problem} for kind {kind!r}")
    if module is not None and importlib.util.find_spec(module) is None:
        raise _invalid(
            f"{section}.kind", f"= {kind!r} needs an optional extra: {install_hint(EXTRAS[module])}"
        )


def _validated_section(
    section: str, table: dict[str, Any], keys: Mapping[str, tuple[str, bool]]
) -> dict[str, Any]:
    for key in table:
        if key not in keys:
            raise _invalid(_dotted(section, key), f"is not a known key; known: {', '.join(keys)}")
    for key, (kind, required) in keys.items():
        if key in table:
            _check_value(_dotted(section, key), kind, table[key])
        elif required:
            raise _invalid(_dotted(section, key), "is required but missing")
    return table


def _check_value(key: str, kind: str, value: Any) -> None:
    check_option(key, kind, value)
    if kind in _WORDS and value not in _WORDS[kind]:
        raise _invalid(key, f"must be one of: {', '.join(_WORDS[kind])}")


def _check_gates(gates: Mapping[str, int]) -> None:
    low, high = gates.get("min_rows"), gates.get("max_rows")
    if low is not None and high is not None and low > high:
        raise _invalid("gates.min_rows", f"({low:,}) must not exceed gates.max_rows ({high:,})")


def _check_target_file(sections: Mapping[str, Mapping[str, Any]], folder: Path) -> None:
    """A target file that is a folder, or the source's own file, is refused with the route (a
    pipeline's before any of its tables runs): each load failed on its own, the second after
    waiting 30 s for the source's read to let the file be written."""
    target, source = sections["target"], sections["source"]
    if "path" not in target or _kind_name(target) not in _FILE_TARGETS:
        return
    path = _resolve(folder, target["path"])
    if os.path.isdir(path):
        raise _invalid("target.path", "is a folder, not a database file")
    if os.path.exists(path) and not os.path.isfile(path):
        raise _invalid("target.path", "is a device, a pipe or a socket, not a database file")
    if "path" in source and os.path.realpath(_resolve(folder, source["path"])) == (
        os.path.realpath(path)
    ):
        raise _invalid("target.path", "is the source's own file: give the target a file of its own")


def _check_store_file(sections: Mapping[str, Mapping[str, Any]], folder: Path) -> None:
    """A store file that is the source's or the target's own database is refused before any
    table runs: each table failed on its own inside the run (and the store would write into
    the source)."""
    store = _store_location(folder, sections["store"]["path"])
    if store.startswith(("env:", *POSTGRES_SCHEMES)):
        return
    for name in ("source", "target"):
        section = sections[name]
        if "path" in section and os.path.realpath(_resolve(folder, section["path"])) == (
            os.path.realpath(store)
        ):
            raise _invalid(
                "store.path", f"is the {name}'s own file: give the store a file of its own"
            )


_FILE_TARGETS = ("sqlite", "duckdb")


def _build(sections: dict[str, dict[str, Any]], folder: Path) -> RouteConfig:
    _check_target_file(sections, folder)
    _check_store_file(sections, folder)
    transfer, gates = sections["transfer"], sections.get("gates", {})
    artifact_dir = transfer.get("artifact_dir")
    strategy = Strategy(transfer["strategy"])
    source = _source(sections["source"], folder, strategy)
    ranged = source.partition_rows
    key = sections["source"].get("primary_key")
    return RouteConfig(
        source_location=_location(sections["source"], folder, "source"),
        target_location=_location(sections["target"], folder, "target"),
        source=source,
        sink=_sink(sections["target"], folder, None if ranged else source.partition_column),
        strategy=strategy,
        path=transfer["path"],
        governance=Governance(min_rows=gates.get("min_rows"), max_rows=gates.get("max_rows")),
        chunk_rows=transfer.get("chunk_rows", DEFAULT_CHUNK_ROWS),
        artifact_dir=None if artifact_dir is None else _resolve(folder, artifact_dir),
        store_path=_store_location(folder, sections["store"]["path"]),
        ledger=sections["target"].get("ledger", True),
        lease_seconds=float(sections["store"].get("lease_seconds", DEFAULT_LEASE_SECONDS)),
        schema_contract=transfer.get("schema_contract", "evolve"),
        lag=sections["source"].get("lag", 0),
        on_null_cursor=sections["source"].get("on_null_cursor", "error"),
        recovery=sections.get("guard", {}).get("recovery", "manual"),
        batch_column=sections["target"].get("batch_column"),
        on_bad_value=transfer.get("on_bad_value", "refuse"),
        quarantine_values=transfer.get("quarantine_values", False),
        primary_key=None if key is None else tuple([key] if isinstance(key, str) else key),
        deleted_column=sections["source"].get("deleted_column"),
    )


def _source(table: Mapping[str, Any], folder: Path, strategy: Strategy) -> Source:
    """The source connector. ``partition_by = "range"`` (the default without a partition
    column) cuts the key into ranges of ``partition_rows``; a route without a cursor column
    then windows by the key too, so each run loads the keys above the last one it loaded
    (not a merge route: it reads the whole table each run, where updated rows are)."""
    kind = _SOURCE_KINDS[_kind_name(table)]
    location = _location(table, folder, "source")
    by = table.get("partition_by", "value" if "partition_column" in table else "range")
    if "partition_rows" in table and by != "range":
        raise _invalid("source.partition_rows", 'needs partition_by = "range"')
    key = table.get("partition_column")
    if key is None:
        if by != "range":
            raise _invalid("source.partition_column", "is required but missing")
        if kind.range_key is None:  # a server's table: no key is looked up before a run
            raise _invalid(
                "source.partition_column",
                f"is required for a {_kind_name(table)} source: name the column whose values "
                "are the partitions, or the key to cut into ranges (its integer primary key)",
            )
        key = _imported(kind.range_key)(location, table["table"])
    rows = table.get("partition_rows", DEFAULT_PARTITION_ROWS) if by == "range" else None
    windowed = by == "range" and strategy is not Strategy.MERGE
    cursor = table.get("cursor_column") or (key if windowed else None)
    extra = {}
    if "parallel" in table:
        if _kind_name(table) != "postgres":
            raise _invalid("source.parallel", 'is read by source.kind = "postgres" only')
        extra["parallel"] = table["parallel"]
    return kind.make(location, table["table"], key, cursor, partition_rows=rows, **extra)


def _sink(table: Mapping[str, Any], folder: Path, partition_column: str | None) -> Sink:
    kind = _TARGET_KINDS[_kind_name(table)]
    location = _location(table, folder, "target")
    if kind.partitioned:
        return kind.make(location, table["table"], partition_by=partition_column)
    return kind.make(location, table["table"])


def _store_location(folder: Path, value: str) -> str:
    """A store file resolves like any file; a DSN or an ``env:NAME`` reference is kept as is."""
    if value.startswith(("env:", *POSTGRES_SCHEMES)):
        return value
    return _resolve(folder, value)


def _resolve(folder: Path, value: str) -> str:
    """A configured file, relative to the route file's folder unless absolute."""
    return os.fspath(folder / value)
