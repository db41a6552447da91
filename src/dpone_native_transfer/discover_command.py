"""``dpone-transfer discover``: print a source database's catalog (``discover.read_catalog``)
or write a pipeline file of its tables, checked as ``run`` will check it.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import tomllib
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from .drivers import (
    POSTGRES_SCHEMES,
    resolve_env,
)
from .errors import ConfigInvalid
from .identity import fold_ascii
from .reporting import EXIT_OK, plural
from .wording import one_line

__all__ = ["add_discover_command", "pipeline_text"]

from .config import read_toml_file
from .discover import TableInfo, read_catalog
from .pipeline import is_pattern, pipeline_from_mapping

_HEADERS = ("TABLE", "ROWS", "PRIMARY_KEY", "CURSOR_CANDIDATES", "PARTITION_CANDIDATES")


def add_discover_command(commands: Any, common: argparse.ArgumentParser) -> None:
    discover = commands.add_parser(
        "discover",
        parents=[common],
        help="a source's tables, keys and candidate columns; --write: a pipeline file of them",
        description="List the tables of a source database with their row estimates, primary "
        "keys, and candidate cursor and partition columns; with --write, a pipeline file that "
        "moves them all, to edit and run (docs/pipelines.md). Reads only.",
    )
    discover.add_argument(
        "source",
        metavar="SOURCE",
        help="a SQLite file, a postgresql:// URL, or env:NAME naming a variable holding either",
    )
    discover.add_argument("--json", action="store_true", help="one JSON array of tables")
    discover.add_argument("--write", metavar="FILE", help="write a pipeline file of every table")
    discover.add_argument(
        "--target",
        metavar="TARGET",
        help="the written pipeline's target: a file (.duckdb: DuckDB, else SQLite), a "
        "postgresql:// URL or env:NAME (default: warehouse.db beside the pipeline file)",
    )
    discover.add_argument(
        "--target-kind",
        choices=("sqlite", "duckdb", "clickhouse", "postgres"),
        help="the target's kind, when its name does not say it",
    )
    discover.add_argument(
        "--store",
        metavar="STORE",
        help="the written pipeline's checkpoint store (default: checkpoints.db beside it)",
    )
    discover.add_argument("--force", action="store_true", help="replace an existing --write file")
    discover.set_defaults(handler=_discover_command)


def _kind_of(location: str, *, argument: str) -> str:
    value = resolve_env(location, argument=argument)
    return "postgres" if value.startswith(POSTGRES_SCHEMES) else "sqlite"


def _discover_command(args: argparse.Namespace) -> int:
    kind = _kind_of(args.source, argument="SOURCE")
    catalog = read_catalog(kind, args.source)
    if args.write is not None:
        _write(args, kind, catalog)
    if args.json:
        print(json.dumps([table.as_dict() for table in catalog], sort_keys=True))
        return EXIT_OK
    rows = [
        (
            one_line(table.name),
            "?" if table.rows is None else f"{table.rows:,}",
            ", ".join(table.primary_key) or "-",
            ", ".join(table.cursor_candidates) or "-",
            ", ".join(table.partition_candidates) or "-",
        )
        for table in catalog
    ]
    widths = [max(len(cell) for cell in column) for column in zip(_HEADERS, *rows, strict=True)]
    for row in (_HEADERS, *rows):
        print("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())
    print(
        f"{plural(len(catalog), 'table')}"
        + (
            f"; wrote the pipeline file {args.write}"
            if args.write
            else "; --write FILE writes a pipeline file of them"
        )
    )
    return EXIT_OK


def _write(args: argparse.Namespace, kind: str, catalog: list[TableInfo]) -> None:
    """The pipeline file, checked as ``run`` will check it before it is written."""
    file = Path(args.write)
    if not file.absolute().parent.is_dir():  # else its relative source path named nothing
        raise ConfigInvalid(
            "--write names a file in a folder that does not exist",
            diagnostics={"argument": "--write"},
        )
    if file.exists() and not args.force:
        raise ConfigInvalid(
            "--write names a file that exists; pass --force to replace it",
            diagnostics={"argument": "--write"},
        )
    if file.exists() and not _is_toml(file):
        raise ConfigInvalid(
            "--write names a file that is not a pipeline file (TOML): it may be a database "
            "(the source itself); --force replaces only a pipeline file",
            diagnostics={"argument": "--write"},
        )
    if not catalog:
        raise ConfigInvalid(
            "the source has no table to write a pipeline of", diagnostics={"argument": "SOURCE"}
        )
    folder = Path(os.path.abspath(file)).parent
    text = pipeline_text(
        catalog,
        source=_location_keys(args.source, kind, folder, argument="SOURCE"),
        target=_target_keys(args, folder),
        store="checkpoints.db" if args.store is None else _relative(args.store, folder),
    )
    pipeline_from_mapping(tomllib.loads(text), base_dir=folder, file=args.write)
    try:
        file.write_text(text)
    except OSError:
        raise ConfigInvalid(
            "--write names a file that cannot be written", diagnostics={"argument": "--write"}
        ) from None


def _is_toml(file: Path) -> bool:
    """Whether ``file`` is a TOML file (a pipeline file ``--force`` may replace), not a
    database or anything else: ``discover db --write db --force`` replaced the source."""
    try:
        read_toml_file(file)
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError, RecursionError):
        return False
    return True


def _location_keys(value: str, kind: str, folder: Path, *, argument: str) -> dict[str, str]:
    if kind in ("sqlite", "duckdb", "clickhouse") and not value.startswith("env:"):
        return {"kind": kind, "path": _relative(value, folder)}
    if value.startswith(POSTGRES_SCHEMES) and urlsplit(value).password:
        raise ConfigInvalid(
            f"{argument} holds a password, which --write would put into the file: give it as "
            "env:NAME, a variable holding the URL",
            diagnostics={"argument": argument},
        )
    key = "dsn" if kind == "postgres" else ("url" if kind == "clickhouse" else "path")
    return {"kind": kind, key: value}


def _target_keys(args: argparse.Namespace, folder: Path) -> dict[str, str]:
    if args.target is None:  # beside the pipeline file
        kind = args.target_kind or "sqlite"
        return {"kind": kind, "path": "warehouse.duckdb" if kind == "duckdb" else "warehouse.db"}
    value = args.target
    kind = args.target_kind
    if kind is None:
        if value.startswith(("env:", *POSTGRES_SCHEMES)):
            kind = _kind_of(value, argument="--target")
        else:
            kind = "duckdb" if value.endswith(".duckdb") else "sqlite"
    return _location_keys(value, kind, folder, argument="--target")


def _relative(path: str, folder: Path) -> str:
    """A file as the pipeline file names it: relative to its folder (where it is read from)."""
    if path.startswith(("env:", *POSTGRES_SCHEMES)):
        return path
    return os.path.relpath(os.path.abspath(path), folder)


def pipeline_text(
    catalog: list[TableInfo], *, source: dict[str, str], target: dict[str, str], store: str
) -> str:
    """A pipeline file moving every table of ``catalog``: by key ranges of its integer key
    and, where one is found, with a cursor column; a table with neither is refreshed whole.
    A table a pipeline cannot name (an empty name) is left out, said in a comment."""
    unnamed = [table for table in catalog if not table.name.strip("! ")]
    catalog = [table for table in catalog if table not in unnamed]
    listed = [table for table in catalog if not is_pattern(table.name)]
    renamed = _target_tables(catalog, chdb=target.get("kind") == "clickhouse" and "path" in target)
    lines = [
        "# Written by `dpone-transfer discover` from the source's catalog: edit it, then run",
        "# `dpone-transfer run` on it. docs/pipelines.md describes every key.",
        "",
        "[pipeline]",
        # a name that reads as a pattern is selected by its [tables.NAME] section alone
        f"tables = {_toml(', '.join(_toml(t.name) for t in listed), raw=True)}",
        "",
        "[source]",
        *(f"{key} = {_toml(value)}" for key, value in source.items()),
        "",
        "[target]",
        *(f"{key} = {_toml(value)}" for key, value in target.items()),
        "",
        "[store]",
        f"path = {_toml(store)}",
        "",
        "[defaults]",
        'strategy = "incremental_append"',
        'path = "auto"  # per table, the fastest path for the source and target',
    ]
    for table in unnamed:
        lines += ["", f"# left out: table {table.name!r}, a name a pipeline cannot select"]
    for table in catalog:
        rows = "unknown rows" if table.rows is None else plural(table.rows, "row")
        lines += [
            "",
            f"# {rows}; primary key: {', '.join(table.primary_key) or 'none'}; cursor "
            f"candidates: {', '.join(table.cursor_candidates) or 'none'}; partition candidates: "
            f"{', '.join(table.partition_candidates) or 'none'}",
            f"[tables.{_key(table.name)}]",
            *_table_settings(table),
        ]
        if table.name in renamed:
            name, why = renamed[table.name]
            lines.append(f"target_table = {_toml(name)}  # {why}")
    return "\n".join(lines) + "\n"


def _target_tables(catalog: list[TableInfo], *, chdb: bool) -> dict[str, tuple[str, str]]:
    """The ``target_table`` (and why) written for a table whose default one (``sales.orders``:
    ``sales_orders``) another table's meets in any ASCII case (``dot.ted`` and ``dot_ted``:
    the one named so keeps it), or chDB reads as a file path pattern: a free name, so that
    ``run`` takes the file as written."""
    taken = {fold_ascii(table.name.replace(".", "_")) for table in catalog}
    seen: set[str] = set()
    renamed: dict[str, tuple[str, str]] = {}
    for table in sorted(catalog, key=lambda table: "." in table.name):
        default = table.name.replace(".", "_")
        name = re.sub(r"[*?{]", "_", default) if chdb else default
        why = "chDB reads *, ? and { in a table name as a file path pattern"
        if fold_ascii(name) in seen or (name != default and fold_ascii(name) in taken):
            why = f"{default!r} is another table's target table"
            name = next(
                f"{name}_{n}"
                for n in range(2, len(catalog) + 3)
                if fold_ascii(f"{name}_{n}") not in taken | seen
            )
        seen.add(fold_ascii(name))
        if name != default:
            renamed[table.name] = (name, why)
    return renamed


def _table_settings(table: TableInfo) -> list[str]:
    key = table.range_key
    cursors = [c for c in table.cursor_candidates if c != key]
    column = key or (table.partition_candidates or table.columns)[0]
    settings = [f"partition_column = {_toml(column)}", 'partition_by = "range"']
    if cursors:
        settings.append(f"cursor_column = {_toml(cursors[0])}")
    elif key is None:
        settings.append('strategy = "full_refresh"  # no integer key or cursor column found')
    return settings


def _key(name: str) -> str:
    return name if re.fullmatch(r"[A-Za-z0-9_-]+", name) else _toml(name)


def _toml(value: str, *, raw: bool = False) -> str:
    return f"[{value}]" if raw else json.dumps(value)
