"""Models shared by every kustos kind."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from kustos.runtime.crd import IntOrString, KubeModel

__all__ = ["Condition", "ConditionStatus", "IntOrString", "KubeModel"]

ConditionStatus = Literal["True", "False", "Unknown"]

DURATION_PATTERN = r"^([0-9]+(\.[0-9]+)?(ms|s|m|h))+$"  # Go-style: 90s, 5m, 1h30m, 500ms
QUANTITY_PATTERN = r"^[0-9]+(\.[0-9]+)?(Ki|Mi|Gi|Ti|k|M|G|T)?$"  # a storage size: 10Gi

# metav1.Condition's own validation, so a status write that kubectl would reject fails alike.
CONDITION_TYPE_PATTERN = (
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])$"
)
CONDITION_REASON_PATTERN = r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$"


class Condition(KubeModel):
    """One aspect of an object's current state, in the shape of metav1.Condition."""

    type: str = Field(max_length=316, pattern=CONDITION_TYPE_PATTERN)
    """The aspect, in CamelCase: Available, Progressing, Degraded, or a kind-specific one."""
    status: ConditionStatus
    """Whether the condition holds: True, False or Unknown."""
    reason: str = Field(min_length=1, max_length=1024, pattern=CONDITION_REASON_PATTERN)
    """A CamelCase word that machines can match on."""
    message: str = Field(default="", max_length=32768)
    """What a person should know about the transition."""
    last_transition_time: str = Field(json_schema_extra={"format": "date-time"})
    """When the status last changed (RFC 3339)."""
    observed_generation: int | None = Field(default=None, ge=0)
    """The .metadata.generation the condition was set for."""
