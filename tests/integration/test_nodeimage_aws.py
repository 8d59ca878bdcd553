"""The AWS path end to end: a local AWS API (moto), the bridge that makes its instances kwok
Nodes, and the operator with ``--cloud-provider aws`` (issue 15).

The cloud is faked at its network boundary only: moto serves EC2 and Auto Scaling over
HTTP on loopback, the operator's AWS provider makes its real boto3 calls to it, and the
bridge (``kustos.devcluster.awsbridge``, a separate process) plays kubelet and the cloud
controller manager: an instance in a group becomes a Node with its providerID and AMI, a
terminated one loses its Node.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from kustos.devcluster.awsbridge import BRIDGE_LABEL, IMAGE_LABEL
from kustos.devcluster.cluster import DevCluster
from kustos.devcluster.kwokconfig import MANAGED_LABEL
from tests.aws_support import (
    NEW_IMAGE,
    OLD_IMAGE,
    MotoServer,
    aws_environment,
    ec2_instance,
    group,
    instance_ids,
    make_group,
    moto_server,
)
from tests.integration.conftest import Kubectl
from tests.integration.kube import wait_until
from tests.integration.operator import REPO, OperatorProcess, start_chart_operator

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def moto(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MotoServer]:
    with moto_server(tmp_path_factory.mktemp("moto")) as server:
        yield server


@contextmanager
def running_bridge(cluster: DevCluster, aws: MotoServer, log_dir: Path) -> Iterator[Path]:
    """The bridge as its own process, as a developer runs it; yields its log file."""
    log_dir.mkdir(parents=True, exist_ok=True)
    log_file = log_dir / "awsbridge.log"
    env = {**os.environ, **aws_environment(), "PYTHONPATH": str(REPO)}
    argv = [
        sys.executable, "-m", "kustos.devcluster.awsbridge",
        "--kubeconfig", str(cluster.kubeconfig), "--endpoint-url", aws.endpoint, "--interval", "0.3",
    ]  # fmt: skip
    with log_file.open("ab") as sink:
        process = subprocess.Popen(argv, stdout=sink, stderr=sink, env=env, cwd=REPO)
    try:
        yield log_file
    finally:
        process.terminate()
        try:
            process.wait(15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)


@pytest.fixture
async def aws(moto: MotoServer, dev_cluster: DevCluster, tmp_path: Path) -> AsyncIterator[MotoServer]:
    """A fresh AWS account with the bridge mirroring it; afterwards the account is emptied
    and the bridge removes the Nodes it made (as it does for terminated instances)."""
    moto.reset()
    with running_bridge(dev_cluster, moto, tmp_path / "bridge"):
        try:
            yield moto
        finally:
            moto.reset()

            async def no_bridge_nodes() -> bool:
                return not bridge_nodes(dev_cluster)

            await wait_until(no_bridge_nodes, "the bridge to remove its nodes", timeout=60)


def bridge_nodes(cluster: DevCluster) -> dict[str, dict[str, Any]]:
    """providerID -> Node, for the Nodes the bridge made."""
    nodes = json.loads(cluster.kubectl("get", "nodes", "-l", f"{BRIDGE_LABEL}=true", "-o", "json"))["items"]
    return {n["spec"]["providerID"]: n for n in nodes}


def ready(node: dict[str, Any]) -> bool:
    return any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in node.get("status", {}).get("conditions", [])
    )


def pid(aws: MotoServer, instance_id: str) -> str:
    return f"aws:///us-east-1a/{instance_id}"


async def test_the_bridge_mirrors_instances_as_nodes(aws: MotoServer, dev_cluster: DevCluster) -> None:
    make_group(aws, "bridge-cp", "ControlPlane", size=1)
    make_group(aws, "bridge-workers", "Worker", size=2)
    expected = {pid(aws, i) for name in ("bridge-cp", "bridge-workers") for i in instance_ids(aws, name)}

    async def all_ready() -> dict[str, dict[str, Any]] | None:
        nodes = bridge_nodes(dev_cluster)
        return nodes if set(nodes) == expected and all(ready(n) for n in nodes.values()) else None

    nodes = await wait_until(all_ready, "a Ready node per instance", timeout=60, cluster=dev_cluster)
    [cp] = instance_ids(aws, "bridge-cp")
    cp_node = nodes[pid(aws, cp)]
    assert cp_node["metadata"]["labels"][IMAGE_LABEL] == OLD_IMAGE
    assert "node-role.kubernetes.io/control-plane" in cp_node["metadata"]["labels"]
    assert cp_node["metadata"]["name"].endswith(".ec2.internal")
    internal = [a["address"] for a in cp_node["status"]["addresses"] if a["type"] == "InternalIP"]
    assert internal and internal[0].startswith("127.")

    # A stopped instance: its Node stops (kwok no longer heartbeats it).
    stopped = instance_ids(aws, "bridge-workers")[0]
    aws.client("ec2").stop_instances(InstanceIds=[stopped])

    async def unmanaged() -> bool:
        node = bridge_nodes(dev_cluster).get(pid(aws, stopped))
        return node is not None and MANAGED_LABEL not in node["metadata"]["labels"]

    await wait_until(unmanaged, "the stopped instance's node to stop", timeout=30, cluster=dev_cluster)

    # A terminated instance: its Node goes; the group's new instance (new image) gets one.
    ec2 = aws.client("ec2")
    template = group(aws, "bridge-workers")["LaunchTemplate"]["LaunchTemplateId"]
    version = ec2.create_launch_template_version(
        LaunchTemplateId=template, SourceVersion="1", LaunchTemplateData={"ImageId": NEW_IMAGE}
    )["LaunchTemplateVersion"]["VersionNumber"]
    ec2.modify_launch_template(LaunchTemplateId=template, DefaultVersion=str(version))
    victim = instance_ids(aws, "bridge-workers")[1]
    aws.client("autoscaling").terminate_instance_in_auto_scaling_group(
        InstanceId=victim, ShouldDecrementDesiredCapacity=False
    )

    async def replaced() -> bool:
        nodes = bridge_nodes(dev_cluster)
        images = sorted(n["metadata"]["labels"][IMAGE_LABEL] for n in nodes.values())
        return pid(aws, victim) not in nodes and len(nodes) == 3 and images.count(NEW_IMAGE) == 1

    await wait_until(replaced, "the terminated instance's node replaced", timeout=60, cluster=dev_cluster)


# ---- the rollout end to end -----------------------------------------------------------------

CP, WORKERS = "e2e-control-plane", "e2e-workers"
SIZE = 3


@contextmanager
def aws_operator(kubectl: Kubectl, aws: MotoServer, log_dir: Path) -> Iterator[OperatorProcess]:
    """``kustos run --cloud-provider aws`` against moto, with boto3's credential chain fed
    from the environment, as on a real cluster with IRSA or an instance profile."""
    process = start_chart_operator(
        kubectl.cluster, log_dir, "--namespace", kubectl.namespace,
        "--cloud-provider", "aws", "--cloud-option", "region=us-east-1",
        "--cloud-option", f"endpoint-url={aws.endpoint}",
        env=aws_environment(),
    )  # fmt: skip
    try:
        yield process
    finally:
        if process.alive():
            process.stop()


def remove_rollout_objects(cluster: DevCluster, name: str, groups: tuple[str, ...]) -> None:
    """The test's cluster-scoped objects: its NodeImage and the ScalingGroups and PendingNodes
    of its groups."""
    cluster.kubectl("delete", "nodeimage", name, "--wait=false", check=False)
    for kind in ("scalinggroups", "pendingnodes"):
        items = json.loads(cluster.kubectl("get", kind, "-o", "json", check=False) or "{}").get("items", [])
        for item in items:
            if (item.get("spec") or {}).get("groupId") in groups:
                cluster.kubectl("delete", kind, item["metadata"]["name"], "--wait=false", check=False)


def workload(name: str, replicas: int, min_available: int) -> list[dict[str, Any]]:
    """A Deployment on the bridge's worker nodes, one pod a node, with a budget."""
    labels = {"app": name}
    pod = {
        "containers": [{"name": "web", "image": "nginx:1.27"}],
        "nodeSelector": {BRIDGE_LABEL: "true", "node-role.kubernetes.io/worker": ""},
        "topologySpreadConstraints": [
            {"maxSkew": 1, "topologyKey": "kubernetes.io/hostname", "whenUnsatisfiable": "ScheduleAnyway",
             "labelSelector": {"matchLabels": labels}}
        ],
        "terminationGracePeriodSeconds": 0,
    }  # fmt: skip
    return [
        {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name},
         "spec": {"replicas": replicas, "selector": {"matchLabels": labels},
                  "template": {"metadata": {"labels": labels}, "spec": pod}}},
        {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": {"name": name},
         "spec": {"minAvailable": min_available, "selector": {"matchLabels": labels}}},
    ]  # fmt: skip


@dataclass
class Budgets:
    """What a watcher saw while the rollout ran, sampled from the AWS API and the cluster."""

    max_instances: dict[str, int] = field(default_factory=dict)
    max_unavailable: dict[str, int] = field(default_factory=dict)
    pdb_breaches: list[str] = field(default_factory=list)
    samples: int = 0


async def watch(
    aws: MotoServer, cluster: DevCluster, namespace: str, stop: asyncio.Event, seen: Budgets
) -> None:
    role_of = {CP: "node-role.kubernetes.io/control-plane", WORKERS: "node-role.kubernetes.io/worker"}
    while not stop.is_set():
        groups = await asyncio.to_thread(
            lambda: aws.client("autoscaling").describe_auto_scaling_groups(
                AutoScalingGroupNames=[CP, WORKERS]
            )
        )
        for g in groups["AutoScalingGroups"]:
            live = [i for i in g["Instances"] if not i["LifecycleState"].startswith("Terminat")]
            name = g["AutoScalingGroupName"]
            seen.max_instances[name] = max(seen.max_instances.get(name, 0), len(live))
        nodes = (await asyncio.to_thread(bridge_nodes, cluster)).values()
        for group_name, role in role_of.items():
            usable = sum(
                1 for n in nodes
                if role in n["metadata"]["labels"] and ready(n) and not n["spec"].get("unschedulable")
            )  # fmt: skip
            seen.max_unavailable[group_name] = max(seen.max_unavailable.get(group_name, 0), SIZE - usable)
        pdbs = await asyncio.to_thread(cluster.kubectl, "-n", namespace, "get", "pdb", "-o", "json")
        for pdb in json.loads(pdbs)["items"]:
            status = pdb.get("status") or {}
            if status.get("currentHealthy", 0) < status.get("desiredHealthy", 0):
                seen.pdb_breaches.append(f"{pdb['metadata']['name']}: {status}")
        seen.samples += 1
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 0.3)


@pytest.mark.timeout(900)
async def test_a_new_image_replaces_every_node_of_both_groups(
    aws: MotoServer, dev_cluster: DevCluster, kubectl: Kubectl, crds: None, tmp_path: Path
) -> None:
    make_group(aws, CP, "ControlPlane", size=SIZE, min_size=SIZE, max_size=SIZE + 1)
    make_group(aws, WORKERS, "Worker", size=SIZE, min_size=1, max_size=SIZE + 1)
    old = {pid(aws, i) for name in (CP, WORKERS) for i in instance_ids(aws, name)}

    async def nodes_up() -> bool:
        nodes = bridge_nodes(dev_cluster)
        return set(nodes) == old and all(ready(n) for n in nodes.values())

    await wait_until(nodes_up, "a Ready node per instance", timeout=60, cluster=dev_cluster)
    kubectl.apply(*workload("web", replicas=SIZE, min_available=SIZE - 1))

    async def web_ready() -> bool:
        deployment = kubectl.get("deployment", "web")
        return (deployment.get("status") or {}).get("readyReplicas") == SIZE

    await wait_until(
        web_ready, "the workload Ready", timeout=60, cluster=dev_cluster, namespace=kubectl.namespace
    )

    name = kubectl.namespace  # cluster-scoped: named after the test
    seen, stop = Budgets(), asyncio.Event()
    watcher = asyncio.create_task(watch(aws, dev_cluster, kubectl.namespace, stop, seen))
    try:
        with aws_operator(kubectl, aws, tmp_path / "operator") as operator:
            dev_cluster.kubectl(
                "apply", "-f", "-",
                input_text=yaml.safe_dump({
                    "apiVersion": "kustos.dev/v1alpha1", "kind": "NodeImage", "metadata": {"name": name},
                    "spec": {"image": NEW_IMAGE, "imageVersion": "2026.11", "joinTimeout": "120s",
                             "drainTimeout": "2m", "etcd": {"enabled": False}},
                }),
            )  # fmt: skip

            async def rolled_out() -> dict[str, Any] | None:
                nodes = bridge_nodes(dev_cluster)
                image = json.loads(dev_cluster.kubectl("get", "nodeimage", name, "-o", "json"))
                status = image.get("status") or {}
                done = (
                    len(nodes) == 2 * SIZE
                    and not set(nodes) & old
                    and all(n["metadata"]["labels"][IMAGE_LABEL] == NEW_IMAGE for n in nodes.values())
                    and all(ready(n) and not n["spec"].get("unschedulable") for n in nodes.values())
                    and status.get("progress") == f"{2 * SIZE}/{2 * SIZE}"
                )
                return image if done else None

            try:
                image = await wait_until(rolled_out, "every node replaced", timeout=600, interval=1)
            except AssertionError as err:
                raise AssertionError(f"{err}\noperator log (tail):\n{operator.log()[-6000:]}") from None
            table = dev_cluster.kubectl("get", "nodeimage", name)
    finally:
        stop.set()
        await watcher
        remove_rollout_objects(dev_cluster, name, (CP, WORKERS))

    # Every old instance is terminated in EC2; the groups are back to their size.
    ec2 = aws.client("ec2")
    for provider_id in old:
        assert ec2_instance(aws, provider_id.rsplit("/", 1)[1])["State"]["Name"] == "terminated"
    for group_name in (CP, WORKERS):
        described = group(aws, group_name)
        assert described["DesiredCapacity"] == SIZE
        template = described["LaunchTemplate"]["LaunchTemplateId"]
        [default] = ec2.describe_launch_template_versions(LaunchTemplateId=template, Versions=["$Default"])[
            "LaunchTemplateVersions"
        ]
        assert default["LaunchTemplateData"]["ImageId"] == NEW_IMAGE
    # Within every budget, all along: one extra instance at most per group (maxSurge 1),
    # no node unavailable beyond maxUnavailable 0, no PodDisruptionBudget broken.
    # A sample takes a few seconds (two kubectl calls and an AWS call); since the operator got
    # faster the whole rollout spans about ten. That it watched mid-rollout is the surge it saw.
    assert seen.samples >= 5
    assert seen.max_instances == {CP: SIZE + 1, WORKERS: SIZE + 1}, seen
    assert seen.max_unavailable == {CP: 0, WORKERS: 0}, seen
    assert not seen.pdb_breaches
    # kubectl shows the outcome.
    available = next(c for c in image["status"]["conditions"] if c["type"] == "Available")
    assert available["status"] == "True"
    assert NEW_IMAGE in table and f"{2 * SIZE}/{2 * SIZE}" in table
    assert (await asyncio.to_thread(kubectl.get, "deployment", "web"))["status"]["readyReplicas"] == SIZE


@pytest.mark.timeout(600)
async def test_a_group_at_its_maximum_is_reported_and_the_rollout_resumes_once_it_has_room(
    aws: MotoServer, dev_cluster: DevCluster, kubectl: Kubectl, crds: None, tmp_path: Path
) -> None:
    """MaxSize leaves no room for the surge: the NodeImage says so with AWS's numbers and
    creates nothing; raising MaxSize (in AWS, as a user would) lets the rollout finish."""
    make_group(aws, CP, "ControlPlane", size=1, min_size=1, max_size=1)
    make_group(aws, WORKERS, "Worker", size=1, min_size=1, max_size=2)
    old = {pid(aws, i) for name in (CP, WORKERS) for i in instance_ids(aws, name)}

    async def nodes_up() -> bool:
        nodes = bridge_nodes(dev_cluster)
        return set(nodes) == old and all(ready(n) for n in nodes.values())

    await wait_until(nodes_up, "a Ready node per instance", timeout=60, cluster=dev_cluster)
    name = kubectl.namespace
    try:
        with aws_operator(kubectl, aws, tmp_path / "operator") as operator:
            dev_cluster.kubectl(
                "apply", "-f", "-",
                input_text=yaml.safe_dump({
                    "apiVersion": "kustos.dev/v1alpha1", "kind": "NodeImage", "metadata": {"name": name},
                    "spec": {"image": NEW_IMAGE, "joinTimeout": "120s", "etcd": {"enabled": False}},
                }),
            )  # fmt: skip

            async def refused() -> dict[str, Any] | None:
                image = json.loads(dev_cluster.kubectl("get", "nodeimage", name, "-o", "json"))
                for c in (image.get("status") or {}).get("conditions") or []:
                    if c["type"] == "Degraded" and c.get("reason") == "ProviderCapacity":
                        return dict(c)
                return None

            condition = await wait_until(refused, "the capacity refusal in status", timeout=60)
            assert f"{CP} is at its maximum size (1 of 1)" in condition["message"]
            assert group(aws, CP)["DesiredCapacity"] == 1  # nothing was asked of AWS

            aws.client("autoscaling").update_auto_scaling_group(AutoScalingGroupName=CP, MaxSize=2)

            async def rolled_out() -> bool:
                nodes = bridge_nodes(dev_cluster)
                return (
                    len(nodes) == 2
                    and not set(nodes) & old
                    and all(n["metadata"]["labels"][IMAGE_LABEL] == NEW_IMAGE for n in nodes.values())
                    and all(ready(n) for n in nodes.values())
                )

            try:
                await wait_until(
                    rolled_out, "both nodes replaced once the group had room", timeout=300, interval=1
                )
            except AssertionError as err:
                raise AssertionError(f"{err}\noperator log (tail):\n{operator.log()[-6000:]}") from None
    finally:
        remove_rollout_objects(dev_cluster, name, (CP, WORKERS))
    assert [group(aws, g)["DesiredCapacity"] for g in (CP, WORKERS)] == [1, 1]


AWS_STEPS = ("CreateHeir", "ClaimInstance", "DeleteDonor")


@pytest.mark.timeout(900)
async def test_the_operator_killed_after_each_aws_step_asks_aws_for_nothing_twice(
    aws: MotoServer, dev_cluster: DevCluster, kubectl: Kubectl, crds: None, tmp_path: Path
) -> None:
    """Killed right after raising the desired capacity, after claiming the new instance and
    after terminating a donor: each restarted operator reads AWS and the cluster again and
    goes on, never a second heir for a donor (one extra instance at most), never a second
    decrement, no orphan instance."""
    make_group(aws, WORKERS, "Worker", size=SIZE, min_size=1, max_size=SIZE + 2)
    old = {pid(aws, i) for i in instance_ids(aws, WORKERS)}

    async def nodes_up() -> bool:
        nodes = bridge_nodes(dev_cluster)
        return set(nodes) == old and all(ready(n) for n in nodes.values())

    await wait_until(nodes_up, "a Ready node per instance", timeout=60, cluster=dev_cluster)
    name = kubectl.namespace
    seen, stop = Budgets(), asyncio.Event()
    watcher = asyncio.create_task(watch(aws, dev_cluster, kubectl.namespace, stop, seen))
    dev_cluster.kubectl(
        "apply", "-f", "-",
        input_text=yaml.safe_dump({
            "apiVersion": "kustos.dev/v1alpha1", "kind": "NodeImage", "metadata": {"name": name},
            "spec": {"image": NEW_IMAGE, "joinTimeout": "120s", "etcd": {"enabled": False}},
        }),
    )  # fmt: skip
    try:
        for step in AWS_STEPS:
            marker = tmp_path / f"fault-{step}"
            env = {"KUSTOS_FAULT_EXIT_AFTER": step, "KUSTOS_FAULT_MARKER": str(marker)}
            process = start_chart_operator(
                kubectl.cluster, tmp_path / "operator", "--namespace", kubectl.namespace,
                "--cloud-provider", "aws", "--cloud-option", "region=us-east-1",
                "--cloud-option", f"endpoint-url={aws.endpoint}",
                env={**aws_environment(), **env},
            )  # fmt: skip

            async def exited(p: OperatorProcess = process) -> bool:
                return not p.alive()

            try:
                await wait_until(exited, f"the operator to exit after {step}", timeout=180, interval=0.5)
            except AssertionError as err:
                process.stop()
                raise AssertionError(f"{err}\noperator log (tail):\n{process.log()[-4000:]}") from None
            assert process.wait() == 137 and marker.read_text() == step

        with aws_operator(kubectl, aws, tmp_path / "operator") as operator:

            async def rolled_out() -> bool:
                nodes = bridge_nodes(dev_cluster)
                return (
                    len(nodes) == SIZE
                    and not set(nodes) & old
                    and all(n["metadata"]["labels"][IMAGE_LABEL] == NEW_IMAGE for n in nodes.values())
                    and all(ready(n) and not n["spec"].get("unschedulable") for n in nodes.values())
                )

            try:
                await wait_until(rolled_out, "every node replaced after the crashes", timeout=300, interval=1)
            except AssertionError as err:
                raise AssertionError(f"{err}\noperator log (tail):\n{operator.log()[-6000:]}") from None
    finally:
        stop.set()
        await watcher
        remove_rollout_objects(dev_cluster, name, (WORKERS,))

    assert seen.max_instances[WORKERS] == SIZE + 1, seen  # never a second heir at once
    described = group(aws, WORKERS)
    assert described["DesiredCapacity"] == SIZE  # every increment matched by one decrement
    assert len(described["Instances"]) == SIZE
    for provider_id in old:
        assert ec2_instance(aws, provider_id.rsplit("/", 1)[1])["State"]["Name"] == "terminated"
