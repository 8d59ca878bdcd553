"""The MaintenancePolicy controller: observe nodes (and the provider), plan, act one step, record.

One policy, named ``default``, governs the cluster. Any Node, Pod or claim change wakes it;
while a node is unreachable it looks again every few seconds (fencing evidence may come
from the provider, which sends no event). Each pass takes at most one step: untaint a node
that came back, taint a fenced node out of service, force-delete one pod, release one
pinned claim, or one step of one node's purge; then the status is written once.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from datetime import datetime
from typing import Any

from kustos.api.maintenance import (
    POLICY_NAME,
    MaintenancePolicy,
    MaintenancePolicySpec,
    MaintenancePolicyStatus,
    ScaledResource,
)
from kustos.etcd import kubeadm
from kustos.images import configured_agent_image
from kustos.maintenance import (
    certrotation,
    certrotation_act,
    internallb,
    minio,
    minio_controller,
    minio_spread,
    planner,
    rook,
    rook_objects,
    rook_scaling,
    scaling,
)
from kustos.maintenance.nodes import node_view, rook_node
from kustos.maintenance.planner import (
    OUT_OF_SERVICE_OWNER,
    OUT_OF_SERVICE_TAINT,
    OUT_OF_SERVICE_VALUE,
    RELEASE_CLAIMS_ANNOTATION,
    ClaimView,
    Observed,
    PodView,
    Step,
)
from kustos.maintenance.purge import PurgeOptions, Purger
from kustos.runtime import faults, objects
from kustos.runtime.api import ApiStatusError
from kustos.runtime.cloud import CloudProvider, InstanceState, NotFound, ProviderError
from kustos.runtime.conditions import Condition as RawCondition
from kustos.runtime.controller import ChangeFilter, Controller
from kustos.runtime.deps import Deps
from kustos.runtime.errors import ReconcileError
from kustos.runtime.events import NORMAL, WARNING
from kustos.runtime.informer import InformerOptions
from kustos.runtime.manager import Manager
from kustos.runtime.reconciler import FamilyReconciler
from kustos.runtime.record import Note, warning
from kustos.runtime.refs import ResourceRef
from kustos.runtime.resources import CLAIMS, DAEMONSETS, DEPLOYMENTS, NODES, PODS, STATEFULSETS, VOLUMES
from kustos.runtime.times import parse_rfc3339, rfc3339

log = logging.getLogger(__name__)

POLICIES = MaintenancePolicy.crd.ref
HOSTNAME_LABEL = "kubernetes.io/hostname"
ANNOUNCED = frozenset({"Degraded", "Ready", "FencingAnnotationsValid", "PurgeInterrupted"})
UNSCHEDULED_INDEX = "maintenance-unscheduled"
WRITER_SELECTOR = f"{internallb.COMPONENT_LABEL}={internallb.WRITER_NAME}"
Obj = dict[str, Any]


def _unscheduled(pod: dict[str, Any]) -> Iterable[str]:
    """Pods no scheduler has placed yet (all under one key): where a pinned claim shows."""
    return () if (pod.get("spec") or {}).get("nodeName") else ("",)


def pinned_node(volume: dict[str, Any] | None) -> str | None:
    """The one node (its kubernetes.io/hostname) a volume's required nodeAffinity allows
    (local and local-path volumes)."""
    terms = (((volume or {}).get("spec") or {}).get("nodeAffinity") or {}).get("required", {}).get(
        "nodeSelectorTerms"
    ) or []
    if len(terms) != 1:
        return None
    for expression in terms[0].get("matchExpressions") or []:
        values = expression.get("values") or []
        if (
            expression.get("key") == HOSTNAME_LABEL
            and expression.get("operator") == "In"
            and len(values) == 1
        ):
            return str(values[0])
    return None


class NodeMaintenanceReconciler(FamilyReconciler[MaintenancePolicy, Observed, Step]):
    """Node maintenance under the MaintenancePolicy (etcd's defragmentation is another family's)."""

    model = MaintenancePolicy
    announce = ANNOUNCED

    def __init__(self, manager: Manager, deps: Deps) -> None:
        super().__init__(manager, deps)
        self.cloud: CloudProvider | None = deps.cloud
        self.policies = self.cache
        self.nodes = manager.informer(NODES)
        self.pods = manager.informer(PODS)
        self.pods_by_node = self.pods.index_by_node_name()
        self.pods.add_index(UNSCHEDULED_INDEX, _unscheduled)
        self.pods.add_index(certrotation_act.TASK_INDEX, certrotation_act.task_index)
        self.claims = manager.informer(CLAIMS)
        self.volumes = manager.informer(VOLUMES)
        self.statefulsets = manager.informer(STATEFULSETS)
        self.writers = manager.informer(DAEMONSETS, InformerOptions(label_selector=WRITER_SELECTOR))

    def plan(self, observed: Observed) -> Step:
        return planner.plan(observed)

    def status(self, observed: Observed, step: Step, now: datetime, failure: ReconcileError | None) -> Obj:
        return planner.status(observed, step, now, failure).model_dump(by_alias=True)

    def requeue_after(self, observed: Observed, step: Step) -> float | None:
        return planner.requeue_after(step)

    async def write_status(self, raw: Obj, status: Obj, notes: list[Note]) -> None:
        """The one write, with an Event for an action recorded anew. A conflict (a stale cache)
        must not lose the record of a step taken: once more on the policy as it is now
        (nothing else writes its status)."""
        old = MaintenancePolicyStatus.model_validate(raw.get("status") or {})
        new = MaintenancePolicyStatus.model_validate(status)
        told = notes + planner.action_notes(old, new)
        try:
            await self.record_status(raw, status, told, announce=ANNOUNCED, is_warning=_warning)
        except ApiStatusError as err:
            if not err.conflict:
                raise
            fresh = await self.api.get(POLICIES, None, objects.name(raw))
            if fresh is None:
                return
            await self.record_status(fresh, status, told, announce=ANNOUNCED, is_warning=_warning)
        if (
            new.last_action is not None
            and new.last_action != old.last_action
            and new.last_action.outcome != "Failed"
        ):
            # Recorded anew (the same test as its Event): counted for the metrics, in memory.
            self.manager.observations.count_maintenance(
                objects.name(raw), new.last_action.action, new.last_action.outcome
            )

    # ---- observe -----------------------------------------------------------------------

    async def observe(self, policy: MaintenancePolicy, now: datetime) -> Observed:
        previous = policy.status or MaintenancePolicyStatus()
        spec = policy.spec
        views = []
        unreachable: list[str] = []
        for node in list(self.nodes.list()):
            view = node_view(node)
            if not view.ready and view.unreachable_since is not None:
                unreachable.append(view.name)
                if spec.fencing.provider and self.cloud is not None:
                    view = node_view(node, await self._instance_state(node))
            views.append(view)
        pods = [
            PodView(
                namespace=str(objects.namespace(pod)),
                name=objects.name(pod),
                uid=str(objects.uid(pod)),
                node=objects.pod_node(pod),
                deleting_since=parse_rfc3339((pod.get("metadata") or {}).get("deletionTimestamp")),
            )
            for name in unreachable
            for pod in self.pods.by_index(self.pods_by_node, name)
        ]
        ready = minio_controller.ready_nodes(self.nodes.list())
        return Observed(
            spec=spec,
            nodes=tuple(views),
            pods=tuple(pods),
            claims=tuple(self._pinned_claims()),
            now=now,
            name=objects.name(policy),
            generation=objects.generation(policy),
            previous=previous,
            load_balancer=self._load_balancer(),
            workloads=tuple([await self._workload(entry) for entry in spec.auto_resource_scaling]),
            candidates=tuple(
                scaling.Candidate(
                    objects.name(n),
                    objects.node_ready(n),
                    objects.node_unschedulable(n),
                    tuple(sorted(objects.labels(n).items())),
                )
                for n in self.nodes.list()
            ),
            rook=await rook_objects.observe(self.api, spec, [rook_node(n) for n in self.nodes.list()]),
            minio=await minio_controller.observe_minio(
                self.api, spec, self.pods, self.statefulsets, self.claims, list(self.nodes.list()), now,
            ),
            kotsadm=minio_controller.observe_kotsadm(spec, self.statefulsets, ready),
            certificates=certrotation_act.view(
                self.nodes.list(),
                lambda node: self.pods.by_index(self.pods_by_node, node),
                self.pods.by_index(certrotation_act.TASK_INDEX, certrotation.TASK),
                configured_agent_image(),
                {"apiVersion": policy.api_version, "kind": policy.kind, "metadata": policy.metadata},
            ),
        )  # fmt: skip

    async def _workload(self, entry: ScaledResource) -> scaling.WorkloadView:
        """One listed workload's replicas: StatefulSets from the cache, the rest read (a custom
        resource needs get and patch granted, see docs/maintenance-extras.md)."""
        ref = scaled_ref(entry)
        try:
            if ref == STATEFULSETS:
                found = self.statefulsets.get(f"{entry.namespace}/{entry.name}")
            else:
                found = await self.api.get(ref, entry.namespace, entry.name)
        except ApiStatusError as err:
            return scaling.WorkloadView(None, f"cannot read {scaling.describe(entry)}: {err}"[:500])
        if found is None:
            return scaling.WorkloadView(None, f"{scaling.describe(entry)} does not exist")
        replicas = scaling.replicas_at(found, entry.replicas_path)
        if replicas is None:
            return scaling.WorkloadView(
                None, f"{scaling.describe(entry)} has no integer at {entry.replicas_path}"
            )
        return scaling.WorkloadView(replicas)

    def _load_balancer(self) -> internallb.LoadBalancerView:
        """The control-plane nodes' API servers and the writer DaemonSet, from the caches."""
        control_plane = {
            objects.name(n): objects.internal_ip(n) for n in self.nodes.list() if objects.is_control_plane(n)
        }
        annotated: dict[str, str] = {}
        for node in control_plane:
            endpoint = kubeadm.apiserver_endpoint(self.pods.by_index(self.pods_by_node, node))
            if endpoint is not None:
                annotated[node] = endpoint
        writer = None
        for daemonset in self.writers.list():
            if objects.name(daemonset) != internallb.WRITER_NAME or objects.deleting(daemonset):
                continue
            state = daemonset.get("status") or {}
            writer = internallb.WriterView(
                namespace=str(objects.namespace(daemonset)),
                digest=objects.annotations(daemonset).get(internallb.CONFIG_HASH_ANNOTATION, ""),
                desired=int(state.get("desiredNumberScheduled") or 0),
                updated=int(state.get("updatedNumberScheduled") or 0),
                ready=int(state.get("numberReady") or 0),
                current=state.get("observedGeneration") == objects.generation(daemonset),
            )
        return internallb.LoadBalancerView(
            servers=internallb.api_servers(control_plane, annotated),
            writer=writer,
            writer_image=configured_agent_image(),
        )

    async def _instance_state(self, node: dict[str, Any]) -> InstanceState | None:
        assert self.cloud is not None
        provider_id = (node.get("spec") or {}).get("providerID")
        if not provider_id:
            return None
        try:
            return (await self.cloud.instance(provider_id)).state
        except NotFound:
            return InstanceState.GONE
        except ProviderError as err:
            log.warning("provider %s cannot say what %s is: %s", self.cloud.name, provider_id, err)
            return None

    def _opted_in(self, pod: dict[str, Any]) -> bool:
        owner = objects.owner_of(pod, "StatefulSet")
        if owner is None:
            return False
        workload = self.statefulsets.get(f"{objects.namespace(pod)}/{owner}")
        return workload is not None and objects.annotations(workload).get(RELEASE_CLAIMS_ANNOTATION) == "true"

    def _pinned_claims(self) -> Iterable[ClaimView]:
        """Claims of unscheduled pods whose volume is pinned to one node."""
        for pod in list(self.pods.by_index(UNSCHEDULED_INDEX, "")):
            if objects.deleting(pod) or objects.pod_node(pod):
                continue
            namespace = str(objects.namespace(pod))
            for volume in (pod.get("spec") or {}).get("volumes") or []:
                claim_name = (volume.get("persistentVolumeClaim") or {}).get("claimName")
                claim = self.claims.get(f"{namespace}/{claim_name}") if claim_name else None
                if claim is None:
                    continue
                bound = (claim.get("spec") or {}).get("volumeName")
                node = pinned_node(self.volumes.get(bound)) if bound else None
                if node is None:
                    continue
                yield ClaimView(namespace, str(claim_name), str(objects.uid(claim)), node, objects.name(pod),
                                self._opted_in(pod), objects.deleting(claim))  # fmt: skip

    # ---- act ---------------------------------------------------------------------------

    async def act(self, policy: MaintenancePolicy, observed: Observed, step: Step, notes: list[Note]) -> Step:
        match step:
            case planner.TaintOutOfService(node, evidence):
                log.info("step: TaintOutOfService %s (%s)", node, evidence)
                await self._set_out_of_service(node, True)
                faults.exit_after("TaintOutOfService")
            case planner.RemoveOutOfService(node, why):
                log.info("step: RemoveOutOfService %s (%s)", node, why)
                await self._set_out_of_service(node, False)
            case planner.ForceDeletePod(namespace, name, uid, node, why):
                log.info("step: ForceDeletePod %s/%s on %s (%s)", namespace, name, node, why)
                await self.api.delete(PODS, namespace, name, uid=uid, grace_seconds=0)
            case planner.ReleaseClaim(namespace, name, uid, node, pod):
                log.info("step: ReleaseClaim %s/%s pinned to %s for %s", namespace, name, node, pod)
                await self.api.delete(CLAIMS, namespace, name, uid=uid)
            case internallb.ApplyLoadBalancer(settings):
                log.info("step: ApplyLoadBalancer %s", ", ".join(map(str, settings.servers)))
                owner = {"apiVersion": policy.api_version, "kind": policy.kind, "metadata": policy.metadata}
                await self.api.apply(DAEMONSETS, internallb.writer_daemonset(settings, owner))
            case internallb.RemoveLoadBalancer(namespace, why):
                log.info("step: RemoveLoadBalancer %s (%s)", namespace, why)
                await self.api.delete(DAEMONSETS, namespace, internallb.WRITER_NAME)
            case scaling.ScaleWorkload(entry, current, to, _):
                log.info("step: Scale %s from %d to %d", scaling.describe(entry), current, to)
                pointer = scaling.json_pointer(entry.replicas_path)
                # Guarded by the count read: one the user raised meanwhile is never lowered.
                patch = [{"op": "test", "path": pointer, "value": current},
                         {"op": "replace", "path": pointer, "value": to}]  # fmt: skip
                await self.api.patch(scaled_ref(entry), entry.namespace, entry.name, patch, kind="json")
            case rook_scaling.PatchRook():
                log.info("step: %s %s", step.action, step.message)
                await rook_objects.act(self.api, step)
            case minio.CreateStatefulSet() | minio.SetServiceSelector() | minio.CopyObjects() | \
                    minio.RemoveOldMinio() | minio_spread.MoveReplica() | minio.ScaleKotsadm():  # fmt: skip
                return await minio_controller.act(self.api, step)
            case certrotation.StartRenewal() | certrotation.FinishRenewal() | certrotation.RemoveRenewalPod():
                await certrotation_act.act(self.api, self.manager.events, policy.spec, step, self.clock.now())
            case planner.Purge(node):
                options = PurgeOptions.from_spec(policy.spec)
                purger = Purger(self.api, options, self._announce, await self._toolbox(options))
                outcome = await purger.next(node)
                if outcome.deleted:
                    self.manager.observations.count_purged(policy.metadata["name"])
                return planner.Purged(node, outcome.message, outcome.refused, outcome.finished)
            case planner.Purged(finished=True):  # a Node whose deletion was decided is gone
                self.manager.observations.count_purged(policy.metadata["name"])
        return step

    async def _toolbox(self, options: PurgeOptions) -> rook.CephToolbox | None:
        """Exec in Rook's toolbox pod through the API server; None (the Ceph commands are
        printed for a person to run) when Rook is not maintained or there is no toolbox pod."""
        if not options.maintain_rook:
            return None
        if await rook.toolbox_pod(self.api, options.rook_namespace) is None:
            return None
        return rook.ApiToolbox(self.api, self.manager.clients.config, options.rook_namespace)

    async def _set_out_of_service(self, name: str, wanted: bool) -> None:
        """Add or remove the out-of-service taint (and our mark), guarded by resourceVersion:
        the node lifecycle controller edits taints too."""
        node = await self.api.get(NODES, None, name)
        if node is None:
            return
        current = objects.node_taints(node)
        others = [t for t in current if t.get("key") != OUT_OF_SERVICE_TAINT]
        if wanted:
            others.append({"key": OUT_OF_SERVICE_TAINT, "value": OUT_OF_SERVICE_VALUE, "effect": "NoExecute",
                           "timeAdded": rfc3339(self.clock.now())})  # fmt: skip
        patch: list[dict[str, Any]] = [
            {"op": "test", "path": "/metadata/resourceVersion", "value": objects.resource_version(node)},
            {"op": "replace" if "taints" in (node.get("spec") or {}) else "add", "path": "/spec/taints",
             "value": others},
        ]  # fmt: skip
        annotations = objects.annotations(node)
        mark = "/metadata/annotations/" + OUT_OF_SERVICE_OWNER.replace("/", "~1")
        if wanted:
            if not annotations:
                patch.append({"op": "add", "path": "/metadata/annotations", "value": {}})
            patch.append({"op": "add", "path": mark, "value": rfc3339(self.clock.now())})
        elif OUT_OF_SERVICE_OWNER in annotations:
            patch.append({"op": "remove", "path": mark})
        try:
            await self.api.patch(NODES, None, name, patch, kind="json")
        except ApiStatusError as err:
            if err.not_found:
                return
            raise

    async def _announce(self, node: dict[str, Any], reason: str, message: str) -> None:
        type_ = WARNING if reason.endswith("Refused") else NORMAL
        await self.manager.events.record({"apiVersion": "v1", "kind": "Node", **node}, type_, reason, message)


def _warning(condition: RawCondition) -> bool:
    """A node back Ready mid-purge warns as Degraded does (an Event when it turns True)."""
    if condition.get("type") == "PurgeInterrupted":
        return condition.get("status") == "True"
    return warning(condition)


def scaled_ref(entry: ScaledResource) -> ResourceRef:
    if entry.api_version == "apps/v1" and entry.kind == "Deployment":
        return DEPLOYMENTS
    if entry.api_version == "apps/v1" and entry.kind == "StatefulSet":
        return STATEFULSETS
    group, _, version = entry.api_version.rpartition("/")
    return ResourceRef(group, version, str(entry.resource), entry.kind)


def _policy(_: dict[str, Any]) -> list[str]:
    return [POLICY_NAME]


WATCHED_NAMESPACES = tuple(
    MaintenancePolicySpec.model_fields[name]
    for name in ("minio_namespace", "rook_namespace", "kotsadm_namespace", "host_task_namespace")
)
"""The policy's fields naming namespaces whose pods' status a pass reads (MinIO's replicas,
Rook's toolbox, kotsadm, the host tasks)."""


def read_whole_in(policies: Callable[[], Iterable[dict[str, Any]]]) -> ChangeFilter:
    """A pod or claim update wakes node maintenance when it changed more than its status, or
    where a pass reads the status too: the namespaces a policy names (``WATCHED_NAMESPACES``),
    kube-system (kubeadm's static pods) and the certificate renewal pods. Of any other pod a
    pass reads only metadata and spec (its node, its deletion, its claims), so the status
    updates of every workload's pods (an etcd member's four on its way to Ready) woke it for
    nothing (issue 28: about 30 passes per etcd create, as many as etcd's own)."""

    def matters(old: dict[str, Any], new: dict[str, Any]) -> bool:
        if objects.changed_beyond_status(old, new) or certrotation_act.task_index(new):
            return True
        namespace = objects.namespace(new)
        if namespace == kubeadm.KUBE_SYSTEM:
            return True
        for policy in policies():
            spec = policy.get("spec") or {}
            if any(namespace == (spec.get(str(f.alias)) or f.default) for f in WATCHED_NAMESPACES):
                return True
        return False

    return matters


def register(manager: Manager, deps: Deps) -> None:
    reconciler = NodeMaintenanceReconciler(manager, deps)
    controller = Controller("maintenance", POLICIES, reconciler.reconcile, workers=1)
    controller.watch(NODES, _policy)
    pod_matters = read_whole_in(reconciler.policies.list)
    controller.watch(PODS, _policy, matters=pod_matters)
    controller.watch(CLAIMS, _policy, matters=pod_matters)
    controller.watch(STATEFULSETS, _policy)  # MinIO's StatefulSet coming up, kotsadm's database
    controller.watch(DAEMONSETS, _policy, InformerOptions(label_selector=WRITER_SELECTOR))
    manager.add_controller(controller)
