"""Every object a StorageCluster owns, as manifests (pure: no I/O, no clock).

``desired(inputs)`` turns a StorageCluster, the Kubernetes version the operator discovered,
the key-value endpoints it resolved and the cluster secret's data into the full, ordered
list of objects to apply. ``refusals(inputs)`` says why a spec cannot be deployed (the
planner then changes nothing). Every object carries ``CLUSTER_LABEL`` so that the
controller finds (and on deletion removes) what it made, including cluster-scoped objects
and objects in another namespace, which owner references cannot reach.
"""

from __future__ import annotations

import base64
import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from kustos.api.storage import StorageCluster, StorageClusterSpec, StorageImages
from kustos.storage import names
from kustos.storage.images import KubeVersion, resolve_images

Obj = dict[str, Any]

HASH_ANNOTATION = "kustos.dev/applied-hash"
"""sha256 of the manifest as generated: the controller re-applies only when it differs."""
CREATED_NAMESPACE_ANNOTATION = "kustos.dev/created-by"

STATE_DIR = "/var/lib/storageos"
PLUGIN_DIR = "/var/lib/kubelet/plugins_registry"
PODS_DIR = "/var/lib/kubelet/pods"
CSI_SOCKET_DIR = f"{PLUGIN_DIR}/{names.CSI_DRIVER}"
CSI_ENDPOINT = f"unix://{CSI_SOCKET_DIR}/csi.sock"

# (spec switch, object suffix, secret key prefix, StorageClass parameter prefix)
CREDENTIALS: tuple[tuple[str, str, str, str], ...] = (
    ("enable_provision_creds", "csi-provision", "csiProvision", "csi.storage.k8s.io/provisioner-secret"),
    ("enable_controller_publish_creds", "csi-controller-publish", "csiControllerPublish",
     "csi.storage.k8s.io/controller-publish-secret"),
    ("enable_node_publish_creds", "csi-node-publish", "csiNodePublish",
     "csi.storage.k8s.io/node-publish-secret"),
    ("enable_controller_expand_creds", "csi-controller-expand", "csiControllerExpand",
     "csi.storage.k8s.io/controller-expand-secret"),
)  # fmt: skip


@dataclass(frozen=True)
class Inputs:
    """What the manifests depend on besides the StorageCluster itself."""

    cluster: StorageCluster
    kube_version: KubeVersion
    kv_endpoints: tuple[str, ...] = ()
    """Resolved key-value endpoints (from kvBackend.address or the EtcdCluster's members)."""
    secret_data: dict[str, str] | None = None
    """The cluster secret's data (base64 values), None when no secret is named or it is missing."""
    etcd_tls_data: dict[str, str] | None = None
    """The etcd TLS secret's data (base64 values), None when none is named or it is missing."""
    foreign_namespace: bool = False
    """spec.namespace exists and was not created by this StorageCluster: use it, never own it
    (owning it would delete it, and everything else in it, with the StorageCluster)."""
    shipped_roles: Mapping[str, str] = field(default_factory=dict)
    """Component ("node", "csi-helper") -> a ClusterRole installed with the operator (the
    chart's) to bind instead of generating one (``shipped_roles``)."""


# ---- small helpers -------------------------------------------------------------------


def labels(cluster: StorageCluster, component: str) -> dict[str, str]:
    return {
        "app.kubernetes.io/name": "kustos-storage",
        "app.kubernetes.io/instance": cluster.metadata["name"],
        "app.kubernetes.io/component": component,
        "app.kubernetes.io/managed-by": "kustos",
        names.CLUSTER_LABEL: names.cluster_key(cluster),
    }


def _meta(cluster: StorageCluster, name: str, component: str, namespaced: bool = True) -> Obj:
    meta: Obj = {"name": name, "labels": labels(cluster, component)}
    if namespaced:
        meta["namespace"] = cluster.spec.namespace
    return meta


def cluster_scoped_name(cluster: StorageCluster, suffix: str) -> str:
    """Names of cluster-scoped objects carry the StorageCluster's namespace and name."""
    return f"kustos-storage-{names.cluster_key(cluster)}-{suffix}"


def component_selector(cluster: StorageCluster, component: str) -> dict[str, str]:
    return {
        "app.kubernetes.io/instance": cluster.metadata["name"],
        "app.kubernetes.io/component": component,
        names.CLUSTER_LABEL: names.cluster_key(cluster),
    }


def node_selector(cluster: StorageCluster) -> dict[str, str]:
    """Pod labels that select the node DaemonSet's pods (used by the Service too)."""
    return names.node_pod_labels(cluster)


def manifest_hash(obj: Obj) -> str:
    body = {k: v for k, v in obj.items() if k != "status"}
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()[:16]


def _decode(data: dict[str, str] | None, key: str) -> str | None:
    if not data or key not in data:
        return None
    try:
        return base64.b64decode(data[key]).decode()
    except (ValueError, UnicodeDecodeError):
        return None


def images_for(inputs: Inputs) -> StorageImages:
    return resolve_images(inputs.cluster.spec.images, inputs.kube_version)


def kv_address(inputs: Inputs) -> str:
    return ",".join(inputs.kv_endpoints)


# ---- refusals ------------------------------------------------------------------------


def refusals(inputs: Inputs) -> list[str]:
    """Why this spec cannot be deployed as it stands; empty when it can."""
    spec = inputs.cluster.spec
    reasons: list[str] = []
    if spec.disable_tcmu and spec.force_tcmu:
        reasons.append("disableTCMU and forceTCMU are both true: choose one")
    if spec.secret_ref_name and inputs.secret_data is None:
        namespace = spec.secret_ref_namespace or inputs.cluster.metadata["namespace"]
        reasons.append(f"secret {namespace}/{spec.secret_ref_name} (secretRefName) not found")
    needs_secret = spec.ingress.enable and spec.ingress.tls
    needs_secret = needs_secret or (
        spec.csi.enable and any(getattr(spec.csi, switch) for switch, *_ in CREDENTIALS)
    )
    if needs_secret and not spec.secret_ref_name:
        reasons.append("ingress TLS and CSI credentials are read from the cluster secret: set secretRefName")
    if spec.secret_ref_name and inputs.secret_data is not None:
        missing: list[str] = []
        if spec.ingress.enable and spec.ingress.tls:
            missing += [k for k in ("tls.crt", "tls.key") if k not in inputs.secret_data]
        if spec.csi.enable:
            for switch, _suffix, prefix, _param in CREDENTIALS:
                if getattr(spec.csi, switch):
                    missing += [
                        k for k in (f"{prefix}Username", f"{prefix}Password") if k not in inputs.secret_data
                    ]
        if missing:
            reasons.append(f"secret {spec.secret_ref_name} lacks keys {', '.join(missing)}")
    if spec.tls_etcd_secret_ref_name and inputs.etcd_tls_data is None:
        namespace = spec.tls_etcd_secret_ref_namespace or inputs.cluster.metadata["namespace"]
        reasons.append(f"etcd TLS secret {namespace}/{spec.tls_etcd_secret_ref_name} not found")
    if (
        spec.kv_backend.backend == "etcd"
        and not spec.kv_backend.address
        and not spec.kv_backend.etcd_cluster_ref
    ):
        reasons.append("kvBackend.backend etcd needs an address or an etcdClusterRef")
    return reasons


# ---- the node DaemonSet --------------------------------------------------------------


def _env(inputs: Inputs) -> list[Obj]:
    spec = inputs.cluster.spec
    env: list[Obj] = [
        {"name": "HOSTNAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
        {"name": "ADVERTISE_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
        {"name": "NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
        {"name": "API_PORT", "value": str(spec.service.internal_port)},
        {"name": "DISABLE_TELEMETRY", "value": str(spec.disable_telemetry).lower()},
        {"name": "DISABLE_FENCING", "value": str(spec.disable_fencing).lower()},
        {"name": "DISABLE_TCMU", "value": str(spec.disable_tcmu).lower()},
        {"name": "FORCE_TCMU", "value": str(spec.force_tcmu).lower()},
        {"name": "LOG_LEVEL", "value": "debug" if spec.debug else "info"},
        {"name": "KV_BACKEND", "value": spec.kv_backend.backend},
    ]
    if spec.secret_ref_name:
        secret = credentials_secret_name(inputs.cluster)
        env += [
            {"name": "BOOTSTRAP_USERNAME",
             "valueFrom": {"secretKeyRef": {"name": secret, "key": "username", "optional": True}}},
            {"name": "BOOTSTRAP_PASSWORD",
             "valueFrom": {"secretKeyRef": {"name": secret, "key": "password", "optional": True}}},
        ]  # fmt: skip
    if spec.kv_backend.backend == "etcd":
        env.append({"name": "KV_ADDR", "value": kv_address(inputs)})
        if inputs.etcd_tls_data is not None:
            env += [
                {"name": "ETCD_TLS_CLIENT_CA", "value": "/run/etcd-tls/ca.crt"},
                {"name": "ETCD_TLS_CLIENT_CERT", "value": "/run/etcd-tls/tls.crt"},
                {"name": "ETCD_TLS_CLIENT_KEY", "value": "/run/etcd-tls/tls.key"},
            ]
    if spec.csi.enable:
        env += [
            {"name": "CSI_ENDPOINT", "value": CSI_ENDPOINT},
            {"name": "CSI_VERSION", "value": "v1"},
        ]
    if spec.k8s_distro:
        env.append({"name": "K8S_DISTRO", "value": spec.k8s_distro})
    return env


def _csi_node_sidecars(inputs: Inputs, images: StorageImages) -> list[Obj]:
    registrar: Obj = {
        "name": "csi-driver-registrar",
        "image": images.csi_node_driver_registrar_container,
        "args": ["--v=5", "--csi-address=$(ADDRESS)", "--kubelet-registration-path=$(REG_PATH)"],
        "env": [
            {"name": "ADDRESS", "value": "/csi/csi.sock"},
            {"name": "REG_PATH", "value": f"{CSI_SOCKET_DIR}/csi.sock"},
            {"name": "KUBE_NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
        ],
        "volumeMounts": [
            {"name": "plugin-dir", "mountPath": "/csi"},
            {"name": "registrar-socket-dir", "mountPath": "/registration"},
        ],
    }
    liveness: Obj = {
        "name": "csi-liveness-probe",
        "image": images.csi_liveness_probe_container,
        "args": ["--csi-address=$(ADDRESS)", "--health-port=9808"],
        "env": [{"name": "ADDRESS", "value": "/csi/csi.sock"}],
        "volumeMounts": [{"name": "plugin-dir", "mountPath": "/csi"}],
    }
    return [registrar, liveness]


def node_daemonset(inputs: Inputs) -> Obj:
    cluster, spec = inputs.cluster, inputs.cluster.spec
    images = images_for(inputs)
    namespace, name = names.node_daemonset(cluster)
    privileged = {
        "privileged": True,
        "capabilities": {"add": ["SYS_ADMIN"]},
        "allowPrivilegeEscalation": True,
    }
    node_mounts: list[Obj] = [
        {"name": "kernel-modules", "mountPath": "/lib/modules", "readOnly": True},
        {"name": "fuse", "mountPath": "/dev/fuse"},
        {"name": "sys", "mountPath": "/sys"},
        {"name": "state", "mountPath": STATE_DIR, "mountPropagation": "Bidirectional"},
        {"name": "shared", "mountPath": spec.shared_dir, "mountPropagation": "Bidirectional"},
    ]
    volumes: list[Obj] = [
        {"name": "kernel-modules", "hostPath": {"path": "/lib/modules"}},
        {"name": "fuse", "hostPath": {"path": "/dev/fuse"}},
        {"name": "sys", "hostPath": {"path": "/sys"}},
        {"name": "state", "hostPath": {"path": STATE_DIR, "type": "DirectoryOrCreate"}},
        {"name": "shared", "hostPath": {"path": spec.shared_dir, "type": "DirectoryOrCreate"}},
    ]
    if spec.csi.enable:
        node_mounts += [
            {"name": "kubelet-dir", "mountPath": PODS_DIR, "mountPropagation": "Bidirectional"},
            {"name": "plugin-dir", "mountPath": CSI_SOCKET_DIR, "mountPropagation": "Bidirectional"},
            {"name": "device-dir", "mountPath": "/dev"},
        ]
        volumes += [
            {"name": "kubelet-dir", "hostPath": {"path": PODS_DIR, "type": "Directory"}},
            {"name": "plugin-dir", "hostPath": {"path": CSI_SOCKET_DIR, "type": "DirectoryOrCreate"}},
            {"name": "registrar-socket-dir", "hostPath": {"path": PLUGIN_DIR, "type": "DirectoryOrCreate"}},
            {"name": "device-dir", "hostPath": {"path": "/dev", "type": "Directory"}},
        ]
    if spec.kv_backend.backend == "etcd" and inputs.etcd_tls_data is not None:
        node_mounts.append({"name": "etcd-tls", "mountPath": "/run/etcd-tls", "readOnly": True})
        volumes.append({"name": "etcd-tls", "secret": {"secretName": etcd_tls_secret_name(cluster)}})
    node: Obj = {
        "name": names.node_container_name,
        "image": images.node_container,
        "args": ["server"],
        "env": _env(inputs),
        "ports": [{"name": "api", "containerPort": spec.service.internal_port}],
        "securityContext": privileged,
        "volumeMounts": node_mounts,
        "readinessProbe": {
            "tcpSocket": {"port": spec.service.internal_port},
            "periodSeconds": 5,
            "failureThreshold": 3,
        },
    }
    if spec.resources:
        node["resources"] = spec.resources
    init: Obj = {
        "name": names.init_container_name,
        "image": images.init_container,
        "env": [
            {"name": "NODE_IMAGE", "value": images.node_container},
            {"name": "DAEMONSET_NAME", "value": name},
            {"name": "DAEMONSET_NAMESPACE", "value": namespace},
        ],
        "securityContext": privileged,
        "volumeMounts": [
            {"name": "kernel-modules", "mountPath": "/lib/modules", "readOnly": True},
            {"name": "sys", "mountPath": "/sys", "mountPropagation": "Bidirectional"},
            {"name": "state", "mountPath": STATE_DIR, "mountPropagation": "Bidirectional"},
        ],
    }
    containers = [node]
    if spec.csi.enable:
        containers += _csi_node_sidecars(inputs, images)
    pod_spec: Obj = {
        "serviceAccountName": service_account_name(cluster, "node"),
        "hostNetwork": True,
        "hostPID": True,
        "dnsPolicy": "ClusterFirstWithHostNet",
        "terminationGracePeriodSeconds": 30,
        "initContainers": [init],
        "containers": containers,
        "volumes": volumes,
    }
    _place(pod_spec, spec)
    pod_labels = node_selector(cluster)
    template_meta: Obj = {"labels": {**labels(cluster, "node"), **pod_labels}}
    if spec.k8s_distro:
        template_meta["annotations"] = {"kustos.dev/k8s-distro": spec.k8s_distro}
    return {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": _meta(cluster, name, "node"),
        "spec": {
            "selector": {"matchLabels": pod_labels},
            "updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1}},
            "minReadySeconds": 0,
            "template": {"metadata": template_meta, "spec": pod_spec},
        },
    }


# ---- Service, Ingress, secrets -------------------------------------------------------


def api_service(inputs: Inputs) -> Obj:
    cluster, service = inputs.cluster, inputs.cluster.spec.service
    meta = _meta(cluster, service.name, "api")
    if service.annotations:
        meta["annotations"] = dict(service.annotations)
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": meta,
        "spec": {
            "type": service.type,
            "selector": node_selector(cluster),
            "ports": [
                {"name": "api", "protocol": "TCP", "port": service.external_port,
                 "targetPort": service.internal_port},
            ],
        },
    }  # fmt: skip


def credentials_secret_name(cluster: StorageCluster) -> str:
    return f"{cluster.metadata['name']}-credentials"


def tls_secret_name(cluster: StorageCluster) -> str:
    return f"{cluster.metadata['name']}-ingress-tls"


def etcd_tls_secret_name(cluster: StorageCluster) -> str:
    return f"{cluster.metadata['name']}-etcd-tls"


def _secret(cluster: StorageCluster, name: str, component: str, data: dict[str, str], type_: str) -> Obj:
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": _meta(cluster, name, component),
        "type": type_,
        "data": dict(sorted(data.items())),
    }


def secrets(inputs: Inputs) -> list[Obj]:
    """Copies into spec.namespace of what the pods there need from the referenced secrets."""
    cluster, spec = inputs.cluster, inputs.cluster.spec
    data = inputs.secret_data or {}
    result: list[Obj] = []
    if spec.secret_ref_name:
        creds: dict[str, str] = {k: data[k] for k in ("username", "password") if k in data}
        result.append(_secret(cluster, credentials_secret_name(cluster), "credentials", creds, "Opaque"))
    if spec.ingress.enable and spec.ingress.tls:
        tls: dict[str, str] = {k: data.get(k, "") for k in ("tls.crt", "tls.key")}
        result.append(_secret(cluster, tls_secret_name(cluster), "ingress", tls, "kubernetes.io/tls"))
    if spec.csi.enable:
        for switch, suffix, prefix, _param in CREDENTIALS:
            if getattr(spec.csi, switch):
                pair = {
                    "username": data.get(f"{prefix}Username", ""),
                    "password": data.get(f"{prefix}Password", ""),
                }
                result.append(_secret(cluster, f"{cluster.metadata['name']}-{suffix}", "csi", pair, "Opaque"))
    if spec.kv_backend.backend == "etcd" and inputs.etcd_tls_data is not None:
        tls = {k: v for k, v in inputs.etcd_tls_data.items() if k in ("ca.crt", "tls.crt", "tls.key")}
        result.append(_secret(cluster, etcd_tls_secret_name(cluster), "etcd-tls", tls, "Opaque"))
    return result


def ingress(inputs: Inputs) -> Obj:
    cluster, spec = inputs.cluster, inputs.cluster.spec
    meta = _meta(cluster, f"{cluster.metadata['name']}-ingress", "ingress")
    if spec.ingress.annotations:
        meta["annotations"] = dict(spec.ingress.annotations)
    body: Obj = {
        "rules": [{
            "host": spec.ingress.hostname,
            "http": {"paths": [{
                "path": "/", "pathType": "Prefix",
                "backend": {"service": {"name": spec.service.name,
                                        "port": {"number": spec.service.external_port}}},
            }]},
        }],
    }  # fmt: skip
    if spec.ingress.tls:
        body["tls"] = [{"hosts": [spec.ingress.hostname], "secretName": tls_secret_name(cluster)}]
    return {"apiVersion": "networking.k8s.io/v1", "kind": "Ingress", "metadata": meta, "spec": body}


# ---- CSI -----------------------------------------------------------------------------


def csi_driver(inputs: Inputs) -> Obj | None:
    """The CSIDriver object (storage.k8s.io/v1 from 1.18, v1beta1 1.14-1.17; before that the
    cluster driver registrar sidecar registers the driver itself)."""
    version = inputs.kube_version
    if version < (1, 14):
        return None
    body: Obj = {"attachRequired": True, "podInfoOnMount": False}
    if version >= (1, 16):
        body["volumeLifecycleModes"] = ["Persistent"]
    return {
        "apiVersion": "storage.k8s.io/v1" if version >= (1, 18) else "storage.k8s.io/v1beta1",
        "kind": "CSIDriver",
        "metadata": _meta(inputs.cluster, names.CSI_DRIVER, "csi", namespaced=False),
        "spec": body,
    }


def csi_helper(inputs: Inputs) -> Obj:
    """Provisioner, attacher and resizer (and the cluster registrar on old versions), as a
    StatefulSet or a Deployment per csi.deploymentStrategy."""
    cluster, spec = inputs.cluster, inputs.cluster.spec
    images = images_for(inputs)
    common = {
        "env": [{"name": "ADDRESS", "value": "/csi/csi.sock"}],
        "volumeMounts": [{"name": "plugin-dir", "mountPath": "/csi"}],
    }
    containers: list[Obj] = [
        {"name": "csi-external-provisioner", "image": images.csi_external_provisioner_container,
         "args": ["--v=5", "--csi-address=$(ADDRESS)", "--extra-create-metadata"], **common},
        {"name": "csi-external-attacher", "image": images.csi_external_attacher_container,
         "args": ["--v=5", "--csi-address=$(ADDRESS)"], **common},
    ]  # fmt: skip
    if images.csi_external_resizer_container:
        containers.append({"name": "csi-external-resizer", "image": images.csi_external_resizer_container,
                           "args": ["--v=5", "--csi-address=$(ADDRESS)"], **common})  # fmt: skip
    if images.csi_cluster_driver_registrar_container and inputs.kube_version < (1, 14):
        containers.append({"name": "csi-cluster-driver-registrar",
                           "image": images.csi_cluster_driver_registrar_container,
                           "args": ["--v=5", "--pod-info-mount-version=v1", "--csi-address=$(ADDRESS)"],
                           **common})  # fmt: skip
    name = f"{cluster.metadata['name']}-csi-helper"
    selector = component_selector(cluster, "csi-helper")
    pod_spec: Obj = {
        "serviceAccountName": service_account_name(cluster, "csi-helper"),
        "containers": containers,
        "volumes": [
            {"name": "plugin-dir", "hostPath": {"path": CSI_SOCKET_DIR, "type": "DirectoryOrCreate"}}
        ],
    }
    _place(pod_spec, spec)
    body: Obj = {
        "replicas": 1,
        "selector": {"matchLabels": selector},
        "template": {"metadata": {"labels": {**labels(cluster, "csi-helper"), **selector}}, "spec": pod_spec},
    }
    if spec.csi.deployment_strategy == "statefulset":
        kind = "StatefulSet"
        body["serviceName"] = name
    else:
        kind = "Deployment"
        body["strategy"] = {"type": "Recreate"}
    return {
        "apiVersion": "apps/v1",
        "kind": kind,
        "metadata": _meta(cluster, name, "csi-helper"),
        "spec": body,
    }


# ---- StorageClass --------------------------------------------------------------------


def storage_class(inputs: Inputs) -> Obj:
    cluster, spec = inputs.cluster, inputs.cluster.spec
    parameters: dict[str, str] = {"csi.storage.k8s.io/fstype": "ext4"}
    if spec.csi.enable:
        for switch, suffix, _prefix, param in CREDENTIALS:
            if getattr(spec.csi, switch):
                parameters[f"{param}-name"] = f"{cluster.metadata['name']}-{suffix}"
                parameters[f"{param}-namespace"] = spec.namespace
    expandable = spec.csi.enable and bool(images_for(inputs).csi_external_resizer_container)
    return {
        "apiVersion": "storage.k8s.io/v1",
        "kind": "StorageClass",
        "metadata": _meta(cluster, names.storage_class(cluster), "storageclass", namespaced=False),
        "provisioner": names.provisioner(cluster),
        "parameters": parameters,
        "reclaimPolicy": "Delete",
        "volumeBindingMode": "Immediate",
        "allowVolumeExpansion": expandable,
    }


# ---- RBAC ----------------------------------------------------------------------------


def service_account_name(cluster: StorageCluster, component: str) -> str:
    return f"{cluster.metadata['name']}-{component}"


NODE_RULES: list[Obj] = [
    {"apiGroups": [""], "resources": ["nodes", "pods", "persistentvolumes", "persistentvolumeclaims"],
     "verbs": ["get", "list", "watch"]},
    {"apiGroups": [""], "resources": ["events"], "verbs": ["create", "patch"]},
    {"apiGroups": [""], "resources": ["pods"], "verbs": ["delete"]},
    {"apiGroups": ["storage.k8s.io"], "resources": ["storageclasses", "volumeattachments", "csinodes"],
     "verbs": ["get", "list", "watch"]},
    {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"],
     "verbs": ["get", "list", "watch", "create", "update"]},
]  # fmt: skip
CSI_HELPER_RULES: list[Obj] = [
    {"apiGroups": [""], "resources": ["persistentvolumes"],
     "verbs": ["get", "list", "watch", "create", "delete", "update", "patch"]},
    {"apiGroups": [""], "resources": ["persistentvolumeclaims"], "verbs": ["get", "list", "watch", "update"]},
    {"apiGroups": [""], "resources": ["persistentvolumeclaims/status"], "verbs": ["update", "patch"]},
    {"apiGroups": [""], "resources": ["nodes", "pods", "secrets"], "verbs": ["get", "list", "watch"]},
    {"apiGroups": [""], "resources": ["events"], "verbs": ["list", "watch", "create", "update", "patch"]},
    {"apiGroups": ["storage.k8s.io"], "resources": ["storageclasses", "csinodes"],
     "verbs": ["get", "list", "watch"]},
    {"apiGroups": ["storage.k8s.io"], "resources": ["volumeattachments", "volumeattachments/status"],
     "verbs": ["get", "list", "watch", "update", "patch"]},
    {"apiGroups": ["snapshot.storage.k8s.io"], "resources": ["volumesnapshots", "volumesnapshotcontents"],
     "verbs": ["get", "list"]},
    {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"],
     "verbs": ["get", "list", "watch", "create", "update", "patch"]},
]  # fmt: skip
SCHEDULER_CLUSTER_ROLES = ("system:kube-scheduler", "system:volume-scheduler")
# The chart ships ClusterRoles with NODE_RULES and CSI_HELPER_RULES and names them to the
# operator here: a StorageCluster's bindings then refer to them, and the operator needs only
# `bind` on those names (RBAC lets it create a role, or bind one without `bind`, only when it
# holds every permission in it).
SHIPPED_ROLE_ENV = {"node": "KUSTOS_STORAGE_NODE_ROLE", "csi-helper": "KUSTOS_STORAGE_CSI_HELPER_ROLE"}
COMPONENT_RULES = {"node": NODE_RULES, "csi-helper": CSI_HELPER_RULES}


def shipped_roles(environ: Mapping[str, str]) -> dict[str, str]:
    """The shipped ClusterRoles named in ``environ`` (``SHIPPED_ROLE_ENV``), by component."""
    return {component: environ[var] for component, var in SHIPPED_ROLE_ENV.items() if environ.get(var)}


def rbac(inputs: Inputs) -> list[Obj]:
    cluster, spec = inputs.cluster, inputs.cluster.spec
    components: list[tuple[str, list[Obj]]] = [("node", NODE_RULES)]
    if spec.csi.enable:
        components.append(("csi-helper", CSI_HELPER_RULES))
    objects: list[Obj] = []
    for component, rules in components:
        account = service_account_name(cluster, component)
        binding = cluster_scoped_name(cluster, component)
        role = inputs.shipped_roles.get(component)
        objects.append(
            {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": _meta(cluster, account, component)}
        )
        if role is None:
            role = binding
            metadata = _meta(cluster, role, component, namespaced=False)
            objects.append({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
                            "metadata": metadata, "rules": rules})  # fmt: skip
        else:
            # A binding's roleRef is immutable: a binding to a shipped role has a name of its own,
            # so a cluster whose binding referred to a generated role gets a new one and the old
            # binding and role are pruned (applying a changed roleRef would fail every pass).
            binding = f"{binding}.shipped"
        objects.append(
            {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
             "metadata": _meta(cluster, binding, component, namespaced=False),
             "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
             "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": spec.namespace}]}
        )  # fmt: skip
    if not spec.disable_scheduler:
        account = service_account_name(cluster, "scheduler")
        objects.append(
            {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": _meta(cluster, account, "scheduler")}
        )
        for role in SCHEDULER_CLUSTER_ROLES:
            binding = cluster_scoped_name(cluster, "scheduler-" + role.split(":")[-1])
            objects.append({
                "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
                "metadata": _meta(cluster, binding, "scheduler", namespaced=False),
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
                "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": spec.namespace}],
            })  # fmt: skip
    return objects


# ---- the scheduler -------------------------------------------------------------------


def scheduler_image(version: KubeVersion) -> str:
    return f"registry.k8s.io/kube-scheduler:v{version[0]}.{version[1]}.0"


def scheduler(inputs: Inputs) -> list[Obj]:
    """A kube-scheduler under the cluster's scheduler name, with the storage API as an
    extender (ignorable: pods still schedule when the storage API does not answer)."""
    cluster, spec = inputs.cluster, inputs.cluster.spec
    name = names.scheduler_name(cluster)
    config = {
        "apiVersion": "kubescheduler.config.k8s.io/v1",
        "kind": "KubeSchedulerConfiguration",
        "leaderElection": {"leaderElect": True, "resourceName": name, "resourceNamespace": spec.namespace},
        "profiles": [{"schedulerName": name}],
        "extenders": [{
            "urlPrefix": f"http://{spec.service.name}.{spec.namespace}.svc:{spec.service.external_port}"
                         "/v2/k8s/scheduler",
            "filterVerb": "filter", "prioritizeVerb": "prioritize", "weight": 1,
            "enableHTTPS": False, "nodeCacheCapable": False, "ignorable": True,
        }],
    }  # fmt: skip
    config_map = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": _meta(cluster, name, "scheduler"),
        "data": {"config.yaml": json.dumps(config, indent=2, sort_keys=True)},
    }
    selector = component_selector(cluster, "scheduler")
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": _meta(cluster, name, "scheduler"),
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": selector},
            "template": {
                "metadata": {"labels": {**labels(cluster, "scheduler"), **selector}},
                "spec": {
                    "serviceAccountName": service_account_name(cluster, "scheduler"),
                    "containers": [{
                        "name": "kube-scheduler",
                        "image": scheduler_image(inputs.kube_version),
                        "command": ["kube-scheduler", "--config=/etc/kustos-scheduler/config.yaml"],
                        "volumeMounts": [{"name": "config", "mountPath": "/etc/kustos-scheduler"}],
                    }],
                    "volumes": [{"name": "config", "configMap": {"name": name}}],
                },
            },
        },
    }  # fmt: skip
    return [config_map, deployment]


# ---- everything ----------------------------------------------------------------------


def namespace(inputs: Inputs) -> Obj | None:
    cluster = inputs.cluster
    if cluster.spec.namespace == cluster.metadata["namespace"] or inputs.foreign_namespace:
        return None  # it exists already and is not the StorageCluster's to delete
    meta = _meta(cluster, cluster.spec.namespace, "namespace", namespaced=False)
    meta["annotations"] = {CREATED_NAMESPACE_ANNOTATION: names.cluster_key(cluster)}
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": meta}


def desired(inputs: Inputs) -> list[Obj]:
    """Every object, in apply order (namespace and RBAC before what uses them)."""
    spec = inputs.cluster.spec
    objects: list[Obj] = []
    ns = namespace(inputs)
    if ns is not None:
        objects.append(ns)
    objects += rbac(inputs)
    objects += secrets(inputs)
    if spec.csi.enable:
        driver = csi_driver(inputs)
        if driver is not None:
            objects.append(driver)
    objects.append(storage_class(inputs))
    objects.append(api_service(inputs))
    if spec.ingress.enable:
        objects.append(ingress(inputs))
    objects.append(node_daemonset(inputs))
    if spec.csi.enable:
        objects.append(csi_helper(inputs))
    if not spec.disable_scheduler:
        objects += scheduler(inputs)
    for obj in objects:
        obj["metadata"].setdefault("annotations", {})[HASH_ANNOTATION] = manifest_hash(obj)
    return objects


def listing(objects: list[Obj]) -> list[str]:
    """``Kind namespace/name`` per object: what a person reviews in a golden file."""
    return [
        f"{o['kind']} {o['metadata'].get('namespace', '')}/{o['metadata']['name']}".replace(" /", " ")
        for o in objects
    ]


__all__ = [
    "CREATED_NAMESPACE_ANNOTATION",
    "HASH_ANNOTATION",
    "Inputs",
    "desired",
    "labels",
    "listing",
    "node_selector",
    "refusals",
]


def _place(pod_spec: Obj, spec: StorageClusterSpec) -> None:
    """The cluster's nodeSelectorTerms and tolerations, for every pod it runs on its nodes."""
    if spec.node_selector_terms:
        pod_spec["affinity"] = {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": spec.node_selector_terms
                }
            }
        }
    if spec.tolerations:
        pod_spec["tolerations"] = spec.tolerations
