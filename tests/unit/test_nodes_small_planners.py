"""PendingNode and AutoscalingStrategy planners, ScalingGroup's image rule, kwok helpers."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from kustos.nodes.autoscaling import planner as autoscaling
from kustos.nodes.cloud import parse_options, provider_from
from kustos.nodes.cloud.kwok import GroupConfig, KwokProvider, _instance, label_value, node_name_of
from kustos.nodes.pendingnode import planner as pending
from kustos.nodes.scalinggroup.planner import want_image
from kustos.runtime.cloud import InstanceState, NotFound, ProviderError, Role
from kustos.runtime.steps import Done, Wait

NOW = datetime(2026, 1, 1, tzinfo=UTC)


def join(**kw: object) -> pending.Observed:
    deadline = NOW + timedelta(minutes=5)
    values: dict[str, object] = {
        "goal": "Join", "provider_id": "kwok://n", "deadline": deadline, "now": NOW,
        "node_ready": False, "node_exists": True, "instance": InstanceState.PENDING,
    }  # fmt: skip
    values.update(kw)
    return pending.Observed(**values)  # type: ignore[arg-type]


def test_join_ready_is_joined() -> None:
    assert pending.plan(join(node_ready=True)) == pending.MarkJoined()


def test_join_in_time_waits() -> None:
    assert isinstance(pending.plan(join()), Wait)


def test_join_past_deadline_deletes_the_instance() -> None:
    assert isinstance(pending.plan(join(now=NOW + timedelta(minutes=6))), pending.DeleteInstance)


def test_join_past_deadline_already_gone_is_forgotten() -> None:
    step = pending.plan(join(now=NOW + timedelta(minutes=6), instance=InstanceState.GONE, node_exists=False))
    assert isinstance(step, pending.Forget) and not isinstance(step, pending.CancelCreate)


def test_join_without_instance_past_deadline_takes_its_creation_back_and_is_forgotten() -> None:
    step = pending.plan(join(provider_id="", now=NOW + timedelta(minutes=6)))
    assert isinstance(step, pending.CancelCreate)


def test_leave_gone_is_forgotten_and_late_is_retried() -> None:
    assert isinstance(pending.plan(join(goal="Leave", instance=InstanceState.GONE)), pending.Forget)
    late = join(goal="Leave", instance=InstanceState.STOPPING, now=NOW + timedelta(minutes=6))
    assert isinstance(pending.plan(late), pending.DeleteInstance)
    assert isinstance(pending.plan(join(goal="Leave", instance=InstanceState.STOPPING)), Wait)


def test_a_refused_delete_is_recorded_degraded_with_the_providers_reason() -> None:
    """Finding 8: a delete the provider refuses (group at its minimum) is counted and said
    (Degraded, its reason and message) before it is retried, not lost with the exception."""
    late = join(now=NOW + timedelta(minutes=6), instance=InstanceState.RUNNING)
    step = pending.plan(late)
    assert isinstance(step, pending.DeleteInstance)
    refused = ProviderError("AWS group workers is at its minimum size (3)", reason="ProviderGroupAtMinimum")
    previous = {"phase": "Pending", "attempts": 1}

    status = pending.status(replace(late, previous=previous, generation=4), step, late.now, refused)

    assert status["attempts"] == 2
    assert status["phase"] == "DeadlineExceeded"
    assert status["instanceState"] == str(InstanceState.RUNNING)
    assert "at its minimum size (3)" in status["message"]
    [degraded] = [c for c in status["conditions"] if c["type"] == "Degraded"]
    assert (degraded["status"], degraded["reason"], degraded["observedGeneration"]) == (
        "True", "ProviderGroupAtMinimum", 4,
    )  # fmt: skip
    assert degraded["message"].startswith("deleting the instance failed: AWS group workers")
    assert previous == {"phase": "Pending", "attempts": 1}  # pure


def test_a_failed_lookup_is_recorded_and_the_rest_kept() -> None:
    previous = {"phase": "Pending", "instanceState": "Running"}
    failure = ProviderError("providerID names zone 'eu-west-1a'", reason="ProviderOtherRegion")

    status = pending.unobserved(previous, 1, NOW, failure)

    assert (status["phase"], status["instanceState"]) == ("Pending", "Running")
    [degraded] = status["conditions"]
    assert (degraded["reason"], degraded["status"]) == ("ProviderOtherRegion", "True")
    assert "looking up the instance failed" in degraded["message"]
    # The provider answers again: the condition says so.
    after = pending.status(join(previous=status, generation=1), pending.plan(join()), NOW)
    assert [(c["status"], c["reason"]) for c in after["conditions"]] == [("False", "AsExpected")]


def test_an_accepted_delete_is_deadline_exceeded_and_counted() -> None:
    late = join(now=NOW + timedelta(minutes=6))
    step = pending.plan(late)
    status = pending.status(late, step, late.now)
    assert (status["phase"], status["attempts"]) == ("DeadlineExceeded", 1)
    assert [c["reason"] for c in status["conditions"]] == ["DeadlineExceeded"]
    assert pending.status(join(), pending.plan(join()), NOW)["phase"] == "Pending"
    assert pending.status(join(node_ready=True), pending.MarkJoined(), NOW)["phase"] == "Joined"


def image(name: str, paused: bool = False, progressing: bool = True, **status: object) -> dict[str, object]:
    conditions = [
        {"type": "Progressing", "status": "True" if progressing else "False", "reason": "Replacing"}
    ]
    return {
        "metadata": {"name": name},
        "spec": {"paused": paused},
        "status": {"conditions": conditions, **status},
    }


def test_progressing_alone_never_holds_the_autoscaler() -> None:
    """Finding 9: Progressing is True for any step short of Done, incl. "no cloud provider
    configured" and a rollout waiting for capacity: neither may hold the autoscaler at 0."""
    no_provider = image("a", waitingFor="no cloud provider configured (kustos run --cloud-provider)")
    no_capacity = image("b", step="CreateHeir", waitingFor="AWS group workers is at its maximum size")
    assert autoscaling.in_flight([no_provider, no_capacity], provider=True) == []
    assert autoscaling.in_flight([{"metadata": {"name": "c"}}], provider=True) == []


@pytest.mark.parametrize(
    "field", [("pending", ["a-heir-1"]), ("heirs", ["n2"]), ("donors", ["n1"]),
              ("replacements", [{"donor": "n1", "heir": "n2"}])],
)  # fmt: skip
def test_a_heir_pair_or_join_in_flight_holds_it_with_a_provider_only(field: tuple[str, object]) -> None:
    key, value = field
    busy = image("busy", **{key: value})
    assert autoscaling.in_flight([image("idle"), busy], provider=True) == ["busy"]
    assert autoscaling.in_flight([busy], provider=False) == []  # no provider: nothing can be in flight
    assert autoscaling.in_flight([image("busy", paused=True, **{key: value})], provider=True) == []


@pytest.mark.parametrize(
    ("enabled", "rolling", "replicas", "saved", "expected"),
    [
        (True, True, 2, None, autoscaling.Pause(2)),
        (True, True, 0, 2, Done()),
        (True, False, 0, 2, autoscaling.Restore(2)),
        (True, True, 0, None, autoscaling.Pause(0)),  # the user had it off: saved as 0 ...
        (True, False, 0, 0, autoscaling.Restore(0)),  # ... and it stays off afterwards
        (False, True, 3, None, Done()),
        (False, True, 0, 3, autoscaling.Restore(3)),  # disabled mid-rollout: give it back
    ],
)
def test_autoscaler_paused_and_restored_to_the_users_own_replicas(
    enabled: bool, rolling: bool, replicas: int, saved: int | None, expected: autoscaling.Step
) -> None:
    o = autoscaling.Observed(enabled, rolling, True, replicas, saved)
    assert autoscaling.plan(o) == expected


def test_autoscaler_missing_waits() -> None:
    assert isinstance(autoscaling.plan(autoscaling.Observed(True, True, False, 0, None)), Wait)


def test_scaling_group_image() -> None:
    assert want_image("a", "b") == "b"
    assert want_image("b", "b") is None
    assert want_image("a", None) is None


def test_kwok_helpers() -> None:
    assert label_value("registry.example/os:v2") == "registry.example-os-v2"
    assert node_name_of("kwok://n1") == "n1"
    with pytest.raises(ProviderError) as caught:  # not NotFound: that would fence the node
        node_name_of("aws:///i-1")
    assert not isinstance(caught.value, NotFound) and caught.value.reason == "ProviderForeignID"
    g = GroupConfig.parse(
        {"id": "w", "role": "Worker", "image": "x", "readyAfterSeconds": 2, "failCreate": "capacity"}
    )
    assert g.role == Role.WORKER and g.ready_after_seconds == 2 and g.fail_create == "capacity"


def test_kwok_instance_state_follows_kwok_management() -> None:
    labels = {"kustos.dev/kwok-group": "w", "kustos.dev/kwok-managed": "true"}
    base = {"metadata": {"name": "n", "labels": labels,
                         "annotations": {"kustos.dev/kwok-image": "x"}},
            "spec": {"providerID": "kwok://n"},
            "status": {"conditions": [{"type": "Ready", "status": "True"}]}}  # fmt: skip
    assert _instance(base).state == InstanceState.RUNNING
    assert _instance(base).image == "x"
    stopped = {**base, "metadata": {**base["metadata"], "labels": {"kustos.dev/kwok-group": "w"}}}
    assert _instance(stopped).state == InstanceState.STOPPED
    partitioned = {
        **stopped,
        "metadata": {**stopped["metadata"], "annotations": {"kustos.dev/partitioned": "true"}},
    }
    assert _instance(partitioned).state == InstanceState.RUNNING


def test_provider_from() -> None:
    assert provider_from("none", {}) is None
    kwok = provider_from("kwok", {"namespace": "ns", "ip-prefix": "127.9"})
    assert isinstance(kwok, KwokProvider) and kwok.namespace == "ns" and kwok.ip_prefix == "127.9"
    with pytest.raises(ValueError, match="unknown kwok provider option"):
        provider_from("kwok", {"bogus": "1"})
    with pytest.raises(ValueError, match="unknown cloud provider"):
        provider_from("openstack", {})
    assert parse_options(["a=b", "c=d=e"]) == {"a": "b", "c": "d=e"}
    with pytest.raises(ValueError, match="key=value"):
        parse_options(["nope"])


def test_kustos_run_refuses_a_bad_cloud_provider_naming_the_flag() -> None:
    from typer.testing import CliRunner

    from kustos.cli import app

    runner = CliRunner(env={"COLUMNS": "300", "TERMINAL_WIDTH": "300"})
    result = runner.invoke(app, ["run", "--cloud-provider", "openstack"])
    assert result.exit_code == 2
    assert "--cloud-provider" in result.output and "unknown cloud provider 'openstack'" in result.output
    result = runner.invoke(app, ["run", "--cloud-provider", "kwok", "--cloud-option", "nokey"])
    assert result.exit_code == 2 and "expected key=value" in result.output
