"""The pure parts of a purge: kubeadm's endpoints and etcd layout, Rook's lists, the CLI's spec."""

from __future__ import annotations

from pathlib import Path

import pytest
import typer
import yaml

from kustos.etcd import kubeadm
from kustos.maintenance import purge_planner as pp
from kustos.maintenance import rook
from kustos.maintenance.purge import PurgeOptions, node_view
from kustos.maintenance.purge_cli import load_spec, with_flags
from kustos.runtime.errors import ReconcileError

CLUSTER_STATUS = """\
apiEndpoints:
  cp-1:
    advertiseAddress: 10.0.0.1
    bindPort: 6443
  cp-2:
    advertiseAddress: 10.0.0.2
    bindPort: 6443
apiVersion: kubeadm.k8s.io/v1beta2
kind: ClusterStatus
"""


def config_map(status: str | None = CLUSTER_STATUS, external: bool = False) -> dict[str, object]:
    etcd = (
        {"external": {"endpoints": ["https://e:2379"]}}
        if external
        else {"local": {"dataDir": "/var/lib/etcd"}}
    )
    data = {"ClusterConfiguration": yaml.safe_dump({"etcd": etcd})}
    if status is not None:
        data["ClusterStatus"] = status
    return {"metadata": {"name": "kubeadm-config", "resourceVersion": "7"}, "data": data}


def apiserver(node: str, endpoint: str) -> dict[str, object]:
    return {
        "metadata": {"annotations": {kubeadm.APISERVER_ENDPOINT_ANNOTATION: endpoint}},
        "spec": {"nodeName": node},
    }


def node(name: str, ip: str, control_plane: bool = True) -> dict[str, object]:
    labels = {"node-role.kubernetes.io/control-plane": ""} if control_plane else {}
    return {
        "metadata": {"name": name, "labels": labels},
        "status": {"addresses": [{"type": "InternalIP", "address": ip}]},
    }


def test_hosts_of_endpoints_and_urls() -> None:
    assert kubeadm.host_of("10.0.0.1:6443") == "10.0.0.1"
    assert kubeadm.host_of("[fd00::1]:6443") == "fd00::1"
    assert kubeadm.url_host("https://10.0.0.1:2380") == "10.0.0.1"
    assert kubeadm.client_url("fd00::1") == "https://[fd00::1]:2379"
    assert kubeadm.peer_url("10.0.0.3") == "https://10.0.0.3:2380"


def test_cluster_status_endpoints_and_removal() -> None:
    cm = config_map()
    assert kubeadm.cluster_status_endpoints(cm) == {"cp-1": "10.0.0.1", "cp-2": "10.0.0.2"}
    text = kubeadm.without_node(cm, "cp-1")
    assert text is not None and "cp-1" not in text and "cp-2" in text and "ClusterStatus" in text
    assert kubeadm.without_node(cm, "cp-9") is None
    assert kubeadm.cluster_status_endpoints(config_map(None)) is None


def test_external_etcd_is_read_from_the_cluster_configuration() -> None:
    assert kubeadm.external_etcd(config_map(external=True))
    assert not kubeadm.external_etcd(config_map())
    assert not kubeadm.external_etcd(None)


def test_addresses_prefer_cluster_status_then_the_apiserver_annotation_then_the_node() -> None:
    pods = [apiserver("cp-2", "10.0.1.2:6443"), apiserver("cp-3", "10.0.1.3:6443")]
    nodes = [node("cp-3", "192.168.0.3"), node("cp-4", "192.168.0.4"), node("w-1", "192.168.1.1", False)]
    where = kubeadm.addresses("cp-1", config_map(), pods, nodes)
    assert where.dead == "10.0.0.1" and where.source == "ClusterStatus"
    assert where.remaining == ("10.0.0.2", "10.0.1.3", "192.168.0.4")  # no worker
    where = kubeadm.addresses("cp-3", config_map(None), pods, nodes)
    assert where.dead == "10.0.1.3" and where.source == "apiserver pod"
    where = kubeadm.addresses("cp-4", None, [], nodes)
    assert where.dead == "192.168.0.4" and where.source == "Node"
    assert where.remaining == ("192.168.0.3",)


def test_steps_by_role_and_rook() -> None:
    worker, control = node_view(node("w", "1.1.1.1", False)), node_view(node("c", "1.1.1.2"))
    assert pp.steps_for(worker, False) == ("Node",)
    assert pp.steps_for(control, False) == ("Address", "ControlPlaneEndpoint", "EtcdMember", "Node")
    assert pp.steps_for(control, True) == pp.STEPS
    assert pp.steps_for(None, False) == ()


def test_rook_storage_nodes_and_osd_deployments() -> None:
    cluster = {"spec": {"storage": {"nodes": [{"name": "a"}, {"name": "b"}]}}}
    assert rook.storage_nodes_without(cluster, "a") == [{"name": "b"}]
    assert rook.storage_nodes_without(cluster, "c") is None
    deployment = {
        "metadata": {"labels": {"ceph-osd-id": "4"}},
        "spec": {"template": {"spec": {"nodeSelector": {"kubernetes.io/hostname": "a"}}}},
    }
    assert rook.osd_of(deployment, "a") == "4"
    assert rook.osd_of(deployment, "b") is None
    assert pp.ceph_commands(["4"], "a") == [
        ["ceph", "osd", "down", "osd.4"],
        ["ceph", "osd", "purge", "4", "--yes-i-really-mean-it"],
        ["ceph", "osd", "crush", "rm", "a"],
    ]


def test_the_cli_reads_a_policy_or_its_spec_and_flags_override(tmp_path: Path) -> None:
    whole = tmp_path / "policy.yaml"
    whole.write_text(
        "kind: MaintenancePolicy\nspec:\n  minReadyMasterNodeCount: 3\n  rookShouldUseAllNodes: true\n"
    )
    spec = load_spec(whole)
    assert spec.min_ready_master_node_count == 3
    bare = tmp_path / "spec.yaml"
    bare.write_text("minReadyWorkerNodeCount: 2\n")
    assert load_spec(bare).min_ready_worker_node_count == 2
    changed = with_flags(spec, Path("/pki"), 1, 4, True)
    assert (changed.certificates_dir, changed.min_ready_master_node_count) == ("/pki", 1)
    assert changed.min_ready_worker_node_count == 4 and changed.rook_should_use_all_nodes is False
    assert PurgeOptions.from_spec(changed).maintain_rook
    assert load_spec(None).min_ready_master_node_count == 2


def test_a_bad_config_names_the_field(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("minReadyMasterNodeCount: -1\n")
    with pytest.raises(typer.BadParameter, match=r"minReadyMasterNodeCount|min_ready_master_node_count"):
        load_spec(bad)


def test_purge_node_is_one_command_in_kustos_and_the_kubectl_plugin() -> None:
    from typer.testing import CliRunner

    from kustos import cli, kubectl_plugin

    for app in (cli.app, kubectl_plugin.app):
        result = CliRunner().invoke(app, ["purge-node", "--help"], env={"COLUMNS": "200"})
        assert result.exit_code == 0, result.output
        for flag in ("--certificates_dir", "--min_ready_master_nodes", "--min_ready_worker_nodes",
                     "--maintain_rook_storage_nodes", "--config", "--yes", "--force"):  # fmt: skip
            assert flag in result.output, flag


async def test_the_kubectl_toolbox_execs_ceph_in_the_running_toolbox_pod(tmp_path: Path) -> None:
    """The exec boundary faked: a kubectl that records its arguments."""
    import httpx2

    from kustos.runtime.api import Api

    record = tmp_path / "calls"
    kubectl = tmp_path / "kubectl"
    kubectl.write_text(f'#!/bin/sh\necho "$@" >> {record}\necho ok\n')
    kubectl.chmod(0o755)
    old = _pod("tools-old", "n")
    old["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"  # type: ignore[index]
    pods = {"items": [old, _pod("tools-1", "n")]}

    def answer(request: httpx2.Request) -> httpx2.Response:
        if request.url.path == "/api/v1/nodes/n":
            return httpx2.Response(200, json=_node("n"))
        assert request.url.params["labelSelector"] == rook.TOOLBOX_SELECTOR
        return httpx2.Response(200, json=pods)

    api = Api(httpx2.AsyncClient(transport=httpx2.MockTransport(answer), base_url="https://k8s"))
    toolbox = rook.KubectlToolbox(api, "rook-ceph", str(kubectl), "/kc", None)
    code, out, _ = await toolbox.run(["ceph", "osd", "purge", "3", "--yes-i-really-mean-it"])
    assert (code, out.strip()) == (0, "ok")
    assert record.read_text().split() == [
        "--kubeconfig", "/kc", "exec", "-n", "rook-ceph", "tools-1", "--", "ceph", "osd", "purge", "3",
        "--yes-i-really-mean-it",
    ]  # fmt: skip
    pods["items"] = []
    code, _, err = await toolbox.run(["ceph", "status"])
    assert code == 127 and "no Ready pod labelled app=rook-ceph-tools on a Ready node" in err


def test_a_volume_is_pinned_only_by_one_required_hostname() -> None:
    from kustos.maintenance.controller import pinned_node

    def volume(*terms: dict[str, object]) -> dict[str, object]:
        return {"spec": {"nodeAffinity": {"required": {"nodeSelectorTerms": list(terms)}}}}

    one = {"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In", "values": ["w-1"]}]}
    assert pinned_node(volume(one)) == "w-1"
    two = {
        "matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In", "values": ["w-1", "w-2"]}]
    }
    assert pinned_node(volume(two)) is None
    zone = {"matchExpressions": [{"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["a"]}]}
    assert pinned_node(volume(zone)) is None
    assert pinned_node(volume(one, one)) is None  # either of two terms: not one node
    assert pinned_node({"spec": {}}) is None
    assert pinned_node(None) is None


async def test_a_ceph_command_that_could_not_run_is_said_and_stops_the_purge_unless_it_is_down() -> None:
    """An exec refused (403) or timed out is a ReconcileError: said as the command's failure, not
    raised; only `ceph osd down` may fail and the purge go on (a dead node's OSDs are down)."""

    class Refusing:
        async def run(self, argv: list[str]) -> tuple[int, str, str]:
            raise ReconcileError("exec in pod rook-ceph/tools: HTTP 403: forbidden", "Forbidden")

    clause, go_on = await rook.run_one(Refusing(), ["ceph", "osd", "down", "osd.4"])
    assert (
        go_on
        and clause == "ceph osd down osd.4: failed (-1: exec in pod rook-ceph/tools: HTTP 403: forbidden)"
    )
    clause, go_on = await rook.run_one(Refusing(), ["ceph", "osd", "purge", "4", "--yes-i-really-mean-it"])
    assert not go_on and "HTTP 403: forbidden" in clause


async def test_the_api_toolbox_finds_no_running_toolbox_pod() -> None:
    import httpx2

    from kustos.runtime.api import Api
    from kustos.runtime.kubeconfig import KubeAccess

    pods = {"items": [
        {"metadata": {"name": "tools-old", "deletionTimestamp": "2026-01-01T00:00:00Z"},
         "status": {"containerStatuses": [{"state": {"running": {}}}]}},
    ]}  # fmt: skip

    def answer(request: httpx2.Request) -> httpx2.Response:
        assert request.url.params["labelSelector"] == rook.TOOLBOX_SELECTOR
        return httpx2.Response(200, json=pods)

    api = Api(httpx2.AsyncClient(transport=httpx2.MockTransport(answer), base_url="https://k8s"))
    config = KubeAccess(server="https://k8s")
    assert await rook.toolbox_pod(api, "rook-ceph") is None
    code, _, err = await rook.ApiToolbox(api, config, "rook-ceph").run(["ceph", "status"])
    assert code == 127 and "no Ready pod labelled app=rook-ceph-tools on a Ready node in rook-ceph" in err


def _pod(name: str, node: str, ready: bool = True, running: bool = True) -> dict[str, object]:
    return {
        "metadata": {"name": name, "labels": {"app": "rook-ceph-tools"}},
        "spec": {"nodeName": node},
        "status": {
            "phase": "Running" if running else "Pending",
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
            "containerStatuses": [{"ready": ready, "state": {"running": {}} if running else {"waiting": {}}}],
        },
    }


def _node(name: str, ready: bool = True, annotations: dict[str, str] | None = None) -> dict[str, object]:
    return {
        "metadata": {"name": name, "uid": f"uid-{name}", "annotations": dict(annotations or {})},
        "status": {"conditions": [{"type": "Ready", "status": "True" if ready else "Unknown"}]},
    }


def _fake_api(pods: list[dict[str, object]], nodes: dict[str, dict[str, object]]) -> object:
    """The API server at its HTTP boundary: pods listed, Nodes got, annotations merge-patched."""
    import json as jsonlib

    import httpx2

    from kustos.runtime.api import Api

    def answer(request: httpx2.Request) -> httpx2.Response:
        path = request.url.path
        if path.endswith("/pods"):
            return httpx2.Response(200, json={"items": pods})
        name = path.rsplit("/", 1)[-1]
        if path.startswith("/api/v1/nodes/"):
            node = nodes.get(name)
            if node is None:
                return httpx2.Response(404, json={"kind": "Status", "code": 404, "reason": "NotFound"})
            if request.method == "PATCH":
                patch = jsonlib.loads(request.content)
                annotations = node["metadata"]["annotations"]  # type: ignore[index]
                for key, value in patch["metadata"]["annotations"].items():
                    if value is None:
                        annotations.pop(key, None)
                    else:
                        annotations[key] = value
            if request.method == "DELETE":
                nodes.pop(name)
            return httpx2.Response(200, json=node)
        raise AssertionError(f"unexpected {request.method} {path}")

    return Api(httpx2.AsyncClient(transport=httpx2.MockTransport(answer), base_url="https://k8s"))


async def test_the_toolbox_chosen_is_ready_on_a_ready_node() -> None:
    """The toolbox pod on the node being purged still says Running: it is never chosen."""
    from kustos.runtime.api import Api

    nodes = {"dead": _node("dead", ready=False), "live": _node("live")}
    pods = [_pod("a-on-dead", "dead"), _pod("b-not-ready", "live", ready=False), _pod("c-good", "live")]
    api = _fake_api(pods, nodes)
    assert isinstance(api, Api)
    assert await rook.toolbox_pod(api, "rook-ceph") == "c-good"
    pods.pop()
    assert await rook.toolbox_pod(api, "rook-ceph") is None
    assert rook.usable_toolboxes([_pod("x", "gone")], []) == []


async def test_the_ceph_purge_runs_one_command_per_pass_its_progress_on_the_node() -> None:
    """Each pass runs at most one Ceph command (each bounded by the exec timeout), so a pass stays
    well under the controller's timeout; a restarted purge goes on from the recorded count."""
    from kustos.maintenance.purge import CEPH_ANNOTATION, OSDS_ANNOTATION, Purger
    from kustos.runtime.api import Api

    done = {"kustos.dev/purge": "RookStorageNode,RookOSDDeployment", OSDS_ANNOTATION: "3,7"}
    nodes = {"w": _node("w", ready=False, annotations=done)}
    api = _fake_api([], nodes)
    assert isinstance(api, Api)
    ran: list[list[str]] = []

    class Toolbox:
        async def run(self, argv: list[str]) -> tuple[int, str, str]:
            ran.append(list(argv))
            return 0, "", ""

    purger = Purger(api, PurgeOptions(maintain_rook=True), toolbox=Toolbox())
    first = await purger.next("w")
    assert ran == [["ceph", "osd", "down", "osd.3"]]
    assert first.step == "CephOSDPurge" and first.message == "ceph osd down osd.3: ok (1/5)"
    assert nodes["w"]["metadata"]["annotations"][CEPH_ANNOTATION] == "1"  # type: ignore[index]
    # A new Purger (a restarted operator) goes on from the Node's record.
    purger = Purger(api, PurgeOptions(maintain_rook=True), toolbox=Toolbox())
    for _ in range(4):
        before = len(ran)
        outcome = await purger.next("w")
        assert len(ran) == before + 1 and outcome.step == "CephOSDPurge"
    assert ran[1:] == [
        ["ceph", "osd", "purge", "3", "--yes-i-really-mean-it"],
        ["ceph", "osd", "down", "osd.7"],
        ["ceph", "osd", "purge", "7", "--yes-i-really-mean-it"],
        ["ceph", "osd", "crush", "rm", "w"],
    ]
    annotations = nodes["w"]["metadata"]["annotations"]  # type: ignore[index]
    assert CEPH_ANNOTATION not in annotations and annotations["kustos.dev/purge"].endswith(",CephOSDPurge")
    last = await purger.next("w")
    assert last.finished and len(ran) == 5


async def test_etcd_client_certificates_missing_from_the_directory_are_named(tmp_path: Path) -> None:
    """Both stacked-etcd callers (purge, NodeImage) get this check from the one module now."""
    (tmp_path / "etcd").mkdir()
    (tmp_path / "etcd" / "ca.crt").write_text("ca")
    with pytest.raises(ReconcileError) as caught:
        async with kubeadm.client_tls(None, tmp_path):  # type: ignore[arg-type]  # no Secret: no API call
            pass
    assert caught.value.reason == "EtcdCertificatesMissing"
    assert "healthcheck-client.crt" in caught.value.message and "ca.crt" not in caught.value.message
    async with kubeadm.client_tls(None, tmp_path, scheme="http") as tls:  # type: ignore[arg-type]
        assert tls is None  # plain http: no certificates asked for


async def test_without_a_toolbox_or_when_a_ceph_command_fails_the_purge_waits() -> None:
    """Neither is done: a Node deleted while Ceph still counts its OSDs leaves them in the map.
    Only `ceph osd down` may fail (a dead node's OSDs are down already) and the purge go on."""
    from kustos.maintenance.purge import CEPH_ANNOTATION, OSDS_ANNOTATION, Purger
    from kustos.runtime.api import Api

    done = {"kustos.dev/purge": "RookStorageNode,RookOSDDeployment", OSDS_ANNOTATION: "3"}
    nodes = {"w": _node("w", ready=False, annotations=done)}
    api = _fake_api([], nodes)
    assert isinstance(api, Api)
    waiting = await Purger(api, PurgeOptions(maintain_rook=True)).next("w")
    assert waiting.refused and "ceph osd purge 3 --yes-i-really-mean-it" in waiting.message
    annotations: dict[str, str] = nodes["w"]["metadata"]["annotations"]  # type: ignore[index]
    assert annotations["kustos.dev/purge"] == "RookStorageNode,RookOSDDeployment"  # not done

    class Failing:
        async def run(self, argv: list[str]) -> tuple[int, str, str]:
            return (
                (1, "", "Error EBUSY: osd.3 is still up") if argv[2] == "purge" else (1, "", "already down")
            )

    purger = Purger(api, PurgeOptions(maintain_rook=True), toolbox=Failing())
    down = await purger.next("w")
    assert not down.refused and down.message.startswith("ceph osd down osd.3: failed")
    refused = await purger.next("w")
    assert refused.refused and "EBUSY" in refused.message
    assert annotations[CEPH_ANNOTATION] == "1"  # the purge command runs again on the next pass
    assert "CephOSDPurge" not in annotations["kustos.dev/purge"]
