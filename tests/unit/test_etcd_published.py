"""What the EtcdCluster controller publishes for the metrics from what etcd told it: each
member's backend against its quota, the alarms by member name, and the leader changes."""

from __future__ import annotations

from kustos.api.etcd import EtcdCluster, EtcdClusterSpec, StorageSpec
from kustos.etcd.client import Member, MemberList, Status
from kustos.etcd.observe import EtcdView
from kustos.etcd.pods import backend_quota
from kustos.etcd.published import ETCD_DEFAULT_QUOTA, configured_quota, observation
from kustos.runtime.observations import EtcdObservation

MiB = 1024 * 1024


def _status(
    member: int, leader: int, term: int, *, size: int = 10 * MiB, quota: int = 0, errors: tuple[str, ...] = ()
) -> Status:
    return Status(
        cluster_id=1, member_id=member, leader_id=leader, raft_term=term, raft_index=10,
        raft_applied_index=10, revision=5, db_size=size, db_size_in_use=size // 2, version="3.6.16",
        is_learner=False, errors=errors, db_size_quota=quota,
    )  # fmt: skip


def _view(*statuses: Status) -> EtcdView:
    members = MemberList(1, 1, [Member(i, f"a-{i - 1}", (), (), False) for i in (1, 2, 3)])
    answered = {f"http://a-{s.member_id - 1}:2379": s for s in statuses}
    healthy = {url: s for url, s in answered.items() if s.has_leader}
    return EtcdView(members, healthy, answered)


def _cluster(**spec: object) -> EtcdCluster:
    return EtcdCluster(metadata={"name": "a", "namespace": "db"}, spec=EtcdClusterSpec(**spec))  # type: ignore[arg-type]


def test_backends_by_member_name_with_the_quota_etcd_reports_or_the_configured_one() -> None:
    seen = observation(None, _view(_status(1, 1, 2, quota=16 * MiB), _status(2, 1, 2)), 99)
    assert [(m.name, m.db_size, m.db_size_in_use, m.quota) for m in seen.members] == [
        ("a-0", 10 * MiB, 5 * MiB, 16 * MiB),  # v3.6 says its quota
        ("a-1", 10 * MiB, 5 * MiB, 99),  # v3.5 does not: the configured one
    ]
    assert (seen.leader_id, seen.raft_term, seen.leader_changes) == (1, 2, 0)  # the baseline


def test_every_election_counts_even_between_two_passes() -> None:
    first = observation(None, _view(_status(1, 1, 2), _status(2, 1, 2), _status(3, 1, 2)), 1)
    same = observation(first, _view(_status(1, 1, 2), _status(2, 1, 2)), 1)
    assert same.leader_changes == 0
    moved = observation(same, _view(_status(2, 2, 3), _status(3, 2, 3)), 1)  # leader 1 killed
    assert (moved.leader_id, moved.leader_changes) == (2, 1)
    during = observation(moved, _view(_status(2, 0, 4), _status(3, 0, 4)), 1)  # an election under way
    assert (during.leader_id, during.leader_changes) == (2, 1)
    back = observation(during, _view(_status(1, 1, 5), _status(2, 1, 5)), 1)  # terms 4 and 5 since
    assert back.leader_changes == 3


def test_a_rebuilt_cluster_starts_its_terms_over_and_counts_one_change() -> None:
    before = EtcdObservation((), leader_id=1, raft_term=40, leader_changes=5)
    after = observation(before, _view(_status(2, 2, 2)), 1)
    assert (after.raft_term, after.leader_changes) == (2, 6)


def test_no_leader_seen_yet_is_no_baseline() -> None:
    quiet = observation(None, _view(_status(1, 0, 1)), 1)
    assert (quiet.leader_id, quiet.leader_changes) == (0, 0)
    elected = observation(quiet, _view(_status(1, 1, 7)), 1)
    assert elected.leader_changes == 0  # first leader seen: the baseline, not 7 changes


def test_alarms_are_named_by_the_member_that_raised_them() -> None:
    nospace = ("memberID:2 alarm:NOSPACE ",)
    seen = observation(None, _view(_status(1, 1, 2, errors=nospace), _status(2, 1, 2, errors=nospace)), 1)
    assert seen.alarms == (("a-1", "NOSPACE"),)


def test_configured_quota() -> None:
    assert configured_quota(_cluster()) == ETCD_DEFAULT_QUOTA
    assert configured_quota(_cluster(extraArgs=[f"--quota-backend-bytes={16 * MiB}"])) == 16 * MiB
    on_volume = _cluster(storage=StorageSpec(type="pvc", size="4Gi"))
    assert configured_quota(on_volume) == backend_quota(4 * 1024 * MiB)
