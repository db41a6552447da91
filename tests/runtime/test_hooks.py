"""The hook contract: specs, the typed facade, the fire order, vetoes, error hooks,
every-implementation-runs, plugin loading, and the rule that only the boundary calls the
target."""

from __future__ import annotations

import ast
import importlib.metadata
import inspect
import subprocess
import sys
import types
from pathlib import Path

import pytest

import dpone_native_transfer
from dpone_native_transfer import (
    PluginLoadFailed,
    TargetCommitGuardUnhandled,
    entry_point_plugins,
    hookimpl,
    hookspecs,
)
from dpone_native_transfer.events import EventName
from dpone_native_transfer.plugins import Hooks, make_plugin_manager
from dpone_native_transfer.testing import InjectedFault, build_sample_source, guard_phase

SPEC_MARKER = f"{hookspecs.PROJECT_NAME}_spec"
SRC = Path(dpone_native_transfer.__file__).parent


def spec_functions() -> dict[str, types.FunctionType]:
    return {
        name: value
        for name, value in vars(hookspecs).items()
        if callable(value) and hasattr(value, SPEC_MARKER)
    }


SPEC_NAMES = frozenset(spec_functions())


def guard_module() -> types.ModuleType:
    entry_points = importlib.metadata.entry_points(group=hookspecs.PROJECT_NAME)
    return entry_points["target_commit_guard"].load()


def parameter_names(function) -> list[str]:
    return [name for name in inspect.signature(function).parameters if name != "self"]


class Recorder:
    """Implements every hook, records each call, answers nothing; can veto on request."""

    def __init__(self, veto: BaseException | None = None) -> None:
        self.calls: list[str] = []
        self.arguments: dict[str, dict] = {}
        self.veto = veto

    def _record(self, name: str, **arguments) -> None:
        self.calls.append(name)
        self.arguments[name] = arguments

    @hookimpl
    def resume_route_scan(self, route, checkpoints):
        self._record("resume_route_scan", route=route, checkpoints=list(checkpoints))

    @hookimpl
    def before_target_mutation(self, mutation):
        self._record("before_target_mutation", mutation=mutation)
        if self.veto is not None:
            raise self.veto

    @hookimpl
    def after_target_success(self, mutation, result):
        self._record("after_target_success", mutation=mutation, result=result)

    @hookimpl
    def on_target_error(self, mutation, error):
        self._record("on_target_error", mutation=mutation, error=error)


class Veto(Exception):
    """A third-party plugin's own refusal."""


# -- the spec module is the reference ---------------------------------------


def test_hookspec_names_are_derived_from_the_spec_module():
    assert SPEC_NAMES == {
        "resume_route_scan",
        "before_target_mutation",
        "after_target_success",
        "on_target_error",
    }


@pytest.mark.parametrize("name", sorted(SPEC_NAMES))
def test_every_hookspec_has_a_docstring(name):
    doc = inspect.getdoc(spec_functions()[name])
    assert doc and len(doc.split()) > 10, f"hookspec {name} needs a docstring that is the contract"


@pytest.mark.parametrize("name", sorted(SPEC_NAMES))
def test_no_hook_is_firstresult_so_no_plugin_answers_for_another(name):
    assert getattr(spec_functions()[name], SPEC_MARKER)["firstresult"] is False


def test_the_hooks_whose_every_implementation_runs_say_so_in_their_spec():
    from dpone_native_transfer.plugins import EVERY_IMPLEMENTATION_RUNS

    for name in SPEC_NAMES:
        words = " ".join(inspect.getdoc(spec_functions()[name]).split())
        assert ("Every implementation is called" in words) is (name in EVERY_IMPLEMENTATION_RUNS)


def test_typed_facade_has_exactly_one_method_per_hookspec():
    methods = {
        name
        for name, member in inspect.getmembers(Hooks, inspect.isfunction)
        if not name.startswith("_")
    }
    assert methods == SPEC_NAMES


@pytest.mark.parametrize("name", sorted(SPEC_NAMES))
def test_typed_facade_parameters_match_the_hookspec(name):
    assert parameter_names(getattr(Hooks, name)) == parameter_names(spec_functions()[name])


def test_the_guard_implements_only_known_hooks_with_spec_parameter_names():
    guard = guard_module()
    implemented = {
        name
        for name, value in vars(guard).items()
        if callable(value) and hasattr(value, f"{hookspecs.PROJECT_NAME}_impl")
    }
    assert implemented == SPEC_NAMES
    for name in implemented:
        assert set(parameter_names(getattr(guard, name))) <= set(
            parameter_names(spec_functions()[name])
        )


# -- all hooks, in order ----------------------------------------------------


def test_all_hooks_fire_in_order_on_success(route, path):
    recorder = Recorder()
    result = route.runtime(plugins=[guard_module(), recorder]).run(route.spec(path))
    assert recorder.calls == ["resume_route_scan", "before_target_mutation", "after_target_success"]
    assert recorder.arguments["after_target_success"]["result"] == result.rows_loaded == 120
    mutation = recorder.arguments["before_target_mutation"]["mutation"]
    assert recorder.arguments["after_target_success"]["mutation"] is mutation
    assert mutation.path == path
    assert mutation.state.target_succeeded and mutation.state.armed
    assert {guard_phase(cp) for cp in route.latest()} == {"checkpoint_committed"}


def test_all_hooks_fire_in_order_on_target_error(route, path):
    route.sink.fail = "before"
    recorder = Recorder()
    with pytest.raises(InjectedFault) as info:
        route.runtime(plugins=[guard_module(), recorder]).run(route.spec(path))
    assert info.value is route.sink.error
    assert recorder.calls == ["resume_route_scan", "before_target_mutation", "on_target_error"]
    assert recorder.arguments["on_target_error"]["error"] is route.sink.error
    mutation = recorder.arguments["on_target_error"]["mutation"]
    assert mutation.state.target_started and not mutation.state.target_succeeded
    # the recorder answered None, so the guard still handled the firstresult hook
    assert {guard_phase(cp) for cp in route.latest()} == {"target_outcome_unknown"}


def test_all_hooks_fire_in_order_on_veto(route, path):
    recorder = Recorder(veto=Veto("no"))
    with pytest.raises(Veto):
        route.runtime(plugins=[guard_module(), recorder]).run(route.spec(path))
    assert recorder.calls == ["resume_route_scan", "before_target_mutation", "on_target_error"]
    assert not recorder.arguments["on_target_error"]["mutation"].state.target_started
    assert route.sink.target_calls == 0


@pytest.mark.parametrize("veto_first", [True, False], ids=["veto-registered-first", "guard-first"])
def test_a_veto_after_the_guard_armed_leaves_the_route_retryable(route, path, veto_first):
    """Registration order must not matter: a vetoed mutation never strands armed guards."""
    veto_plugin = VetoPlugin(Veto("refused by policy"))
    plugins = [veto_plugin, guard_module()] if veto_first else [guard_module(), veto_plugin]
    with pytest.raises(Veto):
        route.runtime(plugins=plugins).run(route.spec(path))
    assert {guard_phase(cp) for cp in route.latest()} <= {"failed_before_target"}
    result = route.runtime().run(route.spec(path, run_id="retry"))
    assert len(result.committed_partition_ids) == 4
    assert route.target_ids() == route.source_ids()


def test_success_and_error_runs_together_fire_every_hookspec(route):
    success, failure = Recorder(), Recorder()
    route.runtime(plugins=[guard_module(), success]).run(route.spec("legacy"))
    build_sample_source(route.source_path, rows=8, start_id=500)
    route.sink.fail = "before"
    with pytest.raises(InjectedFault):
        route.runtime(plugins=[guard_module(), failure]).run(route.spec("legacy", run_id="run-2"))
    assert set(success.calls) | set(failure.calls) == SPEC_NAMES


def test_route_scan_sees_every_latest_checkpoint_of_the_route(route):
    route.runtime().run(route.spec("legacy"))
    recorder = Recorder()
    route.runtime(plugins=[guard_module(), recorder]).run(route.spec("legacy", run_id="again"))
    seen = recorder.arguments["resume_route_scan"]
    assert seen["route"] == route.spec("legacy").route
    assert seen["checkpoints"] == route.latest()
    assert recorder.calls == ["resume_route_scan"], "nothing new: no target hooks"


# -- veto -------------------------------------------------------------------


class VetoPlugin:
    def __init__(self, error: BaseException) -> None:
        self.error = error

    @hookimpl
    def before_target_mutation(self, mutation):
        raise self.error


@pytest.mark.parametrize("with_guard", [False, True], ids=["unguarded", "guarded"])
def test_a_veto_stops_the_target_and_reaches_the_caller_unchanged(route, path, with_guard):
    veto = Veto("refused by policy")
    plugins = [guard_module()] if with_guard else []
    with pytest.raises(Veto) as info:
        route.runtime(plugins=[*plugins, VetoPlugin(veto)], unguarded=not with_guard).run(
            route.spec(path)
        )
    assert info.value is veto
    assert route.sink.target_calls == 0
    assert route.target_ids() == []


def test_a_veto_emits_no_target_events(route):
    events = []
    with pytest.raises(Veto):
        route.runtime(plugins=[VetoPlugin(Veto())], events=events.append, unguarded=True).run(
            route.spec("legacy")
        )
    names = [event.name for event in events]
    assert EventName.PRE_TARGET_DONE in names
    assert EventName.TARGET_VETOED in names
    assert EventName.TARGET_STARTED not in names
    assert EventName.EVIDENCE_WRITTEN not in names


# -- a raising error hook is swallowed --------------------------------------


class ErrorHookBoom(Exception):
    pass


class RaisingErrorHook:
    @hookimpl
    def on_target_error(self, mutation, error):
        raise ErrorHookBoom("secret text from the error hook")


@pytest.mark.parametrize("with_guard", [False, True], ids=["unguarded", "guarded"])
def test_a_raising_error_hook_is_swallowed_and_the_original_is_reraised(route, path, with_guard):
    route.sink.fail = "before"
    events = []
    plugins = [guard_module()] if with_guard else []
    runtime = route.runtime(
        plugins=[*plugins, RaisingErrorHook()], events=events.append, unguarded=not with_guard
    )
    with pytest.raises(InjectedFault) as info:
        runtime.run(route.spec(path))
    assert info.value is route.sink.error
    assert any(entry.name == "target_call" for entry in info.traceback), "original traceback kept"
    failed = [event for event in events if event.name == EventName.ERROR_HOOK_FAILED]
    assert len(failed) == 1
    assert dict(failed[0].fields) == {"error_type": "ErrorHookBoom"}
    names = [event.name for event in events]
    assert names.index(EventName.TARGET_FAILED) < names.index(EventName.ERROR_HOOK_FAILED)


def test_a_raising_error_hook_does_not_stop_the_guards_marker(route):
    """The raising hook is registered last, so pluggy calls it first: the guard still runs."""
    from dpone_native_transfer import ManualReconciliationRequired

    route.sink.fail = "after"
    with pytest.raises(InjectedFault):
        route.runtime(plugins=[guard_module(), RaisingErrorHook()]).run(route.spec("legacy"))
    assert {guard_phase(cp) for cp in route.latest()} == {"target_outcome_unknown"}
    route.sink.fail = None
    with pytest.raises(ManualReconciliationRequired):
        route.runtime().run(route.spec("legacy", run_id="retry"))
    assert route.sink.target_calls == 1


# -- the built-in lifecycle steps aside for a batch the guard armed ---------


def test_with_the_guard_the_builtin_promotion_does_not_run(route, path):
    route.runtime().run(route.spec(path))
    assert [guard_phase(batch[0]) for batch in route.store.batches] == [
        "armed",
        "checkpoint_committed",
    ], "a third, unguarded batch would mean the built-in lifecycle ran too"
    assert {guard_phase(cp) for cp in route.latest()} == {"checkpoint_committed"}


def test_without_plugins_the_builtin_lifecycle_promotes_without_a_guard(route, path):
    route.runtime(plugins=[]).run(route.spec(path))
    assert len(route.store.batches) == 1
    latest = route.latest()
    assert len(latest) == 4
    assert all(cp.status == "committed" for cp in latest)
    assert all("target_commit_guard" not in cp.diagnostics for cp in latest)


def test_with_the_guard_the_builtin_error_marker_does_not_run(route):
    route.sink.fail = "before"
    with pytest.raises(InjectedFault):
        route.runtime().run(route.spec("legacy"))
    assert [guard_phase(batch[0]) for batch in route.store.batches] == [
        "armed",
        "target_outcome_unknown",
    ]


# -- make_plugin_manager ----------------------------------------------------


def test_default_manager_finds_the_guard_through_its_entry_point():
    manager = make_plugin_manager()
    assert manager.get_plugin("target_commit_guard") is guard_module()
    assert (
        manager.get_plugin("target_commit_guard") is sys.modules["dpone_target_commit_guard.plugin"]
    )


def test_explicit_empty_plugin_list_registers_only_the_builtin_lifecycle():
    manager = make_plugin_manager([])
    assert manager.get_plugin("target_commit_guard") is None
    assert len(manager.get_plugins()) == 1


def test_each_manager_is_fresh():
    first, second = make_plugin_manager([]), make_plugin_manager([])
    assert first is not second
    first.register(Recorder(), name="only-in-first")
    assert second.get_plugin("only-in-first") is None


class MisspelledHook:
    @hookimpl
    def before_target_mutaton(self, mutation):  # sic
        raise AssertionError("never called")


class MisnamedArgument:
    @hookimpl
    def before_target_mutation(self, mutaton):  # sic
        raise AssertionError("never called")


@pytest.mark.parametrize("plugin", [MisspelledHook(), MisnamedArgument()], ids=type)
def test_a_misspelled_hook_fails_loudly(plugin):
    with pytest.raises(PluginLoadFailed) as info:
        make_plugin_manager([plugin])
    assert info.value.code == "native_transfer_plugin_load_failed"
    assert set(info.value.diagnostics) == {"plugin", "reason", "error_type"}
    assert info.value.diagnostics["plugin"] == type(plugin).__name__  # which one, and why
    assert type(plugin).__name__ in info.value.message


def test_a_misspelled_hook_refuses_the_runtime_before_any_io(route):
    with pytest.raises(PluginLoadFailed):
        route.runtime(plugins=[guard_module(), MisspelledHook()])
    assert route.store.batches == []
    assert route.sink.target_calls == 0


def test_registering_the_same_plugin_object_twice_fails():
    recorder = Recorder()
    with pytest.raises(PluginLoadFailed) as info:
        make_plugin_manager([recorder, recorder])
    assert info.value.code == "native_transfer_plugin_load_failed"
    assert info.value.diagnostics["plugin"] == "Recorder"


def test_registering_the_guard_next_to_its_entry_point_twice_fails():
    with pytest.raises(PluginLoadFailed):
        make_plugin_manager([guard_module(), guard_module()])


# -- the runtime never imports the guard ------------------------------------


def test_no_runtime_source_file_names_the_guard_package():
    offenders = [
        str(file.relative_to(SRC))
        for file in sorted(SRC.rglob("*.py"))
        if "dpone_target_commit_guard" in file.read_text(encoding="utf-8")
    ]
    assert offenders == []


CHECK_IMPORT = (
    "import sys\n"
    "import dpone_native_transfer\n"
    "from dpone_native_transfer.plugins import make_plugin_manager\n"
    "make_plugin_manager({plugins})\n"
    "print('dpone_target_commit_guard' in sys.modules)\n"
)


@pytest.mark.parametrize(
    ("plugins", "imported"),
    [("[]", "False"), ("None", "True")],  # None: the entry point imports it, as a control
)
def test_a_fresh_process_imports_the_guard_only_through_the_entry_point(plugins, imported):
    completed = subprocess.run(
        [sys.executable, "-c", CHECK_IMPORT.format(plugins=plugins)],
        capture_output=True,
        text=True,
        check=True,
    )
    assert completed.stdout.strip() == imported


# -- only the boundary calls the target -------------------------------------

TARGET_METHODS = {"load", "finalize_staged_load", "load_plan"}


def _is_sink(node: ast.expr) -> bool:
    """``ctx.sink``, ``sink``, ``engine`` or ``sink.engine()``: what holds a target call."""
    if isinstance(node, ast.Call):
        return isinstance(node.func, ast.Attribute) and node.func.attr == "engine"
    return (isinstance(node, ast.Attribute) and node.attr == "sink") or (
        isinstance(node, ast.Name) and node.id in ("sink", "engine")
    )


def _target_methods(tree: ast.AST) -> list[ast.Attribute]:
    """Every mention of a target call of a sink or its engine: called, or passed on."""
    return [
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute) and node.attr in TARGET_METHODS and _is_sink(node.value)
    ]


def _handed_to_mutate(method: ast.Attribute, parents: dict[ast.AST, ast.AST]) -> bool:
    """Whether the target call is handed to ``ctx.mutate(operation, call, ...)`` itself, for
    the boundary to call, rather than called (anywhere, in a lambda too)."""
    parent = parents.get(method)
    return (
        isinstance(parent, ast.Call)
        and isinstance(parent.func, ast.Attribute)
        and parent.func.attr == "mutate"
        and len(parent.args) > 1
        and parent.args[1] is method
    )


def _scan(source: str, filename: str) -> list[tuple[str, int, bool]]:
    tree = ast.parse(source, filename)
    parents = {child: parent for parent in ast.walk(tree) for child in ast.iter_child_nodes(parent)}
    return [
        (filename, method.lineno, _handed_to_mutate(method, parents))
        for method in _target_methods(tree)
    ]


def test_the_scanner_catches_a_direct_sink_call():
    rogue = "def rogue_path(ctx):\n    return ctx.sink.load(ctx.row_chunks([]))\n"
    wrapped = "def path(ctx):\n    return ctx.mutate('load', lambda: ctx.sink.load(p))\n"
    fine = "def path(ctx):\n    return ctx.mutate('load', ctx.sink.load, p, sent=1)\n"
    engine = "def path(ctx):\n    return ctx.mutate('load', ctx.sink.engine().load_plan, p)\n"
    assert _scan(rogue, "rogue.py") == [("rogue.py", 2, False)]
    assert _scan(wrapped, "wrapped.py") == [("wrapped.py", 2, False)]
    assert _scan(fine, "fine.py") == [("fine.py", 2, True)]
    assert _scan(engine, "engine.py") == [("engine.py", 2, True)]


def test_only_the_boundary_calls_the_target():
    connectors = SRC / "connectors"
    found = []
    for file in sorted(SRC.rglob("*.py")):
        if connectors in file.parents:
            continue  # the sink implementation itself
        found += _scan(file.read_text(encoding="utf-8"), str(file.relative_to(SRC)))
    assert len(found) >= 4, "every built-in path reaches the target once"
    outside = [(name, line) for name, line, inside in found if not inside]
    assert outside == [], "a target call not handed to ctx.mutate(operation, call, ...)"


# -- the guard must not vanish silently -------------------------------------


def test_unresolved_guards_without_the_guard_plugin_refuse_to_run(route, path):
    route.sink.fail = "after"
    with pytest.raises(InjectedFault):
        route.runtime().run(route.spec(path))
    route.sink.fail = None
    with pytest.raises(TargetCommitGuardUnhandled) as info:
        route.runtime(plugins=[]).run(route.spec(path, run_id="retry"))
    assert info.value.code == "native_transfer_target_commit_guard_unhandled"
    assert sorted(info.value.diagnostics["partition_ids"]) == sorted(
        cp.partition_id for cp in route.latest()
    )
    assert route.sink.target_calls == 1
    assert route.target_ids() == route.source_ids()


def test_committed_guards_without_the_guard_plugin_refuse_to_run(route):
    route.runtime().run(route.spec("legacy"))
    build_sample_source(route.source_path, rows=10, start_id=500)
    calls_before, batches_before = route.sink.target_calls, len(route.store.batches)
    with pytest.raises(TargetCommitGuardUnhandled):
        route.runtime(plugins=[]).run(route.spec("legacy", run_id="run-2"))
    assert route.sink.target_calls == calls_before
    assert len(route.store.batches) == batches_before


def test_a_plugin_that_does_not_claim_the_route_scan_does_not_hide_missing_guards(route):
    route.runtime().run(route.spec("legacy"))
    with pytest.raises(TargetCommitGuardUnhandled):
        route.runtime(plugins=[Recorder()]).run(route.spec("legacy", run_id="run-2"))


def test_a_route_without_guards_runs_with_no_plugins(route, path):
    first = route.runtime(plugins=[]).run(route.spec(path))
    build_sample_source(route.source_path, rows=10, start_id=500)
    second = route.runtime(plugins=[]).run(route.spec(path, run_id="run-2"))
    assert len(first.committed_partition_ids) == 4
    assert second.rows_loaded == 10
    assert route.target_ids() == route.source_ids()


def test_a_worker_whose_guard_entry_point_is_missing_refuses_guarded_routes(route, monkeypatch):
    """plugins=None on a machine where the guard is not installed: no entry point at all."""
    route.runtime().run(route.spec("legacy"))
    monkeypatch.setattr(importlib.metadata, "distributions", lambda: [])
    runtime = route.runtime()
    assert runtime.plugin_manager.get_plugin("target_commit_guard") is None
    with pytest.raises(TargetCommitGuardUnhandled):
        runtime.run(route.spec("legacy", run_id="run-2"))
    assert route.sink.target_calls == 1


def test_a_fresh_route_without_the_guards_entry_point_stops_before_any_io(route, monkeypatch):
    """Issue 13.4: a broken install used to run fresh routes unguarded, silently."""
    monkeypatch.setattr(importlib.metadata, "distributions", lambda: [])
    with pytest.raises(TargetCommitGuardUnhandled) as info:
        route.runtime().run(route.spec("legacy"))
    assert "plugins=[]" in str(info.value) and "--unguarded" in str(info.value)
    assert route.store.batches == [] and route.sink.target_calls == 0
    assert route.real_store.list_routes() == []


def test_adding_ones_own_plugin_without_the_guard_is_refused_not_unguarded(route):
    with pytest.raises(TargetCommitGuardUnhandled):
        route.runtime(plugins=[Recorder()]).run(route.spec("legacy"))
    assert route.sink.target_calls == 0
    result = route.runtime(plugins=[*entry_point_plugins(), Recorder()]).run(route.spec("legacy"))
    assert result.guarded and {guard_phase(cp) for cp in route.latest()} == {"checkpoint_committed"}


def test_only_an_explicit_request_runs_unguarded_and_the_result_says_so(route):
    assert route.runtime(plugins=[]).run(route.spec("legacy")).guarded is False
    build_sample_source(route.source_path, rows=10, start_id=500)
    plain = route.runtime(plugins=[Recorder()], unguarded=True)
    assert plain.run(route.spec("legacy", run_id="run-2")).guarded is False
    assert route.target_ids() == route.source_ids()


# -- hostile plugins and listeners cannot pre-empt or drop the guard ----------


class AnswersFirst:
    """Answers the after-call hooks first (tryfirst, registered last) and does nothing."""

    @hookimpl(tryfirst=True)
    def after_target_success(self, mutation, result):
        return True

    @hookimpl(tryfirst=True)
    def on_target_error(self, mutation, error):
        return True


class RaisesFirst:
    def __init__(self, error: BaseException) -> None:
        self.error = error

    @hookimpl(tryfirst=True)
    def after_target_success(self, mutation, result):
        raise self.error

    @hookimpl(tryfirst=True)
    def on_target_error(self, mutation, error):
        raise self.error


def test_a_plugin_answering_first_cannot_skip_the_guards_promotion(route, path):
    result = route.runtime(plugins=[guard_module(), AnswersFirst()]).run(route.spec(path))
    assert {guard_phase(cp) for cp in route.latest()} == {"checkpoint_committed"}
    assert len(result.committed_partition_ids) == 4
    assert route.store.load_source_state(route.spec(path).route) is not None


def test_a_plugin_answering_first_cannot_skip_the_guards_error_marker(route, path):
    route.sink.fail = "after"
    with pytest.raises(InjectedFault):
        route.runtime(plugins=[guard_module(), AnswersFirst()]).run(route.spec(path))
    assert {guard_phase(cp) for cp in route.latest()} == {"target_outcome_unknown"}


def test_a_plugin_raising_first_in_the_success_hook_still_lets_the_guard_promote(route):
    boom = ErrorHookBoom("hostile")
    with pytest.raises(ErrorHookBoom) as info:
        route.runtime(plugins=[guard_module(), RaisesFirst(boom)]).run(route.spec("legacy"))
    assert info.value is boom
    assert {guard_phase(cp) for cp in route.latest()} == {"checkpoint_committed"}
    assert route.store.load_source_state(route.spec("legacy").route) is None, "run stopped"
    again = route.runtime().run(route.spec("legacy", run_id="again"))
    assert again.rows_loaded == 0 and route.target_ids() == route.source_ids()


@pytest.mark.parametrize("hostile", [KeyboardInterrupt(), SystemExit(3), ErrorHookBoom("x")])
def test_whatever_an_error_hook_raises_the_original_error_and_marker_win(route, hostile):
    route.sink.fail = "after"
    with pytest.raises(InjectedFault) as info:
        route.runtime(plugins=[guard_module(), RaisesFirst(hostile)]).run(route.spec("legacy"))
    assert info.value is route.sink.error
    assert {guard_phase(cp) for cp in route.latest()} == {"target_outcome_unknown"}


def test_a_plugin_that_arms_but_never_promotes_stops_the_run_before_state(route):
    """A third-party guard that claims the scan and arms, then forgets to promote."""

    class Forgetful:
        @hookimpl
        def resume_route_scan(self, route, checkpoints):
            return True

        @hookimpl
        def before_target_mutation(self, mutation):
            mutation.state.armed = True

    with pytest.raises(TargetCommitGuardUnhandled) as info:
        route.runtime(plugins=[Forgetful()]).run(route.spec("legacy"))
    assert "not promoted" in str(info.value)
    assert route.store.load_source_state(route.spec("legacy").route) is None


def test_a_wrapper_around_an_after_call_hook_is_refused_at_registration():
    class Wraps:
        @hookimpl(wrapper=True)
        def after_target_success(self, mutation, result):
            return (yield)

    with pytest.raises(PluginLoadFailed) as info:
        make_plugin_manager([guard_module(), Wraps()])
    assert info.value.diagnostics == {"hook": "after_target_success"}


def _raising_listener(at: str | None, error: BaseException):
    def listener(event):
        if at is None or event.name == at:
            raise error

    return listener


@pytest.mark.parametrize("at", [None, EventName.TARGET_STARTED, EventName.GUARD_ARMED])
def test_a_raising_listener_never_changes_the_run(route, path, at):
    """Issue 13: a progress listener raising at target_started left a false armed block."""
    listener = _raising_listener(at, ErrorHookBoom("listener"))
    result = route.runtime(events=listener).run(route.spec(path))
    assert len(result.committed_partition_ids) == 4
    assert {guard_phase(cp) for cp in route.latest()} == {"checkpoint_committed"}
    failed = [e for e in result.events if e.name == EventName.LISTENER_FAILED]
    assert failed and all(e.fields["error_type"] == "ErrorHookBoom" for e in failed)
    assert route.target_ids() == route.source_ids()


@pytest.mark.parametrize("hostile", [KeyboardInterrupt(), ErrorHookBoom("listener")])
def test_a_listener_raising_in_the_error_path_never_replaces_the_original(route, hostile):
    route.sink.fail = "after"
    listener = _raising_listener(EventName.TARGET_FAILED, hostile)
    with pytest.raises(InjectedFault) as info:
        route.runtime(events=listener).run(route.spec("legacy"))
    assert info.value is route.sink.error
    assert {guard_phase(cp) for cp in route.latest()} == {"target_outcome_unknown"}


def test_an_entry_point_that_cannot_be_imported_is_named(monkeypatch):
    """PluginLoadFailed said only 'a plugin could not be loaded' and the exception's type."""
    import importlib.metadata

    broken = importlib.metadata.EntryPoint(
        name="broken_plugin", value="no_such_module_for_dpone:plugin", group="dpone_native_transfer"
    )
    monkeypatch.setattr(importlib.metadata, "entry_points", lambda group=None: [broken])
    with pytest.raises(PluginLoadFailed) as info:
        make_plugin_manager(None)
    assert info.value.diagnostics == {
        "plugin": "broken_plugin",
        "reason": "cannot be imported",
        "error_type": "ModuleNotFoundError",
    }
    assert "no_such_module_for_dpone" not in info.value.message  # never the exception's text
