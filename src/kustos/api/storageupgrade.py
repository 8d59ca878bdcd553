"""StorageUpgrade: an offline upgrade of a StorageCluster's node image (SPEC F-STOR-5)."""

from __future__ import annotations

from typing import Literal

from pydantic import ConfigDict, Field

from kustos.api import refs
from kustos.api.common import Condition, Duration
from kustos.runtime.crd import CRDInfo, CustomResource, KubeModel, PrinterColumn, Rule, kube_schema, list_map

UpgradeStep = Literal[
    "PullImage", "PauseClusterCtrl", "ScaleDown", "RollNodes", "ScaleUp", "Completed", "Failed"
]


class StorageUpgradeSpec(KubeModel):
    """The image to upgrade the storage cluster's nodes to."""

    model_config = ConfigDict(
        json_schema_extra=kube_schema(
            rules=[Rule("self == oldSelf", "a StorageUpgrade's spec cannot change; create a new one")]
        )
    )

    new_image: str = Field(min_length=1, pattern=r"^\S+$")
    """The storage node container image to upgrade to."""
    cluster_name: str | None = Field(default=None, min_length=1)
    """The StorageCluster (in this namespace) to upgrade; the only one there when unset."""
    step_timeout: Duration = "10m"
    """How long pulling the image, or rolling the nodes, may take before the upgrade fails."""


class WorkloadStatus(KubeModel):
    """A Deployment or StatefulSet that uses the cluster's volumes, scaled down for the upgrade."""

    kind: Literal["Deployment", "StatefulSet"]
    namespace: str
    name: str
    replicas: int = Field(ge=0)
    """The replicas it had, restored at the end (also in its kustos.dev/upgrade-replicas annotation)."""
    restored: bool = False
    """Whether it was scaled back up."""


class StorageUpgradeStatus(KubeModel):
    """Where the upgrade is; every step is recorded here before the next starts."""

    step: UpgradeStep | None = None
    """The step in progress (PullImage, PauseClusterCtrl, ScaleDown, RollNodes, ScaleUp), or the end."""
    cluster: str | None = None
    """The StorageCluster being upgraded."""
    previous_image: str | None = None
    """The node image before the upgrade."""
    workloads: list[WorkloadStatus] = Field(default_factory=list)
    """The workloads scaled down, with the replicas they get back."""
    nodes_ready: str | None = None
    """Node pods running the new image and ready, over all node pods, like 2/3."""
    step_start_time: str | None = None
    """When the current step started (for its timeout)."""
    start_time: str | None = None
    completion_time: str | None = None
    message: str | None = None
    """What happened last."""
    conditions: list[Condition] = Field(default_factory=list, json_schema_extra=list_map("type"))
    """Completed, Failed."""


class StorageUpgrade(CustomResource[StorageUpgradeSpec, StorageUpgradeStatus]):
    """An offline upgrade of a StorageCluster: pre-pull, maintenance, scale down, roll, scale up."""

    crd = CRDInfo.of(
        refs.STORAGE_UPGRADES,
        short_names=("supgrade",),
        categories=("kustos",),
        printer_columns=(
            PrinterColumn("IMAGE", ".spec.newImage"),
            PrinterColumn("STEP", ".status.step"),
            PrinterColumn("NODES", ".status.nodesReady", priority=1),
            PrinterColumn("AGE", ".metadata.creationTimestamp", "date"),
        ),
    )
