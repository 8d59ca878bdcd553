"""Envoy restarts and pod image overrides (issue #16 items 5 and 6) on the real control plane.

The dev cluster runs pods of the operator's image as real processes with real readiness
probes (devcluster/probes.py), so an "envoy" container whose exec probe fails is a container
the kubelet reports running and not ready, as Contour's stuck Envoys are. The image override
webhook is called by the real API server over TLS (the operator's self-signed CA in the
configuration it applies).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from kustos.devcluster.cluster import DevClusterError
from kustos.images import KUSTOS_IMAGE_REPOSITORY
from kustos.maintenance.envoy import NOT_READY_ANNOTATION
from kustos.maintenance.image_overrides_webhook import APPLIED_ANNOTATION
from tests.integration.conftest import Kubectl
from tests.integration.kube import wait_until
from tests.integration.operator import OperatorProcess, start_operator

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


def events(kubectl: Kubectl, name: str, reason: str, namespace: str | None = None) -> list[dict[str, Any]]:
    selector = f"involvedObject.name={name},reason={reason}"
    args = ["get", "events", "--field-selector", selector, "-o", "json"]
    text = kubectl.cluster.kubectl("-n", namespace or kubectl.namespace, *args)
    return list(json.loads(text)["items"])


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

    on_pod = events(kubectl, first["metadata"]["name"], "EnvoyRestarted")
    assert on_pod and on_pod[0]["type"] == "Warning"
    message = on_pod[0]["message"]
    assert "container envoy" in message and "envoyPodsNotReadyDuration 8s" in message, message
    on_policy = events(kubectl, "default", "EnvoyRestarted", namespace="default")
    assert any(first["metadata"]["name"] in e["message"] for e in on_policy)

    healthy = kubectl.get("pod", "healthy")
    assert not healthy["metadata"].get("deletionTimestamp")
    assert NOT_READY_ANNOTATION not in (healthy["metadata"].get("annotations") or {})
    other = kubectl.get("pod", "not-envoy")
    assert not other["metadata"].get("deletionTimestamp"), "a pod the selector does not match is left alone"
    assert NOT_READY_ANNOTATION not in (other["metadata"].get("annotations") or {})


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
    off = events(kubectl, "default", "ImageOverridesOff", namespace="default")
    assert off and configuration in off[0]["message"]


def _yaml(document: dict[str, Any]) -> str:
    return str(yaml.safe_dump(document))
