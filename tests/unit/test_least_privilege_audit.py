"""The audit-log reading behind the least-privilege check (tests/integration/audit.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests.integration import audit

REPO = Path(__file__).resolve().parents[2]
OPERATOR = "system:serviceaccount:kustos-system:kustos"


def event(
    verb: str,
    resource: str,
    group: str = "",
    user: str = OPERATOR,
    code: int = 200,
    decision: str = "allow",
    subresource: str = "",
    stage: str = "ResponseComplete",
) -> str:
    ref: dict[str, Any] = {"resource": resource, "namespace": "ns", "name": "x"}
    if group:
        ref["apiGroup"] = group
    if subresource:
        ref["subresource"] = subresource
    body = {
        "stage": stage,
        "verb": verb,
        "user": {"username": user},
        "objectRef": ref,
        "responseStatus": {"code": code},
        "annotations": {"authorization.k8s.io/decision": decision} if decision else {},
    }
    return json.dumps(body)


def test_the_operators_identities_are_the_charts_service_accounts() -> None:
    assert audit.is_operator(OPERATOR)
    assert audit.is_operator("system:serviceaccount:t-1234abcd:kustos-t-1234abcd")
    assert not audit.is_operator("system:serviceaccount:kube-system:namespace-controller")
    assert not audit.is_operator("system:serviceaccount:default:kustosx")
    assert not audit.is_operator("kubernetes-admin")


def test_requests_keep_subresources_and_skip_others_and_open_watches() -> None:
    lines = [
        event("update", "etcdclusters", "kustos.dev", subresource="status"),
        event("get", "pods", user="system:serviceaccount:kube-system:x"),
        event("watch", "pods", stage="ResponseStarted"),
        json.dumps({"verb": "get", "user": {"username": OPERATOR}, "requestURI": "/version"}),
        "",
    ]

    requests = list(audit.operator_requests(lines))

    assert [(r.verb, r.group, r.resource) for r in requests] == [
        ("update", "kustos.dev", "etcdclusters/status")
    ]


def test_an_authorizer_refusal_fails_and_an_admission_403_is_counted_apart() -> None:
    requests = list(
        audit.operator_requests(
            [
                event("create", "secrets", code=403, decision="forbid"),
                event("create", "events", code=403, decision="allow"),  # namespace terminating
            ]
        )
    )

    result = audit.coverage(requests, [], {})

    assert [r.resource for r in result.denied] == ["secrets"]
    assert [r.resource for r in result.refused_by_admission] == ["events"]


CHART = """
kind: ClusterRole
metadata: {name: kustos}
rules:
  - apiGroups: [""]
    resources: ["pods", "pods/log"]
    verbs: ["get", "delete"]
  - apiGroups: ["rbac.authorization.k8s.io"]
    resources: ["clusterroles"]
    verbs: ["bind"]
    resourceNames: ["system:kube-scheduler"]
---
kind: ClusterRoleBinding
metadata: {name: kustos}
roleRef: {kind: ClusterRole, name: kustos}
subjects: [{kind: ServiceAccount, name: kustos, namespace: kustos-system}]
---
kind: ClusterRole
metadata: {name: kustos-storage-node}
rules:
  - apiGroups: [""]
    resources: ["persistentvolumes"]
    verbs: ["get"]
---
kind: ServiceAccount
metadata: {name: kustos}
"""

DOCS = """
## RBAC
### Granted, never requested

| group | resources | verbs | why |
| --- | --- | --- | --- |
| rbac.authorization.k8s.io | clusterroles | bind | checked when binding, never a request |

## Next
| core | pods | delete | not in the table above |
"""


def test_every_grant_is_used_justified_or_named() -> None:
    grants = audit.chart_grants(audit.rendered(CHART), "cluster mode")
    requests = list(audit.operator_requests([event("get", "pods"), event("get", "pods", subresource="log")]))

    result = audit.coverage(requests, grants, audit.justified(DOCS))

    assert {(g.resource, g.verb) for g in result.used} == {("pods", "get"), ("pods/log", "get")}
    assert [(g.resource, g.verb) for g, _ in result.justified] == [("clusterroles", "bind")]
    assert {(g.resource, g.verb) for g in result.unjustified} == {("pods", "delete"), ("pods/log", "delete")}
    assert "delete pods (ClusterRole kustos (cluster mode))" in result.report()
    assert "['system:kube-scheduler']" in result.report()


def test_a_refused_request_does_not_count_as_use() -> None:
    grants = audit.chart_grants(audit.rendered(CHART), "cluster mode")
    requests = list(audit.operator_requests([event("delete", "pods", code=403, decision="forbid")]))

    assert ("pods", "delete") not in {(g.resource, g.verb) for g in audit.coverage(requests, grants, {}).used}


def test_the_docs_justify_with_a_parseable_table() -> None:
    reasons = audit.justified((REPO / "docs" / "install.md").read_text())

    assert reasons, f"docs/install.md has no table under {audit.JUSTIFIED_HEADING!r}"
    assert all(why for why in reasons.values())


def test_a_server_side_apply_that_creates_uses_create() -> None:
    grants = audit.chart_grants(
        audit.rendered(CHART.replace('["get", "delete"]', '["create"]')), "cluster mode"
    )
    applied = list(audit.operator_requests([event("patch", "pods", code=201)]))
    patched = list(audit.operator_requests([event("patch", "pods", code=200)]))

    assert {(g.resource, g.verb) for g in audit.coverage(applied, grants, {}).used} == {("pods", "create")}
    assert not audit.coverage(patched, grants, {}).used


def test_roles_the_chart_ships_for_others_are_not_the_operators() -> None:
    grants = audit.chart_grants(audit.rendered(CHART), "cluster mode")

    assert {g.where for g in grants} == {"ClusterRole kustos (cluster mode)"}
