"""StorageCluster: a clustered storage system that kustos deploys and watches (SPEC F-STOR-1..4, 6).

Every parameter of the reference operator's table (seed 001) is here with its default;
``kvBackend.etcdClusterRef`` (a kustos EtcdCluster) goes beyond it. Empty image fields are
filled from a table keyed by the Kubernetes version the operator discovers at runtime
(``kustos.storage.images``); ``images.nodeContainer`` is the field a StorageUpgrade rewrites.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import ConfigDict, Field

from kustos.api import refs
from kustos.api.common import Condition
from kustos.runtime.crd import CRDInfo, CustomResource, KubeModel, PrinterColumn, Rule, kube_schema, list_map

DEFAULT_NODE_IMAGE = "storageos/node:v2.1.0"
DEFAULT_INIT_IMAGE = "storageos/init:1.0.0"

_PRESERVE_ITEMS: dict[str, Any] = {"items": {"x-kubernetes-preserve-unknown-fields": True}}


class StorageImages(KubeModel):
    """Container images; an empty CSI image means "the default for this Kubernetes version"."""

    node_container: str = DEFAULT_NODE_IMAGE
    """The storage node image (the one a StorageUpgrade replaces)."""
    init_container: str = DEFAULT_INIT_IMAGE
    """The init container image that prepares each node."""
    csi_node_driver_registrar_container: str = ""
    """CSI node driver registrar sidecar; default by Kubernetes version."""
    csi_cluster_driver_registrar_container: str = ""
    """CSI cluster driver registrar (only used on Kubernetes before 1.14); default by version."""
    csi_external_provisioner_container: str = ""
    """CSI external provisioner; default by Kubernetes version."""
    csi_external_attacher_container: str = ""
    """CSI external attacher; default by Kubernetes version."""
    csi_external_resizer_container: str = ""
    """CSI external resizer (Kubernetes 1.16 and later); default by Kubernetes version."""
    csi_liveness_probe_container: str = ""
    """CSI liveness probe sidecar; default by Kubernetes version."""


class CSISpec(KubeModel):
    """The Container Storage Interface driver and its helpers."""

    enable: bool = False
    """Deploy the CSI driver: CSIDriver object, registrar sidecars and controller helpers."""
    enable_provision_creds: bool = False
    """Pass provision credentials (csiProvisionUsername/Password from the cluster secret)."""
    enable_controller_publish_creds: bool = False
    """Pass controller publish credentials (csiControllerPublishUsername/Password)."""
    enable_node_publish_creds: bool = False
    """Pass node publish credentials (csiNodePublishUsername/Password)."""
    enable_controller_expand_creds: bool = False
    """Pass controller expand credentials (csiControllerExpandUsername/Password)."""
    deployment_strategy: Literal["statefulset", "deployment"] = "statefulset"
    """How the controller helpers run: a StatefulSet (default) or a Deployment."""


class ServiceSpec(KubeModel):
    """The Service in front of the storage API."""

    name: str = Field(default="storageos", min_length=1, max_length=63)
    """The Service's name."""
    type: Literal["ClusterIP", "NodePort", "LoadBalancer"] = "ClusterIP"
    """The Service's type."""
    external_port: int = Field(default=5705, ge=1, le=65535)
    """The port the Service exposes."""
    internal_port: int = Field(default=5705, ge=1, le=65535)
    """The port the node container listens on."""
    annotations: dict[str, str] = Field(default_factory=dict)
    """Annotations of the Service."""


class IngressSpec(KubeModel):
    """An Ingress to the storage API."""

    enable: bool = False
    """Create the Ingress."""
    hostname: str = "storageos.local"
    """The host the Ingress answers for."""
    tls: bool = False
    """Terminate TLS with tls.crt/tls.key from the cluster secret (copied into the cluster namespace)."""
    annotations: dict[str, str] = Field(default_factory=dict)
    """Annotations of the Ingress."""


class EtcdClusterRef(KubeModel):
    """A kustos EtcdCluster whose members' client URLs become the key-value store's endpoints."""

    name: str = Field(min_length=1)
    """The EtcdCluster's name."""
    namespace: str | None = None
    """Its namespace; the StorageCluster's own when unset."""


class KVBackend(KubeModel):
    """Where the storage cluster keeps its metadata."""

    model_config = ConfigDict(
        json_schema_extra=kube_schema(
            rules=[
                Rule(
                    "!has(self.backend) || self.backend != 'etcd' "
                    "|| (has(self.address) && self.address != '') || has(self.etcdClusterRef)",
                    "backend etcd needs address or etcdClusterRef",
                    field_path=".backend",
                ),
                Rule(
                    "!(has(self.address) && self.address != '' && has(self.etcdClusterRef))",
                    "set at most one of address and etcdClusterRef",
                    field_path=".etcdClusterRef",
                ),
            ]
        )
    )

    backend: Literal["embedded", "etcd"] = "embedded"
    """embedded (the default), or etcd for an external etcd."""
    address: str = ""
    """Comma-separated host:port list of the external etcd (1.2.3.4:2379,2.3.4.5:2379)."""
    etcd_cluster_ref: EtcdClusterRef | None = None
    """Or a kustos EtcdCluster; its client endpoints are followed as it changes."""


class StorageClusterSpec(KubeModel):
    """The storage cluster the user wants."""

    secret_ref_name: str = ""
    """The secret with the cluster's credentials (and tls.crt/tls.key, CSI credentials)."""
    secret_ref_namespace: str = ""
    """The secret's namespace; the StorageCluster's own when empty."""
    namespace: str = Field(default="storageos", min_length=1, max_length=63)
    """The namespace the cluster's objects are created in (created when missing)."""
    images: StorageImages = Field(default_factory=StorageImages)
    """Container images."""
    csi: CSISpec = Field(default_factory=CSISpec)
    """CSI."""
    service: ServiceSpec = Field(default_factory=ServiceSpec)
    """The API Service."""
    ingress: IngressSpec = Field(default_factory=IngressSpec)
    """The Ingress."""
    shared_dir: str = "/var/lib/kubelet/plugins/kubernetes.io~storageos"
    """Directory shared with the kubelet (bidirectional mount propagation)."""
    kv_backend: KVBackend = Field(default_factory=KVBackend)
    """The key-value store."""
    tls_etcd_secret_ref_name: str = ""
    """Secret with the etcd client TLS files (ca.crt, tls.crt, tls.key) for backend etcd."""
    tls_etcd_secret_ref_namespace: str = ""
    """Its namespace; the StorageCluster's own when empty."""
    pause: bool = False
    """Stop changing the generated objects (status is still reported)."""
    debug: bool = False
    """Debug logging on every node."""
    disable_fencing: bool = False
    """Turn off pod fencing."""
    disable_telemetry: bool = False
    """Turn off telemetry reports."""
    disable_tcmu: bool = Field(default=False, alias="disableTCMU")
    """Turn off TCMU (coexistence with other storage systems, lower performance)."""
    force_tcmu: bool = Field(default=False, alias="forceTCMU")
    """Require TCMU: nodes refuse to start without it. Conflicts with disableTCMU."""
    disable_scheduler: bool = False
    """Do not set the storage scheduler on pods that use the cluster's volumes."""
    node_selector_terms: list[dict[str, Any]] = Field(default_factory=list, json_schema_extra=_PRESERVE_ITEMS)
    """Node selector terms (as in node affinity) choosing the storage nodes."""
    tolerations: list[dict[str, Any]] = Field(default_factory=list, json_schema_extra=_PRESERVE_ITEMS)
    """Tolerations of the storage pods."""
    resources: dict[str, Any] | None = Field(
        default=None, json_schema_extra=kube_schema(preserve_unknown_fields=True)
    )
    """Resource requests and limits of the node container."""
    k8s_distro: str = Field(default="", alias="k8sDistro")
    """The Kubernetes distribution (openshift, rancher, eks, ...), passed to the nodes."""
    storage_class_name: str = Field(default="fast", min_length=1, max_length=253)
    """The StorageClass created for the cluster's volumes."""


class NodeHealth(KubeModel):
    """How one storage node looked at the last observation."""

    pod: str = ""
    """The node pod on it."""
    phase: str = ""
    """The pod's phase."""
    ready: bool = False
    """Whether the pod is Ready and its node is Ready."""
    message: str = ""
    """Why it is not ready."""


class StorageClusterStatus(KubeModel):
    """What the operator last observed and did."""

    phase: Literal["Pending", "Creating", "Running", "Degraded", "Paused", "Terminating"] | None = None
    """Pending, Creating, Running, Degraded, Paused or Terminating."""
    ready: str | None = None
    """Ready node pods over scheduled node pods, like 3/3."""
    nodes: list[str] = Field(default_factory=list)
    """The nodes running a storage node pod."""
    node_health_status: dict[str, NodeHealth] = Field(default_factory=dict)
    """Health per node."""
    kv_endpoints: list[str] = Field(default_factory=list)
    """The key-value store endpoints the nodes are configured with."""
    node_image: str | None = None
    """The node image the DaemonSet runs."""
    observed_generation: int | None = None
    """The generation of the spec this status describes."""
    conditions: list[Condition] = Field(default_factory=list, json_schema_extra=list_map("type"))
    """Available, Progressing, Degraded, Maintenance, Ready (refusals)."""


class StorageCluster(CustomResource[StorageClusterSpec, StorageClusterStatus]):
    """A clustered storage system run by kustos."""

    crd = CRDInfo.of(
        refs.STORAGE_CLUSTERS,
        short_names=("stc",),
        categories=("kustos",),
        printer_columns=(
            PrinterColumn("READY", ".status.ready", description="Ready node pods over scheduled"),
            PrinterColumn("STATUS", ".status.phase"),
            PrinterColumn("AGE", ".metadata.creationTimestamp", "date"),
        ),
    )
