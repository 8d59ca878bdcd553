"""The AWS provider against a real local AWS API (moto's server on loopback).

No Kubernetes: the provider's calls go over HTTP to moto, which keeps Auto Scaling Groups,
launch templates and EC2 instances as AWS does. Outcomes are read back from the API with a
separate boto3 client, never from the provider's own answers alone.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from kustos.devcluster.ports import free_port
from kustos.nodes.cloud.aws import AwsProvider
from kustos.runtime.cloud import (
    CapacityError,
    CloudProvider,
    InstanceState,
    NotFound,
    ProviderError,
    Role,
)
from tests.aws_support import (
    MOTO_AMI,
    NEW_IMAGE,
    OLD_IMAGE,
    ZONE,
    MotoServer,
    aws_environment,
    ec2_instance,
    group,
    instance_ids,
    make_group,
    moto_server,
)


@pytest.fixture(autouse=True)
def hermetic_aws_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for key, value in aws_environment().items():
        monkeypatch.setenv(key, value)


@pytest.fixture(scope="module")
def moto(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MotoServer]:
    with moto_server(tmp_path_factory.mktemp("moto")) as server:
        yield server


@pytest.fixture(scope="module")
def moto_checking_amis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MotoServer]:
    """A second server, with moto's AMI validation on: a template on a missing AMI leaves a
    group's desired capacity above its instances, as AWS does while a launch is under way."""
    with moto_server(tmp_path_factory.mktemp("moto-amis"), MOTO_ENABLE_AMI_VALIDATION="true") as server:
        yield server


@pytest.fixture
def aws_checking_amis(moto_checking_amis: MotoServer) -> MotoServer:
    moto_checking_amis.reset()
    return moto_checking_amis


@pytest.fixture
def aws(moto: MotoServer) -> MotoServer:
    moto.reset()
    return moto


@pytest.fixture
def provider(aws: MotoServer) -> AwsProvider:
    return AwsProvider.from_options(aws.options())


def count_calls(provider: AwsProvider) -> list[str]:
    """Every AWS operation the provider sends from now on, in order (botocore's own event)."""
    calls: list[str] = []

    def record(model: Any, **_: Any) -> None:
        calls.append(model.name)

    for client in (provider._ec2, provider._autoscaling):
        client.meta.events.register("before-call", record)
    return calls


async def test_it_is_a_cloud_provider(provider: AwsProvider) -> None:
    assert isinstance(provider, CloudProvider)
    assert provider.name == "aws"


async def test_groups_are_discovered_by_their_role_tag(aws: MotoServer, provider: AwsProvider) -> None:
    make_group(aws, "cp", "ControlPlane", size=3, min_size=3, max_size=4)
    make_group(aws, "workers", "Worker", size=2, max_size=5)
    make_group(aws, "untagged", None)  # not the cluster's
    make_group(aws, "odd", "database")  # a role kustos does not know: skipped, not fatal

    groups = {g.group_id: g for g in await provider.groups()}

    assert set(groups) == {"cp", "workers"}
    assert groups["cp"].role is Role.CONTROL_PLANE
    assert groups["workers"].role is Role.WORKER
    assert groups["cp"].image == OLD_IMAGE
    assert (groups["cp"].min_size, groups["cp"].max_size, groups["cp"].desired) == (3, 4, 3)


async def test_cluster_filter_by_name_and_by_tag_value(aws: MotoServer) -> None:
    make_group(aws, "a-workers", "Worker", tags={"kubernetes.io/cluster/a": "owned", "env": "prod"})
    make_group(aws, "b-workers", "worker", tags={"kubernetes.io/cluster/b": "owned", "env": "test"})

    by_name = AwsProvider.from_options(aws.options(cluster="a"))
    by_value = AwsProvider.from_options(aws.options(**{"cluster-tag": "env=test"}))
    by_key = AwsProvider.from_options(aws.options(**{"cluster-tag": "kubernetes.io/cluster/b"}))

    assert [g.group_id for g in await by_name.groups()] == ["a-workers"]
    assert [g.group_id for g in await by_value.groups()] == ["b-workers"]
    assert [g.group_id for g in await by_key.groups()] == ["b-workers"]


async def test_the_image_is_the_one_of_the_version_the_group_launches_from(aws: MotoServer) -> None:
    """A group pinned to version 1 launches version 1's image, whatever $Latest says."""
    template = make_group(aws, "pinned", "Worker", version="1")
    ec2 = aws.client("ec2")
    ec2.create_launch_template_version(
        LaunchTemplateId=template, SourceVersion="1", LaunchTemplateData={"ImageId": NEW_IMAGE}
    )
    provider = AwsProvider.from_options(aws.options())

    [found] = await provider.groups()
    assert found.image == OLD_IMAGE


async def test_instances_carry_provider_id_state_node_name_and_image(
    aws: MotoServer, provider: AwsProvider
) -> None:
    make_group(aws, "workers", "Worker", size=2)

    instances = await provider.instances("workers")

    assert sorted(i.provider_id for i in instances) == [
        f"aws:///{ZONE}/{i}" for i in instance_ids(aws, "workers")
    ]
    for instance in instances:
        raw = ec2_instance(aws, instance.provider_id.rsplit("/", 1)[1])
        assert instance.group_id == "workers"
        assert instance.state is InstanceState.RUNNING
        assert instance.image == OLD_IMAGE
        assert instance.node_name == raw["PrivateDnsName"] and instance.node_name.endswith(".internal")


async def test_set_image_on_default_version_makes_new_instances_use_it(
    aws: MotoServer, provider: AwsProvider
) -> None:
    template = make_group(aws, "workers", "Worker", size=1)
    before = instance_ids(aws, "workers")

    await provider.set_image("workers", NEW_IMAGE)
    await provider.create_instance("workers")

    ec2 = aws.client("ec2")
    [default] = ec2.describe_launch_template_versions(LaunchTemplateId=template, Versions=["$Default"])[
        "LaunchTemplateVersions"
    ]
    assert default["LaunchTemplateData"]["ImageId"] == NEW_IMAGE
    # (AWS copies the rest of the source version's data; moto does not, so that is not asserted.)
    [new] = sorted(set(instance_ids(aws, "workers")) - set(before))
    assert ec2_instance(aws, new)["ImageId"] == NEW_IMAGE
    assert [g.image for g in await provider.groups()] == [NEW_IMAGE]
    images = {i.provider_id.rsplit("/", 1)[1]: i.image for i in await provider.instances("workers")}
    assert images == {before[0]: OLD_IMAGE, new: NEW_IMAGE}


async def test_set_image_again_is_a_no_op(aws: MotoServer, provider: AwsProvider) -> None:
    template = make_group(aws, "workers", "Worker")
    await provider.set_image("workers", NEW_IMAGE)
    calls = count_calls(provider)

    await provider.set_image("workers", NEW_IMAGE)

    versions = aws.client("ec2").describe_launch_template_versions(LaunchTemplateId=template)
    assert len(versions["LaunchTemplateVersions"]) == 2
    assert calls == ["DescribeAutoScalingGroups", "DescribeLaunchTemplateVersions"]


async def test_set_image_on_a_pinned_version_moves_the_group_to_the_new_version(aws: MotoServer) -> None:
    template = make_group(aws, "pinned", "Worker", version="1")
    provider = AwsProvider.from_options(aws.options())

    await provider.set_image("pinned", NEW_IMAGE)

    assert group(aws, "pinned")["LaunchTemplate"]["Version"] == "2"
    [default] = aws.client("ec2").describe_launch_template_versions(
        LaunchTemplateId=template, Versions=["$Default"]
    )["LaunchTemplateVersions"]
    assert default["VersionNumber"] == 1  # the template's default is the user's business
    assert [g.image for g in await provider.groups()] == [NEW_IMAGE]


async def test_set_image_on_latest_needs_no_more_than_the_new_version(aws: MotoServer) -> None:
    make_group(aws, "latest", "Worker", version="$Latest")
    provider = AwsProvider.from_options(aws.options())
    calls = count_calls(provider)

    await provider.set_image("latest", NEW_IMAGE)

    assert "ModifyLaunchTemplate" not in calls and "UpdateAutoScalingGroup" not in calls
    assert group(aws, "latest")["LaunchTemplate"]["Version"] == "$Latest"
    assert [g.image for g in await provider.groups()] == [NEW_IMAGE]


async def test_create_raises_desired_capacity_by_one(aws: MotoServer, provider: AwsProvider) -> None:
    make_group(aws, "workers", "Worker", size=2, max_size=3)

    await provider.create_instance("workers")

    assert group(aws, "workers")["DesiredCapacity"] == 3
    assert len(await provider.instances("workers")) == 3


async def test_create_at_the_maximum_is_a_capacity_error_naming_the_sizes(
    aws: MotoServer, provider: AwsProvider
) -> None:
    make_group(aws, "cp", "ControlPlane", size=3, min_size=3, max_size=3)

    with pytest.raises(CapacityError, match=r"cp is at its maximum size \(3 of 3\)"):
        await provider.create_instance("cp")
    assert group(aws, "cp")["DesiredCapacity"] == 3


async def test_a_launch_aws_has_not_listed_yet_is_never_asked_for_twice(
    aws_checking_amis: MotoServer,
) -> None:
    """Finding 1: a second create while the group lists fewer instances than it desires
    (one intent asked twice, a pass on a stale cache) must not raise desired capacity
    again, or one rollout step becomes instances up to MaxSize.

    moto launches at once; with its AMI validation on, a template on a missing AMI leaves
    the group at desired 3 with 2 instances, as AWS does while a launch is under way."""
    aws = aws_checking_amis  # a template on a missing AMI: its launches fail
    make_group(aws, "workers", "Worker", image=MOTO_AMI, size=2, max_size=6)
    provider = AwsProvider.from_options(aws.options())
    await provider.set_image("workers", NEW_IMAGE)  # an AMI this region does not have
    with pytest.raises(ProviderError):
        await provider.create_instance("workers")  # moto: the launch fails in the call
    assert (group(aws, "workers")["DesiredCapacity"], len(instance_ids(aws, "workers"))) == (3, 2)

    for _ in range(3):
        with pytest.raises(ProviderError, match="a launch is outstanding") as err:
            await provider.create_instance("workers")
        assert err.value.reason == "ProviderLaunchOutstanding"
        assert not isinstance(err.value, NotFound | CapacityError)

    assert group(aws, "workers")["DesiredCapacity"] == 3


async def test_delete_terminates_and_shrinks_the_group(aws: MotoServer, provider: AwsProvider) -> None:
    make_group(aws, "workers", "Worker", size=3)
    victim = instance_ids(aws, "workers")[0]
    pid = f"aws:///{ZONE}/{victim}"

    await provider.delete_instance("workers", pid)

    assert group(aws, "workers")["DesiredCapacity"] == 2
    assert victim not in instance_ids(aws, "workers")
    assert ec2_instance(aws, victim)["State"]["Name"] == "terminated"
    assert (await provider.instance(pid)).state is InstanceState.GONE
    # Again (a retry after a lost answer): NotFound, and no second decrement.
    with pytest.raises(NotFound):
        await provider.delete_instance("workers", pid)
    assert group(aws, "workers")["DesiredCapacity"] == 2


async def test_delete_refuses_an_instance_of_another_group(aws: MotoServer, provider: AwsProvider) -> None:
    make_group(aws, "cp", "ControlPlane", size=1)
    make_group(aws, "workers", "Worker", size=1)
    [cp] = instance_ids(aws, "cp")

    with pytest.raises(ProviderError, match="belongs to group cp, not workers") as err:
        await provider.delete_instance("workers", f"aws:///{ZONE}/{cp}")
    assert err.value.reason == "ProviderWrongGroup"
    assert instance_ids(aws, "cp") == [cp]


async def test_delete_at_the_minimum_is_refused_with_the_reason(
    aws: MotoServer, provider: AwsProvider
) -> None:
    make_group(aws, "cp", "ControlPlane", size=3, min_size=3, max_size=4)
    victim = instance_ids(aws, "cp")[0]

    with pytest.raises(ProviderError, match="minimum size") as err:
        await provider.delete_instance("cp", f"aws:///{ZONE}/{victim}")
    assert err.value.reason == "ProviderGroupAtMinimum"
    assert victim in instance_ids(aws, "cp")


async def test_instance_state_comes_from_ec2_in_one_call(aws: MotoServer, provider: AwsProvider) -> None:
    """Fencing asks this for every dead node: one DescribeInstances, nothing more."""
    make_group(aws, "workers", "Worker", size=2)
    running, stopped = instance_ids(aws, "workers")
    aws.client("ec2").stop_instances(InstanceIds=[stopped])
    calls = count_calls(provider)

    a = await provider.instance(f"aws:///{ZONE}/{running}")
    b = await provider.instance(f"aws:///{ZONE}/{stopped}")

    assert calls == ["DescribeInstances", "DescribeInstances"]
    assert (a.state, a.state.fenced, a.group_id) == (InstanceState.RUNNING, False, "workers")
    assert (b.state, b.state.fenced) == (InstanceState.STOPPED, True)
    assert a.provider_id == f"aws:///{ZONE}/{running}"


async def test_an_unknown_instance_is_not_found(provider: AwsProvider) -> None:
    with pytest.raises(NotFound):
        await provider.instance(f"aws:///{ZONE}/i-0123456789abcdef0")


async def test_a_provider_id_of_another_cloud_is_never_not_found(provider: AwsProvider) -> None:
    """NotFound means 'gone' to fencing: a providerID we cannot read must not say that."""
    for other in ("kwok://node-1", "gce://project/zone/vm", "aws:///us-east-1a/", ""):
        with pytest.raises(ProviderError) as err:
            await provider.instance(other)
        assert not isinstance(err.value, NotFound)
        assert err.value.reason == "ProviderInvalidID"


async def test_an_instance_in_another_region_is_never_not_found(
    aws: MotoServer, provider: AwsProvider
) -> None:
    """Finding 10: EC2 in us-east-1 says InvalidInstanceID.NotFound for a running instance
    of us-west-2; taken as NotFound, fencing would call it gone and a delete done."""
    make_group(aws, "west", "Worker", size=1, zone="us-west-2a", region="us-west-2")
    [west] = instance_ids(aws, "west", region="us-west-2")
    pid = f"aws:///us-west-2a/{west}"

    for call in (provider.instance(pid), provider.delete_instance("west", pid)):
        with pytest.raises(ProviderError, match="not one of region us-east-1") as err:
            await call
        assert not isinstance(err.value, NotFound)
        assert err.value.reason == "ProviderOtherRegion"
    assert instance_ids(aws, "west", region="us-west-2") == [west]
    assert ec2_instance(aws, west, region="us-west-2")["State"]["Name"] == "running"


async def test_an_unknown_group_is_not_found(provider: AwsProvider) -> None:
    for call in (
        provider.instances("nope"),
        provider.create_instance("nope"),
        provider.set_image("nope", NEW_IMAGE),
    ):
        with pytest.raises(NotFound, match="no Auto Scaling group nope"):
            await call


async def test_an_unreachable_endpoint_is_a_provider_error() -> None:
    closed = f"http://127.0.0.1:{free_port()}"
    provider = AwsProvider.from_options({"region": "us-east-1", "endpoint-url": closed})
    with pytest.raises(ProviderError) as err:
        await provider.groups()
    assert err.value.reason == "ProviderUnreachable"


class FakeMonotonic:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def test_reads_are_reused_briefly_and_forgotten_on_every_write(aws: MotoServer) -> None:
    """A controller observing on every Node heartbeat must not spend the account's request
    budget: groups() and instances() are reused for cache-seconds, and the provider's own
    writes make the next read fresh."""
    make_group(aws, "workers", "Worker", size=1)
    clock = FakeMonotonic()
    base = AwsProvider.from_options(aws.options())
    provider = AwsProvider(base._ec2, base._autoscaling, base.options, monotonic=clock)
    calls = count_calls(provider)

    first = await provider.instances("workers")
    await provider.groups()
    reads = len(calls)
    assert await provider.instances("workers") == first
    await provider.groups()
    assert len(calls) == reads  # both answered from the cache

    await provider.create_instance("workers")
    assert len(await provider.instances("workers")) == 2  # the write forgot the cache

    aws.client("autoscaling").set_desired_capacity(AutoScalingGroupName="workers", DesiredCapacity=3)
    assert len(await provider.instances("workers")) == 2  # someone else's change: seen later
    clock.now += 2.0
    assert len(await provider.instances("workers")) == 3


async def test_the_cache_can_be_turned_off(aws: MotoServer) -> None:
    make_group(aws, "workers", "Worker", size=1)
    provider = AwsProvider.from_options(aws.options(**{"cache-seconds": "0"}))
    calls = count_calls(provider)
    await provider.groups()
    once = len(calls)
    await provider.groups()
    assert len(calls) == 2 * once


async def test_a_launch_that_never_shows_up_is_cancelled_once(aws_checking_amis: MotoServer) -> None:
    """A Join whose deadline passed without an instance takes its launch back: the desired
    capacity is not left raised (a failed launch would block every later one)."""
    aws = aws_checking_amis  # a template on a missing AMI: its launches fail
    make_group(aws, "workers", "Worker", image=MOTO_AMI, size=2, max_size=6)
    provider = AwsProvider.from_options(aws.options())
    await provider.set_image("workers", NEW_IMAGE)  # an AMI this region does not have
    with pytest.raises(ProviderError):
        await provider.create_instance("workers")
    assert group(aws, "workers")["DesiredCapacity"] == 3

    assert await AwsProvider.from_options(aws.options()).cancel_create("workers")
    assert group(aws, "workers")["DesiredCapacity"] == 2
    # Asked again (a restarted operator): nothing outstanding, nothing lowered.
    assert not await AwsProvider.from_options(aws.options()).cancel_create("workers")
    assert (group(aws, "workers")["DesiredCapacity"], len(instance_ids(aws, "workers"))) == (2, 2)


async def test_weighted_instance_types_count_in_capacity_units(aws: MotoServer) -> None:
    """DesiredCapacity counts weights: 2 instances of weight 2 are 4 units, not a launch
    outstanding; one more instance is the lightest weight more, within MaxSize."""
    ec2, autoscaling = aws.client("ec2"), aws.client("autoscaling")
    template = ec2.create_launch_template(
        LaunchTemplateName="weighted", LaunchTemplateData={"ImageId": OLD_IMAGE, "InstanceType": "m5.large"}
    )["LaunchTemplate"]["LaunchTemplateId"]
    autoscaling.create_auto_scaling_group(
        AutoScalingGroupName="weighted", MinSize=0, MaxSize=6, DesiredCapacity=4, AvailabilityZones=[ZONE],
        MixedInstancesPolicy={"LaunchTemplate": {
            "LaunchTemplateSpecification": {"LaunchTemplateId": template, "Version": "$Default"},
            "Overrides": [{"InstanceType": "m5.large", "WeightedCapacity": "2"},
                          {"InstanceType": "m5.xlarge", "WeightedCapacity": "4"}],
        }},
        Tags=[{"Key": "kustos.dev/role", "Value": "Worker", "PropagateAtLaunch": True}],
    )  # fmt: skip
    assert len(instance_ids(aws, "weighted")) == 2
    provider = AwsProvider.from_options(aws.options(**{"cache-seconds": "0"}))
    await provider.create_instance("weighted")
    assert (group(aws, "weighted")["DesiredCapacity"], len(instance_ids(aws, "weighted"))) == (6, 3)
    with pytest.raises(CapacityError, match="maximum size"):
        await provider.create_instance("weighted")
    assert not await provider.cancel_create("weighted")  # nothing outstanding
