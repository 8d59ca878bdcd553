"""The EtcdCluster controller: observe (caches and etcd), plan (planner.plan), act one step, record.

Nothing lives in memory between passes: the pods (with the member ID each became),
the claims, the etcd membership and the status (next member index, when each
member was first seen unhealthy) are all the controller knows, so a restarted
operator plans the same next step as the one that stopped.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

from pydantic import ValidationError

from kustos.api.backup import EtcdBackup
from kustos.api.etcd import AdoptionStatus, EtcdCluster, EtcdClusterStatus, MemberStatus
from kustos.etcd import planner, recovery
from kustos.etcd.certs import (
    FINGERPRINT_ANNOTATION,
    SECRETS,
    ClusterTLS,
    operator_certificates,
    user_fingerprint,
)
from kustos.etcd.client import EtcdClient, EtcdError, EtcdTLS, LearnerNotReady, MemberList, Status
from kustos.etcd.planner import ClaimView, MemberView, Observed, PodView, Step
from kustos.etcd.pods import (
    CLUSTER_LABEL,
    MEMBER_ID_ANNOTATION,
    MEMBER_LABEL,
    VERSION_ANNOTATION,
    claim_name,
    current_version,
    image,
    member_claim,
    member_pod,
    member_urls,
    pod_epoch,
    services,
)
from kustos.etcd.rebuild import Rebuilder, requested_recovery
from kustos.etcd.versions import agreed_version, image_version, rollback_target, upgrade_refusal
from kustos.images import configured_agent_image
from kustos.runtime import faults
from kustos.runtime.api import ApiStatusError
from kustos.runtime.conditions import get_condition, set_condition
from kustos.runtime.controller import Controller, Result, label_keys
from kustos.runtime.events import NORMAL, WARNING
from kustos.runtime.informer import InformerOptions, ResourceRef
from kustos.runtime.manager import Manager
from kustos.runtime.resources import CLAIMS, NODES, PODS, SERVICES
from kustos.runtime.times import parse_duration, parse_rfc3339, rfc3339

log = logging.getLogger(__name__)

ETCDCLUSTERS = ResourceRef(EtcdCluster.crd.group, EtcdCluster.crd.version, "etcdclusters", "EtcdCluster")
ETCDBACKUPS = ResourceRef(EtcdBackup.crd.group, EtcdBackup.crd.version, "etcdbackups", "EtcdBackup")

Phase = Literal["Creating", "Running", "Scaling", "Upgrading", "Recovering", "QuorumLost", "Failed"]

STEADY_RESYNC = 10.0
# A member that is merely slow to answer must not make a healthy cluster look lost:
# quorum loss is reported once it has been observed for this long.
QUORUM_LOSS_GRACE = timedelta(seconds=5)
AFTER_STEP = 0.2
STATUS_TIMEOUT = 2.0


@dataclass
class EtcdView:
    """What etcd itself said this pass."""

    members: MemberList | None
    statuses: dict[str, Status]  # by client URL: members that answered without errors
    answered: dict[str, Status]  # by client URL: every member that answered, with a leader or not
    tls: ClusterTLS | None = None  # spec.tls: how to connect, and the certificates to record

    @property
    def client_tls(self) -> EtcdTLS | None:
        return self.tls.client if self.tls is not None else None


def _pod_running(pod: dict[str, Any]) -> bool:
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    return any("running" in (s.get("state") or {}) for s in statuses)


def _running_since(pod: dict[str, Any]) -> datetime | None:
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    started = [((s.get("state") or {}).get("running") or {}).get("startedAt") for s in statuses]
    moments = [m for m in (parse_rfc3339(s) for s in started if s) if m is not None]
    return max(moments) if moments else None


def _pod_ready(pod: dict[str, Any]) -> bool:
    return any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in (pod.get("status") or {}).get("conditions") or []
    )


def _node_lost(node: dict[str, Any] | None) -> bool:
    if node is None:
        return True
    ready = next(
        (c for c in node.get("status", {}).get("conditions") or [] if c.get("type") == "Ready"), None
    )
    return ready is None or ready.get("status") != "True"


class EtcdClusterReconciler:
    resource = ETCDCLUSTERS

    def __init__(self, manager: Manager, agent_image: str | None = None) -> None:
        self.manager = manager
        self.api = manager.api
        self.clusters = manager.informer(ETCDCLUSTERS)
        self.backups = manager.informer(ETCDBACKUPS)
        self.pods = manager.informer(PODS, InformerOptions(label_selector=CLUSTER_LABEL))
        self.nodes = manager.informer(NODES)
        self.services = manager.informer(SERVICES)
        self.rebuilder = Rebuilder(self, agent_image or configured_agent_image())
        self.secrets = manager.informer(SECRETS, InformerOptions(label_selector=CLUSTER_LABEL))
        self.claims = manager.informer(CLAIMS, InformerOptions(label_selector=MEMBER_LABEL))
        self.certs = operator_certificates(manager)  # its client files: a temp dir removed at exit

    # ---- observe -----------------------------------------------------------------------

    def skeleton(self, cluster: EtcdCluster) -> Observed:
        """What addressing needs (URLs of pods), without pods or members."""
        status = cluster.status or EtcdClusterStatus()
        spec = cluster.spec
        return Observed(
            cluster=cluster.metadata["name"], namespace=cluster.metadata["namespace"], size=spec.size,
            addressing=spec.addressing, storage=status.storage_type or spec.storage.type,
            failure_timeout=parse_duration(spec.member_failure_timeout), now=datetime.now(UTC),
            tls=spec.tls is not None,
        )  # fmt: skip

    @staticmethod
    def target_version(cluster: EtcdCluster) -> str:
        return target_version(cluster)

    def pods_of(self, cluster: EtcdCluster) -> list[dict[str, Any]]:
        namespace, name = cluster.metadata["namespace"], cluster.metadata["name"]
        return [
            p for p in self.pods.list()
            if p["metadata"].get("namespace") == namespace
            and (p["metadata"].get("labels") or {}).get(CLUSTER_LABEL) == name
        ]  # fmt: skip

    def claims_of(self, cluster: EtcdCluster) -> tuple[ClaimView, ...]:
        """The member volumes of this cluster's current epoch that are not being deleted; those of
        an earlier epoch are the user's to delete (they may hold writes a rebuild did not restore)."""
        namespace, name = cluster.metadata["namespace"], cluster.metadata["name"]
        epoch = cluster.status.epoch if cluster.status else 0
        views = []
        for claim in self.claims.list():
            meta = claim["metadata"]
            labels = meta.get("labels") or {}
            created = parse_rfc3339(meta.get("creationTimestamp"))
            if meta.get("namespace") != namespace or labels.get(CLUSTER_LABEL) != name:
                continue
            if pod_epoch(claim) == epoch and created is not None and not meta.get("deletionTimestamp"):
                views.append(ClaimView(meta["name"], labels[MEMBER_LABEL], meta["uid"], created))
        return tuple(views)

    def pod_view(self, cluster: EtcdCluster, pod: dict[str, Any]) -> PodView | None:
        meta = pod["metadata"]
        index = planner.pod_index(cluster.metadata["name"], meta["name"])
        if index is None:
            return None
        annotations = meta.get("annotations") or {}
        member_id = annotations.get(MEMBER_ID_ANNOTATION)
        node_name = (pod.get("spec") or {}).get("nodeName")
        containers = (pod.get("spec") or {}).get("containers") or [{}]
        version = annotations.get(VERSION_ANNOTATION) or image_version(containers[0].get("image", ""))
        return PodView(
            name=meta["name"],
            index=index,
            uid=meta.get("uid", ""),
            ip=(pod.get("status") or {}).get("podIP"),
            deleting=bool(meta.get("deletionTimestamp")),
            running=_pod_running(pod),
            ready=_pod_ready(pod),
            member_id=int(member_id, 16) if member_id else None,
            node_lost=bool(node_name) and _node_lost(self.nodes.get(str(node_name))),
            version=version,
            running_since=_running_since(pod),
        )

    async def _ask_etcd(self, urls: list[str], tls: EtcdTLS | None = None) -> EtcdView:
        """Status of every member that answers, and the membership from one that can say."""

        async def status(url: str) -> tuple[str, Status | None]:
            try:
                async with EtcdClient(url, tls, timeout=STATUS_TIMEOUT) as client:
                    return url, await client.status()
            except (EtcdError, OSError, TimeoutError):
                return url, None

        answers = await asyncio.gather(*(status(u) for u in urls))
        answered = {url: s for url, s in answers if s is not None}
        statuses = {url: s for url, s in answered.items() if not s.errors}
        members: MemberList | None = None
        for url in sorted(statuses, key=lambda u: statuses[u].is_learner):
            try:
                async with EtcdClient(url, tls, timeout=STATUS_TIMEOUT) as client:
                    members = await client.member_list()
                break
            except (EtcdError, OSError, TimeoutError):
                continue
        return EtcdView(members, statuses, answered)

    async def observe(self, cluster: EtcdCluster, now: datetime) -> tuple[Observed, EtcdView, dict[str, str]]:
        """The planner's input, what etcd said, and each pod's client URL."""
        status = cluster.status or EtcdClusterStatus()
        spec = cluster.spec
        # Pods of an earlier epoch belong to a cluster that a rebuild replaced (and deleted).
        pod_objects = [p for p in self.pods_of(cluster) if pod_epoch(p) == status.epoch]
        views = [v for p in pod_objects if (v := self.pod_view(cluster, p)) is not None]
        certs: ClusterTLS | None = None
        if spec.tls is not None:
            member_pods = [p for p in pod_objects if p["metadata"]["name"] in {v.name for v in views}]
            certs = await self.certs.reconcile(cluster, member_pods, now)
            views = [replace(v, tls_stale=certs.stale.get(v.name)) for v in views]
        skeleton = self.skeleton(cluster)
        client_urls = {
            v.name: url
            for v in views
            if not v.deleting and (url := planner.client_url(skeleton, v)) is not None
        }
        adoption = status.adoption if status.adoption and status.adoption.phase == "Migrating" else None
        # An adopted cluster's original members are asked too, until they have all left.
        external = [u for u in (adoption.endpoints if adoption else []) if u not in client_urls.values()]
        etcd = await self._ask_etcd([*client_urls.values(), *external], certs.client if certs else None)
        etcd.tls = certs
        members: tuple[MemberView, ...] | None = None
        if etcd.members is not None:
            leader_ids = {s.leader_id for s in etcd.statuses.values()}
            healthy_ids = {s.member_id for s in etcd.statuses.values()}
            said = {s.member_id: s for s in etcd.answered.values()}
            # A silent leader gives 0 (no lag): the cluster is then unhealthy, and nothing rolls.
            leader_index = max((s.raft_index for s in etcd.statuses.values() if s.is_leader), default=0)
            members = tuple(
                MemberView(
                    id=m.id,
                    name=m.name,
                    peer_url=m.peer_urls[0] if m.peer_urls else "",
                    learner=m.is_learner,
                    healthy=m.id in healthy_ids,
                    leader=m.id in leader_ids and len(leader_ids) == 1,
                    version=said[m.id].version if m.id in said else "",
                    storage_version=said[m.id].storage_version if m.id in said else "",
                    lag=max(0, leader_index - said[m.id].raft_applied_index) if m.id in said else 0,
                )
                for m in etcd.members.members
            )
        previous = {m.name: parse_rfc3339(m.unhealthy_since) for m in status.members}
        unhealthy_since: dict[str, datetime] = {}
        for m in members or ():
            key = m.name or m.peer_url
            if not m.healthy:
                unhealthy_since[key] = previous.get(key) or now
        observed = Observed(
            cluster=skeleton.cluster, namespace=skeleton.namespace, size=spec.size,
            addressing=spec.addressing, storage=skeleton.storage, failure_timeout=skeleton.failure_timeout,
            now=now, pods=tuple(views), members=members, next_index=status.next_member_index,
            ever_formed=bool(status.cluster_id), unhealthy_since=unhealthy_since,
            version=target_version(cluster),
            recorded_members=tuple((m.name, int(m.id, 16)) for m in status.members if m.name and m.id),
            external_ids=frozenset(int(i, 16) for i in (adoption.external_members if adoption else [])),
            tls=skeleton.tls, rollback=rollback(cluster),
            downgrade_enabled=any(s.downgrade_enabled for s in etcd.statuses.values()),
            claims=self.claims_of(cluster),
        )  # fmt: skip
        return observed, etcd, client_urls

    # ---- reconcile ---------------------------------------------------------------------

    async def reconcile(self, key: str) -> Result | None:
        raw = self.clusters.get(key)
        if raw is None or raw["metadata"].get("deletionTimestamp"):
            return None  # owner references take everything it owned along
        try:
            cluster = EtcdCluster.model_validate(raw)
        except ValidationError as err:
            await self._reject(raw, f"invalid spec: {err}")
            return None
        await self._ensure_services(cluster)
        if cluster.spec.size % 2 == 0:
            await self.event(
                cluster, "EvenSize",
                f"size {cluster.spec.size} tolerates no more failures than size {cluster.spec.size - 1}",
                warning=True,
            )  # fmt: skip
        refusal = version_refusal(cluster)
        if refusal is not None:
            await self.event(cluster, "UpgradeRefused", refusal, warning=True)
        rebuild = cluster.status.recovery if cluster.status else None
        if rebuild is not None and rebuild.phase == "Running":
            return Result(requeue_after=await self.rebuilder.reconcile(raw, cluster, rebuild))
        now = datetime.now(UTC)
        observed, etcd, client_urls = await self.observe(cluster, now)
        step = planner.plan(observed)
        if cluster.spec.restore is not None and isinstance(step, planner.CreateSeed):
            return await self._start_restore(raw, cluster)
        if cluster.spec.adopt is not None and isinstance(step, planner.CreateSeed):
            return await self._start_adoption(raw, cluster)
        if isinstance(step, planner.QuorumLost):
            started, step = await self._consider_recovery(
                raw, cluster, observed, etcd, client_urls, step, now
            )
            if started:
                return Result(requeue_after=AFTER_STEP)
        elif requested_recovery(raw) is not None:
            await self.rebuilder.consume_request(raw)
            message = "recovery was asked for, but the cluster has quorum"
            await self.event(cluster, "RecoveryNotNeeded", message, warning=True)
        if isinstance(step, planner.Wait | planner.Done):
            log.debug("planned %s", step)
        else:
            log.info("step: %s", step)
        requeue = await self.act(cluster, observed, etcd, step)
        faults.exit_after(type(step).__name__)
        await self._record(raw, cluster, observed, etcd, client_urls, step, now)
        return Result(requeue_after=requeue)

    async def _start_restore(self, raw: dict[str, Any], cluster: EtcdCluster) -> Result:
        """A new cluster with spec.restore: its seed is rebuilt from the backup."""
        assert cluster.spec.restore is not None
        name = cluster.spec.restore.backup
        backups = self.rebuilder.candidates(self.rebuilder.backups_of(cluster, any_cluster=True))
        source = recovery.choose_source([], backups, ("backup", name))
        if isinstance(source, str):
            await self.event(cluster, "RestoreWaiting", f"{source}; waiting for it", warning=True)
            await self._reject(raw, f"spec.restore: {source}", reason="RestoreWaiting")
            return Result(requeue_after=10.0)
        status = cluster.status or EtcdClusterStatus()
        await self.rebuilder.start(raw, cluster, source, "spec.restore", epoch=status.epoch)
        return Result(requeue_after=AFTER_STEP)

    async def _start_adoption(self, raw: dict[str, Any], cluster: EtcdCluster) -> Result:
        """Check the cluster to adopt (one cluster ID, a leader, an acceptable version) and
        record its members as the original ones; the planner then replaces them one by one."""
        assert cluster.spec.adopt is not None
        verdict = await adoption_check(cluster.spec.adopt.endpoints, cluster.spec.version)
        if isinstance(verdict, str):
            await self.event(cluster, "AdoptionWaiting", verdict, warning=True)
            await self._reject(raw, f"spec.adopt: {verdict}", reason="AdoptionWaiting")
            return Result(requeue_after=5.0)
        members, version = verdict
        status = dict(raw.get("status") or {})
        status.update({
            "clusterId": f"{members.cluster_id:x}", "currentVersion": version,
            "storageType": cluster.spec.storage.type, "phase": "Scaling",
            "adoption": AdoptionStatus(
                external_members=[f"{m.id:x}" for m in members.members],
                endpoints=sorted({u for m in members.members for u in m.client_urls}),
                started_at=rfc3339(datetime.now(UTC)),
            ).model_dump(by_alias=True, exclude_none=True),
        })  # fmt: skip
        await self.api.replace_status(ETCDCLUSTERS, raw, status)
        names = ", ".join(m.name or format(m.id, "x") for m in members.members)
        message = f"adopting etcd cluster {members.cluster_id:x} ({names}) on etcd {version}"
        await self.event(cluster, "AdoptionStarted", message)
        return Result(requeue_after=AFTER_STEP)

    async def _consider_recovery(
        self, raw: dict[str, Any], cluster: EtcdCluster, o: Observed, etcd: EtcdView,
        client_urls: dict[str, str], step: planner.QuorumLost, now: datetime,
    ) -> tuple[bool, Step]:  # fmt: skip
        """Start a rebuild if a person asked for one or it is automatic and due; otherwise say
        in the QuorumLost message what a rebuild would use and how to ask for it."""
        status = cluster.status or EtcdClusterStatus()
        request = requested_recovery(raw)
        last = status.recovery
        gave_up = last is not None and last.phase == "Failed" and last.epoch > status.epoch
        available = get_condition([c.model_dump(by_alias=True) for c in status.conditions], "Available")
        lost_since = (
            parse_rfc3339(available.get("lastTransitionTime"))
            if status.phase == "QuorumLost" and available and available.get("status") == "False"
            else None
        )
        reason = recovery.should_start(
            cluster.spec.recovery.automatic and not gave_up, parse_duration(cluster.spec.recovery.delay),
            lost_since, now, request is not None,
        )  # fmt: skip
        source = self.rebuilder.choose(cluster, o, etcd, client_urls, request)
        if reason is not None and not isinstance(source, str):
            epoch = max(status.epoch, last.epoch if last else 0) + 1
            await self.rebuilder.start(raw, cluster, source, reason, epoch)
            return True, step
        if request is not None:  # asked for, but impossible: say why, and forget the request
            await self.rebuilder.consume_request(raw)
            await self.event(cluster, "RecoveryRefused", str(source), warning=True)
        name, namespace = cluster.metadata["name"], cluster.metadata["namespace"]
        if isinstance(source, str):
            hint = f"cannot rebuild: {source}"
        elif gave_up:
            hint = f"the last rebuild failed; `kustos etcd recover {name} -n {namespace}` tries again"
        elif cluster.spec.recovery.automatic:
            hint = f"rebuilding from {source.describe()} after {cluster.spec.recovery.delay}"
        else:
            hint = f"`kustos etcd recover {name} -n {namespace}` rebuilds it from {source.describe()}"
        return False, planner.QuorumLost(f"{step.message}; {hint}")

    async def _reject(self, raw: dict[str, Any], message: str, reason: str = "InvalidSpec") -> None:
        status = dict(raw.get("status") or {})
        status["conditions"] = set_condition(
            status.get("conditions"),
            "Degraded",
            True,
            reason,
            message[:1000],
            raw["metadata"].get("generation"),
        )
        await self.api.replace_status(ETCDCLUSTERS, raw, status)
        if reason == "InvalidSpec":
            await self.manager.events.record(raw, WARNING, reason, message[:500])

    async def _ensure_services(self, cluster: EtcdCluster) -> None:
        """Apply the Services only when missing or different: most passes write nothing."""
        for service in services(cluster):
            meta = service["metadata"]
            current = self.services.get(f"{meta['namespace']}/{meta['name']}")
            if current is None or not _service_matches(current, service):
                await self.api.apply(SERVICES, service)

    async def event(self, cluster: EtcdCluster, reason: str, message: str, warning: bool = False) -> None:
        await self.manager.events.record(
            cluster.model_dump(by_alias=True), WARNING if warning else NORMAL, reason, message
        )

    async def act(self, cluster: EtcdCluster, o: Observed, etcd: EtcdView, step: Step) -> float:
        """Carry out one step; return when to look again."""
        name = cluster.metadata["name"]
        match step:
            case planner.Done():
                return STEADY_RESYNC
            case planner.Wait(reason=reason, seconds=seconds):
                log.debug("waiting: %s", reason)
                return seconds
            case planner.QuorumLost():
                return 2.0  # _record reports it once it has lasted QUORUM_LOSS_GRACE
            case planner.UpgradeHalted(message=message):
                await self.event(cluster, "UpgradeHalted", message, warning=True)
                return 5.0
            case planner.CreateSeed(index=index):
                await self.reserve_index(cluster, index)
                pod = planner.pod_name(name, index)
                peer, _ = member_urls(cluster, pod)
                await self._create_pod(cluster, o, index, "new", [(pod, peer)])
                await self.event(cluster, "SeedMemberCreated", f"created seed member {pod}")
            case planner.CreatePod(index=index):
                await self.reserve_index(cluster, index)
                pod = planner.pod_name(name, index)
                await self._create_pod(
                    cluster, o, index, "existing", self._initial_cluster(cluster, o, etcd, pod)
                )
                await self.event(cluster, "MemberPodCreated", f"created pod {pod} to join the cluster")
            case planner.RecreatePod(name=pod):
                index = planner.pod_index(name, pod)
                assert index is not None
                await self._create_pod(
                    cluster, o, index, "existing", self._initial_cluster(cluster, o, etcd, pod)
                )
                await self.event(cluster, "MemberPodRecreated", f"recreated pod {pod} on its volume")
            case planner.AddMember(pod=pod, peer_url=url, learner=learner, index=index):
                if index is not None:
                    await self.reserve_index(cluster, index)
                added = await self._leader_call(etcd, lambda c: c.member_add([url], is_learner=learner))
                if added is None:
                    return 1.0
                await self.event(
                    cluster, "MemberAdded", f"added {pod} ({url}) as a {'learner' if learner else 'voter'}"
                )
            case planner.PromoteMember(member_id=member_id, name=member):
                try:
                    done = await self._leader_call(
                        etcd, lambda c: c.member_promote(member_id), raise_for=LearnerNotReady
                    )
                except LearnerNotReady:
                    return 1.0
                if done is None:
                    return 1.0
                await self.event(cluster, "MemberPromoted", f"promoted {member} to a voting member")
            case planner.UpdatePeerURL(member_id=member_id, peer_url=url):
                updated = await self._leader_call(etcd, lambda c: c.member_update(member_id, [url]))
                if updated is None:
                    return 1.0
                await self.event(cluster, "MemberPeerURLUpdated", f"member {member_id:x} now at {url}")
            case planner.RemoveMember(member_id=member_id, name=member, reason=reason):
                removed = await self._leader_call(etcd, lambda c: c.member_remove(member_id))
                if removed is None:
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
                    said = await self._leader_call(etcd, lambda c, a=action: c.downgrade(a, target))
                    if said is None:
                        return 2.0  # etcd refused (logged); the next pass asks again
                await self.event(
                    cluster, "DowngradeEnabled",
                    f"etcd downgrade to {target} enabled: members restart on etcd {o.version} one at a time",
                )  # fmt: skip
            case planner.CancelDowngrade():
                if await self._leader_call(etcd, lambda c: c.downgrade("CANCEL")) is None:
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
                moved = await self._leader_call(etcd, lambda c: c.move_leader(to_id))
                if moved is not None:
                    await self.event(
                        cluster, "LeaderMoved", f"moved leadership from {from_id:x} to {to_id:x}"
                    )
        return AFTER_STEP

    def _initial_cluster(
        self, cluster: EtcdCluster, o: Observed, etcd: EtcdView, pod: str
    ) -> list[tuple[str, str]]:
        """The started members, and the new one under the URL it will advertise."""
        peer, _ = member_urls(cluster, pod)
        entries = [(pod, peer)]
        for m in o.members or ():
            if m.name and m.name != pod:
                entries.append((m.name, m.peer_url))
        return entries

    async def reserve_index(self, cluster: EtcdCluster, index: int) -> None:
        """Record the next index before using this one: a name is never used twice."""
        current = cluster.status.next_member_index if cluster.status else 0
        if current > index:
            return
        raw = self.clusters.get(f"{cluster.metadata['namespace']}/{cluster.metadata['name']}")
        assert raw is not None
        status = dict(raw.get("status") or {})
        status["nextMemberIndex"] = index + 1
        status.setdefault("storageType", cluster.spec.storage.type)
        updated = await self.api.replace_status(ETCDCLUSTERS, raw, status)
        cluster.status = EtcdClusterStatus.model_validate(updated.get("status") or {})
        cluster.metadata["resourceVersion"] = updated["metadata"]["resourceVersion"]

    async def _create_pod(
        self,
        cluster: EtcdCluster,
        o: Observed,
        index: int,
        state: str,
        initial_cluster: list[tuple[str, str]],
    ) -> None:
        epoch = cluster.status.epoch if cluster.status else 0
        version = creation_version(cluster, planner.rolling_back(o))
        manifest = member_pod(cluster, index, state, initial_cluster, version, epoch)
        if cluster.spec.tls is not None and cluster.spec.tls.secrets is not None:
            fingerprint = await self._user_tls_fingerprint(cluster)
            if fingerprint is not None:
                manifest["metadata"]["annotations"][FINGERPRINT_ANNOTATION] = fingerprint
        await self.submit_pod(cluster, manifest)

    async def submit_pod(self, cluster: EtcdCluster, manifest: dict[str, Any]) -> None:
        """Create a member pod (and its claim first, with PVC storage); one that exists is fine."""
        if cluster.spec.storage.type == "pvc":
            claim = member_claim(cluster, manifest["metadata"]["name"], pod_epoch(manifest))
            await self.api.apply(CLAIMS, claim)
        try:
            await self.api.create(PODS, manifest)
        except ApiStatusError as err:
            if not err.conflict:
                raise

    async def _user_tls_fingerprint(self, cluster: EtcdCluster) -> str | None:
        """Which contents of the user's TLS Secrets a new member starts with (None: not
        there yet; the member waits for them and is fingerprinted once it runs)."""
        secrets = cluster.spec.tls.secrets if cluster.spec.tls else None
        assert secrets is not None
        namespace = cluster.metadata["namespace"]
        peer = await self.api.get(SECRETS, namespace, secrets.peer)
        server = await self.api.get(SECRETS, namespace, secrets.server)
        return user_fingerprint(peer, server) if peer and server else None

    async def _leader_call(self, etcd: EtcdView, call: Any, raise_for: type[Exception] | None = None) -> Any:
        """Send a membership call to the leader (or any healthy member), with a result or None."""
        urls = sorted(etcd.statuses, key=lambda u: etcd.statuses[u].member_id != etcd.statuses[u].leader_id)
        for url in urls:
            if etcd.statuses[url].is_learner:
                continue
            try:
                async with EtcdClient(url, etcd.client_tls, timeout=5.0) as client:
                    result = await call(client)
                    return result if result is not None else True
            except EtcdError as err:
                if raise_for is not None and isinstance(err, raise_for):
                    raise
                log.warning("etcd call through %s failed: %s", url, err)
        return None

    # ---- record ------------------------------------------------------------------------

    async def _record(
        self, raw: dict[str, Any], cluster: EtcdCluster, o: Observed, etcd: EtcdView,
        client_urls: dict[str, str], step: Step, now: datetime,
    ) -> None:  # fmt: skip
        fresh = self.clusters.get(f"{o.namespace}/{o.cluster}") or raw
        old = dict(fresh.get("status") or {})
        status = EtcdClusterStatus.model_validate(old) if old else EtcdClusterStatus()
        status.next_member_index = max(
            status.next_member_index, (cluster.status.next_member_index if cluster.status else 0)
        )
        status.storage_type = status.storage_type or cluster.spec.storage.type
        pods_by_name = {p.name: p for p in o.pods}
        members: list[MemberStatus] = []
        for m in o.members or ():
            name = m.name or next(
                (p.name for p in o.pods if planner.peer_url(o, p) == m.peer_url), m.peer_url
            )
            url = client_urls.get(name, "")
            st = etcd.statuses.get(url)
            since = o.unhealthy_since.get(m.name or m.peer_url)
            members.append(MemberStatus(
                name=name, id=f"{m.id:x}", pod=name if name in pods_by_name else "", peer_url=m.peer_url,
                client_url=url, healthy=m.healthy, leader=m.leader, learner=m.learner,
                version=st.version if st else "", unhealthy_since=rfc3339(since) if since else None,
            ))  # fmt: skip
        if o.members is not None:
            status.members = members
            status.size = len(members)
        if etcd.members is not None:
            status.cluster_id = f"{etcd.members.cluster_id:x}"
            if (
                status.adoption
                and status.adoption.phase == "Migrating"
                and not o.external_ids & {m.id for m in o.members or ()}
            ):
                status.adoption.phase = "Completed"
                status.adoption.completed_at = rfc3339(now)
                await self.event(
                    cluster, "AdoptionCompleted", "every original member has been replaced by a pod"
                )
        if (agreed := agreed_version(m.version for m in members)) is not None:
            status.current_version = agreed
        healthy_voters = sum(1 for m in members if m.healthy and not m.learner)
        status.ready = f"{healthy_voters}/{cluster.spec.size}"
        generation = fresh["metadata"].get("generation")
        conditions = [c.model_dump(by_alias=True, exclude_none=True) for c in status.conditions]
        lost = isinstance(step, planner.QuorumLost)
        previous = get_condition(conditions, "Available")
        since = parse_rfc3339(previous.get("lastTransitionTime")) if previous else None
        confirmed = (
            lost and previous is not None and previous.get("reason") == "QuorumLost"
            and previous.get("status") == "False" and since is not None and now - since >= QUORUM_LOSS_GRACE
        )  # fmt: skip
        gave_up = status.recovery is not None and status.recovery.phase == "Failed"
        if confirmed:
            status.phase = "Failed" if gave_up else "QuorumLost"
            await self.event(cluster, "QuorumLost", _describe(step), warning=True)
        elif not lost:
            status.phase = self._phase(cluster, o, step, healthy_voters)
        available = o.members is not None and not lost
        conditions = set_condition(conditions, "Available", available,
                                   "QuorumHealthy" if available else "QuorumLost",
                                   f"{healthy_voters} healthy voting members", generation)  # fmt: skip
        progressing = not isinstance(step, planner.Done | planner.QuorumLost)
        conditions = set_condition(conditions, "Progressing", progressing,
                                   type(step).__name__, _describe(step), generation)  # fmt: skip
        halted = isinstance(step, planner.UpgradeHalted)
        degraded = confirmed or halted or any(not m.healthy for m in members)
        reason = (
            "QuorumLost" if confirmed else "UpgradeHalted" if halted
            else "MemberUnhealthy" if degraded else "AllHealthy"
        )  # fmt: skip
        conditions = set_condition(
            conditions, "Degraded", degraded, reason, _describe(step) if degraded else "", generation
        )
        refusal = version_refusal(cluster)
        conditions = set_condition(
            conditions, "VersionAccepted", refusal is None, "UpgradeRefused" if refusal else "Accepted",
            refusal or f"etcd {cluster.spec.version}", generation,
        )  # fmt: skip
        if etcd.tls is not None:
            conditions = await self._record_tls(cluster, old, status, etcd.tls, conditions, generation)
        if old.get("currentVersion") and status.current_version != old.get("currentVersion"):
            went_down = rollback_target(old["currentVersion"], status.current_version or "") is not None
            message = f"every member runs etcd {status.current_version}"
            await self.event(cluster, "Downgraded" if went_down else "Upgraded", message)
        payload = status.model_dump(by_alias=True, exclude_none=True)
        payload["conditions"] = conditions
        payload["observedGeneration"] = generation
        if payload != old:
            with contextlib.suppress(ApiStatusError):  # a conflict: the next pass writes it
                await self.api.replace_status(ETCDCLUSTERS, fresh, payload)

    async def _record_tls(
        self, cluster: EtcdCluster, old: dict[str, Any], status: EtcdClusterStatus, certs: ClusterTLS,
        conditions: list[dict[str, Any]], generation: int | None,
    ) -> list[dict[str, Any]]:  # fmt: skip
        """Certificates in status; CertificatesIssued, CertificatesRenewed and problems as events."""
        was_renewing = bool((old.get("tls") or {}).get("renewing"))
        if certs.problem is None:
            status.tls = certs.status
        if certs.issued:
            await self.event(cluster, "CertificatesIssued", "issued " + ", ".join(certs.issued))
        if certs.stale and not was_renewing:
            reasons = sorted(set(certs.stale.values()))
            await self.event(
                cluster, "CertificatesRenewing",
                f"restarting {len(certs.stale)} member(s) one at a time onto new certificates: "
                + "; ".join(reasons),
            )  # fmt: skip
        if was_renewing and not certs.stale and certs.problem is None:
            await self.event(cluster, "CertificatesRenewed", "every member runs on a current certificate")
        if certs.problem is not None:
            await self.event(cluster, "TLSSecretInvalid", certs.problem, warning=True)
        if certs.warning is not None:
            await self.event(cluster, "CAExpiring", certs.warning, warning=True)
        return set_condition(
            conditions, "CertificatesReady", certs.problem is None,
            "SecretInvalid" if certs.problem else "Renewing" if certs.stale else "Current",
            certs.problem or (f"{len(certs.stale)} member(s) to restart" if certs.stale else "current"),
            generation,
        )  # fmt: skip

    @staticmethod
    def _phase(cluster: EtcdCluster, o: Observed, step: Step, healthy_voters: int) -> Phase:
        if not o.ever_formed or (
            cluster.status and cluster.status.phase == "Creating" and healthy_voters < o.size
        ):
            return "Creating"
        if isinstance(step, planner.Done):
            return "Running"
        if (
            any(planner.is_old_version(o, p) for p in o.pods)
            or planner.rolling_back(o)
            or isinstance(step, planner.UpgradeHalted)
        ):
            return "Upgrading"
        if (o.members is not None and any(not m.healthy for m in o.members)) or isinstance(
            step, planner.RecreatePod
        ):
            return "Recovering"
        return "Scaling" if o.members is not None and len(o.members) != o.size else "Running"


async def adoption_check(endpoints: list[str], wanted: str) -> tuple[MemberList, str] | str:
    """The membership and version of the cluster behind ``endpoints``, or why it cannot be adopted."""
    statuses: dict[str, Status] = {}
    for url in endpoints:
        try:
            async with EtcdClient(url, timeout=STATUS_TIMEOUT) as client:
                statuses[url] = await client.status()
        except (EtcdError, OSError, TimeoutError) as err:
            return f"{url} does not answer: {err}"
    if len({s.cluster_id for s in statuses.values()}) != 1:
        return "the endpoints belong to different etcd clusters"
    if any(s.errors or not s.has_leader for s in statuses.values()):
        return "the cluster has no leader or reports errors: " + "; ".join(
            f"{u}: {', '.join(s.errors) or 'no leader'}"
            for u, s in statuses.items()
            if s.errors or not s.has_leader
        )
    versions = {s.version for s in statuses.values()}
    version = min(versions, key=lambda v: tuple(int(p) for p in v.split(".") if p.isdigit()))
    refusal = upgrade_refusal(version, wanted)
    if refusal is None and rollback_target(version, wanted) is not None:
        # Adoption replaces members by new pods, and a new member of the older minor cannot join.
        refusal = f"adopt it on etcd {version} first, then roll back to {wanted}"
    if refusal is not None:
        return f"its members run etcd {', '.join(sorted(versions))}: {refusal}"
    async with EtcdClient(endpoints[0], timeout=STATUS_TIMEOUT) as client:
        members = await client.member_list()
    if any(not m.name or not m.client_urls for m in members.members):
        return "a member of it has not started (no name or client URL yet)"
    return members, version


def version_refusal(cluster: EtcdCluster) -> str | None:
    """Why spec.version cannot be rolled out from the version the members run, if it cannot."""
    current = current_version(cluster)
    return upgrade_refusal(current, cluster.spec.version)


def rollback(cluster: EtcdCluster) -> str | None:
    """The minor ("3.5") etcd's downgrade protocol takes the cluster to, if spec.version asks for it."""
    current = current_version(cluster)
    return rollback_target(current, cluster.spec.version) if current else None


def target_version(cluster: EtcdCluster) -> str:
    """The version members should run: the spec's, unless that change is refused."""
    current = current_version(cluster)
    if current and version_refusal(cluster) is not None:
        return current
    return cluster.spec.version


def creation_version(cluster: EtcdCluster, rolling_back: bool) -> str:
    """The version a (re)created member pod starts on. While a rollback is under way (a member
    still runs the newer minor) the version the cluster ran: a PVC member's data may not be
    downgraded yet, and the rollback then restarts it in place. Once every member runs the
    older minor, that one: etcd lets only such a member join."""
    current = current_version(cluster)
    return current if current and rolling_back else target_version(cluster)


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


def _describe(step: Step) -> str:
    match step:
        case planner.Wait(reason=reason):
            return reason
        case planner.QuorumLost(message=message) | planner.UpgradeHalted(message=message):
            return message
        case planner.Done():
            return "the cluster matches its spec"
    return str(step)


def _clusters_on_node(reconciler: EtcdClusterReconciler) -> Any:
    """A Node change wakes every cluster with a member on that node."""

    def keys(node: dict[str, Any]) -> list[str]:
        name = node["metadata"]["name"]
        return sorted({
            f"{p['metadata']['namespace']}/{(p['metadata'].get('labels') or {})[CLUSTER_LABEL]}"
            for p in reconciler.pods.list() if (p.get("spec") or {}).get("nodeName") == name
        })  # fmt: skip

    return keys


def _clusters_of_backup(reconciler: EtcdClusterReconciler) -> Any:
    """A backup wakes its own cluster and every cluster waiting to be restored from it."""

    def keys(backup: dict[str, Any]) -> list[str]:
        namespace, name = backup["metadata"]["namespace"], backup["metadata"]["name"]
        owner = (backup.get("spec") or {}).get("clusterName")
        waiting = [
            c["metadata"]["name"] for c in reconciler.clusters.list()
            if c["metadata"].get("namespace") == namespace
            and ((c.get("spec") or {}).get("restore") or {}).get("backup") == name
        ]  # fmt: skip
        return sorted({f"{namespace}/{c}" for c in [owner, *waiting] if c})

    return keys


def register(manager: Manager) -> None:
    reconciler = EtcdClusterReconciler(manager)
    controller = Controller("etcdcluster", ETCDCLUSTERS, reconciler.reconcile, workers=4)
    controller.watch(PODS, label_keys(CLUSTER_LABEL), InformerOptions(label_selector=CLUSTER_LABEL))
    controller.owns(SERVICES)
    controller.owns(CLAIMS, InformerOptions(label_selector=MEMBER_LABEL))
    controller.watch(SECRETS, label_keys(CLUSTER_LABEL), InformerOptions(label_selector=CLUSTER_LABEL))
    controller.watch(NODES, _clusters_on_node(reconciler))
    controller.watch(ETCDBACKUPS, _clusters_of_backup(reconciler))
    manager.add_controller(controller)


__all__ = ["EtcdClusterReconciler", "claim_name", "parse_duration", "register"]
