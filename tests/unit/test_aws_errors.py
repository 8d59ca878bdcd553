"""AWS errors reach the controllers as the typed errors of ``runtime.cloud``.

moto cannot throttle or run out of capacity, so AWS's answers are given at botocore's
boundary with its Stubber (botocore's own test tool: the client parses a stubbed answer as
one from the network, then raises the same ``ClientError``). The provider's code path from
the call to the typed error is the real one.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import boto3
import pytest
from botocore.stub import Stubber

from kustos.nodes.cloud.aws import (
    THROTTLE_RETRY_AFTER,
    AwsOptions,
    AwsProvider,
    in_region,
    instance_id_of,
    parse_role,
    zone_of,
)
from kustos.runtime.cloud import CapacityError, NotFound, ProviderError, Role, Throttled
from kustos.runtime.errors import ReconcileError
from tests.aws_support import CREDENTIALS, REGION, aws_environment

PID = "aws:///us-east-1a/i-0123456789abcdef0"
IID = "i-0123456789abcdef0"


@pytest.fixture(autouse=True)
def hermetic_aws_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for key, value in aws_environment().items():
        monkeypatch.setenv(key, value)


class Stubbed:
    def __init__(self) -> None:
        ec2 = boto3.client("ec2", region_name=REGION, **CREDENTIALS)
        autoscaling = boto3.client("autoscaling", region_name=REGION, **CREDENTIALS)
        self.provider = AwsProvider(ec2, autoscaling, AwsOptions(region=REGION))
        self.ec2 = Stubber(ec2)
        self.autoscaling = Stubber(autoscaling)


@pytest.fixture
def stubbed() -> Iterator[Stubbed]:
    s = Stubbed()
    with s.ec2, s.autoscaling:
        yield s
        s.ec2.assert_no_pending_responses()
        s.autoscaling.assert_no_pending_responses()


def group(desired: int = 2, min_size: int = 0, max_size: int = 5) -> dict[str, Any]:
    """One group with as many instances in service as it desires (no launch outstanding)."""
    return with_instances(desired, desired, min_size, max_size)


def bare_group(desired: int, min_size: int, max_size: int) -> dict[str, Any]:
    return {
        "AutoScalingGroups": [
            {
                "AutoScalingGroupName": "workers",
                "MinSize": min_size,
                "MaxSize": max_size,
                "DesiredCapacity": desired,
                "DefaultCooldown": 300,
                "AvailabilityZones": ["us-east-1a"],
                "HealthCheckType": "EC2",
                "CreatedTime": "2026-01-01T00:00:00Z",
                "LaunchTemplate": {"LaunchTemplateId": "lt-0abc", "Version": "$Default"},
                "Instances": [],
                "Tags": [{"Key": "kustos.dev/role", "Value": "Worker"}],
            }
        ]
    }


async def test_throttling_is_throttled_with_a_retry_after(stubbed: Stubbed) -> None:
    stubbed.autoscaling.add_response("describe_auto_scaling_groups", group())
    stubbed.autoscaling.add_client_error(
        "set_desired_capacity", "Throttling", "Rate exceeded", http_status_code=400
    )

    with pytest.raises(Throttled, match="SetDesiredCapacity: Throttling: Rate exceeded") as err:
        await stubbed.provider.create_instance("workers")
    assert err.value.retry_after == THROTTLE_RETRY_AFTER
    assert err.value.reason == "ProviderThrottled"


async def test_a_retry_after_header_is_honoured(stubbed: Stubbed) -> None:
    stubbed.ec2.add_client_error(
        "describe_instances",
        "RequestLimitExceeded",
        "Request limit exceeded.",
        http_status_code=503,
        response_meta={"HTTPHeaders": {"retry-after": "12"}},
    )

    with pytest.raises(Throttled) as err:
        await stubbed.provider.instance(PID)
    assert err.value.retry_after == 12.0


@pytest.mark.parametrize(
    ("code", "message"),
    [
        ("InsufficientInstanceCapacity", "We currently do not have sufficient capacity"),
        ("VcpuLimitExceeded", "You have requested more vCPU capacity than your current limit"),
        ("ValidationError", "New SetDesiredCapacity value 6 is above max value 5 for the AutoScalingGroup."),
    ],
)
async def test_no_capacity_is_a_capacity_error(stubbed: Stubbed, code: str, message: str) -> None:
    stubbed.autoscaling.add_response("describe_auto_scaling_groups", group())
    stubbed.autoscaling.add_client_error("set_desired_capacity", code, message)

    with pytest.raises(CapacityError, match=re.escape(message)) as err:
        await stubbed.provider.create_instance("workers")
    assert err.value.reason == "ProviderCapacity"


async def test_an_unknown_group_in_a_validation_error_is_not_found(stubbed: Stubbed) -> None:
    stubbed.autoscaling.add_response("describe_auto_scaling_groups", group())
    stubbed.autoscaling.add_client_error(
        "set_desired_capacity", "ValidationError", "AutoScalingGroup name not found - null"
    )

    with pytest.raises(NotFound):
        await stubbed.provider.create_instance("workers")


async def test_an_unknown_instance_is_not_found(stubbed: Stubbed) -> None:
    stubbed.ec2.add_client_error(
        "describe_instances", "InvalidInstanceID.NotFound", f"The instance ID '{IID}' does not exist"
    )

    with pytest.raises(NotFound):
        await stubbed.provider.instance(PID)


async def test_a_terminate_refused_below_the_minimum_says_so(stubbed: Stubbed) -> None:
    """Between our size check and AWS's, the group may have changed: AWS's refusal keeps
    its meaning."""
    stubbed.autoscaling.add_response(
        "describe_auto_scaling_instances",
        {
            "AutoScalingInstances": [
                {
                    "InstanceId": IID,
                    "AutoScalingGroupName": "workers",
                    "AvailabilityZone": "us-east-1a",
                    "LifecycleState": "InService",
                    "HealthStatus": "HEALTHY",
                    "ProtectedFromScaleIn": False,
                }
            ]
        },
    )
    stubbed.autoscaling.add_response("describe_auto_scaling_groups", group(desired=3, min_size=2))
    stubbed.autoscaling.add_client_error(
        "terminate_instance_in_auto_scaling_group",
        "ValidationError",
        "Currently, desiredSize equals minSize (3). Terminating instance without replacement will "
        "violate group's min size constraint.",
    )

    with pytest.raises(ProviderError) as err:
        await stubbed.provider.delete_instance("workers", PID)
    assert err.value.reason == "ProviderGroupAtMinimum"


async def test_a_missing_permission_names_the_action_and_the_docs(stubbed: Stubbed) -> None:
    stubbed.ec2.add_client_error(
        "describe_instances",
        "UnauthorizedOperation",
        "You are not authorized to perform this operation.",
        http_status_code=403,
    )

    with pytest.raises(ProviderError, match=r"DescribeInstances.*docs/nodeimage-aws.md") as err:
        await stubbed.provider.instance(PID)
    assert err.value.reason == "ProviderAccessDenied"
    assert not isinstance(err.value, NotFound | CapacityError | Throttled)


async def test_a_server_error_is_a_retried_provider_error(stubbed: Stubbed) -> None:
    stubbed.ec2.add_client_error(
        "describe_instances", "InternalError", "An internal error", http_status_code=500
    )

    with pytest.raises(ProviderError) as err:
        await stubbed.provider.instance(PID)
    assert type(err.value) is ProviderError and isinstance(err.value, ReconcileError)


async def test_a_group_already_terminating_the_instance_is_left_alone(stubbed: Stubbed) -> None:
    """A delete retried after its answer was lost: no second terminate, no second decrement."""
    stubbed.autoscaling.add_response(
        "describe_auto_scaling_instances",
        {
            "AutoScalingInstances": [
                {
                    "InstanceId": IID,
                    "AutoScalingGroupName": "workers",
                    "AvailabilityZone": "us-east-1a",
                    "LifecycleState": "Terminating:Wait",
                    "HealthStatus": "HEALTHY",
                    "ProtectedFromScaleIn": False,
                }
            ]
        },
    )

    await stubbed.provider.delete_instance("workers", PID)  # and nothing else was called


def test_roles_read_from_the_tag() -> None:
    assert parse_role("ControlPlane") is Role.CONTROL_PLANE
    assert parse_role("control-plane") is Role.CONTROL_PLANE
    assert parse_role("worker") is Role.WORKER
    assert parse_role("Worker") is Role.WORKER
    assert parse_role("master") is None
    assert parse_role("") is None


def test_instance_ids_from_provider_ids() -> None:
    assert instance_id_of("aws:///us-east-1a/i-0abc") == "i-0abc"
    assert instance_id_of("aws:///eu-west-3c/i-06888991e7138ed4e") == "i-06888991e7138ed4e"
    for bad in (
        "kwok://n1",
        "i-0abc",
        "aws:///us-east-1a/",
        "gce://p/z/i-0abc",
        "aws:///us-east-1a/fargate-x",
    ):
        with pytest.raises(ProviderError):
            instance_id_of(bad)


def test_options_are_checked_and_named() -> None:
    parsed = AwsOptions.parse(
        {"region": "eu-west-1", "endpoint_url": "http://127.0.0.1:1", "cluster": "prod"}
    )
    assert (parsed.region, parsed.endpoint_url, parsed.cluster_tag) == (
        "eu-west-1",
        "http://127.0.0.1:1",
        "kubernetes.io/cluster/prod",
    )
    tagged = AwsOptions.parse({"cluster-tag": "team=storage", "role-tag": "node-role"})
    assert (tagged.cluster_tag, tagged.cluster_tag_value, tagged.role_tag) == ("team", "storage", "node-role")
    with pytest.raises(ValueError, match=r"unknown AWS cloud option.*zone"):
        AwsOptions.parse({"zone": "a"})
    with pytest.raises(ValueError, match="exclude each other"):
        AwsOptions.parse({"cluster": "a", "cluster-tag": "b"})
    with pytest.raises(ValueError, match="region is empty"):
        AwsOptions.parse({"region": ""})
    assert AwsOptions.parse({}).cache_seconds == 2.0
    assert AwsOptions.parse({"cache-seconds": "0"}).cache_seconds == 0.0
    with pytest.raises(ValueError, match="cache-seconds: 'soon' is no number"):
        AwsOptions.parse({"cache-seconds": "soon"})
    with pytest.raises(ValueError, match=r"cache-seconds: 600.0 is not within 0\.\.60"):
        AwsOptions.parse({"cache-seconds": "600"})


def test_a_missing_region_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AWS_REGION", raising=False)
    monkeypatch.delenv("AWS_DEFAULT_REGION", raising=False)
    with pytest.raises(ValueError, match="region=<region>"):
        AwsProvider.from_options({})


def with_instances(desired: int, live: int, min_size: int = 0, max_size: int = 5) -> dict[str, Any]:
    described = bare_group(desired, min_size, max_size)
    described["AutoScalingGroups"][0]["Instances"] = [
        {
            "InstanceId": f"i-{n:017x}",
            "AvailabilityZone": "us-east-1a",
            "LifecycleState": "InService",
            "HealthStatus": "Healthy",
            "ProtectedFromScaleIn": False,
        }
        for n in range(live)
    ]
    return described


def activity(status: str, message: str = "") -> dict[str, Any]:
    entry: dict[str, Any] = {
        "ActivityId": "a-1",
        "AutoScalingGroupName": "workers",
        "Cause": "a user request set the desired capacity",
        "StartTime": "2026-01-01T00:00:00Z",
        "StatusCode": status,
    }
    if message:
        entry["StatusMessage"] = message
    return {"Activities": [entry]}


@pytest.mark.parametrize(
    ("message", "error", "reason"),
    [
        (
            "We currently do not have sufficient t3.medium capacity in the Availability Zone you requested "
            "(us-east-1a). Launching EC2 instance failed.",
            CapacityError,
            "ProviderCapacity",
        ),
        (
            "The image id '[ami-0000000000000000b]' does not exist. Launching EC2 instance failed.",
            ProviderError,
            "ProviderLaunchFailed",
        ),
    ],
)
async def test_a_launch_aws_failed_is_reported_instead_of_asking_for_more(
    stubbed: Stubbed, message: str, error: type[ProviderError], reason: str
) -> None:
    """Auto Scaling accepted desired 3 but could launch only 2: its activity history says
    why, and kustos says it instead of raising desired capacity again."""
    stubbed.autoscaling.add_response("describe_auto_scaling_groups", with_instances(desired=3, live=2))
    stubbed.autoscaling.add_response(
        "describe_scaling_activities",
        activity("Failed", message),
        expected_params={"AutoScalingGroupName": "workers", "MaxRecords": 1},
    )

    with pytest.raises(error, match="its last launch failed") as err:
        await stubbed.provider.create_instance("workers")
    assert err.value.reason == reason
    assert message in err.value.message  # AWS's own words reach the status


async def test_a_launch_still_under_way_stops_another_until_it_is_listed(stubbed: Stubbed) -> None:
    """The group desires 3 and lists 2: whoever asks cannot tell that launch from its own
    (one intent asked twice, a stale cache), so nothing more is asked (no SetDesiredCapacity
    is stubbed: a call would fail the test) and the caller retries."""
    stubbed.autoscaling.add_response("describe_auto_scaling_groups", with_instances(desired=3, live=2))
    stubbed.autoscaling.add_response("describe_scaling_activities", activity("InProgress"))

    with pytest.raises(
        ProviderError, match=r"a launch is outstanding \(2 instance\(s\) listed, 3 desired\)"
    ) as err:
        await stubbed.provider.create_instance("workers")
    assert err.value.reason == "ProviderLaunchOutstanding"
    assert type(err.value) is ProviderError  # retried with backoff, not Capacity nor NotFound


async def test_once_the_launch_is_listed_the_next_one_is_asked_for(stubbed: Stubbed) -> None:
    """maxSurge 2: the second heir follows once the first instance is listed."""
    stubbed.autoscaling.add_response("describe_auto_scaling_groups", with_instances(desired=3, live=3))
    stubbed.autoscaling.add_response(
        "set_desired_capacity",
        {},
        expected_params={"AutoScalingGroupName": "workers", "DesiredCapacity": 4, "HonorCooldown": False},
    )

    await stubbed.provider.create_instance("workers")


def test_zones_are_read_from_provider_ids_and_matched_to_the_region() -> None:
    assert zone_of("aws:///us-east-1a/i-0123456789abcdef0") == "us-east-1a"
    assert zone_of("aws:///i-0123456789abcdef0") == ""
    assert zone_of("aws://us-west-2b/i-0abc") == "us-west-2b"
    assert in_region("us-east-1a", "us-east-1")
    assert in_region("us-west-2-lax-1a", "us-west-2")
    assert in_region("us-east-1-wl1-bos-wlz-1", "us-east-1")
    assert not in_region("us-west-2a", "us-east-1")
    assert not in_region("us-east-10a", "us-east-1")
    assert not in_region("us-east-1", "us-east-1")
    assert not in_region("", "us-east-1")


@pytest.mark.parametrize(
    "provider_id", ["aws:///eu-west-1a/i-0123456789abcdef0", "aws:///i-0123456789abcdef0"]
)
async def test_an_instance_outside_the_region_is_asked_nothing_and_never_not_found(
    stubbed: Stubbed, provider_id: str
) -> None:
    """EC2 here would answer InvalidInstanceID.NotFound (stubbed: never reached, no call is
    stubbed), which fencing takes for gone: a providerID of another region, or of no
    zone, is a ProviderError before anything is asked."""
    for call in (
        stubbed.provider.instance(provider_id),
        stubbed.provider.delete_instance("workers", provider_id),
    ):
        with pytest.raises(ProviderError, match="not one of region us-east-1") as err:
            await call
        assert not isinstance(err.value, NotFound)
        assert err.value.reason == "ProviderOtherRegion"


async def test_no_outstanding_launch_needs_no_history(stubbed: Stubbed) -> None:
    stubbed.autoscaling.add_response("describe_auto_scaling_groups", with_instances(desired=2, live=2))
    stubbed.autoscaling.add_response("set_desired_capacity", {})

    await stubbed.provider.create_instance("workers")
