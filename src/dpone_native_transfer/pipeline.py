"""Pipeline files: one source database, one target database, one store, many tables.

Each table of a pipeline is an ordinary route: its route file's sections are
built from the pipeline's (``[source]``, ``[target]``, ``[store]``, the
table's settings over ``[defaults]``) and validated by
``config.route_config_from_mapping``, so it has the identity, checkpoints,
ledger, lease and guard a route file of the same tables would give it. A
table's route is named ``PIPELINE::TABLE`` wherever a route file is taken
(``dpone-transfer state show pipeline.toml::orders``).

The whole file is checked before any table runs, against the source's
catalog (``discover.read_catalog``): an unknown key or table, a pattern that
matches nothing, a column the table lacks, two tables mapped by accident to
one target table. Every problem is a ``ConfigInvalid`` naming the file's key
path (``tables.orders.cursor_column``), never a configured value.
"""

from __future__ import annotations

import fnmatch
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs

from .config import (
    _SOURCE_KINDS,
    RouteConfig,
    _check_kind,
    _check_value,
    _dotted,
    _invalid,
    _read_toml,
    _with_locations,
    load_route_config,
    read_toml_file,
)
from .config import route_config_from_mapping as _route_config
from .discover import TableInfo, read_catalog
from .errors import ConfigInvalid
from .identity import fold_ascii
from .lease import lease_key
from .spec import type_name

__all__ = [
    "REFERENCE",
    "Pipeline",
    "PipelineTable",
    "is_pipeline",
    "is_pipeline_file",
    "load_pipeline",
    "load_route",
    "pipeline_from_mapping",
    "pipeline_route",
    "split_reference",
]

REFERENCE = "::"  # PIPELINE::TABLE names one table's route
AUTO_PATH = "auto"  # a table's path unless it names one: the fastest for its source and target
_PATTERN = frozenset("*?[")

# A table's settings, in [defaults] or its [tables.NAME], and the route-file section of each.
TABLE_KEYS: Mapping[str, str] = {
    "strategy": "transfer",
    "path": "transfer",
    "chunk_rows": "transfer",
    "artifact_dir": "transfer",
    "schema_contract": "transfer",
    "on_bad_value": "transfer",
    "quarantine_values": "transfer",
    "partition_column": "source",
    "partition_by": "source",
    "partition_rows": "source",
    "cursor_column": "source",
    "lag": "source",
    "on_null_cursor": "source",
    "primary_key": "source",
    "deleted_column": "source",
    "parallel": "source",
    "min_rows": "gates",
    "max_rows": "gates",
    "recovery": "guard",
}
_SECTIONS: Mapping[str, tuple[str, ...]] = {
    "pipeline": ("tables",),
    "source": ("kind", "path", "dsn"),
    "target": (
        "kind",
        "path",
        "url",
        "dsn",
        "ledger",
        "batch_column",
        "table_prefix",
        "table_suffix",
    ),
    "store": ("path", "lease_seconds"),
    "defaults": tuple(TABLE_KEYS),
    "tables": (),  # a [tables.NAME] per table: TABLE_KEYS and target_table
}
_TABLE_ONLY = ("target_table",)
_NAMING = ("table_prefix", "table_suffix")
_ONE_WRITER = ("chdb:",)  # an embedded engine whose database's tables load one at a time


@attrs.frozen(eq=False)
class PipelineTable:
    """One table of a pipeline: its source table's name and its route."""

    name: str
    config: RouteConfig
    rows: int | None = None  # the catalog's estimate, when asked for

    @property
    def group(self) -> str:
        """What this table's run shares with others' that must not run at once: its target
        table (the lease's key); on chDB the whole target database, which one process opens
        at a time. A DuckDB file's tables run at once: the run keeps one database per file
        open for all of them, and its writes take turns (``DuckDBSink._connect``)."""
        route = self.config.route
        if (route.target_location or "").startswith(_ONE_WRITER):
            return route.target_location or ""
        return lease_key(route)


@attrs.frozen(eq=False)
class Pipeline:
    """A validated pipeline: its file (as given) and its tables, in the order selected."""

    file: str
    tables: tuple[PipelineTable, ...]
    folded: bool = False  # the source's names ignore ASCII case (SQLite): so do ``table``'s

    def reference(self, name: str) -> str:
        return f"{self.file}{REFERENCE}{name}"

    @property
    def names(self) -> list[str]:
        return [table.name for table in self.tables]

    def table(self, name: str, *, argument: str) -> PipelineTable:
        """The table named ``name`` (``--tables``, ``PIPELINE::TABLE``), as the source names
        it: ``ORDERS`` is ``orders`` of a SQLite source, as in ``[pipeline] tables``."""
        tables = {table.name: table for table in self.tables}
        found = _found(name, tables, folded=self.folded)
        if found is not None:
            return tables[found]
        raise ConfigInvalid(
            f"{argument} names a table that is not in the pipeline; its tables: "
            + _listed(self.names),
            diagnostics={"argument": argument, "tables": len(self.tables)},
        )

    def selected(
        self, names: Sequence[str] | None, *, argument: str = "--tables"
    ) -> list[PipelineTable]:
        """The tables named (each once, however it is spelled), or every table."""
        if not names:
            return list(self.tables)
        picked = (self.table(name, argument=argument) for name in names)
        return list({table.name: table for table in picked}.values())


def _listed(names: Sequence[str], shown: int = 20) -> str:
    more = f"; and {len(names) - shown} more" if len(names) > shown else ""
    return (", ".join(names[:shown]) or "none") + more


def split_reference(value: str) -> tuple[str, str | None]:
    """``pipeline.toml::orders`` as the file and the table; any other value as a file. The
    file is the shortest part that exists (a table may be named ``a::b``); none: at the
    last ``::``, so that the error names the file."""
    if REFERENCE not in value or os.path.exists(value):
        return value, None
    parts = value.split(REFERENCE)
    for cut in range(1, len(parts)):
        file = REFERENCE.join(parts[:cut])
        if os.path.isfile(file):
            return file, REFERENCE.join(parts[cut:])
    file, _, table = value.rpartition(REFERENCE)
    return file, table


def load_route(
    path: str | os.PathLike[str],
    *,
    argument: str = "ROUTE",
    locations: Mapping[str, Mapping[str, str]] | None = None,
) -> RouteConfig:
    """A route file's route, or one table's route of a pipeline file (``PIPELINE::TABLE``):
    what every command that takes a route reads it with. ``argument`` and ``locations`` as
    for ``config.load_route_config``."""
    file, table = split_reference(os.fspath(path))
    raw = _read_toml(Path(file), argument)
    if table is not None or is_pipeline(raw):
        return pipeline_route(raw, file, table, argument=argument, locations=locations)
    return load_route_config(file, argument=argument, locations=locations)


def is_pipeline(document: Mapping[str, Any]) -> bool:
    """A pipeline file has ``[pipeline]`` or ``[tables]``; a route file has neither."""
    return "pipeline" in document or "tables" in document


def is_pipeline_file(path: str) -> bool:
    """Whether ``path`` (a file, not a ``PIPELINE::TABLE``) holds a pipeline; a file that
    cannot be read says no, so that loading it reports why as a route file would."""
    try:
        return is_pipeline(read_toml_file(path))
    except (OSError, ValueError, RecursionError):
        return False


def load_pipeline(
    path: str | os.PathLike[str],
    *,
    argument: str = "PIPELINE",
    locations: Mapping[str, Mapping[str, str]] | None = None,
    rows: bool = False,
) -> Pipeline:
    """Read and validate a pipeline file against its source's catalog; ``rows``: with each
    table's row estimate (a count per table on SQLite), by which a run orders them."""
    file = os.fspath(path)
    document = _read_toml(Path(file), argument)
    if not is_pipeline(document):
        raise ConfigInvalid(
            f"the file given as {argument} is a route file, not a pipeline file (it has no "
            "[pipeline] or [tables] section)",
            diagnostics={"argument": argument},
        )
    folder = Path(os.path.abspath(file)).parent
    return pipeline_from_mapping(
        document, base_dir=folder, file=file, locations=locations, rows=rows
    )


def pipeline_route(
    document: Mapping[str, Any],
    file: str,
    table: str | None,
    *,
    argument: str,
    locations: Mapping[str, Mapping[str, str]] | None = None,
) -> RouteConfig:
    """The route of one table, for a command that takes a route file (``config`` calls it
    for ``PIPELINE::TABLE``, and for a pipeline file named without a table, to refuse it)."""
    if not is_pipeline(document):
        raise ConfigInvalid(
            f"{argument} names a table ({REFERENCE}TABLE) of a route file: a route file has "
            "one route; name the file alone",
            diagnostics={"argument": argument},
        )
    folder = Path(os.path.abspath(file)).parent
    pipeline = pipeline_from_mapping(document, base_dir=folder, file=file, locations=locations)
    if table is None:
        raise ConfigInvalid(
            f"the file given as {argument} is a pipeline file: name one of its tables as "
            f"PIPELINE{REFERENCE}TABLE; its tables: {_listed(pipeline.names)}",
            diagnostics={"argument": argument, "tables": len(pipeline.tables)},
        )
    return pipeline.table(table, argument=argument).config


def pipeline_from_mapping(
    document: Mapping[str, Any],
    *,
    base_dir: str | os.PathLike[str] | None = None,
    file: str = "<pipeline>",
    locations: Mapping[str, Mapping[str, str]] | None = None,
    rows: bool = False,
) -> Pipeline:
    """Validate a pipeline given as a mapping with the file's layout; relative files resolve
    against ``base_dir``; ``locations`` replace location keys, as for a route."""
    plain = {name: dict(t) if isinstance(t, Mapping) else t for name, t in document.items()}
    sections = _sections(_with_locations(plain, locations))
    folder = Path(os.path.abspath(base_dir or os.getcwd()))
    source = sections["source"]
    kind = source.get("kind", "sqlite")
    _check_value("source.kind", "source_kind", kind)
    _check_kind("source", source, _SOURCE_KINDS[kind])  # before the catalog is read from it
    for key in ("path", "dsn"):
        if key in source and not isinstance(source[key], str):
            raise _invalid(f"source.{key}", f"must be a string, not {type_name(source[key])}")
    located = os.fspath(folder / source["path"]) if "path" in source else str(source["dsn"])
    catalog = {info.name: info for info in read_catalog(kind, located, rows=rows)}
    folded = kind == "sqlite"  # SQLite's names ignore ASCII case (only)
    sections["tables"] = _named_as_source(sections["tables"], catalog, folded=folded)
    names = _selected(sections, catalog, folded=folded)
    tables = [
        PipelineTable(
            name, _route(sections, name, catalog[name], folder, folded), catalog[name].rows
        )
        for name in names
    ]
    _check_targets(tables, sections)
    return Pipeline(file=file, tables=tuple(tables), folded=folded)


def _sections(document: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """Known sections and keys only; every table's settings a table of known keys."""
    for name in document:
        if name not in _SECTIONS:
            raise _invalid(
                _dotted(str(name)), f"is not a known section; known: {', '.join(_SECTIONS)}"
            )
    sections: dict[str, dict[str, Any]] = {}
    for name, keys in _SECTIONS.items():
        table = document.get(name, {})
        if not isinstance(table, dict):
            raise _invalid(name, f"must be a table ([{name}]), not {type_name(table)}")
        if name != "tables":
            _known(table, keys, name)
        sections[name] = table
    for required in ("source", "target", "store"):
        if required not in document:
            raise _invalid(required, "section is missing")
    for table, settings in sections["tables"].items():
        where = _dotted("tables", table)
        if not isinstance(settings, dict):
            raise _invalid(where, f"must be a table ([{where}]), not {type_name(settings)}")
        _known(settings, (*_TABLE_ONLY, *TABLE_KEYS), "tables", table)
    listed = sections["pipeline"].get("tables")
    if listed is not None and (
        not isinstance(listed, list)
        or not all(isinstance(e, str) and e.strip("! ") for e in listed)
    ):
        raise _invalid("pipeline.tables", "must be an array of table names and patterns")
    for key in _NAMING:
        if key in sections["target"] and not isinstance(sections["target"][key], str):
            raise _invalid(
                f"target.{key}", f"must be a string, not {type_name(sections['target'][key])}"
            )
    return sections


def is_pattern(entry: str) -> bool:
    """Whether a ``[pipeline] tables`` entry is read as a pattern (``!`` takes matches out,
    ``*``, ``?`` and ``[...]`` match): a table whose name looks so is named by its own
    ``[tables.NAME]`` section instead."""
    return entry.startswith("!") or bool(_PATTERN & set(entry))


def _known(table: Mapping[str, Any], keys: Sequence[str], *where: str) -> None:
    for key in table:
        if key not in keys:
            raise _invalid(
                _dotted(*where, str(key)), f"is not a known key; known: {', '.join(keys)}"
            )


def _found(name: str, catalog: Mapping[str, Any], *, folded: bool) -> str | None:
    """The source's own name of the table ``name`` names (a key of ``catalog``), or None."""
    if name in catalog:
        return name
    if folded:
        return next((n for n in catalog if fold_ascii(n) == fold_ascii(name)), None)
    return None


def _named_as_source(
    tables: Mapping[str, dict[str, Any]], catalog: Mapping[str, TableInfo], *, folded: bool
) -> dict[str, dict[str, Any]]:
    """Each ``[tables.NAME]`` keyed by the source's own name of its table: a SQLite source's
    ``[tables.ORDERS]`` is its table ``orders``, as in ``[pipeline] tables`` and
    ``--tables``. Two sections of one table are refused."""
    keyed: dict[str, dict[str, Any]] = {}
    for spelled, settings in tables.items():
        name = _found(spelled, catalog, folded=folded)
        if name is None:
            raise _invalid(_dotted("tables", spelled), "names no table of the source")
        if name in keyed:
            raise _invalid(
                _dotted("tables", spelled),
                f"names source table {name!r}, as another [tables] section does",
            )
        keyed[name] = settings
    return keyed


def _selected(
    sections: Mapping[str, Mapping[str, Any]], catalog: Mapping[str, TableInfo], *, folded: bool
) -> list[str]:
    """The tables the file selects, in its order: ``[pipeline] tables`` (names; patterns,
    each matching some table; ``!`` patterns taking matches out again), then each
    ``[tables.NAME]``. A table named explicitly is never taken out by a pattern."""

    listed = sections["pipeline"].get("tables", [])
    named = list(sections["tables"])
    if not listed and not named:
        raise _invalid(
            "pipeline.tables",
            "is required: list the tables or patterns to move, or give each table a [tables.NAME]",
        )
    explicit: list[str] = []
    matched: list[str] = []
    excluded: set[str] = set()
    for index, entry in enumerate(listed):
        key = f"pipeline.tables[{index}]"
        pattern = entry.removeprefix("!").strip()
        if is_pattern(entry):
            hits = [
                n
                for n in catalog
                if fnmatch.fnmatchcase(
                    fold_ascii(n) if folded else n, fold_ascii(pattern) if folded else pattern
                )
            ]
            if not hits:
                raise _invalid(key, "matches no table of the source")
            if entry.startswith("!"):
                excluded.update(hits)
            else:
                matched.extend(hits)
            continue
        name = _found(entry, catalog, folded=folded)
        if name is None:
            raise _invalid(key, "names no table of the source")
        explicit.append(name)
    picked = [*explicit, *(n for n in matched if n not in excluded), *named]
    if not picked:
        raise _invalid("pipeline.tables", "selects no table: its patterns take out every match")
    return list(dict.fromkeys(picked))


# Settings naming the source's columns: checked against its catalog before any table runs.
_COLUMN_KEYS = ("partition_column", "cursor_column", "primary_key", "deleted_column")


def _route(
    sections: Mapping[str, Mapping[str, Any]],
    name: str,
    info: TableInfo,
    folder: Path,
    folded: bool,
) -> RouteConfig:
    """The table's route: its route-file sections, validated as a route file's, errors naming
    the pipeline file's keys."""
    own = sections["tables"].get(name, {})
    settings = {
        key: (value, _dotted("defaults", key)) for key, value in sections["defaults"].items()
    }
    settings.update({key: (value, _dotted("tables", name, key)) for key, value in own.items()})
    origins = {f"source.{k}": f"source.{k}" for k in ("kind", "path", "dsn")}
    document: dict[str, dict[str, Any]] = {
        "source": {**sections["source"], "table": name},
        "target": {k: v for k, v in sections["target"].items() if k not in _NAMING},
        "transfer": {},
        "store": dict(sections["store"]),
    }
    for key, (value, where) in settings.items():
        if key in _TABLE_ONLY:
            continue
        named = [value] if isinstance(value, str) else value if isinstance(value, list) else []
        if key in _COLUMN_KEYS and all(isinstance(column, str) for column in named):
            if not all(info.has_column(column, folded=folded) for column in named):
                raise _invalid(where, f"names no column of source table {name!r}")
        document.setdefault(TABLE_KEYS[key], {})[key] = value
        origins[f"{TABLE_KEYS[key]}.{key}"] = where
    source = document["source"]
    if (
        "partition_column" not in source
        and source.get("partition_by", "range") == "range"
        and info.range_key
    ):
        source.update(partition_column=info.range_key, partition_by="range")
    document["transfer"].setdefault("path", AUTO_PATH)
    for key in ("strategy", "path"):
        origins.setdefault(f"transfer.{key}", _dotted("defaults", key))
    origins.setdefault("source.partition_column", _dotted("tables", name, "partition_column"))
    target, where = _target_name(sections["target"], name, own)
    document["target"]["table"] = target
    origins["target.table"] = where
    if document["transfer"].get("strategy") == "merge" and not (
        "primary_key" in source or info.primary_key
    ):  # as ``planner.route_merge`` would refuse it, once the table ran
        raise _invalid(
            _dotted("tables", name, "primary_key"),
            f"is required: source table {name!r} has no primary key of its own and the "
            "table merges, so name the column(s) that identify a row",
        )
    try:
        return _route_config(document, base_dir=folder)
    except ConfigInvalid as error:
        raise _rekeyed(error, origins) from None


def _target_name(target: Mapping[str, Any], name: str, own: Mapping[str, Any]) -> tuple[Any, str]:
    """``target_table``, or the source table's name (``sales.orders``: ``sales_orders``)
    between ``target.table_prefix`` and ``target.table_suffix``."""
    if "target_table" in own:
        return own["target_table"], _dotted("tables", name, "target_table")
    prefix, suffix = target.get("table_prefix", ""), target.get("table_suffix", "")
    return f"{prefix}{name.replace('.', '_')}{suffix}", _dotted("tables", name, "target_table")


def _rekeyed(error: ConfigInvalid, origins: Mapping[str, str]) -> ConfigInvalid:
    """The route's error, naming the pipeline file's key instead of the route file's."""
    key = error.diagnostics.get("key")
    where = origins.get(key) if isinstance(key, str) else None
    if key is None or where is None:
        return error
    message = (
        error.message.replace(key, where, 1)
        if key in error.message
        else f"{where}: {error.message}"
    )
    return type(error)(message, diagnostics={**error.diagnostics, "key": where})


def _check_targets(
    tables: Sequence[PipelineTable], sections: Mapping[str, Mapping[str, Any]]
) -> None:
    """Two tables write one target table only on purpose (shards fanned into one table): each
    names it with its own ``target_table``, and each appends (a refresh would replace the
    others' rows). The lease then serialises them; a run puts them in one queue."""
    groups: dict[str, list[PipelineTable]] = {}
    for table in tables:
        groups.setdefault(lease_key(table.config.route), []).append(table)
    for group in groups.values():
        if len(group) < 2:
            continue
        for table in group:
            own = sections["tables"].get(table.name, {})
            appends = str(table.config.strategy) == "incremental_append"
            if "target_table" not in own or not appends:
                other = next(t.name for t in group if t is not table)
                raise _invalid(
                    _dotted("tables", table.name, "target_table"),
                    f"is the target table of {_dotted('tables', other)} too: tables share a "
                    "target table only when each names it with its own target_table and "
                    'appends (strategy = "incremental_append")',
                )
