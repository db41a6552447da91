"""legacy: write the extraction to one local file, then one ``sink.load()`` from it."""

from __future__ import annotations

from ._context import PathContext

__all__ = ["legacy_path"]


def legacy_path(ctx: PathContext) -> int:
    files = ctx.pulled_files(per_partition=False)
    if files is None:
        files = [ctx.write_load_file("legacy", ctx.extract())]
    rows = sum(file.rows for file in files)
    ctx.check_governance(rows)
    payload = ctx.load_files(files)
    return ctx.mutate("load", ctx.sink.load, payload, sent=rows)
