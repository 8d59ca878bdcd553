"""Pod image overrides (issue #16 item 6): the webhooks, and the controller (``imageoverrides``)
that keeps the mutating webhook's configuration present exactly while there are overrides.

- The mutating webhook (``overrides.pod.kustos.dev``, failurePolicy Ignore: an operator that is
  down never stops pods being created; they keep their images) rewrites images by the
  MaintenancePolicy ``default``'s ``podImageOverrides``, read from the informer cache, so the
  standby replica answers as the leader does.
- Its configuration is a MutatingWebhookConfiguration of its own, ``<name>-image-overrides``,
  owned by the policy: the leader applies it (with the serving CA) while the list has a usable
  entry and deletes it when the list is empty, so a cluster without overrides sends no pod
  through kustos at all. Narrowing the rules to nothing would leave an object that does
  nothing; a shared configuration would be rewritten by the leader's start-up apply.
- The validating webhook (``overrides.maintenancepolicy.kustos.dev``, in the shared
  configuration) refuses a policy whose entries are not usable, naming each one
  (``spec.podImageOverrides[2]: ...``) and the envoyPodSelector when it cannot be parsed. When
  it is down the controller says the same in a Warning Event and skips the bad entries.
"""

from __future__ import annotations

import logging
from typing import Any

from kustos.api.maintenance import POLICY_NAME, MaintenancePolicy
from kustos.maintenance import envoy, image_overrides
from kustos.runtime import objects
from kustos.runtime.api import ApiStatusError
from kustos.runtime.controller import Controller, Result
from kustos.runtime.deps import Deps
from kustos.runtime.errors import ReconcileError
from kustos.runtime.events import NORMAL, WARNING
from kustos.runtime.informer import Informer
from kustos.runtime.manager import Manager
from kustos.runtime.webhook import MUTATING, AdmissionResponse, Webhook

log = logging.getLogger(__name__)

Obj = dict[str, Any]

POLICIES = MaintenancePolicy.crd.ref
NAME = "imageoverrides"
MUTATE_NAME = "overrides.pod.kustos.dev"
MUTATE_PATH = "/mutate-v1-pod-image-overrides"
VALIDATE_NAME = "overrides.maintenancepolicy.kustos.dev"
VALIDATE_PATH = "/validate-kustos-dev-v1alpha1-maintenancepolicy-overrides"
APPLIED_ANNOTATION = "kustos.dev/image-overrides"
"""Written on a pod whose images the webhook rewrote: ``container: old -> new``, one a line."""
RESYNC = 300.0  # seconds: the configuration is applied again (a renewed CA, a hand deletion)


def configuration_name(base: str) -> str:
    return f"{base}-image-overrides"


def policy_overrides(policies: Informer) -> image_overrides.Overrides:
    """The overrides of the policy named default, from the cache (none when absent)."""
    raw = policies.get(POLICY_NAME)
    if raw is None or objects.deleting(raw):
        return image_overrides.Overrides({})
    entries = (raw.get("spec") or {}).get("podImageOverrides") or []
    return image_overrides.parse([str(e) for e in entries])


# ---- the webhooks --------------------------------------------------------------------------------


def _annotation_patch(pod: Obj, lines: list[str]) -> Obj:
    value = "\n".join(lines)
    if (pod.get("metadata") or {}).get("annotations") is None:
        return {"op": "add", "path": "/metadata/annotations", "value": {APPLIED_ANNOTATION: value}}
    return {"op": "add", "path": "/metadata/annotations/kustos.dev~1image-overrides", "value": value}


def pod_handler(policies: Informer) -> Any:
    async def handle(request: Obj) -> AdmissionResponse:
        images = policy_overrides(policies).images
        if not images:
            return AdmissionResponse.allow()
        pod = request.get("object") or {}
        old = request.get("oldObject") if request.get("operation") == "UPDATE" else None
        patch = image_overrides.mutation(pod, images, old)
        if not patch:
            return AdmissionResponse.allow()
        lines = image_overrides.rewritten(patch, pod)
        log.info("image overrides for pod %s/%s: %s", request.get("namespace"),
                 (pod.get("metadata") or {}).get("name") or "(generated name)", "; ".join(lines))  # fmt: skip
        return AdmissionResponse.mutate([*patch, _annotation_patch(pod, lines)])

    return handle


def policy_denials(obj: Obj, old: Obj | None) -> list[str]:
    """Why a MaintenancePolicy is refused (ratcheted: only fields the write changes)."""
    spec, old_spec = obj.get("spec") or {}, (old or {}).get("spec") or {}
    denials: list[str] = []
    entries = [str(e) for e in spec.get("podImageOverrides") or []]
    if old is None or entries != [str(e) for e in old_spec.get("podImageOverrides") or []]:
        denials.extend(image_overrides.parse(entries).problems)
    selector = spec.get("envoyPodSelector")
    if selector is not None and (old is None or selector != old_spec.get("envoyPodSelector")):
        try:
            envoy.parse_selector(str(selector))
        except envoy.SelectorError as err:
            denials.append(str(err))
    return denials


async def _validate(request: Obj) -> AdmissionResponse:
    denials = policy_denials(request.get("object") or {}, request.get("oldObject"))
    return AdmissionResponse.deny("; ".join(denials), code=422) if denials else AdmissionResponse.allow()


def webhooks(policies: Informer, base_name: str = "kustos") -> list[Webhook]:
    """The pod mutator (in its own configuration) and the policy validator (shared)."""
    crd = MaintenancePolicy.crd
    return [
        Webhook(
            MUTATE_NAME,
            MUTATE_PATH,
            "mutating",
            [
                {
                    "operations": ["CREATE", "UPDATE"],
                    "apiGroups": [""],
                    "apiVersions": ["v1"],
                    "resources": ["pods"],
                    "scope": "Namespaced",
                }
            ],
            pod_handler(policies),
            failure_policy="Ignore",
            configuration=configuration_name(base_name),
        ),
        Webhook(
            VALIDATE_NAME,
            VALIDATE_PATH,
            "validating",
            [
                {
                    "operations": ["CREATE", "UPDATE"],
                    "apiGroups": [crd.group],
                    "apiVersions": [crd.version],
                    "resources": [crd.plural],
                    "scope": "Cluster",
                }
            ],
            _validate,
            failure_policy="Ignore",
        ),
    ]


# ---- the configuration's controller -----------------------------------------------------------


class ImageOverridesReconciler:
    def __init__(self, manager: Manager) -> None:
        self.manager = manager
        self.api = manager.api
        self.policies = manager.informer(POLICIES)
        self.configuration = configuration_name(manager.options.webhook_configuration_name)
        self.serving = bool(manager.options.webhook_url or manager.options.webhook_service)

    async def reconcile(self, key: str) -> Result | None:
        if key != POLICY_NAME:
            return None
        raw = self.policies.get(POLICY_NAME)
        overrides = policy_overrides(self.policies)
        if raw is not None and overrides.problems:
            message = "entries skipped: " + "; ".join(overrides.problems)
            await self.manager.events.record(raw, WARNING, "InvalidImageOverrides", message)
        if not self.serving:
            if raw is not None and overrides.images:
                await self.manager.events.record(
                    raw, WARNING, "ImageOverridesUnavailable",
                    "spec.podImageOverrides: the webhook is off (kustos run has no --webhook-url or "
                    "webhook Service), so pods keep their images",
                )  # fmt: skip
            return None  # and never made a configuration to remove (nor may: no RBAC for it)
        if not overrides.images or raw is None:
            await self._remove()
            return None
        configurations = self.manager.own_webhook_configurations(self.configuration)
        if not configurations:
            return Result(requeue_after=1.0)  # the webhook server is still starting
        for ref, obj in configurations:
            obj["metadata"]["ownerReferences"] = [
                {
                    "apiVersion": MaintenancePolicy.crd.api_version,
                    "kind": MaintenancePolicy.crd.kind,
                    "name": objects.name(raw),
                    "uid": objects.uid(raw),
                }
            ]
            try:
                await self.api.apply(ref, obj)
            except ApiStatusError as err:
                raise ReconcileError(f"applying {self.configuration}: {err.message}", "ApplyFailed") from err
        log.info("image overrides on: %d image(s) rewritten", len(overrides.images))
        return Result(requeue_after=RESYNC)

    async def _remove(self) -> None:
        try:
            gone = await self.api.delete(MUTATING, None, self.configuration)
        except ApiStatusError as err:
            raise ReconcileError(f"deleting {self.configuration}: {err.message}", "DeleteFailed") from err
        if gone:
            log.info("image overrides off: MutatingWebhookConfiguration %s deleted", self.configuration)
            raw = self.policies.get(POLICY_NAME)
            if raw is not None:
                await self.manager.events.record(
                    raw, NORMAL, "ImageOverridesOff",
                    f"spec.podImageOverrides is empty: MutatingWebhookConfiguration "
                    f"{self.configuration} deleted",
                )  # fmt: skip


def register(manager: Manager, deps: Deps) -> None:
    """The webhooks (when the API server can reach them) and the configuration's controller."""
    del deps  # no clock: nothing here waits
    reconciler = ImageOverridesReconciler(manager)
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


__all__ = [
    "APPLIED_ANNOTATION",
    "MUTATE_NAME",
    "NAME",
    "VALIDATE_NAME",
    "configuration_name",
    "policy_denials",
    "register",
    "webhooks",
]
