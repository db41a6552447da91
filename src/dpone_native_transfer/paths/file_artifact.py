"""file-artifact: one verified file per partition, then one ``sink.load()`` from the files.

The files are in the format the sink's engine reads itself when it has one
(``EnginePull.write_load_file``: an Arrow IPC stream for DuckDB and ClickHouse), and otherwise
in the runtime's own spool format (``artifacts.py``); either keeps every value
exact. Each file's digest is checked before the target call, and again as the
sink reads it (chDB reads its files itself: just before it does).
"""

from __future__ import annotations

from ..artifacts import file_sha256
from ..errors import ArtifactInvalid
from ._context import PathContext

__all__ = ["file_artifact_path"]


def file_artifact_path(ctx: PathContext) -> int:
    """Files in the run's private work folder (``artifact_dir`` says where it is made)."""
    files = ctx.pulled_files(per_partition=True)
    if files is None:
        files = []
        for index, candidate in enumerate(ctx.candidates):
            file = ctx.write_load_file(candidate.partition_id, ctx.read(candidate))
            ctx.extracted(index, file.rows, artifact_sha256=file.sha256)
            files.append(file)
    for candidate, file in zip(ctx.candidates, files, strict=True):
        if file_sha256(file.path) != candidate.diagnostics["artifact_sha256"]:
            raise ArtifactInvalid(
                "an exported artifact does not match its recorded digest",
                diagnostics={"route": ctx.route.as_dict(), "partition_id": candidate.partition_id},
            )
    rows = sum(file.rows for file in files)
    ctx.check_governance(rows)
    payload = ctx.load_files(files)
    return ctx.mutate("load", ctx.sink.load, payload, sent=rows)
