"""One harness per cloud for the provider contract (tests/integration/test_cloud_contract.py)
and the rollouts on each cloud: kwok Nodes, AWS (moto), GCP and Azure (the local fakes).

A harness makes groups as a user would (through the cloud's own API, never through the
provider under test), gives a fresh provider for every call (a restarted operator has
nothing in memory), says how the cloud refuses, and runs the bridge that makes the
cloud's instances Nodes (kwok's provider makes Nodes itself).

GCP and Azure authenticate as a user's operator would, through the SDKs' own credential
chains configured by environment and files (``environment``, in force while a harness is
used, and given to the operator process): Application Default Credentials and
DefaultAzureCredential against the fakes' token endpoints, with the dev cluster as the
OIDC issuer of the workload identity tokens.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from unittest import mock

import yaml

from kustos.devcluster.awsbridge import BRIDGE_LABEL as AWS_BRIDGE_LABEL
from kustos.devcluster.awsbridge import AwsBridge
from kustos.devcluster.azurefake import FEDERATION_AUDIENCE, AzureFake
from kustos.devcluster.cloudbridge import BRIDGE_LABEL, CloudBridge
from kustos.devcluster.cluster import DevCluster
from kustos.devcluster.fakeidentity import jwks_keys
from kustos.devcluster.gcpfake import GcpFake, PoolProvider, gce_error
from kustos.nodes.cloud.kwok import GROUP_LABEL, MANAGED_LABEL, KwokProvider
from kustos.runtime.api import Api
from kustos.runtime.cloud import CloudProvider, Role
from kustos.runtime.resources import CONFIGMAPS, NODES
from tests.aws_support import MOTO_AMI, MotoServer, aws_environment, group, make_group, moto_server

GALLERY = (
    "/subscriptions/{s}/resourceGroups/images/providers/Microsoft.Compute/galleries/os/images/node/versions/"
)
OLD = {
    "kwok": "kwok-os:v1",
    "aws": MOTO_AMI,
    "gcp": "projects/images/global/images/node-v1",
    "azure": GALLERY + "1.0.0",
}
NEW = {"kwok": "kwok-os:v2", "aws": "ami-0000000000000000b", "gcp": "projects/images/global/images/node-v2",
       "azure": GALLERY + "/versions/2.0.0"}  # fmt: skip
KWOK_NAMESPACE = "kube-system"


@dataclass
class Cloud:
    """What every harness gives; ``name`` is the ``--cloud-provider`` value."""

    name: str
    api: Api
    prefix: str  # the test's groups are named after it
    groups: list[str] = field(default_factory=list)
    can_hold_launches: bool = True
    throttle_retry_after: float = 0.0
    pod_cidr_prefix: str | None = None  # bridge Nodes get pod ranges of the dev cluster's network
    environment: dict[str, str] = field(default_factory=dict)  # the credentials, for provider and operator

    @property
    def old(self) -> str:
        return OLD[self.name]

    @property
    def new(self) -> str:
        return NEW[self.name]

    def provider(self) -> CloudProvider:
        raise NotImplementedError

    async def make_group(self, suffix: str, role: Role, size: int) -> str:
        raise NotImplementedError

    async def refuse_creates(self, why: str) -> None:
        """``capacity`` or ``throttled``: the cloud refuses the next creation so."""
        raise NotImplementedError

    async def hold_launches(self) -> None:
        """Creations are accepted but not listed (a launch outstanding)."""
        raise NotImplementedError

    async def stop(self, provider_id: str) -> None:
        """The instance stops, as its owner would stop it."""
        raise NotImplementedError

    def foreign_provider_id(self) -> str:
        raise NotImplementedError

    async def image_versions(self, group_id: str) -> int:
        """How many launch configurations the group's image changes made (templates,
        template versions, model updates)."""
        return 0

    def node_selector(self) -> str:
        return f"{BRIDGE_LABEL}=true"

    def options(self) -> dict[str, str]:
        """``--cloud-option`` values of the operator's provider."""
        raise NotImplementedError

    @contextlib.asynccontextmanager
    async def bridged(self) -> AsyncIterator[None]:
        """The bridge from the cloud's instances to Nodes while the block runs (with the
        harness's credential environment in force); its Nodes removed afterwards."""
        with mock.patch.dict(os.environ, self.environment):
            async with self._bridged():
                yield

    @contextlib.asynccontextmanager
    async def _bridged(self) -> AsyncIterator[None]:
        # A provider's first call loads its cloud's SDK in a worker thread, and the imports add
        # loggers. Made here, it is awaited within the fixture; made by the bridge's first pass,
        # it ran while pytest began the test's next phase, which iterates logging's loggers to
        # attach its handlers: "dictionary changed size during iteration" failed a test.
        await self.provider().groups()
        stop = asyncio.Event()
        task = asyncio.create_task(self._bridge(stop))
        try:
            yield
        finally:
            stop.set()
            await task
            for node in await self.api.list_objects(NODES, None, self.node_selector()):
                await self.api.delete(NODES, None, node["metadata"]["name"])

    async def _bridge(self, stop: asyncio.Event) -> None:
        await CloudBridge(self.api, self.provider(), pod_cidr_prefix=self.pod_cidr_prefix).run(stop, 0.2)


# ---- kwok ----------------------------------------------------------------------------------


@dataclass
class KwokCloud(Cloud):
    can_hold_launches: bool = False
    throttle_retry_after: float = 2.0

    @property
    def configmap(self) -> str:
        return f"kwok-groups-{self.prefix}"

    def provider(self) -> KwokProvider:
        return KwokProvider(self.api, namespace=KWOK_NAMESPACE, configmap=self.configmap,
                            pod_cidr_prefix=self.pod_cidr_prefix, first_index=150)  # fmt: skip

    def options(self) -> dict[str, str]:
        return {"namespace": KWOK_NAMESPACE, "configmap": self.configmap, "ip-prefix": "127.77",
                "pod-cidr-prefix": self.pod_cidr_prefix, "first-index": "150"}  # fmt: skip

    async def _config(self) -> list[dict[str, Any]]:
        cm = await self.api.get(CONFIGMAPS, KWOK_NAMESPACE, self.configmap)
        return list(yaml.safe_load(cm["data"]["groups.yaml"])) if cm else []

    async def _write(self, groups: list[dict[str, Any]]) -> None:
        data = {"groups.yaml": yaml.safe_dump(groups, sort_keys=False)}
        if await self.api.get(CONFIGMAPS, KWOK_NAMESPACE, self.configmap) is None:
            meta = {"name": self.configmap, "namespace": KWOK_NAMESPACE}
            await self.api.create(
                CONFIGMAPS, {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "data": data}
            )
        else:
            await self.api.patch(CONFIGMAPS, KWOK_NAMESPACE, self.configmap, {"data": data})

    async def make_group(self, suffix: str, role: Role, size: int) -> str:
        group_id = f"{self.prefix}-{suffix}"
        groups = await self._config()
        groups.append(
            {"id": group_id, "role": str(role), "image": self.old, "max": size + 3, "readyAfterSeconds": 0}
        )
        await self._write(groups)
        for _ in range(size):
            await self.provider().create_instance(group_id)
        self.groups.append(group_id)
        return group_id

    async def refuse_creates(self, why: str) -> None:
        groups = await self._config()
        for g in groups:
            g["failCreate"] = why
        await self._write(groups)

    async def hold_launches(self) -> None:
        raise AssertionError("kwok creates at once: no launch is ever outstanding")

    async def stop(self, provider_id: str) -> None:
        name = provider_id.removeprefix("kwok://")
        await self.api.patch(NODES, None, name, {"metadata": {"labels": {MANAGED_LABEL: None}}})

    def foreign_provider_id(self) -> str:
        return "aws:///us-east-1a/i-0123456789abcdef0"

    def node_selector(self) -> str:
        return f"{GROUP_LABEL} in ({','.join(self.groups)})" if self.groups else f"{GROUP_LABEL}=none"

    async def _bridge(self, stop: asyncio.Event) -> None:
        await stop.wait()  # kwok's provider makes the Nodes itself

    async def cleanup(self) -> None:
        with contextlib.suppress(Exception):
            await self.api.delete(CONFIGMAPS, KWOK_NAMESPACE, self.configmap)


# ---- AWS (moto) ----------------------------------------------------------------------------


@contextlib.contextmanager
def moto_with_ami_validation(log_dir: Path) -> Iterator[MotoServer]:
    """moto whose launches fail on an AMI it does not have (a launch then stays outstanding,
    as on AWS); boto3's credential chain fed with moto's credentials meanwhile."""
    environment = {"MOTO_ENABLE_AMI_VALIDATION": "true", **aws_environment()}
    with mock.patch.dict(os.environ, environment), moto_server(log_dir) as server:
        yield server


@dataclass
class AwsCloud(Cloud):
    moto: MotoServer | None = None
    throttle_retry_after: float = 5.0  # AWS's throttling carries no Retry-After: kustos waits 5 s
    throttles_left: int = 0  # requests still answered "Throttling"

    @property
    def aws(self) -> MotoServer:
        assert self.moto is not None
        return self.moto

    def provider(self) -> CloudProvider:
        from kustos.nodes.cloud.aws import AwsProvider

        provider = AwsProvider.from_options(self.aws.options(**{"cache-seconds": "0"}))
        provider._autoscaling.meta.events.register("before-send", self._throttle)
        return provider

    def _throttle(self, request: Any, **_: Any) -> Any:
        """botocore's before-send hook: AWS's answer to a throttled request instead of sending it."""
        if self.throttles_left <= 0:
            return None
        self.throttles_left -= 1
        return _throttled(request)

    async def make_group(self, suffix: str, role: Role, size: int) -> str:
        name = f"{self.prefix}-{suffix}"
        await asyncio.to_thread(
            make_group, self.aws, name, str(role), image=self.old, size=size, max_size=size + 3
        )
        self.groups.append(name)
        return name

    async def refuse_creates(self, why: str) -> None:
        if why == "throttled":
            # One call's every attempt: the provider's max_attempts of 3 are botocore's
            # retries, after the first try.
            self.throttles_left = 4
            return
        for name in self.groups:  # at its maximum: no room for one more
            desired = group(self.aws, name)["DesiredCapacity"]
            self.aws.client("autoscaling").update_auto_scaling_group(
                AutoScalingGroupName=name, MaxSize=desired
            )

    async def hold_launches(self) -> None:
        """Launches fail in moto from a template on an AMI it does not have: the desired
        capacity is raised and no instance is listed, as while AWS launches."""
        ec2 = self.aws.client("ec2")
        for name in self.groups:
            template = group(self.aws, name)["LaunchTemplate"]["LaunchTemplateId"]
            version = ec2.create_launch_template_version(
                LaunchTemplateId=template, SourceVersion="1", LaunchTemplateData={"ImageId": self.new}
            )["LaunchTemplateVersion"]["VersionNumber"]
            ec2.modify_launch_template(LaunchTemplateId=template, DefaultVersion=str(version))

    async def stop(self, provider_id: str) -> None:
        self.aws.client("ec2").stop_instances(InstanceIds=[provider_id.rpartition("/")[2]])

    def foreign_provider_id(self) -> str:
        return "gce://kustos-test/us-central1-a/node-1"

    async def image_versions(self, group_id: str) -> int:
        template = group(self.aws, group_id)["LaunchTemplate"]["LaunchTemplateId"]
        versions = self.aws.client("ec2").describe_launch_template_versions(LaunchTemplateId=template)
        return len(versions["LaunchTemplateVersions"])

    def node_selector(self) -> str:
        return f"{AWS_BRIDGE_LABEL}=true"

    async def _bridge(self, stop: asyncio.Event) -> None:
        bridge = AwsBridge(self.api, self.aws.client("ec2"), self.aws.client("autoscaling"))
        await bridge.run(stop, 0.2)


def _throttled(request: Any) -> Any:
    """AWS's answer to a throttled request."""
    from botocore.awsrequest import AWSResponse

    body = (b"<ErrorResponse><Error><Type>Sender</Type><Code>Throttling</Code>"
            b"<Message>Rate exceeded</Message></Error></ErrorResponse>")  # fmt: skip

    class Raw:
        def stream(self, **_: Any) -> Iterator[bytes]:
            yield body

    return AWSResponse(request.url, 400, {"content-type": "text/xml"}, Raw())


# ---- GCP (the local fake) ------------------------------------------------------------------


@dataclass
class GcpCloud(Cloud):
    fake: GcpFake = field(default_factory=GcpFake)
    throttle_retry_after: float = 7.0

    def options(self) -> dict[str, str]:
        return {"project": self.fake.project, "endpoint": self.fake.api.url}

    def provider(self) -> CloudProvider:
        from kustos.nodes.cloud.gcp import GcpProvider

        return GcpProvider.from_options({**self.options(), "cache-seconds": "0"})

    async def make_group(self, suffix: str, role: Role, size: int) -> str:
        label = "control-plane" if role == Role.CONTROL_PLANE else "worker"
        # One of each: a zonal group on a global template, a regional one on a regional template.
        region = "us-central1" if role == Role.WORKER else None
        group_id = self.fake.add_group(
            f"{self.prefix}-{suffix}",
            label,
            self.old,
            size,
            region=region,
            regional_template=region is not None,
        )
        self.groups.append(group_id)
        return group_id

    async def refuse_creates(self, why: str) -> None:
        if why == "capacity":
            self.fake.quota_exhausted = True
            return
        for api in ("instanceGroupManagers.resize", "regionInstanceGroupManagers.resize"):
            self.fake.api.fail(api, 429, gce_error(429, "rateLimitExceeded", "Rate Limit Exceeded"),
                               headers={"Retry-After": "7"})  # fmt: skip

    async def hold_launches(self) -> None:
        self.fake.hold_creations = True

    async def stop(self, provider_id: str) -> None:
        _, zone, name = provider_id.removeprefix("gce://").split("/")
        self.fake.stop(zone, name)

    def foreign_provider_id(self) -> str:
        return "gce://another-project/us-central1-a/node-1"

    async def image_versions(self, group_id: str) -> int:
        return len(self.fake.templates)


# ---- Azure (the local fake) ----------------------------------------------------------------


@dataclass
class AzureCloud(Cloud):
    fake: AzureFake = field(default_factory=AzureFake)
    throttle_retry_after: float = 11.0

    @property
    def old(self) -> str:
        return OLD["azure"].format(s=self.fake.subscription)

    @property
    def new(self) -> str:
        return NEW["azure"].format(s=self.fake.subscription)

    def options(self) -> dict[str, str]:
        return self.fake.options(token_file=False)

    def provider(self) -> CloudProvider:
        from kustos.nodes.cloud.azure import AzureProvider

        return AzureProvider.from_options({**self.options(), "cache-seconds": "0"})

    async def make_group(self, suffix: str, role: Role, size: int) -> str:
        label = "control-plane" if role == Role.CONTROL_PLANE else "worker"
        mode = "Flexible" if role == Role.WORKER else "Uniform"  # one of each
        group_id = self.fake.add_scale_set(f"{self.prefix}-{suffix}", label, self.old, size, mode=mode)
        self.groups.append(group_id)
        return group_id

    async def refuse_creates(self, why: str) -> None:
        if why == "capacity":
            self.fake.quota_instances = self.fake.vm_count()
            return
        body = {
            "error": {"code": "OperationNotAllowed", "message": "too many requests for this subscription"}
        }
        self.fake.api.fail("virtualMachineScaleSets.get", 429, body, headers={"Retry-After": "11"})

    async def hold_launches(self) -> None:
        self.fake.hold_creations = True

    async def stop(self, provider_id: str) -> None:
        for group_id in self.groups:
            for instance_id, vm in self.fake.scale_set(group_id).vms.items():
                if provider_id.lower().endswith(f"/{instance_id}".lower()) or provider_id.endswith(vm.name):
                    self.fake.stop(group_id, instance_id)
                    return
        raise AssertionError(f"no VM {provider_id}")

    def foreign_provider_id(self) -> str:
        return ("azure:///subscriptions/11111111-1111-1111-1111-111111111111/resourceGroups/rg/providers/"
                "Microsoft.Compute/virtualMachineScaleSets/set/virtualMachines/0")  # fmt: skip

    async def image_versions(self, group_id: str) -> int:
        return self.fake.image_updates


# ---- credentials: the dev cluster as the OIDC issuer of workload identity tokens -----------

AZURE_CLIENT = "6f1c0de2-0000-4000-8000-00000000c0de"


@dataclass(frozen=True)
class ServiceAccount:
    namespace: str
    name: str

    @property
    def subject(self) -> str:
        return f"system:serviceaccount:{self.namespace}:{self.name}"


OPERATOR_ACCOUNT = ServiceAccount("kustos-system", "kustos")  # the chart's


def projected_token(cluster: DevCluster, account: ServiceAccount, audience: str, path: Path) -> Path:
    """The token kubelet projects into a pod of ``account`` for ``audience`` (as AKS workload
    identity's webhook and GCP's credential configuration ask for), from the TokenRequest API."""
    token = cluster.kubectl(
        "create", "token", account.name, "-n", account.namespace, "--audience", audience, "--duration", "3h"
    ).strip()
    path.write_text(token)
    return path


def cluster_issuer(cluster: DevCluster) -> tuple[str, dict[str, Any]]:
    """The dev cluster's service account issuer and signing keys, as its discovery documents
    publish them (what a federated credential or pool provider is made to trust)."""
    issuer = json.loads(cluster.kubectl("get", "--raw", "/.well-known/openid-configuration"))["issuer"]
    return str(issuer), jwks_keys(json.loads(cluster.kubectl("get", "--raw", "/openid/v1/jwks")))


def azure_workload_identity(
    fake: AzureFake, cluster: DevCluster, account: ServiceAccount, directory: Path, *, federate: bool = True
) -> dict[str, str]:
    """AKS workload identity for ``account``: a federated credential of the app for the
    cluster's issuer (unless ``federate`` is false: a user who has not made it yet), its
    projected token, and the environment the webhook gives the pod."""
    if federate:
        issuer, keys = cluster_issuer(cluster)
        fake.federate(AZURE_CLIENT, issuer, account.subject, keys)
    else:
        fake.add_app(AZURE_CLIENT)
    directory.mkdir(parents=True, exist_ok=True)
    token = projected_token(cluster, account, FEDERATION_AUDIENCE, directory / "azure-identity-token")
    return fake.credential_environment(AZURE_CLIENT, token)


def gcp_workload_identity(
    fake: GcpFake, cluster: DevCluster, account: ServiceAccount, directory: Path, *, bind: bool = True
) -> tuple[dict[str, str], PoolProvider]:
    """Workload identity federation for ``account``: a pool provider trusting the cluster's
    issuer, the account's principal given a role (unless ``bind`` is false), its projected
    token and the credential configuration as Application Default Credentials."""
    issuer, keys = cluster_issuer(cluster)
    pool = fake.add_pool_provider(
        "kubernetes", "dev-cluster", issuer, keys, {account.subject} if bind else set()
    )
    directory.mkdir(parents=True, exist_ok=True)
    token = projected_token(cluster, account, pool.allowed_audience, directory / "gcp-token")
    adc = fake.external_account_file(directory / "credential-configuration.json", pool, token)
    return {"GOOGLE_APPLICATION_CREDENTIALS": str(adc), "GOOGLE_CLOUD_PROJECT": fake.project}, pool


def gcp_service_account_key(fake: GcpFake, directory: Path) -> dict[str, str]:
    """A service account key file as Application Default Credentials."""
    directory.mkdir(parents=True, exist_ok=True)
    adc = fake.service_account_key(directory / "service-account-key.json")
    return {"GOOGLE_APPLICATION_CREDENTIALS": str(adc), "GOOGLE_CLOUD_PROJECT": fake.project}


__all__ = [
    "AZURE_CLIENT",
    "NEW",
    "OLD",
    "OPERATOR_ACCOUNT",
    "AwsCloud",
    "AzureCloud",
    "Cloud",
    "GcpCloud",
    "KwokCloud",
    "ServiceAccount",
    "azure_workload_identity",
    "cluster_issuer",
    "gcp_service_account_key",
    "gcp_workload_identity",
    "moto_with_ami_validation",
]
