"""The controller runtime against the real API server, through a real ``kustos run`` process
(issue: informers, queues, leader election, metrics, webhooks)."""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from lightkube import AsyncClient
from lightkube.generic_resource import create_namespaced_resource
from lightkube.types import PatchType

from kustos.devcluster.cluster import DevCluster, DevClusterError
from kustos.runtime.api import Api, ApiStatusError
from kustos.runtime.crd import crd_for
from kustos.runtime.errors import ReconcileError
from kustos.runtime.events import NORMAL, EventRecorder
from kustos.runtime.kube import connect, load_config
from kustos.runtime.metrics import Metrics
from kustos.runtime.resources import CONFIGMAPS
from tests.example.api import Example
from tests.example.controller import BASE_LABEL, FAIL_ANNOTATION
from tests.integration.conftest import Kubectl
from tests.integration.kube import wait_until
from tests.integration.operator import OperatorProcess, start_operator

ExampleResource = create_namespaced_resource("example.kustos.dev", "v1alpha1", "Example", "examples")
RECONCILES = 'controller_runtime_reconcile_total{controller="example",result="success"}'
ERRORS = 'controller_runtime_reconcile_total{controller="example",result="error"}'
RETRIES = 'workqueue_retries_total{name="example"}'
OVERLAPS = "example_concurrent_reconciles_total"
WEBHOOKS = "kustos-runtime-tests"


@pytest.fixture(scope="module")
def example_crd(dev_cluster: DevCluster) -> None:
    dev_cluster.kubectl("apply", "-f", "-", input_text=yaml.safe_dump(crd_for(Example)))
    dev_cluster.wait_established("examples.example.kustos.dev")


@pytest.fixture(scope="module")
def operator(
    dev_cluster: DevCluster, example_crd: None, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[OperatorProcess]:
    """One operator for the module: leader election on, in its own lease."""
    process = start_operator(
        dev_cluster, tmp_path_factory.mktemp("operator"),
        "--lease-name", "runtime-tests",
        # Longer than client-go's 15/10 s: the API server restart test must not cost the lease
        # (losing it is exit 3 by design), and a restart under CI load takes several seconds.
        "--lease-duration", "30", "--renew-deadline", "20", "--retry-period", "1",
        "--webhook-configuration-name", WEBHOOKS,
    )  # fmt: skip
    yield process
    assert process.stop() == 0
    dev_cluster.kubectl("delete", "validatingwebhookconfiguration", WEBHOOKS, "--ignore-not-found")


def example(name: str, message: str = "hello", **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "example.kustos.dev/v1alpha1",
        "kind": "Example",
        "metadata": {"name": name},
        "spec": {"message": message, **spec},
    }


async def mirror_says(kubectl: Kubectl, name: str, message: str) -> bool:
    found = kubectl("get", "configmap", f"{name}-mirror", "-o", "jsonpath={.data.message}", check=False)
    return found == message


async def test_replace_status_clears_fields_and_refuses_a_stale_copy(
    kubectl: Kubectl, dev_cluster: DevCluster, example_crd: None
) -> None:
    """First in the module: the module's operator (started by the tests after it) runs the
    example controller on every namespace, and its status writes would race this test's."""
    from tests.example.controller import EXAMPLES

    kubectl.apply(example("replaced", "x", labels={"a": "b"}))
    metrics = Metrics()
    clients = connect(load_config(dev_cluster.kubeconfig), metrics)
    try:
        api = Api(clients.raw)
        obj = await api.get(EXAMPLES, kubectl.namespace, "replaced")
        assert obj is not None
        written = await api.replace_status(EXAMPLES, obj, {"phase": "Ready", "ready": "1/1"})
        status = written["status"]
        assert (status["phase"], status["ready"], status["observedGeneration"]) == ("Ready", "1/1", 1)
        cleared = await api.replace_status(EXAMPLES, written, {"phase": "Pending", "ready": None})
        assert cleared["status"]["phase"] == "Pending" and "ready" not in cleared["status"]
        with pytest.raises(ReconcileError) as stale:
            await api.replace_status(EXAMPLES, written, {"phase": "Stale"})
        assert isinstance(stale.value, ApiStatusError) and stale.value.conflict
    finally:
        await clients.close()


async def test_reacts_to_create_update_delete_of_its_resource_and_what_it_owns(
    kubectl: Kubectl, operator: OperatorProcess
) -> None:
    await wait_until(lambda: _ready(operator), "operator ready", timeout=30)
    kubectl.apply(example("first", "hello"))
    await wait_until(lambda: mirror_says(kubectl, "first", "hello"), "mirror created", timeout=10)

    async def ready_status() -> bool:
        status = kubectl.get("example", "first").get("status") or {}
        return status.get("phase") == "Ready" and status.get("observedGeneration") == 1

    await wait_until(ready_status, "status Ready with observedGeneration", timeout=10)
    columns = kubectl("get", "examples")
    assert "READY" in columns and "1/1" in columns and "Ready" in columns

    kubectl.apply(example("first", "changed", mode="upper"))
    await wait_until(lambda: mirror_says(kubectl, "first", "CHANGED"), "mirror updated", timeout=10)

    # Someone deletes what the controller owns: it comes back.
    kubectl("delete", "configmap", "first-mirror")
    await wait_until(lambda: mirror_says(kubectl, "first", "CHANGED"), "mirror recreated", timeout=10)
    events = kubectl("get", "events", "--field-selector", "involvedObject.name=first")
    assert "Synced" in events

    kubectl("delete", "example", "first")

    async def mirror_gone() -> bool:
        return not kubectl("get", "configmap", "first-mirror", "--ignore-not-found", "-o", "name")

    # The garbage collector learns a new CRD from discovery, which it refreshes every 30 s.
    await wait_until(mirror_gone, "owned mirror garbage-collected", timeout=90)


async def test_a_burst_of_updates_is_folded_and_never_reconciled_concurrently(
    kubectl: Kubectl, operator: OperatorProcess, kube: AsyncClient
) -> None:
    kubectl.apply(example("bursty", "m-0"))
    await wait_until(lambda: mirror_says(kubectl, "bursty", "m-0"), "first mirror", timeout=10)
    before = operator.metric(RECONCILES)
    updates = 400  # in bursts of 20 at once: far faster than one reconcile each, and few enough
    # that the API server's retries of conflicting patches to the one object stay short
    burst = 20

    async def update(i: int) -> None:
        await kube.patch(
            ExampleResource, "bursty", {"spec": {"message": f"m-{i}"}},
            namespace=kubectl.namespace, patch_type=PatchType.MERGE,
        )  # fmt: skip

    for start in range(1, updates + 1, burst):
        await asyncio.gather(*(update(i) for i in range(start, min(start + burst, updates + 1))))
    await kube.patch(ExampleResource, "bursty", {"spec": {"message": "final"}}, namespace=kubectl.namespace,
                     patch_type=PatchType.MERGE)  # fmt: skip
    await wait_until(
        lambda: mirror_says(kubectl, "bursty", "final"), "the last update reconciled", timeout=30
    )
    reconciles = operator.metric(RECONCILES) - before
    assert 0 < reconciles < updates / 2, f"{reconciles} reconciles for {updates} updates"
    assert operator.metric(OVERLAPS) == 0


async def test_errors_back_off_exponentially_and_recover(kubectl: Kubectl, operator: OperatorProcess) -> None:
    failing = example("failing")
    failing["metadata"]["annotations"] = {FAIL_ANNOTATION: "true"}
    retries_before = operator.metric(RETRIES)
    kubectl.apply(failing)
    await asyncio.sleep(4)
    retries = operator.metric(RETRIES) - retries_before
    # 5 ms doubling: about 10 retries fit in 4 s; without backoff there would be hundreds.
    assert 3 <= retries <= 14, f"{retries} retries in 4 s"
    assert operator.metric(ERRORS) >= retries
    kubectl("annotate", "example", "failing", f"{FAIL_ANNOTATION}-")
    await wait_until(
        lambda: mirror_says(kubectl, "failing", "hello"), "recovery after the failure", timeout=30
    )


BASE_ERRORS = 'controller_runtime_reconcile_total{controller="example-base",result="error"}'
BASE_RETRIES = 'workqueue_retries_total{name="example-base"}'


def base_example(name: str, message: str = "hello") -> dict[str, Any]:
    obj = example(name, message)
    obj["metadata"]["labels"] = {BASE_LABEL: "true"}
    return obj


def available(kubectl: Kubectl, name: str) -> dict[str, Any]:
    status = kubectl.get("example", name).get("status") or {}
    return next((c for c in status.get("conditions") or [] if c["type"] == "Available"), {})


async def test_a_failing_step_that_records_status_waits_for_its_backoff(
    kubectl: Kubectl, operator: OperatorProcess
) -> None:
    """Each failed pass records a new attempt number in status, as an EtcdCluster whose pods the
    API server refuses records a new member index: that write must not wake the controller past
    its backoff (it looped at about 20 passes a second)."""
    failing = base_example("base-failing")
    failing["metadata"]["annotations"] = {FAIL_ANNOTATION: "true"}
    errors_before = operator.metric(BASE_ERRORS)
    kubectl.apply(failing)
    await wait_until(
        lambda: _async(available(kubectl, "base-failing").get("reason") == "MirrorRefused"),
        "the failure on the Available condition",
    )
    await asyncio.sleep(6)
    errors = operator.metric(BASE_ERRORS) - errors_before
    # 5 ms doubling: about 11 passes fit in 6 s (and one more for the first record's own event);
    # woken by each of its status writes it made over a hundred.
    assert 3 <= errors <= 15, f"{errors} failed passes in about 6 s"
    attempts = int(kubectl.get("example", "base-failing")["status"]["phase"].removeprefix("Attempt "))
    assert 1 <= attempts <= errors + 1, f"{attempts} attempts recorded for {errors} failed passes"
    kubectl("annotate", "example", "base-failing", f"{FAIL_ANNOTATION}-")
    await wait_until(lambda: mirror_says(kubectl, "base-failing", "hello"), "recovery", timeout=60)
    await wait_until(lambda: _async(available(kubectl, "base-failing").get("status") == "True"), "Available")


async def test_an_invalid_spec_names_its_field_keeps_the_status_and_is_not_retried(
    kubectl: Kubectl, operator: OperatorProcess
) -> None:
    kubectl.apply(base_example("base-invalid"))
    await wait_until(lambda: _async(available(kubectl, "base-invalid").get("status") == "True"), "Available")
    retries_before = operator.metric(BASE_RETRIES)
    kubectl("patch", "example", "base-invalid", "--type=merge", "-p", '{"spec":{"message":"invalid"}}')
    await wait_until(
        lambda: _async(available(kubectl, "base-invalid").get("reason") == "InvalidSpec"), "InvalidSpec"
    )
    condition = available(kubectl, "base-invalid")
    assert condition["status"] == "False"
    assert "spec.message" in condition["message"], condition
    # What earlier passes recorded stays: an invalid spec is no observation of the world.
    assert kubectl.get("example", "base-invalid")["status"]["ready"] == "1/1"
    assert operator.metric(BASE_RETRIES) == retries_before  # terminal: no backoff loop


async def _async(value: bool) -> bool:
    return value


async def test_metrics_and_probes(operator: OperatorProcess) -> None:
    metrics = operator.metrics()
    names = {key.split("{", 1)[0] for key in metrics}
    expected = {
        "controller_runtime_reconcile_total", "controller_runtime_reconcile_errors_total",
        "controller_runtime_reconcile_time_seconds_bucket", "controller_runtime_active_workers",
        "workqueue_depth", "workqueue_adds_total", "workqueue_queue_duration_seconds_bucket",
        "workqueue_work_duration_seconds_bucket", "workqueue_retries_total",
        "workqueue_unfinished_work_seconds", "workqueue_longest_running_processor_seconds",
        "rest_client_requests_total", "leader_election_master_status", "process_resident_memory_bytes",
    }  # fmt: skip
    assert expected <= names, f"missing: {expected - names}"
    assert metrics['leader_election_master_status{name="runtime-tests"}'] == 1
    assert metrics['controller_runtime_max_concurrent_reconciles{controller="example"}'] == 2
    assert any(k.startswith('rest_client_requests_total{code="200"') for k in metrics)
    assert operator.readyz()[0] == 200


async def test_readyz_fails_until_caches_sync(
    dev_cluster: DevCluster, example_crd: None, tmp_path: Path
) -> None:
    """An informer on a resource the API server does not serve never syncs: not ready."""
    process = start_operator(dev_cluster, tmp_path, "--no-leader-elect",
                             controllers="tests.example.controller:register_unsyncable")  # fmt: skip
    try:
        await asyncio.sleep(2)
        code, text = process.readyz()
        assert code == 503 and "ghosts.example.kustos.dev" in text
    finally:
        process.stop()


async def test_webhook_denial_reaches_kubectl(kubectl: Kubectl, operator: OperatorProcess) -> None:
    async def webhook_configured() -> bool:
        return bool(kubectl.cluster.kubectl("get", "validatingwebhookconfiguration", WEBHOOKS, check=False))

    await wait_until(webhook_configured, "the operator's webhook configuration", timeout=30)
    with pytest.raises(DevClusterError, match="must not contain the word 'forbidden'"):
        kubectl.apply(example("bad", "a forbidden word"))
    assert not kubectl("get", "example", "bad", "--ignore-not-found", "-o", "name")
    kubectl.apply(example("good", "a fine word"))


async def _ready(operator: OperatorProcess) -> bool:
    return operator.readyz()[0] == 200


async def test_api_server_restart_loses_no_events(
    kubectl: Kubectl, operator: OperatorProcess, dev_cluster: DevCluster
) -> None:
    kubectl.apply(example("steady", "before"))
    await wait_until(
        lambda: mirror_says(kubectl, "steady", "before"), "mirror before the restart", timeout=10
    )
    dev_cluster.restart_component("kube-apiserver", down_seconds=3)

    async def answers() -> bool:
        return dev_cluster.kubectl("get", "--raw", "/readyz", check=False).strip() == "ok"

    await wait_until(answers, "API server back", timeout=60)
    # Changes made right after the restart, while the operator's watches are reconnecting.
    kubectl.apply(example("steady", "after"))
    kubectl.apply(example("newcomer", "fresh"))
    await wait_until(
        lambda: mirror_says(kubectl, "steady", "after"), "update seen after the restart", timeout=60
    )
    await wait_until(
        lambda: mirror_says(kubectl, "newcomer", "fresh"), "create seen after the restart", timeout=60
    )
    assert operator.alive()


async def test_leader_election_one_active_failover_and_release(
    kubectl: Kubectl, dev_cluster: DevCluster, example_crd: None, tmp_path: Path
) -> None:
    lease = ["--lease-name", f"le-{kubectl.namespace}", "--lease-duration", "6", "--renew-deadline", "4",
             "--retry-period", "1", "--namespace", kubectl.namespace,
             "--webhook-configuration-name", f"kustos-{kubectl.namespace}"]  # fmt: skip
    first = start_operator(dev_cluster, tmp_path, *lease)
    second = start_operator(dev_cluster, tmp_path, *lease)
    gauge = f'leader_election_master_status{{name="le-{kubectl.namespace}"}}'
    processes = [first, second]
    try:

        async def one_leader() -> OperatorProcess | None:
            leaders = [p for p in processes if p.alive() and p.metric(gauge) == 1]
            return leaders[0] if len(leaders) == 1 else None

        leader = await wait_until(one_leader, "exactly one leader", timeout=30)
        standby = second if leader is first else first
        kubectl.apply(example("led", "one"))
        await wait_until(lambda: mirror_says(kubectl, "led", "one"), "the leader reconciles", timeout=15)
        assert standby.metric(RECONCILES) == 0, "the standby must not reconcile"

        leader.kill(signal.SIGKILL)
        killed_at = time.monotonic()
        await wait_until(lambda: _leads(standby, gauge), "the standby takes over", timeout=20)
        takeover = time.monotonic() - killed_at
        assert takeover < 6 + 2 * 1 + 2, f"took {takeover:.1f}s, lease is 6s"
        kubectl.apply(example("led", "two"))
        await wait_until(lambda: mirror_says(kubectl, "led", "two"), "the new leader reconciles", timeout=15)

        third = start_operator(dev_cluster, tmp_path, *lease)
        processes.append(third)
        standby.kill(signal.SIGTERM)
        released_at = time.monotonic()
        assert standby.wait(30) == 0
        await wait_until(lambda: _leads(third, gauge), "a standby takes a released lease", timeout=20)
        # Released, not expired: faster than a lease duration.
        assert time.monotonic() - released_at < 6
    finally:
        for process in processes:
            process.kill(signal.SIGKILL)
        dev_cluster.kubectl("delete", "validatingwebhookconfiguration", f"kustos-{kubectl.namespace}",
                            "--ignore-not-found")  # fmt: skip


async def _leads(process: OperatorProcess, gauge: str) -> bool:
    return process.alive() and process.metric(gauge) == 1


async def test_api_helpers_apply_finalizers_and_guarded_writes(
    kubectl: Kubectl, dev_cluster: DevCluster
) -> None:
    """Server-side apply, finalizers and UID-guarded deletes, on the real API server."""
    metrics = Metrics()
    clients = connect(load_config(dev_cluster.kubeconfig), metrics)
    api = Api(clients.raw)
    try:
        cm = {"metadata": {"name": "held", "namespace": kubectl.namespace}, "data": {"a": "1"}}
        applied = await api.apply(CONFIGMAPS, cm)
        managers = {m["manager"] for m in applied["metadata"]["managedFields"]}
        assert "kustos" in managers and applied["data"] == {"a": "1"}

        held = await api.add_finalizer(CONFIGMAPS, applied, "kustos.dev/test")
        assert held["metadata"]["finalizers"] == ["kustos.dev/test"]
        # A stale copy cannot change finalizers: the write is guarded by resourceVersion.
        with pytest.raises(ApiStatusError):
            await api.remove_finalizer(CONFIGMAPS, applied | {"metadata": {**applied["metadata"],
                                       "finalizers": ["kustos.dev/test"]}}, "kustos.dev/test")  # fmt: skip
        # A delete naming another incarnation's UID does nothing.
        with pytest.raises(ApiStatusError) as refused:
            await api.delete(CONFIGMAPS, kubectl.namespace, "held", uid="not-this-one")
        assert refused.value.conflict
        assert await api.delete(CONFIGMAPS, kubectl.namespace, "held", uid=held["metadata"]["uid"])
        pending = await api.get(CONFIGMAPS, kubectl.namespace, "held")
        assert pending is not None and pending["metadata"].get("deletionTimestamp")
        await api.remove_finalizer(CONFIGMAPS, pending, "kustos.dev/test")
        assert await api.get(CONFIGMAPS, kubectl.namespace, "held") is None

        # Repeated Events fold into one with a count.
        recorder = EventRecorder(api)
        subject = await api.apply(CONFIGMAPS, {"metadata": {"name": "noisy", "namespace": kubectl.namespace}})
        for _ in range(3):
            await recorder.record(subject, NORMAL, "Repeated", "the same thing again")
        events = kubectl.get("events", None, "--field-selector", "involvedObject.name=noisy")["items"]
        assert [(e["reason"], e["count"]) for e in events] == [("Repeated", 3)]
        assert metrics.registry.get_sample_value(
            "rest_client_requests_total", {"code": "200", "method": "PATCH", "host": "127.0.0.1"}
        )
    finally:
        await clients.close()


async def test_a_controller_whose_crd_is_absent_waits_while_the_others_run(
    kubectl: Kubectl, dev_cluster: DevCluster, example_crd: None, tmp_path: Path
) -> None:
    """The ghost controller's CRD is not installed: it is reported and waits; Example runs."""
    process = start_operator(
        dev_cluster, tmp_path, "--no-leader-elect", "--cache-sync-timeout", "2",
        "--extra-controllers", "tests.example.controller:register",
        "--webhook-configuration-name", f"kustos-absent-{kubectl.namespace}",
        controllers="tests.example.controller:register_unsyncable",
    )  # fmt: skip
    try:
        kubectl.apply(example("beside-a-ghost", "runs"))
        await wait_until(
            lambda: mirror_says(kubectl, "beside-a-ghost", "runs"),
            "Example runs beside the ghost",
            timeout=30,
        )

        async def reported() -> bool:
            code, text = process.readyz()
            return code == 200 and "controller ghost waits for ghosts.example.kustos.dev" in text

        await wait_until(reported, "ready, with the ghost controller reported as waiting", timeout=15)
        assert process.metric('kustos_controller_caches_synced{controller="ghost"}') == 0
        assert process.metric('kustos_controller_caches_synced{controller="example"}') == 1
        assert "ghosts.example.kustos.dev is not served" in process.log()
    finally:
        process.stop()
        dev_cluster.kubectl("delete", "validatingwebhookconfiguration", f"kustos-absent-{kubectl.namespace}",
                            "--ignore-not-found")  # fmt: skip


async def test_losing_the_api_server_stands_down_with_one_line(
    dev_cluster: DevCluster, example_crd: None, tmp_path: Path
) -> None:
    """The API server goes away for longer than the renew deadline: exit 3, said in one line."""
    process = start_operator(dev_cluster, tmp_path, "--lease-name", "gone-tests", "--lease-duration", "6",
                             "--renew-deadline", "4", "--retry-period", "1",
                             "--webhook-configuration-name", "kustos-gone-tests")  # fmt: skip
    gauge = 'leader_election_master_status{name="gone-tests"}'
    try:
        await wait_until(lambda: _leads(process, gauge), "the operator leads", timeout=30)
        # Down for longer than the renew deadline; shorter than the module operator's (20 s).
        outage = asyncio.create_task(asyncio.to_thread(dev_cluster.restart_component, "kube-apiserver", 9.0))
        code = await asyncio.to_thread(process.wait, 30)
        await outage

        async def answers() -> bool:
            return dev_cluster.kubectl("get", "--raw", "/readyz", check=False).strip() == "ok"

        await wait_until(answers, "API server back", timeout=60)
        log = process.log()
        assert code == 3, log[-3000:]
        assert "Traceback" not in log, log[-3000:]
        assert "lost the lease default/gone-tests: not renewed for 4s" in log
        assert log.strip().splitlines()[-1].endswith("exiting so that a fresh start waits as a standby")
    finally:
        process.kill(signal.SIGKILL)
        dev_cluster.kubectl(
            "delete", "validatingwebhookconfiguration", "kustos-gone-tests", "--ignore-not-found"
        )
