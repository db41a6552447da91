"""legacy: write the extraction to one local file, then one ``sink.load()`` from it."""

from __future__ import annotations

from . import PathContext

__all__ = ["legacy_path"]


def legacy_path(ctx: PathContext) -> int:
    file = ctx.write_load_file("legacy", ctx.extract())
    ctx.check_governance(file.rows)
    payload = ctx.load_files([file])
    return ctx.mutate("load", lambda: ctx.sink.load(payload))
