"""The module layers: what imports what, read from the source (AST) or from a fresh process.

``cli.py`` is the console script and nothing imports it; running a route is
``application.py`` and what is reported is ``reporting.py``, which the CLI, the
demo and the Airflow adapter share. Imports under ``if TYPE_CHECKING:`` are not
imports at run time: the import-time checks leave them out, the layer and cycle checks
count them (a reader follows them all the same).
"""

from __future__ import annotations

import ast
import importlib
import io
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import dpone_native_transfer
from dpone_native_transfer.events import Event, EventName
from dpone_native_transfer.reporting import progress_lines, progress_printer

PACKAGE = "dpone_native_transfer"
SRC = Path(dpone_native_transfer.__file__).parent
PLUGINS = SRC.parents[1] / "plugins"
CONNECTOR_NAMES = ("sqlite", "duckdb", "postgres", "postgres_sink", "clickhouse")


def module_name(file: Path, root: Path) -> str:
    parts = list(file.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


SRC_MODULES = {module_name(file, SRC.parent): file for file in sorted(SRC.rglob("*.py"))}
PLUGIN_MODULES = {module_name(file, PLUGINS): file for file in sorted(PLUGINS.rglob("*.py"))}
KNOWN_MODULES = {*SRC_MODULES, *PLUGIN_MODULES}


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def import_nodes(
    tree: ast.AST, *, in_functions: bool = True, type_checking: bool = False
) -> Iterator[ast.Import | ast.ImportFrom]:
    """Every import statement run at some point; ``in_functions=False``: at import time only;
    ``type_checking``: also those only type checkers run."""
    for child in ast.iter_child_nodes(tree):
        if isinstance(child, ast.If) and _is_type_checking(child) and not type_checking:
            continue
        if not in_functions and isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        if isinstance(child, ast.Import | ast.ImportFrom):
            yield child
        yield from import_nodes(child, in_functions=in_functions, type_checking=type_checking)


def imported_modules(
    module: str, file: Path, *, in_functions: bool = True, type_checking: bool = False
) -> set[str]:
    """The modules ``module`` imports; ``from . import x`` imports ``x`` if it is a module."""
    package = module if file.name == "__init__.py" else module.rpartition(".")[0]
    found = set()
    tree = ast.parse(file.read_text(encoding="utf-8"))
    for node in import_nodes(tree, in_functions=in_functions, type_checking=type_checking):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
            continue
        base = node.module or ""
        if node.level:
            anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
            base = ".".join(anchor + ([node.module] if node.module else []))
        for alias in node.names:  # a submodule by that name, else a name defined in ``base``
            submodule = f"{base}.{alias.name}"
            found.add(submodule if submodule in KNOWN_MODULES else base)
    return found


def src_graph(*, in_functions: bool) -> dict[str, set[str]]:
    return {
        module: imported_modules(module, file, in_functions=in_functions)
        & set(SRC_MODULES) - {module}
        for module, file in SRC_MODULES.items()
    }


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    found: list[list[str]] = []
    state: dict[str, str] = {}

    def visit(node: str, path: list[str]) -> None:
        state[node] = "open"
        for target in sorted(graph[node]):
            if state.get(target) == "open":
                found.append([*path[path.index(target) :], target])
            elif target not in state:
                visit(target, [*path, target])
        state[node] = "done"

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])
    return found


def test_the_import_graph_finds_a_planted_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c", "a"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_the_package_modules_import_each_other_without_a_cycle_at_import_time():
    graph = src_graph(in_functions=False)
    assert graph[f"{PACKAGE}.cli"] >= {f"{PACKAGE}.application", f"{PACKAGE}.reporting"}
    assert cycles(graph) == []


# The layers, from the ground up (docs/architecture.md, "Layers"): a module imports its own
# layer and those below, never one above, counting every import (in functions and under
# TYPE_CHECKING). A module is in the layer of its longest listed prefix.
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("foundation", ("errors", "wording", "events", "drivers", "artifacts", "rejects")),
    (
        "records",
        (
            "checkpoints",
            "clock",
            "column_types",
            "payloads",
            "identity",
            "audit",
            "latest",
            "source_state",
        ),
    ),  # fmt: skip
    ("durable state", ("ledger", "lease", "stores")),
    ("connectors", ("connectors",)),
    ("hook contract", ("mutation", "hookspecs", "lifecycle", "plugins", "boundary", "recovery")),
    ("spec", ("spec",)),
    ("planning", ("planner", "cursor_edge", "schema_contract")),
    ("paths", ("paths",)),
    ("runtime", ("runtime",)),
    (
        "application",
        (
            "application",
            "config",
            "reporting",
            "route_status",
            "state_commands",
            "rejects_command",
            "demo",
            "discover",
            "discover_command",
            "pipeline",
            "pipeline_run",
            "pipeline_worker",
            "testing",
        ),
    ),  # fmt: skip
    ("command line", ("cli", "_entry", "__main__", "")),  # "": the package's lazy exports
)


def layer_of(module: str) -> int:
    """The layer of a module of the package; the plugins are above them all."""
    if module != PACKAGE and not module.startswith(f"{PACKAGE}."):
        return len(LAYERS)
    name = module.removeprefix(PACKAGE).removeprefix(".")
    found = [
        (len(prefix), number)
        for number, (_, prefixes) in enumerate(LAYERS)
        for prefix in prefixes
        if name == prefix or name.startswith(f"{prefix}.") or prefix == ""
    ]
    return max(found)[1]


def full_graph() -> dict[str, set[str]]:
    """Every module of src/ and plugins/ and what it imports of them: every import."""
    files = {**SRC_MODULES, **PLUGIN_MODULES}
    return {
        module: imported_modules(module, file, type_checking=True) & set(files) - {module}
        for module, file in files.items()
    }


def test_every_module_is_in_a_layer_and_no_import_goes_up():
    upward = sorted(
        f"{module} ({LAYERS[layer_of(module)][0]}) -> {target} ({LAYERS[layer_of(target)][0]})"
        for module, targets in full_graph().items()
        if module in SRC_MODULES
        for target in targets
        if layer_of(target) > layer_of(module)
    )
    assert upward == []
    unlisted = [m for m in SRC_MODULES if m != PACKAGE and layer_of(m) == len(LAYERS) - 1]
    assert sorted(unlisted) == [f"{PACKAGE}.__main__", f"{PACKAGE}._entry", f"{PACKAGE}.cli"]


def test_the_layer_rule_catches_an_upward_import():
    assert layer_of(f"{PACKAGE}.ledger") < layer_of(f"{PACKAGE}.reporting")
    assert layer_of(f"{PACKAGE}.connectors.sqlite") == layer_of(f"{PACKAGE}.connectors.contract")
    assert layer_of("dpone_target_commit_guard.plugin") > layer_of(f"{PACKAGE}.cli")


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import cycles: each set of modules that import each other, through any chain."""
    reach = {module: _reachable(graph, module) for module in graph}
    groups = {frozenset(m for m in reach[module] if module in reach[m]) for module in graph}
    return sorted(sorted(group) for group in groups if len(group) > 1)


def _reachable(graph: dict[str, set[str]], start: str) -> set[str]:
    seen, todo = {start}, [start]
    while todo:
        for target in graph[todo.pop()] - seen:
            seen.add(target)
            todo.append(target)
    return seen


def test_at_most_one_import_cycle_counting_every_import_and_it_is_small_and_in_one_package():
    found = strongly_connected(full_graph())
    assert len(found) <= 1, found
    for group in found:
        assert len(group) <= 4 and len({m.rpartition(".")[0] for m in group}) == 1, group


def test_the_cycle_finder_finds_cycles_through_any_chain():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": {"e"}}
    assert strongly_connected(graph) == [["a", "b", "c"]]


IMPLEMENTATIONS = {
    *(f"{PACKAGE}.connectors.{name}" for name in CONNECTOR_NAMES),
    *(f"{PACKAGE}.stores.{name}" for name in ("memory", "sqlite", "postgres")),
}
# The edges that may name an implementation: the implementations themselves, the lazy
# package exports, the store opener, the demo and the test support. The route-file reader
# names connectors by "module:Class" strings, imported only when a route uses the kind.
EDGES = (f"{PACKAGE}.connectors.", f"{PACKAGE}.stores.", f"{PACKAGE}.testing")
EDGE_MODULES = {PACKAGE, f"{PACKAGE}.connectors", f"{PACKAGE}.stores", f"{PACKAGE}.demo"}


def test_below_the_edges_no_module_imports_a_connector_or_store_implementation():
    """The runtime, paths, planner, guard and commands see connectors and stores only through
    their ports (``connectors.contract``, ``stores``), not even inside a function."""
    files = {**SRC_MODULES, **PLUGIN_MODULES}
    reaching = sorted(
        f"{module} -> {target}"
        for module, file in files.items()
        if module not in EDGE_MODULES and not module.startswith(EDGES)
        for target in imported_modules(module, file) & IMPLEMENTATIONS
    )
    assert reaching == []
    assert imported_modules(f"{PACKAGE}.demo", SRC_MODULES[f"{PACKAGE}.demo"]) & IMPLEMENTATIONS


def test_nothing_imports_the_command_line_module_not_even_on_use():
    """The CLI is the top layer: the demo, the application, reporting and the plugins are below."""
    files = {**SRC_MODULES, **PLUGIN_MODULES}
    importers = sorted(
        module
        for module, file in files.items()
        if f"{PACKAGE}.cli" in imported_modules(module, file)
        # the console script's function and python -m run the command
        and module not in (f"{PACKAGE}.cli", f"{PACKAGE}._entry", f"{PACKAGE}.__main__")
    )
    assert importers == []
    assert f"{PACKAGE}.application" in imported_modules(
        f"{PACKAGE}.demo", SRC_MODULES[f"{PACKAGE}.demo"]
    )


# -- one progress reporter, for a stream or for a logger ----------------------------------


def _progress_events() -> list[Event]:
    return [
        Event(
            EventName.PARTITION_EXTRACTED,
            {"done": 1, "of": 2, "partition_id": "p-1", "partition": "region=eu", "rows": 1200},
        ),
        Event(EventName.GUARD_ARMED, {}),
        Event(EventName.TARGET_STARTED, {"operation": "load"}),
    ]


def test_progress_lines_hands_over_whole_lines_and_the_printer_prints_the_same_lines():
    emitted: list[str] = []
    listener = progress_lines(emitted.append, clock=iter([0.0, 2.0]).__next__)
    for event in _progress_events():
        listener(event)
    assert emitted == [
        "[1/2] partition region=eu (p-1) extracted 1,200 rows (1,200 rows so far, 600 rows/s)",
        "target: load",
    ]
    stream = io.StringIO()
    printer = progress_printer(stream, indent="  ")
    for event in _progress_events():
        printer(event)
    printed = stream.getvalue().splitlines()
    assert printed[0].startswith("  [1/2] partition region=eu (p-1) extracted 1,200 rows (")
    assert printed[1:] == ["  target: load"]


# -- what an import loads, in a fresh interpreter -------------------------------------------

CONNECTORS = tuple(f"{PACKAGE}.connectors.{name}" for name in CONNECTOR_NAMES)


def loaded_after(statement: str) -> set[str]:
    """The modules a fresh interpreter holds after ``statement`` (and nothing else)."""
    script = f"import json, sys\n{statement}\nprint(json.dumps(sorted(sys.modules)))\n"
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True
    )
    return set(json.loads(done.stdout))


def test_importing_the_package_loads_none_of_its_modules():
    loaded = loaded_after("import dpone_native_transfer")
    assert sorted(m for m in loaded if m.startswith(PACKAGE)) == [PACKAGE]


def test_the_guards_hook_implementations_load_no_cli_config_or_connector():
    """What the entry point imports on every run: the hooks, the guard's policy, the records."""
    loaded = loaded_after("import dpone_target_commit_guard.plugin")
    assert f"{PACKAGE}.checkpoints" in loaded  # the control: the import did load the guard
    unwanted = {"argparse", f"{PACKAGE}.cli", f"{PACKAGE}.config", *CONNECTORS}
    assert sorted(unwanted & loaded) == []
    assert sorted(m for m in loaded if m.startswith(f"{PACKAGE}.connectors")) == []


# -- the lazy public API --------------------------------------------------------------------


def _type_checking_imports() -> dict[str, str]:
    """Name -> module of the imports ``__init__.py`` makes for type checkers."""
    tree = ast.parse((SRC / "__init__.py").read_text(encoding="utf-8"))
    block = next(n for n in tree.body if isinstance(n, ast.If) and _is_type_checking(n))
    return {
        alias.name: node.module or ""
        for node in block.body
        if isinstance(node, ast.ImportFrom)
        for alias in node.names
    }


def test_every_public_name_has_one_module_and_type_checkers_see_the_same_one():
    exports = dpone_native_transfer._EXPORTS
    assert sorted(exports) == sorted(dpone_native_transfer.__all__)
    assert _type_checking_imports() == exports


@pytest.mark.parametrize("name", sorted(dpone_native_transfer.__all__))
def test_every_public_name_resolves_to_the_object_its_module_defines(name):
    module = importlib.import_module(f"{PACKAGE}.{dpone_native_transfer._EXPORTS[name]}")
    assert getattr(dpone_native_transfer, name) is getattr(module, name)
    assert name in dir(dpone_native_transfer)


def test_a_name_that_is_not_public_is_an_attribute_error():
    with pytest.raises(AttributeError, match="no attribute 'SQLiteSinkk'"):
        _ = dpone_native_transfer.SQLiteSinkk


def test_submodules_stay_attributes_of_the_package_and_dir_lists_the_public_names():
    """As when ``__init__`` imported them eagerly: ``dpone_native_transfer.runtime`` works."""
    code = (
        "import dpone_native_transfer as d; "
        "print(d.runtime.__name__, d.testing.contract.__name__, dir(d) == sorted(d.__all__))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.split() == [
        f"{PACKAGE}.runtime",
        f"{PACKAGE}.testing.contract",
        "True",
    ]
    with pytest.raises(AttributeError):
        _ = dpone_native_transfer._lazy_nothing


# -- one obvious module each: the hook contract, the boundary, the guard's policy -----------

GUARD = PLUGINS / "dpone_target_commit_guard"
TARGET_HOOKS = {"before_target_mutation", "after_target_success", "on_target_error"}


def _trees() -> dict[str, ast.AST]:
    """Every module of src/ and plugins/, by its path from there."""
    files = [*sorted(SRC.rglob("*.py")), *sorted(PLUGINS.rglob("*.py"))]
    return {
        str(file.relative_to(SRC.parent if SRC in file.parents else PLUGINS)): ast.parse(
            file.read_text(encoding="utf-8")
        )
        for file in files
    }


def _called(tree: ast.AST) -> set[str]:
    """The names of what ``tree`` calls: ``f(...)`` and ``x.f(...)`` both give ``f``."""
    return {
        node.func.id if isinstance(node.func, ast.Name) else node.func.attr
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name | ast.Attribute)
    }


def _named(tree: ast.AST) -> set[str]:
    """Every name and attribute ``tree`` mentions, imports included."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            names.add(node.id)
        elif isinstance(node, ast.Attribute):
            names.add(node.attr)
        elif isinstance(node, ast.alias):
            names.add((node.asname or node.name).split(".")[-1])
    return names


def test_the_hook_contract_is_declared_in_hookspecs_only():
    makers = {"HookspecMarker", "HookimplMarker"}
    declaring = sorted(name for name, tree in _trees().items() if _called(tree) & makers)
    assert declaring == ["dpone_native_transfer/hookspecs.py"]


def test_the_target_hooks_are_fired_by_the_boundary_only():
    """``plugins.py`` is the typed facade the boundary calls them through, nothing else."""
    firing = sorted(name for name, tree in _trees().items() if _called(tree) & TARGET_HOOKS)
    assert firing == ["dpone_native_transfer/boundary.py", "dpone_native_transfer/plugins.py"]


def _guard_trees() -> dict[str, ast.AST]:
    return {
        file.name: ast.parse(file.read_text(encoding="utf-8"))
        for file in sorted(GUARD.glob("*.py"))
    }


def test_what_blocks_a_route_is_decided_in_the_guards_policy_module_only():
    trees = _guard_trees()
    assert {"plugin.py", "policy.py", "payload.py", "commands.py"} <= set(trees)
    refusals = {"ManualReconciliationRequired", "TargetCommitGuardInvalid"}
    assert sorted(name for name, tree in trees.items() if _named(tree) & refusals) == ["policy.py"]
    assert sorted(n for n, tree in trees.items() if "UNRESOLVED_PHASES" in _named(tree)) == [
        "policy.py"
    ]


def test_the_guards_hooks_react_and_leave_every_failure_marker_to_the_policy():
    """The hooks write ARMED before the target and CHECKPOINT_COMMITTED after it; which phase
    and failure code a failed attempt leaves, and what a finding means, is ``policy.py``'s."""
    plugin = _guard_trees()["plugin.py"]
    phases = {
        node.attr
        for node in ast.walk(plugin)
        if isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and node.value.id == "GuardPhase"
    }
    assert phases == {"ARMED", "CHECKPOINT_COMMITTED"}
    named = _named(plugin)
    assert "FailureCode" not in named
    assert not named & {"malformed", "unresolved", "blocked", "problem", "blocked_partitions"}


# -- the first-party plugins use the public API ---------------------------------------------

# The rule: a plugin imports the names of ``dpone_native_transfer.__all__`` from the package
# itself, and anything else only from a module listed here (with the plugin files allowed to
# use it, or None for any). Each entry says why; a module nobody imports any more must leave.
ANY_PLUGIN = None
ALLOWED_MODULES: dict[str, frozenset[str] | None] = {
    # Exit codes, PROG, progress and summary lines: how a command plugin (entry-point group
    # dpone_native_transfer.commands) or a scheduler adapter reports like dpone-transfer.
    f"{PACKAGE}.reporting": ANY_PLUGIN,
    f"{PACKAGE}.wording": ANY_PLUGIN,  # PROG and plural, without reporting's layer
    # Route files, and running one: what a scheduler adapter or an operator command starts from.
    f"{PACKAGE}.config": ANY_PLUGIN,
    f"{PACKAGE}.application": ANY_PLUGIN,
    # Pipeline files: a scheduler adapter maps a task over their tables (PIPELINE::TABLE).
    f"{PACKAGE}.pipeline": ANY_PLUGIN,
    # Not public API: what the target's ledger proves, the operator lease, opening a store
    # by its location and the audit record's keys, shared by the guard's operator commands
    # and `dpone-transfer state`.
    f"{PACKAGE}.audit": frozenset({"dpone_target_commit_guard/commands.py"}),
    # which routes write one target table (the lease's key): verify shows their blocks too
    f"{PACKAGE}.lease": frozenset({"dpone_target_commit_guard/commands.py"}),
    f"{PACKAGE}.ledger": frozenset({"dpone_target_commit_guard/commands.py"}),
    f"{PACKAGE}.recovery": frozenset({"dpone_target_commit_guard/commands.py"}),
    f"{PACKAGE}.stores": frozenset({"dpone_target_commit_guard/commands.py"}),
}


def package_imports(source: str) -> Iterator[tuple[str, str | None]]:
    """(module, name) of every import from the package, even under TYPE_CHECKING or in a
    function; ``import dpone_native_transfer.x`` gives (module, None)."""
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module == PACKAGE or node.module.startswith(f"{PACKAGE}."):
                yield from ((node.module, alias.name) for alias in node.names)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == PACKAGE or alias.name.startswith(f"{PACKAGE}."):
                    yield alias.name, None


def off_the_public_api(plugin_file: str, source: str) -> list[str]:
    public = set(dpone_native_transfer.__all__)
    found = []
    for module, name in package_imports(source):
        if module == PACKAGE:
            if name is not None and name not in public:
                found.append(f"{name} is not in {PACKAGE}.__all__")
        elif name in public:
            found.append(f"{name} from {module}: import it from {PACKAGE}")
        elif module not in ALLOWED_MODULES:
            found.append(f"{module} is not a module plugins may import")
        elif (files := ALLOWED_MODULES[module]) is not None and plugin_file not in files:
            found.append(f"{module} is for {', '.join(sorted(files))} only")
    return [f"{plugin_file}: {problem}" for problem in found]


def _plugin_sources() -> dict[str, str]:
    return {
        str(file.relative_to(PLUGINS)): file.read_text(encoding="utf-8")
        for file in sorted(PLUGINS.rglob("*.py"))
    }


def test_the_public_api_rule_catches_each_way_past_it():
    rogue = (
        "from dpone_native_transfer.latest import LatestCheckpoints\n"
        "from dpone_native_transfer import lease_key\n"
        "from dpone_native_transfer.planner import plan_window\n"
        "import dpone_native_transfer.ledger\n"
        "def f():\n    from dpone_native_transfer.reporting import PROG\n"
    )
    assert off_the_public_api("mine/plugin.py", rogue) == [
        f"mine/plugin.py: LatestCheckpoints from {PACKAGE}.latest: import it from {PACKAGE}",
        f"mine/plugin.py: lease_key is not in {PACKAGE}.__all__",
        f"mine/plugin.py: {PACKAGE}.planner is not a module plugins may import",
        f"mine/plugin.py: {PACKAGE}.ledger is for dpone_target_commit_guard/commands.py only",
    ]


def test_the_first_party_plugins_import_only_the_public_api_and_the_listed_modules():
    sources = _plugin_sources()
    assert [p for file, source in sources.items() for p in off_the_public_api(file, source)] == []
    used = {module for source in sources.values() for module, _ in package_imports(source)}
    assert sorted(set(ALLOWED_MODULES) - used) == [], "an allowed module no plugin imports"


def test_the_guards_hook_modules_need_nothing_beyond_the_public_api_but_prog():
    """What the route scan runs (hooks, policy, payload) is a plugin any author could write."""
    sources = _plugin_sources()
    hook_side = ("plugin.py", "policy.py", "payload.py")
    beyond = {
        (module, name)
        for file in hook_side
        for module, name in package_imports(sources[f"dpone_target_commit_guard/{file}"])
        if module != PACKAGE
    }
    assert beyond == {(f"{PACKAGE}.wording", "PROG")}  # the command named in a refusal


def test_the_guard_and_the_facade_annotate_each_hook_argument_as_its_spec_does():
    """``resume_route_scan`` is passed a ``LatestCheckpoints``, and says so everywhere."""
    from dpone_native_transfer import hookspecs
    from dpone_native_transfer.plugins import Hooks
    from dpone_target_commit_guard import plugin as guard

    for name in TARGET_HOOKS | {"resume_route_scan"}:
        spec = getattr(hookspecs, name).__annotations__
        for implementation in (getattr(guard, name), getattr(Hooks, name)):
            annotations = dict(implementation.__annotations__)
            annotations.pop("return")
            assert annotations == {key: spec[key] for key in annotations}, (name, implementation)
    assert hookspecs.resume_route_scan.__annotations__["checkpoints"] == "LatestCheckpoints"
