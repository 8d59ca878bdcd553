"""The images every real node has before any pod asks: etcd's and the sandboxes' pause.

Both are static programs on an empty base, written as OCI archives
(``ociarchive``) from the binaries ``kustos dev build`` made, under the names a
user's cluster would pull: the etcd image of the default ``spec.repository`` at each
version the dev cluster builds, so an EtcdCluster with defaults runs unchanged.
Archives are cached beside the binaries, keyed by what they hold.
"""

from __future__ import annotations

from pathlib import Path

from kustos.api.etcd import EtcdClusterSpec
from kustos.devcluster import binaries
from kustos.devcluster.ociarchive import ImageFile, ImageSpec, write_archive
from kustos.devcluster.paths import cache_root
from kustos.etcd.pods import image_in

PAUSE_IMAGE = f"kustos.dev/pause:{binaries.PAUSE_VERSION}"
# What the upstream etcd images run as when a pod sets no user: a non-root id (distroless's).
NONROOT = "65532"


def default_etcd_repository() -> str:
    return str(EtcdClusterSpec.model_fields["repository"].default)


def etcd_image(version: str) -> str:
    """``registry.k8s.io/etcd:3.6.16-0`` for ``v3.6.16``: the default repository's scheme."""
    return image_in(default_etcd_repository(), version.lstrip("v"))


def etcd_image_spec(version: str) -> ImageSpec:
    files = [
        ImageFile(f"/usr/local/bin/{name}", binaries.binary_path(name, version))
        for name in ("etcd", "etcdctl", "etcdutl")
    ]
    return ImageSpec(etcd_image(version), files, entrypoint=("/usr/local/bin/etcd",), user=NONROOT)


def pause_image_spec() -> ImageSpec:
    return ImageSpec(PAUSE_IMAGE, [ImageFile("/pause", binaries.binary_path("pause"))],
                     entrypoint=("/pause",), user=NONROOT, directories=())  # fmt: skip


def images_dir(root: Path | None = None) -> Path:
    return (root or cache_root()) / "images"


def archive_path(spec: ImageSpec, root: Path | None = None) -> Path:
    """``<cache>/images/<name with / and : made safe>.tar``; the tag carries the version."""
    return images_dir(root) / (spec.name.replace("/", "_").replace(":", "+") + ".tar")


def node_image_archives(root: Path | None = None) -> list[Path]:
    """The archives of every preloaded image, written if missing."""
    specs = [pause_image_spec(), *(etcd_image_spec(v) for v in binaries.ETCD_VERSIONS)]
    archives = []
    for spec in specs:
        path = archive_path(spec, root)
        if not path.is_file():
            write_archive(spec, path)
        archives.append(path)
    return archives
