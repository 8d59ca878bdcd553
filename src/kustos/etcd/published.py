"""What the EtcdCluster controller publishes for the metrics each pass, from what etcd already
told it (``observe.EtcdView``): each member's backend size against its quota, its NOSPACE
alarm, and the leader changes. Figures, not state: they go to the manager's in-memory
``Observations`` (runtime/observations.py), never to status, so a growing database is not a
status write per pass."""

from __future__ import annotations

import re

from kustos.api.etcd import EtcdCluster
from kustos.etcd.observe import EtcdView
from kustos.etcd.pods import quota_args
from kustos.runtime.observations import EtcdObservation, MemberBackend

QUOTA_FLAG = "--quota-backend-bytes="
ETCD_DEFAULT_QUOTA = 2 * 1024**3
"""etcd's backend quota when no flag sets one (and --quota-backend-bytes=0)."""
ALARM_ERROR = re.compile(r"memberID:(\d+) alarm:(\w+)")
"""How a status's errors list the cluster's alarms (every member lists all of them)."""


def configured_quota(cluster: EtcdCluster) -> int:
    """The quota the members start with: the last --quota-backend-bytes of their arguments
    (extraArgs win over the one derived from the volume), else etcd's default. Only members
    of v3.5, which do not report their quota (dbSizeQuota), need it."""
    flags = [a for a in [*quota_args(cluster), *cluster.spec.extra_args] if a.startswith(QUOTA_FLAG)]
    value = flags[-1][len(QUOTA_FLAG) :] if flags else ""
    return int(value) if value.isdigit() and int(value) > 0 else ETCD_DEFAULT_QUOTA


def leader_changes(previous: EtcdObservation | None, leader_id: int, term: int) -> int:
    """Leader changes so far: each raft term has at most one leader, so the term's growth
    counts the elections, even those that happened between two passes; a new leader within
    a lower term (a rebuilt cluster starts over at term 1) counts once."""
    if previous is None or previous.leader_id == 0:  # no leader seen yet: this is the baseline
        return previous.leader_changes if previous else 0
    if leader_id == 0:
        return previous.leader_changes
    if term >= previous.raft_term:
        moved = int(leader_id != previous.leader_id)
        return previous.leader_changes + max(term - previous.raft_term, moved)
    return previous.leader_changes + int(leader_id != previous.leader_id)


def observation(previous: EtcdObservation | None, etcd: EtcdView, fallback_quota: int) -> EtcdObservation:
    """This pass's observation, counting on from ``previous``."""
    names = {m.id: m.name for m in etcd.members.members} if etcd.members else {}
    members = tuple(
        sorted(
            (
                MemberBackend(
                    name=names.get(s.member_id) or url,
                    db_size=s.db_size,
                    db_size_in_use=s.db_size_in_use,
                    quota=s.db_size_quota or fallback_quota,
                )
                for url, s in etcd.answered.items()
            ),
            key=lambda m: m.name,
        )
    )
    leaders = {s.leader_id for s in etcd.statuses.values()}
    leader = leaders.pop() if len(leaders) == 1 else 0
    terms = [s.raft_term for s in etcd.statuses.values() if s.leader_id == leader and leader]
    term = max(terms, default=0)
    if leader == 0 and previous is not None:  # nobody leads now: keep counting from the last leader
        leader, term = previous.leader_id, previous.raft_term
    alarms = {
        (names.get(int(member_id)) or f"{int(member_id):x}", alarm)
        for s in etcd.answered.values()
        for error in s.errors
        for member_id, alarm in ALARM_ERROR.findall(error)
    }
    return EtcdObservation(
        members, leader, term, leader_changes(previous, leader, term), tuple(sorted(alarms))
    )


__all__ = ["configured_quota", "leader_changes", "observation"]
