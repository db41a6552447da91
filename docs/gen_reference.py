"""Regenerate the reference sections of the docs from the docstrings they document.

docs/hooks.md       the hook reference, from the hookspecs (``hookspecs.py``)
docs/connectors.md  the connector contract, from its parts (``connectors/contract/``)

python docs/gen_reference.py          # rewrite the generated sections
python docs/gen_reference.py --check  # exit 1 if a doc is stale (the tests do this)
"""

from __future__ import annotations

import inspect
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

from dpone_native_transfer import hookspecs
from dpone_native_transfer.connectors import contract
from dpone_native_transfer.connectors.contract.bulk import BulkRead
from dpone_native_transfer.connectors.contract.engine import EnginePull
from dpone_native_transfer.connectors.contract.postgres_table import PostgresTable
from dpone_native_transfer.connectors.contract.sqlite_file import SQLiteFile
from dpone_native_transfer.plugins import EVERY_IMPLEMENTATION_RUNS
from dpone_native_transfer.testing.contract import protocol_members

DOCS = Path(__file__).parent
END = "<!-- END GENERATED {what} -->"
SPEC_MARKER = f"{hookspecs.PROJECT_NAME}_spec"


def begin(what: str, source: str) -> str:
    return f"<!-- BEGIN GENERATED {what}: edit {source}, then run docs/gen_reference.py -->"


def hookspec_functions() -> list:
    """The hookspecs in declaration order."""
    found = [value for value in vars(hookspecs).values() if hasattr(value, SPEC_MARKER)]
    return sorted(found, key=lambda function: function.__code__.co_firstlineno)


def signature_text(function, *, skip_self: bool = False) -> str:
    parameters = list(inspect.signature(function).parameters.values())[int(skip_self) :]
    arguments = []
    for p in parameters:
        if p.kind is p.KEYWORD_ONLY and "*" not in arguments:
            arguments.append("*")
        text = f"{p.name}: {p.annotation}"
        arguments.append(text if p.default is p.empty else f"{text} = {p.default!r}")
    returned = inspect.signature(function).return_annotation
    return f"{function.__name__}({', '.join(arguments)}) -> {returned}"


def hook_reference() -> str:
    sections = []
    for function in hookspec_functions():
        kind = (
            "every implementation called, whatever another returns or raises"
            if function.__name__ in EVERY_IMPLEMENTATION_RUNS
            else "all implementations called; the first raise stops the rest"
        )
        sections.append(
            f"### `{function.__name__}`\n\n"
            f"```python\n{signature_text(function)}\n```\n\n"
            f"*{kind}*\n\n{inspect.getdoc(function)}\n"
        )
    return "\n".join(sections)


def contract_protocols() -> list[type]:
    """The parts of the contract: what every connector is, then the optional parts."""
    return [contract.Source, contract.Sink, EnginePull, SQLiteFile, PostgresTable, BulkRead]


KINDS = {
    contract.Source: "every source",
    contract.Sink: "every sink",
    EnginePull: "optional: what `Sink.engine()` returns",
    SQLiteFile: "optional: a source other engines read",
    PostgresTable: "optional: a source other engines read",
    BulkRead: "optional: what `Source.bulk()` returns",
}


def protocol_text(protocol: type) -> str:
    """The members a Protocol declares itself (its bases are documented on their own)."""
    own = vars(protocol)
    lines = []
    for name, member in protocol_members(protocol).items():
        if name not in own and name not in own.get("__annotations__", {}):
            continue
        if member is None:
            lines.append(f"{name}: {own['__annotations__'][name]}")
        else:
            lines.append(f"def {signature_text(member, skip_self=True)}")
            doc = inspect.getdoc(member) or ""
            lines.append(textwrap.indent(f'"""{doc}"""', "    "))
    return "\n".join(lines)


def fields_text(features: type) -> str:
    """A features class's fields as written: each with its comment and default."""
    lines = inspect.getsource(features).splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip().startswith('"""'))
    end = next(i for i in range(start, len(lines)) if lines[i].rstrip().endswith('"""')
               and (i > start or lines[i].count('"""') == 2))  # fmt: skip
    return textwrap.dedent("\n".join(lines[end + 1 :])).strip()


def contract_reference() -> str:
    sections = []
    for protocol in contract_protocols():
        bases = [b.__name__ for b in protocol.__bases__ if b in contract_protocols()]
        kind = KINDS[protocol] + (f"; includes {', '.join(bases)}" if bases else "")
        sections.append(
            f"### `{protocol.__name__}`\n\n*{kind}*\n\n{inspect.getdoc(protocol)}\n\n"
            f"```python\n{protocol_text(protocol)}\n```\n"
        )
    for features in (contract.SourceFeatures, contract.SinkFeatures):
        sections.append(
            f"### `{features.__name__}`\n\n*data*\n\n{inspect.getdoc(features)}\n\n"
            f"```python\n{fields_text(features)}\n```\n"
        )
    sections.append(f"### `Unsupported`\n\n*a refusal*\n\n{inspect.getdoc(contract.Unsupported)}\n")
    return "\n".join(sections)


# (document, what is generated, the module it comes from, the generator)
SECTIONS: list[tuple[str, str, str, Callable[[], str]]] = [
    ("hooks.md", "HOOK REFERENCE", "hookspecs.py", hook_reference),
    ("connectors.md", "CONNECTOR CONTRACT", "connectors/contract/", contract_reference),
]


def render(text: str, what: str, source: str, reference: Callable[[], str]) -> str:
    head, found, rest = text.partition(begin(what, source))
    if not found:
        raise SystemExit(f"the marker {begin(what, source)!r} is missing")
    _, _, tail = rest.partition(END.format(what=what))
    return f"{head}{begin(what, source)}\n\n{reference()}\n{END.format(what=what)}{tail}"


def main(argv: list[str]) -> int:
    stale = 0
    for name, what, source, reference in SECTIONS:
        doc = DOCS / name
        current = doc.read_text(encoding="utf-8")
        wanted = render(current, what, source, reference)
        if "--check" in argv:
            stale += current != wanted
        else:
            doc.write_text(wanted, encoding="utf-8")
    return int(stale > 0)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
