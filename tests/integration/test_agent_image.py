"""Agent pods with the operator's own image run the local kustos to the end (SPEC F-DEV-2)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from kustos.devcluster.cluster import DevCluster
from kustos.devcluster.runner import sandbox_dir
from kustos.images import agent_image
from tests.integration import handwritten_etcd as demo
from tests.integration.conftest import Kubectl
from tests.integration.kube import wait_until

pytestmark = pytest.mark.process_runner(
    "tests the runner's own mapping of kustos's image to this checkout (the built image: test_dev_up)"
)


def agent_pod(name: str, *containers: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 1,
            "containers": list(containers),
            "volumes": [{"name": "work", "emptyDir": {}}],
        },
    }


def kustos_container(name: str = "agent", **fields: Any) -> dict[str, Any]:
    mounts = [{"name": "work", "mountPath": "/work"}]
    return {"name": name, "image": agent_image(), "volumeMounts": mounts, **fields}


async def finished_pod(kubectl: Kubectl, name: str, phase: str, timeout: float = 60) -> dict[str, Any]:
    async def finished() -> dict[str, Any] | None:
        pod = kubectl.get("pod", name)
        return pod if pod["status"].get("phase") == phase else None

    return await wait_until(finished, f"pod {name} {phase}", timeout=timeout, cluster=kubectl.cluster,
                            namespace=kubectl.namespace)  # fmt: skip


async def pod_logs(kubectl: Kubectl, name: str, expected: str, *flags: str) -> str:
    """``kubectl logs`` of a finished pod, once kwok serves it (it learns of log files by a watch)."""

    async def logs() -> str | None:
        text = kubectl("logs", name, *flags, check=False)
        return text if expected in text else None

    return await wait_until(logs, f"{expected!r} in kubectl logs {name}", timeout=30)


def terminated(pod: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {s["name"]: s["state"]["terminated"] for s in pod["status"]["containerStatuses"]}


async def test_an_agent_pod_runs_the_local_kustos_and_succeeds(
    kubectl: Kubectl, dev_cluster: DevCluster
) -> None:
    # A real agent command that writes under its emptyDir: /work must become the pod's directory.
    command = ["kustos", "crds", "--write", "/work/crds"]
    kubectl.apply(agent_pod("agent-ok", kustos_container(command=command)))

    pod = await finished_pod(kubectl, "agent-ok", "Succeeded")
    assert terminated(pod)["agent"]["exitCode"] == 0
    assert pod["status"]["containerStatuses"][0]["restartCount"] == 0

    text = await pod_logs(kubectl, "agent-ok", "etcdclusters.kustos.dev.yaml")
    work = sandbox_dir(dev_cluster.state_dir / "pods", pod) / "volumes" / "work"
    written = [Path(line.removeprefix("wrote ")) for line in text.splitlines() if line.startswith("wrote ")]
    assert work / "crds" / "etcdclusters.kustos.dev.yaml" in written
    assert all(path.parent == work / "crds" and path.is_file() for path in written)

    # A finished pod stays finished: a node coming back does not run it again.
    node = pod["spec"]["nodeName"]
    dev_cluster.take_node_down(node)
    dev_cluster.bring_node_up(node)
    await asyncio.sleep(3)
    again = kubectl.get("pod", "agent-ok")
    assert again["status"]["phase"] == "Succeeded"
    assert terminated(again) == terminated(pod)
    assert kubectl("logs", "agent-ok").count("etcdclusters.kustos.dev.yaml") == 1


async def test_an_agent_pod_that_exits_non_zero_fails_with_its_output(kubectl: Kubectl) -> None:
    # No command: the image's entrypoint is kustos, which refuses an unknown command with exit 2.
    kubectl.apply(agent_pod("agent-bad", kustos_container(args=["no-such-command"])))

    pod = await finished_pod(kubectl, "agent-bad", "Failed")
    state = terminated(pod)["agent"]
    assert (state["exitCode"], state["reason"]) == (2, "Error")
    await pod_logs(kubectl, "agent-bad", "No such command")


async def test_a_pod_mixing_the_agent_and_etcd_images_runs_both(kubectl: Kubectl) -> None:
    etcd = {"name": "etcd", "image": demo.etcd_image(), "command": ["etcdctl", "version"]}
    kubectl.apply(agent_pod("mixed", etcd, kustos_container(command=["kustos", "--help"])))

    pod = await finished_pod(kubectl, "mixed", "Succeeded")
    assert {name: state["exitCode"] for name, state in terminated(pod).items()} == {"etcd": 0, "agent": 0}
    await pod_logs(kubectl, "mixed", "etcdctl version:", "-c", "etcd")
    await pod_logs(kubectl, "mixed", "Usage: kustos", "-c", "agent")
