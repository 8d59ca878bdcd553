"""Every controller kustos runs, registered on a manager by ``kustos run``.

Each family exposes ``register(manager: Manager, deps: Deps) -> None``; ``kustos run``
builds one ``Deps`` (the clock, settings) and hands it to all of them.
"""

from __future__ import annotations

from collections.abc import Callable

from kustos.etcd import backup_controller
from kustos.etcd import controller as etcd_controller
from kustos.etcd.maintenance_controller import register as register_maintenance
from kustos.maintenance import controller as maintenance_controller
from kustos.nodejob import controller as nodejob_controller
from kustos.runtime.deps import Deps
from kustos.runtime.manager import Manager
from kustos.storage import controller as storage_controller
from kustos.storage import upgrade_controller as storageupgrade_controller

Register = Callable[[Manager, Deps], None]


CONTROLLERS: dict[str, Register] = {
    "etcdcluster": etcd_controller.register,
    "etcdbackup": backup_controller.register,
    "etcdmaintenance": register_maintenance,
    "storagecluster": storage_controller.register,
    "nodejob": nodejob_controller.register,
    "storageupgrade": storageupgrade_controller.register,
    "maintenance": maintenance_controller.register,
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
