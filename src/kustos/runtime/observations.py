"""What controllers saw on their last pass and deliberately do not record in status, held in
memory for the metrics collector (``kustos.metrics``).

Some facts change on every pass without changing any decision: a member's database size, the
raft term, how many nodes a policy has cleared since the operator started. Writing them to
status would be a status write per pass; they are figures for graphs and alerts, so each
controller publishes its latest observation here and the collector reads it at scrape time
(no second etcd client, no extra API call). They live here, in ``runtime/``, because the
families may not import ``metrics/`` and ``metrics/`` may not import the families.

Nothing here steers a reconcile: a restarted operator starts from empty, the next pass fills
it again, and the counters start over (a Prometheus counter reset, which ``rate`` handles).
"""

from __future__ import annotations

import threading
from collections import Counter
from dataclasses import dataclass


@dataclass(frozen=True)
class MemberBackend:
    """One etcd member's backend as it answered its last status request."""

    name: str
    db_size: int
    """Its database file's size in bytes (etcd's dbSize)."""
    db_size_in_use: int
    """The part of it holding data; the rest is free pages a defragmentation gives back."""
    quota: int | None
    """Its backend quota in bytes (etcd's dbSizeQuota on v3.6+, else the configured flag)."""


@dataclass(frozen=True)
class EtcdObservation:
    """An EtcdCluster as its controller last saw it through etcd."""

    members: tuple[MemberBackend, ...]
    """Members that answered."""
    leader_id: int
    """The raft leader all answering members agreed on (0: none)."""
    raft_term: int
    """The highest raft term any member reported."""
    leader_changes: int
    """Leader changes seen since this operator first observed the cluster."""
    alarms: tuple[tuple[str, str], ...] = ()
    """(member, alarm) for each alarm raised, like ("a-0", "NOSPACE"); sorted."""


class Observations:
    """The latest observation per object, by controller; safe to read from the scrape thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._etcd: dict[tuple[str, str], EtcdObservation] = {}
        self._maintenance: dict[str, Counter[tuple[str, str]]] = {}
        self._purged: Counter[str] = Counter()

    # ---- EtcdCluster -----------------------------------------------------------------------

    def publish_etcd(self, namespace: str, name: str, observation: EtcdObservation) -> None:
        with self._lock:
            self._etcd[(namespace, name)] = observation

    def etcd(self, namespace: str, name: str) -> EtcdObservation | None:
        with self._lock:
            return self._etcd.get((namespace, name))

    def forget_etcd(self, namespace: str, name: str) -> None:
        """The cluster is gone: its series go with it."""
        with self._lock:
            self._etcd.pop((namespace, name), None)

    # ---- MaintenancePolicy -----------------------------------------------------------------

    def count_maintenance(self, policy: str, action: str, outcome: str) -> None:
        """One action taken (Done) or refused (Refused) by the policy, as its status recorded it."""
        with self._lock:
            self._maintenance.setdefault(policy, Counter())[(action, outcome)] += 1

    def count_purged(self, policy: str) -> None:
        """One node's purge finished: its Node was deleted."""
        with self._lock:
            self._purged[policy] += 1

    def maintenance(self, policy: str) -> tuple[dict[tuple[str, str], int], int]:
        """(action, outcome) -> how many, and the nodes purged, since this operator started."""
        with self._lock:
            return dict(self._maintenance.get(policy) or {}), self._purged[policy]


__all__ = ["EtcdObservation", "MemberBackend", "Observations"]
