"""Azure: virtual machine scale sets (uniform and flexible orchestration), through azure-mgmt-compute.

One ``Group`` is one scale set, its id the ARM resource id
``/subscriptions/<s>/resourceGroups/<rg>/providers/Microsoft.Compute/virtualMachineScaleSets/<n>``
as the node operator we replace wrote it. The scale sets kustos manages carry the role tag
(``kustos-role``: ``control-plane`` or ``worker``; Azure tag names allow no ``/``) and,
when a cluster is given, ``kustos-cluster``.

- **Image**: the scale set model's ``imageReference``: a gallery image (version) id such as
  ``/subscriptions/.../galleries/<g>/images/<i>/versions/<v>``, a shared or community
  gallery id, or a marketplace URN ``publisher:offer:sku:version``. A new image is the
  model updated (a PATCH of ``imageReference`` only); instances made before keep theirs.
- **Create**: capacity + 1; the new instance is the one the set lists next. No second
  increase while one is outstanding (capacity above the instances listed).
- **Delete**: ``deleteInstances`` with the instance's id (uniform: its instance id;
  flexible: its VM name), which lowers the capacity with it, after checking membership
  and that it is not already being deleted (a retry never lowers twice).
- **State**: the instance view's ``ProvisioningState/*`` and ``PowerState/*``
  (``deallocated`` and ``stopped`` fence; ``deleting`` is on its way out).
- Long operations are polled to completion (ARM's ``Azure-AsyncOperation``), the client's
  own retries are off: a 429 reaches kustos at once as ``Throttled`` with its Retry-After.

Provider IDs are the Azure cloud provider's: ``azure://`` + the VM's resource id (uniform:
``.../virtualMachineScaleSets/<n>/virtualMachines/<instance id>``, flexible:
``.../virtualMachines/<name>``). Azure ids are case-insensitive and the cloud provider
lowercases the resource group; ids are compared without case.

Credentials: azure-identity's ``DefaultAzureCredential`` (AZURE_CLIENT_ID/AZURE_TENANT_ID with
AZURE_CLIENT_SECRET or a certificate, AKS workload identity's AZURE_FEDERATED_TOKEN_FILE, a
managed identity), or ``token-file`` (a bearer token kept fresh by something else, or a
local fake's). Calls (for the role in docs/nodeimage-azure.md):
Microsoft.Compute/virtualMachineScaleSets/read, /write, /delete/action,
/virtualMachines/read, /virtualMachines/instanceView/read; Microsoft.Compute/virtualMachines/read
(flexible sets); Microsoft.Compute/locations/operations/read.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from azure.core.credentials import AccessToken, TokenCredential
from azure.core.exceptions import (
    AzureError,
    ClientAuthenticationError,
    HttpResponseError,
    ResourceNotFoundError,
    ServiceRequestError,
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
    from azure.mgmt.compute import ComputeManagementClient
    from azure.mgmt.compute import models as az

log = logging.getLogger(__name__)


def load_sdk() -> None:
    """Import azure-mgmt-compute: ~120 MiB and seconds of CPU, so once, in a worker thread, at
    the provider's first call; ``kustos run`` serves its probes meanwhile. azure-core logs
    every request and response at INFO, and azure-identity each credential it tried and each
    token (with workload identity, "Incomplete environment configuration" at every provider
    made): kept to warnings, the failures kustos reports itself."""
    global az
    from azure.mgmt.compute import models as az

    _prepare_models()
    for chatty in ("azure.core.pipeline.policies.http_logging_policy", "azure.identity"):
        logging.getLogger(chatty).setLevel(logging.WARNING)


_PREPARING = threading.Lock()
_prepared = False  # once per process: every provider's first call loads the SDK
# What the provider reads and writes: every model these hold, at any depth, is prepared.
_MODEL_ROOTS = (
    "VirtualMachineScaleSet", "VirtualMachineScaleSetVM", "VirtualMachine", "VirtualMachineScaleSetUpdate",
    "VirtualMachineScaleSetVMInstanceRequiredIDs",
)  # fmt: skip


def _prepare_models() -> None:
    """Build the field table of every compute model the provider meets now, in one thread at a
    time, before any response is read. The SDK builds a class's table at its first object,
    unsafely across threads (Azure/azure-sdk-for-python#47426, open in 39.0.0): threads meeting
    there can leave a model holding raw dicts where models belong, silently. CI saw a scale
    set's ``properties`` come back a dict; the operator reads scale sets and VMs from several
    threads at once. Only the 167 classes reachable from ``_MODEL_ROOTS``: all 514 would cost
    8.7 MiB, these none measurable."""
    from azure.mgmt.compute._utils.model_base import Model

    def models_in(kind: object) -> list[type[Model]]:  # a field's deserializer: partials of types
        if isinstance(kind, type):
            return [kind] if issubclass(kind, Model) else []
        parts = (*kind.args, *kind.keywords.values()) if isinstance(kind, functools.partial) else kind
        return [m for part in parts for m in models_in(part)] if isinstance(parts, tuple | list) else []

    global _prepared
    with _PREPARING:
        if _prepared:
            return
        todo: list[type[Model]] = [getattr(az, name) for name in _MODEL_ROOTS]
        seen: set[type[Model]] = set()
        while todo:
            model = todo.pop()
            if model in seen:
                continue
            seen.add(model)
            Model.__new__(model)  # builds the table; __init__ is not run
            fields = vars(model)["_attr_to_rest_field"].values()  # what __new__ just set on the class
            todo += [m for field in fields for m in models_in(field._type)]
            todo += getattr(model, "__mapping__", {}).values()  # the subtypes of a polymorphic one
        _prepared = True


T = TypeVar("T")

NAME = "azure"
PROVIDER_PREFIX = "azure://"
ROLE_TAG = "kustos-role"
CLUSTER_TAG = "kustos-cluster"
DEFAULT_CACHE_SECONDS = 2.0
DEFAULT_POLL_SECONDS = 2.0
THROTTLE_RETRY_AFTER = 5.0
OPERATION_TIMEOUT = 180.0
SCALE_SETS = "/providers/microsoft.compute/virtualmachinescalesets/"
CREDENTIAL_SOURCES = (
    "AZURE_TENANT_ID and AZURE_CLIENT_ID with AZURE_CLIENT_SECRET, a certificate or workload identity's "
    "AZURE_FEDERATED_TOKEN_FILE, or a managed identity"
)

CAPACITY_CODES = frozenset(
    {
        "QuotaExceeded", "AllocationFailed", "ZonalAllocationFailed", "OverconstrainedAllocationRequest",
        "OverconstrainedZonalAllocationRequest", "SkuNotAvailable", "AllocationFailedVMSeriesNotAvailable",
    }
)  # fmt: skip
THROTTLING_CODES = frozenset({"TooManyRequests", "OperationThrottled", "RetryableError"})

POWER_STATES = {
    "starting": InstanceState.PENDING,
    "running": InstanceState.RUNNING,
    "stopping": InstanceState.STOPPING,
    "deallocating": InstanceState.STOPPING,
    "stopped": InstanceState.STOPPED,
    "deallocated": InstanceState.STOPPED,
}


def parse_role(value: str) -> Role | None:
    normal = value.replace("-", "").replace("_", "").lower()
    return {"controlplane": Role.CONTROL_PLANE, "worker": Role.WORKER}.get(normal)


@dataclass(frozen=True)
class ScaleSetRef:
    subscription: str
    resource_group: str
    name: str

    @classmethod
    def parse(cls, group_id: str) -> ScaleSetRef:
        parts = group_id.strip("/").split("/")
        lowered = [p.lower() for p in parts]
        if (
            len(parts) != 8
            or lowered[0] != "subscriptions"
            or lowered[2] != "resourcegroups"
            or lowered[4:7] != ["providers", "microsoft.compute", "virtualmachinescalesets"]
        ):
            raise ProviderError(
                f"group id {group_id!r} is not a scale set (want /subscriptions/<s>/resourceGroups/<rg>"
                "/providers/Microsoft.Compute/virtualMachineScaleSets/<name>)",
                reason="ProviderInvalidID",
            )
        return cls(parts[1], parts[3], parts[7])

    @property
    def group_id(self) -> str:
        return (
            f"/subscriptions/{self.subscription}/resourceGroups/{self.resource_group}"
            f"/providers/Microsoft.Compute/virtualMachineScaleSets/{self.name}"
        )


@dataclass(frozen=True)
class VmRef:
    """A VM named by a providerID: a uniform set's instance, or a standalone (flexible) VM."""

    subscription: str
    resource_group: str
    scale_set: str | None  # uniform only
    name: str  # uniform: the instance id; otherwise the VM name

    @classmethod
    def parse(cls, provider_id: str) -> VmRef:
        path = provider_id[len(PROVIDER_PREFIX) :] if provider_id.startswith(PROVIDER_PREFIX) else ""
        parts = path.strip("/").split("/")
        lowered = [p.lower() for p in parts]
        ok = len(parts) >= 8 and lowered[0] == "subscriptions" and lowered[2] == "resourcegroups"
        scale_sets = ["providers", "microsoft.compute", "virtualmachinescalesets"]
        if ok and len(parts) == 10 and lowered[4:7] == scale_sets and lowered[8] == "virtualmachines":
            return cls(parts[1], parts[3], parts[7], parts[9])
        if ok and len(parts) == 8 and lowered[4:7] == ["providers", "microsoft.compute", "virtualmachines"]:
            return cls(parts[1], parts[3], None, parts[7])
        raise ProviderError(
            f"providerID {provider_id!r} is not an Azure VM (want azure:///subscriptions/<s>/resourceGroups/"
            "<rg>/providers/Microsoft.Compute/virtualMachineScaleSets/<set>/virtualMachines/<id> or "
            ".../virtualMachines/<name>)",
            reason="ProviderInvalidID",
        )


def uniform_provider_id(ref: ScaleSetRef, instance_id: str) -> str:
    return (
        f"{PROVIDER_PREFIX}/subscriptions/{ref.subscription}/resourceGroups/{ref.resource_group.lower()}"
        f"/providers/Microsoft.Compute/virtualMachineScaleSets/{ref.name}/virtualMachines/{instance_id}"
    )


def flexible_provider_id(subscription: str, resource_group: str, name: str) -> str:
    return (
        f"{PROVIDER_PREFIX}/subscriptions/{subscription}/resourceGroups/{resource_group.lower()}"
        f"/providers/Microsoft.Compute/virtualMachines/{name}"
    )


def image_of(reference: az.ImageReference | None) -> str | None:
    """An image reference as one string: a gallery id, or a marketplace URN."""
    if reference is None:
        return None
    found = reference.id or reference.shared_gallery_image_id or reference.community_gallery_image_id
    if found:
        return found
    parts = (reference.publisher, reference.offer, reference.sku, reference.version)
    return ":".join(p or "" for p in parts) if any(parts) else None


def image_reference(image: str) -> az.ImageReference:
    """The reverse of ``image_of``; an image it cannot read is a ``ProviderError`` naming it."""
    load_sdk()
    lowered = image.lower()
    if lowered.startswith("/sharedgalleries/"):
        return az.ImageReference(shared_gallery_image_id=image)
    if lowered.startswith("/communitygalleries/"):
        return az.ImageReference(community_gallery_image_id=image)
    if lowered.startswith("/subscriptions/"):
        return az.ImageReference(id=image)
    parts = image.split(":")
    if len(parts) == 4 and all(parts):
        return az.ImageReference(publisher=parts[0], offer=parts[1], sku=parts[2], version=parts[3])
    raise ProviderError(
        f"image {image!r} is no Azure image: want a gallery image (version) id "
        "/subscriptions/.../galleries/<g>/images/<i>/versions/<v>, /SharedGalleries/..., "
        "/CommunityGalleries/... or a URN publisher:offer:sku:version",
        reason="ProviderInvalidImage",
    )


def provisioning_state(statuses: Sequence[az.InstanceViewStatus] | None, provisioning: str | None) -> str:
    """The VM's provisioning state, lowercase: the instance view's when it has one."""
    codes = [str(s.code or "").lower() for s in statuses or ()]
    found = [c.partition("/")[2] for c in codes if c.startswith("provisioningstate/")]
    return (found[0] if found else (provisioning or "")).lower()


def vm_state(statuses: Sequence[az.InstanceViewStatus] | None, provisioning: str | None) -> InstanceState:
    codes = [str(s.code or "").lower() for s in statuses or ()]
    power = [c.partition("/")[2] for c in codes if c.startswith("powerstate/")]
    current = provisioning_state(statuses, provisioning)
    if current == "deleting":
        return InstanceState.STOPPING
    if power:
        return POWER_STATES.get(power[0], InstanceState.UNKNOWN)
    if current in ("creating", "updating", ""):
        return InstanceState.PENDING
    if current == "failed":
        return InstanceState.UNKNOWN
    return InstanceState.RUNNING if current == "succeeded" else InstanceState.UNKNOWN


def _retry_after(err: HttpResponseError) -> float:
    response = err.response
    headers = getattr(response, "headers", None) or {}
    value = headers.get("Retry-After")
    try:
        return max(float(value), 0.0) if value is not None else THROTTLE_RETRY_AFTER
    except ValueError:
        return THROTTLE_RETRY_AFTER


def map_error(err: Exception, action: str) -> ProviderError:
    """A failed ARM call as one of the typed errors of ``runtime.cloud``."""
    if isinstance(err, ClientAuthenticationError) and err.status_code not in (401, 403):
        return ProviderError(
            f"Azure {action}: no usable credentials ({err.message}); kustos uses DefaultAzureCredential "
            f"({CREDENTIAL_SOURCES}; docs/nodeimage-azure.md)",
            reason="ProviderCredentials",
        )
    if isinstance(err, HttpResponseError):
        code = (err.error.code if err.error else None) or ""
        message = (err.error.message if err.error else None) or err.message
        text = f"Azure {action}: {err.status_code} {code}: {message}"
        if err.status_code == 429 or code in THROTTLING_CODES:
            return Throttled(text, retry_after=_retry_after(err))
        if code in CAPACITY_CODES or (code == "OperationNotAllowed" and "quota" in str(message).lower()):
            return CapacityError(text)
        if isinstance(err, ResourceNotFoundError) or err.status_code == 404:
            return NotFound(text)
        if err.status_code == 401:
            return ProviderError(
                f"{text}: Resource Manager refused the credential's token (DefaultAzureCredential: "
                f"{CREDENTIAL_SOURCES}; docs/nodeimage-azure.md)",
                reason="ProviderCredentials",
            )
        if err.status_code == 403:
            return ProviderError(
                f"{text} (docs/nodeimage-azure.md lists the permissions kustos needs)",
                reason="ProviderAccessDenied",
            )
        return ProviderError(text)
    if isinstance(err, ServiceRequestError):
        return ProviderError(f"Azure {action}: {err}", reason="ProviderUnreachable")
    return ProviderError(f"Azure {action}: {type(err).__name__}: {err}")


class TokenFileCredential:
    """A bearer token read from a file at each request (something else keeps it fresh)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def get_token(self, *scopes: str, **kwargs: Any) -> AccessToken:
        token = self.path.read_text().strip()
        return AccessToken(token, int(time.time()) + 300)


@dataclass(frozen=True)
class AzureOptions:
    subscription: str
    resource_group: str | None = None
    endpoint: str | None = None
    token_file: str | None = None
    ca_bundle: str | None = None
    role_tag: str = ROLE_TAG
    cluster: str | None = None
    cache_seconds: float = DEFAULT_CACHE_SECONDS
    poll_seconds: float = DEFAULT_POLL_SECONDS

    KEYS = (
        "subscription", "resource_group", "endpoint", "token_file", "ca_bundle", "role_tag", "cluster",
        "cache_seconds", "poll_seconds",
    )  # fmt: skip

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> AzureOptions:
        """``subscription`` (or AZURE_SUBSCRIPTION_ID), ``resource-group`` (only its scale sets),
        ``endpoint`` (another Resource Manager root), ``token-file``, ``ca-bundle`` (a CA file to
        trust for it), ``role-tag``, ``cluster``
        (only sets tagged ``kustos-cluster=<cluster>``), ``cache-seconds`` (default 2) and
        ``poll-seconds`` (between polls of a long operation, default 2)."""
        values = {key.replace("-", "_"): value for key, value in options.items()}
        unknown = sorted(set(values) - set(cls.KEYS))
        if unknown:
            allowed = ", ".join(k.replace("_", "-") for k in cls.KEYS)
            raise ValueError(f"unknown Azure cloud option(s) {', '.join(unknown)}; known: {allowed}")
        for key, value in values.items():
            if not value:
                raise ValueError(f"Azure cloud option {key.replace('_', '-')} is empty")
        subscription = values.get("subscription") or os.environ.get("AZURE_SUBSCRIPTION_ID")
        if not subscription:
            raise ValueError(
                "Azure cloud provider: give --cloud-option subscription=<id> or set AZURE_SUBSCRIPTION_ID"
            )
        seconds = {}
        for key, default, top in (("cache_seconds", DEFAULT_CACHE_SECONDS, 60.0), ("poll_seconds",
                                  DEFAULT_POLL_SECONDS, 60.0)):  # fmt: skip
            try:
                seconds[key] = float(values.get(key, default))
            except ValueError:
                raise ValueError(
                    f"Azure cloud option {key.replace('_', '-')}: {values[key]!r} is no number"
                ) from None
            if not 0 <= seconds[key] <= top:
                raise ValueError(
                    f"Azure cloud option {key.replace('_', '-')}: {seconds[key]} is not within 0..{top:.0f}"
                )
        return cls(
            subscription=subscription,
            resource_group=values.get("resource_group"),
            endpoint=values.get("endpoint"),
            token_file=values.get("token_file"),
            ca_bundle=values.get("ca_bundle"),
            role_tag=values.get("role_tag", ROLE_TAG),
            cluster=values.get("cluster"),
            cache_seconds=seconds["cache_seconds"],
            poll_seconds=seconds["poll_seconds"],
        )


@dataclass(frozen=True)
class _Member:
    instance: Instance
    delete_id: str  # what deleteInstances takes: the instance id (uniform) or VM name (flexible)
    deleting: bool


class AzureProvider:
    """``runtime.cloud.CloudProvider`` for virtual machine scale sets."""

    name = NAME

    def __init__(self, options: AzureOptions, monotonic: Callable[[], float] = time.monotonic) -> None:
        self.options = options
        self._client: ComputeManagementClient | None = None  # made at the first call (``load_sdk``)
        self._loading = asyncio.Lock()
        self._monotonic = monotonic
        self._cache = LookupCache(options.cache_seconds, monotonic)

    @classmethod
    def from_options(cls, options: Mapping[str, str]) -> AzureProvider:
        return cls(AzureOptions.parse(options))

    def _make_client(self) -> ComputeManagementClient:
        load_sdk()
        from azure.mgmt.compute import ComputeManagementClient

        options = self.options
        credential: TokenCredential
        if options.token_file:
            credential = TokenFileCredential(Path(options.token_file))
        else:
            from azure.identity import DefaultAzureCredential

            credential = DefaultAzureCredential(exclude_interactive_browser_credential=True)
        transport: dict[str, Any] = {"connection_verify": options.ca_bundle} if options.ca_bundle else {}
        return ComputeManagementClient(
            credential, options.subscription, base_url=options.endpoint,
            retry_total=0, polling_interval=options.poll_seconds, connection_timeout=5, read_timeout=20,
            **transport,
        )  # fmt: skip

    @property
    def client(self) -> ComputeManagementClient:
        assert self._client is not None, "AzureProvider._run makes the client first"
        return self._client

    # -- the CloudProvider interface -------------------------------------------------------

    async def groups(self) -> Sequence[Group]:
        cached: Sequence[Group] | None = self._cache.get(("groups",))
        if cached is not None:
            return cached
        group = self.options.resource_group

        def listed() -> list[az.VirtualMachineScaleSet]:
            sets = self.client.virtual_machine_scale_sets
            return list(sets.list(group) if group else sets.list_all())

        raw = await self._run("virtualMachineScaleSets.list", listed)
        found = tuple(g for g in (self._group(s) for s in raw) if g is not None)
        return self._cache.put(("groups",), found)

    async def instances(self, group_id: str) -> Sequence[Instance]:
        cached: Sequence[Instance] | None = self._cache.get(("instances", group_id))
        if cached is not None:
            return cached
        members = await self._members(ScaleSetRef.parse(group_id))
        return self._cache.put(("instances", group_id), tuple(m.instance for m in members))

    async def instance(self, provider_id: str) -> Instance:
        ref = self._vm_here(provider_id)
        if ref.scale_set is not None:
            scale_set = ScaleSetRef(ref.subscription, ref.resource_group, ref.scale_set)
            vm = await self._run(
                "virtualMachineScaleSetVMs.get",
                lambda: self.client.virtual_machine_scale_set_vms.get(
                    ref.resource_group, scale_set.name, ref.name, expand="instanceView"
                ),
            )
            return self._uniform(scale_set, vm).instance
        standalone = await self._run(
            "virtualMachines.get",
            lambda: self.client.virtual_machines.get(ref.resource_group, ref.name, expand="instanceView"),
        )
        properties = standalone.properties
        owner = (
            properties.virtual_machine_scale_set.id
            if properties and properties.virtual_machine_scale_set
            else ""
        )
        return self._flexible(standalone, ScaleSetRef.parse(owner).group_id if owner else "").instance

    async def set_image(self, group_id: str, image: str) -> None:
        try:
            await self._set_image(ScaleSetRef.parse(group_id), image)
        finally:
            self._cache.clear()

    async def create_instance(self, group_id: str) -> None:
        try:
            await self._create_instance(ScaleSetRef.parse(group_id))
        finally:
            self._cache.clear()

    async def delete_instance(self, group_id: str, provider_id: str) -> None:
        try:
            await self._delete_instance(ScaleSetRef.parse(group_id), provider_id)
        finally:
            self._cache.clear()

    async def cancel_create(self, group_id: str) -> bool:
        """Take back a creation the set has not listed: capacity - 1 (the default scale-in
        policy removes the highest instance id, the newest). False when none was outstanding."""
        ref = ScaleSetRef.parse(group_id)
        try:
            scale_set = await self._scale_set(ref)
            live = [m for m in await self._members(ref) if not m.deleting]
            capacity = int(scale_set.sku.capacity or 0) if scale_set.sku else 0
            if capacity <= len(live):
                return False
            await self._set_capacity(ref, scale_set, capacity - 1)
            return True
        finally:
            self._cache.clear()

    # -- the steps -------------------------------------------------------------------------

    async def _set_image(self, ref: ScaleSetRef, image: str) -> None:
        scale_set = await self._scale_set(ref)
        if (_current_image(scale_set) or "").lower() == image.lower():
            return
        update = az.VirtualMachineScaleSetUpdate(
            properties=az.VirtualMachineScaleSetUpdateProperties(
                virtual_machine_profile=az.VirtualMachineScaleSetUpdateVMProfile(
                    storage_profile=az.VirtualMachineScaleSetUpdateStorageProfile(
                        image_reference=image_reference(image)
                    )
                )
            )
        )
        await self._wait(
            "virtualMachineScaleSets.update (image)",
            lambda: self.client.virtual_machine_scale_sets.begin_update(ref.resource_group, ref.name, update),
        )
        log.info("scale set %s: model image %s", ref.group_id, image)

    async def _create_instance(self, ref: ScaleSetRef) -> None:
        scale_set = await self._scale_set(ref)
        members = await self._members(ref)
        live = [m for m in members if not m.deleting]
        capacity = int(scale_set.sku.capacity or 0) if scale_set.sku else 0
        if capacity > len(live):
            raise ProviderError(
                f"Azure scale set {ref.group_id}: a creation is outstanding ({len(live)} instance(s) "
                f"listed, capacity {capacity}); asking for another once it shows up",
                reason="ProviderLaunchOutstanding",
            )
        await self._set_capacity(ref, scale_set, capacity + 1)
        log.info("scale set %s: capacity %d -> %d", ref.group_id, capacity, capacity + 1)

    async def _set_capacity(
        self, ref: ScaleSetRef, scale_set: az.VirtualMachineScaleSet, capacity: int
    ) -> None:
        sku = scale_set.sku or az.Sku()
        update = az.VirtualMachineScaleSetUpdate(sku=az.Sku(name=sku.name, tier=sku.tier, capacity=capacity))
        await self._wait(
            "virtualMachineScaleSets.update (capacity)",
            lambda: self.client.virtual_machine_scale_sets.begin_update(ref.resource_group, ref.name, update),
        )

    async def _delete_instance(self, ref: ScaleSetRef, provider_id: str) -> None:
        self._vm_here(provider_id)
        members = await self._members(ref)
        member = next((m for m in members if m.instance.provider_id.lower() == provider_id.lower()), None)
        if member is None:
            other = await self.instance(provider_id)  # NotFound when it is gone
            raise ProviderError(
                f"Azure VM {provider_id} belongs to {other.group_id or 'no scale set'}, not {ref.group_id}: "
                "not deleting it",
                reason="ProviderWrongGroup",
            )
        if member.deleting:
            return  # an earlier call whose answer was lost: deleting again lowers nothing
        request = az.VirtualMachineScaleSetVMInstanceRequiredIDs(instance_ids=[member.delete_id])
        await self._wait(
            "virtualMachineScaleSets.deleteInstances",
            lambda: self.client.virtual_machine_scale_sets.begin_delete_instances(
                ref.resource_group, ref.name, request
            ),
        )
        log.info("scale set %s: deleted %s", ref.group_id, member.delete_id)

    # -- helpers ---------------------------------------------------------------------------

    def _vm_here(self, provider_id: str) -> VmRef:
        ref = VmRef.parse(provider_id)
        if ref.subscription.lower() != self.options.subscription.lower():
            raise ProviderError(
                f"providerID {provider_id!r} names subscription {ref.subscription}, not "
                f"{self.options.subscription}: kustos does not manage it",
                reason="ProviderOtherSubscription",
            )
        return ref

    def _group(self, scale_set: az.VirtualMachineScaleSet) -> Group | None:
        tags = dict(scale_set.tags or {})
        if self.options.cluster and tags.get(CLUSTER_TAG) != self.options.cluster:
            return None
        role = parse_role(tags.get(self.options.role_tag, ""))
        image = _current_image(scale_set)
        if role is None or image is None or not scale_set.id:
            return None
        return Group(
            group_id=ScaleSetRef.parse(scale_set.id).group_id,
            role=role,
            image=image,
            # A scale set has no bounds of its own (autoscale settings have; kustos pauses autoscaling).
            min_size=0,
            max_size=1000,
            desired=int(scale_set.sku.capacity or 0) if scale_set.sku else 0,
        )

    async def _scale_set(self, ref: ScaleSetRef) -> az.VirtualMachineScaleSet:
        return await self._run(
            "virtualMachineScaleSets.get",
            lambda: self.client.virtual_machine_scale_sets.get(ref.resource_group, ref.name),
        )

    async def _members(self, ref: ScaleSetRef) -> list[_Member]:
        scale_set = await self._scale_set(ref)
        mode = scale_set.properties.orchestration_mode if scale_set.properties else None
        if mode is not None and str.lower(mode) == "flexible":
            owner = ref.group_id
            vms = await self._run(
                "virtualMachines.list",
                lambda: list(
                    self.client.virtual_machines.list(
                        ref.resource_group,
                        filter=f"'virtualMachineScaleSet/id' eq '{owner}'",
                        expand="instanceView",
                    )
                ),
            )
            return [self._flexible(vm, ref.group_id) for vm in vms]
        uniform = await self._run(
            "virtualMachineScaleSetVMs.list",
            lambda: list(
                self.client.virtual_machine_scale_set_vms.list(
                    ref.resource_group, ref.name, expand="instanceView"
                )
            ),
        )
        return [self._uniform(ref, vm) for vm in uniform]

    def _uniform(self, ref: ScaleSetRef, vm: az.VirtualMachineScaleSetVM) -> _Member:
        properties = vm.properties
        view = properties.instance_view if properties else None
        computer = (
            properties.os_profile.computer_name if properties and properties.os_profile else None
        ) or (view.computer_name if view else None)
        storage = properties.storage_profile if properties else None
        instance = Instance(
            provider_id=uniform_provider_id(ref, str(vm.instance_id)),
            group_id=ref.group_id,
            state=vm_state(
                view.statuses if view else None, properties.provisioning_state if properties else None
            ),
            node_name=computer.lower() if computer else None,
            image=image_of(storage.image_reference) if storage else None,
        )
        deleting = provisioning_state(
            view.statuses if view else None, properties.provisioning_state if properties else None
        )
        return _Member(instance, str(vm.instance_id), deleting == "deleting")

    def _flexible(self, vm: az.VirtualMachine, group_id: str) -> _Member:
        properties = vm.properties
        view = properties.instance_view if properties else None
        computer = properties.os_profile.computer_name if properties and properties.os_profile else None
        storage = properties.storage_profile if properties else None
        resource = VmRef.parse(PROVIDER_PREFIX + "/" + str(vm.id).strip("/"))
        instance = Instance(
            provider_id=flexible_provider_id(resource.subscription, resource.resource_group, str(vm.name)),
            group_id=group_id,
            state=vm_state(
                view.statuses if view else None, properties.provisioning_state if properties else None
            ),
            node_name=computer.lower() if computer else None,
            image=image_of(storage.image_reference) if storage else None,
        )
        deleting = provisioning_state(
            view.statuses if view else None, properties.provisioning_state if properties else None
        )
        return _Member(instance, str(vm.name), deleting == "deleting")

    async def _wait(self, action: str, begin: Callable[[], Any]) -> None:
        """Start a long operation and poll it to completion; its failure, typed."""

        def run() -> None:
            poller = begin()
            poller.result(timeout=OPERATION_TIMEOUT)
            if not poller.done():
                raise ProviderError(
                    f"Azure {action}: not done after {OPERATION_TIMEOUT:.0f}s", reason="ProviderTimeout"
                )

        await self._run(action, run)

    async def _run(self, action: str, call: Callable[[], T]) -> T:
        """``call`` in a worker thread (the client blocks), its failure as a typed error."""
        if self._client is None:
            async with self._loading:
                if self._client is None:
                    try:
                        self._client = await asyncio.to_thread(self._make_client)
                    except (AzureError, ValueError, OSError) as err:
                        raise map_error(err, "creating the compute client") from err
        try:
            return await asyncio.to_thread(call)
        except ProviderError:
            raise
        except (AzureError, OSError) as err:
            raise map_error(err, action) from err


def _current_image(scale_set: az.VirtualMachineScaleSet) -> str | None:
    properties = scale_set.properties
    profile = properties.virtual_machine_profile if properties else None
    storage = profile.storage_profile if profile else None
    return image_of(storage.image_reference) if storage else None


__all__ = [
    "NAME", "AzureOptions", "AzureProvider", "ScaleSetRef", "TokenFileCredential", "VmRef",
    "flexible_provider_id", "image_of", "image_reference", "map_error", "uniform_provider_id", "vm_state",
]  # fmt: skip
