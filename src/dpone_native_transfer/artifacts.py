"""Row spool files: chunks of row tuples written and read back without holding a table in memory.

The legacy path spools its extraction to one temporary file; the
file-artifact path keeps one file per partition and records its digest.
``marshal`` keeps SQLite's value types (int, float, str, bytes, None) exact
and is fast; the files are process-local working data, not an exchange format.
"""

from __future__ import annotations

import hashlib
import marshal
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import BinaryIO

__all__ = ["file_sha256", "read_chunks", "write_chunks"]

_READ_BLOCK = 1 << 20


def write_chunks(handle: BinaryIO, chunks: Iterable[Sequence[tuple]]) -> tuple[int, str]:
    """Append ``chunks`` to ``handle``; return (rows written, ``sha256:`` of the bytes written)."""
    digest = hashlib.sha256()
    rows = 0
    for chunk in chunks:
        block = marshal.dumps(list(chunk))
        handle.write(block)
        digest.update(block)
        rows += len(chunk)
    return rows, "sha256:" + digest.hexdigest()


def read_chunks(path: Path) -> Iterator[list[tuple]]:
    """Yield the chunks of a spool file in the order they were written."""
    with open(path, "rb") as handle:
        while True:
            try:
                yield marshal.load(handle)
            except EOFError:
                return


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(_READ_BLOCK):
            digest.update(block)
    return "sha256:" + digest.hexdigest()
