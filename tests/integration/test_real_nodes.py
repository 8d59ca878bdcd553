"""Real nodes beside the kwok nodes: a kubelet with containerd and runc enforces what the
process runner only interprets (issue 20).

One real node serves the whole module (its start is the expensive part); the last test
takes it down as a killed run would leave it and proves teardown leaves nothing.
"""

from __future__ import annotations

import ipaddress
import json
import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from kustos.devcluster.binaries import ETCD_VERSIONS
from kustos.devcluster.cluster import DevCluster
from kustos.devcluster.kwokconfig import kubernetes_service_ip
from kustos.devcluster.nodeimages import NONROOT, etcd_image
from kustos.devcluster.realnode import REAL_NODE_LABEL, SHIM_SOCKET_DIR, RealNode
from tests.integration import handwritten_etcd as demo
from tests.integration.conftest import Kubectl
from tests.integration.kube import is_ready, wait_until

pytestmark = [
    pytest.mark.integration,
    pytest.mark.real_nodes,
    pytest.mark.process_runner(
        "the Service's endpoint: a member the runner runs answers a client on the real node"
    ),
]

RESTRICTED: dict[str, Any] = {
    "runAsNonRoot": True,
    "runAsUser": int(NONROOT),
    "readOnlyRootFilesystem": True,
    "allowPrivilegeEscalation": False,
    "capabilities": {"drop": ["ALL"]},
    "seccompProfile": {"type": "RuntimeDefault"},
}


@pytest.fixture(scope="module")
def real_node(dev_cluster: DevCluster) -> Iterator[RealNode]:
    node = dev_cluster.start_real_node(1, timeout=120)
    # Nothing of the session's other workloads lands here (the kustos image is not built in
    # CI); this module's pods name the node and need no scheduler.
    dev_cluster.kubectl("taint", "node", node.name, f"{REAL_NODE_LABEL}=true:NoSchedule", "--overwrite")
    try:
        yield node
    finally:
        dev_cluster.remove_real_node(node)
        # The session cluster goes on without real nodes: no kube-proxy, no tables of it.
        dev_cluster.stop_kube_proxy()


def restricted_etcd_pod(name: str, node: str) -> dict[str, Any]:
    """An etcd member as a hardened chart would run it: non-root, read-only root filesystem,
    no capabilities, the runtime's seccomp profile, a memory limit and an HTTP probe."""
    pod = demo.etcd_pod(name, [f"--initial-cluster={name}=http://$(POD_IP):2380"], node_name=node)
    container = pod["spec"]["containers"][0]
    container["image"] = etcd_image(ETCD_VERSIONS[-1])
    container["securityContext"] = RESTRICTED
    container["resources"] = {"limits": {"memory": "256Mi"}, "requests": {"memory": "64Mi"}}
    container["readinessProbe"] = {"httpGet": {"path": "/health", "port": 2379}, "periodSeconds": 1}
    return pod


async def ready_pod(kubectl: Kubectl, name: str, timeout: float = 60) -> dict[str, Any]:
    async def ready() -> dict[str, Any] | None:
        pod = kubectl.get("pod", name)
        return pod if is_ready(pod) else None

    return await wait_until(ready, f"pod {name} Ready", timeout=timeout, cluster=kubectl.cluster,
                            namespace=kubectl.namespace)  # fmt: skip


def pod_links(bridge: str) -> list[str]:
    """The CNI bridge plugin's host ends on the cluster's bridge (the runner's are ``kv*``)."""
    return [
        link.name
        for link in Path("/sys/class/net").glob("veth*")
        if (link / "master").exists() and (link / "master").resolve().name == bridge
    ]


def node_ready(cluster: DevCluster, name: str) -> str:
    node = json.loads(cluster.kubectl("get", "node", name, "-o", "json"))
    return next(c["status"] for c in node["status"]["conditions"] if c["type"] == "Ready")


def test_a_real_node_is_ready_beside_the_kwok_nodes(dev_cluster: DevCluster, real_node: RealNode) -> None:
    nodes = json.loads(dev_cluster.kubectl("get", "nodes", "-o", "json"))["items"]
    real = [n for n in nodes if n["metadata"]["labels"].get(REAL_NODE_LABEL) == "true"]
    kwok = [n for n in nodes if n["metadata"]["labels"].get("type") == "kwok"]

    assert [n["metadata"]["name"] for n in real] == [real_node.name]
    assert node_ready(dev_cluster, real_node.name) == "True"
    assert kwok and all(node_ready(dev_cluster, n["metadata"]["name"]) == "True" for n in kwok)
    info = real[0]["status"]["nodeInfo"]
    assert info["containerRuntimeVersion"].startswith("containerd://")
    assert info["kubeletVersion"] == "v1.36.3"


async def test_a_restricted_etcd_pod_runs_answers_and_logs(
    kubectl: Kubectl, dev_cluster: DevCluster, real_node: RealNode
) -> None:
    kubectl.apply(restricted_etcd_pod("hardened", real_node.name))
    pod = await ready_pod(kubectl, "hardened", timeout=90)
    ip = pod["status"]["podIP"]
    assert ipaddress.ip_address(ip) in ipaddress.ip_network(dev_cluster.network.node_cidr(real_node.index))

    async with httpx.AsyncClient(timeout=5) as client:
        health = (await client.get(f"http://{ip}:2379/health")).json()
    assert health["health"] == "true"
    # The image's program really runs as the non-root user, unable to write its root filesystem.
    status = kubectl("exec", "hardened", "--", "etcdctl", "endpoint", "status", "-w", "json")
    assert json.loads(status)[0]["Status"]["header"]["member_id"]
    assert "serving client traffic" in kubectl("logs", "hardened")
    [container] = real_node.crictl("ps", "--name", "etcd", "-q").split()
    spec = json.loads(real_node.crictl("inspect", container))["info"]["runtimeSpec"]
    assert spec["process"]["user"]["uid"] == int(NONROOT)
    assert spec["root"]["readonly"] is True
    assert spec["linux"]["seccomp"]["defaultAction"] == "SCMP_ACT_ERRNO"
    assert spec["linux"]["resources"]["memory"]["limit"] == 256 * 2**20


async def test_pods_on_a_real_node_reach_services_by_cluster_ip(
    kubectl: Kubectl, dev_cluster: DevCluster, real_node: RealNode
) -> None:
    # A client on the real node; the Service's endpoint is a member run by the process runner.
    client = restricted_etcd_pod("client", real_node.name)
    client["metadata"]["labels"] = {"role": "client"}  # the Service selects the member only
    kubectl.apply(client, demo.etcd_pod(
        "member", ["--initial-cluster=member=http://$(POD_IP):2380"]),
        {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "member-client"},
         "spec": {"selector": {"kustos.dev/demo": "etcd"}, "ports": [{"port": 2379}]}})  # fmt: skip
    for pod in ("client", "member"):
        await ready_pod(kubectl, pod, timeout=90)
    cluster_ip = kubectl.get("service", "member-client")["spec"]["clusterIP"]

    health = kubectl("exec", "client", "--", "etcdctl", f"--endpoints=http://{cluster_ip}:2379",
                     "--dial-timeout=5s", "endpoint", "health")  # fmt: skip
    assert "is healthy" in health

    # The API server answers through the ``kubernetes`` Service (refusing an anonymous gRPC
    # call is its answer: a Status object, where an unrouted address would time out).
    api = subprocess.run(
        [str(dev_cluster.kubectl_path), "--kubeconfig", str(dev_cluster.kubeconfig), "-n", kubectl.namespace,
         "exec", "client", "--", "etcdctl", f"--endpoints=https://{kubernetes_service_ip()}:443",
         "--insecure-skip-tls-verify", "--dial-timeout=5s", "--command-timeout=5s", "endpoint", "status"],
        capture_output=True, text=True, check=False, timeout=60,
    )  # fmt: skip
    assert "system:anonymous" in api.stdout + api.stderr


def _host_uplinks() -> list[tuple[str, str]]:
    """Loopback and the links the host's default routes leave by, with their state, and the
    default routes. Only these: other sessions' dev clusters add and remove veths meanwhile, and
    a veth has no bridge for a moment after it is made."""
    routes = json.loads(
        subprocess.run(["ip", "-j", "route", "show", "default"], capture_output=True, check=True).stdout
    )
    links = json.loads(subprocess.run(["ip", "-j", "link", "show"], capture_output=True, check=True).stdout)
    uplinks = {"lo", *(route["dev"] for route in routes if "dev" in route)}
    return [(link["ifname"], link.get("operstate", "")) for link in links if link["ifname"] in uplinks] + [
        ("default", json.dumps(routes, sort_keys=True))
    ]


async def test_a_partitioned_real_node_keeps_its_containers_but_is_cut_off(
    kubectl: Kubectl, dev_cluster: DevCluster, real_node: RealNode
) -> None:
    kubectl.apply(restricted_etcd_pod("cut-off", real_node.name))
    ip = (await ready_pod(kubectl, "cut-off", timeout=90))["status"]["podIP"]
    host_links = _host_uplinks()

    dev_cluster.partition_node(real_node.name)
    try:
        assert real_node.crictl("ps", "--name", "etcd", "-q").split()  # still running
        async with httpx.AsyncClient(timeout=2) as client:
            with pytest.raises(httpx.TransportError):
                await client.get(f"http://{ip}:2379/health")

        async def not_ready() -> bool:
            return node_ready(dev_cluster, real_node.name) != "True"

        await wait_until(not_ready, f"{real_node.name} NotReady", timeout=60)
        assert _host_uplinks() == host_links  # only the pods' bridge ports went down
    finally:
        dev_cluster.heal_node(real_node.name)

    async def answers() -> bool:
        async with httpx.AsyncClient(timeout=2) as client:
            try:
                return (await client.get(f"http://{ip}:2379/health")).status_code == 200
            except httpx.TransportError:
                return False

    await wait_until(answers, "the partitioned pod answering again", timeout=60)
    await ready_pod(kubectl, "cut-off", timeout=90)


async def test_a_stopped_real_node_goes_not_ready_and_comes_back(
    kubectl: Kubectl, dev_cluster: DevCluster, real_node: RealNode
) -> None:
    kubectl.apply(restricted_etcd_pod("stopped", real_node.name))
    await ready_pod(kubectl, "stopped", timeout=90)

    dev_cluster.take_node_down(real_node.name)

    assert not real_node.is_running("kubelet")
    assert real_node.crictl("ps", "-q").split() == []

    async def not_ready() -> bool:
        return node_ready(dev_cluster, real_node.name) != "True"

    await wait_until(not_ready, f"{real_node.name} NotReady", timeout=60)

    dev_cluster.bring_node_up(real_node.name)

    async def ready() -> bool:
        return node_ready(dev_cluster, real_node.name) == "True"

    await wait_until(ready, f"{real_node.name} Ready again", timeout=90)


def test_a_killed_real_node_leaves_nothing_behind(dev_cluster: DevCluster, real_node: RealNode) -> None:
    # A killed run: kubelet and containerd die without stopping anything (the shims, the
    # containers, their mounts, network namespaces and cgroups stay).
    kubectl = Kubectl(dev_cluster, "default")
    kubectl.apply(restricted_etcd_pod("left-behind", real_node.name))
    try:

        def running() -> bool:
            return bool(real_node.crictl("ps", "--name", "etcd", "-q", check=False).split())

        dev_cluster._wait_for(running, 90, "a container on the real node")
        for component in ("kubelet", "containerd"):
            os.kill(int(real_node.pid_file(component).read_text()), signal.SIGKILL)
        netns = list(real_node.netns_dir.iterdir())
        shim_sockets = set(SHIM_SOCKET_DIR.iterdir())
        assert netns and shim_sockets and real_node.leftovers()

        dev_cluster.remove_real_node(real_node)

        assert real_node.leftovers() == []
        assert not real_node.directory.exists()
        assert pod_links(dev_cluster.network.bridge) == []
        assert not any(socket.exists() for socket in shim_sockets)
    finally:
        kubectl("delete", "pod", "left-behind", "--grace-period=0", "--force", check=False)
