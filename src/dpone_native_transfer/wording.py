"""How every message counts things and names the command: a leaf, so any layer may word."""

from __future__ import annotations

import shlex

__all__ = ["PROG", "one_line", "plural", "shell_word"]

PROG = "dpone-transfer"


def plural(count: int, word: str) -> str:
    suffix = "es" if word.endswith(("ch", "sh", "s", "x")) else "s"
    return f"{count:,} {word}" + ("" if count == 1 else suffix)


def one_line(name: str) -> str:
    """A name as output shows it, on one line: a control character (a newline, a tab) in a
    table name is escaped (``\\n``), so that it cannot split or forge a log line."""
    if name.isprintable():
        return name
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode() for c in name)


def shell_word(text: str) -> str:
    """``text`` quoted for a shell command a person copies, on one line: ``shlex.quote``, or
    ``$'...'`` with the escapes of ``one_line`` when it holds a control character."""
    if text.isprintable():
        return shlex.quote(text)
    return "$'" + one_line(text.replace("\\", "\\\\")).replace("'", "\\'") + "'"
