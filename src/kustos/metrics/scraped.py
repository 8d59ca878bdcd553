"""The observed figures read back from the leading replica's /metrics: ``kubectl kustos status``
has no access to the operator's memory (``runtime.observations``), only to its exposition, so it
rebuilds the same ``EtcdObservation`` from it and renders it through ``facts`` like the collector.
"""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from kustos.metrics.collector import (
    ALARM,
    BACKEND_BYTES,
    BACKEND_IN_USE_BYTES,
    BACKEND_QUOTA_BYTES,
    LEADER_CHANGES,
)
from kustos.runtime.observations import EtcdObservation, MemberBackend

_PER_MEMBER = (BACKEND_BYTES, BACKEND_IN_USE_BYTES, BACKEND_QUOTA_BYTES)


def observation(exposition: str, namespace: str, name: str) -> EtcdObservation | None:
    """One EtcdCluster's observation in a Prometheus text exposition; None when it has none
    (the replica does not lead, or has not observed the cluster yet). The exposition does not
    carry the raft leader's id and term, so they read 0: nothing shown depends on them."""
    per_member: dict[str, dict[str, int]] = {}
    changes: int | None = None
    alarms: set[tuple[str, str]] = set()
    for family in text_string_to_metric_families(exposition):
        if family.name not in (*_PER_MEMBER, LEADER_CHANGES, ALARM):
            continue
        for sample in family.samples:
            labels = sample.labels
            if (labels.get("namespace"), labels.get("name")) != (namespace, name):
                continue
            if family.name == LEADER_CHANGES and sample.name.endswith("_total"):
                changes = int(sample.value)
            elif family.name == ALARM and sample.value:
                alarms.add((labels.get("member", ""), labels.get("alarm", "")))
            elif family.name in _PER_MEMBER:
                per_member.setdefault(labels.get("member", ""), {})[family.name] = int(sample.value)
    if changes is None and not per_member and not alarms:
        return None
    members = tuple(
        MemberBackend(
            name=member,
            db_size=figures.get(BACKEND_BYTES, 0),
            db_size_in_use=figures.get(BACKEND_IN_USE_BYTES, 0),
            quota=figures.get(BACKEND_QUOTA_BYTES),
        )
        for member, figures in sorted(per_member.items())
    )
    return EtcdObservation(members, 0, 0, changes or 0, tuple(sorted(alarms)))


__all__ = ["observation"]
