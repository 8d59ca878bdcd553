"""Least privilege, proven from the API server's audit log (issue 14 item 5).

The dev cluster's API server records every request a service account makes
(``kwokconfig.AUDIT_POLICY``). After the integration suite this module reads that log for
the operator's identities (the chart's ServiceAccount: ``system:serviceaccount:<ns>:kustos``
or ``kustos-<suffix>``) and answers two questions:

- was any of its requests refused by the authorizer (``authorization.k8s.io/decision:
  forbid``)? Other 403s (admission refusing new objects in a terminating namespace) are
  counted apart: they are not a missing permission.
- is every (group, resource, verb) the chart grants used by some request, or listed with its
  reason in docs/install.md ("Granted, never requested")?

Pure functions over parsed events and rendered chart documents; the I/O is in conftest.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

_IDENTITY = re.compile(r"system:serviceaccount:[a-z0-9-]+:kustos(-[a-z0-9-]+)?")
JUSTIFIED_HEADING = "### Granted, never requested"


@dataclass(frozen=True)
class Request:
    user: str
    verb: str
    group: str
    resource: str  # "pods" or "pods/log"
    namespace: str
    name: str
    code: int
    decision: str  # "allow", "forbid" or "" (no authorization annotation)


def is_operator(username: str) -> bool:
    return bool(_IDENTITY.fullmatch(username))


def operator_requests(lines: Iterable[str]) -> Iterator[Request]:
    """The resource requests of the operator's identities, one per completed request."""
    for line in lines:
        if not line.strip():
            continue
        event = json.loads(line)
        user = event.get("user", {}).get("username", "")
        ref = event.get("objectRef")
        if not is_operator(user) or not ref or event.get("stage") == "ResponseStarted":
            continue
        resource = ref.get("resource", "")
        if ref.get("subresource"):
            resource += "/" + ref["subresource"]
        annotations = event.get("annotations") or {}
        yield Request(
            user=user,
            verb=event.get("verb", ""),
            group=ref.get("apiGroup", ""),
            resource=resource,
            namespace=ref.get("namespace", ""),
            name=ref.get("name", ""),
            code=int((event.get("responseStatus") or {}).get("code") or 0),
            decision=annotations.get("authorization.k8s.io/decision", ""),
        )


@dataclass(frozen=True)
class Grant:
    """One (group, resource, verb) of a chart rule, and where the chart grants it."""

    group: str
    resource: str
    verb: str
    where: str  # "ClusterRole kustos (cluster mode)", ...
    names: tuple[str, ...] = ()

    def __str__(self) -> str:
        names = f" {list(self.names)}" if self.names else ""
        return f"{self.verb} {self.resource}{'.' + self.group if self.group else ''}{names} ({self.where})"


def chart_grants(documents: Iterable[dict[str, Any] | None], mode: str) -> list[Grant]:
    """Every (group, resource, verb) the ClusterRoles and Roles of a rendered chart grant its
    ServiceAccount (roles a binding of the chart gives a ServiceAccount; the roles it ships for
    a StorageCluster's pods are bound by the operator, to those pods, and are not its own)."""
    docs = [d for d in documents if d]
    bound = {
        (d["roleRef"]["kind"], d["roleRef"]["name"], d["metadata"].get("namespace", ""))
        for d in docs
        if d.get("kind") in ("ClusterRoleBinding", "RoleBinding")
        and any(s.get("kind") == "ServiceAccount" for s in d.get("subjects") or [])
    }
    grants = []
    for doc in docs:
        if doc.get("kind") not in ("ClusterRole", "Role"):
            continue
        name = doc["metadata"]["name"]
        if doc["kind"] == "Role":
            if ("Role", name, doc["metadata"].get("namespace", "")) not in bound:
                continue
        elif not any(kind == "ClusterRole" and role == name for kind, role, _ in bound):
            continue
        where = f"{doc['kind']} {doc['metadata']['name']} ({mode})"
        for rule in doc.get("rules") or []:
            for group in rule.get("apiGroups") or [""]:
                for resource in rule.get("resources") or []:
                    for verb in rule.get("verbs") or []:
                        grants.append(
                            Grant(group, resource, verb, where, tuple(rule.get("resourceNames") or ()))
                        )
    return grants


def used(grant: Grant, requests: Iterable[Request]) -> bool:
    """Some allowed request needed the grant. A server-side apply (or an update) that creates
    its object answers 201 and needed ``create`` too: the API server authorizes both, though
    the request's verb is ``patch``."""
    return any(
        r.decision == "allow"
        and r.group == grant.group
        and r.resource == grant.resource
        and (
            r.verb == grant.verb
            or (grant.verb == "create" and r.verb in ("patch", "update") and r.code == 201)
        )
        for r in requests
    )


def justified(docs_text: str) -> dict[tuple[str, str, str], str]:
    """(group, resource, verb) -> reason, from the table under ``JUSTIFIED_HEADING``:
    ``| group | resources | verbs | why |`` (``core`` for the core group, lists comma-separated)."""
    _, found, rest = docs_text.partition(JUSTIFIED_HEADING)
    if not found:
        return {}
    reasons = {}
    for line in rest.splitlines()[1:]:
        if line.startswith("#"):
            break
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 4 or set(cells[0]) <= {"-", " "} or cells[0] == "group":
            continue
        group = "" if cells[0] in ("core", '""') else cells[0]
        for resource in (r.strip().strip("`") for r in cells[1].split(",")):
            for verb in (v.strip().strip("`") for v in cells[2].split(",")):
                reasons[(group, resource, verb)] = cells[3]
    return reasons


@dataclass
class Coverage:
    denied: list[Request] = field(default_factory=list)
    refused_by_admission: list[Request] = field(default_factory=list)
    used: list[Grant] = field(default_factory=list)
    justified: list[tuple[Grant, str]] = field(default_factory=list)
    unjustified: list[Grant] = field(default_factory=list)
    identities: dict[str, int] = field(default_factory=dict)

    def report(self) -> str:
        lines = ["# kustos least-privilege report from the API server's audit log", ""]
        lines += [f"requests by {user}: {count}" for user, count in sorted(self.identities.items())]
        lines += ["", f"## refused by the authorizer: {len(self.denied)}"]
        lines += [f"  {r.user} {r.verb} {r.resource} {r.namespace}/{r.name}" for r in self.denied]
        lines += [
            "",
            f"## refused with 403 by admission (not a permission): {len(self.refused_by_admission)}",
        ]
        lines += [
            f"  {r.user} {r.verb} {r.resource} {r.namespace}/{r.name}" for r in self.refused_by_admission
        ]
        lines += ["", f"## granted and used: {len(self.used)}"] + [f"  {g}" for g in self.used]
        lines += ["", f"## granted, never requested, reason in docs/install.md: {len(self.justified)}"]
        lines += [f"  {g}: {why}" for g, why in self.justified]
        lines += ["", f"## granted, never requested, no reason given: {len(self.unjustified)}"]
        lines += [f"  {g}" for g in self.unjustified]
        return "\n".join(lines) + "\n"


def coverage(
    requests: list[Request], grants: Iterable[Grant], reasons: dict[tuple[str, str, str], str]
) -> Coverage:
    result = Coverage()
    for r in requests:
        result.identities[r.user] = result.identities.get(r.user, 0) + 1
        if r.decision == "forbid":
            result.denied.append(r)
        elif r.code == 403:
            result.refused_by_admission.append(r)
    for grant in grants:
        if used(grant, requests):
            result.used.append(grant)
        elif (grant.group, grant.resource, grant.verb) in reasons:
            result.justified.append((grant, reasons[(grant.group, grant.resource, grant.verb)]))
        else:
            result.unjustified.append(grant)
    return result


def rendered(text: str) -> list[dict[str, Any] | None]:
    return list(yaml.safe_load_all(text))


def read_requests(audit_log: Path) -> list[Request]:
    with audit_log.open(errors="replace") as lines:
        return list(operator_requests(lines))
