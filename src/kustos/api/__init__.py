"""The kustos API: one module per kind, pydantic models from which the CRDs are generated.

``RESOURCES`` lists every kind that gets a CRD in deploy/crds/; a new kind adds
itself here (tests/unit/test_crds_current.py fails until deploy/crds/ follows).
"""

from __future__ import annotations

from typing import Any

from kustos.api.autoscaling import AutoscalingStrategy
from kustos.api.backup import EtcdBackup
from kustos.api.etcd import EtcdCluster
from kustos.api.maintenance import MaintenancePolicy
from kustos.api.nodeimage import NodeImage
from kustos.api.nodejob import NodeJob
from kustos.api.pendingnode import PendingNode
from kustos.api.scalinggroup import ScalingGroup
from kustos.api.storage import StorageCluster
from kustos.api.storageupgrade import StorageUpgrade
from kustos.runtime.crd import CustomResource

__all__ = [
    "RESOURCES",
    "AutoscalingStrategy",
    "EtcdBackup",
    "EtcdCluster",
    "MaintenancePolicy",
    "NodeImage",
    "NodeJob",
    "PendingNode",
    "ScalingGroup",
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
    NodeImage,
    ScalingGroup,
    PendingNode,
    AutoscalingStrategy,
]
