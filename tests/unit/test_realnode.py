"""Real nodes' configuration and images: pure functions, checked without starting anything."""

from __future__ import annotations

import hashlib
import io
import ipaddress
import json
import tarfile
import tomllib
from pathlib import Path

import pytest
import yaml

from kustos.devcluster.kwokconfig import _UPSTREAM_STAGES, Timings, kwokctl_config
from kustos.devcluster.network import SERVICE_CIDR, ClusterNetwork
from kustos.devcluster.nodeimages import etcd_image
from kustos.devcluster.ociarchive import CONTAINERD_NAME_ANNOTATION, ImageFile, ImageSpec, write_archive
from kustos.devcluster.realnode import FIRST_REAL_INDEX, real_node

NETWORK = ClusterNetwork("c1", ipaddress.IPv4Network("10.77.0.0/16"))


def test_real_nodes_have_their_own_names_directories_ranges_and_cgroups(tmp_path: Path) -> None:
    one, two = real_node("c1", tmp_path, 1), real_node("c1", tmp_path, 2)

    assert (one.name, two.name) == ("c1-real-1", "c1-real-2")
    assert one.directory == tmp_path / "real" / "1"
    assert one.index == FIRST_REAL_INDEX + 1
    assert one.cgroup_root != two.cgroup_root
    assert NETWORK.node_cidr(one.index) != NETWORK.node_cidr(two.index)
    assert real_node("c2", tmp_path, 1).cgroup_root != one.cgroup_root


@pytest.mark.parametrize("index", [0, 55])
def test_a_real_node_index_out_of_the_networks_range_is_refused(tmp_path: Path, index: int) -> None:
    with pytest.raises(ValueError, match="real node index"):
        real_node("c1", tmp_path, index)


def test_containerd_is_private_to_its_node_and_restricts_oom_scores(tmp_path: Path) -> None:
    node = real_node("c1", tmp_path, 1)
    config = tomllib.loads(node.containerd_config("kustos.dev/pause:v1"))
    runtime = config["plugins"]["io.containerd.cri.v1.runtime"]

    assert config["version"] == 3
    for path in (config["root"], config["state"], config["grpc"]["address"], config["ttrpc"]["address"]):
        assert path.startswith(str(node.directory))
    assert runtime["restrict_oom_score_adj"] is True
    assert config["plugins"]["io.containerd.nri.v1.nri"]["disable"] is True
    assert runtime["cni"]["conf_dir"] == str(node.cni_conf_dir)
    options = runtime["containerd"]["runtimes"]["runc"]["options"]
    assert options["SystemdCgroup"] is False
    assert options["BinaryName"] == str(node.bin_dir / "runc")
    pinned = config["plugins"]["io.containerd.cri.v1.images"]["pinned_images"]
    assert pinned["sandbox"] == "kustos.dev/pause:v1"
    # Unix socket paths stop at 107 bytes.
    assert len(str(node.containerd_socket)) < 100


def test_the_kubelet_fits_a_cgroup_v1_host_without_cap_sys_resource(tmp_path: Path) -> None:
    node = real_node("c1", tmp_path, 1)
    config = node.kubelet_config(NETWORK, tmp_path / "ca.crt", (10250, 10248))

    assert config["failCgroupV1"] is False
    assert config["cgroupDriver"] == "cgroupfs"
    assert config["cgroupRoot"] == node.cgroup_root
    assert config["oomScoreAdj"] == 0
    assert config["clusterDNS"] == [NETWORK.gateway]
    assert config["authentication"]["x509"]["clientCAFile"] == str(tmp_path / "ca.crt")
    assert config["containerRuntimeEndpoint"] == f"unix://{node.containerd_socket}"


def test_pods_get_addresses_of_their_nodes_range_on_the_clusters_bridge(tmp_path: Path) -> None:
    node = real_node("c1", tmp_path, 3)
    bridge, portmap = node.cni_config(NETWORK)["plugins"]
    [[pool]] = bridge["ipam"]["ranges"]
    node_range = ipaddress.ip_network(NETWORK.node_cidr(node.index))

    assert bridge["bridge"] == NETWORK.bridge
    assert pool["subnet"] == str(NETWORK.cidr)
    assert ipaddress.ip_address(pool["rangeStart"]) in node_range
    assert ipaddress.ip_address(pool["rangeEnd"]) in node_range
    assert pool["gateway"] == NETWORK.gateway
    assert bridge["ipam"]["routes"] == [{"dst": SERVICE_CIDR, "gw": NETWORK.gateway}]
    assert bridge["ipam"]["dataDir"].startswith(str(node.directory))
    assert portmap["type"] == "portmap"


def test_the_api_server_reaches_kubelets_at_their_internal_ip_with_a_client_certificate(
    tmp_path: Path,
) -> None:
    # kwok's stages as its module ships them, reduced to what the config reads.
    for rel in _UPSTREAM_STAGES:
        kind = "Node" if "/node/" in rel else "Pod"
        name = Path(rel).stem
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(yaml.safe_dump({"metadata": {"name": name},
                                    "spec": {"resourceRef": {"kind": kind}, "next": {}}}))  # fmt: skip
    config = kwokctl_config(Timings(), tmp_path, 1, network=NETWORK,
                            kubelet_client=(tmp_path / "a.crt", tmp_path / "a.key"))  # fmt: skip
    [apiserver] = [p for p in config[0]["componentsPatches"] if p["name"] == "kube-apiserver"]
    args = {a["key"]: a["value"] for a in apiserver["extraArgs"]}

    assert args["kubelet-preferred-address-types"] == "InternalIP,Hostname"
    # Appended (an override that matches no flag of kwokctl's is dropped).
    [service_range] = [a for a in apiserver["extraArgs"] if a["key"] == "service-cluster-ip-range"]
    assert service_range == {"key": "service-cluster-ip-range", "value": SERVICE_CIDR}
    # Pods on real nodes verify the API server at the kubernetes Service's ClusterIP.
    assert config[0]["options"]["kubeApiserverCertSANs"] == [NETWORK.gateway, "10.96.0.1"]
    assert args["kubelet-client-certificate"] == str(tmp_path / "a.crt")
    assert args["kubelet-client-key"] == str(tmp_path / "a.key")


def test_etcd_images_carry_the_default_repositorys_name_and_tag() -> None:
    assert etcd_image("v3.7.3") == "gcr.io/etcd-development/etcd:v3.7.3"


# ---- OCI archives -------------------------------------------------------------------------


def _archive(tmp_path: Path, name: str = "example.org/tool:v1") -> tuple[Path, str]:
    program = tmp_path / "tool"
    program.write_bytes(b"#!/bin/sh\necho hi\n")
    spec = ImageSpec(name, [ImageFile("/usr/local/bin/tool", program)], entrypoint=("/usr/local/bin/tool",),
                     user="65532")  # fmt: skip
    target = tmp_path / "out" / "tool.tar"
    return target, write_archive(spec, target)


def _member(tar: tarfile.TarFile, name: str) -> bytes:
    handle = tar.extractfile(name)
    assert handle is not None
    return handle.read()


def test_an_archive_names_its_image_for_containerd_and_holds_the_files(tmp_path: Path) -> None:
    target, digest = _archive(tmp_path)

    with tarfile.open(target) as tar:
        index = json.loads(_member(tar, "index.json"))
        [entry] = index["manifests"]
        assert entry["digest"] == digest
        assert entry["annotations"][CONTAINERD_NAME_ANNOTATION] == "example.org/tool:v1"
        assert entry["platform"] == {"architecture": "amd64", "os": "linux"}
        manifest = json.loads(_member(tar, f"blobs/sha256/{digest.split(':')[1]}"))
        [layer] = manifest["layers"]
        layer_bytes = _member(tar, f"blobs/sha256/{layer['digest'].split(':')[1]}")
        assert "sha256:" + hashlib.sha256(layer_bytes).hexdigest() == layer["digest"]
        config = json.loads(_member(tar, f"blobs/sha256/{manifest['config']['digest'].split(':')[1]}"))
        assert config["config"]["Entrypoint"] == ["/usr/local/bin/tool"]
        assert config["config"]["User"] == "65532"
        assert config["rootfs"]["diff_ids"] == [layer["digest"]]
    with tarfile.open(fileobj=io.BytesIO(layer_bytes)) as layer_tar:
        tool = layer_tar.getmember("usr/local/bin/tool")
        assert (tool.mode, tool.uid) == (0o755, 0)
        assert layer_tar.getmember("tmp").mode == 0o1777
        assert {"usr", "usr/local", "usr/local/bin"} <= set(layer_tar.getnames())


def test_archives_are_reproducible(tmp_path: Path) -> None:
    _, first = _archive(tmp_path)
    _, second = _archive(tmp_path)

    assert first == second


@pytest.mark.parametrize("name", ["example.org/tool", "example.org:5000/tool"])
def test_an_image_without_a_tag_is_refused(tmp_path: Path, name: str) -> None:
    with pytest.raises(ValueError, match="has no tag"):
        ImageSpec(name, [])
