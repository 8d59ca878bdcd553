"""ScalingGroup: one cloud provider instance group (an AWS Auto Scaling Group, a GCP managed
instance group, an Azure scale set) that kustos keeps on its NodeImage's image.

Discovered from the provider and created by the operator; users may edit ``autoscaling``,
``min`` and ``max``. Cluster-scoped.
"""

from __future__ import annotations

from typing import Literal

from pydantic import ConfigDict, Field

from kustos.api import refs
from kustos.api.common import Condition
from kustos.runtime.crd import CRDInfo, CustomResource, KubeModel, PrinterColumn, Rule, kube_schema, list_map


class ScalingGroupSpec(KubeModel):
    """The provider group and the NodeImage its new nodes follow."""

    model_config = ConfigDict(
        json_schema_extra=kube_schema(
            rules=[
                Rule("self.min <= self.max", "min must not exceed max", field_path=".min"),
                Rule("self.groupId == oldSelf.groupId", "groupId cannot change", field_path=".groupId"),
            ]
        )
    )

    group_id: str = Field(min_length=1)
    """The provider's id of the group."""
    role: Literal["ControlPlane", "Worker"]
    """The role of the group's nodes."""
    node_image: str = Field(min_length=1)
    """The NodeImage whose image new instances of the group are created from."""
    autoscaling: bool = False
    """Whether the cluster-autoscaler may scale this group."""
    min: int = Field(default=0, ge=0)
    """The fewest nodes the autoscaler may leave."""
    max: int = Field(default=0, ge=0)
    """The most nodes the autoscaler may create."""


class ScalingGroupStatus(KubeModel):
    """The image the provider reports for the group's new instances."""

    image: str | None = None
    """The group's image at the provider, as last read."""
    instances: int | None = None
    """Instances the provider reports in the group."""
    observed_generation: int | None = None
    conditions: list[Condition] = Field(default_factory=list, json_schema_extra=list_map("type"))
    """ImageInSync (the group creates new instances from the NodeImage's image), Degraded."""


class ScalingGroup(CustomResource[ScalingGroupSpec, ScalingGroupStatus]):
    """A cloud provider instance group kustos keeps on its NodeImage's image."""

    crd = CRDInfo.of(
        refs.SCALING_GROUPS,
        short_names=("sg",),
        categories=("kustos",),
        printer_columns=(
            PrinterColumn("ROLE", ".spec.role"),
            PrinterColumn("GROUP", ".spec.groupId"),
            PrinterColumn("NODEIMAGE", ".spec.nodeImage"),
            PrinterColumn("IMAGE", ".status.image"),
            PrinterColumn("INSTANCES", ".status.instances", "integer"),
            PrinterColumn("AGE", ".metadata.creationTimestamp", "date"),
        ),
    )


__all__ = ["ScalingGroup", "ScalingGroupSpec", "ScalingGroupStatus"]
