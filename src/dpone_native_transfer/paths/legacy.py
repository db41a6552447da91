"""legacy: spool the extraction to a local file, then one ``sink.load()`` of all rows."""

from __future__ import annotations

import hashlib

from ..artifacts import create_private, read_chunks, write_chunks
from . import PathContext

__all__ = ["legacy_path"]


def legacy_path(ctx: PathContext) -> int:
    spool = ctx.work_dir / "legacy.spool"
    total, digest, whole = 0, hashlib.sha256(), ""
    with create_private(spool) as handle:
        for index, candidate in enumerate(ctx.candidates):
            rows, whole = write_chunks(handle, ctx.read(candidate), digest)
            ctx.extracted(index, rows)
            total += rows
    ctx.check_governance(total)
    payload = ctx.row_chunks(read_chunks(spool, whole or None))
    return ctx.mutate("load", lambda: ctx.sink.load(payload))
