"""The EtcdCluster planner: from what is observed, the one next safe step (pure, no I/O).

Everything the planner needs is in ``Observed``; everything it decides is a ``Step``.
The rules, in the order they are tried:

1. Without a readable membership: bootstrap a seed when nothing exists yet, wait
   for a seed that is starting, bring PVC-backed members back on their volumes,
   otherwise report quorum lost and touch nothing else.
1b. Bring PVC-backed members whose pod is gone back on their volumes, before any
   bookkeeping (with quorum, unless dead past the failure timeout).
2. Record on each pod the member ID it became (so a removed member's pod is known),
   and give a member that came back in a new pod (pod-IP addressing) its new peer URL.
3. Quorum lost (fewer healthy voters than a majority): touch nothing else.
4. A member without a pod: create the pod a just-added member was waiting for
   (DNS addressing), bring a PVC-backed member back on its own volume, or remove
   the member from etcd when that keeps quorum.
5. A pod without a member: delete it when its member was removed; add it as a
   learner when it is a new member waiting to join (pod-IP addressing).
6. Promote a learner whose process runs.
7. A member unhealthy past the failure timeout (or on a lost node): remove it,
   if that keeps quorum; its pod goes at the next pass, a replacement after.
8. Grow by one member (never while another change is in flight, never while a
   member is unhealthy), or shrink by one: an unhealthy member first, else an
   original member of an adopted cluster, else an outdated one, else the newest
   follower; the leader only after moving leadership away. While an adopted
   cluster still has original members, grow one past size, then shrink: each of
   them is replaced by a member pod, one at a time.
8b. A member on a draining node (cordoned, or tainted by a node remover), or whose eviction was
   asked (``evictions.py``), moves, unless
   ``migrate`` is off: surge as for an upgrade (a new member joins as a learner elsewhere,
   its pod kept off the leaving members' nodes: ``pods.away_from``, and is promoted), then rule 8 removes the
   member on the draining node (leadership moved first) and rule 5 deletes its pod. One
   member at a time; the cluster never has fewer healthy voters than its size.
9. Roll members onto ``version`` (or onto renewed certificates: ``PodView.tls_stale``)
   one at a time, followers first and the leader last, each once the previous one is
   healthy and caught up with the leader: with PVC storage restart a
   member's pod on its volume; otherwise surge (add a member at the new version,
   then remove an outdated one by rule 8). A member at the new version that dies
   mid-upgrade halts the upgrade.
   A rollback to the previous minor (``Observed.rollback``) goes through etcd's
   downgrade protocol instead: enable the downgrade, wait until etcd has rewritten the
   member's storage to the old version, then give its pod the old image in place (a
   fresh member of the old minor cannot join, so neither surge nor a new volume), one
   member at a time, the leader last. The cluster does not grow meanwhile (a new member of
   the older minor could not join). A downgrade nobody wants any more is cancelled.
   A change across several minors comes here one step at a time (``version`` is the step,
   etcd/chain.py); between steps the planner waits (``hold``) for etcd's cluster version.

10. Once the cluster matches its spec, delete the volume (PVC) of any member that is
   neither a pod nor a member any more: etcd never lets a removed member back in.

Each step changes the membership by at most one member, and a removal is only
planned when the healthy voters that remain are still a majority of the smaller
cluster, so no step ever costs quorum.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from kustos.etcd.quorum import quorum
from kustos.etcd.quorum import removal_keeps_quorum as _keeps_quorum
from kustos.runtime.steps import Done as Done  # the shared steps, in this planner's Step union
from kustos.runtime.steps import Wait as Wait

# etcd refuses a membership change until its leader has been connected to every voting
# member for this long (--strict-reconfig-check, etcdserver.HealthInterval).
RECONFIG_SETTLE = timedelta(seconds=6)  # 5 s, plus the second that startedAt may have lost
# A member this many raft entries behind the leader is still catching up after a restart
# (a WAL replay, a snapshot from the leader): the next member does not restart until it is
# closer. A few entries apart is normal under writes, between two status answers.
CATCH_UP_SLACK = 1000
# While a member's etcd started this recently, an unhealthy member or a quorum loss is looked
# at again every RECOVERY_LOOK: its etcd may be serving (or electing a leader with the
# survivors) any moment, and no pod event says when (the next one is the readiness probe's,
# up to its 2 s period later). A member back on its volume (a replaced pod, a lost quorum) is
# looked at more often than a new one the cluster grows by: its return is what the user waits
# for, and it is over in a second or two; a growth waits on learners anyway. In the first
# RECOVERY_FIRST, when a restarted etcd serves (0.1-0.3 s after its start on the dev cluster),
# every RECOVERY_FIRST_LOOK: a pass that found it not yet listening looks again soon (one that
# found it listening waits for its answer, which comes when it serves).
RECOVERY_WINDOW = timedelta(seconds=10)
RECOVERY_FIRST = timedelta(seconds=2)
RECOVERY_FIRST_LOOK = 0.1
RECOVERY_LOOK = 0.25
GROWTH_LOOK = 0.5
# A learner is promoted once its raft log matches 90% of the leader's (etcd's isLearnerReady):
# for one whose etcd has just started, a few heartbeats (100 ms each) after it connects. Its
# pod runs before that and no event says when, so the promote is asked again this soon, for
# LEARNER_FRESH; after that (a learner receiving a large snapshot) once a second.
LEARNER_CATCH_UP = 0.25
LEARNER_FRESH = timedelta(seconds=5)
# A pass that had only a member's own (unconfirmed) membership, and nothing to bring back on it,
# looks again this soon: an election takes etcd a second or two.
UNCONFIRMED_LOOK = 0.25
# A member volume is only ever collected this long after its creation (caches may not show
# the pod of a claim created a moment ago).
CLAIM_GRACE = timedelta(seconds=20)


@dataclass(frozen=True)
class PodView:
    name: str
    index: int
    uid: str = ""
    ip: str | None = None
    deleting: bool = False
    deletion_deadline: datetime | None = None  # when a graceful deletion ends (deletionTimestamp)
    running: bool = False
    ready: bool = False
    member_id: int | None = None  # from the pod's annotation, once it became a member
    node_lost: bool = False
    version: str | None = None  # the etcd version its container runs
    running_since: datetime | None = None  # when its etcd process last started
    tls_stale: str | None = None  # why it must restart onto a new certificate (certs.py)
    node: str | None = None  # the node it runs on
    draining: bool = False  # its node is cordoned or tainted for removal, or its eviction was asked


@dataclass(frozen=True)
class MemberView:
    id: int
    name: str  # empty until the member has started
    peer_url: str
    learner: bool = False
    healthy: bool = False
    leader: bool = False
    version: str = ""  # the etcd version the member itself reports ("" when it did not answer)
    storage_version: str = ""  # v3.6+: the version its data is written for ("3.5.0" once downgraded)
    lag: int = 0  # raft entries it has still to apply to reach the leader's commit index


@dataclass(frozen=True)
class ClaimView:
    """A member's PersistentVolumeClaim: its own name, and the pod (member) it was made for."""

    name: str
    pod: str
    uid: str
    created: datetime


@dataclass(frozen=True)
class Observed:
    cluster: str
    namespace: str
    size: int
    addressing: str  # "dns" or "podIP"
    storage: str  # "emptyDir" or "pvc"
    failure_timeout: timedelta
    now: datetime
    pods: tuple[PodView, ...] = ()
    members: tuple[MemberView, ...] | None = None  # None: no member answered
    # False: ``members`` is one member's own applied view (a serializable list, answered during an
    # election), asked only to bring members back on their volumes (``back_on_volumes``).
    members_confirmed: bool = True
    next_index: int = 0
    ever_formed: bool = False  # the cluster had a membership once (status.clusterID set)
    unhealthy_since: dict[str, datetime] = field(default_factory=dict)  # by member name
    version: str | None = None  # the version members should run (None: whatever they run)
    recorded_members: tuple[tuple[str, int], ...] = ()  # (name, ID) from status: who to bring back
    recorded_voters: tuple[str, ...] = ()  # names of the voting members status recorded
    external_ids: frozenset[int] = frozenset()  # members of an adopted cluster not yet replaced by pods
    tls: bool = False  # members speak https
    rollback: str | None = None  # "3.5": ``version`` is the previous minor, reached by etcd's downgrade
    downgrade_enabled: bool = False  # etcd reports a downgrade in progress
    claims: tuple[ClaimView, ...] = ()  # member volumes of the current epoch (PVC storage)
    migrate: bool = True  # spec.disruption.migrate: move members off draining nodes (rule 8b)
    hold: str | None = None  # a path across minors waits for etcd before its next step (etcd/chain.py)


# ---- steps --------------------------------------------------------------------------------


@dataclass(frozen=True)
class CreateSeed:
    index: int


@dataclass(frozen=True)
class CreatePod:
    """Create member pod ``index`` to join the existing cluster."""

    index: int


@dataclass(frozen=True)
class RecreatePod:
    """Bring a PVC-backed member back on its own volume under its own name, and with it every
    member in ``also`` whose pod is gone too: each is the same member on its own data (no
    membership changes), so they come back at once, and after a lost quorum the second member's
    pod no longer waits a pass for the first's."""

    name: str
    member_id: int
    also: tuple[tuple[str, int], ...] = ()

    @property
    def members(self) -> tuple[tuple[str, int], ...]:
        """(pod name, member ID) of every member this brings back."""
        return ((self.name, self.member_id), *self.also)


def _recreate(gone: list[tuple[str, int]]) -> RecreatePod | None:
    return RecreatePod(*gone[0], also=tuple(gone[1:])) if gone else None


@dataclass(frozen=True)
class AddMember:
    pod: str
    peer_url: str
    learner: bool = True
    index: int | None = None  # DNS addressing: the pod is created after the add


@dataclass(frozen=True)
class PromoteMember:
    member_id: int
    name: str


@dataclass(frozen=True)
class UpdatePeerURL:
    member_id: int
    peer_url: str


@dataclass(frozen=True)
class RemoveMember:
    member_id: int
    name: str
    reason: str


@dataclass(frozen=True)
class DeletePod:
    name: str
    uid: str
    reason: str
    force: bool = False  # the pod's node is gone: nobody else will finish the deletion


@dataclass(frozen=True)
class AnnotatePod:
    name: str
    member_id: int


@dataclass(frozen=True)
class MoveLeader:
    from_id: int
    to_id: int


@dataclass(frozen=True)
class EnableDowngrade:
    """Validate, then enable etcd's downgrade of the cluster to ``target`` ("3.5")."""

    target: str


@dataclass(frozen=True)
class CancelDowngrade:
    """spec.version went back up: etcd's downgrade is no longer wanted."""


@dataclass(frozen=True)
class ReplaceImage:
    """Restart a member's container in place on another etcd version, keeping its data dir."""

    name: str
    uid: str
    version: str


@dataclass(frozen=True)
class DeleteClaim:
    """Delete the volume of a member that left etcd: its data can never rejoin the cluster."""

    name: str
    pod: str
    uid: str


@dataclass(frozen=True)
class QuorumLost:
    message: str
    refused: str | None = None  # the controller's: why a rebuild asked for cannot start
    seconds: float = 2.0  # when to look again (sooner while member pods start: ``_recovering``)


@dataclass(frozen=True)
class UpgradeHalted:
    """A member on the new version failed: stop rolling, touch nothing more."""

    message: str


Step = (
    CreateSeed | CreatePod | RecreatePod | AddMember | PromoteMember | UpdatePeerURL | RemoveMember
    | DeletePod | AnnotatePod | MoveLeader | EnableDowngrade | CancelDowngrade | ReplaceImage
    | DeleteClaim | Wait | QuorumLost | UpgradeHalted | Done
)  # fmt: skip


# ---- naming -------------------------------------------------------------------------------


def pod_name(cluster: str, index: int) -> str:
    return f"{cluster}-{index}"


def pod_index(cluster: str, name: str) -> int | None:
    prefix = f"{cluster}-"
    if not name.startswith(prefix) or not name[len(prefix) :].isdigit():
        return None
    return int(name[len(prefix) :])


def peer_service(cluster: str) -> str:
    return f"{cluster}-peer"


def dns_name(cluster: str, namespace: str, pod: str) -> str:
    return f"{pod}.{peer_service(cluster)}.{namespace}.svc"


def peer_url(o: Observed, pod: PodView | str) -> str | None:
    """The peer URL a member pod has (or will have, for DNS addressing)."""
    name = pod if isinstance(pod, str) else pod.name
    scheme = "https" if o.tls else "http"
    if o.addressing == "dns":
        return f"{scheme}://{dns_name(o.cluster, o.namespace, name)}:2380"
    if isinstance(pod, str) or not pod.ip:
        return None
    return f"{scheme}://{pod.ip}:2380"


def client_url(o: Observed, pod: PodView) -> str | None:
    scheme = "https" if o.tls else "http"
    if o.addressing == "dns":
        return f"{scheme}://{dns_name(o.cluster, o.namespace, pod.name)}:2379"
    return f"{scheme}://{pod.ip}:2379" if pod.ip else None


# ---- planning -----------------------------------------------------------------------------


def match_pods(o: Observed, members: tuple[MemberView, ...]) -> dict[int, PodView]:
    """member ID -> its pod: by name once started, by peer URL before, by annotation after."""
    by_name = {p.name: p for p in o.pods}
    by_url = {url: p for p in o.pods if (url := peer_url(o, p))}
    by_id = {p.member_id: p for p in o.pods if p.member_id is not None}
    matched: dict[int, PodView] = {}
    for m in members:
        pod = by_name.get(m.name) if m.name else None
        pod = pod or by_url.get(m.peer_url) or by_id.get(m.id)
        if pod is not None:
            matched[m.id] = pod
    return matched


def removal_keeps_quorum(members: tuple[MemberView, ...], victim: MemberView) -> bool:
    """Would the healthy voters left still be a majority of the voters left?"""
    voters = [m for m in members if not m.learner]
    healthy_after = sum(1 for m in voters if m.healthy and m.id != victim.id)
    return _keeps_quorum(len(voters), healthy_after, victim.learner)


def stopping(pod: PodView) -> bool:
    """Deleted, on a node that still runs it: its etcd stops on purpose, and its member comes
    back (on its volume) or is replaced once the pod is gone."""
    return pod.deleting and not pod.node_lost


def is_dead(o: Observed, member: MemberView, pod: PodView | None) -> bool:
    """Unhealthy (or on a lost node) for longer than the failure timeout. A stopping pod's
    member is timed from the end of the pod's grace period instead: before, one whose pod took
    longer than the timeout to go (a leader deleted with another member waits 7 s on a
    leadership transfer that cannot land) was removed and replaced by a new member that copied
    every key, where the same member was back on its volume a second later."""
    if member.healthy and not (pod and pod.node_lost):
        return False
    if pod is not None and stopping(pod):
        deadline = pod.deletion_deadline
        return deadline is not None and o.now - deadline >= o.failure_timeout
    since = o.unhealthy_since.get(member.name or member.peer_url)
    return since is not None and o.now - since >= o.failure_timeout


def back_on_volumes(o: Observed) -> RecreatePod | None:
    """Rule 1b: PVC-backed members whose pod is gone come back on their volumes, before any
    bookkeeping (2, 2b): each is the same member with its data, often what restores quorum, and
    after a quorum loss the first member back must not hold the next one up by a pass. With
    quorum lost even a dead member comes back (removing it is impossible); with quorum, rule 7
    removes a dead one."""
    if o.members is None:
        return None
    voters = [m for m in o.members if not m.learner]
    quorum_lost = sum(1 for m in voters if m.healthy) < quorum(len(voters))
    return _back_on_volumes(o, o.members, match_pods(o, o.members), quorum_lost)


def _back_on_volumes(
    o: Observed, members: tuple[MemberView, ...], pods: dict[int, PodView], quorum_lost: bool
) -> RecreatePod | None:
    if o.storage != "pvc":
        return None
    existing_names = {p.name for p in o.pods}
    return _recreate([
        (m.name, m.id)
        for m in members
        if m.name and m.id not in pods and m.name not in existing_names
        and m.id not in o.external_ids and (quorum_lost or not is_dead(o, m, None))
    ])  # fmt: skip


def plan(o: Observed) -> Step:
    if o.members is None:
        return _plan_without_membership(o)
    members = o.members
    pods = match_pods(o, members)
    voters = [m for m in members if not m.learner]
    healthy_voters = [m for m in voters if m.healthy]
    quorum_lost = len(healthy_voters) < quorum(len(voters))

    # 1b (``back_on_volumes``).
    if (recreate := _back_on_volumes(o, members, pods, quorum_lost)) is not None:
        return recreate
    if not o.members_confirmed:  # the observer asks such a list only for rule 1b: never acted on
        return Wait("the membership is not confirmed by a leader yet", UNCONFIRMED_LOOK)

    # 2. Record membership on pods.
    for m in members:
        pod = pods.get(m.id)
        if pod is not None and pod.member_id != m.id and not pod.deleting:
            return AnnotatePod(pod.name, m.id)

    # 2b. A member back on its volume in a new pod (pod-IP addressing) has a new peer URL.
    for m in members:
        pod = pods.get(m.id)
        if pod is None or pod.deleting or not m.name:
            continue
        url = peer_url(o, pod)
        if url is not None and url != m.peer_url:
            return UpdatePeerURL(m.id, url)

    # 3. Quorum. PVC-backed members whose pod is gone are back on their volumes (1b).
    if quorum_lost:
        return QuorumLost(
            f"{len(healthy_voters)} of {len(voters)} voting members are healthy; "
            f"{quorum(len(voters))} are needed for quorum",
            seconds=_starting_look(o),
        )

    # 4. Members without a pod.
    existing = {p.name for p in o.pods}
    for m in members:
        if m.id in pods or m.id in o.external_ids:
            continue
        expected = _expected_pod(o, m)
        if o.addressing == "dns" and not m.name and expected is not None and expected not in existing:
            index = pod_index(o.cluster, expected)
            if index is not None:
                return CreatePod(index)
        if removal_keeps_quorum(members, m):  # a PVC-backed one not dead came back (1b)
            return RemoveMember(m.id, m.name or m.peer_url, "its pod is gone")
        return Wait(f"member {m.name or format(m.id, 'x')} has no pod, but removing it would cost quorum")

    # 5. Pods without a member.
    member_ids = {m.id for m in members}
    matched_pods = {p.name for p in pods.values()}
    for pod in o.pods:
        if pod.name in matched_pods:
            continue
        if pod.deleting:
            if pod.node_lost:
                return DeletePod(pod.name, pod.uid, "its node is lost", force=True)
            return Wait(f"pod {pod.name} is terminating", 1.0)
        if pod.member_id is not None and pod.member_id not in member_ids:
            return DeletePod(pod.name, pod.uid, "its member was removed", force=pod.node_lost)
        if o.addressing == "podIP" and pod.member_id is None:
            url = peer_url(o, pod)
            if url is None:
                return Wait(f"pod {pod.name} has no IP yet", 0.5)
            if any(m.learner or not m.name for m in members):
                return Wait("another member is still joining", 1.0)
            return AddMember(pod.name, url)
        return DeletePod(pod.name, pod.uid, "it belongs to no member", force=pod.node_lost)

    # 6. Learners.
    for m in members:
        if m.learner and pods[m.id].running:
            return PromoteMember(m.id, m.name or pods[m.id].name)

    # 7. Dead members.
    for m in members:
        if is_dead(o, m, pods.get(m.id)):
            pod = pods.get(m.id)
            if pod is not None and _rolling(o, pods, is_old_version) and not is_old_version(o, pod):
                change = "rollback" if o.rollback is not None else "upgrade"
                return UpgradeHalted(
                    f"member {m.name or pod.name} failed on etcd {o.version}: {change} halted; "
                    f"set spec.version back to continue on the version the others run"
                )
            if removal_keeps_quorum(members, m):
                return RemoveMember(m.id, m.name, "it has been unhealthy longer than the failure timeout")
            return Wait(f"member {m.name} is dead, but removing it would cost quorum")

    # 8. Size.
    joining = [m for m in members if m.learner or not m.name]
    if joining:
        return Wait("a member is joining", 1.0)
    adopting = any(m.id in o.external_ids for m in members)
    surge = len(members) == o.size and (
        adopting
        or (o.storage != "pvc" and o.rollback is None and _rolling(o, pods))
        or (o.rollback is None and _leaving(o, pods) is not None)
    )
    # While etcd's downgrade is enabled it refuses every new member, of either minor
    # ("incompatible with current running cluster"): a cluster short of a member then (one
    # died, or spec.size went up) finishes its rollback in place first (9a), and grows once
    # etcd has finished the downgrade. Before that, a new member joins on the version the
    # cluster runs (the controller's choice), and the rollback restarts it like the others.
    if (len(members) < o.size or surge) and not o.downgrade_enabled:
        if any(not m.healthy for m in members):
            return Wait("not growing while a member is unhealthy", _starting_look(o, growth=True))
        settle = _settling(o, members, pods)
        if settle > 0:
            # etcd refuses a membership change for 5 s after the last one joined ("unhealthy
            # cluster"): an add now would fail a pass (DNS addressing; the index is given
            # back, ``status.made_nothing``), or start a pod whose etcd exits and backs off
            # (pod-IP addressing).
            return Wait("letting the newest member settle: etcd refuses the next add for 5 s", settle)
        index = max(o.next_index, *(p.index + 1 for p in o.pods)) if o.pods else o.next_index
        if o.addressing == "dns":
            name = pod_name(o.cluster, index)
            url = peer_url(o, name)
            assert url is not None
            return AddMember(name, url, learner=True, index=index)
        return CreatePod(index)
    if len(members) > o.size:
        victim = _scale_down_victim(o, members, pods)
        if (
            not victim.healthy
            and (_rolling(o, pods) or _leaving(o, pods) is not None)
            and victim.id in pods
            and not is_outdated(o, pods[victim.id])
            and not pods[victim.id].draining
        ):
            # The member that surged in is still starting: removing it would only start the
            # surge over (rule 7 removes it if it never becomes healthy).
            return Wait(f"new member {victim.name or pods[victim.id].name} is not healthy yet", 1.0)
        if victim.leader:
            target = _leadership_heir(o, members, pods, victim)
            if target is not None:
                return MoveLeader(victim.id, target.id)
        if removal_keeps_quorum(members, victim):
            outdated = victim.id in pods and is_old_version(o, pods[victim.id])
            why = pods[victim.id].tls_stale if victim.id in pods else None
            leaving = pods.get(victim.id)
            reason = (
                "replaced by a member pod (adoption)"
                if victim.id in o.external_ids
                else f"moved off draining node {leaving.node}"
                if leaving is not None and o.migrate and leaving.draining
                else f"replaced by a member on etcd {o.version}"
                if outdated
                else f"replaced by a member with a new certificate ({why})"
                if why
                else "the cluster is larger than its size"
            )
            return RemoveMember(victim.id, victim.name, reason)
        return Wait("not shrinking: removing a member now would cost quorum")
    if any(not m.healthy for m in members):
        return Wait("a member is unhealthy", _starting_look(o))

    # 9a. Roll back a minor through etcd's downgrade protocol; cancel one nobody wants.
    if o.rollback is not None:
        step = _plan_rollback(o, o.rollback, members, pods)
        if step is not None:
            return step
    elif o.downgrade_enabled:
        return CancelDowngrade()

    # 9. Restart PVC-backed members on the new version, one at a time, the leader last.
    stale = [m for m in members if is_outdated(o, pods[m.id])]
    if stale:
        if (busy := _catching_up(members) or _terminating(pods)) is not None:
            return busy
        victim = min(stale, key=lambda m: (m.leader, pods[m.id].index))
        if victim.leader:
            target = _leadership_heir(o, members, pods, victim)
            if target is not None:
                return MoveLeader(victim.id, target.id)
        pod = pods[victim.id]
        reason = f"restarting it on etcd {o.version}" if is_old_version(o, pod) else ""
        return DeletePod(pod.name, pod.uid, reason or f"restarting it: {pod.tls_stale}")

    # 10. Collect the volumes of members that left (scaled down, replaced). Those of an earlier
    # epoch are not observed: they may hold writes newer than what a rebuild restored.
    coming = {_expected_pod(o, m) for m in members}  # DNS: members whose pod is yet to come
    in_use = {p.name for p in o.pods} | {m.name for m in members} | {c for c in coming if c}
    for claim in o.claims:
        if claim.pod not in in_use and o.now - claim.created >= CLAIM_GRACE:
            return DeleteClaim(claim.name, claim.pod, claim.uid)
    if o.hold is not None:  # every member runs this step of a path across minors; etcd must follow
        return Wait(o.hold, 2.0)
    return Done()


def _plan_rollback(
    o: Observed, target: str, members: tuple[MemberView, ...], pods: dict[int, PodView]
) -> Step | None:
    """The next step of a rollback to ``target`` ("3.5"); None once every pod names it and
    etcd has finished its downgrade."""
    for m in members:
        # A member whose pod names the target but which has not said it runs it (an older
        # version, or no answer yet in the moment it restarts) is still restarting: the next
        # member waits for it, or two restart at once under load.
        if not is_old_version(o, pods[m.id]) and minor(m.version) != target:
            return Wait(f"member {m.name} is restarting on etcd {o.version}", 1.0)
    pending = [m for m in members if is_old_version(o, pods[m.id])]
    if not pending:
        # etcd's leader marks its downgrade finished within seconds of the last restart; until
        # then it refuses new members, so a cluster short of one waits here for that.
        return Wait(f"etcd is finishing its downgrade to {target}", 1.0) if o.downgrade_enabled else None
    if (busy := _catching_up(members) or _terminating(pods)) is not None:
        return busy
    # A member already on the target minor means etcd's downgrade was enabled (etcd lets no
    # such member run otherwise) and its cluster version is the target: a leader of the older
    # minor no longer reports the downgrade, and etcd refuses to enable it again.
    started = any(minor(m.version) == target for m in members)
    if not o.downgrade_enabled and not started and any(minor(m.version) != target for m in members):
        return EnableDowngrade(target)
    victim = min(pending, key=lambda m: (m.leader, pods[m.id].index))
    if victim.leader:
        heir = _leadership_heir(o, members, pods, victim)
        if heir is not None:
            return MoveLeader(victim.id, heir.id)
    if minor(victim.version) != target and victim.storage_version != f"{target}.0":
        # etcd of the old minor refuses data written for the newer one.
        return Wait(f"etcd is downgrading the storage of {victim.name} to {target}", 1.0)
    pod = pods[victim.id]
    return ReplaceImage(pod.name, pod.uid, o.version or "")


def _leaving(o: Observed, pods: dict[int, PodView]) -> PodView | None:
    """The member pod to move off a draining node (rule 8b), if any."""
    if not o.migrate:
        return None
    return next(
        (p for p in sorted(pods.values(), key=lambda p: p.index) if p.draining and not p.deleting), None
    )


def _catching_up(members: tuple[MemberView, ...]) -> Wait | None:
    """Wait for a member that is healthy but still far behind the leader (a restart's catch-up)."""
    behind = max(members, key=lambda m: m.lag)
    if behind.lag <= CATCH_UP_SLACK:
        return None
    return Wait(f"member {behind.name} is catching up: {behind.lag} raft entries behind the leader", 1.0)


def _terminating(pods: dict[int, PodView]) -> Wait | None:
    """Wait for a member's pod that is going away (an eviction, a restart): one member down at a time."""
    restarting = next((p for p in pods.values() if p.deleting), None)
    return Wait(f"pod {restarting.name} is terminating", 1.0) if restarting is not None else None


def minor(version: str) -> str:
    """``major.minor`` of a version ("3.6.16" -> "3.6"); "" when unknown."""
    return ".".join(version.split(".")[:2]) if version.count(".") >= 1 else ""


def rolling_back(o: Observed) -> bool:
    """A rollback is under way: some member does not run the target minor yet."""
    return o.rollback is not None and any(minor(m.version) != o.rollback for m in o.members or ())


def is_old_version(o: Observed, pod: PodView) -> bool:
    return o.version is not None and pod.version is not None and pod.version != o.version


# The first release of each minor whose add asks for a quorum of settled voters, not all of
# them (etcd's isConnectedToQuorumAfterAddingNewMemberSince, 887c848 "Fix the issue of not
# being able to adding new member when one existing member is down"); 3.7.0 has it.
QUORUM_SETTLE_SINCE = {"3.5": (3, 5, 30), "3.6": (3, 6, 11)}


def _settles_by_quorum(members: tuple[MemberView, ...]) -> bool:
    """Every member runs an etcd whose add needs only a quorum of settled voters."""
    for m in members:
        parts = m.version.split(".")
        if len(parts) != 3 or not all(p.isdigit() for p in parts):
            return False  # unknown: the older, stricter rule
        version = (int(parts[0]), int(parts[1]), int(parts[2]))
        if version < QUORUM_SETTLE_SINCE.get(minor(m.version), (3, 7, 0)):
            return False
    return True


def _settling(o: Observed, members: tuple[MemberView, ...], pods: dict[int, PodView]) -> float:
    """Seconds until etcd accepts the next add: until the leader has been connected for
    RECONFIG_SETTLE to enough other voters (etcd's ``mayAddMember`` with the new member
    counted as down).

    Before 3.5.30 / 3.6.11 that is every other voter. Since, it is a quorum of the voters after
    the add, the leader included: growing 3 -> 5, the fifth member need not wait for the fourth
    (just promoted) to settle, as two settled peers and the leader are a quorum of five. The
    rule is etcd's own; an add it would refuse is never sent.
    """
    voters = [m for m in members if not m.learner]
    others = [m for m in voters if not m.leader]
    needed = quorum(len(voters) + 1) - 1 if _settles_by_quorum(members) else len(others)
    if needed <= 0:
        return 0.0
    # A voter with no pod we know of (or no start time) has been up longer than we can see.
    long_ago = datetime.min.replace(tzinfo=o.now.tzinfo)
    since = sorted((pods[m.id].running_since if m.id in pods else None) or long_ago for m in others)
    if len(since) < needed:
        return 0.0  # fewer peers than a quorum needs: etcd's rule is about the ones it has
    settled_by = since[needed - 1]  # the needed-th longest connected
    return max(0.0, (settled_by + RECONFIG_SETTLE - o.now).total_seconds())


def is_outdated(o: Observed, pod: PodView) -> bool:
    """Runs another version than wanted, or must restart onto a new certificate."""
    return is_old_version(o, pod) or pod.tls_stale is not None


def _rolling(
    o: Observed, pods: dict[int, PodView], outdated: Callable[[Observed, PodView], bool] = is_outdated
) -> bool:
    return any(outdated(o, p) for p in pods.values() if not p.deleting)


def _leadership_heir(
    o: Observed, members: tuple[MemberView, ...], pods: dict[int, PodView], leader: MemberView
) -> MemberView | None:
    """A healthy voter to lead instead, preferring one already on the target version."""
    candidates = [m for m in members if m.healthy and not m.learner and m.id != leader.id]
    candidates.sort(key=lambda m: (m.id in o.external_ids, m.id in pods and is_outdated(o, pods[m.id])))
    return candidates[0] if candidates else None


def _plan_without_membership(o: Observed) -> Step:
    live = [p for p in o.pods if not p.deleting]
    if o.ever_formed and o.storage == "pvc":
        names = {p.name for p in o.pods}
        missing = [(name, member_id) for name, member_id in o.recorded_members if name not in names]
        if (recreate := _recreate(missing)) is not None:
            return recreate
    if not o.ever_formed:
        if not o.pods:
            return CreateSeed(o.next_index)
        if len(live) == 1:
            return Wait(f"seed member {live[0].name} is starting", 1.0)
        return Wait("waiting for the first member to answer", 1.0)
    return QuorumLost("no member of the cluster answers", seconds=_starting_look(o))


def recorded_member_without_pod(o: Observed) -> bool:
    """A PVC-backed member the status recorded has no pod: one rule 1b may bring back."""
    if not (o.ever_formed and o.storage == "pvc") or o.external_ids:
        return False
    present = {p.name for p in o.pods}
    return any(name not in present for name, _ in o.recorded_members)


def membership_unanswerable(o: Observed) -> bool:
    """Whether asking the membership is sure to fail, and failing leads where the pods tell
    already: a PVC-backed member to bring back (``_plan_without_membership``).

    The member list is linearizable: the leader must hear from a majority of the voters before it
    answers (ReadIndex), and a voter without an etcd process (no pod, or no running container)
    cannot answer. When fewer of the recorded voters could answer than their quorum, the list
    hangs until its timeout (``LIST_TIMEOUT``, 2 s: a survivor that led keeps naming itself
    leader meanwhile), and then the same member comes back. So this says yes only when a
    recorded member has no pod; otherwise the list's own answer (or its timeout) decides."""
    if not (o.recorded_voters and recorded_member_without_pod(o)):
        return False
    able = {p.name for p in o.pods if p.running}  # a stopping pod counts while its container runs
    return sum(1 for v in o.recorded_voters if v in able) < quorum(len(o.recorded_voters))


def learner_look(o: Observed, learner: str) -> float:
    """When to ask again to promote ``learner``, which etcd found not caught up."""
    pod = next((p for p in o.pods if p.name == learner and not p.deleting), None)
    fresh = pod is not None and pod.running_since is not None and o.now - pod.running_since < LEARNER_FRESH
    return LEARNER_CATCH_UP if fresh else 1.0


def _starting_look(o: Observed, growth: bool = False) -> float:
    """When to look again at an unhealthy member or a lost quorum: often while a member's etcd
    has just started (a member back on its volume may serve, or restore quorum, any moment; a
    ``growth`` waits on a learner, less often), else every 2 s. A pod that starts running wakes
    the controller by itself."""
    youngest = min(
        (o.now - p.running_since for p in o.pods if not p.deleting and p.running_since is not None),
        default=RECOVERY_WINDOW,
    )
    if youngest >= RECOVERY_WINDOW:
        return 2.0
    if growth:
        return GROWTH_LOOK
    return RECOVERY_FIRST_LOOK if youngest < RECOVERY_FIRST else RECOVERY_LOOK


def _expected_pod(o: Observed, member: MemberView) -> str | None:
    """The pod name a DNS-addressed member's peer URL names."""
    if o.addressing != "dns":
        return None
    host = member.peer_url.split("://", 1)[-1].split(":", 1)[0]
    name = host.split(".", 1)[0]
    return name if pod_index(o.cluster, name) is not None else None


def _scale_down_victim(o: Observed, members: tuple[MemberView, ...], pods: dict[int, PodView]) -> MemberView:
    unhealthy = [m for m in members if not m.healthy]
    if unhealthy:
        return unhealthy[0]

    def adopted_draining_outdated_then_newest_follower(m: MemberView) -> tuple[bool, bool, bool, bool, int]:
        pod = pods.get(m.id)
        external = m.id in o.external_ids
        leaving = pod is not None and o.migrate and pod.draining
        outdated = pod is not None and is_outdated(o, pod)
        return (external, leaving, outdated, not m.leader, pod.index if pod else -1)

    return max(members, key=adopted_draining_outdated_then_newest_follower)
