"""AutoscalingStrategy: the cluster-autoscaler Deployment kustos pauses during a node image
rollout, and the replicas the user had, restored afterwards. Cluster-scoped."""

from __future__ import annotations

from pydantic import Field

from kustos.api import refs
from kustos.api.common import Condition
from kustos.runtime.crd import CRDInfo, CustomResource, KubeModel, PrinterColumn, list_map

PAUSED_ANNOTATION = "kustos.dev/autoscaler-paused-replicas"
"""On the Deployment while kustos holds it at 0: the replicas the user had (restored after)."""


class AutoscalingStrategySpec(KubeModel):
    """Which Deployment is the cluster-autoscaler."""

    enabled: bool = True
    """Pause the autoscaler while a rollout is under way."""
    deployment_name: str = Field(default="cluster-autoscaler", min_length=1)
    """The cluster-autoscaler's Deployment."""
    deployment_namespace: str = Field(default="kube-system", min_length=1)
    """Its namespace."""


class AutoscalingStrategyStatus(KubeModel):
    """Whether kustos holds the autoscaler paused."""

    paused: bool = False
    """True while kustos holds the Deployment at 0 replicas."""
    saved_replicas: int | None = None
    """The replicas the user had before the pause (also on the Deployment, annotated)."""
    replicas: int | None = None
    """The Deployment's replicas, as last read."""
    observed_generation: int | None = None
    conditions: list[Condition] = Field(default_factory=list, json_schema_extra=list_map("type"))
    """Paused, Degraded (the Deployment is missing)."""


class AutoscalingStrategy(CustomResource[AutoscalingStrategySpec, AutoscalingStrategyStatus]):
    """The cluster-autoscaler kustos pauses during rollouts."""

    crd = CRDInfo.of(
        refs.AUTOSCALING_STRATEGIES,
        short_names=("as",),
        categories=("kustos",),
        printer_columns=(
            PrinterColumn("ENABLED", ".spec.enabled", "boolean"),
            PrinterColumn("DEPLOYMENT", ".spec.deploymentName"),
            PrinterColumn("PAUSED", ".status.paused", "boolean"),
            PrinterColumn("SAVED", ".status.savedReplicas", "integer"),
            PrinterColumn("AGE", ".metadata.creationTimestamp", "date"),
        ),
    )


__all__ = ["PAUSED_ANNOTATION", "AutoscalingStrategy", "AutoscalingStrategySpec", "AutoscalingStrategyStatus"]
