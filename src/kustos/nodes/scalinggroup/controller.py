"""The ScalingGroup controller: the group's image at the provider follows its NodeImage.

One step per pass: if the provider creates new instances of the group from another image
than the NodeImage's, set it (the NodeImage controller waits for this before it asks the
group for a heir, so no heir is born outdated).
"""

from __future__ import annotations

from typing import Any

from kustos.api.nodeimage import NodeImage
from kustos.api.scalinggroup import ScalingGroup
from kustos.runtime import objects
from kustos.runtime.cloud import CloudProvider
from kustos.runtime.conditions import set_condition
from kustos.runtime.controller import Controller, Result
from kustos.runtime.deps import Deps
from kustos.runtime.errors import ReconcileError
from kustos.runtime.manager import Manager
from kustos.runtime.record import Note, note_failure, record

SCALINGGROUPS = ScalingGroup.crd.ref
NODEIMAGES = NodeImage.crd.ref
RESYNC = 30.0


def want_image(current: str, desired: str | None) -> str | None:
    """The image to set (None: nothing to do). Pure."""
    if not desired or current == desired:
        return None
    return desired


class ScalingGroupReconciler:
    def __init__(self, manager: Manager, deps: Deps) -> None:
        self.manager = manager
        self.api = manager.api
        self.clock = deps.clock
        self.cloud: CloudProvider | None = deps.cloud
        self.groups = manager.informer(SCALINGGROUPS)
        self.images = manager.informer(NODEIMAGES)

    async def reconcile(self, key: str) -> Result | None:
        raw = self.groups.get(key)
        if raw is None or objects.deleting(raw) or self.cloud is None:
            return None
        spec = raw.get("spec") or {}
        group_id = spec.get("groupId", "")
        image = self.images.get(spec.get("nodeImage", ""))
        desired = (image.get("spec") or {}).get("image") if image else None
        status: dict[str, Any] = dict(raw.get("status") or {})
        now = self.clock.now()
        notes: list[Note] = []
        failure: ReconcileError | None = None
        try:
            group = next((g for g in await self.cloud.groups() if g.group_id == group_id), None)
            if group is None:
                raise ReconcileError(f"the provider has no group {group_id!r}", "GroupNotFound")
            status["image"], status["instances"] = group.image, group.desired
            target = want_image(group.image, desired)
            if target is not None:
                await self.cloud.set_image(group_id, target)
                status["image"] = target
                notes.append(Note("ImageSet", f"new instances of {group_id} are created from {target}"))
        except ReconcileError as err:
            failure = err
        in_sync = desired is not None and status.get("image") == desired
        message = (
            f"new instances use {desired}"
            if in_sync
            else f"image {status.get('image')}, NodeImage wants {desired}"
        )
        reason = "InSync" if in_sync else "NotInSync"
        generation = objects.generation(raw)
        conditions = set_condition(
            status.get("conditions"), "ImageInSync", in_sync, reason, message, generation, now
        )
        status["conditions"] = note_failure(conditions, failure, now, objects.generation(raw), "Degraded")
        await record(self.api, SCALINGGROUPS, raw, status, self.manager.events, notes=notes)
        if failure is not None:
            raise failure
        return Result(requeue_after=RESYNC)


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
