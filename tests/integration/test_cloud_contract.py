"""One contract every cloud provider passes the same way: kwok, AWS (moto), GCP and Azure
(the local fakes of their APIs, through the official SDKs) (issue 24, SPEC F-NODE-6).

Every call is made by a fresh provider, as by an operator restarted after the previous
call: nothing a provider remembers may be what keeps it from asking the cloud twice. The
outcomes are read from the cloud (its own API) and from the cluster (Nodes that joined).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from kustos.devcluster.azurefake import AzureFake
from kustos.devcluster.cluster import DevCluster
from kustos.devcluster.gcpfake import GcpFake
from kustos.nodes.cloud import CancelsCreates
from kustos.runtime import objects
from kustos.runtime.api import Api
from kustos.runtime.cloud import (
    CapacityError,
    CloudProvider,
    Instance,
    InstanceState,
    NotFound,
    ProviderError,
    Role,
    Throttled,
)
from kustos.runtime.kube import connect, load_config
from kustos.runtime.metrics import Metrics
from kustos.runtime.resources import NODES
from tests.aws_support import MotoServer
from tests.cloud_support import (
    AwsCloud,
    AzureCloud,
    Cloud,
    GcpCloud,
    KwokCloud,
    ServiceAccount,
    azure_workload_identity,
    gcp_service_account_key,
    moto_with_ami_validation,
)
from tests.integration.kube import wait_until

pytestmark = pytest.mark.integration

CLOUDS = ("kwok", "aws", "gcp", "azure")
SIZE = 2


@pytest.fixture(scope="module")
def moto(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MotoServer]:
    with moto_with_ami_validation(tmp_path_factory.mktemp("moto")) as server:
        yield server


@pytest.fixture(scope="module")
def fakes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, object]]:
    """The GCP and Azure fakes, one each for the module (every test names its own groups)."""
    gcp, azure = GcpFake(), AzureFake()
    gcp.api.start()
    azure.start(tmp_path_factory.mktemp("azure"))
    yield {"gcp": gcp, "azure": azure}
    gcp.api.stop()
    azure.api.stop()


@pytest.fixture
async def api(dev_cluster: DevCluster) -> AsyncIterator[Api]:
    clients = connect(load_config(dev_cluster.kubeconfig), Metrics())
    yield Api(clients.raw)
    await clients.close()


@pytest.fixture(params=CLOUDS)
async def cloud(
    request: pytest.FixtureRequest, api: Api, dev_cluster: DevCluster, namespace: str, moto: MotoServer,
    fakes: dict[str, object], tmp_path: Path,
) -> AsyncIterator[Cloud]:  # fmt: skip
    """Every cloud as its users reach it; GCP with a service account key file as Application
    Default Credentials, Azure with workload identity (the dev cluster's token for the
    ``default`` ServiceAccount, federated), both through the SDKs' credential chains."""
    name: str = request.param
    prefix = namespace[-20:].strip("-")
    made: Cloud
    if name == "kwok":
        octets = str(dev_cluster.network.cidr.network_address).split(".")
        made = KwokCloud(name, api, prefix, pod_cidr_prefix=f"{octets[0]}.{octets[1]}")
    elif name == "aws":
        moto.reset()
        made = AwsCloud(name, api, prefix, moto=moto)
    elif name == "gcp":
        gcp: GcpFake = fakes["gcp"]  # type: ignore[assignment]
        made = GcpCloud(name, api, prefix, fake=gcp, environment=gcp_service_account_key(gcp, tmp_path))
    else:
        azure: AzureFake = fakes["azure"]  # type: ignore[assignment]
        identity = azure_workload_identity(azure, dev_cluster, ServiceAccount("default", "default"), tmp_path)
        made = AzureCloud(name, api, prefix, fake=azure, environment=identity)
    async with made.bridged():
        yield made
    if isinstance(made, KwokCloud):
        await made.cleanup()
    for fake in fakes.values():  # refusals and holds end with the test
        fake.quota_exhausted = False  # type: ignore[attr-defined]
        fake.quota_instances = None  # type: ignore[attr-defined]
        fake.hold_creations = False  # type: ignore[attr-defined]
        fake.api.faults.clear()  # type: ignore[attr-defined]


async def members(cloud: Cloud, group_id: str) -> list[Instance]:
    return [i for i in await cloud.provider().instances(group_id) if i.state != InstanceState.GONE]


async def desired(cloud: Cloud, group_id: str) -> int:
    [group] = [g for g in await cloud.provider().groups() if g.group_id == group_id]
    return group.desired


async def node_ready(cloud: Cloud, provider_id: str) -> dict[str, object] | None:
    for node in await cloud.api.list_objects(NODES, None, cloud.node_selector()):
        if (node.get("spec") or {}).get("providerID") == provider_id and objects.node_ready(node):
            return node
    return None


async def test_groups_are_listed_with_their_role_image_and_size(cloud: Cloud) -> None:
    cp = await cloud.make_group("cp", Role.CONTROL_PLANE, 1)
    workers = await cloud.make_group("w", Role.WORKER, SIZE)
    found = {g.group_id: g for g in await cloud.provider().groups()}
    assert found[cp].role == Role.CONTROL_PLANE and found[workers].role == Role.WORKER
    assert found[cp].image == found[workers].image == cloud.old
    assert (found[cp].desired, found[workers].desired) == (1, SIZE)
    listed = await members(cloud, workers)
    assert len(listed) == SIZE and all(i.group_id == workers and i.image == cloud.old for i in listed)
    for instance in listed:  # each is a Node that joined, and reads back one by one
        await wait_until(
            lambda i=instance: node_ready(cloud, i.provider_id), f"{instance.provider_id} joined"
        )
        alone = await cloud.provider().instance(instance.provider_id)
        assert (alone.group_id, alone.state) == (workers, InstanceState.RUNNING)


async def test_a_new_image_is_read_back_and_set_once_when_asked_again(cloud: Cloud) -> None:
    workers = await cloud.make_group("w", Role.WORKER, 1)
    await cloud.provider().set_image(workers, cloud.new)
    versions = await cloud.image_versions(workers)
    await cloud.provider().set_image(workers, cloud.new)  # a restarted operator asks again
    assert await cloud.image_versions(workers) == versions
    [group] = [g for g in await cloud.provider().groups() if g.group_id == workers]
    assert group.image == cloud.new
    # Running instances keep the image they were made from.
    assert [i.image for i in await members(cloud, workers)] == [cloud.old]


async def test_a_created_instance_joins_and_is_deleted_once(cloud: Cloud) -> None:
    workers = await cloud.make_group("w", Role.WORKER, SIZE)
    before = {i.provider_id for i in await members(cloud, workers)}
    await cloud.provider().create_instance(workers)

    async def listed() -> list[Instance]:
        return [i for i in await members(cloud, workers) if i.provider_id not in before]

    [new] = await wait_until(listed, "the new instance listed", timeout=30)
    await wait_until(lambda: node_ready(cloud, new.provider_id), "the new instance to join as a Ready Node")
    assert await desired(cloud, workers) == SIZE + 1  # one creation, whoever reads it now
    assert (await cloud.provider().instance(new.provider_id)).state == InstanceState.RUNNING

    await cloud.provider().delete_instance(workers, new.provider_id)
    # Retried by a restarted operator (the answer was lost): done already, or gone.
    with contextlib.suppress(NotFound):
        await cloud.provider().delete_instance(workers, new.provider_id)
    assert await desired(cloud, workers) == SIZE  # shrunk once

    async def gone() -> bool:
        ours = {i.provider_id: i for i in await members(cloud, workers)}
        return new.provider_id not in ours or ours[new.provider_id].state == InstanceState.STOPPING

    await wait_until(gone, "the deleted instance gone or on its way out", timeout=30)
    assert {i.provider_id for i in await members(cloud, workers)} >= before


async def test_a_stopped_instance_is_fenced(cloud: Cloud) -> None:
    workers = await cloud.make_group("w", Role.WORKER, 1)
    [instance] = await members(cloud, workers)
    await cloud.stop(instance.provider_id)
    stopped = await cloud.provider().instance(instance.provider_id)
    assert stopped.state.fenced and stopped.state == InstanceState.STOPPED


@pytest.mark.parametrize("why", ["capacity", "throttled"])
async def test_refusals_are_typed_and_create_nothing_more(cloud: Cloud, why: str) -> None:
    workers = await cloud.make_group("w", Role.WORKER, 1)
    await cloud.refuse_creates(why)
    expected = CapacityError if why == "capacity" else Throttled
    refused: ProviderError | None = None
    for _ in range(2):  # a cloud that accepts the request and fails the creation says so on the next
        try:
            await cloud.provider().create_instance(workers)
        except ProviderError as err:
            refused = err
            break
    assert isinstance(refused, expected), refused
    if isinstance(refused, Throttled):
        assert refused.retry_after == cloud.throttle_retry_after  # the delay the cloud asked for
        assert await desired(cloud, workers) == 1


async def test_a_foreign_provider_id_is_refused_never_not_found(cloud: Cloud) -> None:
    workers = await cloud.make_group("w", Role.WORKER, 1)
    foreign = cloud.foreign_provider_id()
    with pytest.raises(ProviderError) as refused:
        await cloud.provider().instance(foreign)
    assert not isinstance(refused.value, NotFound), refused.value
    with pytest.raises(ProviderError) as refused:
        await cloud.provider().delete_instance(workers, foreign)
    assert not isinstance(refused.value, NotFound), refused.value
    assert await desired(cloud, workers) == 1


async def test_a_launch_not_listed_yet_is_never_asked_twice_and_can_be_taken_back(cloud: Cloud) -> None:
    workers = await cloud.make_group("w", Role.WORKER, 1)
    provider: CloudProvider = cloud.provider()
    if not cloud.can_hold_launches:
        # kwok: a creation is listed at once, so none is ever outstanding nor to take back.
        await provider.create_instance(workers)
        assert len(await members(cloud, workers)) == 2
        assert not isinstance(provider, CancelsCreates)
        return
    await cloud.hold_launches()
    # Accepted (GCP, Azure) or refused at once (moto fails the launch in the call): either way
    # the group's size is raised and nothing is listed.
    with contextlib.suppress(ProviderError):
        await cloud.provider().create_instance(workers)
    for _ in range(2):  # restarted operators, each asking again
        with pytest.raises(ProviderError) as outstanding:
            await cloud.provider().create_instance(workers)
        assert outstanding.value.reason == "ProviderLaunchOutstanding"
    assert await desired(cloud, workers) == 2  # asked once
    fresh = cloud.provider()
    assert isinstance(fresh, CancelsCreates) and await fresh.cancel_create(workers)
    again = cloud.provider()
    assert isinstance(again, CancelsCreates) and not await again.cancel_create(workers)
    assert await desired(cloud, workers) == 1 and len(await members(cloud, workers)) == 1


def test_the_harness_covers_every_provider_kustos_has() -> None:
    from kustos.nodes.cloud import PROVIDERS

    assert set(PROVIDERS) - {"none"} == set(CLOUDS)
