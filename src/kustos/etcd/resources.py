"""The etcd family's resource refs, derived from the CRD info of their API models."""

from __future__ import annotations

from kustos.api.backup import EtcdBackup
from kustos.api.etcd import EtcdCluster

ETCDCLUSTERS = EtcdCluster.crd.ref
ETCDBACKUPS = EtcdBackup.crd.ref
