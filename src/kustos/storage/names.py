"""Deterministic names of what a StorageCluster creates (pure, no I/O).

Shared with StorageUpgrade and NodeJob: they find the node DaemonSet, its node container,
the StorageClass and the provisioner through these functions, never by guessing.
"""

from __future__ import annotations

from kustos.api.storage import StorageCluster

__all__ = [
    "CLUSTER_LABEL",
    "CSI_DRIVER",
    "FINALIZER",
    "MAINTENANCE_ANNOTATION",
    "init_container_name",
    "node_container_name",
    "node_daemonset",
    "provisioner",
    "scheduler_name",
    "storage_class",
]

MAINTENANCE_ANNOTATION = "kustos.dev/maintenance"
"""Set by a StorageUpgrade (value: its name): the controller then changes none of the
generated objects and reports phase Paused with condition Maintenance=True."""

FINALIZER = "kustos.dev/storagecluster"
"""Held on the StorageCluster until the objects it made outside its namespace are gone."""

CLUSTER_LABEL = "kustos.dev/storage-cluster"
"""On every generated object: ``<namespace>.<name>`` of the StorageCluster that made it."""

CSI_DRIVER = "storage.csi.kustos.dev"
"""The CSI driver name, and the StorageClass provisioner."""

node_container_name = "node"
"""The container of the node DaemonSet that runs ``spec.images.nodeContainer``."""

init_container_name = "init"
"""Its init container."""


def cluster_key(cluster: StorageCluster) -> str:
    """``<namespace>.<name>``: the value of CLUSTER_LABEL (a valid label value)."""
    return f"{cluster.metadata['namespace']}.{cluster.metadata['name']}"


def node_daemonset(cluster: StorageCluster) -> tuple[str, str]:
    """(namespace, name) of the node DaemonSet."""
    return cluster.spec.namespace, f"{cluster.metadata['name']}-node"


def storage_class(cluster: StorageCluster) -> str:
    """The StorageClass the cluster creates."""
    return cluster.spec.storage_class_name


def provisioner(cluster: StorageCluster) -> str:
    """The provisioner of that StorageClass (the CSI driver's name)."""
    return CSI_DRIVER


def scheduler_name(cluster: StorageCluster) -> str:
    """The scheduler the admission webhook puts on pods using the cluster's volumes."""
    return f"{cluster.metadata['name']}-scheduler"
