"""The pod status a sandbox reports: container states, phases and conditions, as a kubelet would."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from kustos.devcluster.sandbox import ContainerState, Sandbox, SandboxContext

UID = "5f0e-41aa"
POD_IP = "127.2.3.4"
OLD = "2000-01-01T00:00:00Z"
SHIM = Path("/cache/images/etcd-v3.6.16")


async def _write_status(pod: dict[str, Any], status: dict[str, Any]) -> None:
    return None


async def _resolve_claim(namespace: str, claim: str) -> Path | None:
    return None


async def _read_source(kind: str, namespace: str, name: str) -> dict[str, str] | None:
    return None


def _bin_paths_for(image: str) -> dict[str, Path]:
    return {name: SHIM / name for name in ("etcd", "etcdctl", "etcdutl")} if "etcd" in image else {}


def _pod(
    containers: list[str], restart_policy: str | None = None, init: list[str] | None = None
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "nodeName": "worker-1",
        "containers": [{"name": n, "image": "registry.k8s.io/etcd:3.6.16-0"} for n in containers],
    }
    if init:
        spec["initContainers"] = [{"name": n, "image": "registry.k8s.io/etcd:3.6.16-0"} for n in init]
    if restart_policy:
        spec["restartPolicy"] = restart_policy
    return {
        "metadata": {"name": "etcd-0", "namespace": "db", "uid": UID},
        "spec": spec,
        "status": {"hostIP": "127.2.0.1", "startTime": "2026-02-03T04:05:06Z"},
    }


def _sandbox(pod: dict[str, Any], tmp_path: Path) -> Sandbox:
    context = SandboxContext(
        write_status=_write_status,
        resolve_claim=_resolve_claim,
        read_source=_read_source,
        bin_paths_for=_bin_paths_for,
        base_env={"PATH": "/usr/bin:/bin"},
    )
    sandbox = Sandbox(pod=pod, pod_ip=POD_IP, directory=tmp_path, context=context)
    # What start() sets up, without starting anything.
    pod["status"]["podIP"] = POD_IP
    spec = pod["spec"]
    for c in spec.get("initContainers") or []:
        sandbox.init_states[c["name"]] = ContainerState(
            c["name"], c["image"], waiting_reason="PodInitializing"
        )
    for c in spec["containers"]:
        sandbox.states[c["name"]] = ContainerState(c["name"], c["image"])
    return sandbox


def _exit(code: int) -> dict[str, Any]:
    return {
        "exitCode": code,
        "reason": "Completed" if code == 0 else "Error",
        "startedAt": "2026-02-03T04:05:07Z",
        "finishedAt": "2026-02-03T04:05:09Z",
    }


def _completed(state: ContainerState, code: int) -> None:
    state.last_exit, state.waiting_reason = _exit(code), "Completed"
    state.running_since, state.ready, state.started = None, False, False


def _running(state: ContainerState, ready: bool = True) -> None:
    state.running_since, state.started, state.ready, state.waiting_reason = OLD, True, ready, ""


def _conditions(status: dict[str, Any]) -> dict[str, str]:
    return {c["type"]: c["status"] for c in status["conditions"]}


# ---- container states -----------------------------------------------------------------


def test_a_new_container_is_waiting_for_creation() -> None:
    status = ContainerState("etcd", "registry.k8s.io/etcd:3.6.16-0").status(UID)

    assert status["state"] == {"waiting": {"reason": "ContainerCreating"}}
    assert status["lastState"] == {}
    assert status["ready"] is False
    assert status["started"] is False
    assert status["restartCount"] == 0
    assert status["name"] == "etcd"
    assert status["image"] == "registry.k8s.io/etcd:3.6.16-0"


def test_a_running_container_reports_when_it_started() -> None:
    state = ContainerState("etcd", "img")
    _running(state)

    status = state.status(UID)

    assert status["state"] == {"running": {"startedAt": OLD}}
    assert status["ready"] is True
    assert status["started"] is True
    assert status["lastState"] == {}


def test_a_restarted_container_reports_its_previous_exit_as_last_state() -> None:
    state = ContainerState("etcd", "img", restart_count=2, last_exit=_exit(137))
    _running(state, ready=False)

    status = state.status(UID)

    assert status["state"] == {"running": {"startedAt": OLD}}
    assert status["lastState"] == {"terminated": _exit(137)}
    assert status["restartCount"] == 2


def test_a_crash_looping_container_is_waiting_with_its_last_exit() -> None:
    state = ContainerState(
        "etcd", "img", restart_count=1, last_exit=_exit(1), waiting_reason="CrashLoopBackOff"
    )

    status = state.status(UID)

    assert status["state"] == {"waiting": {"reason": "CrashLoopBackOff"}}
    assert status["lastState"] == {"terminated": _exit(1)}


@pytest.mark.parametrize("code", [0, 3])
def test_a_container_that_will_not_restart_is_terminated(code: int) -> None:
    state = ContainerState("job", "img")
    _completed(state, code)

    assert state.status(UID)["state"] == {"terminated": _exit(code)}


def test_a_container_that_terminated_once_has_no_last_state() -> None:
    state = ContainerState("job", "img")
    _completed(state, 0)

    assert state.status(UID)["lastState"] == {}


def test_each_container_incarnation_has_its_own_id() -> None:
    first = ContainerState("etcd", "img").status(UID)["containerID"]
    second = ContainerState("etcd", "img", restart_count=1).status(UID)["containerID"]
    other_pod = ContainerState("etcd", "img").status("another-uid")["containerID"]

    assert len({first, second, other_pod}) == 3
    assert first.startswith("kustos://")


# ---- pod phase and conditions ---------------------------------------------------------


def test_a_pod_that_is_not_initialized_is_pending(tmp_path: Path) -> None:
    sandbox = _sandbox(_pod(["etcd"], init=["wait"]), tmp_path)
    sandbox.volumes_ready = True

    status = sandbox.pod_status()

    assert status["phase"] == "Pending"
    assert _conditions(status) == {
        "PodReadyToStartContainers": "True",
        "Initialized": "False",
        "ContainersReady": "False",
        "Ready": "False",
        "PodScheduled": "True",
    }
    assert status["podIP"] == POD_IP
    assert status["podIPs"] == [{"ip": POD_IP}]
    assert status["hostIP"] == "127.2.0.1"
    assert [s["state"] for s in status["initContainerStatuses"]] == [
        {"waiting": {"reason": "PodInitializing"}}
    ]
    assert [s["state"] for s in status["containerStatuses"]] == [{"waiting": {"reason": "ContainerCreating"}}]


async def test_a_pod_whose_claim_has_no_volume_yet_says_it_cannot_start_containers(tmp_path: Path) -> None:
    """As a kubelet waiting to attach or mount: Pending, PodReadyToStartContainers False,
    written while it waits (the claim never resolves here)."""
    pod = _pod(["etcd"])
    pod["spec"]["volumes"] = [{"name": "data", "persistentVolumeClaim": {"claimName": "etcd-0-data"}}]
    written: list[dict[str, Any]] = []

    async def write_status(_: dict[str, Any], status: dict[str, Any]) -> None:
        written.append(status)

    sandbox = _sandbox(pod, tmp_path)
    sandbox.context.write_status = write_status
    sandbox.start()
    try:
        for _ in range(50):
            if written:
                break
            await asyncio.sleep(0.02)
    finally:
        await sandbox.stop(0, write_status=False)

    assert written, "no status written while the pod waits for its volume"
    assert written[0]["phase"] == "Pending"
    assert _conditions(written[0])["PodReadyToStartContainers"] == "False"
    assert [s["state"] for s in written[0]["containerStatuses"]] == [
        {"waiting": {"reason": "ContainerCreating"}}
    ]


def test_a_pod_with_all_containers_running_and_ready_is_ready(tmp_path: Path) -> None:
    sandbox = _sandbox(_pod(["etcd", "sidecar"]), tmp_path)
    sandbox.initialized = True
    for state in sandbox.states.values():
        _running(state)

    status = sandbox.pod_status()

    assert status["phase"] == "Running"
    assert _conditions(status)["Initialized"] == "True"
    assert _conditions(status)["ContainersReady"] == "True"
    assert _conditions(status)["Ready"] == "True"
    assert [c["name"] for c in status["containerStatuses"]] == ["etcd", "sidecar"]


def test_a_pod_is_not_ready_while_one_container_is_not(tmp_path: Path) -> None:
    sandbox = _sandbox(_pod(["etcd", "sidecar"]), tmp_path)
    sandbox.initialized = True
    _running(sandbox.states["etcd"])
    _running(sandbox.states["sidecar"], ready=False)

    status = sandbox.pod_status()

    assert status["phase"] == "Running"
    assert _conditions(status)["ContainersReady"] == "False"
    assert _conditions(status)["Ready"] == "False"


def test_an_initialized_pod_is_running_while_its_containers_start(tmp_path: Path) -> None:
    sandbox = _sandbox(_pod(["etcd"]), tmp_path)
    sandbox.initialized = True

    assert sandbox.pod_status()["phase"] == "Running"


@pytest.mark.parametrize("policy", ["Never", "OnFailure"])
def test_a_pod_whose_containers_all_completed_successfully_succeeded(tmp_path: Path, policy: str) -> None:
    sandbox = _sandbox(_pod(["job", "helper"], restart_policy=policy), tmp_path)
    sandbox.initialized = True
    for state in sandbox.states.values():
        _completed(state, 0)

    status = sandbox.pod_status()

    assert status["phase"] == "Succeeded"
    assert _conditions(status)["Ready"] == "False"
    assert [s["state"]["terminated"]["exitCode"] for s in status["containerStatuses"]] == [0, 0]


def test_a_pod_with_a_failed_container_that_will_not_restart_failed(tmp_path: Path) -> None:
    sandbox = _sandbox(_pod(["job", "helper"], restart_policy="Never"), tmp_path)
    sandbox.initialized = True
    _completed(sandbox.states["job"], 2)
    _completed(sandbox.states["helper"], 0)

    status = sandbox.pod_status()

    assert status["phase"] == "Failed"
    assert status["containerStatuses"][0]["state"]["terminated"]["reason"] == "Error"


def test_a_pod_is_running_until_every_container_finished(tmp_path: Path) -> None:
    sandbox = _sandbox(_pod(["job", "helper"], restart_policy="Never"), tmp_path)
    sandbox.initialized = True
    _completed(sandbox.states["job"], 1)
    _running(sandbox.states["helper"])

    assert sandbox.pod_status()["phase"] == "Running"


def test_a_pod_that_always_restarts_never_finishes(tmp_path: Path) -> None:
    sandbox = _sandbox(_pod(["etcd"]), tmp_path)
    sandbox.initialized = True
    state = sandbox.states["etcd"]
    state.last_exit, state.restart_count, state.waiting_reason = _exit(0), 1, "CrashLoopBackOff"

    assert sandbox.pod_status()["phase"] == "Running"


def test_a_pod_whose_init_container_failed_without_restarts_failed(tmp_path: Path) -> None:
    sandbox = _sandbox(_pod(["etcd"], restart_policy="Never", init=["migrate"]), tmp_path)
    # As _run_init_containers leaves it after _record_exit of a non-zero exit.
    state = sandbox.init_states["migrate"]
    state.last_exit, state.waiting_reason = _exit(1), ""

    assert sandbox.pod_status()["phase"] == "Failed"


def test_completed_init_containers_are_reported_as_terminated(tmp_path: Path) -> None:
    sandbox = _sandbox(_pod(["etcd"], init=["migrate"]), tmp_path)
    _completed(sandbox.init_states["migrate"], 0)
    sandbox.initialized = True

    status = sandbox.pod_status()

    assert status["initContainerStatuses"][0]["state"] == {"terminated": _exit(0)}
    assert _conditions(status)["Initialized"] == "True"


def test_a_pod_without_init_containers_reports_no_init_statuses(tmp_path: Path) -> None:
    assert "initContainerStatuses" not in _sandbox(_pod(["etcd"]), tmp_path).pod_status()


def test_start_time_is_kept_from_the_existing_status(tmp_path: Path) -> None:
    assert _sandbox(_pod(["etcd"]), tmp_path).pod_status()["startTime"] == "2026-02-03T04:05:06Z"


def test_a_condition_keeps_its_transition_time_while_its_status_holds(tmp_path: Path) -> None:
    pod = _pod(["etcd"])
    pod["status"]["conditions"] = [
        {"type": "Initialized", "status": "True", "lastTransitionTime": OLD},
        {"type": "Ready", "status": "False", "lastTransitionTime": OLD},
        {"type": "PodScheduled", "status": "True", "lastTransitionTime": OLD},
    ]
    sandbox = _sandbox(pod, tmp_path)
    sandbox.initialized = True
    _running(sandbox.states["etcd"])

    times = {c["type"]: c["lastTransitionTime"] for c in sandbox.pod_status()["conditions"]}

    assert times["Initialized"] == OLD
    assert times["PodScheduled"] == OLD
    assert times["Ready"] != OLD  # False -> True is a transition
    assert times["ContainersReady"] != OLD  # not reported before


def test_reporting_twice_without_change_keeps_every_transition_time(tmp_path: Path) -> None:
    sandbox = _sandbox(_pod(["etcd"]), tmp_path)
    sandbox.initialized = True
    _running(sandbox.states["etcd"])
    first = sandbox.pod_status()
    for condition in first["conditions"]:
        condition["lastTransitionTime"] = OLD
    sandbox.pod["status"] = first

    second = sandbox.pod_status()

    assert {c["lastTransitionTime"] for c in second["conditions"]} == {OLD}
    assert _conditions(second) == _conditions(first)


# ---- invocations for probes -----------------------------------------------------------


def test_an_exec_probe_command_replaces_the_container_command_and_args(tmp_path: Path) -> None:
    pod = _pod(["etcd"])
    pod["spec"]["containers"][0].update(command=["etcd"], args=["--name=etcd-0"])
    sandbox = _sandbox(pod, tmp_path)
    sandbox.mounts["etcd"] = {"/var/lib/etcd": tmp_path / "data"}

    invocation = sandbox.invocation(
        pod["spec"]["containers"][0], ["etcdctl", "--endpoints=localhost:2379", "endpoint", "health"]
    )

    assert invocation.argv == [str(SHIM / "etcdctl"), "--endpoints=localhost:2379", "endpoint", "health"]
    assert invocation.env["HOSTNAME"] == "etcd-0"
    assert invocation.env["PATH"].split(":")[0] == str(SHIM)


def test_a_container_invocation_uses_its_own_mounts(tmp_path: Path) -> None:
    pod = _pod(["etcd"])
    pod["spec"]["containers"][0]["args"] = ["--data-dir=/var/lib/etcd"]
    sandbox = _sandbox(pod, tmp_path)
    sandbox.mounts["etcd"] = {"/var/lib/etcd": tmp_path / "data"}

    invocation = sandbox.invocation(pod["spec"]["containers"][0])

    assert invocation.argv == [str(SHIM / "etcd"), f"--data-dir={tmp_path / 'data'}"]
