"""The EtcdCluster controller, on the shared reconcile (``runtime.reconciler``): observe
(caches and etcd), plan (``cluster_planner``, or ``recovery`` while a rebuild runs), act one
step, record once.

Nothing lives in memory between passes: the pods (with the member ID each became),
the claims, the etcd membership and the status (next member index, when each
member was first seen unhealthy) are all the controller knows, so a restarted
operator plans the same next step as the one that stopped.

Every pass ends in one record: ``status.status(seen, step, now, failure)``. A step whose
act depends on progress recorded first (a member index, a rebuild's seed) records that
same status before acting (``status.needs_intent``); the record after the act then writes
nothing unless the act failed.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from kustos.api.etcd import EtcdCluster
from kustos.etcd import (
    cluster_planner,
    disruption,
    evictions,
    membership,
    network,
    planner,
    published,
    webhook,
)
from kustos.etcd.authsync import AuthSync, root_credentials
from kustos.etcd.certs import FINGERPRINT_ANNOTATION, operator_certificates, user_fingerprint
from kustos.etcd.client import CREDENTIALS, LearnerNotReady
from kustos.etcd.cluster_planner import Blocked, StartAdoption, StartRebuild
from kustos.etcd.observe import EtcdView, Observer, adoption_answers
from kustos.etcd.planner import Observed
from kustos.etcd.pods import (
    CLUSTER_LABEL,
    MEMBER_ID_ANNOTATION,
    MEMBER_LABEL,
    VERSION_ANNOTATION,
    claim_name,
    disruption_budget,
    image,
    member_pod,
    member_urls,
    services,
    submit_pod,
)
from kustos.etcd.rebuild import Rebuilder, RebuildSeen, rebuild_step, requested_recovery
from kustos.etcd.resources import ETCDBACKUPS, ETCDCLUSTERS
from kustos.etcd.status import (
    ClusterStep,
    Rebuild,
    Seen,
    Unobserved,
    invalid_spec_notes,
    needs_intent,
    status,
)
from kustos.etcd.status import notes as status_notes
from kustos.etcd.stuck import LOG_TAIL, Stuck, classify, volume_stuck, with_log
from kustos.etcd.versions import creation_version, rollback, target_version, version_refusal
from kustos.images import configured_agent_image
from kustos.runtime import faults, objects
from kustos.runtime.controller import Controller, Result, label_keys
from kustos.runtime.deps import Deps
from kustos.runtime.errors import ReconcileError
from kustos.runtime.events import NORMAL, WARNING
from kustos.runtime.expectations import Expectations
from kustos.runtime.informer import InformerOptions
from kustos.runtime.manager import Manager
from kustos.runtime.reconciler import FamilyReconciler, InvalidSpec, previous_with_failure
from kustos.runtime.record import Note
from kustos.runtime.resources import (
    CLAIMS,
    DISRUPTION_BUDGETS,
    NETWORK_POLICIES,
    NODES,
    PODS,
    SECRETS,
    SERVICES,
)  # fmt: skip
from kustos.runtime.steps import Done, Wait

log = logging.getLogger(__name__)

Obj = dict[str, Any]


STEADY_RESYNC = 10.0
AFTER_STEP = 0.2
RESTORE_WAIT = 10.0
ADOPTION_WAIT = 5.0


@dataclass(frozen=True)
class Pass:
    """What a pass observed: the status inputs (``Seen``) and the planner's input, either a
    rebuild under way (``rebuild``) or ``cluster_planner``'s (``planned``)."""

    raw: Obj
    seen: Seen
    now: datetime
    planned: cluster_planner.ClusterObserved | None = None
    rebuild: RebuildSeen | None = None


class EtcdClusterReconciler(FamilyReconciler[EtcdCluster, Pass, ClusterStep]):
    model = EtcdCluster
    failure_condition = "Progressing"
    announce = ()  # every Event is a note (``status.notes``): one per change, not per condition

    def __init__(self, manager: Manager, deps: Deps, agent_image: str | None = None) -> None:
        super().__init__(manager, deps)
        self.clusters = self.cache
        self.backups = manager.informer(ETCDBACKUPS)
        self.pods = manager.informer(PODS, InformerOptions(label_selector=CLUSTER_LABEL))
        self.nodes = manager.informer(NODES)
        self.services = manager.informer(SERVICES)
        self.secrets = manager.informer(SECRETS, InformerOptions(label_selector=CLUSTER_LABEL))
        self.claims = manager.informer(CLAIMS, InformerOptions(label_selector=MEMBER_LABEL))
        self.budgets = manager.informer(DISRUPTION_BUDGETS, InformerOptions(label_selector=CLUSTER_LABEL))
        self.policies = manager.informer(NETWORK_POLICIES, InformerOptions(label_selector=CLUSTER_LABEL))
        self.operator_peer = network.operator_peer(os.environ)
        self.certs = operator_certificates(manager)  # its client files: a temp dir removed at exit
        self.observer = Observer(self.pods, self.nodes, self.claims, self.certs)
        # Pods created by a pass and not yet delivered by the pods informer: no pass plans without them.
        self.expected = Expectations(self.clock)
        self.pods.add_handler(self._saw_pod)
        self.auth = AuthSync(self.api, self.secrets, self.backups, self.event)
        self.rebuilder = Rebuilder(
            self.api, self.observer, self.backups, self.event, agent_image or configured_agent_image(),
            self.expected,
        )  # fmt: skip
        # Within one pass (a key is never reconciled twice at once): what ``act`` learnt that the
        # base's record and requeue need, the status recorded as the step's intent and when to
        # look again (an etcd refusal asks sooner, a wait as long as it said).
        self._intents: dict[str, Obj | None] = {}  # None: the intent could not be recorded
        self._look_again: dict[str, float] = {}

    def _saw_pod(self, _kind: str, pod: dict[str, Any], _old: dict[str, Any] | None) -> None:
        cluster = objects.labels(pod).get(CLUSTER_LABEL)
        if cluster is not None:
            self.expected.seen(f"{objects.namespace(pod)}/{cluster}", objects.name(pod))

    # ---- reconcile ---------------------------------------------------------------------

    async def reconcile(self, key: str) -> Result | None:
        raw = self.fetch(key)
        if raw is None or objects.deleting(raw):
            self.forget(key)
            self.expected.forget(key)
            self.observer.credentials.pop(key, None)
            CREDENTIALS.forget(key)
            self.manager.observations.forget_etcd(*key.split("/", 1))
            return None  # owner references take everything it owned along
        unseen = self.expected.unseen(key)
        if unseen:  # the pod's own watch event wakes this cluster again
            log.debug("waiting for the pods cache to show %s", ", ".join(unseen))
            return Result(requeue_after=1.0)
        return await super().reconcile(key)

    async def observe(self, cluster: EtcdCluster, now: datetime) -> Pass:
        """The Services and NetworkPolicy first (cheap, and members need them), then etcd as
        root, and what the planner of this pass reads: a rebuild's, or the cluster's."""
        key = objects.key(cluster)
        self._intents.pop(key, None)  # a pass that ended in a bug left them: never carried over
        self._look_again.pop(key, None)
        raw = self.fetch(key) or cluster.model_dump(by_alias=True)
        await self._ensure_services(cluster)
        await self._ensure_network_policy(cluster)
        # Before anything asks etcd: with authentication on, every client logs in as root.
        credentials = root_credentials(await self.auth.identity(cluster, now))
        self.observer.credentials[key] = credentials
        seen = Seen(dict(raw.get("status") or {}), objects.generation(raw), cluster,
                    stuck=await self._stuck(cluster, now))  # fmt: skip
        rebuild = cluster.status.recovery if cluster.status else None
        if rebuild is not None and rebuild.phase == "Running":
            return Pass(raw, seen, now, rebuild=await self.rebuilder.observe(cluster, rebuild, now))
        observed, etcd, client_urls = await self.observer.observe(cluster, now)
        self._publish(cluster, etcd)
        adoption = (
            await adoption_answers(cluster.spec.adopt.endpoints)
            if cluster.spec.adopt is not None and cluster_planner.needs_adoption_check(cluster, observed)
            else None
        )
        planned = cluster_planner.ClusterObserved(
            cluster, observed, now, requested_recovery(raw),
            self.rebuilder.survivors(observed, etcd, client_urls), self.rebuilder.backups_of(cluster),
            adoption,
        )  # fmt: skip
        seen = replace(seen, observed=observed, etcd=etcd, client_urls=client_urls)
        return Pass(raw, seen, now, planned=planned)

    def plan(self, observed: Pass) -> ClusterStep:
        """A running rebuild's next step (``recovery``), else ``cluster_planner``'s (the start of a
        restore, an adoption or a rebuild, or the membership planner's)."""
        if observed.rebuild is not None:
            return rebuild_step(observed.rebuild)
        assert observed.planned is not None
        return cluster_planner.plan(observed.planned)

    def status(self, observed: Pass, step: ClusterStep, now: datetime, failure: ReconcileError | None) -> Obj:
        return status(observed.seen, step, now, failure)

    def unobserved(self, raw: Obj, failure: ReconcileError, now: datetime) -> Obj:
        """The status as it stood, the failure on Progressing (observedGeneration kept)."""
        seen = Seen(dict(raw.get("status") or {}), objects.generation(raw))
        return status(seen, Unobserved(), now, failure)

    def rejected(self, raw: Obj, failure: InvalidSpec, now: datetime) -> Obj:
        """The status as it stood, Degraded naming the field (Progressing would read as progress)."""
        return previous_with_failure(raw, failure, now, "Degraded")

    def requeue_after(self, observed: Pass, step: ClusterStep) -> float | None:
        return self._look_again.pop(objects.key(observed.raw), AFTER_STEP)

    async def write_status(self, raw: Obj, new: Obj, notes: list[Note]) -> None:
        """The pass's one record, onto the step's recorded intent when there was one, else onto
        the newest copy of this generation: what another writer (the maintenance controller)
        recorded meanwhile is kept. A newer spec waits for the next pass."""
        key = objects.key(raw)
        if key in self._intents and self._intents[key] is None:
            del self._intents[key]
            return  # the step's intent was refused (a conflict): the pass fails as it stood
        onto = self._intents.pop(key, None)
        if onto is None:
            onto = raw
            fresh = self.fetch(key)
            if (
                fresh is not None
                and fresh is not raw
                and objects.generation(fresh) == objects.generation(raw)
            ):
                onto = fresh
                kept = (fresh.get("status") or {}).get("maintenance")
                new = {**new, "maintenance": kept} if kept is not None else {
                    k: v for k, v in new.items() if k != "maintenance"
                }  # fmt: skip
        notes = [*notes, *invalid_spec_notes(dict(raw.get("status") or {}), new)]
        await self.record_status(onto, new, notes, announce=())

    def _publish(self, cluster: EtcdCluster, etcd: EtcdView) -> None:
        """Backend sizes, alarms and leader changes for the metrics (memory, not status)."""
        namespace, name = cluster.metadata["namespace"], cluster.metadata["name"]
        board = self.manager.observations
        board.publish_etcd(namespace, name, published.observation(
            board.etcd(namespace, name), etcd, published.configured_quota(cluster)))  # fmt: skip

    async def _stuck(self, cluster: EtcdCluster, now: datetime) -> tuple[Stuck, ...]:
        """Member pods that cannot start or run, with why (a crash loop with its last log lines)."""
        namespace, found = cluster.metadata["namespace"], []
        for pod in sorted(self.observer.pods_of(cluster), key=objects.name):
            if MEMBER_LABEL not in objects.labels(pod):
                continue
            name = objects.name(pod)
            claim = (
                self.claims.get(f"{namespace}/{claim_name(name)}")
                if cluster.spec.storage.type == "pvc"
                else None
            )
            stuck = classify(pod, claim, now) or await volume_stuck(self.api, pod, now)
            if stuck is not None and stuck.container:
                try:
                    said = await self.api.logs(namespace, name, stuck.container, LOG_TAIL, stuck.previous_log)
                    stuck = with_log(stuck, said)
                except (ReconcileError, OSError) as err:  # the reason stands without its log
                    log.debug("could not read the log of %s: %s", name, err)
            if stuck is not None:
                found.append(stuck)
        return tuple(found)

    # ---- act ---------------------------------------------------------------------------

    async def _ensure_services(self, cluster: EtcdCluster) -> None:
        """Apply the Services only when missing or different: most passes write nothing."""
        for service in services(cluster):
            current = self.services.get(objects.key(service))
            if current is None or not _service_matches(current, service):
                await self.api.apply(SERVICES, service)

    async def _ensure_network_policy(self, cluster: EtcdCluster) -> None:
        """Apply the NetworkPolicy when missing or different; delete it when turned off."""
        policy = network.network_policy(cluster, self.operator_peer)
        current = self.policies.get(objects.key(policy))
        if not cluster.spec.network_policy.enabled:
            if current is not None and objects.owner_of(current, "EtcdCluster") == cluster.metadata["name"]:
                await self.api.delete(
                    NETWORK_POLICIES,
                    objects.namespace(current),
                    objects.name(current),
                    uid=objects.uid(current),
                )
        elif current is None or current.get("spec") != policy["spec"]:
            await self.api.apply(NETWORK_POLICIES, policy)

    async def _ensure_budget(
        self, cluster: EtcdCluster, observed: Observed | None, step: ClusterStep
    ) -> None:
        """Apply the PodDisruptionBudget when missing or different (``disruption.py``)."""
        shown = step.step if isinstance(step, Rebuild) else step
        pods = sum(
            1 for p in self.observer.pods_of(cluster)
            if MEMBER_LABEL in objects.labels(p) and not objects.deleting(p)
        )  # fmt: skip
        wanted = disruption.min_available(observed, shown, cluster.spec.size, pods)
        budget = disruption_budget(cluster, wanted)
        current = (self.budgets.get(objects.key(budget)) or {}).get("spec") or {}
        if any(current.get(k) != v for k, v in budget["spec"].items()):
            await self.api.apply(DISRUPTION_BUDGETS, budget)

    async def event(self, cluster: EtcdCluster, reason: str, message: str, warning: bool = False) -> None:
        await self.manager.events.record(
            cluster.model_dump(by_alias=True), WARNING if warning else NORMAL, reason, message
        )

    async def act(
        self, cluster: EtcdCluster, observed: Pass, step: ClusterStep, notes: list[Note]
    ) -> ClusterStep:
        """Carry out one step; its Events are the ones its status is worth (``status.notes``)."""
        seen, raw, key = observed.seen, observed.raw, objects.key(cluster)
        shown = step.step if isinstance(step, Rebuild) else step
        if isinstance(shown, Wait | Done):
            log.debug("planned %s", shown)
        else:
            log.info("step: %s", shown)
        notes.extend(status_notes(seen, step, status(seen, step, observed.now)))
        # Before the step: one that starts a change must find evictions already refused.
        await self._ensure_budget(cluster, seen.observed, step)
        if needs_intent(step):
            # The step's own recorded intent: a conflict here fails the pass before anything acts,
            # and nothing of the pass is recorded (a member index reserved for a member never
            # added would be skipped).
            self._intents[key] = None
            self._intents[key] = await self.record_status(raw, status(seen, step, observed.now), None)
        try:
            self._look_again[key] = await self._act(raw, cluster, seen, step)
        finally:
            faults.exit_after(type(shown).__name__)
        return step

    async def _act(self, raw: Obj, cluster: EtcdCluster, seen: Seen, step: ClusterStep) -> float:
        """Carry out one step (its status is the record's); return when to look again."""
        match step:
            case Blocked(reason=reason):
                return RESTORE_WAIT if reason == "RestoreWaiting" else ADOPTION_WAIT
            case StartAdoption():
                return AFTER_STEP
            case StartRebuild():
                await self.rebuilder.consume_request(raw)
                return AFTER_STEP
            case Rebuild():
                if requested_recovery(raw) is not None:
                    await self.rebuilder.consume_request(raw)
                    await self.event(
                        cluster, "RecoveryInProgress", "a rebuild is already under way", warning=True
                    )
                return await self.rebuilder.act(cluster, step)
            case Unobserved():  # the base's, for a failed observation: never planned
                return STEADY_RESYNC
        assert seen.observed is not None and seen.etcd is not None
        if isinstance(step, planner.QuorumLost):
            if step.refused is not None:  # asked for, but impossible: say why, and forget the request
                await self.rebuilder.consume_request(raw)
                await self.event(cluster, "RecoveryRefused", step.refused, warning=True)
        elif requested_recovery(raw) is not None:
            await self.rebuilder.consume_request(raw)
            message = "recovery was asked for, but the cluster has quorum"
            await self.event(cluster, "RecoveryNotNeeded", message, warning=True)
        return await self.act_on_members(cluster, seen.observed, seen.etcd, step)

    async def act_on_members(
        self, cluster: EtcdCluster, o: Observed, etcd: EtcdView, step: planner.Step
    ) -> float:
        """Carry out one of the planner's steps; return when to look again."""
        name = cluster.metadata["name"]
        members, tls = etcd.statuses, etcd.client_tls
        match step:
            case Done():  # the members are settled: etcd's users and roles, one step at a time
                return AFTER_STEP if await self._sync_auth(cluster, etcd) else STEADY_RESYNC
            case Wait(reason=reason, seconds=seconds):
                log.debug("waiting: %s", reason)
                return seconds
            case planner.QuorumLost(seconds=seconds):
                return seconds  # the record reports it once it has lasted QUORUM_LOSS_GRACE
            case planner.UpgradeHalted():
                return 5.0  # the record's Degraded condition (and its Event) says why
            case planner.CreateSeed(index=index):
                pod = planner.pod_name(name, index)
                peer, _ = member_urls(cluster, pod)
                await self._create_pod(cluster, o, index, "new", [(pod, peer)])
                await self.event(cluster, "SeedMemberCreated", f"created seed member {pod}")
            case planner.CreatePod(index=index):
                pod = planner.pod_name(name, index)
                # Never on the node of a member that is leaving (pods.away_from): a refused eviction
                # alone does not keep the scheduler off its node.
                leaving = [p.node for p in o.pods if p.draining and not p.deleting and p.node]
                initial = self._initial_cluster(cluster, o, pod)
                await self._create_pod(cluster, o, index, "existing", initial, avoid_nodes=leaving)
                await self.event(cluster, "MemberPodCreated", f"created pod {pod} to join the cluster")
            case planner.RecreatePod() as back:
                await self._recreate_pods(cluster, o, back.members)
            case planner.AddMember(pod=pod, peer_url=url, learner=learner):
                if await membership.add_member(members, tls, url, learner) is None:
                    return 1.0
                await self.event(
                    cluster, "MemberAdded", f"added {pod} ({url}) as a {'learner' if learner else 'voter'}"
                )
            case planner.PromoteMember(member_id=member_id, name=member):
                try:
                    if not await membership.promote(members, tls, member_id):
                        return 1.0
                except LearnerNotReady:
                    return planner.learner_look(o, member)
                await self.event(cluster, "MemberPromoted", f"promoted {member} to a voting member")
            case planner.UpdatePeerURL(member_id=member_id, peer_url=url):
                if not await membership.update_peer_url(members, tls, member_id, url):
                    return 1.0
                await self.event(cluster, "MemberPeerURLUpdated", f"member {member_id:x} now at {url}")
            case planner.RemoveMember(member_id=member_id, name=member, reason=reason):
                if not await membership.remove(members, tls, member_id):
                    return 1.0
                await self.event(cluster, "MemberRemoved", f"removed {member} from etcd: {reason}")
            case planner.DeletePod(name=pod, uid=uid, reason=reason, force=force):
                await self.api.delete(PODS, o.namespace, pod, uid=uid, grace_seconds=0 if force else None)
                if cluster.spec.tls is not None:
                    await self.certs.forget(cluster, pod)
                await self.event(cluster, "MemberPodDeleted", f"deleted pod {pod}: {reason}")
            case planner.AnnotatePod(name=pod, member_id=member_id):
                patch = {"metadata": {"annotations": {MEMBER_ID_ANNOTATION: f"{member_id:x}"}}}
                await self.api.patch(PODS, o.namespace, pod, patch)
            case planner.EnableDowngrade(target=target):
                for action in ("VALIDATE", "ENABLE"):
                    if not await membership.downgrade(members, tls, action, target):
                        return 2.0  # etcd refused (logged); the next pass asks again
                await self.event(
                    cluster, "DowngradeEnabled",
                    f"etcd downgrade to {target} enabled: members restart on etcd {o.version} one at a time",
                )  # fmt: skip
            case planner.CancelDowngrade():
                if not await membership.downgrade(members, tls, "CANCEL"):
                    return 2.0
                message = "etcd downgrade cancelled: spec.version does not ask for one"
                await self.event(cluster, "DowngradeCancelled", message)
            case planner.ReplaceImage(name=pod, uid=uid, version=version):
                await self.api.patch(PODS, o.namespace, pod, {
                    "metadata": {"uid": uid, "annotations": {VERSION_ANNOTATION: version}},
                    "spec": {"containers": [{"name": "etcd", "image": image(cluster, version)}]},
                }, kind="strategic")  # fmt: skip
                message = f"restarting {pod} in place on etcd {version}, keeping its data"
                await self.event(cluster, "MemberRollingBack", message)
            case planner.DeleteClaim(name=claim, pod=pod, uid=uid):
                await self.api.delete(CLAIMS, o.namespace, claim, uid=uid)
                message = f"deleted the volume of {pod}: the member has left the cluster"
                await self.event(cluster, "MemberVolumeDeleted", message)
            case planner.MoveLeader(from_id=from_id, to_id=to_id):
                if await membership.move_leader(members, tls, to_id):
                    await self.event(
                        cluster, "LeaderMoved", f"moved leadership from {from_id:x} to {to_id:x}"
                    )
        return AFTER_STEP

    async def _sync_auth(self, cluster: EtcdCluster, etcd: EtcdView) -> bool:
        """One step of spec.auth through the leader; True when it took one."""
        leader = next((url for url, s in etcd.statuses.items() if s.is_leader), None)
        if leader is None:
            return False
        return await self.auth.sync(cluster, leader, etcd.client_tls, self.clock.now())

    def _initial_cluster(self, cluster: EtcdCluster, o: Observed, pod: str) -> list[tuple[str, str]]:
        """The started members, and the new one under the URL it will advertise."""
        peer, _ = member_urls(cluster, pod)
        entries = [(pod, peer)]
        for m in o.members or ():
            if m.name and m.name != pod:
                entries.append((m.name, m.peer_url))
        return entries

    async def _create_pod(
        self,
        cluster: EtcdCluster,
        o: Observed,
        index: int,
        state: str,
        initial_cluster: list[tuple[str, str]],
        avoid_nodes: Sequence[str] = (),
        member_id: int | None = None,
    ) -> None:
        epoch = cluster.status.epoch if cluster.status else 0
        version = creation_version(cluster, planner.rolling_back(o), o.version)
        manifest = member_pod(cluster, index, state, initial_cluster, version, epoch, avoid_nodes, member_id)
        if cluster.spec.tls is not None and cluster.spec.tls.secrets is not None:
            fingerprint = await self._user_tls_fingerprint(cluster)
            if fingerprint is not None:
                manifest["metadata"]["annotations"][FINGERPRINT_ANNOTATION] = fingerprint
        on_volume = any(c.pod == manifest["metadata"]["name"] for c in o.claims)
        await submit_pod(self.api, cluster, manifest, self.expected, claim_exists=on_volume)

    async def _recreate_pods(
        self, cluster: EtcdCluster, o: Observed, members: Sequence[tuple[str, int]]
    ) -> None:
        """Each member's pod, on its volume, all at once: after a lost quorum the members elect a
        leader only once enough of them run, and a second pod created after the first's create
        and Event started its etcd 0.1 s later (issue 28). Every create is made, each pod made gets
        its Event, then the first failure raises."""

        async def one(pod: str, member_id: int) -> None:
            at = planner.pod_index(cluster.metadata["name"], pod)
            assert at is not None
            initial = self._initial_cluster(cluster, o, pod)
            await self._create_pod(cluster, o, at, "existing", initial, member_id=member_id)

        outcomes = await asyncio.gather(
            *(one(pod, member_id) for pod, member_id in members), return_exceptions=True
        )
        for (pod, _), outcome in zip(members, outcomes, strict=True):
            if outcome is None:
                await self.event(cluster, "MemberPodRecreated", f"recreated pod {pod} on its volume")
        for outcome in outcomes:
            if isinstance(outcome, BaseException):
                raise outcome

    async def _user_tls_fingerprint(self, cluster: EtcdCluster) -> str | None:
        """Which contents of the user's TLS Secrets a new member starts with (None: not
        there yet; the member waits for them and is fingerprinted once it runs)."""
        secrets = cluster.spec.tls.secrets if cluster.spec.tls else None
        assert secrets is not None
        namespace = cluster.metadata["namespace"]
        peer = await self.api.get(SECRETS, namespace, secrets.peer)
        server = await self.api.get(SECRETS, namespace, secrets.server)
        return user_fingerprint(peer, server) if peer and server else None


def _service_matches(current: dict[str, Any], desired: dict[str, Any]) -> bool:
    spec, want = current.get("spec") or {}, desired["spec"]
    ports = [(p.get("name"), p.get("port")) for p in spec.get("ports") or []]
    annotations = current["metadata"].get("annotations") or {}
    return (
        spec.get("type", "ClusterIP") == want.get("type", "ClusterIP")
        and spec.get("selector") == want["selector"]
        and ports == [(p["name"], p["port"]) for p in want["ports"]]
        and all(annotations.get(k) == v for k, v in (desired["metadata"].get("annotations") or {}).items())
    )


def claim_change_matters(old: Obj, new: Obj) -> bool:
    """What a pass reads of a member volume: its labels (cluster, member, epoch), its phase (one
    left Pending says why its member cannot start: ``stuck``) and its deletion. A new volume's other
    updates (the scheduler's selected node, the binder's volume name and bind annotations, two per
    member on a WaitForFirstConsumer class) change none of that, and each cost a pass."""

    def read(claim: Obj) -> tuple[Any, ...]:
        meta = claim.get("metadata") or {}
        return meta.get("labels"), meta.get("deletionTimestamp"), (claim.get("status") or {}).get("phase")

    return read(old) != read(new)


def _clusters_on_node(reconciler: EtcdClusterReconciler) -> Any:
    """A Node change wakes every cluster with a member on that node (the pods-by-node index)."""
    index = reconciler.pods.index_by_node_name()

    def keys(node: dict[str, Any]) -> list[str]:
        pods = reconciler.pods.by_index(index, objects.name(node))
        return sorted({f"{objects.namespace(p)}/{objects.labels(p)[CLUSTER_LABEL]}" for p in pods})

    return keys


def _clusters_of_backup(reconciler: EtcdClusterReconciler) -> Any:
    """A backup wakes its own cluster and every cluster waiting to be restored from it."""

    def keys(backup: dict[str, Any]) -> list[str]:
        namespace, name = objects.namespace(backup), objects.name(backup)
        owner = (backup.get("spec") or {}).get("clusterName")
        waiting = [
            objects.name(c) for c in reconciler.clusters.list()
            if objects.namespace(c) == namespace
            and ((c.get("spec") or {}).get("restore") or {}).get("backup") == name
        ]  # fmt: skip
        return sorted({f"{namespace}/{c}" for c in [owner, *waiting] if c})

    return keys


def register(manager: Manager, deps: Deps) -> None:
    reconciler = EtcdClusterReconciler(manager, deps)
    # Every pass ends in a requeue (or a failure's backoff): its own status write need not wake it.
    controller = Controller(
        "etcdcluster", ETCDCLUSTERS, reconciler.reconcile, workers=4, wakes_on_own_status=False
    )
    controller.watch(PODS, label_keys(CLUSTER_LABEL), InformerOptions(label_selector=CLUSTER_LABEL))
    # A pass reads the spec of its Services and budget, never their status: the disruption
    # controller rewrites the budget's status each time a member pod's readiness or the budget's
    # minAvailable changes, and a rewrite arriving alone cost a pass with a round of questions
    # to every member (issue 28).
    controller.owns(SERVICES, matters=objects.changed_beyond_status)
    controller.owns(CLAIMS, InformerOptions(label_selector=MEMBER_LABEL), claim_change_matters)
    controller.owns(
        DISRUPTION_BUDGETS, InformerOptions(label_selector=CLUSTER_LABEL), objects.changed_beyond_status
    )
    controller.owns(NETWORK_POLICIES, InformerOptions(label_selector=CLUSTER_LABEL))
    controller.watch(SECRETS, label_keys(CLUSTER_LABEL), InformerOptions(label_selector=CLUSTER_LABEL))
    controller.watch(NODES, _clusters_on_node(reconciler))
    controller.watch(ETCDBACKUPS, _clusters_of_backup(reconciler))
    manager.add_controller(controller)
    webhook.register(manager, deps)  # admission for what the schema cannot say (F-OPS-2)
    evictions.register(manager, deps)  # evictions asked of members: they move (issue 21)


__all__ = [
    "ETCDBACKUPS", "ETCDCLUSTERS", "EtcdClusterReconciler", "claim_name", "creation_version", "register",
    "rollback", "target_version", "version_refusal",
]  # fmt: skip
