"""Check a connector against the connector contract (``connectors/contract.py``).

``isinstance`` with a runtime-checkable Protocol only asks whether each member
exists. ``contract_problems`` also compares each method's parameters with the
Protocol's, so a connector that names a keyword differently, or wants an
argument the runtime never passes, is caught by the kit rather than in a run.
"""

from __future__ import annotations

import inspect
from typing import Any

from ..connectors.contract import CAPABILITIES, Sink, Source

__all__ = ["capabilities_of", "contract_problems", "protocol_members"]

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
    """The base Protocol (``Source`` or ``Sink``) and each optional capability it has."""
    return [p for p in (Source, Sink, *CAPABILITIES) if isinstance(connector, p)]


def contract_problems(connector: object, protocol: type) -> list[str]:
    """What ``connector`` lacks of ``protocol``, or declares differently; ``[]``: it meets it."""
    problems = []
    for name, declared in protocol_members(protocol).items():
        if not hasattr(connector, name):
            problems.append(f"{protocol.__name__}.{name}: missing")
        elif declared is not None:
            method = getattr(connector, name)
            problems += [
                f"{protocol.__name__}.{name}: {problem}"
                for problem in _signature_problems(declared, method)
            ]
    return problems


def _signature_problems(declared: Any, method: Any) -> list[str]:
    if not callable(method):
        return ["not a method"]
    wanted = list(inspect.signature(declared).parameters.values())[1:]  # without self
    given = inspect.signature(method).parameters
    takes_any_keyword = any(p.kind is p.VAR_KEYWORD for p in given.values())
    positional = [p for p in given.values() if p.kind in _POSITIONAL]
    problems = []
    for index, param in enumerate(wanted):
        if param.kind in _POSITIONAL:
            if index >= len(positional) and not any(
                p.kind is p.VAR_POSITIONAL for p in given.values()
            ):
                problems.append(f"takes no positional argument {param.name!r}")
            continue
        mine = given.get(param.name)
        if mine is None or mine.kind not in (*_POSITIONAL, mine.KEYWORD_ONLY):
            if not takes_any_keyword:
                problems.append(f"takes no keyword argument {param.name!r}")
        elif param.default is not param.empty and mine.default is mine.empty:
            problems.append(f"requires {param.name!r}, which the runtime may leave out")
    names = {param.name for param in wanted}
    extra = [
        p.name
        for index, p in enumerate(given.values())
        if p.default is p.empty
        and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
        and p.name not in names
        and not (p.kind in _POSITIONAL and index < len(wanted))
    ]
    problems += [f"requires {name!r}, which the runtime never passes" for name in extra]
    return problems
