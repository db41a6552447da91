"""file-artifact: one verified file per partition, then one ``sink.load()`` from the files."""

from __future__ import annotations

import itertools
from pathlib import Path

from ..artifacts import file_sha256, read_chunks, write_chunks
from ..errors import ArtifactInvalid
from . import PathContext

__all__ = ["file_artifact_path"]


def file_artifact_path(ctx: PathContext) -> int:
    folder = Path(ctx.spec.artifact_dir) if ctx.spec.artifact_dir else ctx.work_dir
    folder.mkdir(parents=True, exist_ok=True)
    files: list[Path] = []
    for index, candidate in enumerate(ctx.candidates):
        path = folder / f"{candidate.partition_id}.rows"
        with open(path, "wb") as handle:
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
    chunks = itertools.chain.from_iterable(read_chunks(path) for path in files)
    payload = ctx.row_chunks(chunks)
    return ctx.mutate("load", lambda: ctx.sink.load(payload))
