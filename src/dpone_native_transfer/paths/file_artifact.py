"""file-artifact: one verified file per partition, then one ``sink.load()`` from the files.

The files are the runtime's own spool format, read back as ``RowChunks``,
unless the sink declares ``artifact_format = "jsonl"``: then they are written
as JSON lines and the sink receives ``ArtifactFiles`` to read with its engine.
"""

from __future__ import annotations

import itertools
from pathlib import Path

from ..artifacts import (
    JSONL,
    create_private,
    file_sha256,
    read_chunks,
    write_chunks,
    write_jsonl,
)
from ..errors import ArtifactInvalid
from ..payloads import ArtifactFiles
from . import PathContext

__all__ = ["file_artifact_path"]


def file_artifact_path(ctx: PathContext) -> int:
    """Files in the run's private work folder (``artifact_dir`` says where it is made)."""
    jsonl = getattr(ctx.sink, "artifact_format", None) == JSONL
    names = [column.name for column in ctx.shape.columns]
    files: list[Path] = []
    for index, candidate in enumerate(ctx.candidates):
        path = ctx.work_dir / f"{candidate.partition_id}.{JSONL if jsonl else 'rows'}"
        with create_private(path) as handle:
            if jsonl:
                rows, digest = write_jsonl(handle, names, ctx.read(candidate))
            else:
                rows, digest = write_chunks(handle, ctx.read(candidate))
        ctx.extracted(index, rows, artifact_sha256=digest)
        files.append(path)
    for candidate, path in zip(ctx.candidates, files, strict=True):
        if file_sha256(path) != candidate.diagnostics["artifact_sha256"]:
            raise ArtifactInvalid(
                "an exported artifact does not match its recorded digest",
                diagnostics={"route": ctx.route.as_dict(), "partition_id": candidate.partition_id},
            )
    ctx.check_governance(sum(candidate.rows_exported for candidate in ctx.candidates))
    if jsonl:
        payload = ArtifactFiles(
            columns=ctx.shape.columns,
            paths=tuple(str(path.resolve()) for path in files),
            format=JSONL,
            replace=ctx.replace,
        )
    else:
        digests = [candidate.diagnostics["artifact_sha256"] for candidate in ctx.candidates]
        payload = ctx.row_chunks(
            itertools.chain.from_iterable(
                read_chunks(path, digest) for path, digest in zip(files, digests, strict=True)
            )
        )
    return ctx.mutate("load", lambda: ctx.sink.load(payload))
