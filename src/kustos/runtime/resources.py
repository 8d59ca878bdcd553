"""The built-in resource types kustos watches, by their REST coordinates."""

from __future__ import annotations

from kustos.runtime.informer import ResourceRef

PODS = ResourceRef("", "v1", "pods", "Pod")
NODES = ResourceRef("", "v1", "nodes", "Node", namespaced=False)
SERVICES = ResourceRef("", "v1", "services", "Service")
CONFIGMAPS = ResourceRef("", "v1", "configmaps", "ConfigMap")
CLAIMS = ResourceRef("", "v1", "persistentvolumeclaims", "PersistentVolumeClaim")
VOLUMES = ResourceRef("", "v1", "persistentvolumes", "PersistentVolume", namespaced=False)
STORAGE_CLASSES = ResourceRef("storage.k8s.io", "v1", "storageclasses", "StorageClass", namespaced=False)
