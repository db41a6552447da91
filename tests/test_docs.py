"""The docs match the code: the hook reference is the hookspec docstrings."""

from __future__ import annotations

import runpy
from pathlib import Path

DOCS = Path(__file__).resolve().parent.parent / "docs"
generator = runpy.run_path(str(DOCS / "gen_hooks.py"))


def test_every_hookspec_is_documented_with_its_exact_signature_and_docstring():
    text = (DOCS / "hooks.md").read_text(encoding="utf-8")
    functions = generator["hookspec_functions"]()
    assert len(functions) == 4
    for function in functions:
        assert generator["signature_text"](function) in text, function.__name__
        assert function.__doc__ and generator["inspect"].getdoc(function) in text


def test_the_generated_hook_reference_is_up_to_date():
    assert generator["main"](["--check"]) == 0, "run: python docs/gen_hooks.py"
