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
from typing import TYPE_CHECKING
from urllib.parse import parse_qsl, unquote, urlsplit

import attrs

from .checkpoints import RouteKey, Strategy
from .connectors.contract import Identified
from .errors import ConfigInvalid

if TYPE_CHECKING:
    from .connectors.contract import Sink, Source

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
    """``kind:`` and the digest of ``hosts/database`` from a URL (no user, password, options).

    Hosts and ports come from the URL's authority or its ``host``/``port``
    query parameters, as libpq reads them (several hosts allowed); hosts are
    lowercased and missing ports and database filled in (a missing database
    with ``default_database=None`` is the user's own, as libpq has it), so the
    usual spellings of one server's database are one location.
    """
    try:
        parts = urlsplit(url)
    except ValueError:  # the parser's message may quote the URL, password included
        raise ConfigInvalid(
            f"the {kind} server URL cannot be parsed", diagnostics={"engine": kind}
        ) from None
    query = {name: value for name, value in parse_qsl(parts.query)}
    authority = parts.netloc.rpartition("@")[2]
    hosts = [_host_port(item) for item in authority.split(",")] if authority else []
    if "host" in query or "hostaddr" in query:
        names = (query.get("host") or query["hostaddr"]).split(",")
        ports = query.get("port", "").split(",")
        hosts = [(name, ports[min(i, len(ports) - 1)]) for i, name in enumerate(names)]
    elif "port" in query:
        hosts = [(host, query["port"]) for host, _ in hosts or [("", "")]]
    servers = (
        ",".join(f"{(host or 'localhost').lower()}:{port or default_port}" for host, port in hosts)
        or f"localhost:{default_port}"
    )
    user = unquote(parts.netloc.rpartition("@")[0].partition(":")[0]) or query.get("user")
    database = (
        query.get("dbname") or unquote(parts.path.lstrip("/")) or default_database or user
        or "postgres"
    )  # fmt: skip
    return _located(kind, f"{servers}/{database}")


def _host_port(item: str) -> tuple[str, str]:
    """``host`` and ``port`` of one authority entry (``[v6]:port`` kept whole)."""
    if item.startswith("["):
        host, _, rest = item[1:].partition("]")
        return unquote(host), rest.removeprefix(":")
    host, _, port = item.partition(":")
    return unquote(host), port


def fold_ascii(name: str) -> str:
    """A name as case-insensitive engines compare it: ASCII letters folded, nothing else.

    SQLite and DuckDB match identifiers case-insensitively for ASCII only.
    """
    return name.translate(_ASCII_LOWER)


_ASCII_LOWER = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")


def route_key(source: Source, sink: Sink, strategy: Strategy | str) -> RouteKey:
    """The route of a source and a sink: located when both report ``identity()``.

    A connector without ``identity()`` (one written before identities) gives an
    unlocated key of the table names as configured, keyed as older releases did.
    """
    if not (isinstance(source, Identified) and isinstance(sink, Identified)):
        return RouteKey(source.table, sink.table, strategy)
    read, written = source.identity(), sink.identity()
    return RouteKey(read.table, written.table, strategy, read.location, written.location)
