"""kustos's own image, built here from ``deploy/Dockerfile`` without a registry (issue 20).

buildah (Debian) builds the Dockerfile as users build it with docker; its two base images
are made locally under the names the Dockerfile uses, since nothing is pulled:

- ``python:3.11-slim-bookworm``: Debian bookworm with Python 3.11, venv and pip, made by
  mmdebstrap (Debian's python3 is 3.11 too, at /usr/bin; Debian's pip needs
  ``PIP_BREAK_SYSTEM_PACKAGES`` to install into the system as the official image lets it);
- ``golang:1.26-bookworm``: that base plus the machine's own Go toolchain (Debian's Go
  is 1.19, older than the modules need).

Both set ``SSL_CERT_FILE`` to Debian's CA bundle (uv reads no system store otherwise);
the build bind-mounts the machine's bundle there for its RUN steps only, so a machine
behind a TLS-inspecting proxy builds too and the image carries Debian's bundle.

The image is exported as a docker archive (its tag inside) for ``ctr images import``
on every real node. The archive's name carries a key of everything the Dockerfile reads
(``content_key``): an unchanged tree is never built twice, a changed one always is.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from kustos.devcluster.binaries import BuildError, ensure_debian_tools
from kustos.devcluster.paths import cache_root
from kustos.images import agent_image

PYTHON_BASE = "docker.io/library/python:3.11-slim-bookworm"
GO_BASE = "docker.io/library/golang:1.26-bookworm"
DEBIAN_SUITE = "bookworm"
_CA_BUNDLE = "/etc/ssl/certs/ca-certificates.crt"
_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
_PYTHON_PACKAGES = ("python3", "python3-venv", "python3-pip", "ca-certificates")


def repository_root() -> Path:
    return Path(__file__).resolve().parents[3]


# What deploy/Dockerfile copies from the build context (its COPY lines), besides itself.
CONTEXT_FILES = ("pyproject.toml", "uv.lock", "README.md")
CONTEXT_DIRS = ("src",)
# Archives of other trees kept beside the current one (worktrees share the cache).
KEEP_ARCHIVES = 3


def content_key(root: Path | None = None) -> str:
    """A digest of what goes into the image: the Dockerfile, the files and directories it
    copies (bytecode caches left out: Python writes them, the image compiles its own) and
    the Go toolchain its Go base carries."""
    base = root or repository_root()
    digest = hashlib.sha256()
    paths = [base / "deploy" / "Dockerfile", *(base / name for name in CONTEXT_FILES)]
    for directory in CONTEXT_DIRS:
        paths += sorted(
            p for p in (base / directory).rglob("*")
            if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc"
        )  # fmt: skip
    for path in paths:
        digest.update(path.relative_to(base).as_posix().encode() + b"\0")
        digest.update(hashlib.sha256(path.read_bytes()).digest())
    digest.update(_go_version().encode())
    return digest.hexdigest()[:12]


def _go_version() -> str:
    result = subprocess.run(["go", "env", "GOVERSION"], capture_output=True, text=True, check=False)
    return result.stdout.strip() if result.returncode == 0 else "no-go"


def _archive_stem(name: str) -> str:
    return name.replace("/", "_").replace(":", "+")


def archive_path(image: str | None = None, root: Path | None = None, key: str | None = None) -> Path:
    """``<cache>/images/<image made safe>-<content key>.docker.tar`` of this tree."""
    name = image or agent_image()
    return (root or cache_root()) / "images" / f"{_archive_stem(name)}-{key or content_key()}.docker.tar"


def current_archive(log: Callable[[str], None] = print) -> Path:
    """This tree's image archive, built first if it is not there yet."""
    path = archive_path()
    if path.is_file():
        path.touch()  # the most recently used ones are kept
        return path
    return build(log=log)


def _prune_archives(kept: Path) -> None:
    """Keep the newest ``KEEP_ARCHIVES`` archives of this image (374 MB each)."""
    stem = kept.name.rsplit("-", 1)[0]
    others = sorted(
        (p for p in kept.parent.glob(f"{stem}*.docker.tar") if p != kept),
        key=lambda p: p.stat().st_mtime, reverse=True,
    )  # fmt: skip
    for stale in others[KEEP_ARCHIVES - 1 :]:
        stale.unlink(missing_ok=True)


def _run(argv: list[str]) -> str:
    result = subprocess.run(argv, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        tail = "\n".join((result.stdout + result.stderr).splitlines()[-25:])
        raise BuildError(f"{' '.join(argv[:3])} ... failed:\n{tail}")
    return result.stdout.strip()


def has_image(name: str) -> bool:
    result = subprocess.run(["buildah", "images", "-q", name], capture_output=True, text=True, check=False)
    return result.returncode == 0 and bool(result.stdout.strip())


def _commit_base(
    source: str, target: str, tarball: Path | None, copy_dir: Path | None, env: list[str]
) -> None:
    container = _run(["buildah", "from", source])
    try:
        if tarball is not None:
            _run(["buildah", "add", container, str(tarball), "/"])
        if copy_dir is not None:
            _run(["buildah", "copy", container, str(copy_dir), str(copy_dir)])
        config = ["buildah", "config"]
        for item in env:
            config += ["--env", item]
        _run([*config, container])
        _run(["buildah", "commit", "-q", container, target])
    finally:
        subprocess.run(["buildah", "rm", container], capture_output=True, check=False)


def make_base_images(log: Callable[[str], None] = print) -> None:
    """The Dockerfile's two bases, made here if buildah's store lacks them."""
    common = [f"SSL_CERT_FILE={_CA_BUNDLE}", "LANG=C.UTF-8"]
    if not has_image(PYTHON_BASE):
        log(f"making {PYTHON_BASE} with mmdebstrap ({DEBIAN_SUITE}: {', '.join(_PYTHON_PACKAGES)}) ...")
        with tempfile.TemporaryDirectory() as scratch:
            tarball = Path(scratch) / "rootfs.tar"
            _run(["mmdebstrap", "--variant=minbase", f"--include={','.join(_PYTHON_PACKAGES)}",
                  "--aptopt=APT::Install-Recommends \"false\"", DEBIAN_SUITE, str(tarball)])  # fmt: skip
            _commit_base("scratch", PYTHON_BASE, tarball, None,
                         [f"PATH={_PATH}", "PIP_BREAK_SYSTEM_PACKAGES=1", *common])  # fmt: skip
    if not has_image(GO_BASE):
        goroot = Path(_run(["go", "env", "GOROOT"]))
        log(f"making {GO_BASE} from {PYTHON_BASE} and the Go toolchain in {goroot} ...")
        env = [f"PATH={goroot}/bin:{_PATH}", "GOPATH=/go", *common]
        _commit_base(PYTHON_BASE, GO_BASE, None, goroot, env)


def build(image: str | None = None, log: Callable[[str], None] = print) -> Path:
    """Build ``deploy/Dockerfile`` into ``image`` (kustos's own tag by default) and export it
    as a docker archive; return the archive's path."""
    ensure_debian_tools(("mmdebstrap", "buildah"), log=log)
    if shutil.which("go") is None:
        raise BuildError("the Go toolchain is not on PATH; the image's Go base copies it")
    name = image or agent_image()
    key = content_key()
    make_base_images(log)
    started = time.monotonic()
    log(f"building {name} from deploy/Dockerfile with buildah (tree {key}) ...")
    with tempfile.TemporaryDirectory() as scratch:
        # Pushed by its id, not its tag: another checkout building at the same moment moves the tag.
        iidfile = Path(scratch) / "iid"
        _run(["buildah", "build", "--isolation", "chroot", "--network", "host", "--pull-never", "--layers",
              "-v", f"{_CA_BUNDLE}:{_CA_BUNDLE}:ro", "-f", str(repository_root() / "deploy" / "Dockerfile"),
              "--iidfile", str(iidfile), "-t", name, str(repository_root())])  # fmt: skip
        image_id = iidfile.read_text().strip()
        target = archive_path(name, key=key)
        target.parent.mkdir(parents=True, exist_ok=True)
        partial = target.with_name(target.name + ".partial")
        partial.unlink(missing_ok=True)
        _run(["buildah", "push", "-q", image_id, f"docker-archive:{partial}:{name}"])
        partial.rename(target)  # whole or absent: a reader never imports half an archive
    _prune_archives(target)
    log(f"built {name} in {time.monotonic() - started:.0f}s: {target}")
    return target
