"""A container of a pod turned into a local process: images, variables, hosts and paths."""

from __future__ import annotations

import string
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kustos.devcluster.binaries import ETCD_VERSIONS
from kustos.devcluster.podspec import (
    ETCD_IMAGE_REPOSITORIES,
    RUNNER_IMAGE_PREFIXES,
    build_invocation,
    container_env,
    expand_vars,
    field_value,
    is_runner_image,
    match_image,
    pod_is_runnable,
    pod_is_runner_owned,
    rewrite_paths,
)

POD_IP = "127.3.4.5"
REPOSITORIES = [prefix.rstrip(":") for prefix in RUNNER_IMAGE_PREFIXES]


def _pod(*images: str, init: tuple[str, ...] = ()) -> dict[str, Any]:
    return {
        "spec": {
            "initContainers": [{"name": f"init{i}", "image": image} for i, image in enumerate(init)],
            "containers": [{"name": f"c{i}", "image": image} for i, image in enumerate(images)],
        }
    }


# ---- images ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("image", "version"),
    [
        ("registry.k8s.io/etcd:3.5.35-0", "v3.5.35"),
        ("registry.k8s.io/etcd:3.6.16-0", "v3.6.16"),
        ("k8s.gcr.io/etcd:3.5.35", "v3.5.35"),
        ("gcr.io/etcd-development/etcd:v3.6.16", "v3.6.16"),
        ("quay.io/coreos/etcd:v3.5.35", "v3.5.35"),
    ],
)
def test_match_image_maps_allow_listed_etcd_images_to_their_version(image: str, version: str) -> None:
    match = match_image(image, ETCD_VERSIONS)

    assert match is not None
    assert match.image == image
    assert dict(match.binaries) == {"etcd": version, "etcdctl": version, "etcdutl": version}


@pytest.mark.parametrize(
    "image",
    [
        "registry.k8s.io/etcd:3.4.13-0",
        "quay.io/coreos/etcd:v3.6.0",
        "gcr.io/etcd-development/etcd:v3.5.34",
    ],
)
def test_match_image_rejects_versions_that_are_not_built(image: str) -> None:
    assert is_runner_image(image)
    assert match_image(image, ETCD_VERSIONS) is None


@pytest.mark.parametrize(
    "image",
    [
        "docker.io/bitnami/etcd:3.5.35",
        "bitnami/etcd:3.6.16",
        "registry.k8s.io/etcd-manager:3.5.35",
        "evil.example/registry.k8s.io/etcd:3.5.35",
        "registry.k8s.io/etcd:latest",
        "registry.k8s.io/etcd:3.5.35-rc.0",
        "registry.k8s.io/kube-apiserver:v1.36.3",
        "nginx",
        "",
    ],
)
def test_match_image_rejects_images_outside_the_allow_list(image: str) -> None:
    assert match_image(image, ETCD_VERSIONS) is None


def test_match_image_only_knows_the_versions_it_is_given() -> None:
    assert match_image("registry.k8s.io/etcd:3.5.35-0", ["v3.6.16"]) is None
    assert match_image("registry.k8s.io/etcd:3.5.35-0", []) is None


@given(
    repository=st.sampled_from(ETCD_IMAGE_REPOSITORIES),
    version=st.sampled_from(ETCD_VERSIONS),
    v_prefix=st.booleans(),
    build=st.none() | st.integers(min_value=0, max_value=99),
)
def test_match_image_accepts_every_tag_spelling_of_a_built_version(
    repository: str, version: str, v_prefix: bool, build: int | None
) -> None:
    tag = (version if v_prefix else version.lstrip("v")) + ("" if build is None else f"-{build}")
    match = match_image(f"{repository}:{tag}", ETCD_VERSIONS)

    assert match is not None
    assert set(match.binaries.values()) == {version}


@given(st.text() | st.builds(lambda r, t: f"{r}:{t}", st.sampled_from(REPOSITORIES), st.text()))
def test_an_image_the_runner_can_run_is_always_one_it_owns(image: str) -> None:
    # Otherwise kwok would simulate a pod the runner also starts.
    if match_image(image, ETCD_VERSIONS) is not None:
        assert is_runner_image(image)


@pytest.mark.parametrize(
    "image",
    ["registry.k8s.io/etcd:3.4.13-0", "quay.io/coreos/etcd:v3.5.35", "k8s.gcr.io/etcd:anything"],
)
def test_is_runner_image_owns_any_tag_of_an_allow_listed_repository(image: str) -> None:
    assert is_runner_image(image)


@pytest.mark.parametrize(
    "image", ["nginx:1.27", "docker.io/bitnami/etcd:3.5.35", "registry.k8s.io/pause:3.10"]
)
def test_is_runner_image_leaves_other_images_to_kwok(image: str) -> None:
    assert not is_runner_image(image)


def test_a_pod_with_one_etcd_container_among_others_is_runner_owned_but_not_runnable() -> None:
    pod = _pod("registry.k8s.io/etcd:3.6.16-0", "busybox:1.36")

    assert pod_is_runner_owned(pod)
    assert not pod_is_runnable(pod, ETCD_VERSIONS)


def test_an_etcd_init_container_makes_the_pod_runner_owned() -> None:
    pod = _pod("nginx:1.27", init=("registry.k8s.io/etcd:3.6.16-0",))

    assert pod_is_runner_owned(pod)
    assert not pod_is_runnable(pod, ETCD_VERSIONS)


def test_a_pod_whose_containers_are_all_built_etcd_images_is_runnable() -> None:
    pod = _pod(
        "registry.k8s.io/etcd:3.6.16-0",
        "quay.io/coreos/etcd:v3.6.16",
        init=("registry.k8s.io/etcd:3.5.35-0",),
    )

    assert pod_is_runner_owned(pod)
    assert pod_is_runnable(pod, ETCD_VERSIONS)


def test_a_pod_with_an_unbuilt_etcd_version_is_owned_but_not_runnable() -> None:
    pod = _pod("registry.k8s.io/etcd:3.4.13-0")

    assert pod_is_runner_owned(pod)
    assert not pod_is_runnable(pod, ETCD_VERSIONS)


def test_a_pod_without_etcd_images_is_left_to_kwok() -> None:
    pod = _pod("nginx:1.27", init=("busybox:1.36",))

    assert not pod_is_runner_owned(pod)
    assert not pod_is_runnable(pod, ETCD_VERSIONS)


def test_a_pod_without_containers_is_neither_owned_nor_runnable() -> None:
    assert not pod_is_runner_owned({"spec": {}})
    assert not pod_is_runnable({"spec": {}}, ETCD_VERSIONS)
    assert not pod_is_runnable({}, ETCD_VERSIONS)


# ---- $(VAR) expansion -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("--name=$(POD_NAME)", "--name=etcd-0"),
        ("$(POD_NAME).$(SERVICE)", "etcd-0.etcd"),
        ("$(UNKNOWN)", "$(UNKNOWN)"),
        ("$$(POD_NAME)", "$(POD_NAME)"),
        ("$$$(POD_NAME)", "$etcd-0"),
        ("cost: $$5", "cost: $5"),
        ("$POD_NAME", "$POD_NAME"),
        ("$(POD_NAME", "$(POD_NAME"),
        ("$()", "$()"),
        ("plain", "plain"),
    ],
)
def test_expand_vars_follows_kubernetes_semantics(text: str, expected: str) -> None:
    assert expand_vars(text, {"POD_NAME": "etcd-0", "SERVICE": "etcd"}) == expected


_names = st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,10}", fullmatch=True)


@given(name=_names, value=st.text())
def test_expand_vars_does_not_expand_the_substituted_value_again(name: str, value: str) -> None:
    assert expand_vars(f"$({name})", {name: value}) == value
    assert expand_vars(f"<$({name})>", {name: value}) == f"<{value}>"


@given(text=st.text().filter(lambda t: "$" not in t), env=st.dictionaries(_names, st.text()))
def test_expand_vars_leaves_text_without_references_alone(text: str, env: dict[str, str]) -> None:
    assert expand_vars(text, env) == text


@given(name=_names, env=st.dictionaries(_names, st.text()))
def test_expand_vars_escaped_reference_stays_literal(name: str, env: dict[str, str]) -> None:
    assert expand_vars(f"$$({name})", env) == f"$({name})"


# ---- paths ----------------------------------------------------------------------------

DATA = Path("/home/dev/.cache/kustos/pods/uid/volumes/data")
WAL = Path("/home/dev/.cache/kustos/pods/uid/volumes/wal")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("/var/lib/etcd", f"{DATA}"),
        ("/var/lib/etcd/", f"{DATA}/"),
        ("/var/lib/etcd/member/snap", f"{DATA}/member/snap"),
        ("--data-dir=/var/lib/etcd", f"--data-dir={DATA}"),
        ("--data-dir=/var/lib/etcd/sub", f"--data-dir={DATA}/sub"),
        ("PATHS=/var/lib/etcd:/opt", f"PATHS={DATA}:/opt"),
        ("'/var/lib/etcd' \"/var/lib/etcd\"", f"'{DATA}' \"{DATA}\""),
        ("cd /var/lib/etcd && ls", f"cd {DATA} && ls"),
    ],
)
def test_rewrite_paths_replaces_mount_paths_as_path_prefixes(text: str, expected: str) -> None:
    assert rewrite_paths(text, {"/var/lib/etcd": DATA}) == expected


@pytest.mark.parametrize(
    "text",
    [
        "/var/lib/etcdx",
        "/var/lib/etcd-backup",
        "/var/lib/etcd_old",
        "/var/lib/etcd.bak",
        "/srv/var/lib/etcd",
        "./var/lib/etcd",
        "var/lib/etcd",
        "/var/lib",
    ],
)
def test_rewrite_paths_leaves_other_paths_alone(text: str) -> None:
    assert rewrite_paths(text, {"/var/lib/etcd": DATA}) == text


def test_rewrite_paths_prefers_the_longest_mount_path() -> None:
    mounts = {"/var/lib/etcd": DATA, "/var/lib/etcd/wal": WAL}

    assert rewrite_paths("--wal-dir=/var/lib/etcd/wal/0001", mounts) == f"--wal-dir={WAL}/0001"
    assert rewrite_paths("--data-dir=/var/lib/etcd/member", mounts) == f"--data-dir={DATA}/member"
    assert rewrite_paths("/var/lib/etcd/walx", mounts) == f"{DATA}/walx"


def test_rewrite_paths_ignores_a_trailing_slash_on_the_mount_path() -> None:
    assert rewrite_paths("--data-dir=/var/lib/etcd/x", {"/var/lib/etcd/": DATA}) == f"--data-dir={DATA}/x"


def test_rewrite_paths_without_mounts_changes_nothing() -> None:
    assert rewrite_paths("--data-dir=/var/lib/etcd", {}) == "--data-dir=/var/lib/etcd"


def test_rewrite_paths_does_not_rewrite_an_already_substituted_directory() -> None:
    data = Path("/tmp/kustos/pods/uid/volumes/data")
    scratch = Path("/tmp/kustos/pods/uid/volumes/scratch")
    mounts = {"/var/lib/etcd": data, "/tmp": scratch}

    assert rewrite_paths("--data-dir=/var/lib/etcd/member", mounts) == f"--data-dir={data}/member"


_segment = st.from_regex(r"[a-z][a-z0-9]{0,6}", fullmatch=True)
_mount_paths = st.lists(_segment, min_size=1, max_size=4).map(lambda parts: "/" + "/".join(parts))


@given(
    mount=_mount_paths,
    rest=st.lists(_segment, max_size=3),
    flag=st.sampled_from(["", "--dir=", "-d ", "X=", "a:"]),
)
def test_rewrite_paths_maps_anything_below_a_mount(mount: str, rest: list[str], flag: str) -> None:
    suffix = "".join(f"/{part}" for part in rest)
    local = Path("/local/volume")

    assert rewrite_paths(f"{flag}{mount}{suffix}", {mount: local}) == f"{flag}{local}{suffix}"


@given(mount=_mount_paths, tail=st.text(alphabet=string.ascii_letters + string.digits + "_-.", min_size=1))
def test_rewrite_paths_never_rewrites_a_longer_file_name(mount: str, tail: str) -> None:
    text = f"--dir={mount}{tail}"
    assert rewrite_paths(text, {mount: Path("/local/volume")}) == text


# ---- downward API and environment -----------------------------------------------------


def _full_pod() -> dict[str, Any]:
    return {
        "metadata": {
            "name": "etcd-0",
            "namespace": "db",
            "uid": "1234-abcd",
            "labels": {"app": "etcd", "apps.kubernetes.io/pod-index": "0"},
            "annotations": {"note": "hello"},
        },
        "spec": {"nodeName": "worker-1", "serviceAccountName": "etcd"},
        "status": {"podIP": POD_IP, "hostIP": "127.3.0.4"},
    }


@pytest.mark.parametrize(
    ("path", "value"),
    [
        ("metadata.name", "etcd-0"),
        ("metadata.namespace", "db"),
        ("metadata.uid", "1234-abcd"),
        ("spec.nodeName", "worker-1"),
        ("spec.serviceAccountName", "etcd"),
        ("status.podIP", POD_IP),
        ("status.hostIP", "127.3.0.4"),
        ("metadata.labels['app']", "etcd"),
        ("metadata.labels['apps.kubernetes.io/pod-index']", "0"),
        ("metadata.annotations['note']", "hello"),
        ("metadata.labels['missing']", ""),
        ("metadata.generation", ""),
    ],
)
def test_field_value_serves_the_downward_api(path: str, value: str) -> None:
    assert field_value(_full_pod(), path) == value


def test_field_value_of_an_unscheduled_pod_is_empty() -> None:
    pod = {"metadata": {"name": "p"}}

    assert field_value(pod, "spec.nodeName") == ""
    assert field_value(pod, "status.podIP") == ""
    assert field_value(pod, "metadata.labels['app']") == ""


def test_container_env_combines_values_downward_api_and_lookups() -> None:
    container = {
        "env": [
            {"name": "PLAIN", "value": "x"},
            {"name": "EMPTY", "value": ""},
            {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
            {"name": "PEER", "value": "http://$(POD_NAME).etcd:2380"},
            {"name": "LATER", "value": "$(DEFINED_AFTER)"},
            {"name": "DEFINED_AFTER", "value": "y"},
            {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "creds", "key": "token"}}},
            {"name": "MODE", "valueFrom": {"configMapKeyRef": {"name": "cfg", "key": "mode"}}},
            {
                "name": "OPTIONAL",
                "valueFrom": {"configMapKeyRef": {"name": "cfg", "key": "absent", "optional": True}},
            },
        ]
    }
    lookup = {("secret", "creds", "token"): "s3cret", ("configMap", "cfg", "mode"): "fast"}

    env = container_env(_full_pod(), container, lookup)

    assert env == {
        "PLAIN": "x",
        "EMPTY": "",
        "POD_NAME": "etcd-0",
        "PEER": "http://etcd-0.etcd:2380",
        # Only variables defined earlier are expanded, as in Kubernetes.
        "LATER": "$(DEFINED_AFTER)",
        "DEFINED_AFTER": "y",
        "TOKEN": "s3cret",
        "MODE": "fast",
    }


def test_container_env_does_not_confuse_a_secret_with_a_config_map_of_the_same_name() -> None:
    container = {"env": [{"name": "V", "valueFrom": {"secretKeyRef": {"name": "cfg", "key": "k"}}}]}

    assert container_env(_full_pod(), container, {("configMap", "cfg", "k"): "public"}) == {}


def test_container_env_of_a_container_without_env_is_empty() -> None:
    assert container_env(_full_pod(), {"name": "c"}) == {}


# ---- invocation -----------------------------------------------------------------------

SHIM = Path("/cache/images/etcd-v3.6.16")
BIN_PATHS = {name: SHIM / name for name in ("etcd", "etcdctl", "etcdutl")}
BASE_ENV = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "HOSTNAME": "laptop"}


def _etcd_container(**overrides: Any) -> dict[str, Any]:
    container: dict[str, Any] = {
        "name": "etcd",
        "image": "registry.k8s.io/etcd:3.6.16-0",
        "command": ["/usr/local/bin/etcd"],
        "args": [
            "--name=$(POD_NAME)",
            "--data-dir=/var/lib/etcd",
            "--listen-client-urls=http://0.0.0.0:2379",
            "--advertise-client-urls=$(ADVERTISE)",
        ],
        "env": [
            {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
            {"name": "ADVERTISE", "value": "http://localhost:2379"},
            {"name": "ETCD_WAL_DIR", "value": "/var/lib/etcd/wal"},
        ],
    }
    container.update(overrides)
    return container


def test_build_invocation_runs_the_local_binary_with_rewritten_paths_and_hosts_kept(tmp_path: Path) -> None:
    """Pods have their own network namespace: 0.0.0.0 and localhost stay as written."""
    data = tmp_path / "data"

    invocation = build_invocation(
        _full_pod(), _etcd_container(), BIN_PATHS, {"/var/lib/etcd": data}, BASE_ENV
    )

    assert invocation.argv == [
        str(SHIM / "etcd"),
        "--name=etcd-0",
        f"--data-dir={data}",
        "--listen-client-urls=http://0.0.0.0:2379",
        "--advertise-client-urls=http://localhost:2379",
    ]
    assert invocation.cwd is None


def test_build_invocation_environment_is_rewritten_and_puts_the_binaries_first_on_path(
    tmp_path: Path,
) -> None:
    data = tmp_path / "data"

    env = build_invocation(_full_pod(), _etcd_container(), BIN_PATHS, {"/var/lib/etcd": data}, BASE_ENV).env

    assert env["PATH"].split(":") == [str(SHIM), "/usr/bin", "/bin"]
    assert env["ADVERTISE"] == "http://localhost:2379"
    assert env["ETCD_WAL_DIR"] == f"{data}/wal"
    assert env["POD_NAME"] == "etcd-0"
    assert env["HOSTNAME"] == "etcd-0"
    assert env["LANG"] == "C.UTF-8"


def test_build_invocation_defaults_path_when_the_base_environment_has_none() -> None:
    env = build_invocation(_full_pod(), _etcd_container(), BIN_PATHS, {}, {}).env

    assert env["PATH"].split(":") == [str(SHIM), "/usr/bin", "/bin"]


def test_build_invocation_without_command_runs_the_image_entrypoint_etcd() -> None:
    container = _etcd_container(
        command=None, args=["--name=solo", "--listen-peer-urls=http://127.0.0.1:2380"]
    )

    invocation = build_invocation(_full_pod(), container, BIN_PATHS, {}, BASE_ENV)

    assert invocation.argv == [str(SHIM / "etcd"), "--name=solo", "--listen-peer-urls=http://127.0.0.1:2380"]


def test_build_invocation_resolves_a_bare_command_name() -> None:
    container = _etcd_container(command=["etcdctl", "endpoint", "health"], args=[])

    invocation = build_invocation(_full_pod(), container, BIN_PATHS, {}, BASE_ENV)

    assert invocation.argv == [str(SHIM / "etcdctl"), "endpoint", "health"]


def test_build_invocation_keeps_a_shell_command_and_lets_it_find_the_binaries_on_path() -> None:
    container = _etcd_container(
        command=["/bin/sh", "-c"], args=["etcdctl --endpoints=localhost:2379 endpoint health"]
    )

    invocation = build_invocation(_full_pod(), container, BIN_PATHS, {}, BASE_ENV)

    assert invocation.argv == ["/bin/sh", "-c", "etcdctl --endpoints=localhost:2379 endpoint health"]
    assert invocation.env["PATH"].split(":")[0] == str(SHIM)


def test_build_invocation_rewrites_the_working_directory(tmp_path: Path) -> None:
    data = tmp_path / "data"
    container = _etcd_container(workingDir="/var/lib/etcd/work")

    invocation = build_invocation(_full_pod(), container, BIN_PATHS, {"/var/lib/etcd": data}, BASE_ENV)

    assert invocation.cwd == data / "work"


def test_build_invocation_leaves_hosts_alone_until_the_pod_has_an_ip() -> None:
    pod = _full_pod()
    del pod["status"]

    invocation = build_invocation(pod, _etcd_container(), BIN_PATHS, {}, BASE_ENV)

    assert "--listen-client-urls=http://0.0.0.0:2379" in invocation.argv
    assert invocation.env["ADVERTISE"] == "http://localhost:2379"


def test_build_invocation_of_an_image_without_binaries_keeps_the_command() -> None:
    container = _etcd_container(command=["/usr/local/bin/etcd"], args=[])

    invocation = build_invocation(_full_pod(), container, {}, {}, BASE_ENV)

    assert invocation.argv == ["/usr/local/bin/etcd"]
    assert invocation.env["PATH"] == "/usr/bin:/bin"


def test_build_invocation_passes_config_map_and_secret_values() -> None:
    container = _etcd_container(
        args=["--initial-cluster-token=$(TOKEN)"],
        env=[{"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "etcd", "key": "token"}}}],
    )

    invocation = build_invocation(
        _full_pod(), container, BIN_PATHS, {}, BASE_ENV, {("secret", "etcd", "token"): "t0k3n"}
    )

    assert invocation.argv[1:] == ["--initial-cluster-token=t0k3n"]
    assert invocation.env["TOKEN"] == "t0k3n"


def test_resource_field_refs_report_requests_and_limits_in_their_divisor() -> None:
    import os

    from kustos.devcluster.podspec import container_env, resource_value

    container = {
        "name": "c", "image": "x",
        "resources": {"requests": {"cpu": "250m"}, "limits": {"memory": "128Mi"}},
        "env": [
            {"name": "CPU_M",
             "valueFrom": {"resourceFieldRef": {"resource": "requests.cpu", "divisor": "1m"}}},
            {"name": "MEM_MI",
             "valueFrom": {"resourceFieldRef": {"resource": "limits.memory", "divisor": "1Mi"}}},
            {"name": "MEM_REQ", "valueFrom": {"resourceFieldRef": {"resource": "requests.memory"}}},
        ],
    }  # fmt: skip
    pod = {"metadata": {"name": "p"}, "spec": {"containers": [container]}}
    env = container_env(pod, container)
    # An unset request defaults to the limit, as the API server's defaulting does.
    assert env == {"CPU_M": "250", "MEM_MI": "128", "MEM_REQ": str(128 * 2**20)}
    # An unset limit is the node's capacity: here, this machine's.
    assert resource_value(pod, {"containerName": "c", "resource": "limits.cpu"}) == str(os.cpu_count())
