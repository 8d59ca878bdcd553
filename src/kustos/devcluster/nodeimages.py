"""The images every real node has before any pod asks: etcd's and the sandboxes' pause.

Both are static programs on an empty base, written as OCI archives
(``ociarchive``) from the binaries ``kustos dev build`` made, under the names a
user's cluster would pull: the etcd image of the default ``spec.repository`` at each
version the dev cluster builds, so an EtcdCluster with defaults runs unchanged.
Archives are cached beside the binaries, keyed by what they hold.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from kustos.api.etcd import EtcdClusterSpec
from kustos.devcluster import binaries
from kustos.devcluster.ociarchive import ImageFile, ImageSpec, write_archive
from kustos.devcluster.paths import cache_root
from kustos.images import NONROOT_UID
from kustos.images import etcd_image as image_of

PAUSE_IMAGE = f"kustos.dev/pause:{binaries.PAUSE_VERSION}"
# MinIO's own image name and the release its module version is (not preloaded: imported by the
# MinIO move's test only, binaries.minio_binary).
MINIO_IMAGE = "quay.io/minio/minio:RELEASE.2026-02-12T20-18-48Z"
# The pause program runs as the non-root id kustos runs its pods as, and tests' hardened pods too.
NONROOT = str(NONROOT_UID)


def default_etcd_repository() -> str:
    return str(EtcdClusterSpec.model_fields["repository"].default)


def etcd_image(version: str) -> str:
    """``gcr.io/etcd-development/etcd:v3.7.3`` for ``v3.7.3``: the default repository's scheme."""
    return image_of(default_etcd_repository(), version.lstrip("v"))


def etcd_image_spec(version: str) -> ImageSpec:
    files = [
        ImageFile(f"/usr/local/bin/{name}", binaries.binary_path(name, version))
        for name in ("etcd", "etcdctl", "etcdutl")
    ]
    # As etcd's own image (distroless static): no USER, so root unless the pod says
    # otherwise; /var/etcd and /var/lib/etcd exist; etcd is the command, not an entrypoint.
    return ImageSpec(etcd_image(version), files, cmd=("/usr/local/bin/etcd",),
                     directories=("tmp", "var/etcd", "var/lib/etcd"))  # fmt: skip


def pause_image_spec() -> ImageSpec:
    return ImageSpec(PAUSE_IMAGE, [ImageFile("/pause", binaries.binary_path("pause"))],
                     entrypoint=("/pause",), user=NONROOT, directories=())  # fmt: skip


def minio_image_spec() -> ImageSpec:
    """As MinIO's image: the server at /usr/bin/minio, run as root, ``minio`` on PATH."""
    return ImageSpec(MINIO_IMAGE, [ImageFile("/usr/bin/minio", binaries.binary_path("minio"))],
                     entrypoint=("minio",), directories=("tmp", "root"))  # fmt: skip


def images_dir(root: Path | None = None) -> Path:
    return (root or cache_root()) / "images"


def archive_path(spec: ImageSpec, root: Path | None = None) -> Path:
    """``<cache>/images/<name made safe>-<key>.tar``: the key changes with the spec (its
    files' sizes and times, its configuration), so a changed image is written anew."""
    parts = [repr((f.path, f.mode, f.source.stat().st_size, f.source.stat().st_mtime_ns)) for f in spec.files]
    parts += [repr((spec.entrypoint, spec.cmd, spec.user, sorted(spec.env.items()), spec.directories))]
    key = hashlib.sha256("\n".join(parts).encode()).hexdigest()[:12]
    return images_dir(root) / (spec.name.replace("/", "_").replace(":", "+") + f"-{key}.tar")


def node_image_archives(root: Path | None = None) -> list[Path]:
    """The archives of every preloaded image, written if missing."""
    specs = [pause_image_spec(), *(etcd_image_spec(v) for v in binaries.ETCD_VERSIONS)]
    return [image_archive(spec, root) for spec in specs]


def image_archive(spec: ImageSpec, root: Path | None = None) -> Path:
    """The archive of one image, written if missing."""
    path = archive_path(spec, root)
    if not path.is_file():
        write_archive(spec, path)
    return path
