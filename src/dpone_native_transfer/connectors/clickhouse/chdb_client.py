"""chDB adapter: the embedded ClickHouse engine, with its data at a filesystem path.

chDB serves one data path per process at a time: opening a second path while
a session is open fails. The sink therefore opens a session per call and
closes it before returning, so routes with different data paths can run one
after the other in one process. While connections are held (a run, a pipeline:
``drivers.holding_connections``) the session of a path is kept for the next
client: chDB leaves five threads and some fifteen open files behind each session
it closes, so a pipeline of 110 tables, a session each, ran out of a default
1,024 open files.
"""

from __future__ import annotations

import contextlib
import datetime
import decimal
import fcntl
import importlib.metadata
import json
import os
import re
import tempfile
import threading
import zoneinfo
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs

from ...drivers import connections_held
from ...errors import (
    ConfigInvalid,
    InternalInvariantBroken,
    TargetUnavailable,
    TargetVersionUnsupported,
)
from ...payloads import Column, LoadFile
from .client import SETTINGS, import_engine
from .sql import (
    column_list,
    encode_json_rows,
    file_pattern,
    insert_settings,
    write_arrow_stream,
)

__all__ = ["ChdbClient"]

# Read-back formatting: numbers as JSON numbers, decimals and NaN/inf as exact text.
_OUTPUT_SETTINGS = {
    "output_format_json_quote_64bit_integers": 0,
    "output_format_json_quote_decimals": 1,
    "output_format_json_quote_denormals": 1,
}


_READ_FORMAT = "JSONCompactEachRowWithNamesAndTypes"


def _held_by_another(path: str) -> bool:
    """Whether another chDB (ClickHouse) instance holds the data path's ``status`` lock: a
    retry can succeed once it ends, so it is not a configuration error."""
    try:
        handle = os.open(os.path.join(path, "status"), os.O_RDONLY)
    except OSError:
        return False  # no data path yet, or no status file: nobody holds it
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    except OSError:
        return False
    finally:
        os.close(handle)  # releases the probe's lock, if it got one
    return False


def _in_use() -> TargetUnavailable:
    return TargetUnavailable(
        "the chDB data path is in use by another process now; nothing was written",
        diagnostics={"key": "location"},
    )


# In the data folder: the newest chdb-core that opened it. The folder records no version of its
# own, and a chDB older than the one that wrote a part moves the part to
# detached/broken-on-start_* when it opens the folder, without an error: the tables look empty
# (ClickHouse 25.8 opening 26.9's parts). docs/connectors.md, 'Engine versions'.
_VERSION_FILE = "dpone-chdb-version"
_ENGINE = "chdb-core"


def _release(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", version)[:3])


def _installed() -> str | None:
    try:
        return importlib.metadata.version(_ENGINE)
    except importlib.metadata.PackageNotFoundError:  # a chDB older than 4.1 bundles its engine
        return None


def _folder_version(path: str) -> str | None:
    """The chdb-core version the data folder records; ``TargetVersionUnsupported`` when it is
    newer than the installed one, before chDB opens (and so rearranges) the folder."""
    try:
        with open(os.path.join(path, _VERSION_FILE), encoding="ascii") as file:
            recorded = file.read().strip()
    except (OSError, ValueError):
        return None
    installed = _installed()
    if not re.fullmatch(r"\d+\.\d+\.\d+", recorded):
        return None
    if installed is not None and _release(recorded) > _release(installed):
        raise TargetVersionUnsupported(
            f"the chDB data folder was last opened by {_ENGINE} {recorded}, newer than the "
            f"installed {_ENGINE} {installed}, which would set aside the parts it cannot read "
            f"and show their tables empty: pip install '{_ENGINE}>={recorded}'; nothing was "
            "written",
            diagnostics={"key": "location", "written_by": recorded, "engine": installed},
        )
    return recorded


def _record_version(path: str, recorded: str | None) -> None:
    """After chDB opened the folder: record the installed chdb-core when it is newer."""
    installed = _installed()
    if installed is None or (recorded is not None and _release(recorded) >= _release(installed)):
        return
    with contextlib.suppress(OSError):  # chDB's own writes then fail the same way
        with tempfile.NamedTemporaryFile("w", dir=path, delete=False, encoding="ascii") as file:
            file.write(installed + "\n")
        os.replace(file.name, os.path.join(path, _VERSION_FILE))


@attrs.define(eq=False)
class _Session:
    """An open chDB session, its clients' uses one at a time (``lock``), and how many
    clients hold it."""

    session: Any
    lock: threading.RLock = attrs.field(factory=threading.RLock)
    users: int = 0


_kept: dict[str, _Session] = {}  # by data path, while connections are held
_kept_lock = threading.Lock()


def _release_kept() -> None:
    """When the last ``holding_connections`` block closes: close the kept sessions no client
    holds (one still held is closed by its client)."""
    with _kept_lock:
        idle = [key for key, kept in _kept.items() if not kept.users]
        closing = [_kept.pop(key) for key in idle]
    for kept in closing:
        with contextlib.suppress(Exception):
            kept.session.close()


def _shared(path: str) -> _Session:
    """The kept session of ``path`` while connections are held, else a new one; a kept
    session of another path no client holds is closed first (chDB serves one path)."""
    key = os.path.abspath(path)
    with _kept_lock:
        held = connections_held(_release_kept)
        kept = _kept.get(key) if held else None
        if kept is None:
            others = [k for k, other in _kept.items() if k != key and not other.users]
            for other in [_kept.pop(k) for k in others]:
                with contextlib.suppress(Exception):
                    other.session.close()
            kept = _Session(_open(path))
            if held:
                _kept[key] = kept
        kept.users += 1
        return kept


def _open(path: str) -> Any:
    """A new chDB session on ``path``, set as dpone reads and writes; errors while opening
    hide the path and chDB's text."""
    session = import_engine("chdb.session")
    if not os.path.isdir(os.path.dirname(path)):
        raise ConfigInvalid(
            "folder of the chDB data path does not exist", diagnostics={"key": "location"}
        )
    if _held_by_another(path):
        raise _in_use()
    recorded = _folder_version(path)
    try:
        opened = session.Session(path)
    except Exception:
        if _held_by_another(path):  # taken since the probe: two runs started at once
            raise _in_use() from None
        raise ConfigInvalid(
            "chDB could not open the data path; chDB serves one data path per process "
            "at a time, so close other chDB sessions first",
            diagnostics={"key": "location"},
        ) from None
    try:
        for name, value in {**SETTINGS, **_OUTPUT_SETTINGS}.items():
            opened.query(f"SET {name} = {_setting(value)}")
        _record_version(path, recorded)
    except BaseException:
        opened.close()
        raise
    return opened


class ChdbClient:
    """A chDB session on one data path (``_shared``), used one call at a time."""

    def __init__(self, path: str) -> None:
        self._shared: _Session | None = _shared(path)

    @contextlib.contextmanager
    def _session(self) -> Iterator[Any]:
        shared = self._shared
        if shared is None:
            raise InternalInvariantBroken("a chDB client used after close()")
        with shared.lock:
            yield shared.session

    def command(self, sql: str, params: Mapping[str, Any] | None = None) -> None:
        with self._session() as session:
            session.query(sql, "CSV", params=_texts(params))

    def query_rows(self, sql: str, params: Mapping[str, Any] | None = None) -> list[tuple]:
        """Rows via JSONCompactEachRowWithNamesAndTypes: unlike JSONCompact, it keeps bytes."""
        with self._session() as session:
            raw = session.query(sql, _READ_FORMAT, params=_texts(params)).bytes()
        lines = raw.decode("utf-8", "surrogateescape").split("\n")  # not splitlines: U+2028
        while lines and not lines[-1]:
            lines.pop()
        if len(lines) < 2:
            return []
        converters = [_converter(type_name) for type_name in json.loads(lines[1])]
        return [
            tuple(
                value if value is None or convert is None else convert(value)
                for convert, value in zip(converters, json.loads(line), strict=True)
            )
            for line in lines[2:]
        ]

    def insert_rows(
        self,
        table: str,
        columns: Sequence[Column],
        chunks: Iterable[Sequence[tuple]],
        *,
        token: str | None = None,
    ) -> int:
        """The rows go to a private Arrow stream file that one INSERT then reads natively
        (``file(..., 'ArrowStream')``): a tenth of the time of JSON. Rows Arrow cannot hold
        as the columns' types are all sent as JSON instead, in the same one INSERT."""
        insert = f"INSERT INTO {table} ({column_list([c.name for c in columns])})"
        with tempfile.TemporaryDirectory(prefix="dpone-chdb-") as folder:
            if file_pattern(folder):  # TMPDIR names a pattern: file() would read other files
                return self._insert_json(f"{insert}{insert_settings(token)}", chunks)
            path = Path(folder, "rows.arrows")
            written = write_arrow_stream(path, columns, chunks, table=table)
            if not isinstance(written, LoadFile):  # every row, for JSON
                return self._insert_json(f"{insert}{insert_settings(token)}", written)
            if written.rows:
                self.insert_file(table, columns, path, token=token)
        return written.rows

    def insert_file(
        self, table: str, columns: Sequence[Column], path: Path, *, token: str | None = None
    ) -> None:
        """One ``INSERT ... SELECT FROM file(..., 'ArrowStream')``: the engine reads the file,
        with ``pread``: by default it maps the whole file into memory, and the peak then grows
        with the file (figures: docs/performance.md, fix 31).
        The columns are read by name: a file chDB pulled may hold one more, its tag."""
        if file_pattern(path):  # write_load_file and the pulls never make one
            raise InternalInvariantBroken("a load file's path reads as a pattern in file()")
        names = column_list([column.name for column in columns])
        self.command(
            f"INSERT INTO {table} ({names}){insert_settings(token)}"
            f" SELECT {names} FROM file({{rows_file:String}}, 'ArrowStream')"
            " SETTINGS max_threads = 1,"  # the file's batches become blocks in order
            " storage_file_read_method = 'pread'",
            {"rows_file": str(path)},
        )

    def _insert_json(self, insert: str, chunks: Iterable[Sequence[tuple]]) -> int:
        with self._session() as session:
            inserter = session.send_insert(insert, "JSONCompactEachRow")
            rows = 0
            try:
                for chunk in chunks:
                    if data := encode_json_rows(chunk):
                        inserter.append(data)
                    rows += len(chunk)
                inserter.finish()
            except BaseException:
                with contextlib.suppress(Exception):
                    inserter.cancel()  # nothing is committed at finish(); see docs on blocks
                raise
            return rows

    def close(self) -> None:
        """Give the session back: closed, unless kept while connections are held."""
        shared, self._shared = self._shared, None
        if shared is None:
            return
        with _kept_lock:
            shared.users -= 1
            if shared.users:
                return
            key = next((key for key, kept in _kept.items() if kept is shared), None)
            if key is not None and connections_held(_release_kept):
                return  # kept for the next client
            if key is not None:  # released while this client still held it
                del _kept[key]
        shared.session.close()


def _setting(value: Any) -> str:
    return str(value) if isinstance(value, int) else "'" + str(value) + "'"


def _texts(params: Mapping[str, Any] | None) -> dict[str, str]:
    """Parameters as the escaped text chDB parses them from (checked on chDB 4.4)."""
    return {name: _text(value) for name, value in (params or {}).items()}


def _text(value: Any) -> str:
    if isinstance(value, str):
        return value.replace("\\", "\\\\").replace("\t", "\\t").replace("\n", "\\n")
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    raise ConfigInvalid("a query parameter has an unsupported type")


def _converter(type_name: str) -> Callable[[Any], Any] | None:
    """How a JSONCompact value of ``type_name`` becomes the Python value a driver would give."""
    base = type_name
    while base.startswith(("Nullable(", "LowCardinality(")):
        base = base[base.index("(") + 1 : -1]
    if base.startswith("Decimal"):
        return decimal.Decimal
    if base.startswith(("Float", "Int", "UInt")):
        return float if base.startswith("Float") else int
    if base in ("Date", "Date32"):
        return datetime.date.fromisoformat
    if base.startswith("DateTime"):
        zone = base.split("'")[1] if "'" in base else None
        tz = zoneinfo.ZoneInfo(zone) if zone else None
        return lambda text: datetime.datetime.fromisoformat(text).replace(tzinfo=tz)
    return None
