"""The dev cluster's pod network: range choice, names, and what a pod's namespaces get."""

from __future__ import annotations

import ipaddress
from pathlib import Path

import pytest

from kustos.devcluster.cluster import corefile_text
from kustos.devcluster.network import (
    ClusterNetwork,
    NetworkError,
    enter_pod_argv,
    hosts_file,
    operator_argv,
    pick_range,
    resolv_conf,
)


def net(cidr: str) -> ipaddress.IPv4Network:
    return ipaddress.IPv4Network(cidr)


def test_the_range_overlaps_no_host_route_and_no_other_cluster() -> None:
    routes = [net("10.64.0.0/16"), net("10.65.3.0/24"), net("192.0.2.0/24")]
    taken = [net("10.66.0.0/16")]

    assert pick_range(taken, routes) == net("10.67.0.0/16")


def test_a_host_route_covering_all_of_10_8_leaves_no_range() -> None:
    with pytest.raises(NetworkError, match="no free private /16"):
        pick_range([], [net("10.0.0.0/8")])


def test_the_service_range_is_never_a_pod_range() -> None:
    routes = [net(f"10.{o}.0.0/16") for o in range(64, 96)]

    assert pick_range([], routes) == net("10.97.0.0/16")


def test_nodes_get_consecutive_slash_24s_and_the_bridge_holds_the_gateway() -> None:
    network = ClusterNetwork("kustos", net("10.70.0.0/16"))

    assert network.gateway == "10.70.0.1"
    assert network.node_cidr(1) == "10.70.1.0/24"
    assert network.node_cidr(4) == "10.70.4.0/24"
    with pytest.raises(ValueError, match="out of range"):
        network.node_cidr(0)


def test_two_clusters_never_share_a_link_or_namespace_name() -> None:
    a = ClusterNetwork("pytest-1", net("10.70.0.0/16"))
    b = ClusterNetwork("pytest-10", net("10.71.0.0/16"))
    uid = "0b5e6a1c-2f6e-4c8e-9a57-3f1b1d2c3e4f"

    assert a.bridge != b.bridge and a.veth(uid) != b.veth(uid)
    assert not a.netns(uid).startswith(b.netns_prefix) and not b.netns(uid).startswith(a.netns_prefix)
    # Linux link names stop at 15 characters.
    assert len(a.bridge) <= 15 and len(a.veth(uid)) <= 15


def test_the_network_round_trips_through_its_state_file(tmp_path: Path) -> None:
    network = ClusterNetwork("kustos", net("10.70.0.0/16"))
    (tmp_path / "network.json").write_text(network.to_json())

    assert ClusterNetwork.from_file(tmp_path / "network.json") == network


def test_a_pod_gets_its_namespace_link_and_address_and_no_default_route() -> None:
    network = ClusterNetwork("kustos", net("10.70.0.0/16"))
    commands = [" ".join(c) for c in network.pod_up_commands("uid-1", "10.70.2.7")]

    assert f"ip netns add {network.netns('uid-1')}" in commands
    assert any(f"master {network.bridge}" in c for c in commands)
    assert any("addr add 10.70.2.7/16 dev eth0" in c for c in commands)
    assert not any("route" in c for c in commands)


def test_resolv_conf_is_what_a_kubelet_writes_for_cluster_first() -> None:
    assert resolv_conf("team-a", "10.70.0.1") == (
        "search team-a.svc.cluster.local svc.cluster.local cluster.local\n"
        "nameserver 10.70.0.1\noptions ndots:5\n"
    )


def test_hosts_file_names_the_pod_by_hostname_and_subdomain_fqdn() -> None:
    text = hosts_file("10.70.2.7", "etcd-0", "etcd", "team-a")

    assert "127.0.0.1\tlocalhost" in text
    assert "10.70.2.7\tetcd-0.etcd.team-a.svc.cluster.local etcd-0\n" in text
    assert hosts_file("10.70.2.7", "solo", None, "team-a").endswith("10.70.2.7\tsolo\n")


def test_a_container_enters_the_pod_network_then_private_mount_and_uts_namespaces() -> None:
    argv = enter_pod_argv(
        "kustos-x-uid", Path("/p/resolv.conf"), Path("/p/hosts"), "etcd-0", None, ["etcd", "--name=a"]
    )

    assert argv[:2] == ["nsenter", "--net=/run/netns/kustos-x-uid"]
    assert "unshare" in argv and "--mount" in argv and "--uts" in argv
    assert argv[-6:] == ["/p/resolv.conf", "/p/hosts", "etcd-0", "", "etcd", "--name=a"]


def test_the_operator_keeps_the_host_network_but_resolves_through_the_cluster_dns() -> None:
    argv = operator_argv(Path("/s/resolv.conf"), ["kustos", "run"])

    assert argv[0] == "unshare" and "--net" not in " ".join(argv[:4])
    assert argv[-3:] == ["/s/resolv.conf", "kustos", "run"]


def test_coredns_serves_only_the_cluster_zones_on_the_gateway() -> None:
    text = corefile_text("10.70.0.1", Path("/s/kubeconfig.yaml"))

    assert text.startswith("cluster.local in-addr.arpa ip6.arpa:53 {")
    assert "bind 10.70.0.1" in text and "kubeconfig /s/kubeconfig.yaml" in text
    assert "forward" not in text and "rcode NXDOMAIN" in text  # other names never leave the machine
