"""Every controller kustos runs, registered on a manager by ``kustos run``.

Each family exposes ``register(manager: Manager, deps: Deps) -> None``; ``kustos run``
builds one ``Deps`` (the clock, settings) and hands it to all of them.

A family whose kind has no object yet is not imported: it loads on the first object of that
kind (``Manager.load_on_first``), so an operator that runs etcd alone does not hold the node,
storage and maintenance families' modules, watches and caches (issue 28, idle RSS). Only a
family that does nothing before its first object may wait; these stay loaded from the start:

- the etcd families, the reason most users run kustos;
- Envoy restarts, which act with no MaintenancePolicy at all (their defaults restart
  ``app=envoy`` pods), and pod image overrides, which remove their own webhook configuration
  when no policy asks for it;
- the webhooks the chart registers before any object exists (``Family.serves_at_start``):
  the StorageCluster scheduler answers every pod's creation, loaded or not.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass

from kustos.api import refs
from kustos.metrics import collector as domain_metrics
from kustos.runtime.deps import Deps
from kustos.runtime.informer import ResourceRef
from kustos.runtime.manager import Manager

Register = Callable[[Manager, Deps], None]


@dataclass(frozen=True)
class Family:
    register: str
    """``module:function`` registering the family's controllers, imported only when needed."""
    loads_on: ResourceRef | None = None
    """Registered on the first object of this kind (None: at start)."""
    serves_at_start: str | None = None
    """``module:function`` registering the family's webhooks at start, however late it loads."""

    @property
    def module(self) -> str:
        return self.register.partition(":")[0]


CONTROLLERS: dict[str, Family] = {
    "etcdcluster": Family("kustos.etcd.controller:register"),
    "etcdbackup": Family("kustos.etcd.backup_controller:register"),
    "etcdmaintenance": Family("kustos.etcd.defragmentation_controller:register"),
    "storagecluster": Family(
        "kustos.storage.controller:register", refs.STORAGE_CLUSTERS, "kustos.storage.webhook:register"
    ),
    "nodejob": Family("kustos.nodejob.controller:register", refs.NODE_JOBS),
    "storageupgrade": Family("kustos.storage.upgrade_controller:register", refs.STORAGE_UPGRADES),
    "maintenance": Family("kustos.maintenance.controller:register", refs.MAINTENANCE_POLICIES),
    "nodeimage": Family("kustos.nodes.nodeimage.controller:register", refs.NODE_IMAGES),
    "scalinggroup": Family("kustos.nodes.scalinggroup.controller:register", refs.SCALING_GROUPS),
    "pendingnode": Family("kustos.nodes.pendingnode.controller:register", refs.PENDING_NODES),
    "autoscalingstrategy": Family(
        "kustos.nodes.autoscaling.controller:register", refs.AUTOSCALING_STRATEGIES
    ),
    "envoyrestart": Family("kustos.maintenance.envoy_controller:register"),
    "imageoverrides": Family("kustos.maintenance.image_overrides_controller:register"),
}


def register_all(manager: Manager, deps: Deps | None = None, names: list[str] | None = None) -> None:
    """Register the named controllers (all when None); an unknown name is an error."""
    deps = deps or Deps()
    chosen = list(CONTROLLERS) if names is None else names
    unknown = [n for n in chosen if n not in CONTROLLERS]
    if unknown:
        raise ValueError(f"unknown controllers {unknown}; known: {sorted(CONTROLLERS)}")
    for name in chosen:
        family = CONTROLLERS[name]
        if family.serves_at_start is not None:
            resolve(family.serves_at_start)(manager, deps)
        if family.loads_on is None:
            resolve(family.register)(manager, deps)
        else:
            load = _loader(family.register, manager, deps)
            manager.load_on_first(family.loads_on, load, f"controller {name}")
    # The domain metrics read the caches these controllers share (docs/metrics.md).
    domain_metrics.register(manager, chosen, deps.clock)


def resolve(target: str) -> Register:
    """The registration function ``module:function`` names, its module imported now."""
    module, _, function = target.partition(":")
    register: Register = getattr(importlib.import_module(module), function)
    return register


def _loader(target: str, manager: Manager, deps: Deps) -> Callable[[], None]:
    return lambda: resolve(target)(manager, deps)
