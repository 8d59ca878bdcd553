"""The dev cluster's binaries: what is built, where it lands, and where the cache is."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import pytest

from kustos.devcluster import binaries
from kustos.devcluster.binaries import (
    CNI_PLUGINS,
    CNI_PLUGINS_VERSION,
    CONTAINERD_VERSION,
    DEBIAN_PACKAGES,
    ETCD_VERSIONS,
    GOMOD_DIR,
    KUBERNETES_VERSION,
    KWOK_VERSION,
    VERSITYGW_VERSION,
    BuildError,
    all_binaries,
    bin_dir,
    binary_path,
    build,
    debian_upstream_version,
    install_debian_packages,
    missing_binaries,
    missing_debian_packages,
)
from kustos.devcluster.paths import cache_root, clusters_root

KUBE_COMMANDS = (
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
    "kubectl",
    "kubelet",
    "kube-proxy",
)
NODE_RUNTIME = ("containerd", "containerd-shim-runc-v2", "ctr", "crictl", "pause")
ETCD_COMMANDS = ("etcd", "etcdctl", "etcdutl")


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "cache"
    monkeypatch.setenv("KUSTOS_CACHE", str(root))
    return root


# ---- what is built ------------------------------------------------------------------------


def test_every_binary_the_dev_cluster_needs_is_built() -> None:
    built = Counter(b.name for b in all_binaries())

    assert built == Counter(
        {
            "kwok": 1,
            "kwokctl": 1,
            **dict.fromkeys(ETCD_COMMANDS, len(ETCD_VERSIONS)),
            **dict.fromkeys(KUBE_COMMANDS, 1),
            "versitygw": 1,
            "helm": 1,
            "coredns": 1,
            "kustos-linearizability": 1,
            "promtool": 1,
            "prometheus": 1,
            **dict.fromkeys(NODE_RUNTIME, 1),
            **{f"cni-{plugin}": 1 for plugin in CNI_PLUGINS},
        }
    )


def test_each_etcd_minor_is_built_from_its_own_module() -> None:
    assert [v.split(".")[1] for v in ETCD_VERSIONS] == ["5", "6", "7"]
    etcd = {(b.name, b.version): b.module_dir for b in all_binaries() if b.name in ETCD_COMMANDS}

    assert etcd == {
        (name, version): "etcd-" + ".".join(version.lstrip("v").split(".")[:2])
        for name in ETCD_COMMANDS
        for version in ETCD_VERSIONS
    }


def test_file_names_are_unique_and_carry_the_version() -> None:
    names = [b.file_name for b in all_binaries()]

    assert len(set(names)) == len(names)
    assert all(b.file_name == f"{b.name}-{b.version}" for b in all_binaries())


def test_kwok_is_built_first() -> None:
    assert [b.name for b in all_binaries()[:2]] == ["kwok", "kwokctl"]
    assert {b.version for b in all_binaries()[:2]} == {KWOK_VERSION}


def test_kubernetes_binaries_are_stamped_with_their_version() -> None:
    major, minor = KUBERNETES_VERSION.lstrip("v").split(".")[:2]

    for binary in all_binaries():
        if binary.name not in KUBE_COMMANDS:
            unstamped = ("kwok", "kwokctl", "coredns", "pause", "kustos-linearizability", *ETCD_COMMANDS)
            assert binary.name in unstamped or binary.ldflags
            continue
        assert binary.version == KUBERNETES_VERSION
        assert binary.package == f"k8s.io/kubernetes/cmd/{binary.name}"
        flags = set(binary.ldflags)
        assert f"-X k8s.io/component-base/version.gitVersion={KUBERNETES_VERSION}" in flags
        assert f"-X k8s.io/component-base/version.gitMajor={major}" in flags
        assert f"-X k8s.io/component-base/version.gitMinor={minor}" in flags
        assert "-X k8s.io/component-base/version.gitTreeState=clean" in flags
        assert f"-X k8s.io/client-go/pkg/version.gitVersion={KUBERNETES_VERSION}" in flags


def test_the_s3_server_is_stamped_with_its_version() -> None:
    [versitygw] = [b for b in all_binaries() if b.name == "versitygw"]

    assert versitygw.version == VERSITYGW_VERSION
    assert versitygw.package == "github.com/versity/versitygw/cmd/versitygw"
    assert versitygw.ldflags == (f"-X main.Version={VERSITYGW_VERSION}",)


def test_containerd_is_pure_go_without_the_snapshotters_that_need_host_libraries() -> None:
    runtime = [b for b in all_binaries() if b.module_dir == "containerd"]

    assert {b.name for b in runtime} == {"containerd", "containerd-shim-runc-v2", "ctr"}
    for binary in runtime:
        assert binary.version == CONTAINERD_VERSION
        assert set(binary.tags) == {"no_btrfs", "no_devmapper", "no_zfs"}
        stamp = f"-X github.com/containerd/containerd/v2/version.Version={CONTAINERD_VERSION}"
        assert binary.ldflags == (stamp,)


def test_cni_plugins_are_built_under_a_prefixed_name() -> None:
    plugins = {b.name: b for b in all_binaries() if b.module_dir == "cni-plugins"}

    assert set(plugins) == {f"cni-{name}" for name in CNI_PLUGINS}
    assert {b.version for b in plugins.values()} == {CNI_PLUGINS_VERSION}
    assert plugins["cni-host-local"].package.endswith("/plugins/ipam/host-local")


def _required_versions(go_mod: Path) -> dict[str, str]:
    text = go_mod.read_text()
    return dict(re.findall(r"^\s*(?:require\s+)?([\w.\-/]+\.[\w.\-/]+)\s+(v\S+)", text, re.MULTILINE))


THIRD_PARTY = [b for b in all_binaries() if not b.package.startswith("kustos.dev/")]


@pytest.mark.parametrize("binary", THIRD_PARTY, ids=lambda b: b.file_name)
def test_each_binary_is_the_version_its_wrapper_module_pins(binary: binaries.Binary) -> None:
    module = GOMOD_DIR / binary.module_dir
    if f"module {binary.package}\n" in (module / "go.mod").read_text():
        # Our own program (pause): its version is ours, nothing to pin.
        return
    pinned = _required_versions(module / "go.mod")
    owners = [path for path in pinned if binary.package == path or binary.package.startswith(path + "/")]

    assert owners, f"{binary.package} is not required by {module}/go.mod"
    assert pinned[max(owners, key=len)] == binary.version
    assert f'_ "{binary.package}"' in (module / "tools.go").read_text()


def test_the_linearizability_checker_pins_porcupine_and_is_rebuilt_when_its_model_changes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    checker = binaries.linearizability_checker()
    pinned = _required_versions(GOMOD_DIR / "porcupine" / "go.mod")
    assert pinned["github.com/anishathalye/porcupine"] == binaries.PORCUPINE_VERSION
    assert checker.version.startswith(binaries.PORCUPINE_VERSION + "-")

    module = tmp_path / "porcupine"
    module.mkdir()
    for name in ("main.go", "go.sum"):
        (module / name).write_bytes((GOMOD_DIR / "porcupine" / name).read_bytes())
    monkeypatch.setattr(binaries, "GOMOD_DIR", tmp_path)
    assert binaries.linearizability_checker().version == checker.version
    (module / "main.go").write_text((module / "main.go").read_text() + "// changed\n")
    assert binaries.linearizability_checker().version != checker.version


# ---- where binaries live ------------------------------------------------------------------


def test_binary_path_defaults_to_the_dev_clusters_versions(cache: Path) -> None:
    assert binary_path("etcd") == cache / "bin" / f"etcd-{ETCD_VERSIONS[-1]}"
    assert binary_path("etcdctl") == cache / "bin" / f"etcdctl-{ETCD_VERSIONS[-1]}"
    assert binary_path("kwokctl") == cache / "bin" / f"kwokctl-{KWOK_VERSION}"
    assert binary_path("kube-apiserver") == cache / "bin" / f"kube-apiserver-{KUBERNETES_VERSION}"
    assert binary_path("kubectl") == cache / "bin" / f"kubectl-{KUBERNETES_VERSION}"
    assert binary_path("versitygw") == cache / "bin" / f"versitygw-{VERSITYGW_VERSION}"


def test_prometheus_is_stamped_and_built_without_service_discovery_plugins() -> None:
    built = {b.name: b for b in all_binaries() if b.module_dir == "prometheus"}

    assert sorted(built) == ["prometheus", "promtool"]
    for binary in built.values():
        assert binary.tags == ("remove_all_sd",)
        assert binary.ldflags == ("-X github.com/prometheus/common/version.Version=3.16.0",)


def test_binary_path_takes_an_explicit_version_and_root(tmp_path: Path) -> None:
    assert (
        binary_path("etcd", ETCD_VERSIONS[0], root=tmp_path) == tmp_path / "bin" / f"etcd-{ETCD_VERSIONS[0]}"
    )
    assert bin_dir(tmp_path) == tmp_path / "bin"


def test_every_binary_is_found_where_binary_path_says(tmp_path: Path) -> None:
    for binary in all_binaries():
        assert binary_path(binary.name, binary.version, root=tmp_path) == bin_dir(tmp_path) / binary.file_name


def test_everything_is_missing_from_an_empty_cache(tmp_path: Path) -> None:
    assert missing_binaries(tmp_path) == all_binaries()


def test_built_binaries_are_no_longer_missing(tmp_path: Path) -> None:
    bin_dir(tmp_path).mkdir()
    present = [b for b in all_binaries() if b.name.startswith("kube")]
    for binary in present:
        (bin_dir(tmp_path) / binary.file_name).write_bytes(b"\x7fELF")

    assert missing_binaries(tmp_path) == [b for b in all_binaries() if b not in present]


def test_a_directory_or_another_version_does_not_count_as_built(tmp_path: Path) -> None:
    bin_dir(tmp_path).mkdir()
    (bin_dir(tmp_path) / f"kwok-{KWOK_VERSION}").mkdir()
    (bin_dir(tmp_path) / "kwokctl-v0.0.1").write_bytes(b"old")

    missing = {b.name for b in missing_binaries(tmp_path)}

    assert {"kwok", "kwokctl"} <= missing


def test_missing_binaries_defaults_to_the_cache(cache: Path) -> None:
    bin_dir().mkdir(parents=True)
    for binary in all_binaries():
        (bin_dir() / binary.file_name).touch()

    assert missing_binaries() == []


def test_build_without_go_fails_with_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    empty = tmp_path / "empty-path"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    logged: list[str] = []

    with pytest.raises(BuildError, match="Go toolchain"):
        build(root=tmp_path / "cache", log=logged.append)

    assert not (tmp_path / "cache").exists()
    assert logged == []


def test_build_only_runs_for_what_is_missing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A `go` that fails whatever it is asked: any build attempt would raise BuildError.
    fake_go = tmp_path / "fake-go"
    fake_go.mkdir()
    (fake_go / "go").write_text("#!/bin/sh\nexit 1\n")
    (fake_go / "go").chmod(0o755)
    monkeypatch.setenv("PATH", str(fake_go))
    root = tmp_path / "cache"
    bin_dir(root).mkdir(parents=True)
    for binary in all_binaries():
        (bin_dir(root) / binary.file_name).write_bytes(b"built")
    logged: list[str] = []

    assert build(root=root, log=logged.append) == []
    assert logged == []


# ---- programs from Debian -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("debian", "upstream"),
    [("1.1.5+ds1-1+deb12u1", "1.1.5"), ("1:2.0~rc1-3", "2.0"), ("1.3.5-7", "1.3.5"), ("4.2", "4.2")],
)
def test_the_upstream_version_is_read_from_a_debian_version(debian: str, upstream: str) -> None:
    assert debian_upstream_version(debian) == upstream


def test_runc_and_haproxy_come_from_debian_into_the_cache(cache: Path) -> None:
    runc, haproxy = DEBIAN_PACKAGES["runc"], DEBIAN_PACKAGES["haproxy"]

    assert missing_debian_packages() == [runc, haproxy]
    assert binary_path("runc") == cache / "bin" / f"runc-{runc.upstream_version}"
    assert binary_path("haproxy") == cache / "bin" / f"haproxy-{haproxy.upstream_version}"

    bin_dir().mkdir(parents=True)
    binary_path("runc").write_bytes(b"\x7fELF")

    assert missing_debian_packages() == [haproxy]


def test_without_apt_the_error_says_what_to_install_and_where(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    empty = tmp_path / "empty-path"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))

    wanted = r"apt-get is not available to install runc, haproxy: install runc 1\.1\.5, haproxy 2\.6\.12"
    with pytest.raises(BuildError, match=wanted):
        install_debian_packages(DEBIAN_PACKAGES.values(), root=tmp_path / "cache", log=lambda _: None)

    assert install_debian_packages([], root=tmp_path / "cache") == []


# ---- the cache ----------------------------------------------------------------------------


def test_kustos_cache_wins_over_xdg(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KUSTOS_CACHE", str(tmp_path / "explicit"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))

    assert cache_root() == tmp_path / "explicit"


def test_xdg_cache_home_holds_a_kustos_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KUSTOS_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))

    assert cache_root() == tmp_path / "xdg" / "kustos"


def test_without_settings_the_cache_is_in_the_home_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("KUSTOS_CACHE", raising=False)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))

    assert cache_root() == tmp_path / "home" / ".cache" / "kustos"


def test_empty_settings_count_as_unset(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KUSTOS_CACHE", "")
    monkeypatch.setenv("XDG_CACHE_HOME", "")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))

    assert cache_root() == tmp_path / "home" / ".cache" / "kustos"


def test_a_tilde_in_the_cache_settings_means_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("KUSTOS_CACHE", "~/kustos-cache")

    assert cache_root() == tmp_path / "home" / "kustos-cache"

    monkeypatch.delenv("KUSTOS_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", "~/xdg")

    assert cache_root() == tmp_path / "home" / "xdg" / "kustos"


def test_clusters_and_binaries_live_in_the_cache(cache: Path) -> None:
    assert clusters_root() == cache / "clusters"
    assert bin_dir() == cache / "bin"
