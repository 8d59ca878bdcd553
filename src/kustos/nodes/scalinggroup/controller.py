"""The ScalingGroup controller: the group's image at the provider follows its NodeImage (see
planner); one step per pass."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from kustos.api.nodeimage import NodeImage
from kustos.api.scalinggroup import ScalingGroup
from kustos.nodes.scalinggroup import planner
from kustos.nodes.scalinggroup.planner import Missing, Observed, SetImage, Step
from kustos.runtime import objects
from kustos.runtime.cloud import CloudProvider
from kustos.runtime.controller import Controller
from kustos.runtime.deps import Deps
from kustos.runtime.errors import ReconcileError
from kustos.runtime.manager import Manager
from kustos.runtime.reconciler import FamilyReconciler
from kustos.runtime.record import Note

SCALINGGROUPS = ScalingGroup.crd.ref
NODEIMAGES = NodeImage.crd.ref
RESYNC = 30.0
Obj = dict[str, Any]


class ScalingGroupReconciler(FamilyReconciler[ScalingGroup, Observed, Step]):
    model = ScalingGroup

    def __init__(self, manager: Manager, deps: Deps) -> None:
        super().__init__(manager, deps)
        self.cloud: CloudProvider | None = deps.cloud
        self.groups = self.cache
        self.images = manager.informer(NODEIMAGES)

    def settled(self, obj: ScalingGroup) -> bool:
        return self.cloud is None  # without a provider there is no group to look at

    async def observe(self, obj: ScalingGroup, now: datetime) -> Observed:
        assert self.cloud is not None
        group_id = obj.spec.group_id
        image = self.images.get(obj.spec.node_image)
        return Observed(
            group_id=group_id,
            group=next((g for g in await self.cloud.groups() if g.group_id == group_id), None),
            desired=(image.get("spec") or {}).get("image") if image else None,
            previous=obj.status.model_dump(by_alias=True, exclude_none=True) if obj.status else {},
            generation=objects.generation(obj),
        )

    def plan(self, observed: Observed) -> Step:
        return planner.plan(observed)

    async def act(self, obj: ScalingGroup, observed: Observed, step: Step, notes: list[Note]) -> Step:
        assert self.cloud is not None
        match step:
            case Missing():
                raise ReconcileError(f"the provider has no group {observed.group_id!r}", "GroupNotFound")
            case SetImage():
                await self.cloud.set_image(observed.group_id, step.image)
                notes.append(
                    Note("ImageSet", f"new instances of {observed.group_id} are created from {step.image}")
                )
        return step

    def status(self, observed: Observed, step: Step, now: datetime, failure: ReconcileError | None) -> Obj:
        return planner.status(observed, step, now, failure)

    def requeue_after(self, observed: Observed, step: Step) -> float | None:
        return RESYNC


def _groups_of_image(reconciler: ScalingGroupReconciler) -> Any:
    def keys(image: dict[str, Any]) -> list[str]:
        name = objects.name(image)
        return [
            objects.key(g) for g in reconciler.groups.list() if (g.get("spec") or {}).get("nodeImage") == name
        ]

    return keys


def register(manager: Manager, deps: Deps) -> None:
    reconciler = ScalingGroupReconciler(manager, deps)
    controller = Controller("scalinggroup", SCALINGGROUPS, reconciler.reconcile, workers=1)
    controller.watch(NODEIMAGES, _groups_of_image(reconciler))
    manager.add_controller(controller)
