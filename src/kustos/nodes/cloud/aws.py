"""AWS: Auto Scaling Groups with launch templates, through boto3.

One ``Group`` is one Auto Scaling Group (its name is the group id) that carries the role
tag (``kustos.dev/role``: ``ControlPlane`` or ``Worker``) and, when a cluster filter is
set, the cluster tag. The image is the ``ImageId`` of the launch template version the
group launches from; a new image is a new version of that template (made from the one
in use, only the ``ImageId`` changed), which the group then launches from:

* group on ``$Default``: the new version becomes the template's default;
* group on ``$Latest``: the new version is the latest, nothing more to do;
* group on a version number: the group is updated to the new number.

An instance is created by raising the desired capacity by one (the group launches it;
it shows up in ``instances`` a moment later) and deleted by terminating it in its group
with the desired capacity decremented, so the group does not launch a replacement. With
weighted instance types (a MixedInstancesPolicy whose overrides carry WeightedCapacity)
sizes are capacity units: one more is the lightest type's weight. ``cancel_create`` takes
back a launch the group never listed (a Join whose deadline passed), so a failed launch
does not leave the desired capacity raised.

Every boto3 call is blocking and runs in a worker thread. Calls the provider makes, so
the IAM policy in docs/nodeimage-aws.md can list exactly these:

* autoscaling:DescribeAutoScalingGroups, autoscaling:DescribeAutoScalingInstances,
  autoscaling:DescribeScalingActivities (only while a launch is outstanding),
  autoscaling:SetDesiredCapacity, autoscaling:TerminateInstanceInAutoScalingGroup,
  autoscaling:UpdateAutoScalingGroup (only for a group pinned to a version number);
* ec2:DescribeInstances, ec2:DescribeLaunchTemplateVersions,
  ec2:CreateLaunchTemplateVersion, ec2:ModifyLaunchTemplate (only for ``$Default``).

How this differs from Constellation's AWS client (operators/constellation-node-operator/
internal/cloud/aws), which we read: it reads the image from ``$Latest`` whatever version
the group launches from, so a group pinned to ``$Default`` or a number reports an image
it does not launch; it recognises a missing instance by matching error text; it waits
inside the create call, up to 30 s, for the new instance to show up; and it makes a new
launch template version on every call, even when the image is already the one in use.
Here the version the group really uses is resolved, a repeated ``set_image`` is a no-op,
create returns at once (the planner waits, not the call), a delete checks the instance's
group and lifecycle first (a retried delete never decrements twice), and errors are
mapped by their AWS error code to the typed errors of ``runtime.cloud``.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

import boto3
from botocore.config import Config
from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    ConnectionError,
    NoCredentialsError,
    NoRegionError,
    PartialCredentialsError,
)

from kustos.nodes.cloud.lookups import LookupCache
from kustos.runtime.cloud import (
    CapacityError,
    Group,
    Instance,
    InstanceState,
    NotFound,
    ProviderError,
    Role,
    Throttled,
)

if TYPE_CHECKING:
    from mypy_boto3_autoscaling.client import AutoScalingClient
    from mypy_boto3_autoscaling.type_defs import (
        AutoScalingGroupTypeDef,
        FilterTypeDef,
        LaunchTemplateSpecificationTypeDef,
        MixedInstancesPolicyTypeDef,
    )
    from mypy_boto3_ec2.client import EC2Client
    from mypy_boto3_ec2.type_defs import (
        DescribeLaunchTemplateVersionsResultTypeDef,
        InstanceTypeDef,
        LaunchTemplateVersionTypeDef,
    )

log = logging.getLogger(__name__)

T = TypeVar("T")

NAME = "aws"
ROLE_TAG = "kustos.dev/role"
# Set by Auto Scaling on every instance it launches.
GROUP_TAG = "aws:autoscaling:groupName"
# The tag Kubernetes' AWS cloud provider and most installers put on a cluster's resources.
CLUSTER_TAG_PREFIX = "kubernetes.io/cluster/"

# botocore's own retries (standard mode: exponential backoff with jitter, a client-side
# retry quota) absorb a short burst of throttling; what is left reaches the controller.
# Short timeouts: a reconcile must not hang a minute on one call (botocore's default
# read timeout is 60 s).
CLIENT_CONFIG = Config(
    retries={"mode": "standard", "max_attempts": 3},
    connect_timeout=5,
    read_timeout=20,
    user_agent_extra="kustos",
)

# AWS's throttling errors carry no Retry-After. After botocore's own three tries, wait at
# least this long: EC2 and Auto Scaling refill their request token buckets per second,
# so a few seconds lets a bucket refill instead of spending the next token at once.
THROTTLE_RETRY_AFTER = 5.0

# Controllers observe on every pass, and a pass can follow every Node heartbeat; AWS
# throttles per account and region. The reads of groups() and instances() are reused for
# this long (each write by this provider forgets them at once); instance(), which fencing
# asks, is always read fresh.
DEFAULT_CACHE_SECONDS = 2.0

# EC2 filters take at most 200 values; instance ids are looked up in chunks of this size.
FILTER_CHUNK = 100

# The error codes botocore itself treats as throttling (botocore/retries/standard.py).
THROTTLING_CODES = frozenset(
    {
        "Throttling",
        "ThrottlingException",
        "ThrottledException",
        "RequestThrottledException",
        "TooManyRequestsException",
        "ProvisionedThroughputExceededException",
        "TransactionInProgressException",
        "RequestLimitExceeded",
        "BandwidthLimitExceeded",
        "LimitExceededException",
        "RequestThrottled",
        "SlowDown",
        "PriorRequestNotComplete",
        "EC2ThrottledException",
    }
)
# EC2 has no capacity, or the account's quota is used up.
CAPACITY_CODES = frozenset(
    {
        "InsufficientInstanceCapacity",
        "InsufficientHostCapacity",
        "InsufficientReservedInstanceCapacity",
        "InsufficientCapacity",
        "InstanceLimitExceeded",
        "VcpuLimitExceeded",
        "MaxSpotInstanceCountExceeded",
        "LimitExceeded",  # Auto Scaling: too many groups, launch configurations, ...
    }
)
NOT_FOUND_CODES = frozenset(
    {
        "InvalidInstanceID.NotFound",
        "InvalidLaunchTemplateId.NotFound",
        "InvalidLaunchTemplateName.NotFoundException",
        "InvalidLaunchTemplateId.VersionNotFound",
    }
)
ACCESS_DENIED_CODES = frozenset({"UnauthorizedOperation", "AccessDenied", "AccessDeniedException"})

# EC2 instance state -> ours. ``shutting-down`` is on its way to terminated but may still
# run processes: not fenced yet. ``stopping`` likewise.
EC2_STATES = {
    "pending": InstanceState.PENDING,
    "running": InstanceState.RUNNING,
    "shutting-down": InstanceState.STOPPING,
    "stopping": InstanceState.STOPPING,
    "stopped": InstanceState.STOPPED,
    "terminated": InstanceState.GONE,
}
# Auto Scaling lifecycle state -> ours, for an instance the group lists but EC2 does not
# (yet or any more).
LIFECYCLE_STATES = {
    "Pending": InstanceState.PENDING,
    "Pending:Wait": InstanceState.PENDING,
    "Pending:Proceed": InstanceState.PENDING,
    "InService": InstanceState.RUNNING,
    "Terminating": InstanceState.STOPPING,
    "Terminating:Wait": InstanceState.STOPPING,
    "Terminating:Proceed": InstanceState.STOPPING,
    "Terminated": InstanceState.GONE,
}


def parse_role(value: str) -> Role | None:
    """The role tag's value: ``ControlPlane`` / ``Worker``, case and dashes ignored."""
    normal = value.replace("-", "").replace("_", "").lower()
    return {"controlplane": Role.CONTROL_PLANE, "worker": Role.WORKER}.get(normal)


def provider_id(availability_zone: str, instance_id: str) -> str:
    """As Kubernetes' AWS cloud provider writes it in ``spec.providerID``."""
    return f"aws:///{availability_zone}/{instance_id}"


def instance_id_of(provider_id: str) -> str:
    """The instance id in ``aws:///<az>/<instance-id>``.

    A providerID of another cloud is a ``ProviderError``, never ``NotFound``: fencing
    takes ``NotFound`` as "the instance is gone", which must not be concluded from a
    providerID this provider cannot even read.
    """
    scheme, sep, rest = provider_id.partition("://")
    instance = rest.rstrip("/").rpartition("/")[2]
    if scheme != "aws" or not sep or not instance.startswith("i-"):
        raise ProviderError(
            f"providerID {provider_id!r} is not an AWS instance (want aws:///<zone>/i-...)",
            reason="ProviderInvalidID",
        )
    return instance


def zone_of(provider_id: str) -> str:
    """The availability zone in ``aws:///<az>/<instance-id>`` ("" when it names none)."""
    rest = provider_id.partition("://")[2].strip("/")
    zone, sep, _ = rest.rpartition("/")
    return zone.rpartition("/")[2] if sep else ""


def in_region(zone: str, region: str) -> bool:
    """Whether ``zone`` is one of ``region``'s: ``us-east-1a``, a Local Zone
    ``us-west-2-lax-1a`` or a Wavelength Zone ``us-east-1-wl1-bos-wlz-1`` (never
    ``us-east-10a`` for ``us-east-1``)."""
    if not region or not zone.startswith(region) or len(zone) == len(region):
        return False
    following = zone[len(region)]
    return following == "-" or following.isalpha()


def _error_code(err: ClientError) -> str:
    return str(err.response.get("Error", {}).get("Code", ""))


def _retry_after(err: ClientError) -> float:
    headers = err.response.get("ResponseMetadata", {}).get("HTTPHeaders", {})
    value = headers.get("retry-after")
    try:
        return max(float(value), 0.0) if value is not None else THROTTLE_RETRY_AFTER
    except ValueError:
        return THROTTLE_RETRY_AFTER


def map_error(err: Exception, action: str) -> ProviderError:
    """A botocore failure of ``action`` as one of the typed errors of ``runtime.cloud``.

    Auto Scaling reports most refusals as ``ValidationError`` with only the message to
    tell them apart (an unknown group or instance, a size out of bounds), so those are
    read from the message; every other service error by its code.
    """
    if isinstance(err, ClientError):
        code = _error_code(err)
        message = str(err.response.get("Error", {}).get("Message", "")) or str(err)
        text = f"AWS {action}: {code}: {message}"
        lowered = message.lower()
        if code in THROTTLING_CODES:
            return Throttled(text, retry_after=_retry_after(err))
        if code in CAPACITY_CODES or (code == "ValidationError" and "above max" in lowered):
            return CapacityError(text)
        if code in NOT_FOUND_CODES or (code == "ValidationError" and "not found" in lowered):
            return NotFound(text)
        if code in ACCESS_DENIED_CODES:
            return ProviderError(
                f"{text} (docs/nodeimage-aws.md lists the IAM actions kustos needs)",
                reason="ProviderAccessDenied",
            )
        if code == "ValidationError" and "min size" in lowered:
            return ProviderError(text, reason="ProviderGroupAtMinimum")
        return ProviderError(text)
    if isinstance(err, NoCredentialsError | PartialCredentialsError):
        return ProviderError(
            f"AWS {action}: no usable credentials ({err}); kustos uses boto3's chain "
            "(environment, shared files, web identity, instance profile)",
            reason="ProviderCredentials",
        )
    if isinstance(err, ConnectionError):
        return ProviderError(f"AWS {action}: {err}", reason="ProviderUnreachable")
    return ProviderError(f"AWS {action}: {type(err).__name__}: {err}")


@dataclass(frozen=True)
class AwsOptions:
    """``--cloud-option`` values (dashes or underscores in the keys)."""

    region: str | None = None
    endpoint_url: str | None = None
    role_tag: str = ROLE_TAG
    # Only groups with this tag (and this value, when given) are the cluster's.
    cluster_tag: str | None = None
    cluster_tag_value: str | None = None
    # How long the answers of groups() and instances() are reused (0: never).
    cache_seconds: float = DEFAULT_CACHE_SECONDS

    KEYS = ("region", "endpoint_url", "role_tag", "cluster", "cluster_tag", "cache_seconds")

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> AwsOptions:
        """``region``, ``endpoint-url`` (a local AWS API such as moto), ``role-tag``
        (default ``kustos.dev/role``), and either ``cluster=NAME`` (groups tagged
        ``kubernetes.io/cluster/NAME``) or ``cluster-tag=KEY`` / ``KEY=VALUE``, and
        ``cache-seconds`` (default 2; 0 turns the read cache off)."""
        values = {key.replace("-", "_"): value for key, value in options.items()}
        unknown = sorted(set(values) - set(cls.KEYS))
        if unknown:
            allowed = ", ".join(k.replace("_", "-") for k in cls.KEYS)
            raise ValueError(f"unknown AWS cloud option(s) {', '.join(unknown)}; known: {allowed}")
        for key, value in values.items():
            if not value:
                raise ValueError(f"AWS cloud option {key.replace('_', '-')} is empty")
        if "cluster" in values and "cluster_tag" in values:
            raise ValueError("AWS cloud options cluster and cluster-tag exclude each other: give one")
        cluster_tag, cluster_value = None, None
        if "cluster" in values:
            cluster_tag = CLUSTER_TAG_PREFIX + values["cluster"]
        elif "cluster_tag" in values:
            key, sep, value = values["cluster_tag"].partition("=")
            cluster_tag, cluster_value = key, (value if sep else None)
        try:
            cache_seconds = float(values.get("cache_seconds", DEFAULT_CACHE_SECONDS))
        except ValueError:
            raise ValueError(
                f"AWS cloud option cache-seconds: {values['cache_seconds']!r} is no number"
            ) from None
        if not 0 <= cache_seconds <= 60:
            raise ValueError(f"AWS cloud option cache-seconds: {cache_seconds} is not within 0..60")
        return cls(
            region=values.get("region"),
            endpoint_url=values.get("endpoint_url"),
            role_tag=values.get("role_tag", ROLE_TAG),
            cluster_tag=cluster_tag,
            cluster_tag_value=cluster_value,
            cache_seconds=cache_seconds,
        )

    def group_filters(self) -> list[FilterTypeDef]:
        """DescribeAutoScalingGroups filters: the role tag, and the cluster tag if set."""
        filters: list[FilterTypeDef] = [
            {"Name": "tag-key", "Values": [self.role_tag]},
        ]
        # A key-only cluster tag would be a second tag-key filter (AND of two values is not
        # how one filter name works): that one is checked on the returned tags (``_is_ours``).
        if self.cluster_tag and self.cluster_tag_value is not None:
            filters.append({"Name": f"tag:{self.cluster_tag}", "Values": [self.cluster_tag_value]})
        return filters


@dataclass(frozen=True)
class _Template:
    """The launch template a group launches from, as the group names it."""

    template_id: str | None
    template_name: str | None
    version: str  # "$Default", "$Latest" or a number
    mixed: bool  # named in the group's MixedInstancesPolicy rather than LaunchTemplate

    def describe(self) -> str:
        return self.template_id or self.template_name or "?"


def _template_of(group: AutoScalingGroupTypeDef) -> _Template | None:
    spec: Mapping[str, Any] | None = group.get("LaunchTemplate")
    mixed = False
    if not spec:
        policy = group.get("MixedInstancesPolicy") or {}
        spec = (policy.get("LaunchTemplate") or {}).get("LaunchTemplateSpecification")
        mixed = True
    if not spec:
        return None
    return _Template(
        template_id=spec.get("LaunchTemplateId"),
        template_name=spec.get("LaunchTemplateName"),
        version=str(spec.get("Version") or "$Default"),
        mixed=mixed,
    )


def _tags(tags: Iterable[Mapping[str, Any]] | None) -> dict[str, str]:
    return {str(t.get("Key")): str(t.get("Value") or "") for t in tags or ()}


def _instance(raw: InstanceTypeDef, group_id: str | None = None) -> Instance:
    tags = _tags(raw.get("Tags"))
    zone = raw.get("Placement", {}).get("AvailabilityZone", "")
    state = EC2_STATES.get(raw.get("State", {}).get("Name", ""), InstanceState.UNKNOWN)
    return Instance(
        provider_id=provider_id(zone, raw["InstanceId"]),
        group_id=group_id if group_id is not None else tags.get(GROUP_TAG, ""),
        state=state,
        # The name kubelet registers with on AWS: the private DNS name (ip-10-0-0-1.ec2.internal,
        # or i-0abc.region.compute.internal with resource-name hostnames). Empty until the
        # instance has a network interface.
        node_name=raw.get("PrivateDnsName") or None,
        image=raw.get("ImageId") or None,
    )


def _weight(member: Mapping[str, Any]) -> int:
    """An instance's capacity units (``WeightedCapacity``; 1 without weights)."""
    try:
        return max(int(member.get("WeightedCapacity") or 1), 1)
    except ValueError:
        return 1


def _type_weights(group: AutoScalingGroupTypeDef) -> dict[str, int]:
    """Instance type -> weight, from the group's MixedInstancesPolicy overrides."""
    overrides = ((group.get("MixedInstancesPolicy") or {}).get("LaunchTemplate") or {}).get("Overrides") or []
    return {str(o.get("InstanceType", "")): _weight(o) for o in overrides if o.get("WeightedCapacity")}


def _live_units(group: AutoScalingGroupTypeDef) -> int:
    """The capacity units of the group's instances that are not on their way out (an
    instance's own WeightedCapacity, else its type's weight in the overrides)."""
    weights = _type_weights(group)
    return sum(
        _weight(i) if i.get("WeightedCapacity") else weights.get(str(i.get("InstanceType", "")), 1)
        for i in group.get("Instances", [])
        if not i.get("LifecycleState", "").startswith("Terminat")
    )


def _lightest_weight(group: AutoScalingGroupTypeDef) -> int:
    """The smallest weight of the group's instance types (1 without weights)."""
    return min(_type_weights(group).values(), default=1)


def _chunks(items: Sequence[str], size: int) -> Iterable[Sequence[str]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


def _client_token(*parts: str) -> str:
    """A deterministic EC2 idempotency token (at most 64 ASCII characters)."""
    return "kustos-" + hashlib.sha256("\0".join(parts).encode()).hexdigest()[:48]


class AwsProvider:
    """``runtime.cloud.CloudProvider`` for Auto Scaling Groups with launch templates."""

    name = NAME

    def __init__(
        self, ec2: EC2Client, autoscaling: AutoScalingClient, options: AwsOptions,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:  # fmt: skip
        self._ec2 = ec2
        self._autoscaling = autoscaling
        self.options = options
        self._monotonic = monotonic
        self._cache = LookupCache(options.cache_seconds, monotonic)
        self._skipped: set[str] = set()  # groups already logged as not managed (once each)

    @classmethod
    def from_options(cls, options: Mapping[str, str]) -> AwsProvider:
        """A provider from ``--cloud-option`` values; credentials from boto3's usual chain
        (environment, shared config and credentials files, web identity, instance profile).
        A missing region is a ``ValueError`` naming the option."""
        parsed = AwsOptions.parse(options)
        session = boto3.session.Session(region_name=parsed.region)
        region = session.region_name or os.environ.get("AWS_REGION")
        if not region:
            raise ValueError(
                "AWS cloud provider: no region; give --cloud-option region=<region> "
                "or set AWS_REGION / AWS_DEFAULT_REGION"
            )
        try:
            ec2 = session.client(
                "ec2", region_name=region, endpoint_url=parsed.endpoint_url, config=CLIENT_CONFIG
            )
            autoscaling = session.client(
                "autoscaling", region_name=region, endpoint_url=parsed.endpoint_url, config=CLIENT_CONFIG
            )
        except (NoRegionError, ValueError) as err:
            raise ValueError(f"AWS cloud provider: {err}") from err
        return cls(ec2, autoscaling, parsed)

    # -- the CloudProvider interface -------------------------------------------------------

    async def groups(self) -> Sequence[Group]:
        cached: Sequence[Group] | None = self._cache.get(("groups",))
        if cached is not None:
            return cached
        raw = await self._run("DescribeAutoScalingGroups", self._describe_groups)
        ours = [g for g in raw if self._is_ours(g)]
        found = await asyncio.gather(*(self._group(g) for g in ours))
        return self._cache.put(("groups",), tuple(g for g in found if g is not None))

    async def instances(self, group_id: str) -> Sequence[Instance]:
        cached: Sequence[Instance] | None = self._cache.get(("instances", group_id))
        if cached is not None:
            return cached
        return self._cache.put(("instances", group_id), tuple(await self._instances(group_id)))

    async def _instances(self, group_id: str) -> list[Instance]:
        group = await self._describe_group(group_id)
        members = group.get("Instances", [])
        ids = [m["InstanceId"] for m in members]
        described = await self._run("DescribeInstances", self._describe_instances, ids)
        result = []
        for member in members:
            raw = described.get(member["InstanceId"])
            if raw is not None:
                result.append(_instance(raw, group_id))
                continue
            # Listed by the group, not (yet, or no longer) by EC2.
            result.append(
                Instance(
                    provider_id=provider_id(member.get("AvailabilityZone", ""), member["InstanceId"]),
                    group_id=group_id,
                    state=LIFECYCLE_STATES.get(member.get("LifecycleState", ""), InstanceState.UNKNOWN),
                )
            )
        return result

    async def instance(self, provider_id: str) -> Instance:
        """One DescribeInstances call: node maintenance asks this for every dead node."""
        instance_id = self._instance_id_here(provider_id)
        response = await self._run(
            "DescribeInstances", lambda: self._ec2.describe_instances(InstanceIds=[instance_id])
        )
        for reservation in response.get("Reservations", []):
            for raw in reservation.get("Instances", []):
                if raw.get("InstanceId") == instance_id:
                    return _instance(raw)
        raise NotFound(f"AWS has no instance {instance_id}")

    async def set_image(self, group_id: str, image: str) -> None:
        try:
            await self._set_image(group_id, image)
        finally:
            self._cache.clear()

    async def _set_image(self, group_id: str, image: str) -> None:
        group = await self._describe_group(group_id)
        template = self._template(group)
        current = await self._template_version(template)
        if current.get("LaunchTemplateData", {}).get("ImageId") == image:
            return
        source = str(current["VersionNumber"])
        template_id = current["LaunchTemplateId"]
        created = await self._run(
            "CreateLaunchTemplateVersion",
            lambda: self._ec2.create_launch_template_version(
                LaunchTemplateId=template_id,
                SourceVersion=source,
                LaunchTemplateData={"ImageId": image},
                VersionDescription=f"kustos: image {image} (from version {source})",
                # The same request again (a retry after a lost answer, a restarted operator)
                # returns the version made the first time instead of making another.
                ClientToken=_client_token(group_id, template_id, source, image),
            ),
        )
        version = str(created["LaunchTemplateVersion"]["VersionNumber"])
        log.info(
            "group %s: launch template %s version %s has image %s", group_id, template_id, version, image
        )
        if template.version == "$Latest":
            return
        if template.version == "$Default":
            await self._run(
                "ModifyLaunchTemplate",
                lambda: self._ec2.modify_launch_template(
                    LaunchTemplateId=template_id, DefaultVersion=version
                ),
            )
            return
        spec: LaunchTemplateSpecificationTypeDef = {"LaunchTemplateId": template_id, "Version": version}
        if template.mixed:
            policy: MixedInstancesPolicyTypeDef = {"LaunchTemplate": {"LaunchTemplateSpecification": spec}}
            await self._run(
                "UpdateAutoScalingGroup",
                lambda: self._autoscaling.update_auto_scaling_group(
                    AutoScalingGroupName=group_id, MixedInstancesPolicy=policy
                ),
            )
        else:
            await self._run(
                "UpdateAutoScalingGroup",
                lambda: self._autoscaling.update_auto_scaling_group(
                    AutoScalingGroupName=group_id, LaunchTemplate=spec
                ),
            )

    async def create_instance(self, group_id: str) -> None:
        try:
            await self._create_instance(group_id)
        finally:
            self._cache.clear()

    async def _create_instance(self, group_id: str) -> None:
        group = await self._describe_group(group_id)
        desired, maximum = group["DesiredCapacity"], group["MaxSize"]
        # With weighted instance types every size is in capacity units, not instances: one
        # more instance is the lightest type's weight more (a heavier one exceeds it, which
        # Auto Scaling allows; it never scales in below the desired capacity for that).
        step = _lightest_weight(group)
        # Auto Scaling refuses a desired capacity above the maximum (ValidationError); say
        # so before asking, with the numbers, as a CapacityError the planner can report.
        if desired + step > maximum:
            raise CapacityError(
                f"AWS group {group_id} is at its maximum size ({desired} of {maximum}); "
                "raise MaxSize to leave room for the rollout's surge"
            )
        live = _live_units(group)
        if desired > live:
            # A launch is outstanding. Auto Scaling accepts a desired capacity it then cannot
            # launch (no capacity in the zones, a missing AMI) and only its activity history
            # says so: report that first. Otherwise the instance is on its way but not listed
            # yet, and whoever asks now cannot tell it from its own: asking for one more each
            # time would pile up desired capacity up to MaxSize (a second CreateHeir of one
            # intent, a pass on a stale cache). So no new launch until the group lists it;
            # retried, the caller asks again once it shows up (or ``cancel_create`` takes it back).
            await self._raise_failed_launch(group_id)
            listed = "capacity unit(s) of instances" if _type_weights(group) else "instance(s)"
            raise ProviderError(
                f"AWS group {group_id}: a launch is outstanding ({live} {listed} listed, "
                f"{desired} desired); asking for another once it shows up",
                reason="ProviderLaunchOutstanding",
            )
        await self._run(
            "SetDesiredCapacity",
            lambda: self._autoscaling.set_desired_capacity(
                AutoScalingGroupName=group_id, DesiredCapacity=desired + step, HonorCooldown=False
            ),
        )
        log.info("group %s: desired capacity %d -> %d", group_id, desired, desired + step)

    async def cancel_create(self, group_id: str) -> bool:
        """Take back a launch the group has not listed (a Join whose deadline passed): the
        desired capacity goes down by what ``create_instance`` raised it, never below what
        is listed. False when nothing was outstanding (the instance showed up after all)."""
        try:
            group = await self._describe_group(group_id)
            desired, live = group["DesiredCapacity"], _live_units(group)
            if desired <= live:
                return False
            lowered = max(desired - _lightest_weight(group), live, group["MinSize"])
            if lowered == desired:
                return False
            await self._run(
                "SetDesiredCapacity",
                lambda: self._autoscaling.set_desired_capacity(
                    AutoScalingGroupName=group_id, DesiredCapacity=lowered, HonorCooldown=False
                ),
            )
            log.info("group %s: launch cancelled, desired capacity %d -> %d", group_id, desired, lowered)
            return True
        finally:
            self._cache.clear()

    async def _raise_failed_launch(self, group_id: str) -> None:
        """The group's newest scaling activity, if it is a launch that failed, as an error."""
        response = await self._run(
            "DescribeScalingActivities",
            lambda: self._autoscaling.describe_scaling_activities(
                AutoScalingGroupName=group_id, MaxRecords=1
            ),
        )
        for activity in response.get("Activities", [])[:1]:
            if activity.get("StatusCode") not in ("Failed", "Cancelled"):
                return
            message = activity.get("StatusMessage") or activity.get("Description") or "no message"
            text = f"AWS group {group_id}: its last launch failed: {message}"
            lowered = message.lower()
            if "capacity" in lowered or "limit" in lowered or any(code in message for code in CAPACITY_CODES):
                raise CapacityError(text)
            raise ProviderError(text, reason="ProviderLaunchFailed")

    async def delete_instance(self, group_id: str, provider_id: str) -> None:
        try:
            await self._delete_instance(group_id, provider_id)
        finally:
            self._cache.clear()

    async def _delete_instance(self, group_id: str, provider_id: str) -> None:
        instance_id = self._instance_id_here(provider_id)
        response = await self._run(
            "DescribeAutoScalingInstances",
            lambda: self._autoscaling.describe_auto_scaling_instances(InstanceIds=[instance_id]),
        )
        found = response.get("AutoScalingInstances", [])
        if not found:
            raise NotFound(f"AWS group {group_id} has no instance {instance_id}")
        member = found[0]
        if member["AutoScalingGroupName"] != group_id:
            raise ProviderError(
                f"AWS instance {instance_id} belongs to group {member['AutoScalingGroupName']}, "
                f"not {group_id}: not deleting it",
                reason="ProviderWrongGroup",
            )
        if member["LifecycleState"].startswith("Terminat"):
            # Already on its way out (an earlier call whose answer was lost): terminating it
            # again would decrement the desired capacity a second time.
            return
        group = await self._describe_group(group_id)
        if group["DesiredCapacity"] - _weight(member) < group["MinSize"]:
            raise ProviderError(
                f"AWS group {group_id} is at its minimum size ({group['MinSize']}): deleting "
                f"{instance_id} would shrink it below; lower MinSize or add an instance first",
                reason="ProviderGroupAtMinimum",
            )
        await self._run(
            "TerminateInstanceInAutoScalingGroup",
            lambda: self._autoscaling.terminate_instance_in_auto_scaling_group(
                InstanceId=instance_id, ShouldDecrementDesiredCapacity=True
            ),
        )
        log.info("group %s: terminating %s", group_id, instance_id)

    # -- helpers -------------------------------------------------------------------------

    def _instance_id_here(self, provider_id: str) -> str:
        """The instance id of ``provider_id``, which must be in this client's region.

        EC2 answers only for its own region: an instance elsewhere is
        ``InvalidInstanceID.NotFound`` here, which fencing would take for "gone" (and a
        delete for "already done"). So a zone of another region, or none at all, is a
        ``ProviderError`` before anything is asked, never ``NotFound``.
        """
        instance_id = instance_id_of(provider_id)
        region = self._ec2.meta.region_name or ""
        zone = zone_of(provider_id)
        if not in_region(zone, region):
            where = f"zone {zone!r}" if zone else "no zone"
            raise ProviderError(
                f"providerID {provider_id!r} names {where}, not one of region {region}: kustos "
                f"cannot see instance {instance_id} from here (give --cloud-option region=)",
                reason="ProviderOtherRegion",
            )
        return instance_id

    async def _run(self, action: str, call: Callable[..., T], *args: Any) -> T:
        """``call`` in a worker thread (boto3 blocks), its failure as a typed error."""
        try:
            return await asyncio.to_thread(call, *args)
        except (ClientError, BotoCoreError) as err:
            raise map_error(err, action) from err

    def _describe_groups(self) -> list[AutoScalingGroupTypeDef]:
        paginator = self._autoscaling.get_paginator("describe_auto_scaling_groups")
        pages = paginator.paginate(Filters=self.options.group_filters())
        return [group for page in pages for group in page.get("AutoScalingGroups", [])]

    async def _describe_group(self, group_id: str) -> AutoScalingGroupTypeDef:
        response = await self._run(
            "DescribeAutoScalingGroups",
            lambda: self._autoscaling.describe_auto_scaling_groups(AutoScalingGroupNames=[group_id]),
        )
        for group in response.get("AutoScalingGroups", []):
            if group["AutoScalingGroupName"] == group_id:
                return group
        raise NotFound(f"AWS has no Auto Scaling group {group_id}")

    def _describe_instances(self, ids: Sequence[str]) -> dict[str, InstanceTypeDef]:
        """By an ``instance-id`` filter, not ``InstanceIds``: an id EC2 no longer knows is
        left out instead of failing the whole call."""
        found: dict[str, InstanceTypeDef] = {}
        paginator = self._ec2.get_paginator("describe_instances")
        for chunk in _chunks(ids, FILTER_CHUNK):
            for page in paginator.paginate(Filters=[{"Name": "instance-id", "Values": list(chunk)}]):
                for reservation in page.get("Reservations", []):
                    for raw in reservation.get("Instances", []):
                        found[raw["InstanceId"]] = raw
        return found

    def _is_ours(self, group: AutoScalingGroupTypeDef) -> bool:
        tags = _tags(group.get("Tags"))
        name = group["AutoScalingGroupName"]
        if self.options.cluster_tag and self.options.cluster_tag not in tags:
            return False
        if parse_role(tags.get(self.options.role_tag, "")) is None:
            self._skip(name, f"tag {self.options.role_tag}={tags.get(self.options.role_tag)!r} is no role "
                             "(ControlPlane or Worker)")  # fmt: skip
            return False
        if _template_of(group) is None:
            self._skip(name, "it launches from no launch template (a launch configuration?)")
            return False
        return True

    def _skip(self, name: str, why: str) -> None:
        if name not in self._skipped:
            self._skipped.add(name)
            log.warning("AWS group %s is not managed: %s", name, why)

    async def _group(self, raw: AutoScalingGroupTypeDef) -> Group | None:
        name = raw["AutoScalingGroupName"]
        role = parse_role(_tags(raw.get("Tags")).get(self.options.role_tag, ""))
        assert role is not None  # _is_ours
        version = await self._template_version(self._template(raw))
        image = version.get("LaunchTemplateData", {}).get("ImageId")
        if not image:
            self._skip(name, "its launch template version has no ImageId")
            return None
        return Group(
            group_id=name,
            role=role,
            image=image,
            min_size=raw["MinSize"],
            max_size=raw["MaxSize"],
            desired=raw["DesiredCapacity"],
        )

    def _template(self, group: AutoScalingGroupTypeDef) -> _Template:
        template = _template_of(group)
        if template is None:
            raise ProviderError(
                f"AWS group {group['AutoScalingGroupName']} launches from no launch template "
                "(a launch configuration?): kustos sets images through launch template versions",
                reason="ProviderUnsupportedGroup",
            )
        return template

    async def _template_version(self, template: _Template) -> LaunchTemplateVersionTypeDef:
        """The version the group launches from ($Default and $Latest resolved)."""

        def describe() -> DescribeLaunchTemplateVersionsResultTypeDef:
            if template.template_id:
                return self._ec2.describe_launch_template_versions(
                    LaunchTemplateId=template.template_id, Versions=[template.version]
                )
            return self._ec2.describe_launch_template_versions(
                LaunchTemplateName=template.template_name or "", Versions=[template.version]
            )

        response = await self._run("DescribeLaunchTemplateVersions", describe)
        versions = response.get("LaunchTemplateVersions", [])
        if not versions:
            raise NotFound(f"AWS launch template {template.describe()} has no version {template.version}")
        return versions[0]


__all__ = [
    "NAME", "AwsOptions", "AwsProvider", "in_region", "instance_id_of", "map_error", "parse_role",
    "provider_id", "zone_of",
]  # fmt: skip
