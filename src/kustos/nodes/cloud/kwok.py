"""The kwok cloud provider: instance groups whose instances are kwok Nodes.

Used by the dev cluster and the tests, where there is no cloud. Its state lives in the
cluster itself, so every kustos process (and ``kustos dev stop-node``) sees the same:

- **Groups** come from a ConfigMap (default ``kube-system/kustos-kwok-groups``), key
  ``groups.yaml``: a list of ``{id, role (ControlPlane|Worker), image, min, max}``, plus
  per group ``readyAfterSeconds`` (how long a new node takes to become Ready),
  ``neverReady`` (new nodes never become Ready) and ``failCreate`` (``capacity`` or
  ``throttled``: creating refuses so, while set). ``set_image`` writes the group's image there.
- **Instances** are Nodes labelled ``kustos.dev/kwok-group=<id>`` with providerID
  ``kwok://<node>``, the image in the annotation ``kustos.dev/kwok-image`` (and, as far as a
  label value allows, the label ``kustos.dev/image``) and an InternalIP of their own.
- **Ready after a delay**: a new node carries ``kustos.dev/kwok-ready-at`` (RFC 3339); the
  dev cluster's kwok Stage ``kustos-node-boot`` makes it Ready at that moment, and skips a
  node annotated ``kustos.dev/kwok-never-ready``.
- **State**: a Node without the ``kustos.dev/kwok-managed`` label (``kustos dev stop-node``
  removes it; kwok then stops its heartbeat) is Stopped unless it is only partitioned
  (``kustos.dev/partitioned``); no Node is Gone. So fencing by provider works in the dev cluster.
"""

from __future__ import annotations

import itertools
import re
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import yaml

from kustos.runtime import objects
from kustos.runtime.api import Api, ApiStatusError
from kustos.runtime.clock import Clock, SystemClock
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
from kustos.runtime.resources import CONFIGMAPS, NODES
from kustos.runtime.times import rfc3339

PROVIDER_PREFIX = "kwok://"
GROUP_LABEL = "kustos.dev/kwok-group"
IMAGE_LABEL = "kustos.dev/image"
IMAGE_ANNOTATION = "kustos.dev/kwok-image"
READY_AT_ANNOTATION = "kustos.dev/kwok-ready-at"
NEVER_READY_ANNOTATION = "kustos.dev/kwok-never-ready"
MANAGED_LABEL = "kustos.dev/kwok-managed"  # the dev cluster's kwok manages nodes with it
PARTITIONED_ANNOTATION = "kustos.dev/partitioned"
GROUPS_KEY = "groups.yaml"


@dataclass(frozen=True)
class GroupConfig:
    id: str
    role: Role
    image: str
    min: int = 0
    max: int = 1000
    ready_after_seconds: float = 0.0
    never_ready: bool = False
    fail_create: str | None = None

    @classmethod
    def parse(cls, raw: Mapping[str, Any]) -> GroupConfig:
        return cls(
            id=str(raw["id"]),
            role=Role(raw.get("role", "Worker")),
            image=str(raw["image"]),
            min=int(raw.get("min", 0)),
            max=int(raw.get("max", 1000)),
            ready_after_seconds=float(raw.get("readyAfterSeconds", 0)),
            never_ready=bool(raw.get("neverReady", False)),
            fail_create=raw.get("failCreate"),
        )


def label_value(text: str) -> str:
    """``registry/os:v2`` -> ``registry-os-v2``: what a label value may hold (63 characters)."""
    value = re.sub(r"[^A-Za-z0-9_.-]", "-", text)[:63]
    return value.strip("-_.")


def node_name_of(provider_id: str) -> str:
    """The Node a kwok providerID names. Another provider's ID is a ``ProviderError``, never
    ``NotFound``: node maintenance takes NotFound for "gone", which fences a node that may run."""
    if not provider_id.startswith(PROVIDER_PREFIX):
        raise ProviderError(
            f"{provider_id!r} is not a kwok providerID ({PROVIDER_PREFIX}<node>): kwok cannot say what it is",
            reason="ProviderForeignID",
        )
    return provider_id[len(PROVIDER_PREFIX) :]


class KwokProvider:
    """``CloudProvider`` over kwok Nodes; bound to an API client by ``bind`` (``kustos run``)."""

    name = "kwok"

    def __init__(
        self,
        api: Api | None = None,
        *,
        namespace: str = "kube-system",
        configmap: str = "kustos-kwok-groups",
        ip_prefix: str = "127.77",
        pod_cidr_prefix: str | None = None,
        first_index: int = 1,
        clock: Clock | None = None,
    ) -> None:
        self._api = api
        self.namespace = namespace
        self.configmap = configmap
        self.ip_prefix = ip_prefix
        self.pod_cidr_prefix = pod_cidr_prefix
        self.first_index = first_index
        self.clock = clock or SystemClock()

    @classmethod
    def from_options(cls, options: Mapping[str, str]) -> KwokProvider:
        """``--cloud-option`` keys: namespace, configmap, ip-prefix (two octets: new nodes get
        ``<prefix>.<n>.<m>``), pod-cidr-prefix (two octets: ``<prefix>.<n>.0/24``), first-index."""
        known = {"namespace", "configmap", "ip-prefix", "pod-cidr-prefix", "first-index"}
        unknown = sorted(set(options) - known)
        if unknown:
            raise ValueError(f"unknown kwok provider option(s) {unknown}; known: {sorted(known)}")
        return cls(
            namespace=options.get("namespace", "kube-system"),
            configmap=options.get("configmap", "kustos-kwok-groups"),
            ip_prefix=options.get("ip-prefix", "127.77"),
            pod_cidr_prefix=options.get("pod-cidr-prefix"),
            first_index=int(options.get("first-index", "1")),
        )

    def bind(self, api: Api) -> None:
        self._api = api

    @property
    def api(self) -> Api:
        if self._api is None:
            raise ProviderError("the kwok provider has no API client (bind it first)")
        return self._api

    # ---- configuration ----------------------------------------------------------------------

    async def _config(self) -> tuple[dict[str, Any] | None, list[GroupConfig]]:
        cm = await self.api.get(CONFIGMAPS, self.namespace, self.configmap)
        if cm is None:
            return None, []
        raw = yaml.safe_load((cm.get("data") or {}).get(GROUPS_KEY) or "[]") or []
        try:
            return cm, [GroupConfig.parse(g) for g in raw]
        except (KeyError, ValueError, TypeError) as err:
            raise ProviderError(
                f"ConfigMap {self.namespace}/{self.configmap} key {GROUPS_KEY}: {err}", "ProviderConfig"
            ) from err

    async def _group(self, group_id: str) -> GroupConfig:
        _, groups = await self._config()
        for g in groups:
            if g.id == group_id:
                return g
        raise NotFound(f"no kwok group {group_id!r} in ConfigMap {self.namespace}/{self.configmap}")

    async def _nodes(self, group_id: str | None = None) -> list[dict[str, Any]]:
        selector = f"{GROUP_LABEL}={group_id}" if group_id else GROUP_LABEL
        return await self.api.list_objects(NODES, None, selector)

    # ---- the interface --------------------------------------------------------------------

    async def groups(self) -> Sequence[Group]:
        _, configs = await self._config()
        nodes = await self._nodes()
        sizes: dict[str, int] = {}
        for node in nodes:
            group = objects.labels(node).get(GROUP_LABEL, "")
            sizes[group] = sizes.get(group, 0) + 1
        return [Group(g.id, g.role, g.image, g.min, g.max, sizes.get(g.id, 0)) for g in configs]

    async def instances(self, group_id: str) -> Sequence[Instance]:
        return [_instance(n) for n in await self._nodes(group_id)]

    async def instance(self, provider_id: str) -> Instance:
        # Any kwok node answers, the dev cluster's own too (they belong to no group): a node
        # that exists is never reported Gone, which would fence a node still running.
        node = await self.api.get(NODES, None, node_name_of(provider_id))
        if node is None:
            return Instance(provider_id, "", InstanceState.GONE)
        return _instance(node)

    async def set_image(self, group_id: str, image: str) -> None:
        cm, _ = await self._config()
        if cm is None:
            raise NotFound(f"no ConfigMap {self.namespace}/{self.configmap}")
        raw = yaml.safe_load((cm.get("data") or {}).get(GROUPS_KEY) or "[]") or []
        for g in raw:
            if str(g.get("id")) == group_id:
                g["image"] = image
                break
        else:
            raise NotFound(f"no kwok group {group_id!r}")
        # Guarded by resourceVersion: a test editing the ConfigMap meanwhile is not overwritten.
        patch = {
            "metadata": {"resourceVersion": objects.resource_version(cm)},
            "data": {GROUPS_KEY: yaml.safe_dump(raw, sort_keys=False)},
        }
        try:
            await self.api.patch(CONFIGMAPS, self.namespace, self.configmap, patch)
        except ApiStatusError as err:
            raise ProviderError(f"setting the image of kwok group {group_id}: {err}") from err

    async def create_instance(self, group_id: str) -> None:
        group = await self._group(group_id)
        if group.fail_create == "capacity":
            raise CapacityError(f"kwok group {group_id}: no capacity (failCreate: capacity)")
        if group.fail_create == "throttled":
            raise Throttled(f"kwok group {group_id}: rate exceeded (failCreate: throttled)", retry_after=2.0)
        nodes = await self.api.list_objects(NODES, None, None)
        members = [n for n in nodes if objects.labels(n).get(GROUP_LABEL) == group_id]
        if len(members) >= group.max:
            raise CapacityError(f"kwok group {group_id} is at its maximum of {group.max} node(s)")
        index = self._free_index(nodes)
        name = f"{label_value(group_id)[:40]}-{secrets.token_hex(3)}"
        try:
            await self.api.create(NODES, self._manifest(name, group, index))
        except ApiStatusError as err:
            raise ProviderError(f"creating kwok node {name}: {err}") from err

    async def delete_instance(self, group_id: str, provider_id: str) -> None:
        name = node_name_of(provider_id)
        node = await self.api.get(NODES, None, name)
        if node is None or objects.labels(node).get(GROUP_LABEL) != group_id:
            raise NotFound(f"kwok instance {provider_id} is not in group {group_id}")
        await self.api.delete(NODES, None, name)

    # ---- helpers ----------------------------------------------------------------------------

    def _free_index(self, nodes: Sequence[Mapping[str, Any]]) -> int:
        used: set[int] = set()
        for node in nodes:
            for address in (node.get("status") or {}).get("addresses") or []:
                ip = str(address.get("address", ""))
                if ip.startswith(self.ip_prefix + "."):
                    a, _, b = ip[len(self.ip_prefix) + 1 :].partition(".")
                    if a.isdigit() and b.isdigit():
                        used.add(int(a) * 256 + int(b))
            cidr = str((node.get("spec") or {}).get("podCIDR") or "")
            if self.pod_cidr_prefix and cidr.startswith(self.pod_cidr_prefix + "."):
                third = cidr[len(self.pod_cidr_prefix) + 1 :].split(".")[0]
                if third.isdigit():
                    used.add(int(third))
        limit = 255 if self.pod_cidr_prefix else 65000
        # Above the highest address in use first, as a cloud rarely hands a freed address out
        # again at once (a stacked etcd keyed by address would take the new node for the old);
        # then, once the range is used up, the lowest free one.
        above = max((i for i in used if i < limit), default=self.first_index - 1) + 1
        for index in itertools.chain(
            range(max(above, self.first_index), limit), range(self.first_index, limit)
        ):
            if index not in used and index % 256 not in (0, 255):
                return index
        raise CapacityError("the kwok provider has no free node address left")

    def _manifest(self, name: str, group: GroupConfig, index: int) -> dict[str, Any]:
        annotations = {IMAGE_ANNOTATION: group.image}
        if group.never_ready:
            annotations[NEVER_READY_ANNOTATION] = "true"
        else:
            ready_at = self.clock.now() + timedelta(seconds=group.ready_after_seconds)
            annotations[READY_AT_ANNOTATION] = rfc3339(ready_at)
        labels = {
            MANAGED_LABEL: "true",
            GROUP_LABEL: group.id,
            IMAGE_LABEL: label_value(group.image),
            "type": "kwok",
            "kubernetes.io/hostname": name,
            "kubernetes.io/os": "linux",
            "kubernetes.io/arch": "amd64",
        }
        taints: list[dict[str, str]] = []
        if group.role == Role.CONTROL_PLANE:
            labels["node-role.kubernetes.io/control-plane"] = ""
            taints.append({"key": "node-role.kubernetes.io/control-plane", "effect": "NoSchedule"})
        else:
            labels["node-role.kubernetes.io/worker"] = ""
        capacity = {"cpu": "32", "memory": "256Gi", "pods": "110", "ephemeral-storage": "1Ti"}
        spec: dict[str, Any] = {"providerID": PROVIDER_PREFIX + name, "taints": taints}
        if self.pod_cidr_prefix:
            cidr = f"{self.pod_cidr_prefix}.{index}.0/24"
            spec["podCIDR"], spec["podCIDRs"] = cidr, [cidr]
        ip = f"{self.ip_prefix}.{index // 256}.{index % 256}"
        return {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": name, "labels": labels, "annotations": annotations},
            "spec": spec,
            "status": {
                "addresses": [{"type": "InternalIP", "address": ip}, {"type": "Hostname", "address": name}],
                "allocatable": capacity,
                "capacity": capacity,
            },
        }


def _instance(node: Mapping[str, Any]) -> Instance:
    name = objects.name(node)
    labels = objects.labels(node)
    annotations = objects.annotations(node)
    if objects.deleting(node):
        state = InstanceState.STOPPING
    elif labels.get(MANAGED_LABEL) == "true" or PARTITIONED_ANNOTATION in annotations:
        state = InstanceState.RUNNING if objects.node_ready(node) else InstanceState.PENDING
    else:
        state = InstanceState.STOPPED
    provider_id = (node.get("spec") or {}).get("providerID") or PROVIDER_PREFIX + name
    return Instance(
        provider_id=provider_id,
        group_id=labels.get(GROUP_LABEL, ""),
        state=state,
        node_name=name,
        image=annotations.get(IMAGE_ANNOTATION),
    )


__all__ = ["GroupConfig", "KwokProvider", "label_value", "node_name_of"]
