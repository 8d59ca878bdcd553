"""Build the dev cluster's binaries from the Go modules pinned in ``gomod/`` (F-DEV-1).

Every binary lands in a per-user cache as ``<cache>/bin/<name>-<version>`` so that
fresh clones on the same machine (which is what CI uses) reuse it; a build only
runs for what is missing. Nothing is downloaded but Go modules.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from kustos.devcluster.paths import cache_root

GOMOD_DIR = Path(__file__).parent / "gomod"

KUBERNETES_VERSION = "v1.36.3"
ETCD_VERSIONS = ("v3.5.35", "v3.6.16")
KWOK_VERSION = "v0.8.0"
# The S3-compatible server that etcd backups are written to in tests (F-ETCD-7).
VERSITYGW_VERSION = "v1.8.0"
# Renders, lints and installs the kustos chart (deploy/helm/kustos).
HELM_VERSION = "v4.3.1"
# The dev cluster's cluster DNS (kubernetes plugin serving cluster.local on the pod bridge).
COREDNS_VERSION = "v1.14.7"
# The linearizability checker of the proof suite (src/kustos/proof): porcupine and our etcd
# model around it (gomod/porcupine/main.go).
PORCUPINE_VERSION = "v1.3.1"
LINEARIZABILITY_CHECKER = "kustos-linearizability"
# promtool checks and unit-tests the chart's alert rules; prometheus scrapes the operator in the
# alert test (issue 29). The Go module of Prometheus 3.16.0 is v0.316.0.
PROMETHEUS_VERSION = "v0.316.0"
PROMETHEUS_RELEASE = "3.16.0"


def _own_source_version(module_dir: str, version: str) -> str:
    """A module of our own code is cached by its pinned dependency and a digest of its source,
    so that editing the model builds it again instead of reusing a stale binary."""
    digest = hashlib.sha256()
    for path in [*sorted((GOMOD_DIR / module_dir).glob("*.go")), GOMOD_DIR / module_dir / "go.sum"]:
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return f"{version}-{digest.hexdigest()[:12]}"


def _kubernetes_ldflags(version: str) -> list[str]:
    """The version stamps `make` would set, so `kube-apiserver --version` is truthful."""
    major, minor = version.lstrip("v").split(".")[:2]
    flags: list[str] = []
    for pkg in ("k8s.io/component-base/version", "k8s.io/client-go/pkg/version"):
        flags += [
            f"-X {pkg}.gitVersion={version}",
            f"-X {pkg}.gitMajor={major}",
            f"-X {pkg}.gitMinor={minor}",
            f"-X {pkg}.gitTreeState=clean",
        ]
    return flags


@dataclass(frozen=True)
class Binary:
    """One command built from one Go package of one wrapper module."""

    name: str
    version: str
    module_dir: str
    package: str
    ldflags: tuple[str, ...] = field(default=())
    tags: tuple[str, ...] = field(default=())
    """Go build tags."""

    @property
    def file_name(self) -> str:
        return f"{self.name}-{self.version}"


def _etcd_binaries(version: str) -> list[Binary]:
    module_dir = "etcd-" + ".".join(version.lstrip("v").split(".")[:2])
    return [
        Binary("etcd", version, module_dir, "go.etcd.io/etcd/server/v3"),
        Binary("etcdctl", version, module_dir, "go.etcd.io/etcd/etcdctl/v3"),
        Binary("etcdutl", version, module_dir, "go.etcd.io/etcd/etcdutl/v3"),
    ]


def all_binaries() -> list[Binary]:
    """Every binary the dev cluster and the tests need, in build order (cheap first)."""
    k8s_flags = tuple(_kubernetes_ldflags(KUBERNETES_VERSION))
    binaries = [
        Binary("kwok", KWOK_VERSION, "kwok", "sigs.k8s.io/kwok/cmd/kwok"),
        Binary("kwokctl", KWOK_VERSION, "kwok", "sigs.k8s.io/kwok/cmd/kwokctl"),
    ]
    for version in ETCD_VERSIONS:
        binaries += _etcd_binaries(version)
    binaries.append(
        Binary(
            "versitygw",
            VERSITYGW_VERSION,
            "versitygw",
            "github.com/versity/versitygw/cmd/versitygw",
            # What its Makefile stamps, so that `versitygw --version` is truthful.
            (f"-X main.Version={VERSITYGW_VERSION}",),
        )
    )
    binaries.append(
        Binary(
            "helm",
            HELM_VERSION,
            "helm",
            "helm.sh/helm/v4/cmd/helm",
            # What its Makefile stamps, so that `helm version` is truthful.
            (f"-X helm.sh/helm/v4/internal/version.version={HELM_VERSION}",),
        )
    )
    binaries.append(Binary("coredns", COREDNS_VERSION, "coredns", "github.com/coredns/coredns"))
    binaries.append(linearizability_checker())
    for command in ("promtool", "prometheus"):
        binaries.append(
            Binary(
                command,
                PROMETHEUS_VERSION,
                "prometheus",
                f"github.com/prometheus/prometheus/cmd/{command}",
                # What its .promu.yml stamps, so that `--version` is truthful.
                (f"-X github.com/prometheus/common/version.Version={PROMETHEUS_RELEASE}",),
                # Its plugins/ build tags: every service discovery but file and http left out
                # (static targets are all the tests use), a much smaller build.
                ("remove_all_sd",),
            )
        )
    for command in ("kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubectl"):
        binaries.append(
            Binary(
                command,
                KUBERNETES_VERSION,
                "kubernetes",
                f"k8s.io/kubernetes/cmd/{command}",
                k8s_flags,
            )
        )
    return binaries


def linearizability_checker() -> Binary:
    """The proof suite's checker: porcupine with kustos's model of etcd's KV (our own main package)."""
    version = _own_source_version("porcupine", PORCUPINE_VERSION)
    return Binary(LINEARIZABILITY_CHECKER, version, "porcupine", "kustos.dev/devcluster/porcupine")


def bin_dir(root: Path | None = None) -> Path:
    return (root or cache_root()) / "bin"


def binary_path(name: str, version: str | None = None, root: Path | None = None) -> Path:
    """Where a built binary lives; the default version is the dev cluster's own."""
    if version is None:
        version = _default_version(name)
    return bin_dir(root) / f"{name}-{version}"


def _default_version(name: str) -> str:
    if name in ("kwok", "kwokctl"):
        return KWOK_VERSION
    if name in ("etcd", "etcdctl", "etcdutl"):
        return ETCD_VERSIONS[-1]
    if name == "versitygw":
        return VERSITYGW_VERSION
    if name == "helm":
        return HELM_VERSION
    if name == "coredns":
        return COREDNS_VERSION
    if name == LINEARIZABILITY_CHECKER:
        return linearizability_checker().version
    if name in ("prometheus", "promtool"):
        return PROMETHEUS_VERSION
    return KUBERNETES_VERSION


def ensure_built(binary: Binary, root: Path | None = None, log: Callable[[str], None] = print) -> Path:
    """The binary's path, built first when it is missing (what `kustos dev build` does for it)."""
    path = bin_dir(root) / binary.file_name
    if not path.is_file():
        build([binary], root, log)
    return path


def missing_binaries(root: Path | None = None) -> list[Binary]:
    return [b for b in all_binaries() if not (bin_dir(root) / b.file_name).is_file()]


class BuildError(RuntimeError):
    """A Go build failed; the message carries the tail of its output."""


def _go_environment() -> dict[str, str]:
    env = dict(os.environ)
    # The installed toolchain is the one we have: never fetch another.
    env["GOTOOLCHAIN"] = "local"
    env["CGO_ENABLED"] = "0"
    return env


def build(
    binaries: Iterable[Binary] | None = None,
    root: Path | None = None,
    log: Callable[[str], None] = print,
) -> list[Binary]:
    """Build what is missing; return what was built. Safe to run again at any time."""
    if shutil.which("go") is None:
        raise BuildError("the Go toolchain is not on PATH; install Go 1.26 or newer")
    todo = list(binaries) if binaries is not None else missing_binaries(root)
    target = bin_dir(root)
    target.mkdir(parents=True, exist_ok=True)
    for binary in todo:
        started = time.monotonic()
        log(f"building {binary.file_name} from {binary.package} ...")
        # Build into a temporary name and rename, so a half-written file never counts.
        with tempfile.TemporaryDirectory(dir=target) as scratch:
            out = Path(scratch) / binary.name
            ldflags = " ".join(("-s", "-w", *binary.ldflags))
            command = ["go", "build", "-trimpath", "-ldflags", ldflags, "-o", str(out)]
            if binary.tags:
                command += ["-tags", ",".join(binary.tags)]
            result = subprocess.run(
                [*command, binary.package],
                cwd=GOMOD_DIR / binary.module_dir,
                env=_go_environment(),
                capture_output=True,
                text=True,
                check=False,
            )
            if result.returncode != 0:
                tail = "\n".join((result.stdout + result.stderr).splitlines()[-30:])
                raise BuildError(f"go build {binary.package} failed:\n{tail}")
            out.replace(target / binary.file_name)
        log(f"built {binary.file_name} in {time.monotonic() - started:.0f}s")
    return todo
