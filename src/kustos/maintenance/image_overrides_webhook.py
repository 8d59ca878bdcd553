"""Pod image overrides (issue #16 item 6): the webhooks. The controller that keeps the mutating
webhook's configuration present exactly while there are overrides is
``image_overrides_controller`` (``imageoverrides``).

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
from kustos.runtime.informer import Informer
from kustos.runtime.webhook import AdmissionResponse, Webhook

log = logging.getLogger(__name__)

Obj = dict[str, Any]

POLICIES = MaintenancePolicy.crd.ref
MUTATE_NAME = "overrides.pod.kustos.dev"
MUTATE_PATH = "/mutate-v1-pod-image-overrides"
VALIDATE_NAME = "overrides.maintenancepolicy.kustos.dev"
VALIDATE_PATH = "/validate-kustos-dev-v1alpha1-maintenancepolicy-overrides"
APPLIED_ANNOTATION = "kustos.dev/image-overrides"
"""Written on a pod whose images the webhook rewrote: ``container: old -> new``, one a line."""


def configuration_name(base: str) -> str:
    return f"{base}-image-overrides"


def overrides_of(policy: Obj | None) -> image_overrides.Overrides:
    """The overrides of a policy (none when it is absent or being deleted)."""
    if policy is None or objects.deleting(policy):
        return image_overrides.Overrides({})
    entries = (policy.get("spec") or {}).get("podImageOverrides") or []
    return image_overrides.parse([str(e) for e in entries])


def policy_overrides(policies: Informer) -> image_overrides.Overrides:
    """The overrides of the policy named default, from the cache (none when absent)."""
    return overrides_of(policies.get(POLICY_NAME))


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


__all__ = [
    "APPLIED_ANNOTATION",
    "MUTATE_NAME",
    "VALIDATE_NAME",
    "configuration_name",
    "overrides_of",
    "policy_denials",
    "policy_overrides",
    "webhooks",
]
