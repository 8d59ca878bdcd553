"""The operator's own image: its name, and how the dev runner maps it to the local install."""

from __future__ import annotations

import sys
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kustos import images
from kustos.devcluster.binaries import ETCD_VERSIONS, binary_path
from kustos.devcluster.podspec import (
    RUNNER_IMAGE_PREFIXES,
    build_invocation,
    image_entrypoint,
    is_runner_image,
    match_image,
    pod_is_runnable,
    pod_is_runner_owned,
)
from kustos.devcluster.runner import bin_paths_for
from kustos.images import KUSTOS_IMAGE_REPOSITORY, agent_image

ETCD = "registry.k8s.io/etcd:3.6.16-0"
SCRIPTS = Path("/opt/venv/bin")
POD_IP = "127.3.4.5"
# Tags as OCI distribution defines them.
_tags = st.from_regex(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}", fullmatch=True)


def _pod(*images: str, init: tuple[str, ...] = ()) -> dict[str, Any]:
    return {
        "metadata": {"name": "agent", "namespace": "db", "uid": "u-1"},
        "spec": {
            "initContainers": [{"name": f"init{i}", "image": image} for i, image in enumerate(init)],
            "containers": [{"name": f"c{i}", "image": image} for i, image in enumerate(images)],
        },
        "status": {"podIP": POD_IP},
    }


# ---- the image name -------------------------------------------------------------------


def test_agent_image_is_the_operator_repository_at_the_installed_version() -> None:
    assert agent_image() == f"ghcr.io/kustos/kustos:{version('kustos')}"


def test_agent_image_without_an_installed_package_is_tagged_dev(monkeypatch: pytest.MonkeyPatch) -> None:
    def missing(name: str) -> str:
        raise PackageNotFoundError(name)

    monkeypatch.setattr(images, "version", missing)

    assert agent_image() == "ghcr.io/kustos/kustos:dev"


# ---- matching -------------------------------------------------------------------------


def test_the_agent_image_is_allow_listed_and_stands_for_the_kustos_command() -> None:
    match = match_image(agent_image(), ETCD_VERSIONS)

    assert match is not None
    assert match.scripts == ("kustos",)
    assert dict(match.binaries) == {}
    assert is_runner_image(agent_image())
    assert f"{KUSTOS_IMAGE_REPOSITORY}:" in RUNNER_IMAGE_PREFIXES


@given(_tags)
def test_any_tag_of_the_operator_image_runs_the_local_install(tag: str) -> None:
    image = f"{KUSTOS_IMAGE_REPOSITORY}:{tag}"
    match = match_image(image, ETCD_VERSIONS)

    assert match is not None and match.scripts == ("kustos",)
    assert is_runner_image(image)
    # Whatever version is built: the tag never selects etcd binaries.
    assert match_image(image, []) == match


@pytest.mark.parametrize(
    "image",
    [
        "ghcr.io/kustos/kustos",  # no tag: not a runner image either, kwok simulates it
        "ghcr.io/kustos/kustos-extra:0.1.0",
        "ghcr.io/kustos/kustosx:0.1.0",
        "ghcr.io/kustos/kustos/agent:0.1.0",
        "docker.io/kustos/kustos:0.1.0",
        "evil.example/ghcr.io/kustos/kustos:0.1.0",
        "ghcr.io/kustos/kustos@sha256:" + "0" * 64,
    ],
)
def test_lookalikes_of_the_operator_image_are_left_to_kwok(image: str) -> None:
    assert match_image(image, ETCD_VERSIONS) is None
    assert not is_runner_image(image)
    assert not pod_is_runner_owned(_pod(image))


@pytest.mark.parametrize("image", ["ghcr.io/kustos/kustos:", "ghcr.io/kustos/kustos:a b"])
def test_a_malformed_tag_is_owned_by_the_runner_but_not_run(image: str) -> None:
    assert is_runner_image(image)
    assert match_image(image, ETCD_VERSIONS) is None
    assert not pod_is_runnable(_pod(image), ETCD_VERSIONS)


@pytest.mark.parametrize(
    ("image", "entrypoint"),
    [("ghcr.io/kustos/kustos:0.1.0", "kustos"), ("ghcr.io/kustos/kustos:dev", "kustos"), (ETCD, "etcd")],
)
def test_image_entrypoint_is_what_the_image_runs_without_a_command(image: str, entrypoint: str) -> None:
    assert image_entrypoint(image) == entrypoint


# ---- pods -----------------------------------------------------------------------------


def test_a_pod_of_the_operator_image_is_runner_owned_and_runnable() -> None:
    pod = _pod(agent_image())

    assert pod_is_runner_owned(pod)
    assert pod_is_runnable(pod, ETCD_VERSIONS)


def test_a_pod_mixing_the_operator_image_and_etcd_images_is_runnable() -> None:
    pod = _pod(ETCD, agent_image(), init=(agent_image(), "quay.io/coreos/etcd:v3.5.35"))

    assert pod_is_runner_owned(pod)
    assert pod_is_runnable(pod, ETCD_VERSIONS)


def test_a_pod_mixing_the_operator_image_and_an_unbuilt_etcd_is_owned_but_not_runnable() -> None:
    pod = _pod(agent_image(), "registry.k8s.io/etcd:3.4.13-0")

    assert pod_is_runner_owned(pod)
    assert not pod_is_runnable(pod, ETCD_VERSIONS)


def test_a_pod_mixing_the_operator_image_and_a_foreign_image_is_owned_but_not_runnable() -> None:
    pod = _pod("nginx:1.27", init=(agent_image(),))

    assert pod_is_runner_owned(pod)
    assert not pod_is_runnable(pod, ETCD_VERSIONS)


# ---- local executables ----------------------------------------------------------------


def test_the_operator_image_maps_to_the_kustos_script_next_to_the_runners_python(tmp_path: Path) -> None:
    assert bin_paths_for(agent_image(), tmp_path) == {"kustos": Path(sys.executable).parent / "kustos"}
    assert bin_paths_for(agent_image(), tmp_path, SCRIPTS) == {"kustos": SCRIPTS / "kustos"}
    assert list(tmp_path.iterdir()) == []  # no links for a script of the runner's own install


def test_the_kustos_script_exists_in_this_environment(tmp_path: Path) -> None:
    # The runner runs with this interpreter in tests: its environment has the console script.
    assert bin_paths_for(agent_image(), tmp_path)["kustos"].is_file()


def test_an_etcd_image_maps_to_links_to_its_built_binaries(tmp_path: Path) -> None:
    paths = bin_paths_for(ETCD, tmp_path, SCRIPTS)

    assert set(paths) == {"etcd", "etcdctl", "etcdutl"}
    assert {p.parent for p in paths.values()} == {tmp_path / "etcd-v3.6.16"}
    assert paths["etcdctl"].readlink() == binary_path("etcdctl", "v3.6.16")


def test_an_image_that_is_not_allow_listed_maps_to_nothing(tmp_path: Path) -> None:
    assert bin_paths_for("nginx:1.27", tmp_path, SCRIPTS) == {}
    assert bin_paths_for("ghcr.io/kustos/kustos", tmp_path, SCRIPTS) == {}


# ---- invocations ----------------------------------------------------------------------


def _agent(**fields: Any) -> dict[str, Any]:
    return {"name": "agent", "image": agent_image(), **fields}


def test_the_kustos_command_runs_the_local_script_with_rewritten_paths(tmp_path: Path) -> None:
    container = _agent(command=["kustos", "crds", "--write", "/work/crds"])

    invocation = build_invocation(
        _pod(agent_image()), container, {"kustos": SCRIPTS / "kustos"}, {"/work": tmp_path}, {}
    )

    assert invocation.argv == [str(SCRIPTS / "kustos"), "crds", "--write", f"{tmp_path}/crds"]
    assert invocation.env["PATH"].split(":")[0] == str(SCRIPTS)


def test_an_absolute_kustos_path_runs_the_local_script_too() -> None:
    container = _agent(command=["/usr/local/bin/kustos"], args=["--help"])

    invocation = build_invocation(_pod(agent_image()), container, {"kustos": SCRIPTS / "kustos"}, {}, {})

    assert invocation.argv == [str(SCRIPTS / "kustos"), "--help"]


def test_a_container_without_a_command_runs_kustos_with_its_args() -> None:
    container = _agent(args=["etcd", "snapshot", "--endpoint=http://127.9.1.4:2379"])

    invocation = build_invocation(_pod(agent_image()), container, {"kustos": SCRIPTS / "kustos"}, {}, {})

    assert invocation.argv == [
        str(SCRIPTS / "kustos"),
        "etcd",
        "snapshot",
        "--endpoint=http://127.9.1.4:2379",
    ]


def test_each_container_of_a_mixed_pod_gets_its_own_image_executables(tmp_path: Path) -> None:
    pod = _pod(ETCD, agent_image())
    etcd, agent = pod["spec"]["containers"]
    etcd["args"] = ["--name=solo"]
    agent["args"] = ["--help"]

    argv = {
        c["name"]: build_invocation(pod, c, bin_paths_for(c["image"], tmp_path, SCRIPTS), {}, {}).argv
        for c in (etcd, agent)
    }

    assert argv == {
        "c0": [str(tmp_path / "etcd-v3.6.16" / "etcd"), "--name=solo"],
        "c1": [str(SCRIPTS / "kustos"), "--help"],
    }
