"""The controller (``imageoverrides``) that keeps the pod image overrides' mutating webhook
configuration, ``<name>-image-overrides``, present exactly while the MaintenancePolicy named
default has a usable override: observe, plan (``image_overrides.plan_configuration``), act.

The leader applies the configuration (with the serving CA, owned by the policy) and applies it
again every few minutes (a renewed CA, a hand deletion); it deletes it when the list is empty,
so a cluster without overrides sends no pod through kustos at all. It records no status
(``policy_follower``): skipped entries and overrides that cannot apply are Warning Events on
the policy, and the deletion a Normal one.
"""

from __future__ import annotations

import logging
from datetime import datetime

from kustos.api.maintenance import POLICY_NAME, MaintenancePolicy
from kustos.maintenance import image_overrides as io
from kustos.maintenance.image_overrides_webhook import configuration_name, overrides_of, webhooks
from kustos.maintenance.policy_follower import PolicyFollower
from kustos.runtime.api import ApiStatusError
from kustos.runtime.controller import Controller
from kustos.runtime.deps import Deps
from kustos.runtime.errors import ReconcileError
from kustos.runtime.manager import Manager
from kustos.runtime.record import Note
from kustos.runtime.webhook import MUTATING

log = logging.getLogger(__name__)

POLICIES = MaintenancePolicy.crd.ref
NAME = "imageoverrides"


class ImageOverridesReconciler(PolicyFollower[io.ConfigurationView, io.ConfigurationStep]):
    def __init__(self, manager: Manager, deps: Deps) -> None:
        super().__init__(manager, deps)
        self.policies = self.cache
        self.configuration = configuration_name(manager.options.webhook_configuration_name)
        self.serving = bool(manager.options.webhook_url or manager.options.webhook_service)

    async def observe(self, policy: MaintenancePolicy, now: datetime) -> io.ConfigurationView:
        raw = policy.model_dump(by_alias=True, exclude_none=True)
        server_ready = bool(self.manager.own_webhook_configurations(self.configuration))
        return io.ConfigurationView(overrides_of(raw), self.serving, server_ready)

    def plan(self, observed: io.ConfigurationView) -> io.ConfigurationStep:
        return io.plan_configuration(observed)

    async def act(
        self, policy: MaintenancePolicy, observed: io.ConfigurationView, step: io.ConfigurationStep,
        notes: list[Note],
    ) -> io.ConfigurationStep:  # fmt: skip
        notes.extend(io.configuration_notes(observed, step))
        match step:
            case io.ApplyConfiguration(images=images):
                await self._apply(policy)
                log.info("image overrides on: %d image(s) rewritten", images)
            case io.RemoveConfiguration():
                if await self._remove():
                    said = f"{io.FIELD} is empty: MutatingWebhookConfiguration {self.configuration} deleted"
                    notes.append(Note("ImageOverridesOff", said))
        return step

    def requeue_after(self, observed: io.ConfigurationView, step: io.ConfigurationStep) -> float | None:
        return io.configuration_requeue(step)

    async def _apply(self, policy: MaintenancePolicy) -> None:
        for ref, obj in self.manager.own_webhook_configurations(self.configuration):
            obj["metadata"]["ownerReferences"] = [
                {
                    "apiVersion": MaintenancePolicy.crd.api_version,
                    "kind": MaintenancePolicy.crd.kind,
                    "name": policy.metadata["name"],
                    "uid": policy.metadata["uid"],
                }
            ]
            try:
                await self.api.apply(ref, obj)
            except ApiStatusError as err:
                raise ReconcileError(f"applying {self.configuration}: {err.message}", "ApplyFailed") from err

    async def _remove(self) -> bool:
        """Delete the configuration; whether there was one."""
        try:
            gone = await self.api.delete(MUTATING, None, self.configuration)
        except ApiStatusError as err:
            raise ReconcileError(f"deleting {self.configuration}: {err.message}", "DeleteFailed") from err
        if gone:
            log.info("image overrides off: MutatingWebhookConfiguration %s deleted", self.configuration)
        return bool(gone)


def register(manager: Manager, deps: Deps) -> None:
    """The webhooks (when the API server can reach them) and the configuration's controller."""
    reconciler = ImageOverridesReconciler(manager, deps)
    if reconciler.serving:
        for webhook in webhooks(reconciler.policies, manager.options.webhook_configuration_name):
            manager.add_webhook(webhook)
    else:
        log.warning(
            "the pod image override webhook is off: the API server could not reach it "
            "(give kustos run --webhook-url, or run it in the cluster behind a webhook Service)"
        )
    runner = manager.add_controller(Controller(NAME, POLICIES, reconciler.reconcile))
    # A rotated webhook CA must reach this configuration too, before the old CA is dropped.
    manager.on_ca_bundle_change(lambda: runner.enqueue(POLICY_NAME))


__all__ = ["NAME", "ImageOverridesReconciler", "register"]
