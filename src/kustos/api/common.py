"""Models shared by every kustos kind."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import AfterValidator, Field

from kustos.runtime.crd import IntOrString, KubeModel, Rule, kube_schema
from kustos.runtime.times import parse_duration

__all__ = ["Condition", "ConditionStatus", "Duration", "IntOrString", "KubeModel"]

ConditionStatus = Literal["True", "False", "Unknown"]

DURATION_PATTERN = r"^([0-9]+(\.[0-9]+)?(ms|s|m|h))+$"  # Go-style: 90s, 5m, 1h30m, 500ms
QUANTITY_PATTERN = r"^[0-9]+(\.[0-9]+)?(Ki|Mi|Gi|Ti|k|M|G|T)?$"  # a storage size: 10Gi
_HOST = r"([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?|\[[0-9A-Fa-f:.]+\])(:[0-9]{1,5})?"
HTTP_URL_PATTERN = rf"^https?://{_HOST}(/\S*)?$"  # a host is required: https://s3.example:9000/x
ENDPOINT_PATTERN = rf"^https?://{_HOST}/?$"  # an etcd client URL: http://10.0.0.5:2379
MAX_DURATION = "87600h"
CRON_PATTERN = r"^\S+(\s+\S+){4}$"  # five fields (UTC); the admission webhook checks the rest
"""Ten years: more than any timeout, interval or lifetime kustos takes, and far inside what Go's
durations (292 years) and Python's timedelta hold: a slip of the keyboard is refused by the
API server, naming the field, instead of overflowing in the operator or in etcd."""


def _at_most_max_duration(text: str) -> str:
    try:
        too_long = parse_duration(text) > parse_duration(MAX_DURATION)
    except OverflowError:
        too_long = True
    if too_long:
        raise ValueError(f"must be at most {MAX_DURATION} (ten years)")
    return text


Duration = Annotated[
    str,
    Field(
        pattern=DURATION_PATTERN,
        max_length=64,
        json_schema_extra=kube_schema(
            rules=[
                Rule(
                    f"duration(self) <= duration('{MAX_DURATION}')",
                    f"must be at most {MAX_DURATION} (ten years)",
                )
            ]
        ),
    ),
    AfterValidator(_at_most_max_duration),
]
"""A Go-style duration (90s, 5m, 1h30m, 500ms) of at most ``MAX_DURATION``."""

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
