"""Every kind that gets a CRD in deploy/crds/, with its models.

A new kind adds itself here (tests/unit/test_crds_current.py fails until deploy/crds/ follows)
and its coordinates to ``kustos.api.refs``. Importing this builds every kind's models: the CLI,
the chart and the tests need them all, the operator only its loaded families' (they import
their own kinds).
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
