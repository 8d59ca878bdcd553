"""GCP: managed instance groups (zonal or regional) with instance templates.

One ``Group`` is one managed instance group (MIG), its id the relative resource name
``projects/<p>/zones/<z>/instanceGroupManagers/<n>`` (or ``regions/<r>``), as the node
operator we replace wrote it in ``ScalingGroup.spec.groupId``. The MIGs kustos manages are
those whose instance template carries the role label (``kustos-role``: ``control-plane`` or
``worker``; GCP label keys allow no ``/``) and, when a cluster is given, ``kustos-cluster``.

- **Image**: the boot disk's ``sourceImage`` of the group's instance template (global or
  regional), as ``projects/<p>/global/images/<name>``. A new image is a new template: the
  current one cloned (in its region, when regional) with only the image replaced (its name
  derived from both, so a retried call finds the template made the first time), then set on
  the group (``setInstanceTemplate``, which changes no running instance).
- **Create**: the group is resized by one; the MIG names and creates the instance, which
  ``listManagedInstances`` shows at once (``CREATING``). As on AWS, no second resize while a
  launch is outstanding, and a creation the MIG keeps failing (quota, no resources in the
  zone) is reported as the error it is.
- **Delete**: ``deleteInstances`` (the target size shrinks with it), after checking that the
  instance is the group's and not already on its way out (a retry never shrinks twice).
- **State**: the instance's status (GCE's ``TERMINATED`` is a stopped VM, not a deleted one).
- Operations are polled to completion through the operations API of their scope;
  the client's own poller is not used, as it builds operation clients for Google's
  endpoint whatever endpoint the client was given.

Calls made, so docs/nodeimage-gcp.md can list the permissions: compute.instanceGroupManagers
.list/.get/.update (resize, deleteInstances, setInstanceTemplate, listManagedInstances),
compute.instanceTemplates.get/.create (and .useReadOnly; regional templates too), compute.instances.get,
compute.zoneOperations.get, compute.regionOperations.get, compute.globalOperations.get.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

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
    from google.api_core import exceptions as gexc
    from google.auth import exceptions as gauth_exceptions
    from google.cloud import compute_v1

log = logging.getLogger(__name__)

T = TypeVar("T")


def load_sdk() -> None:
    """Import google-cloud-compute: ~120 MiB and seconds of CPU (its package builds the whole
    Compute API), so once, in a worker thread, at the provider's first call; ``kustos run``
    serves its probes meanwhile. The module's SDK names are bound here."""
    global compute_v1, gexc, gauth_exceptions
    from google.api_core import exceptions as gexc
    from google.auth import exceptions as gauth_exceptions
    from google.cloud import compute_v1


NAME = "gcp"
PROVIDER_PREFIX = "gce://"
ROLE_LABEL = "kustos-role"
CLUSTER_LABEL = "kustos-cluster"
DEFAULT_CACHE_SECONDS = 2.0
# GCE's rate limit errors rarely carry Retry-After; per-project quotas refill per minute.
THROTTLE_RETRY_AFTER = 5.0
CALL_TIMEOUT = 20.0
OPERATION_TIMEOUT = 120.0
# Set by the MIG on every instance it creates.
CREATED_BY_KEY = "created-by"
TEMPLATE_KEY = "instance-template"
MIG_GROUP = re.compile(r"projects/([^/]+)/(zones|regions)/([^/]+)/instanceGroupManagers/([^/]+)$")
TEMPLATE_SUFFIX = re.compile(r"-k[0-9a-f]{10}$")
TEMPLATE = re.compile(r"^projects/([^/]+)/(?:global|regions/([^/]+))/instanceTemplates/([^/]+)$")

THROTTLING_REASONS = frozenset({"rateLimitExceeded", "userRateLimitExceeded", "RATE_LIMIT_EXCEEDED"})
CAPACITY_REASONS = frozenset(
    {
        "quotaExceeded", "QUOTA_EXCEEDED", "ZONE_RESOURCE_POOL_EXHAUSTED",
        "ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS", "REGION_RESOURCE_POOL_EXHAUSTED",
        "resourceExhausted", "RESOURCE_EXHAUSTED",
    }
)  # fmt: skip

# GCE instance status -> ours. TERMINATED is a stopped VM (it can be started again).
GCE_STATES = {
    "PROVISIONING": InstanceState.PENDING,
    "STAGING": InstanceState.PENDING,
    "RUNNING": InstanceState.RUNNING,
    "STOPPING": InstanceState.STOPPING,
    "SUSPENDING": InstanceState.STOPPING,
    "REPAIRING": InstanceState.STOPPING,
    "TERMINATED": InstanceState.STOPPED,
    "SUSPENDED": InstanceState.STOPPED,
}
LEAVING_ACTIONS = frozenset({"DELETING", "ABANDONING"})
CREDENTIAL_SOURCES = (
    "Application Default Credentials: the file GOOGLE_APPLICATION_CREDENTIALS names (a service account key, "
    "a workload identity federation configuration), gcloud's application default login, or the metadata "
    "server (GKE workload identity)"
)


def parse_role(value: str) -> Role | None:
    normal = value.replace("-", "").replace("_", "").lower()
    return {"controlplane": Role.CONTROL_PLANE, "worker": Role.WORKER}.get(normal)


def relative(url: str) -> str:
    """``https://.../compute/v1/projects/p/zones/z/...`` -> ``projects/p/zones/z/...``."""
    at = url.find("projects/")
    return url[at:] if at >= 0 else url


def last(url: str) -> str:
    return url.rstrip("/").rpartition("/")[2]


def provider_id(project: str, zone: str, name: str) -> str:
    """As Kubernetes' GCE cloud provider writes it: ``gce://<project>/<zone>/<name>``."""
    return f"{PROVIDER_PREFIX}{project}/{zone}/{name}"


def parse_provider_id(value: str) -> tuple[str, str, str]:
    """(project, zone, name) of ``gce://<project>/<zone>/<name>``; anything else is a
    ``ProviderError`` (never ``NotFound``, which fencing would take for "gone")."""
    parts = value[len(PROVIDER_PREFIX) :].split("/") if value.startswith(PROVIDER_PREFIX) else []
    if len(parts) != 3 or not all(parts):
        raise ProviderError(
            f"providerID {value!r} is not a GCE instance (want gce://<project>/<zone>/<name>)",
            reason="ProviderInvalidID",
        )
    return parts[0], parts[1], parts[2]


@dataclass(frozen=True)
class GroupRef:
    project: str
    scope: str  # "zones" or "regions"
    location: str
    name: str

    @classmethod
    def parse(cls, group_id: str) -> GroupRef:
        match = MIG_GROUP.search(group_id)
        if match is None:
            raise ProviderError(
                f"group id {group_id!r} is not a managed instance group "
                "(want projects/<p>/zones|regions/<where>/instanceGroupManagers/<name>)",
                reason="ProviderInvalidID",
            )
        return cls(*match.groups())

    @property
    def regional(self) -> bool:
        return self.scope == "regions"

    @property
    def group_id(self) -> str:
        return f"projects/{self.project}/{self.scope}/{self.location}/instanceGroupManagers/{self.name}"


@dataclass(frozen=True)
class TemplateRef:
    """An instance template: global (``projects/<p>/global/instanceTemplates/<n>``) or
    regional (``projects/<p>/regions/<r>/instanceTemplates/<n>``, usable by the groups of
    its region only, so its clone is made in the same region)."""

    project: str
    region: str | None
    name: str

    @classmethod
    def parse(cls, url: str) -> TemplateRef:
        match = TEMPLATE.search(relative(url))
        if match is None:
            raise ProviderError(
                f"instance template {url!r} is neither global nor regional "
                "(want projects/<p>/global|regions/<r>/instanceTemplates/<name>)",
                reason="ProviderUnsupportedGroup",
            )
        project, region, name = match.groups()
        return cls(project, region, name)

    @property
    def path(self) -> str:
        where = f"regions/{self.region}" if self.region else "global"
        return f"projects/{self.project}/{where}/instanceTemplates/{self.name}"


def _reasons(err: gexc.GoogleAPICallError) -> set[str]:
    found = {str(e.get("reason", "")) for e in (err.errors or []) if isinstance(e, Mapping)}
    if err.reason:
        found.add(err.reason)
    return found


def _retry_after(err: gexc.GoogleAPICallError) -> float:
    response = getattr(err, "response", None)
    value = response.headers.get("Retry-After") if response is not None else None
    try:
        return max(float(value), 0.0) if value is not None else THROTTLE_RETRY_AFTER
    except ValueError:
        return THROTTLE_RETRY_AFTER


def map_error(err: Exception, action: str) -> ProviderError:
    """A failed GCE call as one of the typed errors of ``runtime.cloud``."""
    if isinstance(err, gexc.GoogleAPICallError):
        reasons = _reasons(err)
        text = f"GCP {action}: {err.code} {err.message} ({', '.join(sorted(reasons)) or 'no reason'})"
        if isinstance(err, gexc.TooManyRequests) or reasons & THROTTLING_REASONS:
            return Throttled(text, retry_after=_retry_after(err))
        if reasons & CAPACITY_REASONS:
            return CapacityError(text)
        if isinstance(err, gexc.NotFound):
            return NotFound(text)
        if isinstance(err, gexc.Unauthorized):
            return ProviderError(
                f"{text}: the Compute API refused the credential ({CREDENTIAL_SOURCES}; "
                "docs/nodeimage-gcp.md)",
                reason="ProviderCredentials",
            )
        if isinstance(err, gexc.Forbidden):
            return ProviderError(
                f"{text} (docs/nodeimage-gcp.md lists the permissions kustos needs)",
                reason="ProviderAccessDenied",
            )
        return ProviderError(text)
    if isinstance(err, gauth_exceptions.DefaultCredentialsError):
        return ProviderError(
            f"GCP {action}: no usable credentials ({err}); kustos uses {CREDENTIAL_SOURCES}",
            reason="ProviderCredentials",
        )
    if isinstance(err, gauth_exceptions.GoogleAuthError):
        return ProviderError(
            f"GCP {action}: the credential could not get a token ({err}); kustos uses {CREDENTIAL_SOURCES}",
            reason="ProviderCredentials",
        )
    return ProviderError(f"GCP {action}: {type(err).__name__}: {err}", reason="ProviderUnreachable")


def operation_error(operation: compute_v1.Operation, action: str) -> ProviderError | None:
    """The error of a finished operation, typed; None when it succeeded."""
    errors = list(operation.error.errors) if operation.error else []
    if not errors and not operation.http_error_status_code:
        return None
    codes = {e.code for e in errors}
    detail = "; ".join(f"{e.code}: {e.message}" for e in errors) or operation.http_error_message
    text = f"GCP {action}: operation {operation.name} failed: {detail}"
    if codes & THROTTLING_REASONS or operation.http_error_status_code == 429:
        return Throttled(text, retry_after=THROTTLE_RETRY_AFTER)
    if codes & CAPACITY_REASONS:
        return CapacityError(text)
    return ProviderError(text)


@dataclass(frozen=True)
class GcpOptions:
    """``--cloud-option`` values (dashes or underscores in the keys)."""

    project: str
    endpoint: str | None = None
    role_label: str = ROLE_LABEL
    cluster: str | None = None
    cache_seconds: float = DEFAULT_CACHE_SECONDS

    KEYS = ("project", "endpoint", "role_label", "cluster", "cache_seconds")

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> GcpOptions:
        """``project`` (required), ``endpoint`` (another Compute API root, e.g. a local one),
        ``role-label``, ``cluster`` (only templates labelled ``kustos-cluster=<cluster>``),
        ``cache-seconds`` (default 2; 0 turns the read cache off)."""
        values = {key.replace("-", "_"): value for key, value in options.items()}
        unknown = sorted(set(values) - set(cls.KEYS))
        if unknown:
            allowed = ", ".join(k.replace("_", "-") for k in cls.KEYS)
            raise ValueError(f"unknown GCP cloud option(s) {', '.join(unknown)}; known: {allowed}")
        for key, value in values.items():
            if not value:
                raise ValueError(f"GCP cloud option {key.replace('_', '-')} is empty")
        if "project" not in values:
            raise ValueError("GCP cloud provider: give --cloud-option project=<project id>")
        try:
            cache_seconds = float(values.get("cache_seconds", DEFAULT_CACHE_SECONDS))
        except ValueError:
            raise ValueError(
                f"GCP cloud option cache-seconds: {values['cache_seconds']!r} is no number"
            ) from None
        if not 0 <= cache_seconds <= 60:
            raise ValueError(f"GCP cloud option cache-seconds: {cache_seconds} is not within 0..60")
        return cls(
            project=values["project"],
            endpoint=values.get("endpoint"),
            role_label=values.get("role_label", ROLE_LABEL),
            cluster=values.get("cluster"),
            cache_seconds=cache_seconds,
        )


@dataclass
class GcpClients:
    """The Compute API clients the provider uses, all on one endpoint and credentials."""

    zonal: compute_v1.InstanceGroupManagersClient
    regional: compute_v1.RegionInstanceGroupManagersClient
    templates: compute_v1.InstanceTemplatesClient
    region_templates: compute_v1.RegionInstanceTemplatesClient
    instances: compute_v1.InstancesClient
    zone_operations: compute_v1.ZoneOperationsClient
    region_operations: compute_v1.RegionOperationsClient
    global_operations: compute_v1.GlobalOperationsClient

    @classmethod
    def create(cls, endpoint: str | None) -> GcpClients:
        """Credentials: google-auth's Application Default Credentials (``google.auth.default``,
        as each client would find them; docs/nodeimage-gcp.md), found once and shared, so
        one token serves every client."""
        load_sdk()
        import google.auth
        from google.api_core.client_options import ClientOptions
        from google.cloud.compute_v1.services.instances.transports.base import InstancesTransport

        credentials, _ = google.auth.default(default_scopes=InstancesTransport.AUTH_SCOPES)
        kwargs: dict[str, Any] = {"transport": "rest", "credentials": credentials}
        if endpoint:
            kwargs["client_options"] = ClientOptions(api_endpoint=endpoint)
        return cls(
            zonal=compute_v1.InstanceGroupManagersClient(**kwargs),
            regional=compute_v1.RegionInstanceGroupManagersClient(**kwargs),
            templates=compute_v1.InstanceTemplatesClient(**kwargs),
            region_templates=compute_v1.RegionInstanceTemplatesClient(**kwargs),
            instances=compute_v1.InstancesClient(**kwargs),
            zone_operations=compute_v1.ZoneOperationsClient(**kwargs),
            region_operations=compute_v1.RegionOperationsClient(**kwargs),
            global_operations=compute_v1.GlobalOperationsClient(**kwargs),
        )


def template_image(template: compute_v1.InstanceTemplate) -> str | None:
    """The boot disk's source image, as ``projects/<p>/global/images/<name>``."""
    disks = list(template.properties.disks)
    boot = next((d for d in disks if d.boot), disks[0] if disks else None)
    if boot is None or not boot.initialize_params.source_image:
        return None
    return relative(boot.initialize_params.source_image)


def template_name_for(source: str, image: str) -> str:
    """The name of the template cloned from ``source`` with ``image``: derived from both (a
    retried ``set_image`` finds the template the first call made), at most 63 characters."""
    base = TEMPLATE_SUFFIX.sub("", last(source))[:50]
    digest = hashlib.sha256(f"{relative(source)}\0{image}".encode()).hexdigest()[:10]
    return f"{base}-k{digest}"


class GcpProvider:
    """``runtime.cloud.CloudProvider`` for managed instance groups with instance templates."""

    name = NAME

    def __init__(
        self, clients: GcpClients | None, options: GcpOptions, monotonic: Callable[[], float] = time.monotonic
    ) -> None:
        self._clients = clients  # made at the first call (``load_sdk``)
        self._loading = asyncio.Lock()
        self.options = options
        self._monotonic = monotonic
        self._cache = LookupCache(options.cache_seconds, monotonic)
        # Instance templates are immutable: a template's image is read once.
        self._template_images: dict[str, str | None] = {}
        self._skipped: set[str] = set()

    @classmethod
    def from_options(cls, options: Mapping[str, str]) -> GcpProvider:
        """A provider from ``--cloud-option`` values; credentials from Application Default
        Credentials (GOOGLE_APPLICATION_CREDENTIALS, GKE workload identity, the metadata server)."""
        return cls(None, GcpOptions.parse(options))

    # -- the CloudProvider interface -------------------------------------------------------

    async def groups(self) -> Sequence[Group]:
        cached: Sequence[Group] | None = self._cache.get(("groups",))
        if cached is not None:
            return cached
        managers = await self._run(
            "instanceGroupManagers.aggregatedList",
            lambda: [
                manager
                for _, scoped in self.clients.zonal.aggregated_list(
                    project=self.options.project, timeout=CALL_TIMEOUT
                )
                for manager in scoped.instance_group_managers
            ],
        )
        found = await asyncio.gather(*(self._group(m) for m in managers))
        return self._cache.put(("groups",), tuple(g for g in found if g is not None))

    async def instances(self, group_id: str) -> Sequence[Instance]:
        cached: Sequence[Instance] | None = self._cache.get(("instances", group_id))
        if cached is not None:
            return cached
        ref = GroupRef.parse(group_id)
        members = await self._managed_instances(ref)
        result = []
        for member in members:
            template = member.version.instance_template if member.version else ""
            result.append(
                Instance(
                    provider_id=self._member_provider_id(member),
                    group_id=ref.group_id,
                    state=_member_state(member),
                    node_name=last(member.instance),
                    image=await self._template_image(template) if template else None,
                )
            )
        return self._cache.put(("instances", group_id), tuple(result))

    async def instance(self, provider_id: str) -> Instance:
        """One instances.get: node maintenance asks this for every dead node."""
        project, zone, name = self._parse_here(provider_id)
        raw = await self._run(
            "instances.get",
            lambda: self.clients.instances.get(
                project=project, zone=zone, instance=name, timeout=CALL_TIMEOUT
            ),
        )
        metadata = {item.key: item.value for item in raw.metadata.items} if raw.metadata else {}
        template = metadata.get(TEMPLATE_KEY, "")
        creator = metadata.get(CREATED_BY_KEY, "")
        return Instance(
            provider_id=provider_id,
            group_id=GroupRef.parse(creator).group_id if MIG_GROUP.search(creator) else "",
            state=GCE_STATES.get(raw.status, InstanceState.UNKNOWN),
            node_name=raw.name,
            image=await self._template_image(template) if template else None,
        )

    async def set_image(self, group_id: str, image: str) -> None:
        try:
            await self._set_image(GroupRef.parse(group_id), relative(image))
        finally:
            self._cache.clear()

    async def create_instance(self, group_id: str) -> None:
        try:
            await self._create_instance(GroupRef.parse(group_id))
        finally:
            self._cache.clear()

    async def delete_instance(self, group_id: str, provider_id: str) -> None:
        try:
            await self._delete_instance(GroupRef.parse(group_id), provider_id)
        finally:
            self._cache.clear()

    async def cancel_create(self, group_id: str) -> bool:
        """Take back a creation the group has not listed: the target size goes down by one
        (a MIG resized down drops instances not yet created first). False when none was."""
        ref = GroupRef.parse(group_id)
        try:
            manager = await self._manager(ref)
            live = [m for m in await self._managed_instances(ref) if m.current_action not in LEAVING_ACTIONS]
            if manager.target_size <= len(live):
                return False
            await self._resize(ref, manager.target_size - 1)
            log.info("group %s: creation cancelled, target size %d", ref.group_id, manager.target_size - 1)
            return True
        finally:
            self._cache.clear()

    # -- the steps -------------------------------------------------------------------------

    async def _set_image(self, ref: GroupRef, image: str) -> None:
        manager = await self._manager(ref)
        source = manager.instance_template
        if not source:
            raise ProviderError(
                f"GCP group {ref.group_id} has no instance template", reason="ProviderUnsupportedGroup"
            )
        if await self._template_image(source) == image:
            return
        template = await self._template(source)
        name = template_name_for(source, image)
        clone = compute_v1.InstanceTemplate()
        clone.name = name
        clone.description = f"kustos: {last(source)} with image {image}"
        clone.properties = template.properties
        disks = list(clone.properties.disks)
        boot = next((d for d in disks if d.boot), disks[0])
        boot.initialize_params.source_image = image
        clone.properties.disks = disks
        where = TemplateRef.parse(source)
        target = TemplateRef(where.project, where.region, name)
        try:
            await self._insert_template(target, clone)
        except ProviderError as err:
            # The same name again (a retry after a lost answer): the template exists already.
            if not isinstance(err.__cause__, gexc.Conflict):
                raise
        target_url = target.path
        request = compute_v1.InstanceGroupManagersSetInstanceTemplateRequest(instance_template=target_url)
        if ref.regional:
            regional_request = compute_v1.RegionInstanceGroupManagersSetTemplateRequest(
                instance_template=target_url
            )
            operation = await self._run(
                "regionInstanceGroupManagers.setInstanceTemplate",
                lambda: self.clients.regional.set_instance_template_unary(
                    project=ref.project, region=ref.location, instance_group_manager=ref.name,
                    region_instance_group_managers_set_template_request_resource=regional_request,
                    timeout=CALL_TIMEOUT,
                ),
            )  # fmt: skip
        else:
            operation = await self._run(
                "instanceGroupManagers.setInstanceTemplate",
                lambda: self.clients.zonal.set_instance_template_unary(
                    project=ref.project, zone=ref.location, instance_group_manager=ref.name,
                    instance_group_managers_set_instance_template_request_resource=request,
                    timeout=CALL_TIMEOUT,
                ),
            )  # fmt: skip
        await self._wait(operation, "setInstanceTemplate", ref.project, ref.scope, ref.location)
        log.info("group %s: instance template %s (image %s)", ref.group_id, name, image)

    async def _create_instance(self, ref: GroupRef) -> None:
        manager = await self._manager(ref)
        members = await self._managed_instances(ref)
        live = [m for m in members if m.current_action not in LEAVING_ACTIONS]
        failing = [m for m in live if m.current_action == "CREATING" and _attempt_errors(m)]
        if failing:
            # The MIG keeps retrying a creation that fails (quota, no resources in the zone);
            # one more would fail the same way.
            errors = _attempt_errors(failing[0])
            text = f"GCP group {ref.group_id}: creating {last(failing[0].instance)} fails: " + "; ".join(
                f"{code}: {message}" for code, message in errors
            )
            if {code for code, _ in errors} & CAPACITY_REASONS:
                raise CapacityError(text)
            raise ProviderError(text, reason="ProviderLaunchFailed")
        if manager.target_size > len(live):
            # Asked for but not listed yet: whoever asks now cannot tell it from their own, so
            # no second resize until it shows up (a CreateHeir retried on a stale read).
            raise ProviderError(
                f"GCP group {ref.group_id}: a creation is outstanding ({len(live)} instance(s) "
                f"listed, target size {manager.target_size}); asking for another once it shows up",
                reason="ProviderLaunchOutstanding",
            )
        size = manager.target_size + 1
        await self._resize(ref, size)
        log.info("group %s: target size %d -> %d", ref.group_id, size - 1, size)

    async def _resize(self, ref: GroupRef, size: int) -> None:
        if ref.regional:
            operation = await self._run(
                "regionInstanceGroupManagers.resize",
                lambda: self.clients.regional.resize_unary(
                    project=ref.project, region=ref.location, instance_group_manager=ref.name, size=size,
                    timeout=CALL_TIMEOUT,
                ),
            )  # fmt: skip
        else:
            operation = await self._run(
                "instanceGroupManagers.resize",
                lambda: self.clients.zonal.resize_unary(
                    project=ref.project, zone=ref.location, instance_group_manager=ref.name, size=size,
                    timeout=CALL_TIMEOUT,
                ),
            )  # fmt: skip
        await self._wait(operation, "resize", ref.project, ref.scope, ref.location)

    async def _delete_instance(self, ref: GroupRef, provider_id: str) -> None:
        project, zone, name = self._parse_here(provider_id)
        members = await self._managed_instances(ref)
        member = next((m for m in members if self._member_provider_id(m) == provider_id), None)
        if member is None:
            # Not the group's: gone (instance() raises NotFound), or another group's (refused).
            other = await self.instance(provider_id)
            raise ProviderError(
                f"GCP instance {name} belongs to {other.group_id or 'no managed group'}, not "
                f"{ref.group_id}: not deleting it",
                reason="ProviderWrongGroup",
            )
        if member.current_action in LEAVING_ACTIONS:
            return  # an earlier call whose answer was lost: deleting again shrinks nothing
        url = f"projects/{project}/zones/{zone}/instances/{name}"
        if ref.regional:
            regional_request = compute_v1.RegionInstanceGroupManagersDeleteInstancesRequest(instances=[url])
            operation = await self._run(
                "regionInstanceGroupManagers.deleteInstances",
                lambda: self.clients.regional.delete_instances_unary(
                    project=ref.project, region=ref.location, instance_group_manager=ref.name,
                    region_instance_group_managers_delete_instances_request_resource=regional_request,
                    timeout=CALL_TIMEOUT,
                ),
            )  # fmt: skip
        else:
            request = compute_v1.InstanceGroupManagersDeleteInstancesRequest(instances=[url])
            operation = await self._run(
                "instanceGroupManagers.deleteInstances",
                lambda: self.clients.zonal.delete_instances_unary(
                    project=ref.project, zone=ref.location, instance_group_manager=ref.name,
                    instance_group_managers_delete_instances_request_resource=request,
                    timeout=CALL_TIMEOUT,
                ),
            )  # fmt: skip
        await self._wait(operation, "deleteInstances", ref.project, ref.scope, ref.location)
        log.info("group %s: deleting %s", ref.group_id, name)

    # -- helpers ---------------------------------------------------------------------------

    def _parse_here(self, provider_id: str) -> tuple[str, str, str]:
        """A providerID of this project; another project's is refused (the client could not
        see it, and a NotFound would read as "gone")."""
        project, zone, name = parse_provider_id(provider_id)
        if project != self.options.project:
            raise ProviderError(
                f"providerID {provider_id!r} names project {project!r}, not {self.options.project!r}: "
                "kustos does not manage it",
                reason="ProviderOtherProject",
            )
        return project, zone, name

    def _member_provider_id(self, member: compute_v1.ManagedInstance) -> str:
        # .../projects/<p>/zones/<z>/instances/<name>
        parts = relative(member.instance).split("/")
        return provider_id(parts[1], parts[3], parts[5]) if len(parts) >= 6 else member.instance

    async def _group(self, manager: compute_v1.InstanceGroupManager) -> Group | None:
        group_id = relative(manager.self_link)
        if not MIG_GROUP.search(group_id) or not manager.instance_template:
            return None
        template = await self._template(manager.instance_template)
        labels = dict(template.properties.labels)
        if self.options.cluster and labels.get(CLUSTER_LABEL) != self.options.cluster:
            return None
        role = parse_role(labels.get(self.options.role_label, ""))
        if role is None:
            return None
        image = template_image(template)
        if image is None:
            self._skip(group_id, "its instance template has no boot disk image")
            return None
        return Group(
            group_id=GroupRef.parse(group_id).group_id,
            role=role,
            image=image,
            # A MIG has no bounds of its own (an autoscaler attached to it has; kustos pauses it).
            min_size=0,
            max_size=1000,
            desired=manager.target_size,
        )

    def _skip(self, group_id: str, why: str) -> None:
        if group_id not in self._skipped:
            self._skipped.add(group_id)
            log.warning("GCP group %s is not managed: %s", group_id, why)

    async def _manager(self, ref: GroupRef) -> compute_v1.InstanceGroupManager:
        if ref.regional:
            return await self._run(
                "regionInstanceGroupManagers.get",
                lambda: self.clients.regional.get(
                    project=ref.project, region=ref.location, instance_group_manager=ref.name,
                    timeout=CALL_TIMEOUT,
                ),
            )  # fmt: skip
        return await self._run(
            "instanceGroupManagers.get",
            lambda: self.clients.zonal.get(
                project=ref.project, zone=ref.location, instance_group_manager=ref.name, timeout=CALL_TIMEOUT
            ),
        )

    async def _managed_instances(self, ref: GroupRef) -> list[compute_v1.ManagedInstance]:
        if ref.regional:
            return await self._run(
                "regionInstanceGroupManagers.listManagedInstances",
                lambda: list(
                    self.clients.regional.list_managed_instances(
                        project=ref.project, region=ref.location, instance_group_manager=ref.name,
                        timeout=CALL_TIMEOUT,
                    )
                ),
            )  # fmt: skip
        return await self._run(
            "instanceGroupManagers.listManagedInstances",
            lambda: list(
                self.clients.zonal.list_managed_instances(
                    project=ref.project, zone=ref.location, instance_group_manager=ref.name,
                    timeout=CALL_TIMEOUT,
                )
            ),
        )  # fmt: skip

    async def _template(self, url: str) -> compute_v1.InstanceTemplate:
        ref = TemplateRef.parse(url)
        if ref.region:
            return await self._run(
                "regionInstanceTemplates.get",
                lambda: self.clients.region_templates.get(
                    project=ref.project, region=ref.region, instance_template=ref.name, timeout=CALL_TIMEOUT
                ),
            )
        return await self._run(
            "instanceTemplates.get",
            lambda: self.clients.templates.get(
                project=ref.project, instance_template=ref.name, timeout=CALL_TIMEOUT
            ),
        )

    async def _insert_template(self, ref: TemplateRef, template: compute_v1.InstanceTemplate) -> None:
        """Make ``template`` where ``ref`` says (global, or in its region) and wait for it."""
        if ref.region:
            operation = await self._run(
                "regionInstanceTemplates.insert",
                lambda: self.clients.region_templates.insert_unary(
                    project=ref.project, region=ref.region, instance_template_resource=template,
                    timeout=CALL_TIMEOUT,
                ),
            )  # fmt: skip
            await self._wait(operation, "regionInstanceTemplates.insert", ref.project, "regions", ref.region)
            return
        operation = await self._run(
            "instanceTemplates.insert",
            lambda: self.clients.templates.insert_unary(
                project=ref.project, instance_template_resource=template, timeout=CALL_TIMEOUT
            ),
        )
        await self._wait(operation, "instanceTemplates.insert", ref.project, "global", "")

    async def _template_image(self, url: str) -> str | None:
        key = relative(url)
        if key not in self._template_images:
            self._template_images[key] = template_image(await self._template(key))
        return self._template_images[key]

    async def _wait(
        self, operation: compute_v1.Operation, action: str, project: str, scope: str, location: str
    ) -> None:
        """Poll ``operation`` until it is DONE; its error, typed."""
        deadline = self._monotonic() + OPERATION_TIMEOUT
        delay = 0.1
        while operation.status != compute_v1.Operation.Status.DONE:
            if self._monotonic() >= deadline:
                raise ProviderError(
                    f"GCP {action}: operation {operation.name} not done after {OPERATION_TIMEOUT:.0f}s",
                    reason="ProviderTimeout",
                )
            await asyncio.sleep(delay)
            delay = min(delay * 2, 2.0)
            operation = await self._poll(operation.name, project, scope, location)
        failure = operation_error(operation, action)
        if failure is not None:
            raise failure

    async def _poll(self, name: str, project: str, scope: str, location: str) -> compute_v1.Operation:
        """The operation ``name`` as its scope's operations API has it now."""
        if scope == "zones":
            return await self._run(
                "zoneOperations.get",
                lambda: self.clients.zone_operations.get(
                    project=project, zone=location, operation=name, timeout=CALL_TIMEOUT
                ),
            )
        if scope == "regions":
            return await self._run(
                "regionOperations.get",
                lambda: self.clients.region_operations.get(
                    project=project, region=location, operation=name, timeout=CALL_TIMEOUT
                ),
            )
        return await self._run(
            "globalOperations.get",
            lambda: self.clients.global_operations.get(project=project, operation=name, timeout=CALL_TIMEOUT),
        )

    @property
    def clients(self) -> GcpClients:
        assert self._clients is not None, "GcpProvider._run makes the clients first"
        return self._clients

    async def _run(self, action: str, call: Callable[[], T]) -> T:
        """``call`` in a worker thread (the client blocks), its failure as a typed error."""
        if self._clients is None:
            async with self._loading:
                if self._clients is None:
                    options = self.options
                    try:
                        self._clients = await asyncio.to_thread(GcpClients.create, options.endpoint)
                    except Exception as err:
                        raise map_error(err, "creating the Compute API clients") from err
        try:
            return await asyncio.to_thread(call)
        except (gexc.GoogleAPICallError, gauth_exceptions.GoogleAuthError, OSError) as err:
            raise map_error(err, action) from err
        except gexc.RetryError as err:
            raise map_error(err.cause or err, action) from err


def _member_state(member: compute_v1.ManagedInstance) -> InstanceState:
    if member.current_action in LEAVING_ACTIONS:
        return InstanceState.STOPPING
    if not member.instance_status:
        return InstanceState.PENDING
    return GCE_STATES.get(member.instance_status, InstanceState.UNKNOWN)


def _attempt_errors(member: compute_v1.ManagedInstance) -> list[tuple[str, str]]:
    last_attempt = member.last_attempt
    if not last_attempt or not last_attempt.errors:
        return []
    return [(e.code, e.message) for e in last_attempt.errors.errors]


__all__ = [
    "NAME", "GcpClients", "GcpOptions", "GcpProvider", "GroupRef", "map_error", "parse_provider_id",
    "provider_id", "template_image", "template_name_for",
]  # fmt: skip
