"""The AWS bridge's plan: which kwok Nodes to create, stop, resume and delete (pure)."""

from __future__ import annotations

from typing import Any

from kustos.devcluster.awsbridge import (
    BRIDGE_LABEL,
    IMAGE_LABEL,
    Machine,
    free_ip,
    node_manifest,
    plan,
)
from kustos.devcluster.kwokconfig import MANAGED_LABEL


def machine(n: int, state: str = "running", control_plane: bool = False, dns: str | None = None) -> Machine:
    return Machine(
        instance_id=f"i-{n:017x}",
        zone="us-east-1a",
        state=state,
        image="ami-0000000000000000a",
        dns_name=f"ip-10-0-0-{n}.ec2.internal" if dns is None else dns,
        private_ip=f"10.0.0.{n}",
        group="cp" if control_plane else "workers",
        control_plane=control_plane,
        instance_type="t3.medium",
    )


def node_of(m: Machine, managed: bool = True, deleting: bool = False) -> dict[str, Any]:
    node = node_manifest(m, "127.78.0.1")
    if not managed:
        del node["metadata"]["labels"][MANAGED_LABEL]
    if deleting:
        node["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    return node


def test_a_running_instance_without_a_node_gets_one() -> None:
    actions = plan([machine(1), machine(2, "pending")], [node_of(machine(1))])
    assert [m.instance_id for m in actions.create] == [machine(2).instance_id]
    assert not (actions.delete or actions.halt or actions.resume)


def test_an_instance_without_a_dns_name_waits() -> None:
    assert not plan([machine(1, "pending", dns="")], [])


def test_gone_instances_lose_their_node_once() -> None:
    nodes = [
        node_of(machine(1)),
        node_of(machine(2)),
        node_of(machine(3)),
        node_of(machine(4), deleting=True),
    ]
    actions = plan([machine(1, "terminated"), machine(2, "shutting-down")], nodes)
    assert sorted(actions.delete) == sorted(machine(n).dns_name for n in (1, 2, 3))
    assert not actions.create  # terminated instances get no node


def test_stopped_instances_stop_their_node_and_resume_it() -> None:
    halted = plan([machine(1, "stopping"), machine(2, "stopped")], [node_of(machine(1)), node_of(machine(2))])
    assert sorted(halted.halt) == [machine(1).dns_name, machine(2).dns_name]
    assert not plan([machine(2, "stopped")], [node_of(machine(2), managed=False)])
    resumed = plan([machine(2)], [node_of(machine(2), managed=False)])
    assert resumed.resume == [machine(2).dns_name]


def test_the_node_is_what_kubelet_and_the_cloud_controller_would_make() -> None:
    node = node_manifest(machine(7, control_plane=True), "127.78.0.9")
    assert node["metadata"]["name"] == "ip-10-0-0-7.ec2.internal"
    assert node["spec"]["providerID"] == f"aws:///us-east-1a/{machine(7).instance_id}"
    labels = node["metadata"]["labels"]
    assert labels[IMAGE_LABEL] == "ami-0000000000000000a"
    assert labels[BRIDGE_LABEL] == "true" and labels[MANAGED_LABEL] == "true"
    assert "node-role.kubernetes.io/control-plane" in labels
    assert labels["topology.kubernetes.io/zone"] == "us-east-1a"
    assert labels["topology.kubernetes.io/region"] == "us-east-1"
    assert node["spec"]["taints"] == [
        {"key": "node-role.kubernetes.io/control-plane", "effect": "NoSchedule"}
    ]
    # Loopback, never the instance's private address.
    assert {"type": "InternalIP", "address": "127.78.0.9"} in node["status"]["addresses"]
    worker = node_manifest(machine(8), "127.78.0.10")
    assert "node-role.kubernetes.io/worker" in worker["metadata"]["labels"]
    assert worker["spec"]["taints"] == []


def test_free_ip_skips_used_and_network_addresses() -> None:
    assert free_ip("127.78", []) == "127.78.0.1"
    used = [node_manifest(machine(1), "127.78.0.1"), node_manifest(machine(2), "127.78.0.2")]
    assert free_ip("127.78", used) == "127.78.0.3"
    full = [node_manifest(machine(i), f"127.78.0.{i}") for i in range(1, 255)]
    assert free_ip("127.78", full) == "127.78.1.1"
