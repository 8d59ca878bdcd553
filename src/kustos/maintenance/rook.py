"""What a purge does to Rook: the CephCluster's storage.nodes, the OSD Deployments, Ceph itself.

As EKCO does (pkg/cluster/rook_ceph.go): the node leaves every CephCluster's
``spec.storage.nodes`` (a guarded JSON patch of that list), its OSD Deployments (label
``app=rook-ceph-osd``, pod nodeSelector ``kubernetes.io/hostname``, OSD ID in label
``ceph-osd-id``) are deleted, and for each OSD ``ceph osd down``, ``ceph osd purge
--yes-i-really-mean-it``, then ``ceph osd crush rm <node>`` run in the Ceph toolbox.

The toolbox is an interface (``CephToolbox``): running a command in the toolbox pod is an
exec through the API server; ``ApiToolbox`` does it itself (runtime.podexec: the operator's
purge, RBAC ``pods/exec`` get+create in Rook's namespace), ``KubectlToolbox`` with kubectl (the
CLI's purge). Which command runs next, and what to say with no toolbox pod (the commands, for
a person to run), is ``purge_planner``'s. Unlike EKCO, only a failed ``ceph osd down`` lets the
purge go on (a dead node's OSDs are down already); any other failure, or a command that could
not run, stops it there (``run_one``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any, Protocol

from kustos.maintenance.rook_scaling import CEPH_CLUSTERS
from kustos.runtime import objects, podexec
from kustos.runtime.api import Api, ApiStatusError
from kustos.runtime.errors import ReconcileError
from kustos.runtime.kubeconfig import KubeAccess
from kustos.runtime.resources import DEPLOYMENTS, NODES, PODS

OSD_SELECTOR = "app=rook-ceph-osd"
OSD_ID_LABEL = "ceph-osd-id"
HOSTNAME = "kubernetes.io/hostname"


class CephToolbox(Protocol):
    """Runs ``ceph`` in Rook's toolbox pod: (exit code, stdout, stderr)."""

    async def run(self, argv: Sequence[str]) -> tuple[int, str, str]: ...


def storage_nodes_without(cluster: dict[str, Any], node: str) -> list[Any] | None:
    """The CephCluster's storage.nodes without ``node`` (None: it is not listed)."""
    nodes = (((cluster.get("spec") or {}).get("storage") or {}).get("nodes")) or []
    kept = [n for n in nodes if n.get("name") != node]
    return None if len(kept) == len(nodes) else kept


async def _clusters(api: Api, namespace: str) -> list[dict[str, Any]]:
    try:
        return await api.list_objects(CEPH_CLUSTERS, namespace)
    except ApiStatusError as err:
        if err.not_found:  # no Rook CRD: nothing to do
            return []
        raise


async def remove_storage_node(api: Api, namespace: str, node: str) -> str:
    """Remove ``node`` from every CephCluster's storage.nodes in ``namespace``."""
    changed = []
    for cluster in await _clusters(api, namespace):
        kept = storage_nodes_without(cluster, node)
        if kept is None:
            continue
        patch = [
            {"op": "test", "path": "/metadata/resourceVersion", "value": objects.resource_version(cluster)},
            {"op": "replace", "path": "/spec/storage/nodes", "value": kept},
        ]
        await api.patch(CEPH_CLUSTERS, namespace, objects.name(cluster), patch, kind="json")
        changed.append(objects.name(cluster))
    if not changed:
        return f"{node} is in no CephCluster's storage.nodes in {namespace}"
    return f"removed {node} from storage.nodes of CephCluster {', '.join(changed)}"


def osd_of(deployment: dict[str, Any], node: str) -> str | None:
    """The OSD ID of a Rook OSD Deployment pinned to ``node`` (None: another node's)."""
    selector = (
        (((deployment.get("spec") or {}).get("template") or {}).get("spec") or {}).get("nodeSelector")
    ) or {}
    if selector.get(HOSTNAME) != node:
        return None
    return objects.labels(deployment).get(OSD_ID_LABEL, "")


async def osd_deployments(api: Api, namespace: str, node: str) -> list[tuple[str, str]]:
    """(Deployment name, OSD ID) of the node's OSDs."""
    found = []
    for deployment in await api.list_objects(DEPLOYMENTS, namespace, label_selector=OSD_SELECTOR):
        osd = osd_of(deployment, node)
        if osd is not None:
            found.append((objects.name(deployment), osd))
    return sorted(found)


async def run_one(toolbox: CephToolbox, argv: Sequence[str]) -> tuple[str, bool]:
    """Run one Ceph command: what happened, as a clause, and whether the purge may go on.

    Only ``ceph osd down`` may fail and the purge go on: on a dead node its OSDs are down
    already, which Ceph answers with an error. A failed ``osd purge`` or ``crush rm``, or a
    command that could not run at all, stops the purge there (retried on a later pass), so
    the Node is not deleted while Ceph still counts its OSDs."""
    try:
        code, _, err = await toolbox.run(argv)
    except ReconcileError as failure:  # not run at all (exec refused, timed out)
        code, err = -1, failure.message
    outcome = "ok" if code == 0 else f"failed ({code}: {err.strip()[:200]})"
    tolerated = code == 0 or list(argv[:3]) == ["ceph", "osd", "down"]
    return f"{' '.join(argv)}: {outcome}", tolerated


__all__ = [
    "CEPH_CLUSTERS",
    "ApiToolbox",
    "CephToolbox",
    "KubectlToolbox",
    "osd_deployments",
    "osd_of",
    "remove_storage_node",
    "run_one",
    "storage_nodes_without",
    "toolbox_pod",
    "usable_toolboxes",
]


TOOLBOX_SELECTOR = "app=rook-ceph-tools"


def usable_toolboxes(pods: Sequence[dict[str, Any]], nodes: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Toolbox pods an exec can reach: Ready, not deleting, on a Ready node (the pod of a dead
    node, the one being purged perhaps, still says Running), by name."""
    ready_nodes = {objects.name(n) for n in nodes if objects.node_ready(n)}
    usable = [
        p
        for p in pods
        if objects.pod_running(p)
        and objects.pod_ready(p, trust_containers=True)
        and not objects.deleting(p)
        and objects.pod_node(p) in ready_nodes
    ]
    return sorted(usable, key=objects.name)


async def _toolboxes(api: Api, namespace: str) -> list[dict[str, Any]]:
    pods = await api.list_objects(PODS, namespace, label_selector=TOOLBOX_SELECTOR)
    if not pods:
        return []
    nodes = []
    for name in sorted({n for n in map(objects.pod_node, pods) if n}):
        node = await api.get(NODES, None, name)
        if node is not None:
            nodes.append(node)
    return usable_toolboxes(pods, nodes)


async def toolbox_pod(api: Api, namespace: str) -> str | None:
    """The name of a Ready toolbox pod on a Ready node in ``namespace`` (None: there is none)."""
    usable = await _toolboxes(api, namespace)
    return objects.name(usable[0]) if usable else None


class ApiToolbox:
    """Runs ``ceph`` in Rook's toolbox pod through the API server's exec subresource (the
    operator's purge): the pod is looked up for every command, so a restarted toolbox is found."""

    def __init__(self, api: Api, config: KubeAccess, namespace: str, timeout: float = 60.0) -> None:
        self.api = api
        self.config = config
        self.namespace = namespace
        self.timeout = timeout

    async def run(self, argv: Sequence[str]) -> tuple[int, str, str]:
        pod = await toolbox_pod(self.api, self.namespace)
        if pod is None:
            return 127, "", f"no Ready pod labelled {TOOLBOX_SELECTOR} on a Ready node in {self.namespace}"
        result = await podexec.exec_in_pod(self.config, self.namespace, pod, list(argv), timeout=self.timeout)
        return result.code, result.stdout, result.stderr


class KubectlToolbox:
    """``kubectl exec`` into Rook's toolbox pod (label app=rook-ceph-tools): what ``kustos
    purge-node`` uses on a machine with kubectl, as EKCO's purge-node execs into Rook's pods."""

    def __init__(
        self, api: Api, namespace: str, kubectl: str = "kubectl", kubeconfig: str | None = None,
        context: str | None = None,
    ) -> None:  # fmt: skip
        self.api = api
        self.namespace = namespace
        self.kubectl = kubectl
        self.flags = [
            *(["--kubeconfig", kubeconfig] if kubeconfig else []),
            *(["--context", context] if context else []),
        ]

    async def run(self, argv: Sequence[str]) -> tuple[int, str, str]:
        pod = await toolbox_pod(self.api, self.namespace)
        if pod is None:
            return 127, "", f"no Ready pod labelled {TOOLBOX_SELECTOR} on a Ready node in {self.namespace}"
        command = [
            self.kubectl,
            *self.flags,
            "exec",
            "-n",
            self.namespace,
            pod,
            "--",
            *argv,
        ]
        process = await asyncio.create_subprocess_exec(
            *command, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
        )
        out, err = await process.communicate()
        return process.returncode or 0, out.decode(errors="replace"), err.decode(errors="replace")
