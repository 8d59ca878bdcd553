"""Container images without a registry or a builder: an OCI image layout in one tar file.

The dev cluster's real nodes pull nothing; their containerd imports images with
``ctr -n k8s.io images import``, and a pod that names one with ``imagePullPolicy:
IfNotPresent`` (the default for a tagged image) runs it. The images we need this way
are a few static programs on an empty base (etcd, the sandboxes' pause), so one
uncompressed layer written here is all it takes; the kustos image itself comes from
``deploy/Dockerfile``.

Archives are reproducible: fixed timestamps and owners, sorted entries, so the same
programs give the same digests and a node that has an image skips the import.
"""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# A name containerd keeps as is; ``ref.name`` alone would need ``--base-name`` on import.
CONTAINERD_NAME_ANNOTATION = "io.containerd.image.name"
OCI_REF_ANNOTATION = "org.opencontainers.image.ref.name"
_LAYER_MEDIA_TYPE = "application/vnd.oci.image.layer.v1.tar"
_CONFIG_MEDIA_TYPE = "application/vnd.oci.image.config.v1+json"
_MANIFEST_MEDIA_TYPE = "application/vnd.oci.image.manifest.v1+json"
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


@dataclass(frozen=True)
class ImageFile:
    """A file of the image: where it goes, what it holds (a local file), its mode."""

    path: str
    source: Path
    mode: int = 0o755


@dataclass(frozen=True)
class ImageSpec:
    """What an image is: its full name, its files and how it runs."""

    name: str
    files: Sequence[ImageFile]
    entrypoint: Sequence[str] = ()
    cmd: Sequence[str] = ()
    user: str = ""
    env: Mapping[str, str] = field(default_factory=lambda: {"PATH": DEFAULT_PATH})
    # Directories the image has (besides the files' parents), e.g. a writable /tmp.
    directories: Sequence[str] = ("tmp",)

    def __post_init__(self) -> None:
        if ":" not in self.name.rsplit("/", 1)[-1]:
            raise ValueError(f"image name {self.name!r} has no tag")
        for item in self.files:
            if not item.path.startswith("/"):
                raise ValueError(f"image file path {item.path!r} is not absolute")


def _tar_info(name: str, *, directory: bool, size: int = 0, mode: int = 0o755) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = tarfile.DIRTYPE if directory else tarfile.REGTYPE
    info.mode = 0o1777 if directory and name == "tmp" else mode
    info.size = size
    info.mtime = 0
    info.uid = info.gid = 0
    info.uname = info.gname = "root"
    return info


def layer_bytes(spec: ImageSpec) -> bytes:
    """The single layer: every parent directory once, then the files, in sorted order."""
    directories: set[str] = set(spec.directories)
    for item in spec.files:
        parts = item.path.strip("/").split("/")[:-1]
        directories.update("/".join(parts[: i + 1]) for i in range(len(parts)))
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for directory in sorted(directories):
            tar.addfile(_tar_info(directory, directory=True))
        for item in sorted(spec.files, key=lambda f: f.path):
            data = item.source.read_bytes()
            tar.addfile(
                _tar_info(item.path.strip("/"), directory=False, size=len(data), mode=item.mode),
                io.BytesIO(data),
            )
    return buffer.getvalue()


def _digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def _blob(tar: tarfile.TarFile, data: bytes) -> dict[str, Any]:
    digest = _digest(data)
    name = f"blobs/sha256/{digest.split(':')[1]}"
    tar.addfile(_tar_info(name, directory=False, size=len(data), mode=0o644), io.BytesIO(data))
    return {"digest": digest, "size": len(data)}


def write_archive(spec: ImageSpec, target: Path) -> str:
    """Write the OCI archive of ``spec`` to ``target``; return the manifest's digest."""
    layer = layer_bytes(spec)
    config: dict[str, Any] = {
        "architecture": "amd64",
        "os": "linux",
        "config": {"Env": [f"{k}={v}" for k, v in spec.env.items()]},
        "rootfs": {"type": "layers", "diff_ids": [_digest(layer)]},
        "history": [{"created_by": "kustos.devcluster.ociarchive"}],
    }
    if spec.entrypoint:
        config["config"]["Entrypoint"] = list(spec.entrypoint)
    if spec.cmd:
        config["config"]["Cmd"] = list(spec.cmd)
    if spec.user:
        config["config"]["User"] = spec.user
    partial = target.with_name(target.name + ".partial")
    target.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(partial, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for directory in ("blobs", "blobs/sha256"):
            tar.addfile(_tar_info(directory, directory=True))
        layer_ref = {"mediaType": _LAYER_MEDIA_TYPE, **_blob(tar, layer)}
        config_ref = {"mediaType": _CONFIG_MEDIA_TYPE, **_blob(tar, _json(config))}
        manifest = {
            "schemaVersion": 2,
            "mediaType": _MANIFEST_MEDIA_TYPE,
            "config": config_ref,
            "layers": [layer_ref],
        }
        manifest_ref = {"mediaType": _MANIFEST_MEDIA_TYPE, **_blob(tar, _json(manifest))}
        tag = spec.name.rsplit(":", 1)[1]
        index = {
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.index.v1+json",
            "manifests": [
                {
                    **manifest_ref,
                    "platform": {"architecture": "amd64", "os": "linux"},
                    "annotations": {CONTAINERD_NAME_ANNOTATION: spec.name, OCI_REF_ANNOTATION: tag},
                }
            ],
        }
        layout = _json({"imageLayoutVersion": "1.0.0"})
        for name, data in (("oci-layout", layout), ("index.json", _json(index))):
            tar.addfile(_tar_info(name, directory=False, size=len(data), mode=0o644), io.BytesIO(data))
    partial.replace(target)
    return str(manifest_ref["digest"])


def _json(value: object) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":")).encode()
