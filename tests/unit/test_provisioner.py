"""The local-path provisioner's decisions: which claims get a volume, and what that volume is."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from lightkube.resources.core_v1 import PersistentVolume
from lightkube.resources.storage_v1 import StorageClass

from kustos.devcluster.provisioner import (
    PROVISIONED_BY,
    PROVISIONER,
    SELECTED_NODE,
    STORAGE_CLASS,
    claim_wants_volume,
    storage_class_manifest,
    volume_is_released,
    volume_manifest,
    volume_name,
)

OURS = {STORAGE_CLASS}


def _claim(**spec: Any) -> dict[str, Any]:
    return {
        "metadata": {
            "name": "data-etcd-0",
            "namespace": "db",
            "uid": "0b9c-77aa",
            "annotations": {SELECTED_NODE: "worker-2"},
        },
        "spec": {
            "storageClassName": STORAGE_CLASS,
            "accessModes": ["ReadWriteOnce"],
            "resources": {"requests": {"storage": "5Gi"}},
            **spec,
        },
    }


def _volume(phase: str | None, provisioner: str | None = PROVISIONER) -> dict[str, Any]:
    annotations = {PROVISIONED_BY: provisioner} if provisioner else {}
    volume: dict[str, Any] = {"metadata": {"name": "pvc-1", "annotations": annotations}}
    if phase is not None:
        volume["status"] = {"phase": phase}
    return volume


# ---- which claims ---------------------------------------------------------------------


def test_a_pending_claim_of_our_class_with_a_scheduled_consumer_wants_a_volume() -> None:
    assert claim_wants_volume(_claim(), OURS)


def test_a_claim_waits_until_the_scheduler_selected_a_node() -> None:
    claim = _claim()
    del claim["metadata"]["annotations"][SELECTED_NODE]

    assert not claim_wants_volume(claim, OURS)
    assert not claim_wants_volume({**claim, "metadata": {"name": "x"}}, OURS)


def test_a_claim_of_another_class_is_left_alone() -> None:
    assert not claim_wants_volume(_claim(storageClassName="ebs-gp3"), OURS)
    assert not claim_wants_volume(_claim(storageClassName=None), OURS)


def test_a_claim_of_a_users_own_class_for_our_provisioner_wants_a_volume() -> None:
    assert claim_wants_volume(_claim(storageClassName="fast-local"), {STORAGE_CLASS, "fast-local"})


def test_a_bound_claim_does_not_want_another_volume() -> None:
    assert not claim_wants_volume(_claim(volumeName="pvc-0b9c-77aa"), OURS)


def test_a_claim_being_deleted_does_not_want_a_volume() -> None:
    claim = _claim()
    claim["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"

    assert not claim_wants_volume(claim, OURS)


def test_an_empty_claim_does_not_want_a_volume() -> None:
    assert not claim_wants_volume({}, OURS)


# ---- the volume -----------------------------------------------------------------------


def test_volume_is_named_after_the_claim_uid() -> None:
    manifest = volume_manifest(_claim(), Path("/v"))

    assert manifest["metadata"]["name"] == volume_name(_claim()) == "pvc-0b9c-77aa"
    assert manifest["metadata"]["annotations"] == {PROVISIONED_BY: PROVISIONER}


def test_volume_has_the_requested_capacity_and_access_modes() -> None:
    spec = volume_manifest(_claim(accessModes=["ReadWriteOncePod"]), Path("/v"))["spec"]

    assert spec["capacity"] == {"storage": "5Gi"}
    assert spec["accessModes"] == ["ReadWriteOncePod"]
    assert spec["storageClassName"] == STORAGE_CLASS
    assert spec["volumeMode"] == "Filesystem"
    assert spec["persistentVolumeReclaimPolicy"] == "Delete"


def test_volume_without_a_request_gets_a_default_size_and_mode() -> None:
    claim = _claim()
    del claim["spec"]["resources"]
    del claim["spec"]["accessModes"]

    spec = volume_manifest(claim, Path("/v"))["spec"]

    assert spec["capacity"] == {"storage": "1Gi"}
    assert spec["accessModes"] == ["ReadWriteOnce"]


def test_volume_keeps_a_block_volume_mode() -> None:
    assert volume_manifest(_claim(volumeMode="Block"), Path("/v"))["spec"]["volumeMode"] == "Block"


def test_volume_is_pinned_to_the_selected_node(tmp_path: Path) -> None:
    spec = volume_manifest(_claim(), tmp_path)["spec"]

    assert spec["nodeAffinity"]["required"]["nodeSelectorTerms"] == [
        {"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In", "values": ["worker-2"]}]}
    ]


def test_volume_is_the_local_directory(tmp_path: Path) -> None:
    directory = tmp_path / "volumes" / "pvc-0b9c-77aa"

    assert volume_manifest(_claim(), directory)["spec"]["local"] == {"path": str(directory)}


def test_volume_is_reserved_for_exactly_this_claim() -> None:
    claim_ref = volume_manifest(_claim(), Path("/v"))["spec"]["claimRef"]

    assert claim_ref == {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "namespace": "db",
        "name": "data-etcd-0",
        "uid": "0b9c-77aa",
    }


def test_volume_manifest_is_a_valid_persistent_volume(tmp_path: Path) -> None:
    volume = PersistentVolume.from_dict(volume_manifest(_claim(), tmp_path))

    assert volume.spec is not None and volume.spec.local is not None
    assert volume.spec.local.path == str(tmp_path)
    assert volume.spec.claimRef is not None and volume.spec.claimRef.uid == "0b9c-77aa"


def test_storage_class_is_the_default_and_waits_for_the_first_consumer() -> None:
    manifest = storage_class_manifest()
    storage_class = StorageClass.from_dict(manifest)

    assert storage_class.metadata is not None and storage_class.metadata.name == STORAGE_CLASS
    assert manifest["metadata"]["annotations"]["storageclass.kubernetes.io/is-default-class"] == "true"
    assert storage_class.provisioner == PROVISIONER
    assert storage_class.volumeBindingMode == "WaitForFirstConsumer"
    assert storage_class.reclaimPolicy == "Delete"


# ---- reclaiming -----------------------------------------------------------------------


@pytest.mark.parametrize("phase", ["Released", "Failed"])
def test_our_released_volume_is_reclaimed(phase: str) -> None:
    assert volume_is_released(_volume(phase))


@pytest.mark.parametrize("phase", ["Pending", "Available", "Bound", None])
def test_a_volume_in_use_or_waiting_is_kept(phase: str | None) -> None:
    assert not volume_is_released(_volume(phase))


@pytest.mark.parametrize("provisioner", ["rancher.io/local-path", None])
def test_a_released_volume_of_another_provisioner_is_not_ours_to_delete(provisioner: str | None) -> None:
    assert not volume_is_released(_volume("Released", provisioner))


def test_a_volume_without_metadata_is_kept() -> None:
    assert not volume_is_released({"status": {"phase": "Released"}})
