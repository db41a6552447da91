"""Row spool files: chunks of row tuples written and read back without holding a table in memory.

The legacy path spools its extraction to one temporary file; the
file-artifact path keeps one file per partition and records its digest.
``marshal`` keeps SQLite's value types (int, float, str, bytes, None) exact
and is fast; the files are process-local working data, not an exchange format.

File format: a sequence of blocks, each an 8-byte big-endian length followed
by that many bytes of ``marshal.dumps(list_of_rows)``. The length prefix lets
the reader take a whole block with one ``read`` and decode it with
``marshal.loads`` (``marshal.load`` on a file object reads in many small calls,
which is much slower). The digest returned by :func:`write_chunks`
covers every byte written, length prefixes included, so it equals
:func:`file_sha256` of a file holding only those blocks.
"""

from __future__ import annotations

import hashlib
import marshal
import os
import resource
import struct
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, BinaryIO

from .errors import ArtifactInvalid

__all__ = [
    "DigestReader",
    "DigestWriter",
    "check_digest",
    "create_private",
    "file_sha256",
    "open_files_allowed",
    "read_chunks",
    "write_chunks",
]

_READ_BLOCK = 1 << 20
_LENGTH = struct.Struct(">Q")
_MOST_OPEN_FILES = 10_000  # with no limit on open files: a bound all the same


def write_chunks(
    handle: BinaryIO, chunks: Iterable[Sequence[tuple]], digest: Any = None
) -> tuple[int, str]:
    """Append ``chunks`` to ``handle`` as length-prefixed blocks.

    Return (rows written, ``sha256:`` of the bytes written, prefixes included).
    ``digest`` (a ``hashlib.sha256()``) carries on a digest of earlier writes to
    the same file, so the returned one covers the whole file.
    """
    digest = hashlib.sha256() if digest is None else digest
    rows = 0
    for chunk in chunks:
        block = marshal.dumps(list(chunk))
        prefix = _LENGTH.pack(len(block))
        handle.write(prefix)
        handle.write(block)
        digest.update(prefix)
        digest.update(block)
        rows += len(chunk)
    return rows, "sha256:" + digest.hexdigest()


def read_chunks(path: Path, sha256: str | None = None) -> Iterator[list[tuple]]:
    """Yield the chunks of a spool file in the order they were written.

    A file that ends inside a block (a short length prefix or a short block)
    or holds a block that does not decode raises ``ArtifactInvalid``; partial
    data is never returned silently. Its diagnostics name only the file name,
    the byte offset of the block and the sizes involved. With ``sha256``, the
    bytes read are hashed as they are read and a file that differs raises
    ``ArtifactInvalid`` at its end: the digest covers exactly what a reader took,
    so a file replaced after an earlier check cannot be loaded unnoticed.
    """
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        offset = 0
        while prefix := handle.read(_LENGTH.size):
            digest.update(prefix)
            if len(prefix) != _LENGTH.size:
                raise _truncated(path, offset, _LENGTH.size, len(prefix), "length prefix")
            (size,) = _LENGTH.unpack(prefix)
            block = handle.read(size)
            digest.update(block)
            if len(block) != size:
                raise _truncated(path, offset, size, len(block), "block")
            try:
                chunk = marshal.loads(block)
            except (EOFError, ValueError, TypeError):
                raise ArtifactInvalid(
                    "a spool or artifact file holds a block that cannot be decoded",
                    diagnostics={"file": path.name, "offset": offset, "block_bytes": size},
                ) from None
            offset += _LENGTH.size + size
            yield chunk
    if sha256 is not None and "sha256:" + digest.hexdigest() != sha256:
        raise _changed(path)


class DigestReader:
    """A file read by a reader of another format (pyarrow), hashing every byte it takes:
    ``verify()`` after the last read hashes what is left and raises ``ArtifactInvalid`` when
    the file differs from ``sha256``, so the digest covers exactly what was loaded;
    ``digest()`` gives the digest of what was read, for a file no digest was known of."""

    def __init__(self, path: Path, sha256: str | None = None) -> None:
        self._handle = open(path, "rb")  # noqa: SIM115 - closed by close() / the with block
        self._path, self._sha256, self._digest = path, sha256, hashlib.sha256()

    def read(self, size: int = -1) -> bytes:
        data = self._handle.read(size)
        self._digest.update(data)
        return data

    def digest(self) -> str:
        """``sha256:`` of the whole file: what the reader took and what it left."""
        while self.read(_READ_BLOCK):  # what the reader left, trailing bytes included
            pass
        return "sha256:" + self._digest.hexdigest()

    def verify(self) -> None:
        if self.digest() != self._sha256:
            raise _changed(self._path)

    @property
    def closed(self) -> bool:
        return self._handle.closed

    def close(self) -> None:
        self._handle.close()

    def __enter__(self) -> DigestReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class DigestWriter:
    """A file written by a writer of another format (pyarrow), hashing every byte it writes,
    so the digest needs no second read of the file."""

    def __init__(self, handle: BinaryIO) -> None:
        self._handle, self._digest = handle, hashlib.sha256()

    def write(self, data: bytes) -> int:
        self._digest.update(data)
        return self._handle.write(data)

    def flush(self) -> None:
        self._handle.flush()

    @property
    def closed(self) -> bool:
        return self._handle.closed

    @property
    def sha256(self) -> str:
        return "sha256:" + self._digest.hexdigest()


def create_private(path: Path) -> BinaryIO:
    """Open a new file for writing: never an existing one, never through a symlink."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
    return os.fdopen(os.open(path, flags, 0o600), "wb")


def check_digest(path: Path, sha256: str) -> None:
    """``ArtifactInvalid`` unless the whole file has the digest ``sha256``."""
    if file_sha256(path) != sha256:
        raise _changed(path)


def _changed(path: Path) -> ArtifactInvalid:
    return ArtifactInvalid(
        "a spool or artifact file changed after it was written (its digest differs)",
        diagnostics={"file": path.name},
    )


def _truncated(path: Path, offset: int, expected: int, got: int, part: str) -> ArtifactInvalid:
    return ArtifactInvalid(
        f"a spool or artifact file ends inside a {part} (truncated file)",
        diagnostics={
            "file": path.name,
            "offset": offset,
            "expected_bytes": expected,
            "read_bytes": got,
        },
    )


def file_sha256(path: Path) -> str:
    """``sha256:`` of the whole file, read in 1 MiB blocks."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(_READ_BLOCK):
            digest.update(block)
    return "sha256:" + digest.hexdigest()


def open_files_allowed() -> int:
    """How many files one scan may hold open at once, one per partition: a quarter of the
    process's limit on open files (``RLIMIT_NOFILE``, read at each call), leaving the rest
    to the stores, the engines and the caller (one at least). 256 under Linux's usual 1,024.
    Past this, a partition's rows are read on their own: a scan of an unindexed table each
    (figures: docs/performance.md, fix 52)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return _MOST_OPEN_FILES
    return max(1, min(soft // 4, _MOST_OPEN_FILES))
