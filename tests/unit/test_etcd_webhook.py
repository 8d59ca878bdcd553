"""The EtcdCluster validating webhooks' rules: every refusal names its field, updates ratchet."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from kustos.etcd.webhook import GUARD_PATH, VERSION_PATH, guard_denials, version_denial, webhooks
from kustos.runtime.webhook import handle_review

Obj = dict[str, Any]


def cluster(status: Obj | None = None, **spec: Any) -> Obj:
    body: Obj = {"version": "3.6.16", "size": 3, "addressing": "dns", "storage": {"type": "emptyDir"}}
    body.update(spec)
    return {"metadata": {"name": "e", "namespace": "default"}, "spec": body, "status": status or {}}


def test_a_valid_create_and_an_unchanged_update_are_admitted() -> None:
    assert guard_denials(cluster(), None) == []
    assert guard_denials(cluster(), cluster()) == []
    assert version_denial(cluster(), cluster()) is None
    assert version_denial(cluster(), None) is None


def test_storage_type_is_immutable() -> None:
    denials = guard_denials(cluster(storage={"type": "pvc"}), cluster())
    assert len(denials) == 1 and denials[0].startswith("spec.storage.type:")


def test_addressing_is_immutable() -> None:
    denials = guard_denials(cluster(addressing="podIP"), cluster())
    assert len(denials) == 1 and denials[0].startswith("spec.addressing:")


def test_defaults_count_as_set() -> None:
    bare = {"metadata": {"name": "e"}, "spec": {"version": "3.6.16"}}
    assert guard_denials(cluster(), bare) == []
    assert guard_denials(cluster(addressing="podIP"), bare)[0].startswith("spec.addressing:")


@pytest.mark.parametrize(
    "old",
    [
        cluster(restore={"backup": "b"}),  # created from a backup, not yet restored
        cluster(restore={"backup": "b"}, status={"recovery": {"phase": "Running"}}),
        cluster(status={"recovery": {"phase": "Running"}}),  # a disaster recovery
    ],
)
def test_size_cannot_change_during_a_restore(old: Obj) -> None:
    new = cluster(size=5, restore=old["spec"].get("restore"), status=old["status"])
    denials = guard_denials(new, old)
    assert len(denials) == 1 and denials[0].startswith("spec.size:")


def test_size_may_change_once_the_restore_succeeded() -> None:
    old = cluster(restore={"backup": "b"}, status={"recovery": {"phase": "Succeeded"}})
    assert guard_denials(cluster(size=5, restore={"backup": "b"}), old) == []
    assert guard_denials(cluster(size=5), cluster(status={"recovery": {"phase": "Failed"}})) == []


@pytest.mark.parametrize("version", ["3.4.27", "3.0.0", "3.4.0"])
def test_versions_older_than_the_minimum_are_refused(version: str) -> None:
    denials = guard_denials(cluster(version=version), None)
    assert len(denials) == 1 and denials[0].startswith("spec.version:") and "3.5.0" in denials[0]


def test_the_minimum_ratchets_an_old_cluster_may_still_be_updated() -> None:
    old = cluster(version="3.4.27")
    assert guard_denials(cluster(version="3.4.27", size=5), old) == []


@pytest.mark.parametrize(
    "arg",
    [
        "--data-dir=/elsewhere", "--name=x", "--initial-cluster=a=http://a:2380",
        "--initial-cluster-state=existing", "--initial-cluster-token=t", "-name", "--data-dir",
        "--listen-client-urls=http://0.0.0.0:2379", "--listen-peer-urls=http://0.0.0.0:2380",
        "--advertise-client-urls=http://x:2379", "--initial-advertise-peer-urls=http://x:2380",
    ],
)  # fmt: skip
def test_extra_args_that_fight_the_operator_are_refused(arg: str) -> None:
    denials = guard_denials(cluster(extraArgs=["--quota-backend-bytes=4294967296", arg]), None)
    flag = arg.lstrip("-").split("=")[0]
    assert denials == [f"spec.extraArgs[1]: --{flag} is set by the operator and cannot be overridden"]


@pytest.mark.parametrize(
    "args",
    [["--quota-backend-bytes=4294967296"], ["--listen-metrics-urls=http://0.0.0.0:2381"], ["--name-x"],
     ["--snapshot-count", "10000"]],
)  # fmt: skip
def test_other_extra_args_are_admitted(args: list[str]) -> None:
    assert guard_denials(cluster(extraArgs=args), None) == []


def test_extra_args_ratchet_a_flag_already_there_does_not_block_updates() -> None:
    old = cluster(extraArgs=["--name=x"])
    assert guard_denials(cluster(extraArgs=["--name=x"], size=5), old) == []
    assert guard_denials(cluster(extraArgs=["--name=x", "--data-dir=/d"]), old) == [
        "spec.extraArgs[1]: --data-dir is set by the operator and cannot be overridden"
    ]


def test_a_flag_the_versions_etcd_removed_is_refused_naming_its_replacement() -> None:
    args = ["--quota-backend-bytes=4294967296", "--experimental-compaction-batch-limit=500",
            "--experimental-initial-corrupt-check"]  # fmt: skip
    assert guard_denials(cluster(version="3.6.16", extraArgs=args), None) == []
    denials = guard_denials(cluster(version="3.7.3", extraArgs=args), None)
    assert denials == [
        "spec.extraArgs[1]: --experimental-compaction-batch-limit was removed in etcd 3.7; use "
        "--compaction-batch-limit instead (etcd 3.6 accepts it too) (spec.version is 3.7.3)",
        "spec.extraArgs[2]: --experimental-initial-corrupt-check was removed in etcd 3.7; use "
        "--feature-gates=InitialCorruptCheck=true instead (etcd 3.6 accepts it too) (spec.version is 3.7.3)",
    ]
    # Upgrading a 3.6 cluster that still sets one is refused in the same write.
    old = cluster(version="3.6.16", extraArgs=args)
    assert len(guard_denials(cluster(version="3.7.3", extraArgs=args), old)) == 2
    assert guard_denials(cluster(version="3.6.16", extraArgs=["--enable-v2=true"]), None) == [
        "spec.extraArgs[0]: --enable-v2 was removed in etcd 3.6 (spec.version is 3.6.16)"
    ]
    assert guard_denials(cluster(version="3.5.35", extraArgs=["--enable-v2=true"]), None) == []


def test_removed_flags_ratchet_an_unchanged_object_may_still_be_updated() -> None:
    old = cluster(version="3.7.3", extraArgs=["--experimental-memory-mlock"])
    assert guard_denials({**old, "spec": {**old["spec"], "size": 5}}, old) == []


def test_every_refusal_of_one_write_is_reported() -> None:
    denials = guard_denials(
        cluster(addressing="podIP", storage={"type": "pvc"}, extraArgs=["--name=x"]), cluster()
    )
    assert [d.split(":")[0] for d in denials] == ["spec.storage.type", "spec.addressing", "spec.extraArgs[0]"]


@pytest.mark.parametrize(
    ("current", "wanted", "refused"),
    [
        ("3.5.35", "3.6.16", False),  # one minor up
        ("3.5.35", "3.7.0", False),  # two minors up: through the newest proven 3.6
        ("3.5.35", "3.9.0", True),  # through 3.8, which kustos proves no patch of
        ("3.6.16", "3.6.1", False),  # a patch down
        ("3.6.16", "3.5.35", False),  # one minor down: 3.6 has the downgrade protocol
        ("3.7.0", "3.5.35", False),  # two minors down: 3.7 -> 3.6.16 -> 3.5, each by etcd's downgrade
        ("3.6.16", "3.4.27", True),  # two minors down: 3.5 cannot roll back
        ("3.5.35", "3.4.27", True),  # 3.5 cannot roll back
        ("3.6.16", "3.7.3", False),
        ("3.6.9", "3.7.3", False),  # through the newest proven 3.6: etcd asks for 3.6.11 or later first
        ("3.7.3", "3.6.16", False),  # 3.7 rolls back through the downgrade protocol
    ],
)
def test_unsafe_version_jumps_are_refused(current: str, wanted: str, refused: bool) -> None:
    denial = version_denial(cluster(version=wanted), cluster(version=current))
    assert (denial is not None) == refused
    if denial:
        assert denial.startswith("spec.version:")


def test_version_jumps_are_measured_from_what_the_members_run() -> None:
    # The spec asked for 3.8, which 3.7 members have not started: going back to 3.6 is one
    # rollback from what they run (from 3.8 it would need a downgrade protocol 3.8 lacks).
    old = cluster(version="3.8.0", status={"currentVersion": "3.7.3"})
    assert version_denial(cluster(version="3.6.16"), old) is None
    assert version_denial(cluster(version="3.6.16"), cluster(version="3.8.0")) is not None


def test_a_down_operator_never_blocks_edits() -> None:
    """Both fail open: what would strand data is also a CEL rule the API server enforces."""
    policies = {w.path: w.failure_policy for w in webhooks()}
    assert policies == {GUARD_PATH: "Ignore", VERSION_PATH: "Ignore"}
    for webhook in webhooks():
        assert webhook.rules[0]["resources"] == ["etcdclusters"]
        assert webhook.rules[0]["operations"] == ["CREATE", "UPDATE"]


def test_a_denial_is_an_admission_review_naming_the_field() -> None:
    guard = next(w for w in webhooks() if w.path == GUARD_PATH)
    body = {"request": {"uid": "u1", "object": cluster(addressing="podIP"), "oldObject": cluster()}}
    review = asyncio.run(handle_review(guard, body))
    response = review["response"]
    assert response["uid"] == "u1" and response["allowed"] is False
    assert response["status"]["code"] == 422 and response["status"]["message"].startswith("spec.addressing:")


@pytest.mark.parametrize(
    ("spec", "field"),
    [({"backup": {"schedule": "99 * * * *"}}, "spec.backup.schedule"),
     ({"maintenance": {"defragmentation": {"schedule": "0 0 30 2 *"}}},
      "spec.maintenance.defragmentation.schedule")],
)  # fmt: skip
def test_a_cron_schedule_that_never_fires_is_refused_naming_its_field(spec: Obj, field: str) -> None:
    denials = guard_denials(cluster(**spec), None)
    assert len(denials) == 1 and denials[0].startswith(f"{field}: invalid cron schedule"), denials
    assert guard_denials(cluster(**spec), cluster(**spec)) == []  # ratcheted: admitted before
    assert guard_denials(cluster(backup={"schedule": "0 */6 * * *"}), None) == []
