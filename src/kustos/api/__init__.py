"""The kustos API: one module per kind, pydantic models from which the CRDs are generated.

``RESOURCES`` lists every kind that gets a CRD in deploy/crds/; a new kind adds
itself here (tests/unit/test_crds_current.py fails until deploy/crds/ follows).
"""

from __future__ import annotations

from typing import Any

from kustos.api.backup import EtcdBackup
from kustos.api.etcd import EtcdCluster
from kustos.api.maintenance import MaintenancePolicy
from kustos.api.nodejob import NodeJob
from kustos.api.storage import StorageCluster
from kustos.api.storageupgrade import StorageUpgrade
from kustos.runtime.crd import CustomResource

__all__ = [
    "RESOURCES",
    "EtcdBackup",
    "EtcdCluster",
    "MaintenancePolicy",
    "NodeJob",
    "StorageCluster",
    "StorageUpgrade",
]

RESOURCES: list[type[CustomResource[Any, Any]]] = [
    EtcdCluster,
    EtcdBackup,
    StorageCluster,
    NodeJob,
    StorageUpgrade,
    MaintenancePolicy,
]
