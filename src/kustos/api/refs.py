"""Every kustos kind's REST coordinates, apart from its model.

The operator watches a kind whose family has not loaded (``Manager.load_on_first``) by these
alone: importing a kind's module builds its pydantic models, which an operator running etcd
alone would hold for nothing (issue 28, idle RSS). Each model's ``CRDInfo`` takes its identity
from here (``CRDInfo.of``), so the two cannot disagree.
"""

from __future__ import annotations

from kustos.runtime.crd import DEFAULT_GROUP, DEFAULT_VERSION
from kustos.runtime.refs import ResourceRef


def _kind(plural: str, kind: str, *, namespaced: bool = True) -> ResourceRef:
    return ResourceRef(DEFAULT_GROUP, DEFAULT_VERSION, plural, kind, namespaced)


ETCD_CLUSTERS = _kind("etcdclusters", "EtcdCluster")
ETCD_BACKUPS = _kind("etcdbackups", "EtcdBackup")
STORAGE_CLUSTERS = _kind("storageclusters", "StorageCluster")
STORAGE_UPGRADES = _kind("storageupgrades", "StorageUpgrade")
NODE_JOBS = _kind("nodejobs", "NodeJob")
MAINTENANCE_POLICIES = _kind("maintenancepolicies", "MaintenancePolicy", namespaced=False)
NODE_IMAGES = _kind("nodeimages", "NodeImage", namespaced=False)
SCALING_GROUPS = _kind("scalinggroups", "ScalingGroup", namespaced=False)
PENDING_NODES = _kind("pendingnodes", "PendingNode", namespaced=False)
AUTOSCALING_STRATEGIES = _kind("autoscalingstrategies", "AutoscalingStrategy", namespaced=False)
