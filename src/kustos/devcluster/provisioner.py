"""A local-path volume provisioner for the dev cluster's default StorageClass (F-DEV-2).

It does what local-path provisioners do on real clusters: a claim of our class,
once the scheduler has picked a node for its first consumer, gets a fresh host
directory as a PersistentVolume pinned to that node; a released volume of ours
is deleted with its directory. The pod process runner maps the claim to that
directory, so PVC data survives its pod being deleted and recreated.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any, cast

import httpx2
from lightkube import AsyncClient
from lightkube.core.exceptions import ApiError
from lightkube.resources.core_v1 import PersistentVolume

from kustos.runtime.informer import Informer, new_state_only
from kustos.runtime.resources import CLAIMS, STORAGE_CLASSES, VOLUMES

PROVISIONER = "kustos.dev/local-path"
STORAGE_CLASS = "kustos-local"
SELECTED_NODE = "volume.kubernetes.io/selected-node"
PROVISIONED_BY = "pv.kubernetes.io/provisioned-by"

log = logging.getLogger(__name__)


def storage_class_manifest() -> dict[str, Any]:
    return {
        "apiVersion": "storage.k8s.io/v1",
        "kind": "StorageClass",
        "metadata": {
            "name": STORAGE_CLASS,
            "annotations": {"storageclass.kubernetes.io/is-default-class": "true"},
        },
        "provisioner": PROVISIONER,
        "volumeBindingMode": "WaitForFirstConsumer",
        "reclaimPolicy": "Delete",
        "allowVolumeExpansion": True,
    }


def volume_name(claim: Mapping[str, Any]) -> str:
    return f"pvc-{claim['metadata']['uid']}"


def claim_wants_volume(claim: Mapping[str, Any], our_classes: set[str]) -> bool:
    """A pending claim of one of our classes whose consumer has been scheduled."""
    meta = claim.get("metadata") or {}
    spec = claim.get("spec") or {}
    return (
        spec.get("storageClassName") in our_classes
        and not spec.get("volumeName")
        and not meta.get("deletionTimestamp")
        and SELECTED_NODE in (meta.get("annotations") or {})
    )


def volume_manifest(claim: Mapping[str, Any], directory: Path) -> dict[str, Any]:
    """The PersistentVolume that satisfies a claim: its directory, pinned to its node."""
    meta = claim["metadata"]
    spec = claim["spec"]
    node = meta["annotations"][SELECTED_NODE]
    storage = ((spec.get("resources") or {}).get("requests") or {}).get("storage", "1Gi")
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {
            "name": volume_name(claim),
            "annotations": {PROVISIONED_BY: PROVISIONER},
        },
        "spec": {
            "capacity": {"storage": storage},
            "accessModes": spec.get("accessModes") or ["ReadWriteOnce"],
            "persistentVolumeReclaimPolicy": "Delete",
            "storageClassName": spec["storageClassName"],
            "volumeMode": spec.get("volumeMode") or "Filesystem",
            "local": {"path": str(directory)},
            "claimRef": {
                "apiVersion": "v1",
                "kind": "PersistentVolumeClaim",
                "namespace": meta["namespace"],
                "name": meta["name"],
                "uid": meta["uid"],
            },
            "nodeAffinity": {
                "required": {
                    "nodeSelectorTerms": [
                        {
                            "matchExpressions": [
                                {
                                    "key": "kubernetes.io/hostname",
                                    "operator": "In",
                                    "values": [node],
                                }
                            ]
                        }
                    ]
                }
            },
        },
    }


def volume_is_released(volume: Mapping[str, Any]) -> bool:
    meta = volume.get("metadata") or {}
    return (meta.get("annotations") or {}).get(PROVISIONED_BY) == PROVISIONER and (
        (volume.get("status") or {}).get("phase") in ("Released", "Failed")
    )


class LocalPathProvisioner:
    """Creates and reclaims the host directories behind the dev cluster's volumes."""

    def __init__(self, client: AsyncClient, raw: httpx2.AsyncClient, volumes_dir: Path) -> None:
        self._client = client
        self._informers: list[Informer] = []
        for ref, handler in (
            (STORAGE_CLASSES, self._on_storage_class),
            (CLAIMS, self._on_claim),
            (VOLUMES, self._on_volume),
        ):
            informer = Informer(raw, ref)
            informer.add_handler(new_state_only(handler))
            self._informers.append(informer)
        self._volumes_dir = volumes_dir
        self._our_classes: set[str] = {STORAGE_CLASS}

    async def run(self) -> None:
        self._volumes_dir.mkdir(parents=True, exist_ok=True)
        await asyncio.gather(*(informer.run() for informer in self._informers))

    async def _on_storage_class(self, event: str, obj: dict[str, Any]) -> None:
        # Any class naming our provisioner is ours, so users may add their own classes.
        if obj.get("provisioner") == PROVISIONER and event != "DELETED":
            self._our_classes.add(obj["metadata"]["name"])

    async def _on_claim(self, event: str, claim: dict[str, Any]) -> None:
        if event == "DELETED" or not claim_wants_volume(claim, self._our_classes):
            return
        directory = self._volumes_dir / volume_name(claim)
        directory.mkdir(parents=True, exist_ok=True)
        manifest = volume_manifest(claim, directory)
        try:
            await self._client.create(cast(PersistentVolume, PersistentVolume.from_dict(manifest)))
            log.info(
                "provisioned %s for %s/%s",
                manifest["metadata"]["name"],
                claim["metadata"]["namespace"],
                claim["metadata"]["name"],
            )
        except ApiError as err:
            if err.status.code != 409:
                raise

    async def _on_volume(self, event: str, volume: dict[str, Any]) -> None:
        if event == "DELETED" or not volume_is_released(volume):
            return
        name = volume["metadata"]["name"]
        shutil.rmtree(self._volumes_dir / name, ignore_errors=True)
        try:
            await self._client.delete(PersistentVolume, name)
            log.info("reclaimed %s", name)
        except ApiError as err:
            if err.status.code != 404:
                raise
