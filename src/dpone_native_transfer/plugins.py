"""Plugin manager factory and the typed facade the runtime calls hooks through."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

import attrs
import pluggy

from . import hookspecs
from .errors import PluginLoadFailed
from .lifecycle import UnguardedLifecycle

if TYPE_CHECKING:
    from .boundary import TargetMutation
    from .checkpoints import PartitionCheckpoint, RouteKey

__all__ = ["Hooks", "make_plugin_manager"]

LIFECYCLE_PLUGIN_NAME = "dpone_native_transfer.lifecycle"


def make_plugin_manager(plugins: Iterable[object] | None = None) -> pluggy.PluginManager:
    """A fresh manager: specs, the built-in lifecycle, then plugins.

    ``plugins=None`` loads the entry-point group ``dpone_native_transfer``
    (the target-commit guard is installed there); an explicit iterable
    replaces the entry points, so ``[]`` runs with the unguarded lifecycle
    only. ``check_pending`` makes a misspelled hook implementation fail loudly.
    """
    manager = pluggy.PluginManager(hookspecs.PROJECT_NAME)
    manager.add_hookspecs(hookspecs)
    manager.register(UnguardedLifecycle(), name=LIFECYCLE_PLUGIN_NAME)
    try:
        if plugins is None:
            manager.load_setuptools_entrypoints(hookspecs.PROJECT_NAME)
        else:
            for plugin in plugins:
                manager.register(plugin)
        manager.check_pending()
    except Exception as error:
        raise PluginLoadFailed(
            "a plugin could not be loaded or implements an unknown hook",
            diagnostics={"error_type": type(error).__name__},
        ) from None
    return manager


@attrs.define(eq=False)
class Hooks:
    """Typed calls into the hook relay, so a misspelled keyword is a type error."""

    manager: pluggy.PluginManager

    def resume_route_scan(
        self, route: RouteKey, checkpoints: Sequence[PartitionCheckpoint]
    ) -> list[Any]:
        return self.manager.hook.resume_route_scan(route=route, checkpoints=checkpoints)

    def before_target_mutation(self, mutation: TargetMutation) -> None:
        self.manager.hook.before_target_mutation(mutation=mutation)

    def after_target_success(self, mutation: TargetMutation, result: Any) -> Any:
        return self.manager.hook.after_target_success(mutation=mutation, result=result)

    def on_target_error(self, mutation: TargetMutation, error: BaseException) -> Any:
        return self.manager.hook.on_target_error(mutation=mutation, error=error)
