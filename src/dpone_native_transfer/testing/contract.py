"""Check a connector against the connector contract (``connectors/contract/``).

``isinstance`` with a runtime-checkable Protocol only asks whether each member
exists. ``contract_problems`` also compares each method's parameters with the
Protocol's, so a connector that names a keyword differently, or wants an
argument the runtime never passes, is caught by the kit rather than in a run.
"""

from __future__ import annotations

import inspect
from typing import Any

from ..connectors.contract import Sink, Source
from ..connectors.contract.bulk import BulkRead
from ..connectors.contract.engine import EnginePull
from ..connectors.contract.sqlite_file import SQLiteFile

__all__ = ["PARTS", "capabilities_of", "contract_problems", "protocol_members"]

# What a connector may be: a source or a sink, an engine, a SQLite file other engines read,
# a source that writes its rows to Arrow files in bulk.
PARTS: tuple[type, ...] = (Source, Sink, EnginePull, SQLiteFile, BulkRead)

_POSITIONAL = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)


def protocol_members(protocol: type) -> dict[str, Any]:
    """Each member a Protocol (with its bases) declares: a function, or None for an attribute."""
    members: dict[str, Any] = {}
    for cls in reversed(protocol.__mro__):
        if not getattr(cls, "_is_protocol", False) or cls.__module__ == "typing":
            continue
        members.update(dict.fromkeys(vars(cls).get("__annotations__", {})))
        members.update(
            (name, value)
            for name, value in vars(cls).items()
            if inspect.isfunction(value) and not name.startswith("_")
        )
    return members


def capabilities_of(connector: object) -> list[type]:
    """The parts of the contract ``connector`` claims: ``Source`` or ``Sink``, ``SQLiteFile``
    and ``BulkRead`` for a source, and ``EnginePull`` for a sink whose ``engine()`` is the
    sink itself (an engine of its own is checked apart: ``capabilities_of(sink.engine())``)."""
    return [p for p in PARTS if _claims(connector, p)]


def _claims(connector: object, protocol: type) -> bool:
    try:
        return isinstance(connector, protocol)
    except Exception:  # a member that raises when read: the checker reports it, never crashes
        return False


def contract_problems(connector: object, protocol: type) -> list[str]:
    """What ``connector`` lacks of ``protocol``, or declares differently; ``[]``: it meets it."""
    problems = []
    for name, declared in protocol_members(protocol).items():
        where = f"{protocol.__name__}.{name}"
        try:
            member = getattr(connector, name)
        except AttributeError:
            problems.append(f"{where}: missing")
            continue
        except Exception as exc:
            problems.append(f"{where}: raises {type(exc).__name__} when read")
            continue
        if declared is not None:
            problems += [f"{where}: {problem}" for problem in _signature_problems(declared, member)]
    return problems


def _signature_problems(declared: Any, method: Any) -> list[str]:
    if not callable(method):
        return ["not a method"]
    try:
        given = inspect.signature(method).parameters
    except (TypeError, ValueError):
        return ["its signature cannot be read (a builtin?): wrap it in a function"]
    wanted = list(inspect.signature(declared).parameters.values())[1:]  # without self
    takes_any_keyword = any(p.kind is p.VAR_KEYWORD for p in given.values())
    takes_any_positional = any(p.kind is p.VAR_POSITIONAL for p in given.values())
    positional = [p for p in given.values() if p.kind in _POSITIONAL]
    wanted_positional = [p for p in wanted if p.kind in _POSITIONAL]
    problems = []
    for index, param in enumerate(wanted_positional):
        if index >= len(positional) and not takes_any_positional:
            problems.append(f"takes no positional argument {param.name!r}")
    for param in wanted:
        if param.kind is not param.KEYWORD_ONLY:
            continue
        mine = given.get(param.name)
        by_keyword = mine is not None and mine.kind in (
            mine.POSITIONAL_OR_KEYWORD,
            mine.KEYWORD_ONLY,
        )
        if not by_keyword and not takes_any_keyword:
            problems.append(f"takes no keyword argument {param.name!r}")
        elif mine is not None and param.default is not param.empty and mine.default is mine.empty:
            problems.append(f"requires {param.name!r}, which the runtime may leave out")
    names = {param.name for param in wanted}
    covered = positional[: len(wanted_positional)]  # the runtime fills these by position
    extra = [
        p.name
        for p in given.values()
        if p.default is p.empty
        and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
        and p not in covered
        and not (p.name in names and p.kind is not p.POSITIONAL_ONLY)
    ]
    problems += [f"requires {name!r}, which the runtime never passes" for name in extra]
    return problems
