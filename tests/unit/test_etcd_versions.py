"""Which version changes an EtcdCluster accepts."""

from __future__ import annotations

import pytest

from kustos.api.etcd import EtcdCluster
from kustos.etcd.versions import (
    agreed_version,
    creation_version,
    image_version,
    parse,
    rollback_target,
    target_version,
    upgrade_refusal,
)


@pytest.mark.parametrize(
    ("current", "wanted"),
    [
        (None, "3.6.16"), ("3.6.16", "3.6.16"), ("3.5.35", "3.5.36"), ("3.5.35", "3.5.1"),
        ("3.5.35", "3.6.16"),
        ("3.6.16", "3.5.35"),  # one minor back, through etcd's downgrade protocol
        ("3.6.16", "3.7.3"), ("3.6.11", "3.7.0"),
        ("3.7.3", "3.6.16"),  # 3.7 has the downgrade protocol too
        ("3.5.35", "3.7.3"), ("3.6.10", "3.7.3"),  # paths across minors (test_etcd_chain.py)
        ("3.7.3", "3.5.35"), ("3.5.1", "3.8.0"),
    ],
)  # fmt: skip
def test_allowed_changes(current: str | None, wanted: str) -> None:
    assert upgrade_refusal(current, wanted) is None


@pytest.mark.parametrize(
    ("current", "wanted", "why"),
    [
        ("3.5.35", "3.4.33", "etcd 3.5 has no downgrade protocol: it cannot roll back to 3.4 (3.4.33)"),
        ("3.6.16", "3.4.33", "etcd 3.5 has no downgrade protocol: it cannot roll back to 3.4"),
        ("3.6.16", "4.0.0", "major version"),
        ("3.7.3", "3.9.0", "goes through etcd 3.8, and kustos proves no 3.8 patch to pass through"),
        ("3.8.1", "3.7.3", "etcd 3.8 has no downgrade protocol"),
    ],
)
def test_refused_changes_say_why(current: str, wanted: str, why: str) -> None:
    reason = upgrade_refusal(current, wanted)
    assert reason is not None and why in reason


def test_versions_from_image_tags() -> None:
    assert image_version("gcr.io/etcd-development/etcd:v3.6.16") == "3.6.16"
    assert image_version("registry.k8s.io/etcd:3.5.35-0") == "3.5.35"
    assert image_version("localhost:5000/etcd") is None
    assert image_version("etcd:latest") is None
    assert parse("3.6") is None


@pytest.mark.parametrize(
    ("current", "wanted", "target"),
    [
        ("3.6.16", "3.5.35", "3.5"),
        ("3.6.0", "3.5.0", "3.5"),
        ("3.7.3", "3.6.16", "3.6"),
        ("3.7.3", "3.5.35", None),  # two minors: a path of two rollbacks (test_etcd_chain.py)
        ("v3.6.16", "3.5.35-0", "3.5"),
        ("3.5.35", "3.4.33", None),  # 3.5 has no downgrade API
        ("3.6.16", "3.4.33", None),  # two minors
        ("3.6.16", "3.6.15", None),  # patch change: a plain roll
        ("3.5.35", "3.6.16", None),  # upgrade
        ("4.0.0", "3.6.16", None),  # major
        ("garbage", "3.5.35", None),
    ],
)
def test_rollback_target(current: str, wanted: str, target: str | None) -> None:
    assert rollback_target(current, wanted) == target


def test_the_running_version_is_recorded_only_when_every_member_answered_with_it() -> None:
    assert agreed_version(["3.5.35", "3.5.35", "3.5.35"]) == "3.5.35"
    assert agreed_version(["3.5.35", "3.5.35", ""]) is None, "the silent one may still run 3.6"
    assert agreed_version(["3.5.35", "3.6.16"]) is None
    assert agreed_version([]) is None


def cluster_on(running: str | None, wanted: str) -> EtcdCluster:
    return EtcdCluster.model_validate({
        "apiVersion": "kustos.dev/v1alpha1", "kind": "EtcdCluster",
        "metadata": {"name": "main", "namespace": "prod", "uid": "c1"},
        "spec": {"size": 3, "version": wanted},
        "status": {"currentVersion": running} if running else {},
    })  # fmt: skip


@pytest.mark.parametrize(
    ("running", "wanted", "rolling_back", "target", "created_on"),
    [
        (None, "3.6.16", False, "3.6.16", "3.6.16"),  # a new cluster
        ("3.5.35", "3.6.16", False, "3.6.16", "3.6.16"),  # an upgrade: new pods on the new version
        ("3.6.16", "3.5.35", True, "3.5.35", "3.6.16"),  # mid-rollback: the version the data is for
        ("3.6.16", "3.5.35", False, "3.5.35", "3.5.35"),  # every member rolled back: etcd's rule
        ("3.6.16", "3.4.30", False, "3.6.16", "3.6.16"),  # refused: nothing changes
        ("3.5.35", "3.7.3", False, "3.6.16", "3.6.16"),  # across minors: the first step
    ],
)  # fmt: skip
def test_which_version_members_run_and_which_a_recreated_pod_starts_on(
    running: str | None, wanted: str, rolling_back: bool, target: str, created_on: str
) -> None:
    cluster = cluster_on(running, wanted)
    assert target_version(cluster) == target
    assert creation_version(cluster, rolling_back) == created_on
