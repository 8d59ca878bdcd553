"""Build the dev cluster's binaries from the Go modules pinned in ``gomod/`` (F-DEV-1).

Every binary lands in a per-user cache as ``<cache>/bin/<name>-<version>`` so that
fresh clones on the same machine (which is what CI uses) reuse it; a build only
runs for what is missing. Nothing is downloaded but Go modules and, for what only
Debian packages well (runc, which needs cgo and libseccomp), Debian packages through apt.
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
from kustos.images import PROVEN_ETCD_VERSIONS

GOMOD_DIR = Path(__file__).parent / "gomod"

KUBERNETES_VERSION = "v1.36.3"
# The versions the suite proves (kustos.images), each built from its own module gomod/etcd-<minor>.
ETCD_VERSIONS = tuple(f"v{v}" for v in PROVEN_ETCD_VERSIONS)
KWOK_VERSION = "v0.8.0"
# The S3-compatible server that etcd backups are written to in tests (F-ETCD-7).
VERSITYGW_VERSION = "v1.8.0"
# MinIO (its last module version; MinIO tags no semver releases): the server whose move to a
# distributed StatefulSet the MaintenancePolicy makes (F-MAINT-12). Built on demand only, by
# the test that runs it on real nodes: a long build that no other test needs.
MINIO_VERSION = "v0.0.0-20260212201848-7aac2a2c5b7c"
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


# The real nodes' runtime (issue 20): containerd 2 (Debian's 1.6 is too old for kubelet 1.36),
# the CNI plugins that put pods on the cluster's bridge, crictl, and the sandboxes' pause.
CONTAINERD_VERSION = "v2.4.2"
CNI_PLUGINS_VERSION = "v1.10.0"
CRI_TOOLS_VERSION = "v1.37.0"
# Our own program (gomod/pause); the version changes when its source does.
PAUSE_VERSION = "v1"
CNI_PLUGINS = ("bridge", "host-local", "loopback", "portmap")
_CNI_PACKAGES = {
    "bridge": "plugins/main/bridge",
    "host-local": "plugins/ipam/host-local",
    "loopback": "plugins/main/loopback",
    "portmap": "plugins/meta/portmap",
}


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


def all_binaries(with_test_servers: bool = False) -> list[Binary]:
    """Every binary the dev cluster and the tests need, in build order (cheap first);
    ``with_test_servers``: MinIO too, a long build that only the suite runs (`make test`)."""
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
    binaries += _node_runtime_binaries()
    for command in (
        "kube-apiserver",
        "kube-controller-manager",
        "kube-scheduler",
        "kubectl",
        "kubelet",
        "kube-proxy",
    ):
        binaries.append(
            Binary(
                command,
                KUBERNETES_VERSION,
                "kubernetes",
                f"k8s.io/kubernetes/cmd/{command}",
                k8s_flags,
            )
        )
    if with_test_servers:
        binaries.append(minio_binary())
    return binaries


def minio_binary() -> Binary:
    """MinIO's server, in ``all_binaries`` only with the test servers: only the MinIO move's
    test runs it, and its build is the longest after Kubernetes's."""
    return Binary("minio", MINIO_VERSION, "minio", "github.com/minio/minio")


def linearizability_checker() -> Binary:
    """The proof suite's checker: porcupine with kustos's model of etcd's KV (our own main package)."""
    version = _own_source_version("porcupine", PORCUPINE_VERSION)
    return Binary(LINEARIZABILITY_CHECKER, version, "porcupine", "kustos.dev/devcluster/porcupine")


def _node_runtime_binaries() -> list[Binary]:
    """containerd, its shim and ctr, the CNI plugins, crictl and pause: a real node's runtime."""
    containerd = "github.com/containerd/containerd/v2"
    # Pure Go, without the snapshotters that need cgo or host libraries (what upstream's
    # static builds leave out too); overlayfs and native remain.
    tags = ("no_btrfs", "no_devmapper", "no_zfs")
    stamp = (f"-X {containerd}/version.Version={CONTAINERD_VERSION}",)
    binaries = [
        Binary(command, CONTAINERD_VERSION, "containerd", f"{containerd}/cmd/{command}", stamp, tags)
        for command in ("containerd", "containerd-shim-runc-v2", "ctr")
    ]
    plugins = "github.com/containernetworking/plugins"
    binaries += [
        Binary(
            f"cni-{name}",
            CNI_PLUGINS_VERSION,
            "cni-plugins",
            f"{plugins}/{_CNI_PACKAGES[name]}",
            (f"-X {plugins}/pkg/utils/buildversion.BuildVersion={CNI_PLUGINS_VERSION}",),
        )
        for name in CNI_PLUGINS
    ]
    binaries.append(
        Binary(
            "crictl",
            CRI_TOOLS_VERSION,
            "cri-tools",
            "sigs.k8s.io/cri-tools/cmd/crictl",
            (f"-X sigs.k8s.io/cri-tools/pkg/version.Version={CRI_TOOLS_VERSION}",),
        )
    )
    binaries.append(Binary("pause", PAUSE_VERSION, "pause", "kustos.dev/devcluster/pause"))
    return binaries


@dataclass(frozen=True)
class DebianPackage:
    """A program Debian builds better than we would (runc needs cgo and libseccomp).

    ``apt-get`` installs it on demand; its program is then copied into the cache as
    ``<name>-<upstream_version>``, like the Go binaries, so a node never depends on what
    the host's PATH holds at run time.
    """

    name: str
    upstream_version: str
    program: str

    @property
    def file_name(self) -> str:
        return f"{self.name}-{self.upstream_version}"


DEBIAN_PACKAGES = {
    "runc": DebianPackage("runc", "1.1.5", "/usr/sbin/runc"),
    # The internal load balancer's tests run the real HAProxy in front of the API server.
    "haproxy": DebianPackage("haproxy", "2.6.12", "/usr/sbin/haproxy"),
}


def missing_debian_packages(root: Path | None = None) -> list[DebianPackage]:
    return [p for p in DEBIAN_PACKAGES.values() if not (bin_dir(root) / p.file_name).is_file()]


def _run_apt(argv: list[str]) -> None:
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    result = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        tail = "\n".join((result.stdout + result.stderr).splitlines()[-15:])
        raise BuildError(f"{' '.join(argv)} failed:\n{tail}")


def installed_debian_version(package: str) -> str | None:
    """The version dpkg records for an installed package, or None."""
    result = subprocess.run(
        ["dpkg-query", "-W", "-f", "${db:Status-Abbrev} ${Version}", package],
        capture_output=True,
        text=True,
        check=False,
    )
    status, _, version = result.stdout.partition(" ")
    return version.strip() if result.returncode == 0 and status.startswith("ii") else None


def debian_upstream_version(version: str) -> str:
    """``1:1.1.5+ds1-1+deb12u1`` -> ``1.1.5``: no epoch, Debian revision or repack suffix."""
    version = version.split(":", 1)[-1].rsplit("-", 1)[0]
    return version.split("+", 1)[0].split("~", 1)[0]


def install_debian_packages(
    packages: Iterable[DebianPackage], root: Path | None = None, log: Callable[[str], None] = print
) -> list[DebianPackage]:
    """Install with apt (index refreshed first) and cache the programs; return what was cached."""
    todo = list(packages)
    if not todo:
        return []
    names = [p.name for p in todo]
    if shutil.which("apt-get") is None or shutil.which("dpkg-query") is None:
        raise BuildError(
            f"apt-get is not available to install {', '.join(names)}: install "
            + ", ".join(f"{p.name} {p.upstream_version}" for p in todo)
            + " from your distribution and copy each program into "
            + ", ".join(str(bin_dir(root) / p.file_name) for p in todo)
        )
    log(f"installing {', '.join(names)} from Debian ...")
    _run_apt(["apt-get", "update", "-q"])
    _run_apt(["apt-get", "install", "-y", "-q", "--no-install-recommends", *names])
    target = bin_dir(root)
    target.mkdir(parents=True, exist_ok=True)
    for package in todo:
        installed = installed_debian_version(package.name)
        if installed is None or debian_upstream_version(installed) != package.upstream_version:
            raise BuildError(
                f"apt installed {package.name} {installed or 'nothing'}, "
                f"the dev cluster needs {package.upstream_version}"
            )
        with tempfile.TemporaryDirectory(dir=target) as scratch:
            out = Path(scratch) / package.name
            shutil.copy2(package.program, out)
            out.replace(target / package.file_name)
        log(f"cached {package.file_name} from Debian {installed}")
    return todo


def ensure_debian_tools(packages: Iterable[str], log: Callable[[str], None] = print) -> None:
    """Install Debian packages whose programs are used where apt puts them (buildah,
    mmdebstrap: tools with data files and helpers, not single programs to cache)."""
    missing = [p for p in packages if installed_debian_version(p) is None]
    if not missing:
        return
    if shutil.which("apt-get") is None:
        raise BuildError(f"apt-get is not available to install {', '.join(missing)}: install them by hand")
    log(f"installing {', '.join(missing)} from Debian ...")
    _run_apt(["apt-get", "update", "-q"])
    _run_apt(["apt-get", "install", "-y", "-q", "--no-install-recommends", *missing])


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
    if name == "minio":
        return MINIO_VERSION
    if name == "helm":
        return HELM_VERSION
    if name == "coredns":
        return COREDNS_VERSION
    if name == LINEARIZABILITY_CHECKER:
        return linearizability_checker().version
    if name in ("prometheus", "promtool"):
        return PROMETHEUS_VERSION
    if name in ("containerd", "containerd-shim-runc-v2", "ctr"):
        return CONTAINERD_VERSION
    if name.startswith("cni-"):
        return CNI_PLUGINS_VERSION
    if name == "crictl":
        return CRI_TOOLS_VERSION
    if name == "pause":
        return PAUSE_VERSION
    if name in DEBIAN_PACKAGES:
        return DEBIAN_PACKAGES[name].upstream_version
    return KUBERNETES_VERSION


def ensure_built(binary: Binary, root: Path | None = None, log: Callable[[str], None] = print) -> Path:
    """The binary's path, built first when it is missing (what `kustos dev build` does for it)."""
    path = bin_dir(root) / binary.file_name
    if not path.is_file():
        build([binary], root, log)
    return path


def missing_binaries(root: Path | None = None, with_test_servers: bool = False) -> list[Binary]:
    wanted = all_binaries(with_test_servers=with_test_servers)
    return [b for b in wanted if not (bin_dir(root) / b.file_name).is_file()]


def build_missing(*names: str) -> None:
    """Build those of ``names`` that are missing: what a test module needs before it runs."""
    build([b for b in missing_binaries() if b.name in names])


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
