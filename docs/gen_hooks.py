"""Regenerate the hook reference in docs/hooks.md from the hookspec docstrings.

python docs/gen_hooks.py          # rewrite the generated section
python docs/gen_hooks.py --check  # exit 1 if docs/hooks.md is stale (the tests do this)
"""

from __future__ import annotations

import inspect
import sys
from pathlib import Path

from dpone_native_transfer import hookspecs
from dpone_native_transfer.plugins import EVERY_IMPLEMENTATION_RUNS

DOC = Path(__file__).with_name("hooks.md")
BEGIN = "<!-- BEGIN GENERATED HOOK REFERENCE: edit hookspecs.py, then run docs/gen_hooks.py -->"
END = "<!-- END GENERATED HOOK REFERENCE -->"
SPEC_MARKER = f"{hookspecs.PROJECT_NAME}_spec"


def hookspec_functions() -> list:
    """The hookspecs in declaration order."""
    found = [value for value in vars(hookspecs).values() if hasattr(value, SPEC_MARKER)]
    return sorted(found, key=lambda function: function.__code__.co_firstlineno)


def signature_text(function) -> str:
    parameters = inspect.signature(function).parameters.values()
    arguments = ", ".join(f"{p.name}: {p.annotation}" for p in parameters)
    return f"{function.__name__}({arguments}) -> {inspect.signature(function).return_annotation}"


def reference() -> str:
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


def render(text: str) -> str:
    head, _, rest = text.partition(BEGIN)
    _, _, tail = rest.partition(END)
    return f"{head}{BEGIN}\n\n{reference()}\n{END}{tail}"


def main(argv: list[str]) -> int:
    current = DOC.read_text(encoding="utf-8")
    wanted = render(current)
    if "--check" in argv:
        return 0 if current == wanted else 1
    DOC.write_text(wanted, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
