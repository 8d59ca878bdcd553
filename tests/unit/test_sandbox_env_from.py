"""What the official etcd operator's pods need of the runner (issue 28 item 5): ``envFrom`` a
ConfigMap (its initial-cluster settings), and a data directory of the pod's own when no volume
is mounted there (etcd's default ``--data-dir`` is ``<name>.etcd`` in the working directory)."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

from tests.unit.test_sandbox_secret_volume import _run_to_end

SOURCES = {
    ("configMap", "etcd-state"): {
        "ETCD_INITIAL_CLUSTER_STATE": "new",
        "ETCD_INITIAL_CLUSTER": "etcd-0=http://etcd-0.etcd:2380",
        "not a name": "skipped",
    },
    ("secret", "creds"): {"PASSWORD": base64.b64encode(b"s3cret").decode()},
}


def _pod(uid: str, script: str) -> dict[str, Any]:
    return {
        "metadata": {"name": "etcd-0", "namespace": "db", "uid": uid},
        "spec": {
            "nodeName": "worker-1",
            "restartPolicy": "Never",
            "containers": [{
                "name": "c", "image": "ghcr.io/kustos/kustos:dev",
                "command": ["/bin/sh", "-c", script],
                "envFrom": [
                    {"configMapRef": {"name": "etcd-state"}},
                    {"secretRef": {"name": "creds"}, "prefix": "ETCD_"},
                    {"configMapRef": {"name": "absent", "optional": True}},
                ],
                "env": [{"name": "ETCD_INITIAL_CLUSTER_STATE", "value": "existing"}],
            }],
        },
        "status": {"hostIP": "127.2.0.1"},
    }  # fmt: skip


async def read_source(kind: str, namespace: str, name: str) -> dict[str, str] | None:
    return SOURCES.get((kind, name))


async def resolve_claim(namespace: str, claim: str) -> Path | None:
    return None


async def test_env_from_brings_every_key_with_its_prefix_and_env_wins(tmp_path: Path) -> None:
    script = 'echo "$ETCD_INITIAL_CLUSTER|$ETCD_INITIAL_CLUSTER_STATE|$ETCD_PASSWORD|$PASSWORD"'

    lines = await _run_to_end(
        _pod("u-1", script), tmp_path, read_source=read_source, resolve_claim=resolve_claim
    )

    assert lines == ["etcd-0=http://etcd-0.etcd:2380|existing|s3cret|"]


async def test_a_new_pod_of_the_same_name_does_not_find_the_old_ones_default_data_dir(
    tmp_path: Path,
) -> None:
    """Like a StatefulSet's pod deleted and created again without a volume: a fresh etcd."""
    script = "if [ -e etcd-0.etcd ]; then echo found; else mkdir etcd-0.etcd && echo fresh; fi"
    pods = tmp_path / "pods"

    first = await _run_to_end(
        _pod("u-1", script), pods / "db_etcd-0_u-1", read_source=read_source, resolve_claim=resolve_claim
    )
    second = await _run_to_end(
        _pod("u-2", script), pods / "db_etcd-0_u-2", read_source=read_source, resolve_claim=resolve_claim
    )

    assert (first, second) == (["fresh"], ["fresh"])
    assert not Path("etcd-0.etcd").exists()  # nothing in the runner's own working directory
