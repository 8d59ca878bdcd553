"""Default CSI images by Kubernetes version (pure): the table the operator picks from at runtime.

The operator asks the API server for its version (GET /version) and fills every empty
``spec.images.csi*`` field from the newest row whose minimum version it meets. A sidecar a
version does not use (the resizer before 1.16, the cluster driver registrar from 1.14 on)
is the empty string there, and the manifests leave it out.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from kustos.api.storage import StorageImages

__all__ = ["TABLE", "CSIImages", "KubeVersion", "csi_images", "parse_kube_version", "resolve_images"]

KubeVersion = tuple[int, int]


@dataclass(frozen=True)
class CSIImages:
    node_driver_registrar: str
    cluster_driver_registrar: str
    external_provisioner: str
    external_attacher: str
    external_resizer: str
    liveness_probe: str


_OLD = "quay.io/k8scsi"
_NEW = "registry.k8s.io/sig-storage"

TABLE: tuple[tuple[KubeVersion, CSIImages], ...] = (
    ((1, 0), CSIImages(
        f"{_OLD}/csi-node-driver-registrar:v1.0.1", f"{_OLD}/csi-cluster-driver-registrar:v1.0.1",
        "storageos/csi-provisioner:v1.0.1", f"{_OLD}/csi-attacher:v1.0.1", "",
        f"{_OLD}/livenessprobe:v1.0.1",
    )),
    ((1, 14), CSIImages(
        f"{_OLD}/csi-node-driver-registrar:v1.1.0", "", "storageos/csi-provisioner:v1.4.0",
        f"{_OLD}/csi-attacher:v1.2.1", "", f"{_OLD}/livenessprobe:v1.1.0",
    )),
    ((1, 16), CSIImages(
        f"{_OLD}/csi-node-driver-registrar:v1.2.0", "", "storageos/csi-provisioner:v1.6.0",
        f"{_OLD}/csi-attacher:v2.2.0", f"{_OLD}/csi-resizer:v0.5.0", f"{_OLD}/livenessprobe:v2.0.0",
    )),
    ((1, 20), CSIImages(
        f"{_NEW}/csi-node-driver-registrar:v2.5.1", "", f"{_NEW}/csi-provisioner:v3.1.0",
        f"{_NEW}/csi-attacher:v3.4.0", f"{_NEW}/csi-resizer:v1.4.0", f"{_NEW}/livenessprobe:v2.6.0",
    )),
    ((1, 28), CSIImages(
        f"{_NEW}/csi-node-driver-registrar:v2.10.1", "", f"{_NEW}/csi-provisioner:v4.0.1",
        f"{_NEW}/csi-attacher:v4.5.1", f"{_NEW}/csi-resizer:v1.10.1", f"{_NEW}/livenessprobe:v2.12.0",
    )),
)  # fmt: skip

_MINOR = re.compile(r"^\D*(\d+)")


def parse_kube_version(info: dict[str, object]) -> KubeVersion:
    """(major, minor) from a /version answer; minor may read "29+" on some distributions."""
    major = _MINOR.match(str(info.get("major", "")))
    minor = _MINOR.match(str(info.get("minor", "")))
    if major and minor:
        return int(major[1]), int(minor[1])
    found = re.match(r"^v?(\d+)\.(\d+)", str(info.get("gitVersion", "")))
    if not found:
        raise ValueError(f"cannot read a Kubernetes version from {info}")
    return int(found[1]), int(found[2])


def csi_images(version: KubeVersion) -> CSIImages:
    """The newest row of TABLE that ``version`` meets."""
    chosen = TABLE[0][1]
    for minimum, images in TABLE:
        if version >= minimum:
            chosen = images
    return chosen


def resolve_images(images: StorageImages, version: KubeVersion) -> StorageImages:
    """``images`` with every empty CSI field taken from the table; set fields are kept."""
    defaults = csi_images(version)
    return images.model_copy(
        update={
            "csi_node_driver_registrar_container": images.csi_node_driver_registrar_container
            or defaults.node_driver_registrar,
            "csi_cluster_driver_registrar_container": images.csi_cluster_driver_registrar_container
            or defaults.cluster_driver_registrar,
            "csi_external_provisioner_container": images.csi_external_provisioner_container
            or defaults.external_provisioner,
            "csi_external_attacher_container": images.csi_external_attacher_container
            or defaults.external_attacher,
            "csi_external_resizer_container": images.csi_external_resizer_container
            or defaults.external_resizer,
            "csi_liveness_probe_container": images.csi_liveness_probe_container or defaults.liveness_probe,
        }
    )
