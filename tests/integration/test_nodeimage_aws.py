"""The AWS path end to end: a local AWS API (moto), the bridge that makes its instances kwok
Nodes, and the operator with ``--cloud-provider aws`` (issue 15).

The cloud is faked at its network boundary only: moto serves EC2 and Auto Scaling over
HTTP on loopback, the operator's AWS provider makes its real boto3 calls to it, and the
bridge (``kustos.devcluster.awsbridge``, a separate process) plays kubelet and the cloud
controller manager: an instance in a group becomes a Node with its providerID and AMI, a
terminated one loses its Node.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from kustos.devcluster.awsbridge import BRIDGE_LABEL, IMAGE_LABEL
from kustos.devcluster.cluster import DevCluster
from kustos.devcluster.kwokconfig import MANAGED_LABEL
from tests.aws_support import (
    NEW_IMAGE,
    OLD_IMAGE,
    MotoServer,
    aws_environment,
    group,
    instance_ids,
    make_group,
    moto_server,
)
from tests.integration.kube import wait_until
from tests.integration.operator import REPO

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
