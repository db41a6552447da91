"""Route identity: which database and which table a connector reads or writes.

A connector reports its table's identity with ``identity()``: the engine
kind plus a normalized location (a resolved absolute path for files; host,
port and database for servers; never a user or a password), and the table
name canonicalized the way the engine resolves it. Two spellings of one table
are one identity, and equal table names in different databases are not.
The runtime keys checkpoints, source state, evidence, audit records, the
target's ledger and the lease by it.

A location is kept as ``kind:`` plus a digest of the normalized location, not
the location itself: paths and host names may be secret, and they never
reach a store, a target's ledger, an error or an operator's screen. So an
operator names a route's databases by its route file, and recognises them by
the digest that ``guard show`` prints.
"""

from __future__ import annotations

import hashlib
import os
from typing import Any
from urllib.parse import urlsplit

import attrs

from .checkpoints import RouteKey, Strategy

__all__ = ["TableIdentity", "file_location", "fold_ascii", "route_key", "server_location"]


@attrs.frozen
class TableIdentity:
    """``location`` names the database (``kind:...``); ``table`` is its canonical table name."""

    location: str
    table: str


def _located(kind: str, normalized: str) -> str:
    digest = hashlib.sha256(f"{kind}\0{normalized}".encode()).hexdigest()
    return f"{kind}:{digest[:24]}"


def file_location(kind: str, path: str | os.PathLike[str]) -> str:
    """``kind:`` and the digest of the resolved absolute path (symlinks followed; may not exist)."""
    return _located(kind, os.path.realpath(os.fspath(path)))


def server_location(kind: str, url: str, *, default_port: int, default_database: str | None) -> str:
    """``kind:`` and the digest of ``host:port/database`` from a URL (no user, password, options).

    The host is lowercased and the port and database filled in (a missing
    database with ``default_database=None`` is the user's own, as libpq has
    it), so the usual spellings of one server's database are one location.
    """
    parts = urlsplit(url)
    host = (parts.hostname or "localhost").lower()
    port = parts.port or default_port
    database = parts.path.lstrip("/") or default_database or parts.username or "postgres"
    return _located(kind, f"{host}:{port}/{database}")


def fold_ascii(name: str) -> str:
    """A name as case-insensitive engines compare it: ASCII letters folded, nothing else.

    SQLite and DuckDB match identifiers case-insensitively for ASCII only.
    """
    return name.translate(_ASCII_LOWER)


_ASCII_LOWER = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")


def route_key(source: Any, sink: Any, strategy: Strategy | str) -> RouteKey:
    """The route of a source and a sink: located when both report ``identity()``.

    A connector without ``identity()`` (one written before identities) gives an
    unlocated key of the table names as configured, keyed as older releases did.
    """
    source_identity = getattr(source, "identity", None)
    sink_identity = getattr(sink, "identity", None)
    if source_identity is None or sink_identity is None:
        return RouteKey(source.table, sink.table, strategy)
    read, written = source_identity(), sink_identity()
    return RouteKey(read.table, written.table, strategy, read.location, written.location)
