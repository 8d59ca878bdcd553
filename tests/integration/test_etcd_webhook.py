"""EtcdCluster validating admission (F-OPS-2) through the real API server: a `kustos run`
serves kustos.etcd.webhook over TLS and keeps its configuration current; kubectl writes are
refused with a message that names the field, and valid ones pass.

The webhooks are registered here with --extra-controllers (as etcd/controller.py's register()
will once it serves them), and no controller runs: what is tested is admission alone.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from kustos.devcluster.cluster import DevClusterError
from tests.integration.conftest import Kubectl
from tests.integration.etcd_support import etcd_cluster
from tests.integration.kube import wait_until
from tests.integration.operator import OperatorProcess, start_operator


@pytest.fixture
def admission(crds: None, kubectl: Kubectl, tmp_path: Path) -> Iterator[OperatorProcess]:
    configuration = f"kustos-{kubectl.namespace}"
    process = start_operator(
        kubectl.cluster, tmp_path / "operator",
        "--namespace", kubectl.namespace, "--lease-namespace", kubectl.namespace,
        "--webhook-configuration-name", configuration,
        controllers="kustos.etcd.webhook:register",
    )  # fmt: skip
    try:
        yield process
    finally:
        process.stop()
        kubectl.cluster.kubectl(
            "delete", "validatingwebhookconfiguration", configuration, "--ignore-not-found"
        )


async def configured(kubectl: Kubectl) -> None:
    name = f"kustos-{kubectl.namespace}"

    async def present() -> bool:
        found = kubectl.cluster.kubectl(
            "get", "validatingwebhookconfiguration", name, "-o", "jsonpath={.webhooks[*].name}", check=False
        )
        return "guard.etcdcluster.kustos.dev" in found and "version.etcdcluster.kustos.dev" in found

    await wait_until(present, "the EtcdCluster webhook configuration", timeout=30)


def refused(kubectl: Kubectl, field: str, *args: str, document: dict[str, object] | None = None) -> str:
    def write() -> None:
        if document is not None:
            kubectl.apply(document)
        else:
            kubectl(*args)

    with pytest.raises(DevClusterError) as caught:
        write()
    message = str(caught.value)
    # What would strand data is refused by the CRD's CEL rules before admission runs ("is
    # invalid"); what CEL cannot say, by the webhook ("denied the request").
    assert ("denied the request" in message or "is invalid" in message) and field in message, message
    return message


async def test_bad_creates_are_refused_naming_the_field(kubectl: Kubectl, admission: OperatorProcess) -> None:
    await configured(kubectl)
    message = refused(
        kubectl, "spec.extraArgs",
        document=etcd_cluster("args", 3, extraArgs=["--quota-backend-bytes=1073741824", "--data-dir=/x"]),
    )  # fmt: skip
    assert "cannot set a flag the operator sets" in message or "--data-dir is set by the operator" in message
    refused(kubectl, "spec.version", document=etcd_cluster("old", 3, version="3.4.27"))
    # A flag etcd 3.7 removed would crash every member: refused by CEL (which names the field)
    # or the guard (which names the entry and its replacement), whichever answers first.
    message = refused(
        kubectl, "spec.extraArgs",
        document=etcd_cluster("gone", 3, version="3.7.3", extraArgs=["--experimental-memory-mlock"]),
    )  # fmt: skip
    assert "etcd 3.7 removed" in message or "use --memory-mlock instead" in message
    # The tag comes from spec.version: a repository with one is refused by the schema.
    refused(
        kubectl,
        "spec.repository",
        document=etcd_cluster("tagged", 3, repository="quay.io/coreos/etcd:v3.7.3"),
    )
    assert not kubectl("get", "etcdclusters", "-o", "name")
    # On 3.6 the same flag is still etcd's (deprecated), so it is admitted.
    kubectl.apply(etcd_cluster("on36", 3, version="3.6.16", extraArgs=["--experimental-memory-mlock"]))
    kubectl.apply(etcd_cluster("fine", 3, extraArgs=["--quota-backend-bytes=4294967296"]))
    assert kubectl("get", "etcdcluster", "fine", "-o", "name")


async def test_unsafe_updates_are_refused(kubectl: Kubectl, admission: OperatorProcess) -> None:
    await configured(kubectl)
    kubectl.apply(etcd_cluster("live", 3, version="3.5.35"))  # the default addressing: dns
    refused(kubectl, "spec.addressing", "patch", "etcdcluster", "live", "--type=merge",
            "-p", '{"spec":{"addressing":"podIP"}}')  # fmt: skip
    message = refused(kubectl, "spec.version", "patch", "etcdcluster", "live", "--type=merge",
                      "-p", '{"spec":{"version":"3.9.0"}}')  # fmt: skip
    assert "kustos proves" in message  # 3.8 has no proven patch to pass through (CEL, or the webhook)
    # One minor up is a normal upgrade, and a size change outside a restore is a normal resize.
    kubectl("patch", "etcdcluster", "live", "--type=merge", "-p", '{"spec":{"version":"3.6.16","size":5}}')
    assert kubectl.get("etcdcluster", "live")["spec"]["size"] == 5


async def test_size_is_held_while_a_restore_is_under_way(
    kubectl: Kubectl, admission: OperatorProcess
) -> None:
    await configured(kubectl)
    kubectl.apply(etcd_cluster("restored", 3, restore={"backup": "nightly"}))
    refused(
        kubectl, "spec.size", "patch", "etcdcluster", "restored", "--type=merge", "-p", '{"spec":{"size":5}}'
    )
    # Once the restore has succeeded the cluster may grow.
    recovery = '{"epoch":1,"phase":"Succeeded","sourceKind":"backup","source":"nightly"}'
    kubectl("patch", "etcdcluster", "restored", "--subresource=status", "--type=merge",
            "-p", f'{{"status":{{"recovery":{recovery}}}}}')  # fmt: skip
    kubectl("patch", "etcdcluster", "restored", "--type=merge", "-p", '{"spec":{"size":5}}')
    assert kubectl.get("etcdcluster", "restored")["spec"]["size"] == 5
