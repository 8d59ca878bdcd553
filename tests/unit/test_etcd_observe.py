"""Observation: pods as the planner sees them, and the membership as etcd reported it."""

from __future__ import annotations

import asyncio
import json
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from kustos.api.etcd import EtcdCluster, EtcdClusterStatus, MemberStatus
from kustos.etcd import membership, planner
from kustos.etcd.client import Member, MemberList, Status
from kustos.etcd.observe import (
    EtcdView,
    Observer,
    askable,
    member_views,
    pod_view,
    recorded_leader,
    skeleton,
    starting,
    unless_set,
)
from kustos.runtime.informer import Informer
from kustos.runtime.resources import CLAIMS, PODS
from kustos.runtime.resources import NODES as NODE_KIND

NODE_READY = {"metadata": {"name": "n1"}, "status": {"conditions": [{"type": "Ready", "status": "True"}]}}
NODE_GONE = {"metadata": {"name": "n2"}, "status": {"conditions": [{"type": "Ready", "status": "Unknown"}]}}
NODES = {"n1": NODE_READY, "n2": NODE_GONE}


def pod(name: str, node: str = "n1", **meta: object) -> dict[str, object]:
    return {
        "metadata": {"name": name, "namespace": "ns", "uid": f"u-{name}", **meta},
        "spec": {
            "nodeName": node,
            "containers": [{"name": "etcd", "image": "registry.k8s.io/etcd:3.6.16-0"}],
        },
        "status": {
            "podIP": "10.0.0.1",
            "conditions": [{"type": "Ready", "status": "True"}],
            "containerStatuses": [{"state": {"running": {"startedAt": "2026-11-22T12:00:00Z"}}}],
        },
    }


def status(member_id: int, leader_id: int, applied: int = 10, errors: tuple[str, ...] = ()) -> Status:
    return Status(
        cluster_id=1, member_id=member_id, leader_id=leader_id, raft_term=2, raft_index=100,
        raft_applied_index=applied, revision=5, db_size=0, db_size_in_use=0, version="3.6.16",
        is_learner=False, errors=errors,
    )  # fmt: skip


def test_a_member_pod_is_seen_with_its_member_id_version_and_start() -> None:
    view = pod_view("e", pod("e-2", annotations={"kustos.dev/member-id": "1f"}), NODES.get)
    assert view is not None
    assert (view.name, view.index, view.member_id, view.version) == ("e-2", 2, 0x1F, "3.6.16")
    assert view.ready and view.running and not view.node_lost and not view.deleting
    assert view.running_since == datetime(2026, 11, 22, 12, 0, tzinfo=UTC)


def test_only_pods_whose_etcd_container_runs_are_asked() -> None:
    """A pod just created (an address on no link yet) or between restarts has no etcd to answer,
    and asking it would hold the pass for its request's timeout."""
    created = pod("e-1")
    created["status"] = {"podIP": "10.0.0.2"}
    restarting = pod("e-2")
    restarting["status"]["containerStatuses"] = [{"state": {"waiting": {"reason": "CrashLoopBackOff"}}}]
    seen = [pod_view("e", p, NODES.get) for p in (pod("e-0"), created, restarting)]
    views = tuple(v for v in seen if v is not None)
    urls = {v.name: f"http://{v.name}.e.ns.svc:2379" for v in views}
    assert askable(views, urls) == ["http://e-0.e.ns.svc:2379"]


def test_only_members_whose_etcd_just_started_are_waited_for_to_listen() -> None:
    """A pass waits a little for a just-started etcd to listen (it then answers once it
    serves), and for no other: one that has run for a while and refuses is down."""
    views = tuple(v for v in (pod_view("e", pod(n), NODES.get) for n in ("e-0", "e-1")) if v is not None)
    urls = {v.name: f"http://{v.name}.e.ns.svc:2379" for v in views}
    started = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)
    assert starting(views, urls, started + timedelta(seconds=1)) == list(urls.values())
    assert starting(views, urls, started + timedelta(seconds=3)) == []


def test_a_pod_on_a_lost_or_absent_node_is_on_a_lost_node() -> None:
    lost = pod_view("e", pod("e-0", node="n2"), NODES.get)
    absent = pod_view("e", pod("e-0", node="n9"), NODES.get)
    assert lost is not None and lost.node_lost
    assert absent is not None and absent.node_lost


def test_a_member_whose_eviction_was_asked_is_draining_like_one_on_a_cordoned_node() -> None:
    asked = pod_view(
        "e", pod("e-0", annotations={"kustos.dev/eviction-requested": "2026-11-26T00:00:00Z"}), NODES.get
    )
    cordoned = {"n3": {"metadata": {"name": "n3"}, "spec": {"unschedulable": True}, **NODE_READY["status"]}}
    tainted = {
        "n4": {"metadata": {"name": "n4"}, "spec": {"taints": [{"key": "ToBeDeletedByClusterAutoscaler"}]}}
    }
    plain = pod_view("e", pod("e-1"), NODES.get)
    assert asked is not None and asked.draining
    assert plain is not None and not plain.draining
    on_cordoned = pod_view("e", pod("e-2", node="n3"), cordoned.get)
    on_tainted = pod_view("e", pod("e-3", node="n4"), tainted.get)
    assert on_cordoned is not None and on_cordoned.draining
    assert on_tainted is not None and on_tainted.draining


def test_a_pod_that_is_not_a_member_pod_is_not_seen() -> None:
    assert pod_view("e", pod("e-backup-1"), NODES.get) is None
    assert pod_view("e", pod("other-0"), NODES.get) is None


def test_no_membership_is_none() -> None:
    assert member_views(EtcdView(None, {}, {})) is None


def test_members_are_healthy_when_they_answered_without_errors_and_lag_behind_the_leader() -> None:
    listed = MemberList(1, 1, [
        Member(1, "e-0", ("http://a:2380",), ("http://a:2379",), False),
        Member(2, "e-1", ("http://b:2380",), ("http://b:2379",), False),
        Member(3, "", ("http://c:2380",), (), True),
    ])  # fmt: skip
    leader, follower = status(1, 1, applied=100), status(2, 1, applied=40, errors=("NOSPACE",))
    view = EtcdView(listed, {"http://a:2379": leader}, {"http://a:2379": leader, "http://b:2379": follower})
    members = member_views(view)
    assert members is not None
    by_id = {m.id: m for m in members}
    assert by_id[1].healthy and by_id[1].leader and by_id[1].lag == 0
    assert not by_id[2].healthy and by_id[2].lag == 60 and by_id[2].version == "3.6.16"
    assert by_id[3].learner and not by_id[3].healthy and by_id[3].version == ""


def test_a_promoted_member_is_healthy_only_once_it_has_applied_its_own_promotion() -> None:
    """The leader lists it as a voter a moment before it knows itself: writes sent to it until
    then are refused ("rpc not supported for learner")."""
    listed = MemberList(1, 1, [
        Member(1, "e-0", ("http://a:2380",), ("http://a:2379",), False),
        Member(2, "e-1", ("http://b:2380",), ("http://b:2379",), False),
        Member(3, "e-2", ("http://c:2380",), ("http://c:2379",), True),
    ])  # fmt: skip
    still_learner = replace(status(2, 1), is_learner=True)
    learner = replace(status(3, 1), is_learner=True)
    answered = {"http://a:2379": status(1, 1), "http://b:2379": still_learner, "http://c:2379": learner}
    members = member_views(EtcdView(listed, answered, answered))
    assert members is not None
    by_id = {m.id: m for m in members}
    assert by_id[1].healthy
    assert not by_id[2].learner and not by_id[2].healthy, "promoted, but not yet by its own word"
    assert by_id[3].learner and by_id[3].healthy, "a learner that answers is a healthy learner"


def test_only_name_resolution_failures_count_as_unresolved() -> None:
    from kustos.etcd.client import EtcdUnavailable
    from kustos.etcd.observe import unresolved_hosts

    dns = "http://e-0.e.ns.svc.cluster.local:2379"
    answers = {
        dns: EtcdUnavailable(f"{dns}: cannot reach member: [Errno -2] Name or service not known", None, dns),
        "http://10.0.0.2:2379": EtcdUnavailable(
            "cannot reach member: [Errno 111] Connect call failed", None, ""
        ),
    }
    assert unresolved_hosts(answers) == ("e-0.e.ns.svc.cluster.local",)  # type: ignore[arg-type]


def test_a_member_is_timed_from_when_its_started_etcd_was_first_seen_unhealthy() -> None:
    """etcd names a learner only once its etcd starts (its status names it after its pod
    meanwhile): until then it is joining, not failing, and no time is recorded for it."""
    from kustos.api.etcd import MemberStatus
    from kustos.etcd.observe import unhealthy_since
    from kustos.etcd.planner import MemberView

    url = "http://e-1.e-peer.ns.svc:2380"
    joining = MemberView(id=0x2B, name="", peer_url=url, learner=True, healthy=False)
    first, later = datetime(2026, 11, 26, 17, 0, tzinfo=UTC), datetime(2026, 11, 26, 17, 0, 3, tzinfo=UTC)
    assert unhealthy_since((joining,), [], (), first) == {}
    started = replace(joining, name="e-1")
    assert unhealthy_since((started,), [], (), first) == {"e-1": first}
    recorded = [MemberStatus(name="e-1", id="2b", pod="e-1", peer_url=url, learner=True,
                             unhealthy_since="2026-11-26T17:00:00Z")]  # fmt: skip
    assert unhealthy_since((started,), recorded, (), later) == {"e-1": first}
    # Another member under a recorded name (a rebuild's new cluster) starts its own clock.
    other = MemberView(id=0x3C, name="e-1", peer_url=url, healthy=False)
    assert unhealthy_since((other,), recorded, (), later) == {"e-1": later}
    assert unhealthy_since((replace(other, healthy=True),), recorded, (), later) == {}


def test_a_member_whose_pod_is_stopping_is_not_timed_from_its_status() -> None:
    """Its etcd stops on purpose (``planner.is_dead`` times it from the end of the grace period):
    nothing recorded for it, so the kubelet's last word on the pod writes no status. On a lost
    node, or once the pod is gone, its clock runs as for any failed member."""
    from kustos.api.etcd import MemberStatus
    from kustos.etcd.observe import unhealthy_since
    from kustos.etcd.planner import MemberView, PodView

    url = "http://e-1.e-peer.ns.svc:2380"
    member = MemberView(id=0x2B, name="e-1", peer_url=url, healthy=False)
    now = datetime(2026, 11, 28, 20, 0, tzinfo=UTC)
    pod = PodView("e-1", 1, deleting=True, deletion_deadline=now - timedelta(seconds=1))
    recorded = [MemberStatus(name="e-1", id="2b", pod="e-1", peer_url=url,
                             unhealthy_since="2026-11-28T19:59:00Z")]  # fmt: skip
    assert unhealthy_since((member,), recorded, (pod,), now) == {}
    assert unhealthy_since((member,), [], (replace(pod, name="e-2"),), now) == {"e-1": now}
    assert unhealthy_since((member,), [], (replace(pod, node_lost=True),), now) == {"e-1": now}
    assert unhealthy_since((member,), [], (), now) == {"e-1": now}


async def test_a_member_list_in_flight_is_dropped_when_a_pod_goes_and_kept_otherwise() -> None:
    """``Observer._membership`` drops a list that a vanished pod may leave unanswered; the call
    dropped is cancelled (its connection closed), never left running beside the next one."""
    cancelled = asyncio.Event()

    async def hangs() -> str:
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return "late"

    async def answers() -> str:
        return "members"

    gone = asyncio.Event()
    assert await unless_set(answers(), gone) == ("members", False)
    asyncio.get_running_loop().call_later(0.01, gone.set)
    assert await unless_set(hangs(), gone) == (None, True)
    assert cancelled.is_set()


async def test_a_pass_cancelled_while_it_lists_the_members_cancels_the_list() -> None:
    started, cancelled = asyncio.Event(), asyncio.Event()

    async def hangs() -> None:
        started.set()
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    outer = asyncio.ensure_future(unless_set(hangs(), asyncio.Event()))
    await started.wait()
    outer.cancel()
    await asyncio.wait({outer})
    await asyncio.wait_for(cancelled.wait(), 1)


def test_the_list_beside_the_statuses_is_asked_of_the_recorded_leader_if_its_etcd_runs() -> None:
    urls = [f"http://e-{i}.e.ns.svc:2379" for i in range(3)]
    recorded = [
        MemberStatus(name=f"e-{i}", client_url=u, healthy=True, leader=i == 1) for i, u in enumerate(urls)
    ]
    assert recorded_leader(recorded, urls, []) == urls[1]
    assert recorded_leader(recorded, [urls[0], urls[2]], []) is None  # its pod is gone or not running
    assert recorded_leader(recorded, urls, [urls[1]]) is None  # its etcd just started: not serving yet
    unhealthy = [m.model_copy(update={"healthy": not m.leader}) for m in recorded]
    assert recorded_leader(unhealthy, urls, []) is None


async def _event(informer: Informer, kind: str, obj: dict[str, object]) -> None:
    await informer._handle_line(json.dumps({"type": kind, "object": obj}))


LISTED = MemberList(
    1, 1, [Member(i + 1, f"e-{i}", (f"http://10.0.0.{i}:2380",), (), False) for i in range(3)]
)


async def three_member_pods() -> tuple[EtcdCluster, Observer, Informer, list[dict[str, object]]]:
    """An Observer on caches that hold three member pods of PVC cluster ``ns/e`` (e-i at
    10.0.0.i, member ID i + 1), the cluster, the pod cache and the pods."""
    cluster = EtcdCluster.model_validate({
        "metadata": {"name": "e", "namespace": "ns", "uid": "u-1"},
        "spec": {"size": 3, "addressing": "podIP", "storage": {"type": "pvc"}},
    })  # fmt: skip
    pods, nodes = Informer(None, PODS), Informer(None, NODE_KIND)  # type: ignore[arg-type]
    observer = Observer(pods, nodes, Informer(None, CLAIMS), None)  # type: ignore[arg-type]
    await _event(nodes, "ADDED", NODE_READY)
    labelled = [
        pod(f"e-{i}", labels={"kustos.dev/cluster": "e"}, annotations={"kustos.dev/member-id": f"{i + 1:x}"})
        for i in range(3)
    ]
    for i, member_pod in enumerate(labelled):
        member_pod["status"]["podIP"] = f"10.0.0.{i}"  # type: ignore[index]
        await _event(pods, "ADDED", member_pod)
    return cluster, observer, pods, labelled


async def test_a_pod_gone_while_the_statuses_were_asked_is_brought_back_by_that_pass(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The pass asking the survivors' statuses when a member's pod went lists the members on the
    pods as they are then, and brings that member back on its volume, not the next pass."""
    cluster, observer, pods, labelled = await three_member_pods()

    def views_now() -> tuple[planner.PodView, ...]:
        return tuple(v for p in observer.pods_of(cluster) if (v := observer.pod_view(cluster, p)) is not None)

    async def member_list_at(url: str, tls: object, linearizable: bool = True) -> MemberList:
        return LISTED

    monkeypatch.setattr(membership, "member_list_at", member_list_at)
    said = {"http://10.0.0.0:2379": status(1, 1), "http://10.0.0.2:2379": status(3, 1)}
    now = datetime(2026, 11, 22, 12, 0, 1, tzinfo=UTC)
    recorded = tuple((f"e-{i}", i + 1) for i in range(3))
    known = replace(skeleton(cluster, now), pods=views_now(), ever_formed=True, recorded_members=recorded)
    with observer._pods_going("ns/e") as went:
        await _event(pods, "DELETED", labelled[1])  # while the statuses were asked
        members, observed = await observer._membership(
            cluster, known, views_now, EtcdView(None, said, said), went, None
        )
    etcd = EtcdView(members, said, said)
    assert planner.plan(replace(observed, members=member_views(etcd))) == planner.RecreatePod("e-1", 2)


async def the_leaders_pod_gone(
    monkeypatch: pytest.MonkeyPatch, failed_long_ago: bool
) -> tuple[planner.Observed, list[bool]]:
    """The pass after the leader's (e-0's) pod went: e-1 and e-2 answer their status with no
    leader, and their linearizable list answers once they have elected one, 50 ms into the
    pass; their own lists answer at once. Each list asked is noted, True for a linearizable one."""
    cluster, observer, pods, labelled = await three_member_pods()
    recorded = [
        {"name": f"e-{i}", "id": f"{i + 1:x}", "clientUrl": f"http://10.0.0.{i}:2379", "healthy": i > 0,
         "leader": i == 0, "unhealthySince": "2026-11-22T11:00:00Z" if failed_long_ago and i == 0 else None}
        for i in range(3)
    ]  # fmt: skip
    cluster = cluster.model_copy(update={"status": EtcdClusterStatus.model_validate(
        {"clusterId": "1", "members": recorded})})  # fmt: skip
    await _event(pods, "DELETED", labelled[0])
    elected, lists = asyncio.Event(), []

    async def cluster_health(urls: list[str], *_: object) -> dict[str, Status]:
        return {u: status(int(u.split(".")[3].split(":")[0]) + 1, 0) for u in urls}  # no leader

    async def member_list_at(url: str, tls: object, linearizable: bool = True) -> MemberList:
        lists.append(linearizable)
        if linearizable:
            await elected.wait()
        return LISTED

    monkeypatch.setattr("kustos.etcd.observe.cluster_health", cluster_health)
    monkeypatch.setattr(membership, "member_list_at", member_list_at)
    observing = asyncio.ensure_future(observer.observe(cluster, datetime(2026, 11, 22, 12, 0, 1, tzinfo=UTC)))
    await asyncio.sleep(0.05)
    elected.set()
    observed, _, _ = await observing
    return observed, lists


async def test_the_leaders_pod_gone_is_brought_back_on_a_members_own_list_without_waiting_for_the_election(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A linearizable list waits for the survivors' election (a second or more); the member
    whose pod went came back only after it. Its own list from a survivor brings it back at once."""
    observed, lists = await the_leaders_pod_gone(monkeypatch, failed_long_ago=False)
    assert lists == [False] and not observed.members_confirmed
    assert planner.plan(observed) == planner.RecreatePod("e-0", 1)


async def test_a_member_its_own_list_would_not_bring_back_waits_for_the_leaders_word(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """e-0 failed long before its pod went: with quorum it is removed, not brought back, and
    that is decided on a leader's list only."""
    observed, lists = await the_leaders_pod_gone(monkeypatch, failed_long_ago=True)
    assert lists == [False, True] and observed.members_confirmed
    assert isinstance(planner.plan(observed), planner.RemoveMember)


async def test_members_whose_etcd_started_while_the_list_waited_for_a_leader_are_asked_too(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """After a lost quorum the pass that began before the members brought back ran gets its
    member list only once they have elected a leader: it asks them too, and sees them healthy,
    instead of recording them unhealthy and leaving them to the next pass."""
    cluster, observer, pods, labelled = await three_member_pods()
    for back in labelled[1:]:
        back["status"]["containerStatuses"] = [{"state": {"waiting": {"reason": "ContainerCreating"}}}]  # type: ignore[index]
        await _event(pods, "MODIFIED", back)
    asked: list[str] = []

    async def cluster_health(urls: list[str], *_: object) -> dict[str, Status]:
        asked.extend(urls)
        return {u: status(int(u.split(".")[3].split(":")[0]) + 1, 1) for u in urls}

    async def member_list_at(url: str, tls: object, linearizable: bool = True) -> MemberList:
        for back in labelled[1:]:  # they start, and elect a leader with e-0
            back["status"] = labelled[0]["status"] | {"podIP": back["status"]["podIP"]}  # type: ignore[index]
            await _event(pods, "MODIFIED", back)
        return LISTED

    monkeypatch.setattr("kustos.etcd.observe.cluster_health", cluster_health)
    monkeypatch.setattr(membership, "member_list_at", member_list_at)
    observed, _, _ = await observer.observe(cluster, datetime(2026, 11, 22, 12, 0, 1, tzinfo=UTC))
    assert asked == ["http://10.0.0.0:2379", "http://10.0.0.1:2379", "http://10.0.0.2:2379"]
    assert observed.members is not None and all(m.healthy for m in observed.members)
    assert all(p.running for p in observed.pods)
