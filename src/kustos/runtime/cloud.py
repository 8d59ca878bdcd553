"""The cloud provider interface the node families share.

Node image rollouts (``nodes/``) create and delete instances through it; node
maintenance (``maintenance/``) asks it whether a dead node's instance is really stopped
(fencing). Implementations live in ``nodes/cloud/`` (kwok, AWS); the interface is here so
that both families use it without importing each other. It fits instance groups with a
template (AWS Auto Scaling Groups with launch templates, GCP managed instance groups with
instance templates, Azure VM scale sets with their model).

Errors are typed, so a planner can tell a retry from a refusal: every one is a
``ReconcileError`` (backed off by the runtime) whose reason names the class.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol, runtime_checkable

from kustos.runtime.errors import ReconcileError, RetryAfter


class Role(StrEnum):
    CONTROL_PLANE = "ControlPlane"
    WORKER = "Worker"


class InstanceState(StrEnum):
    """What the provider says of an instance; only STOPPED and GONE fence a node."""

    PENDING = "Pending"
    RUNNING = "Running"
    STOPPING = "Stopping"
    STOPPED = "Stopped"
    GONE = "Gone"  # terminated, deleted, or unknown to the provider
    UNKNOWN = "Unknown"

    @property
    def fenced(self) -> bool:
        """True when the instance can no longer run anything (safe to start its pods elsewhere)."""
        return self in (InstanceState.STOPPED, InstanceState.GONE)


@dataclass(frozen=True)
class Instance:
    provider_id: str  # as the Node's spec.providerID says it, e.g. aws:///us-east-1a/i-0abc
    group_id: str
    state: InstanceState
    node_name: str | None = None  # the Node it registers as, when the provider knows it
    image: str | None = None  # the image it was created from, when the provider knows it


@dataclass(frozen=True)
class Group:
    group_id: str
    role: Role
    image: str  # the image new instances of the group are created from
    min_size: int
    max_size: int
    desired: int


class ProviderError(ReconcileError):
    """A provider call failed; retried with backoff unless a subclass says otherwise."""

    def __init__(self, message: str, reason: str = "ProviderError") -> None:
        super().__init__(message, reason=reason)


class NotFound(ProviderError):
    """The instance or group does not exist (for a delete: already done)."""

    def __init__(self, message: str) -> None:
        super().__init__(message, reason="ProviderNotFound")


class CapacityError(ProviderError):
    """The provider cannot create an instance now (quota, no capacity, group at its maximum)."""

    def __init__(self, message: str) -> None:
        super().__init__(message, reason="ProviderCapacity")


class Throttled(ProviderError, RetryAfter):
    """The provider asked us to slow down; ``retry_after`` seconds when it said how long.

    A ``RetryAfter``: the runtime retries the key no sooner than the provider asked.
    """

    def __init__(self, message: str, retry_after: float | None = None) -> None:
        ReconcileError.__init__(self, message, reason="ProviderThrottled")
        self.retry_after = retry_after


@runtime_checkable
class CloudProvider(Protocol):
    """One cloud account or simulated cloud; every call may raise a ``ProviderError``."""

    name: str  # "kwok", "aws", ...

    async def groups(self) -> Sequence[Group]:
        """Every instance group kustos may manage (discovery creates a ScalingGroup each)."""
        ...

    async def instances(self, group_id: str) -> Sequence[Instance]:
        """The group's instances, including ones still pending."""
        ...

    async def instance(self, provider_id: str) -> Instance:
        """One instance by the Node's providerID; ``NotFound`` when the provider has none."""
        ...

    async def set_image(self, group_id: str, image: str) -> None:
        """Make ``image`` the one new instances of the group are created from."""
        ...

    async def create_instance(self, group_id: str) -> None:
        """Grow the group by one; the new instance shows up in ``instances`` (maybe later)."""
        ...

    async def delete_instance(self, group_id: str, provider_id: str) -> None:
        """Terminate the instance and shrink the group by one; ``NotFound`` if already gone."""
        ...


__all__ = [
    "CapacityError",
    "CloudProvider",
    "Group",
    "Instance",
    "InstanceState",
    "NotFound",
    "ProviderError",
    "Role",
    "Throttled",
]
