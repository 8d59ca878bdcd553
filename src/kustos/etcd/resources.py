"""The etcd family's resource refs, derived from the CRD info of their API models."""

from __future__ import annotations

from kustos.api.backup import EtcdBackup
from kustos.api.etcd import EtcdCluster
from kustos.runtime.crd import CRDInfo
from kustos.runtime.informer import ResourceRef


def ref(info: CRDInfo) -> ResourceRef:
    """The REST coordinates of a custom resource, as its CRD declares them."""
    return ResourceRef(info.group, info.version, info.plural, info.kind, info.scope == "Namespaced")


ETCDCLUSTERS = ref(EtcdCluster.crd)
ETCDBACKUPS = ref(EtcdBackup.crd)
