"""A pod with restartPolicy Never run to the end as real processes: phase, exit and logs."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from kustos.devcluster.sandbox import START_ERROR_EXIT, Sandbox, SandboxContext

POD_IP = "127.2.3.4"


def _never_pod(*commands: list[str]) -> dict[str, Any]:
    return {
        "metadata": {"name": "agent", "namespace": "db", "uid": "u-1"},
        "spec": {
            "nodeName": "worker-1",
            "restartPolicy": "Never",
            "containers": [
                {"name": f"c{i}", "image": "ghcr.io/kustos/kustos:dev", "command": command}
                for i, command in enumerate(commands)
            ],
        },
        "status": {"hostIP": "127.2.0.1"},
    }


async def _run_to_the_end(pod: dict[str, Any], tmp_path: Path) -> tuple[Sandbox, list[dict[str, Any]]]:
    """Start the sandbox and collect the statuses it writes until the pod is finished."""
    written: list[dict[str, Any]] = []
    finished = asyncio.Event()

    async def write_status(pod: dict[str, Any], status: dict[str, Any]) -> None:
        written.append(status)
        if status["phase"] in ("Succeeded", "Failed"):
            finished.set()

    async def resolve_claim(namespace: str, claim: str) -> Path | None:
        return None

    async def read_source(kind: str, namespace: str, name: str) -> dict[str, str] | None:
        return None

    context = SandboxContext(
        write_status=write_status,
        resolve_claim=resolve_claim,
        read_source=read_source,
        bin_paths_for=lambda image: {},
        base_env={"PATH": "/usr/bin:/bin"},
        restart_backoff=(0.01, 0.01),
    )
    sandbox = Sandbox(pod=pod, pod_ip=POD_IP, directory=tmp_path, context=context)
    sandbox.start()
    try:
        async with asyncio.timeout(10):
            await finished.wait()
        await asyncio.sleep(0.1)  # nothing is written once the pod finished
        return sandbox, written
    finally:
        await sandbox.stop(grace_seconds=1, write_status=False)


def _terminated(status: dict[str, Any]) -> list[dict[str, Any]]:
    return [c["state"]["terminated"] for c in status["containerStatuses"]]


def _log_lines(sandbox: Sandbox, container: str) -> list[str]:
    return [line.split(" ", 3)[3] for line in sandbox.log_file(container).read_text().splitlines()]


async def test_a_never_pod_whose_container_exits_zero_succeeds_once(tmp_path: Path) -> None:
    sandbox, written = await _run_to_the_end(_never_pod(["/bin/sh", "-c", "echo done"]), tmp_path)

    assert written[-1]["phase"] == "Succeeded"
    assert [t["exitCode"] for t in _terminated(written[-1])] == [0]
    assert written[-1]["containerStatuses"][0]["restartCount"] == 0
    assert [s["phase"] for s in written].count("Succeeded") == 1
    assert _log_lines(sandbox, "c0") == ["done"]


async def test_a_never_pod_whose_container_exits_non_zero_fails_and_keeps_its_output(
    tmp_path: Path,
) -> None:
    pod = _never_pod(["/bin/sh", "-c", "echo out; echo err >&2; exit 3"], ["/bin/true"])

    sandbox, written = await _run_to_the_end(pod, tmp_path)

    assert written[-1]["phase"] == "Failed"
    assert [(t["exitCode"], t["reason"]) for t in _terminated(written[-1])] == [
        (3, "Error"),
        (0, "Completed"),
    ]
    assert sorted(_log_lines(sandbox, "c0")) == ["err", "out"]


async def test_a_container_that_cannot_start_is_a_start_error_not_a_hang(tmp_path: Path) -> None:
    sandbox, written = await _run_to_the_end(_never_pod([str(tmp_path / "no-such-command")]), tmp_path)

    assert written[-1]["phase"] == "Failed"
    (terminated,) = _terminated(written[-1])
    assert terminated["exitCode"] == START_ERROR_EXIT
    assert terminated["reason"] == "StartError"
    assert "no-such-command" in terminated["message"]
    assert sandbox.processes == {}


async def test_a_finished_container_reports_its_termination_message(tmp_path: Path) -> None:
    """What the program wrote at terminationMessagePath; else, with FallbackToLogsOnError and a
    failed exit, the end of its log; else nothing."""
    pod = _never_pod(
        ["/bin/sh", "-c", "echo working; echo 'renewed 2: apiserver' > /dev/termination-log"],
        ["/bin/sh", "-c", "echo working; echo 'failed: no API server' >&2; exit 3"],
        ["/bin/sh", "-c", "echo working; exit 3"],
    )
    pod["spec"]["containers"][1]["terminationMessagePolicy"] = "FallbackToLogsOnError"

    _, written = await _run_to_the_end(pod, tmp_path)

    assert [(t["exitCode"], t.get("message")) for t in _terminated(written[-1])] == [
        (0, "renewed 2: apiserver\n"),
        (3, "working\nfailed: no API server"),
        (3, None),
    ]
