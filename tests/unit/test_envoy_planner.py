"""The Envoy restart planner: tables and properties (maintenance/envoy.py)."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kustos.maintenance import envoy
from kustos.maintenance.envoy import EnvoyPod, Invalid, Mark, Observed, Restart, Unmark
from kustos.runtime.steps import Done, Wait

NOW = datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC)
FIVE = timedelta(minutes=5)


def pod(name: str = "envoy-a", **kw: Any) -> EnvoyPod:
    base = EnvoyPod(
        namespace="projectcontour",
        name=name,
        uid=f"uid-{name}",
        running=True,
        deleting=False,
        container_running=True,
        container_ready=False,
        container_started=NOW - timedelta(hours=1),
    )
    return replace(base, **kw)


def observed(
    *pods: EnvoyPod, enabled: bool = True, error: str | None = None, now: datetime = NOW
) -> Observed:
    return Observed(enabled=enabled, duration=FIVE, pods=pods, now=now, selector_error=error)


# ---- selectors --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("app=envoy", {"app": "envoy"}),
        ("app==envoy", {"app": "envoy"}),
        (" app = envoy , tier=edge ", {"app": "envoy", "tier": "edge"}),
        ("app.kubernetes.io/name=envoy", {"app.kubernetes.io/name": "envoy"}),
        ("app=", {"app": ""}),
    ],
)
def test_selector_parses(text: str, expected: dict[str, str]) -> None:
    assert envoy.parse_selector(text) == expected


@pytest.mark.parametrize(
    "text",
    ["", "app", "app!=envoy", "app=envoy,", "=envoy", "app=a=b", "-bad=x", "app=bad value", "a in (b)"],
)
def test_selector_refused_names_the_field(text: str) -> None:
    with pytest.raises(envoy.SelectorError, match=r"spec\.envoyPodSelector"):
        envoy.parse_selector(text)


def test_matches() -> None:
    assert envoy.matches({"app": "envoy"}, {"app": "envoy", "x": "y"})
    assert not envoy.matches({"app": "envoy"}, {"app": "contour"})
    assert not envoy.matches({"app": "envoy"}, {})


# ---- the plan ----------------------------------------------------------------------------------


def test_disabled_does_nothing() -> None:
    assert envoy.plan(observed(pod(marked=NOW - timedelta(hours=1)), enabled=False)) == Done()


def test_invalid_selector_is_reported() -> None:
    step = envoy.plan(observed(pod(), error="spec.envoyPodSelector: 'x' is not key=value"))
    assert isinstance(step, Invalid) and "spec.envoyPodSelector" in step.message


def test_first_sight_of_a_not_ready_container_is_recorded() -> None:
    assert envoy.plan(observed(pod())) == Mark(pod(), NOW)


def test_ready_pod_needs_nothing() -> None:
    assert envoy.plan(observed(pod(container_ready=True))) == Done()


def test_recovered_pod_loses_its_mark() -> None:
    recovered = pod(container_ready=True, marked=NOW - timedelta(minutes=2), annotated=True)
    assert envoy.plan(observed(recovered)) == Unmark(recovered)


def test_unreadable_mark_is_rewritten() -> None:
    garbled = pod(annotated=True, marked=None)
    assert envoy.plan(observed(garbled)) == Mark(garbled, NOW)


def test_deselected_pod_loses_its_mark() -> None:
    old = pod(selected=False, marked=NOW - timedelta(hours=1), annotated=True)
    assert envoy.plan(observed(old)) == Unmark(old)


def test_waits_until_the_duration_has_passed() -> None:
    step = envoy.plan(observed(pod(marked=NOW - timedelta(minutes=2), annotated=True)))
    assert isinstance(step, Wait)
    assert step.seconds == pytest.approx(180)
    assert "3m0s" in step.reason


def test_restarts_once_the_duration_has_passed() -> None:
    stuck = pod(marked=NOW - timedelta(minutes=6), annotated=True)
    step = envoy.plan(observed(stuck))
    assert step == Restart(stuck, timedelta(minutes=6))


def test_exactly_at_the_deadline_restarts() -> None:
    stuck = pod(marked=NOW - FIVE, annotated=True)
    assert isinstance(envoy.plan(observed(stuck)), Restart)


def test_a_container_restart_counts_from_its_own_start() -> None:
    restarted = pod(
        marked=NOW - timedelta(minutes=30), annotated=True, container_started=NOW - timedelta(minutes=1)
    )
    step = envoy.plan(observed(restarted))
    assert isinstance(step, Wait) and step.seconds == pytest.approx(240)


@pytest.mark.parametrize(
    "changes",
    [
        {"running": False},  # Pending, Succeeded or Failed: not a stuck running pod
        {"container_running": False},  # waiting (crash loop): the kubelet restarts it itself
        {"node_lost": True},  # stale status; the node's kubelet cannot act
        {"has_container": False},  # no container of that name
    ],
)
def test_not_counted(changes: dict[str, Any]) -> None:
    assert envoy.plan(observed(pod(marked=NOW - timedelta(hours=1), annotated=True, **changes))) == Done()


def test_one_restart_at_a_time() -> None:
    stuck = pod("envoy-b", marked=NOW - timedelta(minutes=10), annotated=True)
    going = pod("envoy-a", deleting=True, running=False, marked=NOW - timedelta(minutes=20), annotated=True)
    step = envoy.plan(observed(stuck, going))
    assert isinstance(step, Wait) and "envoy-a" in step.reason and "terminating" in step.reason


def test_the_longest_stuck_goes_first() -> None:
    a = pod("envoy-a", marked=NOW - timedelta(minutes=6), annotated=True)
    b = pod("envoy-b", marked=NOW - timedelta(minutes=9), annotated=True)
    assert envoy.plan(observed(a, b)) == Restart(b, timedelta(minutes=9))


def test_marks_come_before_restarts() -> None:
    a = pod("envoy-a", marked=NOW - timedelta(minutes=9), annotated=True)
    b = pod("envoy-b")
    assert envoy.plan(observed(a, b)) == Mark(b, NOW)


def test_describe() -> None:
    assert envoy.describe(timedelta(seconds=12)) == "12s"
    assert envoy.describe(timedelta(minutes=5, seconds=3)) == "5m3s"
    assert envoy.describe(timedelta(hours=1, seconds=5)) == "1h0m5s"
    assert envoy.describe(timedelta(seconds=-3)) == "0s"


# ---- reading pods ------------------------------------------------------------------------------


def running(since: str) -> dict[str, Any]:
    return {"running": {"startedAt": since}}


def raw_pod(ready: bool, annotation: str | None = None, phase: str = "Running") -> dict[str, Any]:
    meta: dict[str, Any] = {"name": "envoy-x", "namespace": "edge", "uid": "u1", "labels": {"app": "envoy"}}
    if annotation is not None:
        meta["annotations"] = {envoy.NOT_READY_ANNOTATION: annotation}
    return {
        "metadata": meta,
        "spec": {"containers": [{"name": "shutdown-manager"}, {"name": "envoy"}]},
        "status": {
            "phase": phase,
            "containerStatuses": [
                {
                    "name": "shutdown-manager",
                    "ready": True,
                    "state": {"running": {"startedAt": "2026-01-01T10:00:00Z"}},
                },
                {
                    "name": "envoy",
                    "ready": ready,
                    "state": {"running": {"startedAt": "2026-01-01T11:00:00Z"}},
                },
            ],
        },
    }


def test_envoy_pod_reads_the_named_container() -> None:
    view = envoy.envoy_pod(raw_pod(False, "2026-01-01T11:30:00Z"), "envoy", node_lost=False)
    assert view.key == "edge/envoy-x"
    assert view.stuck and view.annotated
    assert view.marked == datetime(2026, 1, 1, 11, 30, tzinfo=UTC)
    assert view.container_started == datetime(2026, 1, 1, 11, 0, tzinfo=UTC)
    assert not envoy.envoy_pod(raw_pod(True), "envoy", node_lost=False).stuck
    assert not envoy.envoy_pod(raw_pod(False), "missing", node_lost=False).has_container
    assert not envoy.envoy_pod(raw_pod(False, phase="Pending"), "envoy", node_lost=False).stuck


def test_garbled_annotation_reads_as_unmarked() -> None:
    view = envoy.envoy_pod(raw_pod(False, "yesterday"), "envoy", node_lost=False)
    assert view.annotated and view.marked is None


def test_event_message_says_what_and_why() -> None:
    step = Restart(pod(), timedelta(minutes=6, seconds=2))
    text = envoy.event_message(step, "envoy", FIVE)
    assert "projectcontour/envoy-a" in text and "6m2s" in text and "5m0s" in text


# ---- properties --------------------------------------------------------------------------------

pods = st.builds(
    EnvoyPod,
    namespace=st.just("ns"),
    name=st.sampled_from(["a", "b", "c", "d"]),
    uid=st.just("u"),
    running=st.booleans(),
    deleting=st.booleans(),
    node_lost=st.booleans(),
    has_container=st.booleans(),
    container_running=st.booleans(),
    container_ready=st.booleans(),
    container_started=st.none() | st.integers(0, 3600).map(lambda s: NOW - timedelta(seconds=s)),
    marked=st.none() | st.integers(-60, 3600).map(lambda s: NOW - timedelta(seconds=s)),
    annotated=st.booleans(),
    selected=st.booleans(),
)


@given(st.lists(pods, max_size=6, unique_by=lambda p: p.name))
def test_restart_only_a_pod_stuck_past_the_duration_and_never_two_at_once(group: list[EnvoyPod]) -> None:
    step = envoy.plan(observed(*group))
    if isinstance(step, Restart):
        assert step.pod.stuck and not step.pod.deleting
        since = step.pod.not_ready_since()
        assert since is not None and since + FIVE <= NOW
        assert not any(p.deleting for p in group)
        assert step.not_ready_for >= FIVE
    if isinstance(step, Wait):
        assert step.seconds >= 1.0
    if isinstance(step, Mark):
        assert step.pod.stuck and step.since == NOW


@given(st.lists(pods, max_size=6, unique_by=lambda p: p.name))
def test_nothing_happens_when_disabled(group: list[EnvoyPod]) -> None:
    assert envoy.plan(observed(*group, enabled=False)) == Done()
