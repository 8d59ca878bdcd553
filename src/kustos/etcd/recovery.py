"""Disaster recovery, the pure part (F-ETCD-8): whether to rebuild, from what, and the next step.

When a majority of members is lost, etcd cannot change its own membership, so the
cluster is rebuilt in place, under the same name and Services, as a new *epoch*:

1. fence: delete every pod of the old epoch except the surviving member the rebuild
   reads from, so lost members that come back cannot form a second cluster that
   takes writes;
2. start a seed pod of the new epoch whose init containers fetch a snapshot (streamed
   from the surviving member with the newest data, or read from a verified backup)
   and restore it with ``etcdutl snapshot restore --bump-revision --mark-compacted``,
   so watchers never see a revision twice;
3. once the seed answers as a one-member cluster, delete the source pod and record
   the new epoch; the ordinary planner then grows the cluster back to its size.

Each pass takes one of these steps; the progress lives in ``status.recovery`` and in
the ``kustos.dev/epoch`` label of each pod, so a restarted operator carries on.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Literal

from kustos.etcd.planner import DeletePod, PodView
from kustos.runtime.steps import Wait

RECOVER_ANNOTATION = "kustos.dev/recover"
"""Set by ``kustos etcd recover``: ``auto``, ``member/<pod>`` or ``backup/<EtcdBackup>``."""
BUMP_REVISION = 1_000_000_000
"""Added to the restored revision: far more writes than a lost majority could have acknowledged."""
MAX_SEED_ATTEMPTS = 3
SEED_FAILURES = 2
"""Failed runs of a seed's init container before the seed counts as failed."""

SourceKind = Literal["member", "backup"]


@dataclass(frozen=True)
class Survivor:
    """A member of the current epoch that still answers (without quorum) and has its data."""

    pod: str
    client_url: str
    revision: int
    raft_applied_index: int = 0


@dataclass(frozen=True)
class BackupCandidate:
    """A succeeded EtcdBackup in the cluster's namespace (``cluster``: the one it backs up)."""

    name: str
    completed: datetime | None
    revision: int = 0
    cluster: str = ""


@dataclass(frozen=True)
class Source:
    kind: SourceKind
    name: str  # the survivor's pod, or the EtcdBackup
    revision: int | None = None

    def describe(self) -> str:
        at = f" at revision {self.revision}" if self.revision is not None else ""
        return f"{'member' if self.kind == 'member' else 'backup'} {self.name}{at}"


def parse_request(value: str | None) -> tuple[SourceKind | None, str | None] | None:
    """The recovery a person asked for: None when none was, (None, None) to choose the best."""
    if value is None:
        return None
    kind, _, name = value.strip().partition("/")
    if kind in ("member", "backup") and name:
        return ("member" if kind == "member" else "backup"), name
    return None, None


def choose_source(
    survivors: list[Survivor],
    backups: list[BackupCandidate],
    requested: tuple[SourceKind | None, str | None] = (None, None),
) -> Source | str:
    """The best source to rebuild from, or why there is none.

    The survivor with the newest data wins (highest revision, then applied index): it
    holds every write it acknowledged. Without one, the newest succeeded backup.
    """
    kind, name = requested
    if kind == "member":
        match = next((s for s in survivors if s.pod == name), None)
        if match is None:
            alive = ", ".join(s.pod for s in survivors) or "none"
            return f"member {name} does not answer with its data (members that do: {alive})"
        return Source("member", match.pod, match.revision)
    if kind == "backup":
        chosen_backup = next((b for b in backups if b.name == name), None)
        if chosen_backup is None:
            return f"EtcdBackup {name} is not a succeeded backup in this namespace"
        return Source("backup", chosen_backup.name, chosen_backup.revision)
    if survivors:
        best = max(survivors, key=lambda s: (s.revision, s.raft_applied_index, s.pod))
        return Source("member", best.pod, best.revision)
    if backups:
        newest = max(backups, key=lambda b: (b.completed is not None, b.completed or datetime.min, b.name))
        return Source("backup", newest.name, newest.revision)
    return "no member answers with its data and the cluster has no succeeded backup"


def should_start(
    automatic: bool,
    delay: timedelta,
    lost_since: datetime | None,
    now: datetime,
    requested: bool,
) -> str | None:
    """Why recovery starts now (approved, or automatic after the delay), or None to wait."""
    if requested:
        return "approved with kustos etcd recover"
    if automatic and lost_since is not None and now - lost_since >= delay:
        return f"automatic: quorum lost for {int((now - lost_since).total_seconds())}s"
    return None


# ---- the rebuild, one step per pass ------------------------------------------------------


@dataclass(frozen=True)
class CreateRestoreSeed:
    """Start seed pod ``index`` of the new epoch, restoring from the source."""

    index: int


@dataclass(frozen=True)
class FinishRecovery:
    seed: str


@dataclass(frozen=True)
class RecoveryFailed:
    message: str


RecoveryStep = CreateRestoreSeed | DeletePod | Wait | FinishRecovery | RecoveryFailed


@dataclass(frozen=True)
class RecoveryObserved:
    source: Source
    attempts: int  # seeds created so far
    next_index: int
    seed: PodView | None  # the newest pod of the new epoch
    seed_failed: bool  # its restore failed (init container crash-looping)
    seed_answers: bool  # it answers as a healthy one-member cluster
    old_pods: tuple[PodView, ...]  # pods of earlier epochs
    source_problem: str | None = None  # why the source's snapshot cannot be read (gone, unreadable)


def plan_recovery(o: RecoveryObserved) -> RecoveryStep:
    source_pod = o.source.name if o.source.kind == "member" else None
    # 1. Fence: nothing of the old epoch but the source may run again.
    for pod in o.old_pods:
        if pod.name == source_pod:
            continue
        if not pod.deleting or pod.node_lost:
            return DeletePod(
                pod.name, pod.uid, "fenced off: the cluster is being rebuilt", force=pod.node_lost
            )
    if any(p.deleting and p.name != source_pod for p in o.old_pods):
        return Wait("waiting for the old members' pods to go", 1.0)
    # 2. The seed.
    if o.seed is None:
        if source_pod is not None and not any(p.name == source_pod for p in o.old_pods):
            return RecoveryFailed(f"member {source_pod}, the source of the rebuild, is gone")
        if o.attempts >= MAX_SEED_ATTEMPTS:
            return RecoveryFailed(f"{o.attempts} seeds could not restore from {o.source.describe()}")
        if o.source_problem is not None:
            return RecoveryFailed(o.source_problem)
        return CreateRestoreSeed(o.next_index)
    if o.seed.deleting:
        return Wait(f"seed {o.seed.name} is terminating", 1.0)
    if o.seed_failed:
        return DeletePod(o.seed.name, o.seed.uid, f"it could not restore from {o.source.describe()}")
    if not o.seed_answers:
        return Wait(f"seed {o.seed.name} is restoring from {o.source.describe()}", 1.0)
    # 3. The source's turn to go; then the new epoch is the cluster.
    for pod in o.old_pods:
        if not pod.deleting or pod.node_lost:
            return DeletePod(pod.name, pod.uid, "the rebuilt cluster has taken over", force=pod.node_lost)
    if o.old_pods:
        return Wait("waiting for the source member's pod to go", 1.0)
    return FinishRecovery(o.seed.name)
