"""A local fake of the part of GCP's Compute API the GCP provider uses (dev tool, F-NODE-6).

Managed instance groups (zonal and regional), global instance templates, instances and
operations, served as JSON over HTTP on loopback with the URIs and field names of
``compute/v1`` (each route is one of the SDK's own URI templates; a unit test checks that).
The provider reaches it through ``google-cloud-compute``'s REST transport with the
``endpoint`` option; nothing in kustos is faked.

Behaviour that matters to the provider and is kept as GCE has it: a resize lists the new
instance at once (``CREATING``, no status yet) and it runs ``boot_seconds`` later; a
deleted instance is ``DELETING`` (``STOPPING``) for ``delete_seconds`` and then gone, and
the target size shrinks at once; ``TERMINATED`` is a stopped instance; operations are
``RUNNING`` when answered and ``DONE`` when polled; ``quota_exhausted`` makes creations
fail as GCE does (the instance stays ``CREATING`` with the error in ``lastAttempt``).
Faults (``FakeApi.fail``) answer one method's next calls with an error.
"""

from __future__ import annotations

import copy
import itertools
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kustos.devcluster.fakeapi import ApiError, FakeApi, Reply, Route

ROOT = "https://compute.googleapis.com/compute/v1/"
V1 = "/compute/v1/projects/{project}"


def not_found(what: str) -> ApiError:
    return ApiError(
        404,
        {"error": {"code": 404, "message": f"The resource '{what}' was not found",
                   "errors": [{"reason": "notFound", "domain": "global", "message": f"{what} not found"}]}},
    )  # fmt: skip


def gce_error(status: int, reason: str, message: str) -> dict[str, Any]:
    """A Compute API error body, as ``google.api_core`` parses it."""
    errors = [{"reason": reason, "domain": "usageLimits", "message": message}]
    return {"error": {"code": status, "message": message, "errors": errors}}


@dataclass
class FakeInstance:
    name: str
    zone: str
    group: str  # the MIG's relative URL
    template: str  # relative URL
    created: float
    status: str = ""  # "" while CREATING
    action: str = "CREATING"
    gone_at: float | None = None
    errors: list[tuple[str, str]] = field(default_factory=list)


@dataclass
class FakeManager:
    scope: str  # zones | regions
    location: str
    name: str
    template: str  # relative URL
    target_size: int
    base_name: str

    @property
    def path(self) -> str:
        return f"{self.scope}/{self.location}/instanceGroupManagers/{self.name}"


class GcpFake:
    """The fake's state for one project, and its routes."""

    def __init__(
        self, project: str = "kustos-test", *, boot_seconds: float = 0.3, delete_seconds: float = 0.3,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:  # fmt: skip
        self.project = project
        self.boot_seconds = boot_seconds
        self.delete_seconds = delete_seconds
        self.clock = clock
        self.templates: dict[str, dict[str, Any]] = {}
        self.managers: dict[str, FakeManager] = {}
        self.instances: dict[tuple[str, str], FakeInstance] = {}
        self.operations: dict[str, dict[str, Any]] = {}
        self.quota_exhausted = False
        # While set, a resize raises the target size but lists no instance (a creation
        # outstanding, as GCE has it for a moment); ``release`` lists them.
        self.hold_creations = False
        self._held: list[FakeManager] = []
        self.resizes: list[tuple[str, int]] = []  # (group id, size) of every resize asked for
        self._ids = itertools.count(1000)
        self.api = FakeApi(self._routes())

    # -- for tests: the world as a user made it ----------------------------------------------

    def rel(self, path: str) -> str:
        return f"projects/{self.project}/{path}"

    def add_template(self, name: str, image: str, labels: dict[str, str]) -> str:
        with self.api.lock:
            self.templates[name] = {
                "name": name, "id": str(next(self._ids)), "kind": "compute#instanceTemplate",
                "selfLink": ROOT + self.rel(f"global/instanceTemplates/{name}"),
                "properties": {
                    "machineType": "e2-standard-4", "labels": labels,
                    "disks": [{"boot": True, "autoDelete": True, "type": "PERSISTENT",
                               "initializeParams": {"sourceImage": ROOT + image}}],
                    "networkInterfaces": [{"network": ROOT + self.rel("global/networks/default")}],
                },
            }  # fmt: skip
        return self.rel(f"global/instanceTemplates/{name}")

    def add_group(
        self, name: str, role: str, image: str, size: int, *, region: str | None = None,
        zone: str = "us-central1-a", labels: dict[str, str] | None = None,
    ) -> str:  # fmt: skip
        """A MIG (regional when ``region`` is given) with ``size`` running instances; its id."""
        template = self.add_template(f"{name}-tpl", image, {"kustos-role": role, **(labels or {})})
        scope, location = ("regions", region) if region else ("zones", zone)
        manager = FakeManager(scope, location, name, template, 0, name)
        with self.api.lock:
            self.managers[manager.path] = manager
            for _ in range(size):
                instance = self._create(manager)
                assert instance is not None, "add groups before holding creations"
                instance.status, instance.action = "RUNNING", "NONE"
        return self.rel(manager.path)

    def stop(self, zone: str, name: str) -> None:
        """The instance stops (GCE: TERMINATED), as a user's ``gcloud compute instances stop``."""
        with self.api.lock:
            self.instances[(zone, name)].status = "TERMINATED"

    def group(self, group_id: str) -> FakeManager:
        return self.managers[group_id.split(f"projects/{self.project}/", 1)[1]]

    def members(self, group_id: str) -> list[FakeInstance]:
        with self.api.lock:
            self._advance()
            path = group_id if group_id.startswith("projects/") else self.rel(group_id)
            return [i for i in self.instances.values() if i.group == path]

    def image_of(self, template: str) -> str:
        disks = self.templates[template.rpartition("/")[2]]["properties"]["disks"]
        return str(disks[0]["initializeParams"]["sourceImage"]).split("/compute/v1/", 1)[-1]

    # -- the simulation ---------------------------------------------------------------------

    def _zones(self, manager: FakeManager) -> list[str]:
        return [manager.location] if manager.scope == "zones" else [f"{manager.location}-{z}" for z in "abc"]

    def release(self) -> None:
        """The held creations show up."""
        with self.api.lock:
            held, self._held = self._held, []
            for manager in held:
                manager.target_size -= 1
                self._create(manager)

    def _create(self, manager: FakeManager) -> FakeInstance | None:
        if self.hold_creations:
            self._held.append(manager)
            manager.target_size += 1
            return None
        zones = self._zones(manager)
        members = [i for i in self.instances.values() if i.group == self.rel(manager.path)]
        zone = zones[len(members) % len(zones)]
        name = f"{manager.base_name}-{secrets.token_hex(2)}"
        instance = FakeInstance(name, zone, self.rel(manager.path), manager.template, self.clock())
        if self.quota_exhausted:
            instance.errors = [("QUOTA_EXCEEDED", "Quota 'CPUS' exceeded. Limit: 24.0 in region.")]
        self.instances[(zone, name)] = instance
        manager.target_size += 1
        return instance

    def _advance(self) -> None:
        now = self.clock()
        for key, instance in list(self.instances.items()):
            if instance.gone_at is not None and now >= instance.gone_at:
                del self.instances[key]
            elif (
                instance.action == "CREATING"
                and not instance.errors
                and now >= instance.created + self.boot_seconds
            ):
                instance.status, instance.action = "RUNNING", "NONE"

    def _operation(self, kind: str, target: str, scope: str = "global") -> dict[str, Any]:
        name = f"operation-{next(self._ids)}-{secrets.token_hex(4)}"
        where = {"zone": ROOT + self.rel(scope)} if scope.startswith("zones/") else (
            {"region": ROOT + self.rel(scope)} if scope.startswith("regions/") else {})  # fmt: skip
        operation = {
            "kind": "compute#operation", "id": str(next(self._ids)), "name": name, "operationType": kind,
            "status": "RUNNING", "targetLink": ROOT + target, "progress": 0,
            "selfLink": ROOT + self.rel(f"{scope}/operations/{name}"), **where,
        }  # fmt: skip
        self.operations[name] = operation
        return copy.deepcopy(operation)

    # -- the API ----------------------------------------------------------------------------

    def _routes(self) -> list[Route]:
        igm = "/instanceGroupManagers/{instance_group_manager}"
        routes = [
            Route("get", V1 + "/aggregated/instanceGroupManagers", "instanceGroupManagers.aggregatedList",
                  self._aggregated)
        ]  # fmt: skip
        for scope, param in (("zones", "zone"), ("regions", "region")):
            prefix = V1 + f"/{scope}/{{{param}}}" + igm
            api = "instanceGroupManagers" if scope == "zones" else "regionInstanceGroupManagers"
            routes += [
                Route("get", prefix, f"{api}.get", self._scoped(scope, param, self._get_manager)),
                Route("post", prefix + "/listManagedInstances", f"{api}.listManagedInstances",
                      self._scoped(scope, param, self._list_managed)),
                Route("post", prefix + "/resize", f"{api}.resize", self._scoped(scope, param, self._resize)),
                Route("post", prefix + "/deleteInstances", f"{api}.deleteInstances",
                      self._scoped(scope, param, self._delete_instances)),
                Route("post", prefix + "/setInstanceTemplate", f"{api}.setInstanceTemplate",
                      self._scoped(scope, param, self._set_template)),
                Route("get", V1 + f"/{scope}/{{{param}}}/operations/{{operation}}",
                      "zoneOperations.get" if scope == "zones" else "regionOperations.get",
                      self._get_operation),
            ]  # fmt: skip
        routes += [
            Route("get", V1 + "/global/instanceTemplates/{instance_template}", "instanceTemplates.get",
                  self._get_template),
            Route("post", V1 + "/global/instanceTemplates", "instanceTemplates.insert",
                  self._insert_template),
            Route("get", V1 + "/global/operations/{operation}", "globalOperations.get", self._get_operation),
            Route("get", V1 + "/zones/{zone}/instances/{instance}", "instances.get", self._get_instance),
        ]  # fmt: skip
        return routes

    def _project(self, params: dict[str, str]) -> None:
        if params["project"] != self.project:
            raise ApiError(403, gce_error(403, "forbidden", f"no access to project {params['project']}"))

    def _scoped(
        self, scope: str, param: str, handler: Callable[[FakeManager, dict[str, list[str]], Any], Reply]
    ) -> Callable[[dict[str, str], dict[str, list[str]], Any], Reply]:
        def run(params: dict[str, str], query: dict[str, list[str]], body: Any) -> Reply:
            self._project(params)
            self._advance()
            path = f"{scope}/{params[param]}/instanceGroupManagers/{params['instance_group_manager']}"
            manager = self.managers.get(path)
            if manager is None:
                raise not_found(self.rel(path))
            return handler(manager, query, body)

        return run

    def _manager_json(self, m: FakeManager) -> dict[str, Any]:
        where = {"zone": ROOT + self.rel(f"zones/{m.location}")} if m.scope == "zones" else {
            "region": ROOT + self.rel(f"regions/{m.location}")}  # fmt: skip
        return {
            "kind": "compute#instanceGroupManager", "name": m.name, "id": str(abs(hash(m.path)) % 10**12),
            "selfLink": ROOT + self.rel(m.path), "instanceTemplate": ROOT + m.template,
            "versions": [{"instanceTemplate": ROOT + m.template}], "targetSize": m.target_size,
            "baseInstanceName": m.base_name, **where,
        }  # fmt: skip

    def _aggregated(self, params: dict[str, str], query: dict[str, list[str]], body: Any) -> Reply:
        self._project(params)
        items: dict[str, dict[str, Any]] = {}
        for m in self.managers.values():
            items.setdefault(f"{m.scope}/{m.location}", {"instanceGroupManagers": []})[
                "instanceGroupManagers"
            ].append(self._manager_json(m))
        return Reply(200, {"kind": "compute#instanceGroupManagerAggregatedList", "items": items})

    def _get_manager(self, m: FakeManager, query: dict[str, list[str]], body: Any) -> Reply:
        return Reply(200, self._manager_json(m))

    def _list_managed(self, m: FakeManager, query: dict[str, list[str]], body: Any) -> Reply:
        listed = []
        for i in self.instances.values():
            if i.group != self.rel(m.path):
                continue
            entry: dict[str, Any] = {
                "instance": ROOT + self.rel(f"zones/{i.zone}/instances/{i.name}"), "name": i.name,
                "id": str(abs(hash(i.name)) % 10**12), "currentAction": i.action,
                "version": {"instanceTemplate": ROOT + i.template},
            }  # fmt: skip
            if i.status:
                entry["instanceStatus"] = i.status
            if i.errors:
                entry["lastAttempt"] = {
                    "errors": {"errors": [{"code": c, "message": t} for c, t in i.errors]}
                }
            listed.append(entry)
        return Reply(200, {"managedInstances": listed})

    def _resize(self, m: FakeManager, query: dict[str, list[str]], body: Any) -> Reply:
        size = int(query["size"][0])
        self.resizes.append((self.rel(m.path), size))
        while m.target_size < size:
            self._create(m)
        while m.target_size > size:  # creations not made yet go first, then the newest
            if m in self._held:
                self._held.remove(m)
            else:
                newest = max((i for i in self.instances.values() if i.group == self.rel(m.path)
                              and i.action != "DELETING"), key=lambda i: i.created)  # fmt: skip
                newest.action, newest.status = "DELETING", "STOPPING"
                newest.gone_at = self.clock() + self.delete_seconds
            m.target_size -= 1
        return Reply(200, self._operation("compute.instanceGroupManagers.resize", self.rel(m.path),
                                          f"{m.scope}/{m.location}"))  # fmt: skip

    def _delete_instances(self, m: FakeManager, query: dict[str, list[str]], body: Any) -> Reply:
        for url in (body or {}).get("instances", []):
            parts = url.split("/compute/v1/", 1)[-1].split("/")
            instance = self.instances.get((parts[3], parts[5])) if len(parts) >= 6 else None
            if instance is None or instance.group != self.rel(m.path):
                raise ApiError(400, gce_error(400, "invalid", f"instance {url} is not a member of {m.name}"))
            if instance.action != "DELETING":
                instance.action, instance.status = "DELETING", "STOPPING"
                instance.gone_at = self.clock() + self.delete_seconds
                m.target_size -= 1
        return Reply(200, self._operation("compute.instanceGroupManagers.deleteInstances", self.rel(m.path),
                                          f"{m.scope}/{m.location}"))  # fmt: skip

    def _set_template(self, m: FakeManager, query: dict[str, list[str]], body: Any) -> Reply:
        template = (body or {}).get("instanceTemplate", "").split("/compute/v1/", 1)[-1]
        if template.rpartition("/")[2] not in self.templates:
            raise not_found(template)
        m.template = template
        return Reply(200, self._operation("compute.instanceGroupManagers.setInstanceTemplate",
                                          self.rel(m.path), f"{m.scope}/{m.location}"))  # fmt: skip

    def _get_template(self, params: dict[str, str], query: dict[str, list[str]], body: Any) -> Reply:
        self._project(params)
        template = self.templates.get(params["instance_template"])
        if template is None:
            raise not_found(self.rel(f"global/instanceTemplates/{params['instance_template']}"))
        return Reply(200, copy.deepcopy(template))

    def _insert_template(self, params: dict[str, str], query: dict[str, list[str]], body: Any) -> Reply:
        self._project(params)
        name = str(body["name"])
        if name in self.templates:
            raise ApiError(409, gce_error(409, "alreadyExists", f"The resource '{name}' already exists"))
        template = {**body, "kind": "compute#instanceTemplate", "id": str(next(self._ids)),
                    "selfLink": ROOT + self.rel(f"global/instanceTemplates/{name}")}  # fmt: skip
        self.templates[name] = template
        return Reply(200, self._operation("compute.instanceTemplates.insert",
                                          self.rel(f"global/instanceTemplates/{name}")))  # fmt: skip

    def _get_operation(self, params: dict[str, str], query: dict[str, list[str]], body: Any) -> Reply:
        self._project(params)
        operation = self.operations.get(params["operation"])
        if operation is None:
            raise not_found(params["operation"])
        operation["status"], operation["progress"] = "DONE", 100
        return Reply(200, copy.deepcopy(operation))

    def _get_instance(self, params: dict[str, str], query: dict[str, list[str]], body: Any) -> Reply:
        self._project(params)
        self._advance()
        instance = self.instances.get((params["zone"], params["instance"]))
        if instance is None:
            raise not_found(self.rel(f"zones/{params['zone']}/instances/{params['instance']}"))
        return Reply(200, {
            "kind": "compute#instance", "name": instance.name, "id": str(abs(hash(instance.name)) % 10**12),
            "zone": ROOT + self.rel(f"zones/{instance.zone}"), "status": instance.status or "PROVISIONING",
            "selfLink": ROOT + self.rel(f"zones/{instance.zone}/instances/{instance.name}"),
            "metadata": {"items": [{"key": "created-by", "value": instance.group},
                                   {"key": "instance-template", "value": instance.template}]},
        })  # fmt: skip


__all__ = ["GcpFake", "gce_error"]
