"""The ScalingGroup planner. Pure.

The image new instances of the provider's group are created from follows the group's
NodeImage: the NodeImage controller waits for it before it asks the group for a heir, so no
heir is born outdated.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from kustos.runtime.cloud import Group
from kustos.runtime.conditions import note_failure, set_condition
from kustos.runtime.errors import ReconcileError
from kustos.runtime.steps import Done, Wait


@dataclass(frozen=True)
class Observed:
    group_id: str
    group: Group | None
    """The provider's group (None: the provider has none of that ID)."""
    desired: str | None
    """The NodeImage's image (None: no such NodeImage)."""
    previous: Mapping[str, Any] = field(default_factory=dict)
    generation: int | None = None


@dataclass(frozen=True)
class SetImage:
    image: str


@dataclass(frozen=True)
class Missing:
    """The provider has no group of the spec's ID."""


Step = SetImage | Missing | Wait | Done


def want_image(current: str, desired: str | None) -> str | None:
    """The image to set (None: nothing to do)."""
    if not desired or current == desired:
        return None
    return desired


def plan(o: Observed) -> Step:
    if o.group is None:
        return Missing()
    target = want_image(o.group.image, o.desired)
    return SetImage(target) if target is not None else Done()


def status(o: Observed, step: Step, now: datetime, failure: ReconcileError | None = None) -> dict[str, Any]:
    """The whole status after ``step`` (acted on unless ``failure`` says it failed)."""
    result: dict[str, Any] = dict(o.previous)
    if o.group is not None:
        result["image"], result["instances"] = o.group.image, o.group.desired
    if isinstance(step, SetImage) and failure is None:
        result["image"] = step.image
    in_sync = o.desired is not None and result.get("image") == o.desired
    if in_sync:
        reason, message = "InSync", f"new instances use {o.desired}"
    else:
        reason, message = "NotInSync", f"image {result.get('image')}, NodeImage wants {o.desired}"
    conditions = set_condition(
        result.get("conditions"), "ImageInSync", in_sync, reason, message, o.generation, now
    )
    result["conditions"] = note_failure(conditions, failure, now, o.generation, "Degraded")
    return result


__all__ = ["Missing", "Observed", "SetImage", "Step", "plan", "status", "want_image"]
