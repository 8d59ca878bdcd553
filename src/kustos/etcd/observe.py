"""What an etcd cluster looks like this pass: its pods (as the planner sees them), its
volumes, and what its members themselves say. The one place that asks etcd before a
decision: the EtcdCluster controller, the rebuild and the defragmentation controller all
observe through here, and none of them imports another to do it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Collection, Iterator
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any, TypeVar
from urllib.parse import urlsplit

from kustos.api.etcd import EtcdCluster, EtcdClusterStatus, MemberStatus
from kustos.etcd import chain, defragmentation, membership, planner
from kustos.etcd.certs import CertificateManager, ClusterTLS
from kustos.etcd.client import (
    CREDENTIALS,
    EtcdClient,
    EtcdCredentials,
    EtcdError,
    EtcdTLS,
    MemberList,
    Status,
    cluster_health,
)  # fmt: skip
from kustos.etcd.cluster_planner import AdoptionSeen, EndpointAnswer, ExternalMember
from kustos.etcd.planner import ClaimView, MemberView, Observed, PodView
from kustos.etcd.pods import (
    CLUSTER_LABEL,
    EVICTION_ANNOTATION,
    MEMBER_ID_ANNOTATION,
    MEMBER_LABEL,
    VERSION_ANNOTATION,
    pod_epoch,
)  # fmt: skip
from kustos.etcd.versions import image_version
from kustos.runtime import objects
from kustos.runtime.informer import Informer
from kustos.runtime.times import parse_duration, parse_rfc3339

log = logging.getLogger(__name__)

Obj = dict[str, Any]
T = TypeVar("T")

STATUS_TIMEOUT = 2.0
LIST_ATTEMPTS = 3  # member lists one pass may drop for a pod that went (``Observer._membership``)
HEALTH_TIMEOUT = 3.0  # maintenance asks /health as well: a little longer
# How long a pass waits for a just-started member's etcd to listen (``ask_statuses``). It
# listens 20-40 ms after its process starts on the dev cluster; one that never does (it exits
# at once) costs each pass in its first seconds this much, not a request timeout. A recreated
# pod's DNS name resolves once its EndpointSlice has its address: waited for the same way.
STARTING_PATIENCE = 0.5


@dataclass
class EtcdView:
    """What etcd itself said this pass."""

    members: MemberList | None
    statuses: dict[str, Status]  # by client URL: members that answered without errors
    answered: dict[str, Status]  # by client URL: every member that answered, with a leader or not
    tls: ClusterTLS | None = None  # spec.tls: how to connect, and the certificates to record
    unresolved: tuple[str, ...] = ()  # host names of member URLs the operator's resolver cannot resolve
    no_space: tuple[str, ...] = ()  # client URLs of members that report the NOSPACE alarm
    cluster_version: str = ""  # etcd's cluster version ("3.6.0"), asked while a path across minors is walked

    @property
    def client_tls(self) -> EtcdTLS | None:
        return self.tls.client if self.tls is not None else None

    def add(self, more: EtcdView) -> None:
        """What ``more`` members said (``ask_statuses``), beside what these said."""
        self.statuses.update(more.statuses)
        self.answered.update(more.answered)
        self.unresolved = tuple(sorted({*self.unresolved, *more.unresolved}))
        self.no_space = tuple(sorted({*self.no_space, *more.no_space}))


# ---- asking etcd ----------------------------------------------------------------------------


# What the C resolver (getaddrinfo) says when a name does not resolve, as it reaches us
# through the HTTP client: EAI_NONAME (-2), EAI_AGAIN (-3), EAI_FAIL (-4), EAI_NODATA (-5).
RESOLUTION_FAILURES = (
    "[Errno -2]", "[Errno -3]", "[Errno -4]", "[Errno -5]", "Name or service not known",
    "Temporary failure in name resolution", "No address associated with hostname",
)  # fmt: skip


def unresolved_hosts(answers: dict[str, Status | EtcdError]) -> tuple[str, ...]:
    """Host names of the endpoints that failed because their name did not resolve."""
    return tuple(sorted({
        urlsplit(url).hostname or url
        for url, answer in answers.items()
        if isinstance(answer, EtcdError) and any(f in answer.message for f in RESOLUTION_FAILURES)
    }))  # fmt: skip


async def ask_statuses(
    urls: list[str], tls: EtcdTLS | None = None, starting: Collection[str] = ()
) -> EtcdView:
    """Status of every member that answers, and the members whose names did not resolve (DNS
    addressing with a resolver that lacks them). The membership is the Observer's to ask.

    A ``starting`` member (its etcd process just started) is given ``STARTING_PATIENCE`` to
    listen: its etcd listens tens of milliseconds after its process starts and then answers
    once it serves, so the pass sees it serve when it does. Before, a pass that came first was
    refused and the next looked 0.1 s later: most of what kustos added, after the new etcd
    served, to a member pod's replacement (issue 28)."""
    patience = dict.fromkeys(starting, STARTING_PATIENCE)
    answers = await cluster_health(urls, tls, STATUS_TIMEOUT, patience)
    answered = {url: s for url, s in answers.items() if isinstance(s, Status)}
    # A raised NOSPACE alarm refuses writes, not quorum: its members still lead, replicate and
    # serve reads. Counting them unhealthy would report (and automatically rebuild) a quorum loss.
    statuses = {url: s for url, s in answered.items() if not [e for e in s.errors if not no_space_alarm(e)]}
    no_space = tuple(sorted(url for url, s in statuses.items() if any(map(no_space_alarm, s.errors))))
    return EtcdView(None, statuses, answered, unresolved=unresolved_hosts(answers), no_space=no_space)


async def unless_set(call: Awaitable[T], event: asyncio.Event) -> tuple[T | None, bool]:
    """``call``'s result, or (None, True) once ``event`` is set first (``call`` is cancelled)."""
    task, waiter = asyncio.ensure_future(call), asyncio.ensure_future(event.wait())
    try:
        await asyncio.wait({task, waiter}, return_when=asyncio.FIRST_COMPLETED)
    except BaseException:  # the pass itself cancelled: nothing it started goes on
        task.cancel()
        raise
    finally:
        waiter.cancel()
    if task.done():
        return task.result(), False
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    return None, True


def no_space_alarm(error: str) -> bool:
    """A status error that is the NOSPACE alarm (etcd lists alarms as ``memberID:.. alarm:NOSPACE``)."""
    return "NOSPACE" in error


def member_views(etcd: EtcdView) -> tuple[MemberView, ...] | None:
    """The planner's view of the membership etcd reported (None: nobody could say)."""
    if etcd.members is None:
        return None
    leader_ids = {s.leader_id for s in etcd.statuses.values()}
    # A member the leader lists as a voter serves writes only once it has applied its own
    # promotion; until its status says so a client sent to it is told "rpc not supported for
    # learner", so it is not healthy yet (the planner still sees it as promoted).
    healthy_ids = {s.member_id for s in etcd.statuses.values()}
    learners_by_own_word = {s.member_id for s in etcd.statuses.values() if s.is_learner}
    said = {s.member_id: s for s in etcd.answered.values()}
    # A silent leader gives 0 (no lag): the cluster is then unhealthy, and nothing rolls.
    leader_index = max((s.raft_index for s in etcd.statuses.values() if s.is_leader), default=0)
    return tuple(
        MemberView(
            id=m.id,
            name=m.name,
            peer_url=m.peer_urls[0] if m.peer_urls else "",
            learner=m.is_learner,
            healthy=m.id in healthy_ids and (m.is_learner or m.id not in learners_by_own_word),
            leader=m.id in leader_ids and len(leader_ids) == 1,
            version=said[m.id].version if m.id in said else "",
            storage_version=said[m.id].storage_version if m.id in said else "",
            lag=max(0, leader_index - said[m.id].raft_applied_index) if m.id in said else 0,
        )
        for m in etcd.members.members
    )


async def ask_cluster_version(statuses: dict[str, Status], tls: EtcdTLS | None = None) -> str:
    """etcd's cluster version, from the leader first (it decides it), else any healthy member;
    "" when none says."""
    for url in sorted(statuses, key=lambda u: not statuses[u].is_leader):
        try:
            async with EtcdClient(url, tls, timeout=STATUS_TIMEOUT) as client:
                return await client.cluster_version()
        except (EtcdError, OSError, TimeoutError):
            continue
    return ""


async def member_health(name: str, url: str, tls: EtcdTLS | None = None) -> defragmentation.MemberView:
    """Status and health of one member (for defragmentation); anything that does not answer in
    time is unhealthy."""
    try:
        async with EtcdClient(url, tls, timeout=HEALTH_TIMEOUT) as client:
            status = await client.status()
            no_space = any(map(no_space_alarm, status.errors))
            # /health fails while an alarm is raised: a member whose only error is NOSPACE
            # is healthy enough to be compacted and defragmented (that is the cure).
            other_errors = [e for e in status.errors if not no_space_alarm(e)]
            healthy = not other_errors and (no_space or await client.health(serializable=True))
    except (EtcdError, OSError, TimeoutError):
        return defragmentation.MemberView(name, url, healthy=False)
    return defragmentation.MemberView(
        name, url, healthy=healthy, learner=status.is_learner, leader=status.is_leader,
        db_size=status.db_size, db_size_in_use=status.db_size_in_use, no_space=no_space,
        member_id=status.member_id, revision=status.revision,
    )  # fmt: skip


async def seed_answers(url: str, tls: EtcdTLS | None) -> tuple[str, int] | None:
    """(member name, cluster ID) once a rebuild's seed leads a one-member cluster."""
    try:
        async with EtcdClient(url, tls, timeout=STATUS_TIMEOUT) as client:
            status = await client.status()
            members = await client.member_list()
    except (EtcdError, OSError, TimeoutError):
        return None
    if status.errors or not status.is_leader or len(members.members) != 1:
        return None
    return members.members[0].name, members.cluster_id


async def adoption_answers(endpoints: list[str]) -> AdoptionSeen:
    """What the cluster behind spec.adopt's endpoints says of itself (``cluster_planner``
    decides whether it can be adopted)."""
    answers = []
    for url in endpoints:
        try:
            async with EtcdClient(url, timeout=STATUS_TIMEOUT) as client:
                status = await client.status()
        except (EtcdError, OSError, TimeoutError) as err:
            return AdoptionSeen(unreachable=f"{url} does not answer: {err}")
        answers.append(
            EndpointAnswer(url, status.cluster_id, status.version, status.has_leader, tuple(status.errors))
        )
    try:
        async with EtcdClient(endpoints[0], timeout=STATUS_TIMEOUT) as client:
            listed = await client.member_list()
    except (EtcdError, OSError, TimeoutError) as err:
        return AdoptionSeen(unreachable=f"{endpoints[0]} does not list its members: {err}")
    members = tuple(ExternalMember(m.id, m.name, tuple(m.client_urls)) for m in listed.members)
    return AdoptionSeen(tuple(answers), members, listed.cluster_id)


def starting(views: tuple[PodView, ...], client_urls: dict[str, str], now: datetime) -> list[str]:
    """The client URLs of member pods whose etcd started within ``planner.RECOVERY_FIRST``."""
    return [
        url for v in views
        if v.running_since is not None and now - v.running_since < planner.RECOVERY_FIRST
        and (url := client_urls.get(v.name)) is not None
    ]  # fmt: skip


def client_urls_of(base: Observed, views: tuple[PodView, ...]) -> dict[str, str]:
    """Each member pod's client URL, by pod name, but for pods being deleted."""
    return {v.name: url for v in views if not v.deleting and (url := planner.client_url(base, v)) is not None}


def listed_already(asked: tuple[str, asyncio.Future[MemberList | None]] | None, etcd: EtcdView) -> bool:
    """The list asked beside the statuses (``observe``) has answered, from a member that answered
    its status too: ``membership.member_list`` takes it at once."""
    if asked is None or asked[0] not in etcd.statuses or not asked[1].done() or asked[1].cancelled():
        return False
    return asked[1].result() is not None


def recorded_leader(recorded: list[MemberStatus], asking: list[str], just_started: list[str]) -> str | None:
    """The client URL of the member the status last recorded as the healthy leader, when its
    pod's etcd runs and did not just start: the member most likely to list the membership at
    once."""
    for member in recorded:
        url = member.client_url
        if member.leader and member.healthy and url in asking and url not in just_started:
            return url
    return None


def askable(views: tuple[PodView, ...], client_urls: dict[str, str]) -> list[str]:
    """The client URLs worth asking: those of pods whose etcd container runs. One that does not
    (just created, between restarts) has nothing listening, and asking it costs the pass that
    request's timeout: an address on no link yet answers no ARP for a second or more. That was
    most of what a pass took while a replaced member's pod started (issue 28), and the second
    before its return was seen."""
    return [url for v in views if v.running and (url := client_urls.get(v.name)) is not None]


def unhealthy_since(
    members: tuple[MemberView, ...] | None,
    recorded: list[MemberStatus],
    pods: tuple[PodView, ...],
    now: datetime,
) -> dict[str, datetime]:
    """When each unhealthy member was first seen so, by name: the time recorded for the same
    member ID (for a record without one, the same name), else now.

    A member etcd has no name for has never started: it is joining (``stuck`` says why its pod
    cannot start), and its failure timeout starts once its etcd has. Before, its status named it
    after its pod while this looked it up by its peer URL, so its time was "now" on every pass:
    one status write a second while a new member's pod started (issue 28), and a timeout that
    could never run out, which is what this says outright.

    A member whose pod is stopping is not timed here (``planner.is_dead`` times it from the
    end of the pod's grace period): a time recorded at the pod's last moments would be one more
    status write between the pod gone and its member brought back."""
    by_id = {m.id: parse_rfc3339(m.unhealthy_since) for m in recorded if m.id}
    by_name = {m.name: parse_rfc3339(m.unhealthy_since) for m in recorded if not m.id}  # no ID said yet
    stopping = {p.name for p in pods if planner.stopping(p)}
    found: dict[str, datetime] = {}
    for m in members or ():
        if not m.healthy and m.name and m.name not in stopping:
            found[m.name] = by_id.get(f"{m.id:x}") or by_name.get(m.name) or now
    return found


def with_members(known: Observed, etcd: EtcdView, recorded: list[MemberStatus]) -> Observed:
    """``known`` with the membership etcd reported and since when each unhealthy member was so."""
    members = member_views(etcd)
    since = unhealthy_since(members, recorded, known.pods, known.now)
    return replace(known, members=members, unhealthy_since=since)


# ---- pods and volumes -------------------------------------------------------------------------


# Taints of the node removers that do not cordon: the cluster-autoscaler, and karpenter
# (v1 and before). ``kubectl drain`` and most others cordon (spec.unschedulable).
REMOVAL_TAINTS = ("ToBeDeletedByClusterAutoscaler", "karpenter.sh/disrupted", "karpenter.sh/disruption")


def draining_node(node: Obj | None) -> bool:
    """Cordoned, or tainted by a node remover: its pods are about to be evicted."""
    if node is None:
        return False
    taints = (node.get("spec") or {}).get("taints") or []
    return objects.node_unschedulable(node) or any(t.get("key") in REMOVAL_TAINTS for t in taints)


def eviction_requested(pod: Obj) -> bool:
    """Someone asked to evict this member pod (the budget refused it: ``evictions.py``)."""
    return EVICTION_ANNOTATION in objects.annotations(pod)


def pod_view(cluster: str, pod: Obj, node: Callable[[str], Obj | None]) -> PodView | None:
    """The planner's view of a member pod (None: not a member pod of ``cluster``)."""
    name = objects.name(pod)
    index = planner.pod_index(cluster, name)
    if index is None:
        return None
    annotations = objects.annotations(pod)
    member_id = annotations.get(MEMBER_ID_ANNOTATION)
    node_name = objects.pod_node(pod)
    containers = (pod.get("spec") or {}).get("containers") or [{}]
    version = annotations.get(VERSION_ANNOTATION) or image_version(containers[0].get("image", ""))
    return PodView(
        name=name,
        index=index,
        uid=objects.uid(pod) or "",
        ip=(pod.get("status") or {}).get("podIP"),
        deleting=objects.deleting(pod),
        deletion_deadline=objects.deletion_deadline(pod),
        running=objects.pod_running(pod),
        ready=objects.pod_ready(pod),
        member_id=int(member_id, 16) if member_id else None,
        node_lost=node_name is not None and objects.node_lost(node(node_name)),
        node=node_name,
        # A refused eviction (evictions.py) says the same as a cordon: this member must move.
        draining=eviction_requested(pod) or (node_name is not None and draining_node(node(node_name))),
        version=version,
        running_since=objects.running_since(pod),
    )


def skeleton(cluster: EtcdCluster, now: datetime) -> Observed:
    """What addressing needs (URLs of pods), without pods or members."""
    status = cluster.status or EtcdClusterStatus()
    spec = cluster.spec
    return Observed(
        cluster=cluster.metadata["name"], namespace=cluster.metadata["namespace"], size=spec.size,
        addressing=spec.addressing, storage=status.storage_type or spec.storage.type,
        failure_timeout=parse_duration(spec.member_failure_timeout), now=now, tls=spec.tls is not None,
    )  # fmt: skip


class Observer:
    """Observes EtcdClusters from the manager's caches and from etcd itself."""

    def __init__(self, pods: Informer, nodes: Informer, claims: Informer, certs: CertificateManager) -> None:
        self.pods = pods
        self.nodes = nodes
        self.claims = claims
        self.certs = certs
        self.pods_by_cluster = pods.index_by_label(CLUSTER_LABEL)
        # Whom to log in as, by cluster key: the EtcdCluster controller sets it each pass.
        self.credentials: dict[str, tuple[EtcdCredentials, ...]] = {}
        self.claims_by_cluster = claims.index_by_label(CLUSTER_LABEL)
        # By cluster key: one event per observation under way, set when a pod of the cluster goes.
        self._watching: dict[str, set[asyncio.Event]] = {}
        pods.add_handler(self._pod_changed)

    def _pod_changed(self, kind: str, pod: Obj, _old: Obj | None) -> None:
        """A member pod gone: the pods an observation under way started from are not the
        cluster's any more, and a member list in flight for it may never answer now."""
        if kind == "DELETED":
            key = f"{objects.namespace(pod)}/{objects.labels(pod).get(CLUSTER_LABEL)}"
            for went in self._watching.get(key, ()):
                went.set()

    @contextlib.contextmanager
    def _pods_going(self, key: str) -> Iterator[asyncio.Event]:
        """An event set when a pod of the cluster goes while the block runs (``_pod_changed``)."""
        went = asyncio.Event()
        watching = self._watching.setdefault(key, set())
        watching.add(went)
        try:
            yield went
        finally:
            watching.discard(went)
            if not watching:
                self._watching.pop(key, None)

    async def _membership(
        self,
        cluster: EtcdCluster,
        known: Observed,
        views_now: Callable[[], tuple[PodView, ...]],
        etcd: EtcdView,
        went: asyncio.Event,
        asked: tuple[str, asyncio.Future[MemberList | None]] | None,
    ) -> tuple[MemberList | None, Observed]:
        """The membership, and the observation it was asked on (its pods).

        Not asked when it cannot answer (``planner.membership_unanswerable``). When a member pod
        of the cluster goes (``went``) before or while the list is asked, the pods are looked at
        again and a list in flight is dropped: the pod that went may be what makes the list
        unanswerable. Before, a quorum lost on volumes waited for a list asked while the pods
        were stopping, its whole ``LIST_TIMEOUT``, before their members were brought back. The
        last attempt is waited for whatever happens. ``asked``: the first attempt's list from
        one member, already on its way (``observe``).

        A recorded member without a pod is brought back on a member's own list when that list
        says it may be (``_applied_membership``): the members are not confirmed then."""
        key = objects.key(cluster)
        for attempt in range(1, LIST_ATTEMPTS + 1):
            if went.is_set():
                went.clear()
                known = replace(known, pods=views_now())
            if planner.membership_unanswerable(known):
                log.info("%s: not listing the members: too few voters have an etcd running", key)
                return None, known
            early = asked if attempt == 1 else None
            if planner.recorded_member_without_pod(known) and not listed_already(early, etcd):
                applied = await self._applied_membership(cluster, known, etcd)
                if applied is not None:
                    return applied, replace(known, members_confirmed=False)
            listing = membership.member_list(etcd.statuses, etcd.client_tls, early)
            if attempt == LIST_ATTEMPTS:
                break
            listed, dropped = await unless_set(listing, went)
            if not dropped:
                return listed, known
        return await listing, known

    async def _applied_membership(
        self, cluster: EtcdCluster, known: Observed, etcd: EtcdView
    ) -> MemberList | None:
        """The membership as a member has applied it (a serializable list), when on it rule 1b
        brings a member back on its volume (``planner.back_on_volumes``); else None.

        A linearizable list waits for a leader. The leader's pod deleted (alone, or with a
        follower's as in a lost quorum) left the survivors electing for a second or more, and the
        member whose pod went was brought back only after the election, its etcd starting once
        the cluster had a leader again: 0.3-1.2 s of issue 28's quorum-loss step. A member's own
        list answers at once. It may lag a membership change the old leader committed, which
        cannot make this step wrong: a member brought back that was removed meanwhile is refused
        by its peers, and the next pass, on a confirmed list, deletes its pod."""
        listed = await membership.member_list(etcd.statuses, etcd.client_tls, linearizable=False)
        if listed is None:
            return None
        recorded = (cluster.status or EtcdClusterStatus()).members
        candidate = with_members(known, replace(etcd, members=listed), recorded)
        return listed if planner.back_on_volumes(candidate) is not None else None

    async def _ask_started_since(
        self,
        cluster: EtcdCluster,
        known: Observed,
        now_seen: tuple[PodView, ...],
        asking: list[str],
        etcd: EtcdView,
        client_urls: dict[str, str],
    ) -> Observed:
        """The observation with the members whose etcd started while it was under way asked too.

        A member list waits for a leader: after a lost quorum, the pass that started before the
        members brought back were running got its list only once they had elected one, and then
        planned and wrote a status on statuses that lacked them, and the next pass had to look
        again (0.1-0.7 s, issue 28's quorum-loss step). Only when the same pods are there."""
        if {v.name for v in now_seen} != {v.name for v in known.pods}:
            return known
        urls = client_urls_of(known, now_seen)
        late = [u for u in askable(now_seen, urls) if u not in asking]
        if not late:
            return known
        self.remember(cluster, late)
        etcd.add(await ask_statuses(late, etcd.client_tls, starting(now_seen, urls, known.now)))
        client_urls.update(urls)
        return replace(known, pods=now_seen)

    def remember(self, cluster: EtcdCluster, endpoints: list[str]) -> None:
        """Every client of these members (observation, membership, maintenance, rebuilds) logs
        in with the cluster's root credentials, when it has them (``CredentialBook``)."""
        key = objects.key(cluster)
        found = self.credentials.get(key)
        if found:
            CREDENTIALS.remember(key, endpoints, found)

    def pods_of(self, cluster: EtcdCluster) -> list[Obj]:
        """The cluster's pods (every epoch), from the cache's index by cluster label."""
        namespace, name = cluster.metadata["namespace"], cluster.metadata["name"]
        return [
            p for p in self.pods.by_index(self.pods_by_cluster, name) if objects.namespace(p) == namespace
        ]

    def pod_view(self, cluster: EtcdCluster, pod: Obj) -> PodView | None:
        return pod_view(cluster.metadata["name"], pod, self.nodes.get)

    def claims_of(self, cluster: EtcdCluster) -> tuple[ClaimView, ...]:
        """The member volumes of this cluster's current epoch that are not being deleted; those of
        an earlier epoch are the user's to delete (they may hold writes a rebuild did not restore)."""
        namespace, name = cluster.metadata["namespace"], cluster.metadata["name"]
        epoch = cluster.status.epoch if cluster.status else 0
        views = []
        for claim in self.claims.by_index(self.claims_by_cluster, name):
            created = parse_rfc3339(claim["metadata"].get("creationTimestamp"))
            if objects.namespace(claim) != namespace:
                continue
            if pod_epoch(claim) == epoch and created is not None and not objects.deleting(claim):
                views.append(
                    ClaimView(
                        objects.name(claim),
                        objects.labels(claim)[MEMBER_LABEL],
                        objects.uid(claim) or "",
                        created,
                    )
                )
        return tuple(views)

    async def observe(self, cluster: EtcdCluster, now: datetime) -> tuple[Observed, EtcdView, dict[str, str]]:
        """The planner's input, what etcd said, and each pod's client URL."""
        status = cluster.status or EtcdClusterStatus()
        spec = cluster.spec
        certs: ClusterTLS | None = None

        def pods_now() -> list[tuple[Obj, PodView]]:
            # Pods of an earlier epoch belong to a cluster that a rebuild replaced (and deleted).
            return [
                (p, v) for p in self.pods_of(cluster)
                if pod_epoch(p) == status.epoch and (v := self.pod_view(cluster, p)) is not None
            ]  # fmt: skip

        def seen(pods: list[tuple[Obj, PodView]]) -> tuple[PodView, ...]:
            return tuple(replace(v, tls_stale=certs.stale.get(v.name)) if certs else v for _, v in pods)

        found = pods_now()
        if spec.tls is not None:
            certs = await self.certs.reconcile(cluster, [p for p, _ in found], now)
        views = seen(found)
        base = skeleton(cluster, now)
        client_urls = client_urls_of(base, views)
        adoption = status.adoption if status.adoption and status.adoption.phase == "Migrating" else None
        # An adopted cluster's original members are asked too, until they have all left.
        external = [u for u in (adoption.endpoints if adoption else []) if u not in client_urls.values()]
        self.remember(cluster, [*client_urls.values(), *external])
        known = replace(
            base, pods=views, next_index=status.next_member_index,
            ever_formed=bool(status.cluster_id),
            recorded_members=tuple((m.name, int(m.id, 16)) for m in status.members if m.name and m.id),
            recorded_voters=tuple(m.name for m in status.members if m.name and not m.learner),
            external_ids=frozenset(int(i, 16) for i in (adoption.external_members if adoption else [])),
            claims=self.claims_of(cluster), migrate=spec.disruption.migrate,
        )  # fmt: skip

        def views_now() -> tuple[PodView, ...]:
            return seen(pods_now())

        asking, just_started = askable(views, client_urls), starting(views, client_urls, now)
        tls = certs.client if certs else None
        # The member list is asked of the recorded leader beside the statuses, not after them:
        # a round trip less in every pass, and a member's replacement has two such passes on its
        # way (issue 28). It is used only if the leader answered its status too.
        leader = recorded_leader(status.members, asking, just_started)
        asked = None
        if leader is not None and not planner.membership_unanswerable(known):
            asked = (leader, asyncio.ensure_future(membership.member_list_at(leader, tls)))
        with self._pods_going(objects.key(cluster)) as went:
            try:
                etcd = await ask_statuses([*asking, *external], tls, just_started)
                etcd.tls = certs
                etcd.members, known = await self._membership(cluster, known, views_now, etcd, went, asked)
            finally:
                if asked is not None:
                    asked[1].cancel()
            if not went.is_set():
                known = await self._ask_started_since(cluster, known, views_now(), asking, etcd, client_urls)
        if chain.under_way(cluster):
            etcd.cluster_version = await ask_cluster_version(etcd.statuses, etcd.client_tls)
        downgrade_enabled = any(s.downgrade_enabled for s in etcd.statuses.values())
        walk = chain.progress(cluster, etcd.cluster_version, downgrade_enabled, now)
        observed = replace(
            with_members(known, etcd, status.members), version=walk.version, hold=walk.hold,
            rollback=walk.rollback, downgrade_enabled=downgrade_enabled,
        )  # fmt: skip
        return observed, etcd, client_urls
