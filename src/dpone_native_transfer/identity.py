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

import functools
import hashlib
import ipaddress
import os
import socket
import threading
from urllib.parse import parse_qsl, unquote, urlsplit

import attrs

from .errors import ConfigInvalid

__all__ = ["TableIdentity", "file_location", "fold_ascii", "server_location"]


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
    usual spellings of one server's database are one location. This machine's
    server is ``localhost`` however it is reached (``_this_machine``).
    """
    try:
        parts = urlsplit(url)
    except ValueError:  # the parser's message may quote the URL, password included
        raise ConfigInvalid(
            f"the {kind} server URL cannot be parsed", diagnostics={"engine": kind}
        ) from None
    query = {name: value for name, value in parse_qsl(parts.query)}
    authority = parts.netloc.rpartition("@")[2]
    hosts = [_host_port(item) for item in authority.split(",")] if authority else [("", "")]
    if "host" in query or "hostaddr" in query:
        names = (query.get("host") or query["hostaddr"]).split(",")
        ports = query.get("port", "").split(",")
        hosts = [(name, ports[min(i, len(ports) - 1)]) for i, name in enumerate(names)]
    elif "port" in query:
        hosts = [(host, query["port"]) for host, _ in hosts]
    addresses = query.get("hostaddr", "").split(",")  # libpq connects to these, when given
    servers = ",".join(
        f"{_server(host, addresses[i] if i < len(addresses) else '')}:{port or default_port}"
        for i, (host, port) in enumerate(hosts)
    )
    user = unquote(parts.netloc.rpartition("@")[0].partition(":")[0]) or query.get("user")
    database = (
        query.get("dbname") or unquote(parts.path.lstrip("/")) or default_database or user
        or "postgres"
    )  # fmt: skip
    return _located(kind, f"{servers}/{database}")


def _server(host: str, address: str) -> str:
    """How a location names one host: ``localhost`` for this machine, else the name lowercased."""
    return "localhost" if _this_machine(address or host) else host.lower()


def _this_machine(host: str) -> bool:
    """Whether ``host`` reaches this machine's server: no host (libpq's default socket), a
    unix-socket directory (a path, libpq's rule), a loopback address, or a name that
    resolves to loopback addresses only (``localhost``, this machine's name)."""
    if not host or host.startswith("/"):
        return True
    try:
        return _loopback(host.partition("%")[0])  # an address (its IPv6 zone dropped)
    except ValueError:
        return _resolves_to_loopback(host.lower())


def _loopback(address: str) -> bool:
    """Whether an IP address is a loopback one (127.0.0.0/8, ::1, or ::ffff:127.x mapped)."""
    parsed = ipaddress.ip_address(address)
    if isinstance(parsed, ipaddress.IPv6Address) and parsed.ipv4_mapped is not None:
        parsed = parsed.ipv4_mapped
    return parsed.is_loopback


LOOKUP_SECONDS = 0.5  # how long a name's lookup may take; slower names are other servers


@functools.lru_cache(maxsize=256)
def _resolves_to_loopback(name: str) -> bool:
    """Whether ``name`` resolves to loopback addresses only: looked up once per process, in a
    thread given ``LOOKUP_SECONDS`` (a name the hosts file holds answers at once, with no
    network); a name that fails or is late is taken as another machine's, as it was before."""
    found: list[str] = []

    def lookup() -> None:
        try:
            found.extend(str(info[4][0]) for info in socket.getaddrinfo(name, None))
        except (OSError, UnicodeError, ValueError):
            pass

    thread = threading.Thread(target=lookup, name="dpone-host-lookup", daemon=True)
    thread.start()
    thread.join(LOOKUP_SECONDS)
    if thread.is_alive() or not found:
        return False
    try:
        return all(_loopback(address.partition("%")[0]) for address in found)
    except ValueError:
        return False


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


def upper_ascii(text: str) -> str:
    """``text`` with its ASCII letters upper-cased, nothing else: how SQLite reads a declared
    type and compares names. ``str.upper`` made ``ınt`` (a dotless i) ``INT`` and ``ﬂoat``
    ``FLOAT``, types SQLite gives TEXT and NUMERIC affinity: a column then read as another
    kind than it stores lost rows, exit 0."""
    return text.translate(_ASCII_UPPER)


_ASCII_LOWER = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")
_ASCII_UPPER = str.maketrans("abcdefghijklmnopqrstuvwxyz", "ABCDEFGHIJKLMNOPQRSTUVWXYZ")
