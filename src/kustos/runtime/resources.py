"""The built-in resource types kustos reads or writes, by their REST coordinates: declared
here once (a custom resource's come from its model's CRD info, ``Model.crd.ref``)."""

from __future__ import annotations

from kustos.runtime.refs import ResourceRef

PODS = ResourceRef("", "v1", "pods", "Pod")
NODES = ResourceRef("", "v1", "nodes", "Node", namespaced=False)
SERVICES = ResourceRef("", "v1", "services", "Service")
CONFIGMAPS = ResourceRef("", "v1", "configmaps", "ConfigMap")
CLAIMS = ResourceRef("", "v1", "persistentvolumeclaims", "PersistentVolumeClaim")
VOLUMES = ResourceRef("", "v1", "persistentvolumes", "PersistentVolume", namespaced=False)
STORAGE_CLASSES = ResourceRef("storage.k8s.io", "v1", "storageclasses", "StorageClass", namespaced=False)
SECRETS = ResourceRef("", "v1", "secrets", "Secret")
NAMESPACES = ResourceRef("", "v1", "namespaces", "Namespace", namespaced=False)
SERVICE_ACCOUNTS = ResourceRef("", "v1", "serviceaccounts", "ServiceAccount")
CLUSTER_ROLES = ResourceRef(
    "rbac.authorization.k8s.io", "v1", "clusterroles", "ClusterRole", namespaced=False
)
CLUSTER_ROLE_BINDINGS = ResourceRef(
    "rbac.authorization.k8s.io", "v1", "clusterrolebindings", "ClusterRoleBinding", namespaced=False
)
CSI_DRIVERS = ResourceRef("storage.k8s.io", "v1", "csidrivers", "CSIDriver", namespaced=False)
INGRESSES = ResourceRef("networking.k8s.io", "v1", "ingresses", "Ingress")
NETWORK_POLICIES = ResourceRef("networking.k8s.io", "v1", "networkpolicies", "NetworkPolicy")
DAEMONSETS = ResourceRef("apps", "v1", "daemonsets", "DaemonSet")
STATEFULSETS = ResourceRef("apps", "v1", "statefulsets", "StatefulSet")
DEPLOYMENTS = ResourceRef("apps", "v1", "deployments", "Deployment")
DISRUPTION_BUDGETS = ResourceRef("policy", "v1", "poddisruptionbudgets", "PodDisruptionBudget")
