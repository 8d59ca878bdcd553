"""An operator that cannot resolve its members' DNS names says so, naming them.

The failure a new user met: an operator outside the cluster (no cluster DNS) with the
default `addressing: dns` left a cluster at 0/3 Creating with nothing saying why.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from kustos.etcd.planner import dns_name
from tests.integration.conftest import Kubectl
from tests.integration.etcd_support import etcd_cluster, running_operator, status_of
from tests.integration.kube import wait_until

pytestmark = pytest.mark.process_runner(
    "an operator without the cluster DNS is what fails; the members only need to exist"
)


def condition(status: dict[str, Any], kind: str) -> dict[str, Any]:
    return next((c for c in status.get("conditions") or [] if c["type"] == kind), {})


async def test_a_member_name_the_operator_cannot_resolve_is_named_in_status_and_events(
    crds: None, kubectl: Kubectl, tmp_path: Path
) -> None:
    # A resolver with nothing behind it, as on a laptop without the cluster's DNS.
    resolv_conf = tmp_path / "resolv.conf"
    resolv_conf.write_text("nameserver 127.0.0.1\noptions timeout:1 attempts:1\n")
    with running_operator(kubectl, tmp_path / "operator", resolv_conf=resolv_conf):
        kubectl.apply(etcd_cluster("lost", 1))  # the default addressing: dns
        member = dns_name("lost", kubectl.namespace, "lost-0")

        async def unresolved() -> dict[str, Any] | None:
            found = condition(status_of(kubectl, "lost"), "MembersResolvable")
            return found if found.get("status") == "False" else None

        said = await wait_until(unresolved, "MembersResolvable=False", timeout=90)
        assert said["reason"] == "NameNotResolved" and member in said["message"], said
        selector = "involvedObject.name=lost,reason=MemberNameUnresolved"
        assert member in kubectl("get", "events", "--field-selector", selector)
