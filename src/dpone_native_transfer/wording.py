"""How every message counts things and names the command: a leaf, so any layer may word."""

from __future__ import annotations

__all__ = ["PROG", "plural"]

PROG = "dpone-transfer"


def plural(count: int, word: str) -> str:
    suffix = "es" if word.endswith(("ch", "sh", "s", "x")) else "s"
    return f"{count:,} {word}" + ("" if count == 1 else suffix)
