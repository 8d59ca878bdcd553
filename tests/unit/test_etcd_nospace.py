"""etcd's NOSPACE alarm recovered without a human (compact, defragment each member, disarm),
and the backend quota derived from the member volume."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from kustos.api.etcd import EtcdCluster
from kustos.etcd import defragmentation as m
from kustos.etcd.pods import MAX_QUOTA, backend_quota, member_pod, space_shortage
from tests.unit.test_etcd_defragmentation import MiB, member, observed


def full(name: str, leader: bool = False) -> m.MemberView:
    return member(name, size=8 * MiB, in_use=7 * MiB, no_space=True, leader=leader, revision=500)


def test_compact_then_each_member_followers_first_then_disarm() -> None:
    members = (full("a", leader=True), full("b"), full("c"))
    # Whatever the defragmentation settings or the schedule's window: writes are refused.
    o = observed(*members, enabled=False, window_open=False)
    assert m.plan(o) == m.Compact(500)
    space = m.SpaceRecovery(compacted_revision=500)
    order = []
    for _ in members:
        step = m.plan(replace(o, space=space))
        assert isinstance(step, m.Defragment) and "NOSPACE" in step.reason
        order.append(step.member.name)
        space = replace(space, defragmented=(*space.defragmented, step.member.name))
    assert order == ["b", "c", "a"]  # the leader last
    assert m.plan(replace(o, space=space)) == m.Disarm()
    # Disarmed: the record is closed once, then nothing more to do about space.
    healed = observed(*(replace(x, no_space=False) for x in members), space=space)
    assert m.plan(healed) == m.FinishSpace()
    assert m.plan_space(replace(healed, space=None)) is None


def test_an_unhealthy_member_is_waited_for() -> None:
    o = observed(full("a", leader=True), replace(full("b"), healthy=False), full("c"))
    step = m.plan(o)
    assert isinstance(step, m.Wait) and "b" in step.reason


def cluster(storage: dict[str, Any], extra: list[str] | None = None) -> EtcdCluster:
    return EtcdCluster.model_validate({
        "apiVersion": "kustos.dev/v1alpha1", "kind": "EtcdCluster",
        "metadata": {"name": "q", "namespace": "ns", "uid": "u"},
        "spec": {"size": 3, "storage": storage, "extraArgs": extra or []},
    })  # fmt: skip


def quota_flags(c: EtcdCluster) -> list[str]:
    args = member_pod(c, 0, "new", [("q-0", "http://x:2380")], "3.6.16")["spec"]["containers"][0]["args"]
    return [a for a in args if a.startswith("--quota-backend-bytes")]


def test_the_quota_leaves_room_for_a_defragmentation_copy_and_the_wal() -> None:
    assert backend_quota(1024 * MiB) == 384 * MiB
    assert backend_quota(100 * 1024 * MiB) == MAX_QUOTA
    for size in (512, 1024, 4096, 20480):
        quota = backend_quota(size * MiB)
        assert 2 * quota + 256 * MiB <= size * MiB
    assert quota_flags(cluster({"type": "pvc", "size": "1Gi"})) == [f"--quota-backend-bytes={384 * MiB}"]
    # Set by the user: theirs alone. emptyDir has no size to derive from: etcd's default.
    assert quota_flags(cluster({"type": "pvc", "size": "1Gi"}, ["--quota-backend-bytes=1000"])) == [
        "--quota-backend-bytes=1000"
    ]
    assert quota_flags(cluster({"type": "emptyDir"})) == []


def test_a_volume_too_small_for_its_live_data_is_said_with_the_size_needed() -> None:
    small = cluster({"type": "pvc", "size": "256Mi"})  # a 16 MiB quota
    assert space_shortage(small, 6 * MiB) is None  # compaction left room to grow
    said = space_shortage(small, 15 * MiB)
    assert said is not None and "fills 94% of the backend quota (16 MiB" in said
    assert "derived from spec.storage.size 256Mi" in said and "at least 1Gi is needed" in said
    # The size said holds twice the data.
    big = space_shortage(cluster({"type": "pvc", "size": "8Gi"}), 3000 * MiB)
    assert big is not None and "at least 12Gi" in big
    assert 2 * 3000 * MiB <= backend_quota(12 * 1024 * MiB)
    beyond = space_shortage(cluster({"type": "pvc", "size": "20Gi"}), 7000 * MiB)
    assert beyond is not None and "beyond the 8 GiB" in beyond
    theirs = space_shortage(
        cluster({"type": "pvc", "size": "1Gi"}, ["--quota-backend-bytes=1000000"]), 900_000
    )
    assert theirs is not None and "--quota-backend-bytes in spec.extraArgs" in theirs
    assert "--quota-backend-bytes=16777216" in theirs  # at least the 16 MiB etcd needs
    default = space_shortage(cluster({"type": "emptyDir"}), 1500 * MiB)
    assert default is not None and "etcd's default quota" in default


def test_the_alarm_is_said_in_conditions_and_an_event_not_as_a_lost_quorum() -> None:
    from kustos.etcd.status import notes, status
    from kustos.runtime.steps import Done
    from tests.unit.test_etcd_status import NOW, condition, formed

    seen = formed()
    assert seen.etcd is not None
    alarmed = replace(seen, etcd=replace(seen.etcd, no_space=("http://10.0.0.0:2379",)))
    result = status(alarmed, Done(), NOW)
    assert condition(result, "SpaceAvailable")["status"] == "False"
    assert condition(result, "Degraded")["reason"] == "NoSpace"
    assert condition(result, "Available")["status"] == "True" and result["phase"] == "Running"
    assert [n.reason for n in notes(alarmed, Done(), result)] == ["NoSpace"]
    healed = status(replace(seen, previous=result), Done(), NOW)
    assert condition(healed, "SpaceAvailable")["status"] == "True"
    assert condition(healed, "Degraded")["reason"] == "AllHealthy"
