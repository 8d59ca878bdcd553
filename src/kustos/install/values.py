"""The Helm chart's values (deploy/helm/kustos), as a model: values.schema.json is generated
from it (`kustos chart --write`), so `helm install` refuses a typo or a wrong type before
anything is applied, and the defaults in values.yaml are checked against it by a unit test.
"""

from __future__ import annotations

import json
import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator
from pydantic.alias_generators import to_camel

# The idle operator with every controller registered measures 70 MiB resident and grows by
# about 0.25 MiB per three-member EtcdCluster (93 MiB with 50; docs/benchmarks.md): the request
# covers ~100 clusters, the limit leaves room for a burst of watch events.
MEMORY_REQUEST = "96Mi"
MEMORY_LIMIT = "256Mi"
CPU_REQUEST = "50m"
DNS_LABEL = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"


class Values(BaseModel):
    """Base: camelCase keys as in values.yaml, unknown keys refused (a typo is an error)."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        serialize_by_alias=True,
        use_attribute_docstrings=True,
        extra="forbid",
    )


class Image(Values):
    repository: str = "ghcr.io/kustos/kustos"
    """The operator's image (deploy/Dockerfile); agent pods run the same image."""
    tag: str = ""
    """Empty: the chart's appVersion, the kustos version."""
    pull_policy: Literal["Always", "IfNotPresent", "Never"] = "IfNotPresent"


class Crds(Values):
    install: bool = True
    """Install the CustomResourceDefinitions with the chart. They are kept on uninstall
    (helm.sh/resource-policy: keep): deleting a CRD deletes every cluster of its kind."""


class LeaderElection(Values):
    enabled: bool = True
    """Only the lease holder reconciles; the other replicas keep warm caches and serve webhooks."""
    lease_duration: int = Field(default=15, ge=1)
    """Seconds a standby waits after the last renewal before it takes over."""
    renew_deadline: int = Field(default=10, ge=1)
    """Seconds the leader keeps trying to renew before it gives up (and exits)."""
    retry_period: int = Field(default=2, ge=1)


class CertManager(Values):
    enabled: bool = False
    """Use a cert-manager Certificate for the webhook server, instead of the certificate the
    operator generates at start (kept in a Secret that every replica shares)."""
    issuer_kind: Literal["Issuer", "ClusterIssuer"] = "Issuer"
    issuer_name: str = ""
    """Empty: a self-signed Issuer created by the chart in the release namespace."""


class Webhook(Values):
    enabled: bool = True
    """Serve the admission webhooks (EtcdCluster validation, the StorageCluster scheduler)."""
    port: int = Field(default=9443, ge=1024, le=65535)
    cert_manager: CertManager = Field(default_factory=CertManager)
    url: str = Field(default="", pattern=r"^(https://[^/?#]+)?$")
    """Empty: the API server calls the webhooks through the chart's Service. An https base URL
    (no path): the operator runs outside the cluster and serves them there (``kustos run
    --webhook-url``, e.g. while developing it); its certificate is then self-signed."""


class ServiceMonitor(Values):
    enabled: bool = False
    """A prometheus-operator ServiceMonitor for /metrics (needs its CRD)."""
    interval: str = "30s"
    labels: dict[str, str] = Field(default_factory=dict)


class PrometheusRule(Values):
    enabled: bool | None = None
    """The alert rules (docs/runbook.md) as a prometheus-operator PrometheusRule. null: only when
    the cluster serves its CRD (monitoring.coreos.com/v1); true or false to say so."""
    labels: dict[str, str] = Field(default_factory=dict)
    """Extra labels, e.g. the ones your Prometheus's ruleSelector matches."""


class Dashboard(Values):
    enabled: bool = True
    """A Grafana dashboard in a ConfigMap labelled grafana_dashboard: "1" (Grafana's dashboard
    sidecar loads it); one row per kind, from the domain metrics (docs/metrics.md)."""
    labels: dict[str, str] = Field(default_factory=dict)
    """Extra labels for the ConfigMap."""


class Metrics(Values):
    port: int = Field(default=8080, ge=1024, le=65535)
    """/metrics, /healthz and /readyz."""
    service_monitor: ServiceMonitor = Field(default_factory=ServiceMonitor)
    prometheus_rule: PrometheusRule = Field(default_factory=PrometheusRule)
    dashboard: Dashboard = Field(default_factory=Dashboard)


class NetworkPolicy(Values):
    enabled: bool = False
    """Admit only the webhook and metrics ports into the operator's pods (egress stays open: the
    operator reaches the API server and every etcd member)."""
    metrics_from: list[dict[str, Any]] = Field(default_factory=list)
    """NetworkPolicy peers allowed to scrape /metrics; empty: any."""


class ServiceAccount(Values):
    create: bool = True
    name: str = ""
    """Empty: the release's full name."""
    annotations: dict[str, str] = Field(default_factory=dict)


class CloudProvider(Values):
    name: Literal["none", "kwok", "aws", "gcp", "azure"] = "none"
    """The cloud provider NodeImage rollouts and node fencing use (`kustos run --cloud-provider`);
    none: NodeImages wait. Credentials come from each SDK's usual chain: for aws IAM roles for
    service accounts (docs/nodeimage-aws.md), for gcp GKE workload identity
    (docs/nodeimage-gcp.md), for azure workload identity (docs/nodeimage-azure.md), each by
    service account annotations (and, for azure, the pod label azure.workload.identity/use).
    The gcp and azure SDKs take about 130 MiB more: raise resources.limits.memory to 384Mi."""
    options: dict[str, str] = Field(default_factory=dict)
    """`--cloud-option key=value` pairs: region and cluster for aws, project for gcp,
    subscription (and resource-group) for azure."""


class Rook(Values):
    enabled: bool = False
    """A Role in Rook's namespace letting the operator exec there (the namespace must exist:
    off by default, so that the chart installs where Rook does not run). Off: a purge prints
    the Ceph commands for a person to run in the toolbox pod."""
    namespace: str = Field(default="rook-ceph", pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", max_length=63)
    """Rook's namespace: the operator may exec in pods there (pods/exec, a Role), to run the
    Ceph commands of a node purge in Rook's toolbox pod. The MaintenancePolicy's rookNamespace
    must name the same namespace."""


class UserRoles(Values):
    enabled: bool = True
    """ClusterRoles for people (docs/security.md): EtcdCluster and EtcdBackup aggregated to the
    built-in view, edit and admin roles; the cluster- and node-level kinds only in
    <release>-platform-admin, which nothing binds (a NodeJob is root on its nodes)."""


class AdmissionPolicy(Values):
    enabled: bool = True
    """A ValidatingAdmissionPolicy on the operator's own requests (Kubernetes 1.30+): what it
    creates or updates must carry kustos's labels and an owner, its pods only the service
    accounts and host access their kind needs (docs/security.md). Off on older clusters."""


class ResourceList(Values):
    model_config = ConfigDict(extra="allow")
    cpu: str | None = None
    memory: str | None = None


class Resources(Values):
    requests: ResourceList = Field(
        default_factory=lambda: ResourceList(cpu=CPU_REQUEST, memory=MEMORY_REQUEST)
    )
    limits: ResourceList = Field(default_factory=lambda: ResourceList(memory=MEMORY_LIMIT))


class PodDisruptionBudget(Values):
    enabled: bool = True
    min_available: int = Field(default=1, ge=0)


class ChartValues(Values):
    """Everything `helm install kustos deploy/helm/kustos --set ...` accepts."""

    model_config = ConfigDict(title="kustos chart values")

    name_override: str = ""
    fullname_override: str = Field(default="", alias="fullnameOverride")
    image: Image = Field(default_factory=Image)
    image_pull_secrets: list[dict[str, str]] = Field(default_factory=list)
    replicas: int = Field(default=2, ge=0)
    """Two: a standby with warm caches takes over within the lease duration (F-OPS-3). Zero
    stops the operator and keeps everything else."""
    crds: Crds = Field(default_factory=Crds)
    namespaces: list[str] = Field(
        default_factory=list,
        json_schema_extra={"uniqueItems": True, "items": {"type": "string", "pattern": DNS_LABEL}},
    )
    """Namespaced mode: watch only these namespaces (one `kustos run --namespace` each, one
    list/watch per namespace), with Roles there and no cluster-wide access beyond reading
    Nodes. The StorageCluster and StorageUpgrade controllers, which generate cluster-scoped
    objects, are off in this mode. Empty: the whole cluster."""
    leader_election: LeaderElection = Field(default_factory=LeaderElection)
    webhook: Webhook = Field(default_factory=Webhook)
    metrics: Metrics = Field(default_factory=Metrics)
    network_policy: NetworkPolicy = Field(default_factory=NetworkPolicy)
    service_account: ServiceAccount = Field(default_factory=ServiceAccount)
    cloud_provider: CloudProvider = Field(default_factory=CloudProvider)
    rook: Rook = Field(default_factory=Rook)
    user_roles: UserRoles = Field(default_factory=UserRoles)
    admission_policy: AdmissionPolicy = Field(default_factory=AdmissionPolicy)
    resources: Resources = Field(default_factory=Resources)
    pod_disruption_budget: PodDisruptionBudget = Field(default_factory=PodDisruptionBudget)
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    json_logs: bool = True
    pod_annotations: dict[str, str] = Field(default_factory=dict)
    pod_labels: dict[str, str] = Field(default_factory=dict)
    node_selector: dict[str, str] = Field(default_factory=dict)
    tolerations: list[dict[str, Any]] = Field(default_factory=list)
    affinity: dict[str, Any] = Field(default_factory=dict)
    priority_class_name: str = ""

    @field_validator("namespaces")
    @classmethod
    def _dns_labels(cls, value: list[str]) -> list[str]:
        bad = [n for n in value if not re.match(DNS_LABEL, n)]
        if bad:
            raise ValueError(f"not namespace names: {bad}")
        repeated = sorted({n for n in value if value.count(n) > 1})
        if repeated:
            raise ValueError(f"namespaces listed twice: {repeated}")
        return value


def schema() -> dict[str, Any]:
    """values.schema.json: JSON Schema of ``ChartValues`` (helm validates values against it)."""
    document = ChartValues.model_json_schema(by_alias=True)
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", **document}


def render_schema() -> str:
    return json.dumps(schema(), indent=2, sort_keys=True) + "\n"


def defaults() -> dict[str, Any]:
    """The default values, as values.yaml must state them."""
    return ChartValues().model_dump(by_alias=True, exclude_none=True)


__all__ = ["ChartValues", "defaults", "render_schema", "schema"]
