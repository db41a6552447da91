"""Plugin manager factory and the typed facade the runtime calls hooks through."""

from __future__ import annotations

import contextlib
import importlib.metadata
import os
import sys
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

import attrs
import pluggy

from . import hookspecs
from .errors import PluginLoadFailed
from .lifecycle import UnguardedLifecycle

if TYPE_CHECKING:
    from .checkpoints import RouteKey
    from .latest import LatestCheckpoints
    from .mutation import TargetMutation
    from .recovery import TargetRecovery

__all__ = [
    "Hooks",
    "entry_point_plugins",
    "make_plugin_manager",
    "scans_routes",
]

LIFECYCLE_PLUGIN_NAME = "dpone_native_transfer.lifecycle"


def make_plugin_manager(plugins: Iterable[object] | None = None) -> pluggy.PluginManager:
    """A fresh manager: specs, the built-in lifecycle, then plugins.

    ``plugins=None`` loads the entry-point group ``dpone_native_transfer``
    (the target-commit guard is installed there); an explicit iterable
    replaces the entry points (``[*entry_point_plugins(), mine]`` adds to
    them). ``check_pending`` makes a misspelled hook implementation fail
    loudly; a wrapper around a hook whose every implementation must run is
    refused, as it could skip them.
    """
    manager = pluggy.PluginManager(hookspecs.PROJECT_NAME)
    manager.add_hookspecs(hookspecs)
    manager.register(UnguardedLifecycle(), name=LIFECYCLE_PLUGIN_NAME)
    if plugins is None:
        for entry_point in _entry_points():
            if manager.is_blocked(entry_point.name) or manager.has_plugin(entry_point.name):
                continue
            with _loading(entry_point.name, "cannot be imported"):
                manager.register(entry_point.load(), name=entry_point.name)
    else:
        for plugin in plugins:
            reason = "cannot be registered (registered twice, or a hook's arguments differ)"
            with _loading(_name_of(plugin), reason):
                manager.register(plugin)
    try:
        manager.check_pending()
    except pluggy.PluginValidationError as error:
        name = manager.get_name(error.plugin) if plugins is None else _name_of(error.plugin)
        raise _load_failed(name, "implements an unknown hook", error) from None
    for name in EVERY_IMPLEMENTATION_RUNS:
        for impl in getattr(manager.hook, name).get_hookimpls():
            if impl.hookwrapper or impl.wrapper:
                raise PluginLoadFailed(
                    f"plugin {impl.plugin_name!r} wraps hook {name}, whose every implementation "
                    "must run; implement it without a wrapper",
                    diagnostics={"hook": name},
                )
    return manager


def _entry_points() -> tuple[importlib.metadata.EntryPoint, ...]:
    """The group's entry points, read again only when something was installed or removed:
    reading them scans every installed package's metadata (3-8 ms with 170 packages), which
    each runtime, and so each route of a pipeline, paid. Installing or removing a package
    changes its folder on ``sys.path``, so the folders' modification times are the key (and
    the functions that read them: a test replaces them to uninstall the guard)."""
    readers = (importlib.metadata.entry_points, importlib.metadata.distributions)
    key = (readers, tuple(sys.path), tuple(map(_modified, sys.path)))
    found = _read[0]
    if found is None or found[0] != key:
        found = (key, tuple(importlib.metadata.entry_points(group=hookspecs.PROJECT_NAME)))
        _read[0] = found
    return found[1]


def _modified(folder: str) -> int | None:
    try:
        return os.stat(folder or ".").st_mtime_ns
    except OSError:
        return None


_read: list[tuple[tuple, tuple[importlib.metadata.EntryPoint, ...]] | None] = [None]


@contextlib.contextmanager
def _loading(plugin: str | None, reason: str) -> Iterator[None]:
    try:
        yield
    except Exception as error:
        raise _load_failed(plugin, reason, error) from None


def _load_failed(plugin: str | None, reason: str, error: BaseException) -> PluginLoadFailed:
    """Which plugin and why, by category: never the exception's text (it may carry paths)."""
    return PluginLoadFailed(
        f"plugin {plugin!r} {reason}; nothing was read or written",
        diagnostics={"plugin": plugin, "reason": reason, "error_type": type(error).__name__},
    )


def _name_of(plugin: object) -> str:
    return getattr(plugin, "__name__", None) or type(plugin).__name__


def entry_point_plugins() -> list[object]:
    """The plugins ``plugins=None`` would load (the guard among them), to add one's own to."""
    manager = make_plugin_manager(None)
    return [plugin for name, plugin in manager.list_name_plugin() if name != LIFECYCLE_PLUGIN_NAME]


def scans_routes(manager: pluggy.PluginManager) -> bool:
    """True when some plugin implements ``resume_route_scan`` (a guard is installed)."""
    return bool(manager.hook.resume_route_scan.get_hookimpls())


# Target hooks after the call: each implementation runs, whatever another one does, so no
# plugin can pre-empt the guard's promotion or its error marker.
EVERY_IMPLEMENTATION_RUNS = ("after_target_success", "on_target_error")


@attrs.define(eq=False)
class Hooks:
    """Typed calls into the hook relay, so a misspelled keyword is a type error."""

    manager: pluggy.PluginManager

    def resume_route_scan(
        self,
        route: RouteKey,
        checkpoints: LatestCheckpoints,
        recovery: TargetRecovery | None = None,
    ) -> list[Any]:
        return self.manager.hook.resume_route_scan(
            route=route, checkpoints=checkpoints, recovery=recovery
        )

    def before_target_mutation(self, mutation: TargetMutation) -> None:
        self.manager.hook.before_target_mutation(mutation=mutation)

    def after_target_success(self, mutation: TargetMutation, result: Any) -> None:
        self._each("after_target_success", mutation=mutation, result=result)

    def on_target_error(self, mutation: TargetMutation, error: BaseException) -> None:
        self._each("on_target_error", mutation=mutation, error=error)

    def _each(self, name: str, **arguments: Any) -> None:
        """Call every implementation in pluggy's order; then re-raise the first raise, if any."""
        first: BaseException | None = None
        for impl in reversed(getattr(self.manager.hook, name).get_hookimpls()):
            try:
                impl.function(*(arguments[argument] for argument in impl.argnames))
            except BaseException as error:
                if first is None:
                    first = error
        if first is not None:
            raise first
