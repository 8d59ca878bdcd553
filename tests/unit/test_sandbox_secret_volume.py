"""A pod whose Secret volume's Secret does not exist yet waits for it, as on a kubelet."""

from __future__ import annotations

import asyncio
import base64
from pathlib import Path
from typing import Any

from kustos.devcluster.sandbox import Sandbox, SandboxContext


def _pod(optional: bool = False) -> dict[str, Any]:
    secret: dict[str, Any] = {"secretName": "member-tls"}
    if optional:
        secret["optional"] = True
    return {
        "metadata": {"name": "m", "namespace": "db", "uid": "u-1"},
        "spec": {
            "nodeName": "worker-1",
            "restartPolicy": "Never",
            "containers": [{
                "name": "c", "image": "ghcr.io/kustos/kustos:dev",
                "command": ["/bin/sh", "-c", "cat /etc/tls/tls.crt 2>/dev/null || echo none"],
                "volumeMounts": [{"name": "tls", "mountPath": "/etc/tls"}],
            }],
            "volumes": [{"name": "tls", "secret": secret}],
        },
        "status": {"hostIP": "127.2.0.1"},
    }  # fmt: skip


async def _run(pod: dict[str, Any], tmp_path: Path, appears_after: int) -> tuple[str, int]:
    """Run the pod to its end; the Secret exists from the ``appears_after``-th look on."""
    looks = 0

    async def resolve_claim(namespace: str, claim: str) -> Path | None:
        return None

    async def read_source(kind: str, namespace: str, name: str) -> dict[str, str] | None:
        nonlocal looks
        looks += 1
        if looks <= appears_after:
            return None
        return {"tls.crt": base64.b64encode(b"CERT").decode()}

    lines = await _run_to_end(pod, tmp_path, resolve_claim=resolve_claim, read_source=read_source)
    return lines[-1], looks


async def _run_to_end(pod: dict[str, Any], tmp_path: Path, **context: Any) -> list[str]:
    """Run the pod until it has finished; what container c printed, line by line."""
    finished = asyncio.Event()

    async def write_status(pod: dict[str, Any], status: dict[str, Any]) -> None:
        if status["phase"] in ("Succeeded", "Failed"):
            finished.set()

    sandbox = Sandbox(
        pod=pod, pod_ip="127.2.3.4", directory=tmp_path,
        context=SandboxContext(
            write_status=write_status, bin_paths_for=lambda image: {}, base_env={"PATH": "/usr/bin:/bin"},
            restart_backoff=(0.01, 0.01), **context,
        ),
    )  # fmt: skip
    sandbox.start()
    try:
        async with asyncio.timeout(10):
            await finished.wait()
        return [line.split(" ", 3)[3] for line in sandbox.log_file("c").read_text().splitlines()]
    finally:
        await sandbox.stop(grace_seconds=1, write_status=False)


async def test_the_container_starts_only_once_its_secret_exists(tmp_path: Path) -> None:
    output, looks = await _run(_pod(), tmp_path, appears_after=3)
    assert output == "CERT" and looks == 4


async def test_an_optional_missing_secret_does_not_hold_the_pod(tmp_path: Path) -> None:
    output, looks = await _run(_pod(optional=True), tmp_path, appears_after=100)
    assert output == "none" and looks == 1


async def test_a_projected_token_is_renewed_before_it_expires(tmp_path: Path) -> None:
    """As a kubelet does: a long-running pod (the operator itself) always reads a live token."""
    path = "/var/run/secrets/kubernetes.io/serviceaccount"
    pod = _pod()
    pod["spec"]["containers"][0].update(
        command=["/bin/sh", "-c", f"cat {path}/token; echo; sleep 2; cat {path}/token"],
        volumeMounts=[{"name": "sa", "mountPath": path}],
    )
    pod["spec"]["volumes"] = [
        {
            "name": "sa",
            "projected": {"sources": [{"serviceAccountToken": {"path": "token", "expirationSeconds": 1}}]},
        }
    ]
    issued = 0

    async def request_token(pod: dict[str, Any], audience: str | None, seconds: int) -> str:
        nonlocal issued
        issued += 1
        return f"token-{issued}"

    async def nothing(*_: str) -> None:
        return None

    read = await _run_to_end(
        pod, tmp_path, resolve_claim=nothing, read_source=nothing, request_token=request_token
    )
    assert read[0] == "token-1" and read[-1] not in ("", "token-1"), read
