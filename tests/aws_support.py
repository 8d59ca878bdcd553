"""A real local AWS API for the AWS provider's tests: moto's server on loopback.

moto (``moto[server]``, a dev dependency) serves EC2 and Auto Scaling over HTTP as AWS
does; boto3 talks to it through ``endpoint_url`` like to any AWS endpoint. Nothing in
kustos is mocked: the provider makes its real calls over a real socket. One server per
test module; ``reset`` clears its state between tests.

What moto does not do, and the tests therefore do not rely on: it refuses no desired
capacity above MaxSize and no terminate below MinSize (the provider checks both itself),
never throttles (the mapping of throttling is tested with botocore's Stubber), answers
a terminate of an unknown instance with HTTP 500, and makes a launch template version from
``SourceVersion`` with only the data given (AWS copies the rest of the source version).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import boto3
import httpx

from kustos.devcluster.ports import free_port

REGION = "us-east-1"
ZONE = "us-east-1a"
# moto accepts any credentials; these keep boto3 from looking for real ones.
CREDENTIALS = {"aws_access_key_id": "testing", "aws_secret_access_key": "testing"}
OLD_IMAGE = "ami-0000000000000000a"
NEW_IMAGE = "ami-0000000000000000b"
# One of the AMIs moto knows (its default list): the one image that launches when moto's
# AMI validation (MOTO_ENABLE_AMI_VALIDATION) is on.
MOTO_AMI = "ami-03cf127a"


@dataclass
class MotoServer:
    process: subprocess.Popen[bytes]
    port: int
    log_file: Path

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def reset(self) -> None:
        """Forget every resource (moto's own reset endpoint)."""
        httpx.post(f"{self.endpoint}/moto-api/reset", timeout=10).raise_for_status()

    def client(self, service: str, region: str = REGION) -> Any:
        return boto3.client(service, region_name=region, endpoint_url=self.endpoint, **CREDENTIALS)

    def options(self, **extra: str) -> dict[str, str]:
        """``--cloud-option`` values for the provider against this server."""
        return {"region": REGION, "endpoint-url": self.endpoint, **extra}

    def environment(self) -> dict[str, str]:
        return aws_environment()


def aws_environment() -> dict[str, str]:
    """What a process using boto3's credential chain needs for moto, and nothing of the
    machine's own: no shared config files, and never an instance metadata service (boto3
    would ask a link-local address for credentials otherwise)."""
    return {
        "AWS_ACCESS_KEY_ID": CREDENTIALS["aws_access_key_id"],
        "AWS_SECRET_ACCESS_KEY": CREDENTIALS["aws_secret_access_key"],
        "AWS_REGION": REGION,
        "AWS_DEFAULT_REGION": REGION,
        "AWS_EC2_METADATA_DISABLED": "true",
        "AWS_CONFIG_FILE": "/dev/null",
        "AWS_SHARED_CREDENTIALS_FILE": "/dev/null",
    }


@contextmanager
def moto_server(log_dir: Path, timeout: float = 60, **settings: str) -> Iterator[MotoServer]:
    """moto's server on 127.0.0.1 and a free port, until the block ends (``settings``: moto's
    environment variables, which it reads once, at import)."""
    port = free_port()
    log_dir.mkdir(parents=True, exist_ok=True)
    log_file = log_dir / f"moto-{port}.log"
    with log_file.open("ab") as sink:
        process = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
            stdout=sink,
            stderr=sink,
            env={**os.environ, **settings},
        )
    server = MotoServer(process, port, log_file)
    try:
        deadline = time.monotonic() + timeout
        while True:
            if process.poll() is not None:
                raise AssertionError(f"moto exited with {process.returncode}: {log_file.read_text()[-2000:]}")
            try:
                httpx.get(f"{server.endpoint}/moto-api/", timeout=1)
                break
            except httpx.HTTPError:
                if time.monotonic() > deadline:
                    raise AssertionError(f"moto did not answer within {timeout:.0f}s") from None
                time.sleep(0.1)
        yield server
    finally:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)


def make_group(
    server: MotoServer,
    name: str,
    role: str | None,
    *,
    image: str = OLD_IMAGE,
    size: int = 2,
    min_size: int = 0,
    max_size: int = 10,
    version: str = "$Default",
    tags: dict[str, str] | None = None,
    zone: str = ZONE,
    region: str = REGION,
) -> str:
    """A launch template and an Auto Scaling Group launching ``size`` instances from it, as
    an installer would make them; returns the template id."""
    ec2, autoscaling = server.client("ec2", region), server.client("autoscaling", region)
    template = ec2.create_launch_template(
        LaunchTemplateName=f"{name}-template",
        LaunchTemplateData={"ImageId": image, "InstanceType": "t3.medium"},
    )["LaunchTemplate"]["LaunchTemplateId"]
    all_tags = dict(tags or {})
    if role is not None:
        all_tags["kustos.dev/role"] = role
    autoscaling.create_auto_scaling_group(
        AutoScalingGroupName=name,
        LaunchTemplate={"LaunchTemplateId": template, "Version": version},
        MinSize=min_size,
        MaxSize=max_size,
        DesiredCapacity=size,
        AvailabilityZones=[zone],
        Tags=[{"Key": k, "Value": v, "PropagateAtLaunch": True} for k, v in all_tags.items()],
    )
    return str(template)


def group(server: MotoServer, name: str, region: str = REGION) -> dict[str, Any]:
    groups = server.client("autoscaling", region).describe_auto_scaling_groups(AutoScalingGroupNames=[name])
    return dict(groups["AutoScalingGroups"][0])


def instance_ids(server: MotoServer, name: str, region: str = REGION) -> list[str]:
    return sorted(i["InstanceId"] for i in group(server, name, region)["Instances"])


def ec2_instance(server: MotoServer, instance_id: str, region: str = REGION) -> dict[str, Any]:
    reservations = server.client("ec2", region).describe_instances(InstanceIds=[instance_id])["Reservations"]
    return dict(reservations[0]["Instances"][0])
