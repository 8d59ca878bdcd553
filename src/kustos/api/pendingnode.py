"""PendingNode: an instance joining the cluster (created, no Ready Node yet) or leaving it
(its Node deleted, its instance being terminated). Managed by the operator.

A Join past its deadline is deleted at the provider and its slot freed; a Leave past its
deadline is retried and reported, and never holds a rollout's budget forever.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from kustos.api import refs
from kustos.api.common import Condition
from kustos.runtime.crd import CRDInfo, CustomResource, KubeModel, PrinterColumn, list_map


class PendingNodeSpec(KubeModel):
    """Which instance, which way, and until when."""

    provider_id: str = Field(default="", alias="providerID")
    """The instance, as a Node's spec.providerID names it; empty while a Join waits for the
    instance it asked the provider for to show up (see knownInstances)."""
    group_id: str = Field(min_length=1)
    """The provider group it belongs to."""
    node_name: str = ""
    """The Node it registers (or registered) as, when known."""
    goal: Literal["Join", "Leave"]
    """Join: a new instance on its way to a Ready Node; Leave: an instance being terminated."""
    deadline: str = Field(json_schema_extra={"format": "date-time"})
    """Join: when an instance still not Ready is deleted. Leave: when a still-present instance
    is reported and its termination retried."""
    role: Literal["ControlPlane", "Worker"] = "Worker"
    """The role of the group."""
    known_instances: list[str] = Field(default_factory=list)
    """A Join without providerID: the group's instances before the new one was asked for; the
    first other instance that shows up is this one."""
    node_image: str = ""
    """The NodeImage that asked for the instance."""


class PendingNodeStatus(KubeModel):
    """Where the instance is."""

    phase: Literal["Pending", "Joined", "Left", "DeadlineExceeded"] | None = None
    """Pending, Joined (Ready Node), Left (instance gone), DeadlineExceeded."""
    instance_state: str | None = None
    """What the provider last said of the instance."""
    attempts: int = 0
    """Deletes at the provider (Leave, or a Join past its deadline)."""
    message: str | None = None
    observed_generation: int | None = None
    conditions: list[Condition] = Field(default_factory=list, json_schema_extra=list_map("type"))
    """Degraded (past its deadline)."""


class PendingNode(CustomResource[PendingNodeSpec, PendingNodeStatus]):
    """An instance joining or leaving the cluster."""

    crd = CRDInfo.of(
        refs.PENDING_NODES,
        short_names=("pn",),
        categories=("kustos",),
        printer_columns=(
            PrinterColumn("GOAL", ".spec.goal"),
            PrinterColumn("NODE", ".spec.nodeName"),
            PrinterColumn("PHASE", ".status.phase"),
            PrinterColumn("DEADLINE", ".spec.deadline"),
            PrinterColumn("PROVIDERID", ".spec.providerID", priority=1),
            PrinterColumn("AGE", ".metadata.creationTimestamp", "date"),
        ),
    )


__all__ = ["PendingNode", "PendingNodeSpec", "PendingNodeStatus"]
