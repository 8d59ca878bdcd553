"""The generated files of the Helm chart (deploy/helm/kustos): its CRDs template,
values.schema.json and the Grafana dashboard. Generated, never edited:
``kustos chart --write deploy/helm/kustos`` regenerates them and a unit test fails when they
are stale (as for deploy/crds).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from kustos.api.resources import RESOURCES
from kustos.install import dashboard
from kustos.install.values import render_schema
from kustos.runtime.crd import crd_for
from kustos.storage.manifests import COMPONENT_RULES

CRDS_TEMPLATE = "templates/crds.yaml"
SCHEMA = "values.schema.json"
HEADER = "# Generated from the models in kustos.api by `kustos chart --write`: do not edit.\n"


def _crd_document(model: Any) -> str:
    crd = crd_for(model)
    # Deleting a CRD deletes every object of its kind: `helm uninstall` leaves them.
    crd["metadata"].setdefault("annotations", {})["helm.sh/resource-policy"] = "keep"
    text = yaml.safe_dump(crd, sort_keys=True, width=1_000_000, allow_unicode=True)
    if "{{" in text:
        raise ValueError(f"{crd['metadata']['name']}: '{{{{' in a CRD would be read as a Helm template")
    return text


def render_crds_template() -> str:
    """Every CRD, ordered by name, installed only when ``crds.install`` is true."""
    documents = sorted((m.crd.name, _crd_document(m)) for m in RESOURCES)
    body = "".join(f"---\n{text}" for _, text in documents)
    return HEADER + "{{- if .Values.crds.install }}\n" + body + "{{- end }}\n"


STORAGE_ROLES_TEMPLATE = "templates/storage-roles.yaml"


def render_storage_roles_template() -> str:
    """The ClusterRoles a StorageCluster's node and CSI helper pods are bound to
    (``storage.manifests.COMPONENT_RULES``), shipped so that the operator binds them (``bind``
    on these names) instead of holding every permission in them; cluster mode only."""
    body = ""
    for component, rules in COMPONENT_RULES.items():
        body += (
            "---\napiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRole\nmetadata:\n"
            f'  name: {{{{ include "kustos.fullname" . }}}}-storage-{component}\n'
            '  labels:\n    {{- include "kustos.labels" . | nindent 4 }}\n'
            + yaml.safe_dump({"rules": rules}, sort_keys=False, width=1_000_000)
        )
    header = "# Generated from kustos.storage.manifests by `kustos chart --write`: do not edit.\n"
    return header + "{{- if not .Values.namespaces }}\n" + body + "{{- end }}\n"


def generated() -> dict[str, str]:
    """Chart-relative path -> content."""
    return {
        CRDS_TEMPLATE: render_crds_template(),
        STORAGE_ROLES_TEMPLATE: render_storage_roles_template(),
        SCHEMA: render_schema(),
        dashboard.DASHBOARD_FILE: dashboard.render(),
    }


def write(chart: Path) -> list[Path]:
    written = []
    for relative, content in generated().items():
        path = chart / relative
        if not path.is_file() or path.read_text() != content:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(content)
        written.append(path)
    return written


def stale(chart: Path) -> list[str]:
    """Generated files of ``chart`` that are missing or differ."""
    return sorted(
        relative
        for relative, content in generated().items()
        if not (chart / relative).is_file() or (chart / relative).read_text() != content
    )


__all__ = ["generated", "render_crds_template", "stale", "write"]
