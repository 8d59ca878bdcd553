"""Envoy restarts and pod image overrides (issue #16 items 5 and 6) on the real control plane.

The dev cluster runs pods of the operator's image as real processes with real readiness
probes (devcluster/probes.py), so an "envoy" container whose exec probe fails is a container
the kubelet reports running and not ready, as Contour's stuck Envoys are. The image override
webhook is called by the real API server over TLS (the operator's self-signed CA in the
configuration it applies).
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from kustos.devcluster.cluster import DevCluster, DevClusterError
from kustos.devcluster.ports import free_port
from kustos.images import KUSTOS_IMAGE_REPOSITORY
from kustos.maintenance.envoy import NOT_READY_ANNOTATION
from kustos.maintenance.image_overrides_webhook import APPLIED_ANNOTATION
from tests.integration.conftest import Kubectl
from tests.integration.kube import wait_until
from tests.integration.operator import REFUSED, OperatorProcess, start_operator

pytestmark = pytest.mark.process_runner(
    "the policy's Envoy restarts, image overrides and reboot unit decide on kwok nodes' pods"
)

IMAGE = f"{KUSTOS_IMAGE_REPOSITORY}:dev"


def policy(**spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "kustos.dev/v1alpha1",
        "kind": "MaintenancePolicy",
        "metadata": {"name": "default"},
        "spec": spec,
    }


@pytest.fixture
def extras(crds: None, kubectl: Kubectl, tmp_path: Path) -> Iterator[OperatorProcess]:
    """``kustos run --controllers envoyrestart,imageoverrides`` scoped to the test's namespace."""
    configuration = f"kustos-{kubectl.namespace}"
    process = start_operator(
        kubectl.cluster, tmp_path / "operator",
        "--namespace", kubectl.namespace, "--lease-namespace", kubectl.namespace,
        "--webhook-configuration-name", configuration,
        "--controllers", "envoyrestart,imageoverrides",
        controllers=None,
    )  # fmt: skip
    try:
        yield process
    finally:
        process.stop()
        cluster = kubectl.cluster
        cluster.kubectl("delete", "maintenancepolicy", "default", "--ignore-not-found", check=False)
        cluster.kubectl("delete", "validatingwebhookconfiguration", configuration, "--ignore-not-found",
                        check=False)  # fmt: skip
        cluster.kubectl("delete", "mutatingwebhookconfiguration", f"{configuration}-image-overrides",
                        "--ignore-not-found", check=False)  # fmt: skip


def envoy_container(probe: list[str]) -> dict[str, Any]:
    return {
        "name": "envoy",
        "image": IMAGE,
        "command": ["sh", "-c", "sleep 3600"],
        "readinessProbe": {"exec": {"command": probe}, "periodSeconds": 1, "failureThreshold": 1},
    }


def shutdown_manager() -> dict[str, Any]:
    return {"name": "shutdown-manager", "image": IMAGE, "command": ["sh", "-c", "sleep 3600"]}


def events(kubectl: Kubectl, uid: str, reason: str, namespace: str | None = None) -> list[dict[str, Any]]:
    """Events of one incarnation of an object, by its uid: an earlier one of the same name (a
    previous test's MaintenancePolicy) left Events of its own."""
    selector = f"involvedObject.uid={uid},reason={reason}"
    args = ["get", "events", "--field-selector", selector, "-o", "json"]
    text = kubectl.cluster.kubectl("-n", namespace or kubectl.namespace, *args)
    return list(json.loads(text)["items"])


def policy_uid(kubectl: Kubectl) -> str:
    return kubectl.cluster.kubectl("get", "maintenancepolicy", "default", "-o", "jsonpath={.metadata.uid}")


async def test_a_stuck_envoy_is_restarted_and_a_healthy_one_left_alone(
    kubectl: Kubectl, extras: OperatorProcess
) -> None:
    kubectl.cluster.kubectl("apply", "-f", "-", input_text=_yaml(policy(envoyPodsNotReadyDuration="8s")))
    labels = {"app": "envoy"}
    kubectl.apply(
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": "stuck"},
            "spec": {
                "replicas": 1,
                "selector": {"matchLabels": {**labels, "case": "stuck"}},
                "template": {
                    "metadata": {"labels": {**labels, "case": "stuck"}},
                    "spec": {
                        "terminationGracePeriodSeconds": 2,
                        "containers": [envoy_container(["false"]), shutdown_manager()],
                    },
                },
            },
        },
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "healthy", "labels": {**labels, "case": "healthy"}},
            "spec": {"containers": [envoy_container(["true"]), shutdown_manager()]},
        },
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "not-envoy", "labels": {"app": "other"}},
            "spec": {"containers": [envoy_container(["false"])]},
        },
    )

    def stuck_pods() -> list[dict[str, Any]]:
        return list(kubectl.get("pods", None, "-l", "case=stuck")["items"])

    async def marked() -> dict[str, Any] | None:
        for pod in stuck_pods():
            if NOT_READY_ANNOTATION in (pod["metadata"].get("annotations") or {}):
                return pod
        return None

    first = await wait_until(marked, "kustos to record the envoy container not ready", timeout=90,
                             cluster=kubectl.cluster, namespace=kubectl.namespace)  # fmt: skip
    statuses = {s["name"]: s for s in first["status"]["containerStatuses"]}
    assert first["status"]["phase"] == "Running"
    assert statuses["envoy"]["ready"] is False and "running" in statuses["envoy"]["state"]
    first_uid = first["metadata"]["uid"]

    async def replaced() -> dict[str, Any] | None:
        fresh = [p for p in stuck_pods() if p["metadata"]["uid"] != first_uid]
        gone = all(p["metadata"]["uid"] != first_uid for p in stuck_pods())
        return fresh[0] if fresh and gone else None

    await wait_until(replaced, "the stuck envoy pod deleted and its Deployment's new one", timeout=90,
                     cluster=kubectl.cluster, namespace=kubectl.namespace)  # fmt: skip

    on_pod = events(kubectl, first_uid, "EnvoyRestarted")
    assert on_pod and on_pod[0]["type"] == "Warning"
    message = on_pod[0]["message"]
    assert "container envoy" in message and "envoyPodsNotReadyDuration 8s" in message, message
    on_policy = events(kubectl, policy_uid(kubectl), "EnvoyRestarted", namespace="default")
    assert any(first["metadata"]["name"] in e["message"] for e in on_policy)

    healthy = kubectl.get("pod", "healthy")
    assert not healthy["metadata"].get("deletionTimestamp")
    assert NOT_READY_ANNOTATION not in (healthy["metadata"].get("annotations") or {})
    other = kubectl.get("pod", "not-envoy")
    assert not other["metadata"].get("deletionTimestamp"), "a pod the selector does not match is left alone"
    assert NOT_READY_ANNOTATION not in (other["metadata"].get("annotations") or {})


async def test_a_restarted_operator_keeps_counting(crds: None, kubectl: Kubectl, tmp_path: Path) -> None:
    """The not-ready time lives on the pod: an operator stopped after marking it, and a new one
    started, restart the pod at the first mark's deadline, not a fresh one's."""
    configuration = f"kustos-{kubectl.namespace}"
    args = (
        "--namespace", kubectl.namespace, "--lease-namespace", kubectl.namespace,
        "--webhook-configuration-name", configuration, "--controllers", "envoyrestart",
    )  # fmt: skip
    kubectl.cluster.kubectl("apply", "-f", "-", input_text=_yaml(policy(envoyPodsNotReadyDuration="15s")))
    first = start_operator(kubectl.cluster, tmp_path / "first", *args, controllers=None)
    second: OperatorProcess | None = None
    try:
        kubectl.apply(
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": "envoy", "labels": {"app": "envoy"}},
                "spec": {"terminationGracePeriodSeconds": 2, "containers": [envoy_container(["false"])]},
            }
        )

        async def marked() -> str | None:
            annotations = kubectl.get("pod", "envoy")["metadata"].get("annotations") or {}
            return annotations.get(NOT_READY_ANNOTATION)

        mark = await wait_until(marked, "the first operator's mark", timeout=60,
                                cluster=kubectl.cluster, namespace=kubectl.namespace)  # fmt: skip
        assert first.stop() == 0
        second = start_operator(kubectl.cluster, tmp_path / "second", *args, controllers=None)
        marks: set[str] = set()

        async def deleted() -> bool:
            pod = json.loads(kubectl("get", "pod", "envoy", "--ignore-not-found", "-o", "json") or "null")
            if pod is None or pod["metadata"].get("deletionTimestamp"):
                return True
            marks.add((pod["metadata"].get("annotations") or {}).get(NOT_READY_ANNOTATION, "absent"))
            return False

        await wait_until(deleted, "the second operator to restart the pod", timeout=90,
                         cluster=kubectl.cluster, namespace=kubectl.namespace)  # fmt: skip
        assert marks <= {mark}, f"the count was restarted: marks {marks}, first {mark}"
        assert "step: Mark" not in second.log(), "the second operator marked the pod again"
        assert "step: RestartEnvoy" in second.log()
    finally:
        for process in (first, second):
            if process is not None and process.alive():
                process.stop()
        kubectl.cluster.kubectl("delete", "maintenancepolicy", "default", "--ignore-not-found", check=False)


async def test_stuck_envoys_are_restarted_one_at_a_time(kubectl: Kubectl, extras: OperatorProcess) -> None:
    """Two stuck Envoys whose shutdown takes a while: never both terminating at once."""
    kubectl.cluster.kubectl("apply", "-f", "-", input_text=_yaml(policy(envoyPodsNotReadyDuration="2s")))
    slow = envoy_container(["false"])
    slow["command"] = ["sh", "-c", "trap '' TERM; sleep 3600"]  # holds its grace period
    kubectl.apply(
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": "fleet"},
            "spec": {
                "replicas": 2,
                "selector": {"matchLabels": {"app": "envoy"}},
                "template": {
                    "metadata": {"labels": {"app": "envoy"}},
                    "spec": {"terminationGracePeriodSeconds": 6, "containers": [slow]},
                },
            },
        }
    )

    async def two_running() -> set[str] | None:
        pods = kubectl.get("pods", None, "-l", "app=envoy")["items"]
        running = {p["metadata"]["uid"] for p in pods if p["status"].get("phase") == "Running"}
        return running if len(running) == 2 else None

    originals = await wait_until(two_running, "two envoy pods running", timeout=90,
                                 cluster=kubectl.cluster, namespace=kubectl.namespace)  # fmt: skip
    seen_terminating: list[list[str]] = []  # every sample's terminating pods (wait_until swallows asserts)

    async def both_restarted() -> bool:
        pods = kubectl.get("pods", None, "-l", "app=envoy")["items"]
        seen_terminating.append(
            [p["metadata"]["name"] for p in pods if p["metadata"].get("deletionTimestamp")]
        )
        return not originals & {p["metadata"]["uid"] for p in pods}

    await wait_until(both_restarted, "both original envoy pods restarted", timeout=120, interval=0.2,
                     cluster=kubectl.cluster, namespace=kubectl.namespace)  # fmt: skip
    assert max(len(t) for t in seen_terminating) == 1, (
        "a restarted pod is seen terminating (its grace holds it)"
    )
    assert not [t for t in seen_terminating if len(t) > 1], "two envoy pods terminating at once"


async def test_images_are_overridden_through_the_api_server(
    kubectl: Kubectl, extras: OperatorProcess
) -> None:
    configuration = f"kustos-{kubectl.namespace}-image-overrides"
    original, override = "projectcontour/contour:v1.18.0", "myregistry.io/contour:v1.18.0-fips"
    init_original, init_override = "busybox:1.36", "myregistry.io/busybox:1.36"
    entries = [f"{original}={override}", f"{init_original}={init_override}"]
    kubectl.cluster.kubectl("apply", "-f", "-", input_text=_yaml(policy(podImageOverrides=entries)))

    async def configured() -> bool:
        found = kubectl.cluster.kubectl(
            "get", "mutatingwebhookconfiguration", configuration, "-o", "jsonpath={.webhooks[*].name}",
            check=False,
        )  # fmt: skip
        return "overrides.pod.kustos.dev" in found

    await wait_until(configured, "the image override webhook configuration", timeout=60)

    async def validating() -> bool:
        found = kubectl.cluster.kubectl(
            "get", "validatingwebhookconfiguration", f"kustos-{kubectl.namespace}", "-o",
            "jsonpath={.webhooks[*].name}", check=False,
        )  # fmt: skip
        return "overrides.maintenancepolicy.kustos.dev" in found

    await wait_until(validating, "the MaintenancePolicy validator's configuration", timeout=60)
    made = kubectl.cluster.kubectl("get", "mutatingwebhookconfiguration", configuration, "-o", "json")
    owner = json.loads(made)["metadata"]["ownerReferences"][0]
    assert owner["kind"] == "MaintenancePolicy" and owner["name"] == "default"

    kubectl.apply(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "contour"},
            "spec": {
                "initContainers": [{"name": "init", "image": init_original}],
                "containers": [
                    {"name": "contour", "image": original},
                    {"name": "untouched", "image": "docker.io/projectcontour/contour:v1.18.0"},
                ],
            },
        }
    )
    pod = kubectl.get("pod", "contour")
    images = {c["name"]: c["image"] for c in pod["spec"]["containers"]}
    assert images == {"contour": override, "untouched": "docker.io/projectcontour/contour:v1.18.0"}
    assert pod["spec"]["initContainers"][0]["image"] == init_override
    assert f"contour: {original} -> {override}" in pod["metadata"]["annotations"][APPLIED_ANNOTATION]

    # A malformed entry is refused by name; the valid policy stays as it was.
    with pytest.raises(DevClusterError) as caught:
        kubectl.cluster.kubectl(
            "apply", "-f", "-",
            input_text=_yaml(policy(podImageOverrides=[f"{original}={override}", "Contour:1=x:1"])),
        )  # fmt: skip
    assert "spec.podImageOverrides[1]" in str(caught.value) and "lowercase" in str(caught.value)

    # An empty list: the configuration goes away, and new pods keep their images.
    kubectl.cluster.kubectl("apply", "-f", "-", input_text=_yaml(policy(podImageOverrides=[])))

    async def removed() -> bool:
        found = kubectl.cluster.kubectl(
            "get", "mutatingwebhookconfiguration", configuration, "--ignore-not-found", "-o", "name"
        )
        return not found.strip()

    await wait_until(removed, "the image override configuration deleted", timeout=60)
    kubectl.apply(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "plain"},
            "spec": {"containers": [{"name": "contour", "image": original}]},
        }
    )
    assert kubectl.get("pod", "plain")["spec"]["containers"][0]["image"] == original
    off = events(kubectl, policy_uid(kubectl), "ImageOverridesOff", namespace="default")
    assert off and configuration in off[0]["message"]


def _yaml(document: dict[str, Any]) -> str:
    return str(yaml.safe_dump(document))


# ---- reboot safety (item 7): the scripts of deploy/reboot/ against the real API server -----------

REBOOT = Path(__file__).resolve().parents[2] / "deploy" / "reboot"
CORDON_ANNOTATION = "kustos.dev/reboot-cordoned"


def run_script(
    kubectl: Kubectl, script: str, flags_file: Path, **env: str
) -> subprocess.CompletedProcess[str]:
    """Run a reboot script as systemd would, but with the dev cluster's kubeconfig and a kubelet
    flags file that names the node by --hostname-override (no KUSTOS_NODE_NAME)."""
    environment = {
        "PATH": os.environ["PATH"],
        "HOME": str(flags_file.parent),  # kubectl's discovery cache, outside the checkout
        "KUBECONFIG": str(kubectl.cluster.kubeconfig),
        "KUSTOS_KUBECTL": str(kubectl.cluster.kubectl_path),
        "KUSTOS_KUBELET_FLAG_FILES": str(flags_file),
        "KUSTOS_POLL_SECONDS": "1",
        **env,
    }
    return subprocess.run(
        [str(REBOOT / script)], env=environment, capture_output=True, text=True, timeout=300, check=False
    )


def sleeper(name: str, node: str, claim: str | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "nodeSelector": {"kubernetes.io/hostname": node},
        "terminationGracePeriodSeconds": 2,
        "containers": [{"name": "app", "image": IMAGE, "command": ["sh", "-c", "sleep 3600"]}],
    }
    if claim:
        spec["containers"][0]["volumeMounts"] = [{"name": "data", "mountPath": "/data"}]
        spec["volumes"] = [{"name": "data", "persistentVolumeClaim": {"claimName": claim}}]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


def claim(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": name},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "10Mi"}}},
    }


@pytest.fixture
def reboot_node(kubectl: Kubectl) -> Iterator[str]:
    nodes = kubectl.get("nodes")["items"]
    node = sorted(n["metadata"]["name"] for n in nodes if "-worker-" in n["metadata"]["name"])[-1]
    yield node
    kubectl.cluster.kubectl("uncordon", node, check=False)
    kubectl.cluster.kubectl("annotate", "node", node, f"{CORDON_ANNOTATION}-", check=False)
    kubectl.cluster.kubectl("-n", "kube-system", "delete", "pod", f"sys-{kubectl.namespace}", "--wait=false",
                            "--ignore-not-found", check=False)  # fmt: skip
    kubectl.cluster.kubectl("-n", "kube-system", "delete", "pvc", f"sys-{kubectl.namespace}", "--wait=false",
                            "--ignore-not-found", check=False)  # fmt: skip


async def test_reboot_scripts_move_volume_pods_and_uncordon(
    kubectl: Kubectl, reboot_node: str, tmp_path: Path
) -> None:
    node = reboot_node
    flags = tmp_path / "kubeadm-flags.env"
    flags.write_text(
        f'KUBELET_KUBEADM_ARGS="--container-runtime-endpoint=x --hostname-override={node} --v=2"\n'
    )
    system = f"sys-{kubectl.namespace}"
    kubectl.apply(claim("data"), sleeper("with-claim", node, "data"), sleeper("without-claim", node))
    kubectl.cluster.kubectl(
        "-n", "kube-system", "apply", "-f", "-",
        input_text=yaml.safe_dump_all([claim(system), sleeper(system, node, system)]),
    )  # fmt: skip

    async def all_running() -> bool:
        pods = kubectl.get("pods")["items"]
        sys_pod = json.loads(kubectl.cluster.kubectl("-n", "kube-system", "get", "pod", system, "-o", "json"))
        phases = [p["status"].get("phase") for p in [*pods, sys_pod]]
        return len(pods) == 2 and all(phase == "Running" for phase in phases)

    await wait_until(all_running, "the three pods running on the node", timeout=90,
                     cluster=kubectl.cluster, namespace=kubectl.namespace)  # fmt: skip
    volume = kubectl.get("pvc", "data")["spec"]["volumeName"]
    assert volume

    down = run_script(kubectl, "shutdown.sh", flags, KUSTOS_SHUTDOWN_TIMEOUT="90")
    assert down.returncode == 0, down.stderr
    assert f"node {node}" in down.stderr and "deleting pod" in down.stderr
    after = kubectl.get("node", node)
    assert after["spec"].get("unschedulable") is True
    assert CORDON_ANNOTATION in after["metadata"]["annotations"]
    names = {p["metadata"]["name"]: p for p in kubectl.get("pods")["items"]}
    assert "with-claim" not in names, "the pod with a claim is gone before the script returns"
    assert not names["without-claim"]["metadata"].get("deletionTimestamp"), "a pod without a claim stays"
    sys_pod = json.loads(kubectl.cluster.kubectl("-n", "kube-system", "get", "pod", system, "-o", "json"))
    assert not sys_pod["metadata"].get("deletionTimestamp"), "system namespaces are left alone"
    assert kubectl.get("pvc", "data")["spec"]["volumeName"] == volume, "the claim and its data stay"

    up = run_script(kubectl, "startup.sh", flags, KUSTOS_STARTUP_TIMEOUT="60")
    assert up.returncode == 0, up.stderr
    after = kubectl.get("node", node)
    assert not after["spec"].get("unschedulable")
    assert CORDON_ANNOTATION not in (after["metadata"].get("annotations") or {})

    # A node its administrator cordoned stays cordoned across the reboot.
    kubectl.cluster.kubectl("cordon", node)
    down = run_script(kubectl, "shutdown.sh", flags, KUSTOS_SHUTDOWN_TIMEOUT="30")
    assert down.returncode == 0 and "already cordoned" in down.stderr, down.stderr
    up = run_script(kubectl, "startup.sh", flags, KUSTOS_STARTUP_TIMEOUT="30")
    assert up.returncode == 0 and "not cordoned by shutdown.sh" in up.stderr, up.stderr
    assert kubectl.get("node", node)["spec"].get("unschedulable") is True


async def test_shutdown_reports_an_unreachable_api(kubectl: Kubectl, tmp_path: Path) -> None:
    broken = tmp_path / "kubeconfig"
    text = kubectl.cluster.kubeconfig.read_text()
    server = yaml.safe_load(text)["clusters"][0]["cluster"]["server"]
    broken.write_text(text.replace(server, "https://127.0.0.1:1"))
    flags = tmp_path / "none.env"
    result = run_script(kubectl, "shutdown.sh", flags, KUBECONFIG=str(broken), KUSTOS_NODE_NAME="any",
                        KUSTOS_REQUEST_TIMEOUT="2s")  # fmt: skip
    assert result.returncode == 2 and "cannot read node any" in result.stderr, result.stderr


# ---- least privilege: the chart's ServiceAccount is enough ------------------------------------------


def point_chart_webhooks_at(cluster: DevCluster, name: str, base_url: str) -> None:
    """The chart's webhook entries call its Service, which has no endpoint in the dev cluster (the
    operator runs beside it): as the administrator, point them at the operator's URL instead, as
    the operator's own apply does (server-side apply cannot swap one clientConfig member for the
    other: the chart's manager keeps owning the service)."""
    for kind in ("validatingwebhookconfiguration", "mutatingwebhookconfiguration"):
        config = json.loads(cluster.kubectl("get", kind, name, "-o", "json"))
        patch = []
        for index, webhook in enumerate(config["webhooks"]):
            path = webhook["clientConfig"]["service"]["path"]
            patch += [
                {"op": "remove", "path": f"/webhooks/{index}/clientConfig/service"},
                {"op": "add", "path": f"/webhooks/{index}/clientConfig/url", "value": base_url + path},
            ]
        cluster.kubectl("patch", kind, name, "--type=json", "-p", json.dumps(patch))


async def test_envoy_restarts_and_overrides_need_only_the_charts_permissions(
    dev_cluster: DevCluster, kubectl: Kubectl, tmp_path: Path
) -> None:
    """The operator as the chart's ServiceAccount (webhooks on, so the chart grants the
    override configuration's rules): it restarts a stuck Envoy, creates, applies and deletes
    the override configuration, and the API server refuses it nothing."""
    from tests.integration.test_install import (
        CHART,
        adopt_crds,
        helm,
        service_account_kubeconfig,
        start_operator_as,
    )

    release, namespace = f"kustos-{kubectl.namespace}", kubectl.namespace
    configuration = f"{release}-image-overrides"
    adopt_crds(dev_cluster, release, namespace)
    helm(dev_cluster, "install", release, str(CHART), "--namespace", namespace, "--set", "replicas=0")
    port = free_port()
    args = [
        "--namespace", namespace, "--lease-name", release, "--lease-namespace", namespace,
        "--metrics-address", f"127.0.0.1:{free_port()}",
        "--webhook-address", f"127.0.0.1:{port}", "--webhook-url", f"https://127.0.0.1:{port}",
        "--webhook-configuration-name", release, "--controllers", "envoyrestart,imageoverrides",
    ]  # fmt: skip
    point_chart_webhooks_at(dev_cluster, release, f"https://127.0.0.1:{port}")
    entries = ["registry.example/app:1=registry.example/app:1-fips"]
    dev_cluster.kubectl("apply", "-f", "-", input_text=_yaml(policy(envoyPodsNotReadyDuration="5s",
                                                                     podImageOverrides=entries)))  # fmt: skip
    process = None
    log = tmp_path / "operator.log"
    try:
        kubeconfig = service_account_kubeconfig(dev_cluster, namespace, release, tmp_path / "sa.json")
        process = start_operator_as(kubeconfig, log, *args)

        async def configured() -> bool:
            found = dev_cluster.kubectl("get", "mutatingwebhookconfiguration", configuration,
                                        "--ignore-not-found", "-o", "name")  # fmt: skip
            return bool(found.strip())

        await wait_until(configured, "the override configuration, made as the chart's identity", timeout=60)
        kubectl.apply(
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": "app"},
                "spec": {"containers": [{"name": "app", "image": "registry.example/app:1"}]},
            },
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": "envoy-stuck", "labels": {"app": "envoy"}},
                "spec": {"terminationGracePeriodSeconds": 2, "containers": [envoy_container(["false"])]},
            },
        )
        assert kubectl.get("pod", "app")["spec"]["containers"][0]["image"] == "registry.example/app:1-fips"

        async def restarted() -> bool:
            return not kubectl("get", "pod", "envoy-stuck", "--ignore-not-found", "-o", "name").strip()

        try:
            await wait_until(restarted, "the stuck envoy deleted as the chart's identity", timeout=90,
                             cluster=dev_cluster, namespace=namespace)  # fmt: skip
        except AssertionError as err:
            raise AssertionError(f"{err}\noperator log:\n{log.read_text(errors='replace')[-4000:]}") from None
        dev_cluster.kubectl("apply", "-f", "-", input_text=_yaml(policy(podImageOverrides=[])))

        async def removed() -> bool:
            return not await configured()

        await wait_until(removed, "the override configuration deleted as the chart's identity", timeout=60)
    finally:
        if process is not None:
            process.terminate()
            process.wait(30)
        helm(dev_cluster, "uninstall", release, "--namespace", namespace)
        dev_cluster.kubectl("delete", "maintenancepolicy", "default", "--ignore-not-found", check=False)
        dev_cluster.kubectl("delete", "mutatingwebhookconfiguration", configuration, "--ignore-not-found",
                            check=False)  # fmt: skip
    text = log.read_text(errors="replace")
    assert "controller envoyrestart started" in text and "controller imageoverrides started" in text, text[
        -3000:
    ]
    assert not REFUSED.search(text), text[-3000:]
