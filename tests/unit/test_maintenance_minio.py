"""MinIO's move to its StatefulSet and kotsadm's database, decided without I/O (maintenance/minio.py)."""

from __future__ import annotations

from typing import Any

from kustos.api.maintenance import MaintenancePolicySpec, MinioStatus
from kustos.maintenance import minio, planner
from kustos.maintenance.minio import (
    DISABLED_SELECTOR,
    STATEFULSET_LABELS,
    Copied,
    CopyObjects,
    CreateStatefulSet,
    Credential,
    DeploymentView,
    KotsadmView,
    MinioView,
    RemoveOldMinio,
    ScaleKotsadm,
    SetServiceSelector,
    StatefulSetView,
)
from kustos.runtime.steps import Done, Wait

NS = "minio"
TEMPLATE: dict[str, Any] = {
    "metadata": {"labels": {"app": "minio"}},
    "spec": {"containers": [{
        "name": "minio", "image": "quay.io/minio/minio:RELEASE", "args": ["server", "/data"],
        "env": [{"name": "MINIO_ACCESS_KEY", "valueFrom": {"secretKeyRef": {"name": "minio-credentials",
                                                                            "key": "MINIO_ACCESS_KEY"}}},
                {"name": "MINIO_SECRET_KEY", "value": "s3cr3t"}],
    }], "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "minio-pv-claim"}}]},
}  # fmt: skip
OLD = DeploymentView(
    uid="u1", template=TEMPLATE, claims=("minio-pv-claim",), size="5Gi", source="10.0.0.5:9000"
)
READY = StatefulSetView(replicas=6, ready=6, target="10.0.0.9:9000", healthy=True)
SPEC = MaintenancePolicySpec()


def view(**changes: Any) -> MinioView:
    base: dict[str, Any] = {"namespace": NS, "deployment": OLD, "statefulset": READY,
                            "selector": {"app": "minio"}, "storage_class": True,
                            "ready_nodes": 3}  # fmt: skip
    return MinioView(**{**base, **changes})


def test_nothing_to_do_without_minio() -> None:
    assert minio.plan_minio(SPEC, MinioView(NS), None).step is None
    assert minio.plan_minio(SPEC, MinioView(NS), None).waiting is None


def test_waits_for_three_ready_nodes_and_the_storage_class() -> None:
    two = minio.plan_minio(SPEC, view(statefulset=None, ready_nodes=2), None)
    assert two.step is None and two.waiting is not None and "3 needed" in two.waiting.message
    none = minio.plan_minio(SPEC, view(statefulset=None, storage_class=False), None)
    assert none.waiting is not None and "openebs-localpv" in none.waiting.message


def test_the_statefulset_is_made_from_the_deployment() -> None:
    step = minio.plan_minio(SPEC, view(statefulset=None), None).step
    assert isinstance(step, CreateStatefulSet)
    headless, statefulset = step.objects
    assert headless["spec"]["clusterIP"] == "None" and headless["spec"]["publishNotReadyAddresses"]
    spec = statefulset["spec"]
    assert spec["replicas"] == 6
    container = spec["template"]["spec"]["containers"][0]
    assert container["image"] == "quay.io/minio/minio:RELEASE"
    assert container["env"] == TEMPLATE["spec"]["containers"][0]["env"]
    assert "http://ha-minio-{0...5}.ha-minio-hl.minio.svc.cluster.local:9000/export" in container["command"]
    claim = spec["volumeClaimTemplates"][0]["spec"]
    assert (
        claim["storageClassName"] == "openebs-localpv" and claim["resources"]["requests"]["storage"] == "5Gi"
    )
    spread = spec["template"]["spec"]["topologySpreadConstraints"][0]
    assert (
        spread["topologyKey"] == "kubernetes.io/hostname" and spread["whenUnsatisfiable"] == "DoNotSchedule"
    )


def test_the_replicas_run_where_the_old_pod_may_run() -> None:
    """A MinIO pinned to a node pool (its label and taint) keeps to it: replicas elsewhere would
    stay Pending, or land where the user did not want MinIO."""
    placement = {
        "nodeSelector": {"pool": "storage"},
        "tolerations": [{"key": "pool", "operator": "Exists", "effect": "NoSchedule"}],
        "imagePullSecrets": [{"name": "registry"}],
        "securityContext": {"fsGroup": 1000},
    }
    hardened = {"allowPrivilegeEscalation": False}
    containers = [{**TEMPLATE["spec"]["containers"][0], "securityContext": hardened}]
    template = {**TEMPLATE, "spec": {**TEMPLATE["spec"], **placement, "containers": containers}}
    old = DeploymentView(uid="u1", template=template, claims=("minio-pv-claim",), source="10.0.0.5:9000")
    step = minio.plan_minio(SPEC, view(statefulset=None, deployment=old), None).step
    assert isinstance(step, CreateStatefulSet)
    pod = step.objects[1]["spec"]["template"]["spec"]
    assert {key: pod[key] for key in placement} == placement
    assert pod["containers"][0]["securityContext"] == hardened
    assert "volumes" not in pod, "the old claim is not mounted by the replicas"


def test_no_statefulset_without_credentials_to_copy_with() -> None:
    bare = {"spec": {"containers": [{"name": "minio", "image": "m"}]}}
    decision = minio.plan_minio(SPEC, view(statefulset=None, deployment=DeploymentView("u", bare)), None)
    assert (
        decision.step is None
        and decision.waiting is not None
        and "MINIO_ROOT_USER" in decision.waiting.message
    )


def test_the_phases_in_order() -> None:
    """Wait for the replicas, take MinIO offline, copy, switch once verified, remove the old."""
    coming = minio.plan_minio(SPEC, view(statefulset=StatefulSetView(6, 4, "10.0.0.9:9000")), None)
    assert coming.step is None and coming.waiting is not None and coming.waiting.poll
    offline = minio.plan_minio(SPEC, view(), None).step
    assert isinstance(offline, SetServiceSelector) and dict(offline.selector) == DISABLED_SELECTOR
    copy = minio.plan_minio(SPEC, view(selector=DISABLED_SELECTOR), MinioStatus(phase="Copying")).step
    assert copy == CopyObjects(NS, "10.0.0.5:9000", "10.0.0.9:9000",
                               Credential(secret="minio-credentials", key="MINIO_ACCESS_KEY"),
                               Credential(value="s3cr3t"))  # fmt: skip
    switch = minio.plan_minio(SPEC, view(selector=DISABLED_SELECTOR), MinioStatus(phase="Verified")).step
    assert isinstance(switch, SetServiceSelector) and dict(switch.selector) == STATEFULSET_LABELS
    remove = minio.plan_minio(SPEC, view(selector=STATEFULSET_LABELS), MinioStatus(phase="Switched")).step
    assert remove == RemoveOldMinio(NS, "u1", ("minio-pv-claim",))
    done = minio.plan_minio(SPEC, view(deployment=None, selector=STATEFULSET_LABELS), None)
    assert done.step is None and done.waiting is not None and done.waiting.phase == "Migrated"


def test_minio_stays_online_until_the_new_cluster_is_healthy() -> None:
    unhealthy = StatefulSetView(replicas=6, ready=6, target="10.0.0.9:9000", healthy=False)
    decision = minio.plan_minio(SPEC, view(statefulset=unhealthy), None)
    assert decision.step is None and decision.waiting is not None and decision.waiting.poll
    assert "/minio/health/cluster" in decision.waiting.message
    # Already offline (a pass before a restart): the copy's own failure and backoff say why.
    offline = minio.plan_minio(SPEC, view(statefulset=unhealthy, selector=DISABLED_SELECTOR), None)
    assert isinstance(offline.step, CopyObjects)


def test_a_failed_copy_shows_as_copying_offline_with_its_error() -> None:
    decision = minio.plan_minio(SPEC, view(selector=DISABLED_SELECTOR), None)
    assert isinstance(decision.step, CopyObjects)
    # The pass before saw a replica briefly unready: the phase said so, MinIO was offline all along.
    before = MinioStatus(phase="WaitingForStatefulSet", message="5 of 6 replicas ready", objects=31, copied=4)
    status = minio.minio_status(decision, None, before, "copying MinIO's objects: could not connect")
    assert status is not None and status.phase == "Copying"
    assert "tried again" in status.message and "could not connect" in status.message
    assert (status.objects, status.copied) == (31, 4)
    # Another step's failure leaves the phase as it was.
    made = minio.plan_minio(SPEC, view(statefulset=None), None)
    assert minio.minio_status(made, None, before, "refused") == before


def test_a_service_left_disabled_is_switched_when_the_deployment_is_gone() -> None:
    step = minio.plan_minio(SPEC, view(deployment=None, selector=DISABLED_SELECTOR), None).step
    assert isinstance(step, SetServiceSelector) and dict(step.selector) == STATEFULSET_LABELS


def test_disabled_management_does_nothing() -> None:
    spec = MaintenancePolicySpec(minio_should_disable_management=True)
    assert minio.plan_minio(spec, view(statefulset=None), None).step is None


def test_a_copy_pass_is_recorded_and_verified_leads_to_the_switch() -> None:
    observed = planner.Observed(spec=SPEC, nodes=(), minio=view(selector=DISABLED_SELECTOR))
    first = planner.plan(observed)
    assert isinstance(first, CopyObjects)
    done = Copied(NS, 10, 4, False, "copied 4 object(s) this pass; 4 of 10 in place")
    status = planner.status(observed, done, observed.now)
    assert status.minio is not None and (status.minio.phase, status.minio.copied) == ("Copying", 4)
    assert status.last_action is not None and status.last_action.action == "MinioCopy"
    verified = planner.status(observed, Copied(NS, 10, 10, True, "verified"), observed.now)
    assert verified.minio is not None and verified.minio.phase == "Verified"
    after = planner.Observed(spec=SPEC, nodes=(), minio=view(selector=DISABLED_SELECTOR), previous=verified)
    assert isinstance(planner.plan(after), SetServiceSelector)


def test_kotsadm_database_scales_to_three_with_three_nodes() -> None:
    args = ("-disco-mode=dns", "-bootstrap-expect=1")
    assert minio.plan_kotsadm(SPEC, KotsadmView("default", 1, args, ready_nodes=2)) is None
    step = minio.plan_kotsadm(SPEC, KotsadmView("default", 1, args, ready_nodes=3))
    assert step == ScaleKotsadm("default", 1, 3, ("-disco-mode=dns", "-bootstrap-expect=3"))
    assert minio.plan_kotsadm(SPEC, KotsadmView("default", 3, args, ready_nodes=5)) is None
    assert minio.plan_kotsadm(SPEC, KotsadmView("default", None, (), ready_nodes=5)) is None
    off = MaintenancePolicySpec(kotsadm_should_disable_management=True)
    assert minio.plan_kotsadm(off, KotsadmView("default", 1, args, ready_nodes=3)) is None


def test_waiting_for_the_statefulset_polls() -> None:
    observed = planner.Observed(spec=SPEC, nodes=(), minio=view(statefulset=StatefulSetView(6, 2, None)))
    assert isinstance(planner.plan(observed), Wait)
    assert isinstance(planner.plan(planner.Observed(spec=SPEC, nodes=(), minio=MinioView(NS))), Done)
