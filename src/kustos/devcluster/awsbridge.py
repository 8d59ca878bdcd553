"""A bridge from EC2 instances of Auto Scaling Groups to kwok Nodes (dev tool, F-NODE).

There is no kubelet on moto's simulated instances, so nothing would register them as
Nodes. The bridge plays the part the kubelet and the AWS cloud controller manager play
on a real cluster, so a NodeImage rollout against a local AWS API (moto) runs end to end:

- a running (or pending) instance of a tagged group gets a kwok Node named by its private
  DNS name, as kubelet on AWS registers, with ``spec.providerID`` ``aws:///<zone>/<id>``,
  the AMI as the ``kustos.dev/image`` label, an InternalIP of its own (loopback, never the
  instance's private address: nothing here may send traffic to a private range), the
  role's label and taint, and its zone and instance type;
- a stopped (or stopping) instance's Node loses ``kustos.dev/kwok-managed``, so kwok
  stops its heartbeat and it goes NotReady, as a stopped machine's kubelet would; it gets
  the label back when the instance runs again;
- the Node of a terminated (or shutting-down, or vanished) instance is deleted, as the
  cloud controller manager's node lifecycle controller does.

Run it as ``python -m kustos.devcluster.awsbridge --kubeconfig K --endpoint-url URL``
(credentials and region from boto3's usual chain). The operator never imports it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import boto3
from botocore.config import Config

from kustos.devcluster.kwokconfig import MANAGED_LABEL
from kustos.runtime import objects
from kustos.runtime.api import Api, ApiStatusError
from kustos.runtime.resources import NODES

if TYPE_CHECKING:
    from mypy_boto3_autoscaling.client import AutoScalingClient
    from mypy_boto3_ec2.client import EC2Client

log = logging.getLogger(__name__)

BRIDGE_LABEL = "kustos.dev/aws-bridge"
IMAGE_LABEL = "kustos.dev/image"
ROLE_TAG = "kustos.dev/role"
GROUP_TAG = "aws:autoscaling:groupName"
INSTANCE_ANNOTATION = "kustos.dev/aws-instance"
PRIVATE_IP_ANNOTATION = "kustos.dev/aws-private-ip"
STOPPED_ANNOTATION = "kustos.dev/aws-stopped"

LIVE = frozenset({"pending", "running"})
HALTED = frozenset({"stopping", "stopped"})
# shutting-down, terminated, or no longer known: the Node goes.


@dataclass(frozen=True)
class Machine:
    """What the bridge needs of one EC2 instance in a group."""

    instance_id: str
    zone: str
    state: str  # EC2's state name
    image: str
    dns_name: str
    private_ip: str
    group: str
    control_plane: bool
    instance_type: str = ""

    @property
    def provider_id(self) -> str:
        return f"aws:///{self.zone}/{self.instance_id}"


@dataclass
class Actions:
    create: list[Machine] = field(default_factory=list)
    delete: list[str] = field(default_factory=list)  # node names
    halt: list[str] = field(default_factory=list)
    resume: list[str] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.create or self.delete or self.halt or self.resume)


def plan(machines: Iterable[Machine], nodes: Iterable[Mapping[str, Any]]) -> Actions:
    """What to do so the bridge's Nodes mirror the machines; pure."""
    by_pid = {m.provider_id: m for m in machines}
    actions = Actions()
    seen: set[str] = set()
    for node in nodes:
        pid = str((node.get("spec") or {}).get("providerID") or "")
        name = objects.name(node)
        machine = by_pid.get(pid)
        seen.add(pid)
        if machine is None or machine.state not in LIVE | HALTED:
            if not objects.deleting(node):
                actions.delete.append(name)
            continue
        managed = objects.labels(node).get(MANAGED_LABEL) == "true"
        if machine.state in HALTED and managed:
            actions.halt.append(name)
        elif machine.state in LIVE and not managed:
            actions.resume.append(name)
    for pid, machine in sorted(by_pid.items()):
        if pid not in seen and machine.state in LIVE and machine.dns_name:
            actions.create.append(machine)
    return actions


def node_manifest(machine: Machine, internal_ip: str) -> dict[str, Any]:
    labels = {
        MANAGED_LABEL: "true",
        BRIDGE_LABEL: "true",
        IMAGE_LABEL: machine.image,
        "type": "kwok",
        "kubernetes.io/hostname": machine.dns_name,
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
        "topology.kubernetes.io/zone": machine.zone,
        "topology.kubernetes.io/region": machine.zone[:-1],
    }
    if machine.instance_type:
        labels["node.kubernetes.io/instance-type"] = machine.instance_type
    taints: list[dict[str, str]] = []
    if machine.control_plane:
        labels["node-role.kubernetes.io/control-plane"] = ""
        taints.append({"key": "node-role.kubernetes.io/control-plane", "effect": "NoSchedule"})
    else:
        labels["node-role.kubernetes.io/worker"] = ""
    capacity = {"cpu": "8", "memory": "32Gi", "pods": "110", "ephemeral-storage": "100Gi"}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": machine.dns_name,
            "labels": labels,
            "annotations": {
                INSTANCE_ANNOTATION: machine.instance_id,
                PRIVATE_IP_ANNOTATION: machine.private_ip,
            },
        },
        "spec": {"providerID": machine.provider_id, "taints": taints},
        "status": {
            "addresses": [
                {"type": "InternalIP", "address": internal_ip},
                {"type": "Hostname", "address": machine.dns_name},
                {"type": "InternalDNS", "address": machine.dns_name},
            ],
            "allocatable": capacity,
            "capacity": capacity,
        },
    }


def free_ip(prefix: str, nodes: Iterable[Mapping[str, Any]]) -> str:
    """The lowest ``<prefix>.<a>.<b>`` no Node has as an address (prefix: two octets)."""
    used: set[str] = set()
    for node in nodes:
        for address in (node.get("status") or {}).get("addresses") or []:
            used.add(str(address.get("address", "")))
    for index in range(1, 65000):
        a, b = divmod(index, 256)
        if b in (0, 255):
            continue
        ip = f"{prefix}.{a}.{b}"
        if ip not in used:
            return ip
    raise RuntimeError(f"no free node address left in {prefix}.0.0/16")


def _tags(tags: Iterable[Mapping[str, Any]] | None) -> dict[str, str]:
    return {str(t.get("Key")): str(t.get("Value") or "") for t in tags or ()}


class AwsBridge:
    """Mirrors the instances of every group tagged with ``role_tag`` as kwok Nodes."""

    def __init__(
        self, api: Api, ec2: EC2Client, autoscaling: AutoScalingClient,
        *, role_tag: str = ROLE_TAG, ip_prefix: str = "127.78",
    ) -> None:  # fmt: skip
        self.api = api
        self.ec2 = ec2
        self.autoscaling = autoscaling
        self.role_tag = role_tag
        self.ip_prefix = ip_prefix

    def machines(self) -> list[Machine]:
        """Blocking (boto3): every instance of every group with the role tag."""
        roles: dict[str, bool] = {}
        pages = self.autoscaling.get_paginator("describe_auto_scaling_groups").paginate(
            Filters=[{"Name": "tag-key", "Values": [self.role_tag]}]
        )
        ids: list[str] = []
        for page in pages:
            for group in page.get("AutoScalingGroups", []):
                role = _tags(group.get("Tags")).get(self.role_tag, "")
                roles[group["AutoScalingGroupName"]] = role.replace("-", "").lower() == "controlplane"
                ids.extend(i["InstanceId"] for i in group.get("Instances", []))
        machines: list[Machine] = []
        for start in range(0, len(ids), 100):
            chunk = ids[start : start + 100]
            pages_ = self.ec2.get_paginator("describe_instances").paginate(
                Filters=[{"Name": "instance-id", "Values": chunk}]
            )
            for page_ in pages_:
                for reservation in page_.get("Reservations", []):
                    for raw in reservation.get("Instances", []):
                        group_name = _tags(raw.get("Tags")).get(GROUP_TAG, "")
                        machines.append(
                            Machine(
                                instance_id=raw["InstanceId"],
                                zone=raw.get("Placement", {}).get("AvailabilityZone", ""),
                                state=raw.get("State", {}).get("Name", ""),
                                image=raw.get("ImageId", ""),
                                dns_name=raw.get("PrivateDnsName", ""),
                                private_ip=raw.get("PrivateIpAddress", ""),
                                group=group_name,
                                control_plane=roles.get(group_name, False),
                                instance_type=str(raw.get("InstanceType", "")),
                            )
                        )
        return machines

    async def sync(self) -> Actions:
        """One pass: read the groups' instances and the bridge's Nodes, then act on all."""
        machines = await asyncio.to_thread(self.machines)
        nodes = await self.api.list_objects(NODES, None, f"{BRIDGE_LABEL}=true")
        actions = plan(machines, nodes)
        all_nodes: list[Mapping[str, Any]] = (
            list(await self.api.list_objects(NODES)) if actions.create else []
        )
        for machine in actions.create:
            ip = free_ip(self.ip_prefix, all_nodes)
            manifest = node_manifest(machine, ip)
            try:
                await self.api.create(NODES, manifest)
            except ApiStatusError as err:
                if not err.conflict:
                    raise
                log.info("node %s exists (still being deleted?); next pass", machine.dns_name)
                continue
            all_nodes.append(manifest)
            log.info(
                "node %s for %s (%s, %s) created",
                machine.dns_name,
                machine.instance_id,
                machine.group,
                machine.image,
            )
        for name in actions.delete:
            await self.api.delete(NODES, None, name)
            log.info("node %s deleted: its instance is gone", name)
        for name in actions.halt:
            patch = {
                "metadata": {"labels": {MANAGED_LABEL: None}, "annotations": {STOPPED_ANNOTATION: "true"}}
            }
            await self.api.patch(NODES, None, name, patch)
            log.info("node %s: its instance stopped", name)
        for name in actions.resume:
            patch = {
                "metadata": {"labels": {MANAGED_LABEL: "true"}, "annotations": {STOPPED_ANNOTATION: None}}
            }
            await self.api.patch(NODES, None, name, patch)
            log.info("node %s: its instance runs again", name)
        return actions

    async def run(self, stop: asyncio.Event, interval: float = 0.5) -> None:
        while not stop.is_set():
            try:
                await self.sync()
            except Exception:  # a dev tool keeps going: log, and the next pass retries
                log.exception("AWS bridge pass failed")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), interval)


def clients(endpoint_url: str | None, region: str | None) -> tuple[EC2Client, AutoScalingClient]:
    session = boto3.session.Session(region_name=region or os.environ.get("AWS_REGION"))
    config = Config(retries={"mode": "standard", "max_attempts": 3}, connect_timeout=5, read_timeout=20)
    ec2 = session.client("ec2", endpoint_url=endpoint_url, config=config)
    autoscaling = session.client("autoscaling", endpoint_url=endpoint_url, config=config)
    return ec2, autoscaling


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--kubeconfig", type=Path, required=True)
    parser.add_argument("--endpoint-url", help="a local AWS API (moto); default: AWS itself")
    parser.add_argument("--region", help="default: boto3's (AWS_REGION, config file)")
    parser.add_argument("--role-tag", default=ROLE_TAG)
    parser.add_argument("--ip-prefix", default="127.78", help="two octets for the Nodes' InternalIPs")
    parser.add_argument("--interval", type=float, default=0.5, help="seconds between passes")
    return parser


def main(argv: Sequence[str] | None = None) -> None:
    from kustos.runtime.logs import setup_logging

    args = _parser().parse_args(argv)
    setup_logging("info")
    asyncio.run(_serve(args))


async def _serve(args: argparse.Namespace) -> None:
    from kustos.runtime.kube import connect, load_config
    from kustos.runtime.metrics import Metrics

    kube = connect(load_config(args.kubeconfig), Metrics())
    ec2, autoscaling = clients(args.endpoint_url, args.region)
    bridge = AwsBridge(
        Api(kube.raw, field_manager="kustos-aws-bridge"),
        ec2,
        autoscaling,
        role_tag=args.role_tag,
        ip_prefix=args.ip_prefix,
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    log.info("AWS bridge: groups tagged %s at %s", args.role_tag, args.endpoint_url or "AWS")
    try:
        await bridge.run(stop, args.interval)
    finally:
        await kube.close()


if __name__ == "__main__":
    main()
