"""The EtcdCluster's status, computed once per pass from what was seen and the step taken (pure).

Every pass of the EtcdCluster controller ends in ``status(seen, step, now, failure)``,
written by ``runtime.record`` (which writes only a change): the membership pass, a
rebuild's step, the start of a rebuild or an adoption, and the refusals. ``notes`` says
which Events the transition from the old status to the new one is worth: an Event per
change, not per pass.

Progress that must survive a restart (the next member index, a rebuild's attempt and
seed index) is part of this same status: for the steps that depend on it
(``needs_intent``) the controller records it BEFORE acting, and the record after acting
then changes nothing unless the act failed.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Literal
from urllib.parse import urlsplit

from kustos.api.etcd import (
    AdoptionStatus,
    EtcdCluster,
    EtcdClusterStatus,
    MemberStatus,
    RecoveryStatus,
)
from kustos.etcd import chain, planner, recovery
from kustos.etcd.client import UnhealthyCluster
from kustos.etcd.cluster_planner import Blocked, StartAdoption, StartRebuild
from kustos.etcd.observe import EtcdView
from kustos.etcd.planner import Observed, Step
from kustos.etcd.pods import CLUSTER_LABEL, EPOCH_LABEL, PodRefused
from kustos.etcd.recovery import RecoveryStep, Source
from kustos.etcd.restore import SnapshotSource
from kustos.etcd.stuck import REASONS as STUCK_REASONS
from kustos.etcd.stuck import Stuck, summary
from kustos.etcd.versions import agreed_version, rollback_target, version_refusal
from kustos.runtime.conditions import get_condition, set_condition
from kustos.runtime.errors import ReconcileError
from kustos.runtime.events import WARNING
from kustos.runtime.record import Note, note_failure
from kustos.runtime.steps import Done, Wait
from kustos.runtime.times import parse_rfc3339, rfc3339

Obj = dict[str, Any]
Phase = Literal["Creating", "Running", "Scaling", "Upgrading", "Recovering", "QuorumLost", "Failed"]

# A member that is merely slow to answer must not make a healthy cluster look lost:
# quorum loss is reported once it has been observed for this long.
QUORUM_LOSS_GRACE = timedelta(seconds=5)
# How long a running member's name may fail to resolve before the status says so.
RESOLVE_GRACE = timedelta(seconds=10)


# ---- what a pass saw ----------------------------------------------------------------------


@dataclass(frozen=True)
class Seen:
    """The input of ``status``: the status as last recorded, and what this pass observed."""

    previous: Obj  # the status as read (a dict: fields this controller does not own are kept)
    generation: int | None
    cluster: EtcdCluster | None = None  # None: the spec does not validate
    observed: Observed | None = None  # the planner's input (membership passes)
    etcd: EtcdView | None = None
    client_urls: Mapping[str, str] = field(default_factory=dict)
    stuck: tuple[Stuck, ...] = ()  # pods that cannot start or run (``stuck.classify``)


# ---- the steps of a pass beyond the planner's -----------------------------------------------


@dataclass(frozen=True)
class Unobserved:
    """The pass failed before it could plan (an API or etcd call while observing): the status
    stays as it was, with the failure in Progressing."""


@dataclass(frozen=True)
class Rebuild:
    """One step of a running rebuild (``recovery.plan_recovery``), with the rebuild as recorded
    before it; once finished, the seed that became the cluster."""

    step: RecoveryStep
    rebuild: RecoveryStatus
    seed: planner.PodView | None = None
    seed_member: str = ""  # FinishRecovery: the seed's member name and cluster ID
    cluster_id: int = 0
    seed_url: str = ""
    where: SnapshotSource | None = None  # CreateRestoreSeed: what the seed restores from


ClusterStep = Step | Unobserved | Blocked | StartRebuild | StartAdoption | Rebuild


def needs_intent(step: ClusterStep) -> bool:
    """Whether the step's act depends on progress recorded first: a member index (a name is
    never used twice), a rebuild's attempt and seed index, or the rebuild itself."""
    match step:
        case planner.CreateSeed() | planner.CreatePod() | StartRebuild():
            return True
        case planner.AddMember(index=index):
            return index is not None
        case Rebuild(step=recovery.CreateRestoreSeed()):
            return True
    return False


def describe(step: ClusterStep) -> str:
    match step:
        case Wait(reason=reason):
            return reason
        case planner.QuorumLost(message=message) | planner.UpgradeHalted(message=message):
            return message
        case Done():
            return "the cluster matches its spec"
        case Blocked(message=message):
            return message
        case Rebuild(step=inner):
            return rebuild_message(inner)
        case planner.RecreatePod() as back:
            names = " and ".join(name for name, _ in back.members)
            return f"bringing {names} back on {'their volumes' if back.also else 'its volume'}"
    return str(step)


def rebuild_message(step: RecoveryStep) -> str:
    match step:
        case Wait(reason=reason):
            return reason
        case recovery.RecoveryFailed(message=message):
            return message
        case planner.DeletePod(name=name, reason=reason):
            return f"deleting pod {name}: {reason}"
        case recovery.CreateRestoreSeed(index=index):
            return f"starting seed member {index}"
    return str(step)


# ---- the status -------------------------------------------------------------------------------


def status(seen: Seen, step: ClusterStep, now: datetime, failure: ReconcileError | None = None) -> Obj:
    """The whole status to record after ``step`` (a replace: what is left out is cleared)."""
    stamp = rfc3339(now)
    match step:
        case Blocked(reason=reason, message=message):
            result = _degraded(seen, reason, message, stamp)
        case Unobserved():
            result = dict(seen.previous)
        case StartRebuild():
            result = _start_rebuild(seen, step, stamp)
        case StartAdoption():
            result = _start_adoption(seen, step, stamp)
        case Rebuild():
            result = _rebuild(seen, step, stamp, isinstance(failure, PodRefused))
        case _:
            result = _membership(seen, step, now, made_nothing(failure))
    if not isinstance(step, Unobserved):
        result = _stuck(seen, result, step, stamp)
    if failure is not None:
        result["conditions"] = note_failure(result.get("conditions"), failure, stamp, seen.generation)
    return result


def _stuck(seen: Seen, result: Obj, step: ClusterStep, stamp: str) -> Obj:
    """Pods that cannot start or run: listed, and named in Degraded and Progressing (a quorum
    loss, a halted upgrade or a failed rebuild keep their reason; the pods are added to it)."""
    result = dict(result)
    found = _no_spare_node(seen)
    if not found:
        # Empty, as the API server stores it (the CRD's default): left out, it read as a change
        # on every pass, and every pass rewrote an unchanged status (issue 28).
        result["stuck"] = []
        return result
    result["stuck"] = [{"pod": s.pod, "reason": s.reason, "message": s.message[:1000]} for s in found]
    first, message = found[0], summary(found)
    conditions = result.get("conditions")
    degraded = get_condition(conditions, "Degraded") or {}
    if degraded.get("status") == "True" and degraded.get("reason") in KEPT_REASONS:
        said = degraded.get("message") or ""
        reason, message = str(degraded["reason"]), (message if not said else f"{said}; {message}")[:1000]
    else:
        reason = first.reason
    conditions = set_condition(conditions, "Degraded", True, reason, message, seen.generation, stamp)
    if not isinstance(step, Done):
        conditions = set_condition(conditions, "Progressing", False, first.reason, message, seen.generation,
                                   stamp)  # fmt: skip
    result["conditions"] = conditions
    return result


def _no_spare_node(seen: Seen) -> tuple[Stuck, ...]:
    """A member that must leave a draining node whose replacement cannot be scheduled: said
    as what blocks the drain, naming the node."""
    o = seen.observed
    leaving = next((p for p in o.pods if p.draining and not p.deleting), None) if o and o.migrate else None
    if leaving is None:
        return seen.stuck
    return tuple(
        Stuck(s.pod, "NoSpareNode", (
            f"member {leaving.name} cannot leave node {leaving.node} "
            "(cordoned, being removed, or its eviction asked): "
            f"its replacement {s.message.removeprefix('member pod ')}; "
            f"the drain of {leaving.node} waits until then, or uncordon {leaving.node}"
        )) if s.reason == "Unschedulable" else s
        for s in seen.stuck
    )  # fmt: skip


# Degraded reasons worse than a stuck pod: they stay, and the pods are added to their message.
KEPT_REASONS = ("QuorumLost", "UpgradeHalted", "RecoveryFailed", "InvalidSpec", "RestoreWaiting",
                "AdoptionWaiting")  # fmt: skip


def _degraded(seen: Seen, reason: str, message: str, stamp: str) -> Obj:
    result = dict(seen.previous)
    result["conditions"] = set_condition(
        result.get("conditions"), "Degraded", True, reason, message[:1000], seen.generation, stamp
    )
    return result


def _start_rebuild(seen: Seen, step: StartRebuild, stamp: str) -> Obj:
    result = dict(seen.previous)
    result["recovery"] = RecoveryStatus(
        epoch=step.epoch, source_kind=step.source.kind, source=step.source.name,
        revision=step.source.revision, reason=step.reason, started_at=stamp,
        message=f"rebuilding from {step.source.describe()}",
    ).model_dump(by_alias=True, exclude_none=True)  # fmt: skip
    result["phase"] = "Recovering"
    return result


def _start_adoption(seen: Seen, step: StartAdoption, stamp: str) -> Obj:
    assert seen.cluster is not None
    members = step.members
    result = dict(seen.previous)
    result.update({
        "clusterId": f"{step.cluster_id:x}", "currentVersion": step.version,
        "storageType": seen.cluster.spec.storage.type, "phase": "Scaling",
        "adoption": AdoptionStatus(
            external_members=[f"{m.id:x}" for m in members],
            endpoints=sorted({u for m in members for u in m.client_urls}),
            started_at=stamp,
        ).model_dump(by_alias=True, exclude_none=True),
    })  # fmt: skip
    return result


def _rebuild(seen: Seen, step: Rebuild, stamp: str, refused: bool = False) -> Obj:
    """``refused``: the API server refused the seed's pod, so it was no attempt and its index
    stays free for the retry (``reserve_index``)."""
    assert seen.cluster is not None
    rebuild = step.rebuild.model_copy(deep=True)
    inner = step.step
    if isinstance(inner, recovery.FinishRecovery):
        return _finished(seen, step, rebuild, stamp)
    result = dict(seen.previous)
    if isinstance(inner, recovery.CreateRestoreSeed):
        rebuild.attempts += 0 if refused else 1
        result["nextMemberIndex"] = reserve_index(
            int(result.get("nextMemberIndex") or 0), inner.index, refused
        )
    if isinstance(inner, recovery.RecoveryFailed):
        rebuild.phase = "Failed"
        rebuild.completed_at = stamp
    rebuild.message = rebuild_message(inner)
    result["recovery"] = rebuild.model_dump(by_alias=True, exclude_none=True)
    result["phase"] = "Failed" if rebuild.phase == "Failed" else "Recovering"
    result["conditions"] = _rebuild_conditions(seen, rebuild, done=False, stamp=stamp)
    return result


def _finished(seen: Seen, step: Rebuild, rebuild: RecoveryStatus, stamp: str) -> Obj:
    assert seen.cluster is not None and step.seed is not None
    status = EtcdClusterStatus.model_validate(seen.previous or {})
    rebuild.phase = "Succeeded"
    rebuild.completed_at = stamp
    rebuild.message = (
        f"rebuilt from {Source(rebuild.source_kind, rebuild.source, rebuild.revision).describe()}"
    )
    status.recovery = rebuild
    status.epoch = rebuild.epoch
    status.cluster_id = f"{step.cluster_id:x}"
    status.members = [
        MemberStatus(
            name=step.seed_member or step.seed.name, pod=step.seed.name, client_url=step.seed_url,
            healthy=True, leader=True,
        )
    ]  # fmt: skip
    status.size = 1
    status.ready = f"1/{seen.cluster.spec.size}"
    status.phase = "Scaling" if seen.cluster.spec.size > 1 else "Running"
    result = status.model_dump(by_alias=True, exclude_none=True)
    result["conditions"] = _rebuild_conditions(seen, rebuild, done=True, stamp=stamp)
    return result


def _rebuild_conditions(seen: Seen, rebuild: RecoveryStatus, done: bool, stamp: str) -> list[Obj]:
    generation = seen.generation
    conditions = seen.previous.get("conditions")
    message = rebuild.message or ""
    failed = rebuild.phase == "Failed"
    conditions = set_condition(conditions, "Available", done, "Recovered" if done else "Recovering",
                               message, generation, stamp)  # fmt: skip
    conditions = set_condition(
        conditions, "Progressing", not failed, "Recovering", message, generation, stamp
    )
    reason = "RecoveryFailed" if failed else "Recovered" if done else "Recovering"
    return set_condition(conditions, "Degraded", not done, reason, message, generation, stamp)


def made_nothing(failure: ReconcileError | None) -> bool:
    """Whether a failed step certainly made nothing under the member index it reserved: the API
    server refused the member's pod, or etcd refused to add the member (it answers
    ``UnhealthyCluster`` before proposing anything). A timeout may have made it: not this."""
    return isinstance(failure, PodRefused | UnhealthyCluster)


def reserve_index(next_index: int, index: int, refused: bool) -> int:
    """``status.nextMemberIndex`` once member ``index`` was made: past it, so no name is used
    twice. ``refused`` (``made_nothing``): the name was never used and the retry takes the same
    index (recorded: a restarted operator retries it too). The step's intent reserved it before
    the call; this final record gives it back, never going below what was recorded before (a
    DNS member added to etcd keeps its index)."""
    return max(next_index, index if refused else index + 1)


def _membership(seen: Seen, step: Step, now: datetime, refused: bool = False) -> Obj:
    """The membership pass: members as etcd reports them, the phase, and the conditions
    (``refused``: the step made nothing under its member index; ``made_nothing``)."""
    cluster, o, etcd = seen.cluster, seen.observed, seen.etcd
    assert cluster is not None and o is not None and etcd is not None
    stamp = rfc3339(now)
    old = seen.previous
    status = EtcdClusterStatus.model_validate(old) if old else EtcdClusterStatus()
    status.storage_type = status.storage_type or cluster.spec.storage.type
    match step:
        case planner.CreateSeed(index=index) | planner.CreatePod(index=index):
            status.next_member_index = reserve_index(status.next_member_index, index, refused)
        case planner.AddMember(index=int(index)):
            status.next_member_index = reserve_index(status.next_member_index, index, refused)
    pods_by_name = {p.name: p for p in o.pods}
    members: list[MemberStatus] = []
    for m in o.members or ():
        name = m.name or next((p.name for p in o.pods if planner.peer_url(o, p) == m.peer_url), m.peer_url)
        url = seen.client_urls.get(name, "")
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
            status.adoption.completed_at = stamp
    walk = chain.progress(cluster, etcd.cluster_version, o.downgrade_enabled, o.now)
    status.version_path = walk.path
    if (agreed := agreed_version(m.version for m in members)) is not None:
        status.current_version = agreed
    healthy_voters = sum(1 for m in members if m.healthy and not m.learner)
    status.ready = f"{healthy_voters}/{cluster.spec.size}"
    generation = seen.generation
    conditions = [c.model_dump(by_alias=True, exclude_none=True) for c in status.conditions]
    lost = isinstance(step, planner.QuorumLost)
    confirmed = lost and quorum_loss_confirmed(conditions, now)
    gave_up = status.recovery is not None and status.recovery.phase == "Failed"
    if confirmed:
        status.phase = "Failed" if gave_up else "QuorumLost"
    elif not lost:
        status.phase = phase(cluster, o, step, healthy_voters)
    available = o.members is not None and not lost
    conditions = set_condition(conditions, "Available", available,
                               "QuorumHealthy" if available else "QuorumLost",
                               f"{healthy_voters} healthy voting members", generation, stamp)  # fmt: skip
    halted = isinstance(step, planner.UpgradeHalted)
    said = chain.halted(walk.path, describe(step)) if halted and walk.path else describe(step)
    progressing = not isinstance(step, Done | planner.QuorumLost)
    conditions = set_condition(conditions, "Progressing", progressing,
                               type(step).__name__, said, generation, stamp)  # fmt: skip
    no_space = bool(etcd.no_space) and not confirmed and not halted
    degraded = confirmed or halted or no_space or any(not m.healthy for m in members)
    reason = (
        "QuorumLost" if confirmed else "UpgradeHalted" if halted else "NoSpace" if no_space
        else "MemberUnhealthy" if degraded else "AllHealthy"
    )  # fmt: skip
    message = NO_SPACE if no_space else said if degraded else ""
    conditions = set_condition(conditions, "Degraded", degraded, reason, message, generation, stamp)
    refusal = version_refusal(cluster)
    conditions = set_condition(
        conditions, "VersionAccepted", refusal is None, "UpgradeRefused" if refusal else "Accepted",
        refusal or f"etcd {cluster.spec.version}", generation, stamp,
    )  # fmt: skip
    conditions = _space(conditions, etcd, generation, stamp)
    unresolved = lasting_unresolved(seen, now)
    conditions = set_condition(
        conditions, "MembersResolvable", not unresolved,
        "NameNotResolved" if unresolved else "Resolved", unresolved_message(unresolved),
        generation, stamp,
    )  # fmt: skip
    certs = etcd.tls
    if certs is not None:
        if certs.problem is None:
            status.tls = certs.status
        conditions = set_condition(
            conditions, "CertificatesReady", certs.problem is None,
            "SecretInvalid" if certs.problem else "Renewing" if certs.stale else "Current",
            certs.problem or (f"{len(certs.stale)} member(s) to restart" if certs.stale else "current"),
            generation, stamp,
        )  # fmt: skip
    result = status.model_dump(by_alias=True, exclude_none=True)
    result["conditions"] = conditions
    # The maintenance controller's record, as read: not this controller's to change.
    if "maintenance" in old:
        result["maintenance"] = old["maintenance"]
    return result


NO_SPACE = (
    "etcd refuses writes: the NOSPACE alarm is raised (a member's database reached its quota, "
    "--quota-backend-bytes); the operator compacts, defragments each member and disarms it"
)


def _space(conditions: list[Obj], etcd: EtcdView, generation: int | None, stamp: str) -> list[Obj]:
    """SpaceAvailable: False while etcd's NOSPACE alarm is raised (the maintenance controller
    recovers it; its Events say how)."""
    if etcd.no_space:
        return set_condition(conditions, "SpaceAvailable", False, "NoSpace", NO_SPACE, generation, stamp)
    if etcd.statuses:
        return set_condition(conditions, "SpaceAvailable", True, "UnderQuota", "no NOSPACE alarm", generation,
                             stamp)  # fmt: skip
    return conditions


def lasting_unresolved(seen: Seen, now: datetime) -> tuple[str, ...]:
    """Names that still do not resolve although their pod has run with an IP for
    RESOLVE_GRACE: the cluster DNS publishes a new pod's record within seconds, so a name
    missing after that will not appear by waiting."""
    assert seen.observed is not None and seen.etcd is not None
    pods = {p.name: p for p in seen.observed.pods}
    lasting = []
    for name, url in seen.client_urls.items():
        host, pod = urlsplit(url).hostname, pods.get(name)
        if host not in seen.etcd.unresolved or pod is None or not (pod.running and pod.ip):
            continue
        if pod.running_since is not None and now - pod.running_since >= RESOLVE_GRACE:
            lasting.append(host)
    return tuple(sorted(lasting))


def unresolved_message(hosts: tuple[str, ...]) -> str:
    """Why members cannot be reached by name, naming each name (issue: a silent 0/3 Creating)."""
    if not hosts:
        return "every member's address resolves"
    return (
        f"the operator cannot resolve {', '.join(hosts)}: with spec.addressing dns the operator "
        "must use the cluster's DNS (it does when it runs in the cluster); otherwise use "
        "spec.addressing podIP"
    )


def quorum_loss_confirmed(conditions: list[Obj], now: datetime) -> bool:
    """Quorum has been reported lost (Available False, QuorumLost) for QUORUM_LOSS_GRACE."""
    previous = get_condition(conditions, "Available")
    since = parse_rfc3339(previous.get("lastTransitionTime")) if previous else None
    return (
        previous is not None and previous.get("reason") == "QuorumLost" and previous.get("status") == "False"
        and since is not None and now - since >= QUORUM_LOSS_GRACE
    )  # fmt: skip


def phase(cluster: EtcdCluster, o: Observed, step: Step, healthy_voters: int) -> Phase:
    if not o.ever_formed or (
        cluster.status and cluster.status.phase == "Creating" and healthy_voters < o.size
    ):
        return "Creating"
    if isinstance(step, Done):
        return "Running"
    if (
        any(planner.is_old_version(o, p) for p in o.pods)
        or planner.rolling_back(o)
        or o.hold is not None
        or isinstance(step, planner.UpgradeHalted)
    ):
        return "Upgrading"
    if (o.members is not None and any(not m.healthy for m in o.members)) or isinstance(
        step, planner.RecreatePod
    ):
        return "Recovering"
    return "Scaling" if o.members is not None and len(o.members) != o.size else "Running"


# ---- the Events a transition is worth ----------------------------------------------------------


def path_notes(old: Obj, new: Obj) -> list[Note]:
    """A path across minors started, or moved on to its next step (etcd/chain.py)."""
    if not new or (new.get("step") == old.get("step") and new.get("target") == old.get("target")):
        return []
    steps = list(new.get("steps") or [])
    if new.get("target") != old.get("target"):
        through = ", ".join(steps[:-1])
        return [Note("VersionPathStarted", (
            f"going from etcd {new.get('source')} to {new.get('target')} one minor at a time, through "
            f"{through}: each step rolls every member, and the next waits for etcd's cluster version"
        ))]  # fmt: skip
    at = steps.index(new["step"]) + 1 if new.get("step") in steps else 0
    return [Note("VersionStepStarted", (
        f"every member runs etcd {old.get('step')} and etcd's cluster version reached it: "
        f"rolling on to etcd {new.get('step')} (step {at} of {len(steps)})"
    ))]  # fmt: skip


def _condition(status: Obj, type_: str) -> Obj:
    return get_condition(status.get("conditions"), type_) or {}


def _turned(
    old: Obj, new: Obj, type_: str, fields: tuple[str, ...] = ("status", "reason", "message")
) -> bool:
    before, after = _condition(old, type_), _condition(new, type_)
    return any(before.get(f) != after.get(f) for f in fields)


def recovered_message(cluster: EtcdCluster, new: Obj) -> str:
    """What a finished rebuild says, and which volumes it leaves to the user."""
    rebuild = new.get("recovery") or {}
    message = f"{rebuild.get('message') or 'rebuilt'}; growing back to {cluster.spec.size} members"
    if cluster.spec.storage.type == "pvc":
        older = f"{CLUSTER_LABEL}={cluster.metadata['name']},{EPOCH_LABEL}!={rebuild.get('epoch')}"
        message += (
            "; the volumes of the members before it are kept (they may hold newer writes): "
            f"kubectl delete pvc -l {older} once they are not needed"
        )
    return message


def invalid_spec_notes(old: Obj, new: Obj) -> list[Note]:
    """An Event when a spec the model refuses (``runtime.reconciler.InvalidSpec``) turns
    Degraded, or its message changes: not on every pass that finds it still invalid."""
    degraded = _condition(new, "Degraded")
    if degraded.get("reason") != "InvalidSpec" or not _turned(old, new, "Degraded"):
        return []
    return [Note("InvalidSpec", str(degraded.get("message") or "")[:500], WARNING)]


def notes(seen: Seen, step: ClusterStep, new: Obj) -> list[Note]:
    """Events for what changed between the recorded status and ``new`` (none for a pass that
    changes nothing), and for a pass's one-off news (certificates issued)."""
    old = seen.previous
    found: list[Note] = []
    degraded = _condition(new, "Degraded")
    match step:
        case Blocked(reason=reason, event=event) if _turned(old, new, "Degraded"):
            found.append(Note(reason, event, WARNING))
        case StartRebuild(source=source, reason=reason):
            message = f"rebuilding the cluster from {source.describe()} ({reason})"
            found.append(Note("RecoveryStarted", message, WARNING))
        case StartAdoption(cluster_id=cluster_id, members=members, version=version):
            names = ", ".join(m.name or format(m.id, "x") for m in members)
            message = f"adopting etcd cluster {cluster_id:x} ({names}) on etcd {version}"
            found.append(Note("AdoptionStarted", message))
    cluster = seen.cluster
    if cluster is None:
        return found
    size = cluster.spec.size
    if size % 2 == 0 and old.get("observedGeneration") != seen.generation:
        found.append(
            Note("EvenSize", f"size {size} tolerates no more failures than size {size - 1}", WARNING)
        )
    resolvable = _condition(new, "MembersResolvable")
    if resolvable.get("status") == "False" and _turned(old, new, "MembersResolvable", ("status", "message")):
        found.append(Note("MemberNameUnresolved", resolvable.get("message") or "", WARNING))
    accepted = _condition(new, "VersionAccepted")
    if accepted.get("status") == "False" and _turned(old, new, "VersionAccepted"):
        found.append(Note("UpgradeRefused", accepted.get("message") or "", WARNING))
    if degraded.get("reason") in STUCK_REASONS and _turned(
        old, new, "Degraded", ("status", "reason", "message")
    ):
        found.append(Note(str(degraded["reason"]), degraded.get("message") or "", WARNING))
    if isinstance(step, Rebuild):
        if isinstance(step.step, recovery.RecoveryFailed):
            found.append(Note("RecoveryFailed", step.step.message, WARNING))
        if isinstance(step.step, recovery.FinishRecovery):
            found.append(Note("Recovered", recovered_message(cluster, new)))
        return found
    if seen.observed is None:
        return found
    old_adoption, new_adoption = old.get("adoption") or {}, new.get("adoption") or {}
    if old_adoption.get("phase") == "Migrating" and new_adoption.get("phase") == "Completed":
        found.append(Note("AdoptionCompleted", "every original member has been replaced by a pod"))
    quorum_lost = degraded.get("reason") == "QuorumLost" and degraded.get("status") == "True"
    if quorum_lost and _turned(old, new, "Degraded", ("status", "reason")):
        found.append(Note("QuorumLost", degraded.get("message") or "", WARNING))
    space = _condition(new, "SpaceAvailable")
    if space.get("status") == "False" and _turned(old, new, "SpaceAvailable", ("status",)):
        found.append(Note("NoSpace", space.get("message") or "", WARNING))
    if degraded.get("reason") == "UpgradeHalted" and _turned(old, new, "Degraded", ("status", "reason")):
        found.append(Note("UpgradeHalted", degraded.get("message") or "", WARNING))
    found += path_notes(old.get("versionPath") or {}, new.get("versionPath") or {})
    was, now_runs = old.get("currentVersion"), new.get("currentVersion")
    if was and now_runs != was:
        went_down = rollback_target(was, now_runs or "") is not None
        found.append(Note("Downgraded" if went_down else "Upgraded", f"every member runs etcd {now_runs}"))
    certs = seen.etcd.tls if seen.etcd is not None else None
    if certs is not None:
        was_renewing = bool((old.get("tls") or {}).get("renewing"))
        if certs.issued:
            found.append(Note("CertificatesIssued", "issued " + ", ".join(certs.issued)))
        if certs.stale and not was_renewing:
            reasons = sorted(set(certs.stale.values()))
            found.append(Note(
                "CertificatesRenewing",
                f"restarting {len(certs.stale)} member(s) one at a time onto new certificates: "
                + "; ".join(reasons),
            ))  # fmt: skip
        if was_renewing and not certs.stale and certs.problem is None:
            found.append(Note("CertificatesRenewed", "every member runs on a current certificate"))
        if certs.problem is not None and _turned(old, new, "CertificatesReady"):
            found.append(Note("TLSSecretInvalid", certs.problem, WARNING))
        found += _ca_rotation_notes(old, new)
        if certs.warning is not None:
            # Not a transition: the warning's message names the days left, and the recorder
            # folds a repeat into the first Event's count.
            found.append(Note("CAExpiring", certs.warning, WARNING))
    return found


def _ca_rotation_notes(old: dict[str, Any], new: dict[str, Any]) -> list[Note]:
    """A CA rotation's start, each phase and its end, with their times."""
    was = (old.get("tls") or {}).get("caRotation") or {}
    now = (new.get("tls") or {}).get("caRotation") or {}
    if not now or (was.get("phase"), was.get("started")) == (now.get("phase"), now.get("started")):
        return []
    phase = now.get("phase")
    steps = {
        "Trust": "members restart one at a time to trust the old and the new CA",
        "Reissue": "members restart one at a time onto certificates of the new CA",
        "Drop": f"the old CA was dropped at {now.get('oldCaDropped')}; "
        "members restart to trust the new CA only",
    }
    if phase == "Trust" and was.get("started") != now.get("started"):
        return [Note("CARotationStarted", f"a new CA was made at {now.get('started')} ({now.get('reason')}); "
                     + steps["Trust"])]  # fmt: skip
    if phase in steps:
        return [Note("CARotationPhase", f"{phase} since {now.get('phaseStarted')}: {steps[phase]}")]
    if now.get("completed") and was.get("phase"):
        message = (
            f"every member trusts the new CA only, since {now['completed']} "
            f"(started {now.get('started')}, old CA dropped {now.get('oldCaDropped')})"
        )
        return [Note("CARotationCompleted", message)]
    return []


__all__ = [
    "QUORUM_LOSS_GRACE", "ClusterStep", "Rebuild", "Seen", "Unobserved", "describe", "invalid_spec_notes",
    "needs_intent", "notes", "phase", "quorum_loss_confirmed", "recovered_message", "status",
]  # fmt: skip
