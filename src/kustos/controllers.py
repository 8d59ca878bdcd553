"""Every controller kustos runs, registered on a manager by ``kustos run``.

Each family exposes ``register(manager: Manager, deps: Deps) -> None``; ``kustos run``
builds one ``Deps`` (the clock, settings) and hands it to all of them.
"""

from __future__ import annotations

from collections.abc import Callable

from kustos.etcd import backup_controller
from kustos.etcd import controller as etcd_controller
from kustos.etcd.defragmentation_controller import register as register_defragmentation
from kustos.maintenance import controller as maintenance_controller
from kustos.maintenance import envoy_controller, image_overrides_controller
from kustos.metrics import collector as domain_metrics
from kustos.nodejob import controller as nodejob_controller
from kustos.nodes.autoscaling import controller as autoscaling_controller
from kustos.nodes.nodeimage import controller as nodeimage_controller
from kustos.nodes.pendingnode import controller as pendingnode_controller
from kustos.nodes.scalinggroup import controller as scalinggroup_controller
from kustos.runtime.deps import Deps
from kustos.runtime.manager import Manager
from kustos.storage import controller as storage_controller
from kustos.storage import upgrade_controller as storageupgrade_controller

Register = Callable[[Manager, Deps], None]


CONTROLLERS: dict[str, Register] = {
    "etcdcluster": etcd_controller.register,
    "etcdbackup": backup_controller.register,
    "etcdmaintenance": register_defragmentation,
    "storagecluster": storage_controller.register,
    "nodejob": nodejob_controller.register,
    "storageupgrade": storageupgrade_controller.register,
    "maintenance": maintenance_controller.register,
    "nodeimage": nodeimage_controller.register,
    "scalinggroup": scalinggroup_controller.register,
    "pendingnode": pendingnode_controller.register,
    "autoscalingstrategy": autoscaling_controller.register,
    "envoyrestart": envoy_controller.register,
    "imageoverrides": image_overrides_controller.register,
}


def register_all(manager: Manager, deps: Deps | None = None, names: list[str] | None = None) -> None:
    """Register the named controllers (all when None); an unknown name is an error."""
    deps = deps or Deps()
    chosen = list(CONTROLLERS) if names is None else names
    unknown = [n for n in chosen if n not in CONTROLLERS]
    if unknown:
        raise ValueError(f"unknown controllers {unknown}; known: {sorted(CONTROLLERS)}")
    for name in chosen:
        CONTROLLERS[name](manager, deps)
    # The domain metrics read the caches these controllers share (docs/metrics.md).
    domain_metrics.register(manager, chosen, deps.clock)
