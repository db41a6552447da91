"""file-artifact: one verified file per partition, then one ``sink.load()`` from the files.

The files are the runtime's own spool format (``artifacts.py``), which keeps
every value exact (bytes, NaN, decimals' text, timestamps' text). Each file's
digest is checked before the target call, and again over exactly the bytes the
sink reads, as it reads them.
"""

from __future__ import annotations

import itertools
from pathlib import Path

from ..artifacts import create_private, file_sha256, read_chunks, write_chunks
from ..errors import ArtifactInvalid
from . import PathContext

__all__ = ["file_artifact_path"]


def file_artifact_path(ctx: PathContext) -> int:
    """Files in the run's private work folder (``artifact_dir`` says where it is made)."""
    files: list[Path] = []
    for index, candidate in enumerate(ctx.candidates):
        path = ctx.work_dir / f"{candidate.partition_id}.rows"
        with create_private(path) as handle:
            rows, digest = write_chunks(handle, ctx.read(candidate))
        ctx.extracted(index, rows, artifact_sha256=digest)
        files.append(path)
    digests = [candidate.diagnostics["artifact_sha256"] for candidate in ctx.candidates]
    for candidate, path, digest in zip(ctx.candidates, files, digests, strict=True):
        if file_sha256(path) != digest:
            raise ArtifactInvalid(
                "an exported artifact does not match its recorded digest",
                diagnostics={"route": ctx.route.as_dict(), "partition_id": candidate.partition_id},
            )
    ctx.check_governance(sum(candidate.rows_exported for candidate in ctx.candidates))
    payload = ctx.row_chunks(
        itertools.chain.from_iterable(
            read_chunks(path, digest) for path, digest in zip(files, digests, strict=True)
        )
    )
    return ctx.mutate("load", lambda: ctx.sink.load(payload))
