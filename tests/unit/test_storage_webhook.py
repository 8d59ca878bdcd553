"""The scheduler webhook's pure decisions: which claims are the cluster's, which pods change."""

from __future__ import annotations

from typing import Any

from kustos.api.storage import StorageCluster
from kustos.storage.names import CSI_DRIVER
from kustos.storage.webhook import claim_matches, claim_names, mutation, scheduling_clusters


def active(value: str = "True") -> dict[str, Any]:
    return {"conditions": [{"type": "Active", "status": value, "reason": "R", "lastTransitionTime": "t"}]}


ACTIVE = active()


def raw(name: str = "stor", status: dict[str, Any] | None = None, **spec: Any) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "default"}, "spec": spec, "status": status or ACTIVE}


def claim(storage_class: str | None = None, annotations: dict[str, str] | None = None) -> dict[str, Any]:
    spec = {"storageClassName": storage_class} if storage_class else {}
    return {"metadata": {"name": "c", "annotations": annotations or {}}, "spec": spec}


def test_claims_of_the_class_or_the_driver_match() -> None:
    cluster = StorageCluster.model_validate(raw(storageClassName="gold"))
    assert claim_matches(claim("gold"), cluster)
    assert not claim_matches(claim("kustos-local"), cluster)
    assert claim_matches(claim(annotations={"volume.beta.kubernetes.io/storage-class": "gold"}), cluster)
    assert claim_matches(claim(annotations={"volume.kubernetes.io/storage-provisioner": CSI_DRIVER}), cluster)


def test_only_default_scheduled_pods_are_changed() -> None:
    assert mutation({"spec": {"schedulerName": "default-scheduler"}}, "s") == [
        {"op": "add", "path": "/spec/schedulerName", "value": "s"}
    ]
    assert mutation({"spec": {}}, "s") is not None
    assert mutation({"spec": {"schedulerName": "custom"}}, "s") is None
    assert mutation({"spec": {"schedulerName": "s"}}, "s") is None


def test_claim_names() -> None:
    pod = {"spec": {"volumes": [{"name": "a", "emptyDir": {}},
                                {"name": "b", "persistentVolumeClaim": {"claimName": "data"}}]}}  # fmt: skip
    assert claim_names(pod) == ["data"]


def test_disabled_inactive_and_deleting_clusters_do_not_schedule() -> None:
    clusters = [
        raw("on"),
        raw("off", disableScheduler=True),
        raw("inactive", status=active("False")),
        {**raw("gone"), "metadata": {"name": "gone", "namespace": "d", "deletionTimestamp": "x"}},
    ]
    assert [c.metadata["name"] for c in scheduling_clusters(clusters)] == ["on"]


def test_the_webhook_is_registered_only_where_the_api_server_can_reach_it() -> None:
    from kustos.runtime.manager import ManagerOptions

    assert not ManagerOptions().webhooks_reachable  # kustos dev up: no URL, no Service
    assert ManagerOptions(webhook_url="https://127.0.0.1:9443").webhooks_reachable
    service = {"namespace": "kustos", "name": "kustos", "port": 443}
    assert ManagerOptions(webhook_service=service).webhooks_reachable
