"""One pod run as real local processes: volumes, init containers, containers, probes,
restarts and the pod status a kubelet would write (F-DEV-2)."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kustos.devcluster.containers import ContainerProcess, now_rfc3339
from kustos.devcluster.network import SERVICE_ACCOUNT_DIR, enter_pod_argv
from kustos.devcluster.podspec import (
    Invocation,
    build_invocation,
    container_env,
    expand_vars,
    field_value,
    resource_value,
)
from kustos.devcluster.probes import ProbeCounter, ProbeTiming, probe_once

log = logging.getLogger(__name__)

HOLD_SUFFIX = ".hold"
PID_SUFFIX = ".pid"
# The exit code a kubelet reports for a container whose process could not be started.
START_ERROR_EXIT = 128
SOURCE_RETRY = 0.5  # seconds between looks for a missing Secret or ConfigMap
TOKEN_REFRESH_FRACTION = 0.8  # a kubelet renews a projected token after 80% of its lifetime
TOKEN_RETRY = 10.0  # seconds before asking again when a renewal failed
TERMINATION_MESSAGE_PATH = "/dev/termination-log"  # the API server's default terminationMessagePath
# A kubelet's limits on a termination message: the file's first 4096 bytes; from the log
# (FallbackToLogsOnError), its last 80 lines within 2048 bytes.
MESSAGE_FILE_BYTES = 4096
MESSAGE_LOG_LINES = 80
MESSAGE_LOG_BYTES = 2048


@dataclass
class ContainerState:
    """What the pod status says about one container."""

    name: str
    image: str
    restart_count: int = 0
    running_since: str | None = None
    ready: bool = False
    started: bool = False
    last_exit: dict[str, Any] | None = None
    waiting_reason: str = "ContainerCreating"

    @property
    def terminated(self) -> bool:
        """Exited and not about to restart."""
        return not self.running_since and bool(self.last_exit) and self.waiting_reason in ("Completed", "")

    def status(self, pod_uid: str) -> dict[str, Any]:
        state: dict[str, Any]
        if self.running_since:
            state = {"running": {"startedAt": self.running_since}}
        elif self.terminated:
            state = {"terminated": self.last_exit}
        else:
            state = {"waiting": {"reason": self.waiting_reason}}
        result: dict[str, Any] = {
            "name": self.name,
            "image": self.image,
            "imageID": self.image,
            "containerID": f"kustos://{pod_uid}/{self.name}/{self.restart_count}",
            "ready": self.ready,
            "started": self.started,
            "restartCount": self.restart_count,
            "state": state,
            # Only a container that restarted has a previous instance to report.
            "lastState": {"terminated": self.last_exit} if self.last_exit and self.restart_count else {},
        }
        return result


@dataclass
class SandboxContext:
    """What a sandbox needs from the runner: the API and where things live."""

    write_status: Callable[[dict[str, Any], dict[str, Any]], Awaitable[None]]
    resolve_claim: Callable[[str, str], Awaitable[Path | None]]
    read_source: Callable[[str, str, str], Awaitable[dict[str, str] | None]]
    bin_paths_for: Callable[[str], dict[str, Path]]
    base_env: Mapping[str, str]
    restart_backoff: tuple[float, float] = (1.0, 30.0)
    # (pod, audience, expirationSeconds) -> a token of the pod's service account bound to it
    request_token: Callable[[dict[str, Any], str | None, int], Awaitable[str]] | None = None


@dataclass(frozen=True)
class PodNamespaces:
    """The namespaces a pod's processes run in: its network namespace, and the files its
    private mount namespace puts at /etc/resolv.conf and /etc/hosts; its UTS hostname."""

    netns: str
    resolv_conf: Path
    hosts: Path
    hostname: str

    def wrap(self, argv: list[str], mounts: Mapping[str, Path]) -> list[str]:
        token = mounts.get(str(SERVICE_ACCOUNT_DIR)) or mounts.get(f"/var{SERVICE_ACCOUNT_DIR}")
        return enter_pod_argv(self.netns, self.resolv_conf, self.hosts, self.hostname, token, argv)


@dataclass
class Sandbox:
    """The processes, directories and status of one pod on one node."""

    pod: dict[str, Any]
    pod_ip: str
    directory: Path
    context: SandboxContext
    namespaces: PodNamespaces | None = None
    mounts: dict[str, dict[str, Path]] = field(default_factory=dict)
    states: dict[str, ContainerState] = field(default_factory=dict)
    init_states: dict[str, ContainerState] = field(default_factory=dict)
    processes: dict[str, ContainerProcess] = field(default_factory=dict)
    initialized: bool = False
    # Every volume mapped to a directory: until then the pod reports PodReadyToStartContainers
    # False, as a kubelet does while it attaches and mounts (what stuck.waiting_for_volumes reads).
    volumes_ready: bool = False
    env_lookup: dict[tuple[str, str, str], str] = field(default_factory=dict)
    _tasks: list[asyncio.Task[None]] = field(default_factory=list)
    _dirty: asyncio.Event = field(default_factory=asyncio.Event)
    _stopping: bool = False
    _replacing: set[str] = field(default_factory=set)  # containers restarting onto a new image
    # Projected service account tokens written so far: (file, audience, expirationSeconds).
    _tokens: list[tuple[Path, str | None, int]] = field(default_factory=list)
    _log_offsets: dict[str, int] = field(default_factory=dict)  # each container's log size at its start

    @property
    def uid(self) -> str:
        return str(self.pod["metadata"]["uid"])

    @property
    def name(self) -> str:
        return f"{self.pod['metadata']['namespace']}/{self.pod['metadata']['name']}"

    def log_file(self, container: str) -> Path:
        return self.directory / "logs" / f"{container}.log"

    def pid_file(self, container: str) -> Path:
        return self.directory / f"{container}{PID_SUFFIX}"

    def hold_file(self, container: str) -> Path:
        return self.directory / f"{container}{HOLD_SUFFIX}"

    def termination_file(self, container: str) -> Path:
        return self.own_dir(container) / "termination-log"

    def own_dir(self, container: str) -> Path:
        """The container's own files (its working directory unless it names one): a new pod,
        even of the same name, starts with none, as a container's filesystem would."""
        path = self.directory / "containers" / container
        path.mkdir(parents=True, exist_ok=True)
        return path

    # ---- lifecycle -----------------------------------------------------------------

    def start(self) -> None:
        self.pod.setdefault("status", {})["podIP"] = self.pod_ip
        spec = self.pod["spec"]
        for c in spec.get("initContainers") or []:
            self.init_states[c["name"]] = ContainerState(
                c["name"], c["image"], waiting_reason="PodInitializing"
            )
        for c in spec["containers"]:
            self.states[c["name"]] = ContainerState(c["name"], c["image"])
        self._tasks.append(asyncio.create_task(self._status_writer()))
        self._tasks.append(asyncio.create_task(self._main()))

    async def _main(self) -> None:
        try:
            await self._prepare_volumes()
            await self._prepare_env_lookup()
            self._mark_dirty()
            if not await self._run_init_containers():
                return
            self.initialized = True
            self._mark_dirty()
            for container in self.pod["spec"]["containers"]:
                self._tasks.append(asyncio.create_task(self._supervise(container)))
            if self._tokens:
                self._tasks.append(asyncio.create_task(self._rotate_tokens()))
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("pod %s could not start", self.name)

    async def stop(self, grace_seconds: float, write_status: bool = True) -> None:
        """Stop every process (SIGTERM, grace, SIGKILL) and every task of this pod."""
        self._stopping = True
        await asyncio.gather(
            *(p.stop(grace_seconds) for p in self.processes.values()), return_exceptions=True
        )
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._tasks.clear()
        self.processes.clear()
        if write_status:
            for state in self.states.values():
                state.ready, state.running_since = False, None

    def grace_seconds(self) -> float:
        return float(self.pod["spec"].get("terminationGracePeriodSeconds", 30))

    def update_images(self, spec: Mapping[str, Any]) -> None:
        """Restart each container whose image the pod spec changed, keeping the pod's volumes.

        A container's image is the one field of a running pod that may change: a kubelet
        stops the old container (grace period) and starts one from the new image at once.
        """
        wanted = {c["name"]: c["image"] for c in spec.get("containers") or []}
        for container in self.pod["spec"]["containers"]:
            image = wanted.get(container["name"])
            if image is None or image == container["image"]:
                continue
            log.info("image of %s in %s changed to %s: restarting it", container["name"], self.name, image)
            container["image"] = image  # the next start, below or after a back-off, uses it
            process = self.processes.get(container["name"])
            if process is not None:
                self._replacing.add(container["name"])
                self._tasks.append(asyncio.create_task(self._stop_process(process)))

    async def _stop_process(self, process: ContainerProcess) -> None:
        await process.stop(self.grace_seconds())

    def kill_all(self) -> None:
        """A node dies: processes go at once and nobody writes status any more."""
        self._stopping = True
        for process in self.processes.values():
            process.kill()
        for task in self._tasks:
            task.cancel()
        self._tasks.clear()
        self.processes.clear()

    # ---- volumes -------------------------------------------------------------------

    async def _prepare_volumes(self) -> None:
        """Map every volume to a local directory; claims wait until they are bound."""
        volumes: dict[str, Path] = {}
        namespace = self.pod["metadata"]["namespace"]
        for volume in self.pod["spec"].get("volumes") or []:
            name = volume["name"]
            local = self.directory / "volumes" / name
            if "persistentVolumeClaim" in volume:
                claim = volume["persistentVolumeClaim"]["claimName"]
                path = await self.context.resolve_claim(namespace, claim)
                if path is None:
                    # Unbound, or a volume no directory stands for (a CSI volume waiting to
                    # attach): say that the pod waits for its volumes, as a kubelet would.
                    self._mark_dirty()
                while path is None:
                    await asyncio.sleep(0.5)
                    path = await self.context.resolve_claim(namespace, claim)
                local = path
            elif "hostPath" in volume:
                # Host paths stay inside the node's sandbox: never the real host's files.
                node = self.pod["spec"].get("nodeName", "node")
                host = volume["hostPath"]["path"].lstrip("/")
                local = self.directory.parent.parent / "nodes" / node / "hostpath" / host
            elif "configMap" in volume or "secret" in volume:
                await self._write_source_files(volume, local)
            elif "projected" in volume:
                await self._write_projected(volume["projected"], local)
            elif "downwardAPI" in volume:
                self._write_downward(volume["downwardAPI"].get("items") or [], local)
            local.mkdir(parents=True, exist_ok=True)
            volumes[name] = local
        spec = self.pod["spec"]
        for container in (spec.get("initContainers") or []) + spec["containers"]:
            mounts: dict[str, Path] = {}
            for mount in container.get("volumeMounts") or []:
                base = volumes.get(mount["name"])
                if base is None:
                    continue
                # subPathExpr: the official etcd operator's "$(POD_NAME)" (downward API values only)
                expr = str(mount.get("subPathExpr") or "")
                sub = mount.get("subPath") or (
                    expand_vars(expr, container_env(self.pod, container)) if expr else ""
                )
                target = base / sub if sub else base
                target.mkdir(parents=True, exist_ok=True)
                mounts[mount["mountPath"]] = target
            # The termination message file, a kubelet's bind mount: here a path a program is
            # told on its command line (or in its environment) stands for the pod's own file.
            message_path = str(container.get("terminationMessagePath") or TERMINATION_MESSAGE_PATH)
            mounts[message_path] = self.termination_file(container["name"])
            self.mounts[container["name"]] = mounts
        self.volumes_ready = True

    async def _prepare_env_lookup(self) -> None:
        """Read the ConfigMap and Secret keys that containers take env values from."""
        spec = self.pod["spec"]
        namespace = self.pod["metadata"]["namespace"]
        for container in (spec.get("initContainers") or []) + spec["containers"]:
            for source in container.get("envFrom") or []:
                for kind in ("configMap", "secret"):
                    ref = source.get(f"{kind}Ref")
                    if ref:
                        data = await self._read_source(kind, ref["name"], bool(ref.get("optional"))) or {}
                        for key, raw in data.items():
                            value = base64.b64decode(raw).decode() if kind == "secret" else raw
                            self.env_lookup[(kind, ref["name"], key)] = value
            for item in container.get("env") or []:
                source = item.get("valueFrom") or {}
                for kind in ("configMap", "secret"):
                    ref = source.get(f"{kind}KeyRef")
                    if not ref:
                        continue
                    data = await self.context.read_source(kind, namespace, ref["name"]) or {}
                    if ref["key"] in data:
                        raw = data[ref["key"]]
                        value = base64.b64decode(raw).decode() if kind == "secret" else raw
                        self.env_lookup[(kind, ref["name"], ref["key"])] = value

    async def _read_source(self, kind: str, name: str, optional: bool) -> Mapping[str, str] | None:
        """A ConfigMap's or Secret's data. As a kubelet does, a pod whose (non-optional) Secret
        or ConfigMap does not exist yet waits for it instead of starting without it."""
        namespace = self.pod["metadata"]["namespace"]
        data = await self.context.read_source(kind, namespace, name)
        while data is None and not optional:
            await asyncio.sleep(SOURCE_RETRY)
            data = await self.context.read_source(kind, namespace, name)
        return data

    async def _write_source_files(self, volume: Mapping[str, Any], local: Path) -> None:
        kind = "configMap" if "configMap" in volume else "secret"
        source = volume[kind]
        name = source.get("name") or source.get("secretName")
        data = await self._read_source(kind, str(name), bool(source.get("optional")))
        local.mkdir(parents=True, exist_ok=True)
        if data is None:
            return
        items = source.get("items")
        selected = {i["key"]: i["path"] for i in items} if items else {k: k for k in data}
        for key, rel in selected.items():
            if key in data:
                target = local / rel
                target.parent.mkdir(parents=True, exist_ok=True)
                raw = data[key]
                target.write_bytes(base64.b64decode(raw) if kind == "secret" else raw.encode())

    async def _write_projected(self, projected: Mapping[str, Any], local: Path) -> None:
        """A projected volume as a kubelet fills it: the service account token (from the
        TokenRequest API, bound to this pod), ConfigMap and Secret keys, downward API fields.
        What the ServiceAccount admission adds (``kube-api-access-*``) is one of these."""
        local.mkdir(parents=True, exist_ok=True)
        for source in projected.get("sources") or []:
            if "serviceAccountToken" in source and self.context.request_token is not None:
                spec = source["serviceAccountToken"]
                audience, seconds = spec.get("audience"), int(spec.get("expirationSeconds") or 3607)
                token = await self.context.request_token(self.pod, audience, seconds)
                _write_file(local / spec["path"], token.encode())
                self._tokens.append((local / spec["path"], audience, seconds))
            for kind in ("configMap", "secret"):
                if kind in source:
                    await self._write_source_files({kind: source[kind]}, local)
            if "downwardAPI" in source:
                self._write_downward(source["downwardAPI"].get("items") or [], local)

    async def _rotate_tokens(self) -> None:
        """Replace each projected token when 80% of its lifetime has passed, as a kubelet
        does: a pod that runs for hours (the operator itself) keeps a valid token. Written
        by rename, so a reader never sees half a token; a failed request is retried soon."""
        request = self.context.request_token
        assert request is not None
        delay = TOKEN_REFRESH_FRACTION * min(seconds for _, _, seconds in self._tokens)
        while True:
            await asyncio.sleep(delay)
            delay = TOKEN_REFRESH_FRACTION * min(seconds for _, _, seconds in self._tokens)
            for path, audience, seconds in self._tokens:
                try:
                    token = await request(self.pod, audience, seconds)
                except Exception as err:  # the API server may be away for a moment: try again soon
                    log.warning("could not renew the token of %s: %s", self.name, err)
                    delay = TOKEN_RETRY
                    continue
                fresh = path.with_name(f".{path.name}.new")
                fresh.write_bytes(token.encode())
                fresh.replace(path)

    def _write_downward(self, items: list[Mapping[str, Any]], local: Path) -> None:
        local.mkdir(parents=True, exist_ok=True)
        for item in items:
            if "fieldRef" in item:
                _write_file(
                    local / item["path"], field_value(self.pod, item["fieldRef"]["fieldPath"]).encode()
                )
            if "resourceFieldRef" in item:
                _write_file(local / item["path"], resource_value(self.pod, item["resourceFieldRef"]).encode())

    # ---- containers ----------------------------------------------------------------

    def invocation(self, container: Mapping[str, Any], command: list[str] | None = None) -> Invocation:
        shaped = dict(container)
        if command is not None:
            shaped = {**container, "command": command, "args": []}
        mounts = self.mounts.get(container["name"], {})
        invocation = build_invocation(
            self.pod,
            shaped,
            self.context.bin_paths_for(container["image"]),
            mounts,
            self.context.base_env,
            self.env_lookup,
            self.own_dir(container["name"]),
        )
        if self.namespaces is None:
            return invocation
        return Invocation(self.namespaces.wrap(invocation.argv, mounts), invocation.env, invocation.cwd)

    async def _run_init_containers(self) -> bool:
        """Run init containers in order; False when one failed for good (restartPolicy Never)."""
        policy = self.pod["spec"].get("restartPolicy") or "Always"
        for container in self.pod["spec"].get("initContainers") or []:
            state = self.init_states[container["name"]]
            delay = self.context.restart_backoff[0]
            while True:
                code = await self._run_once(container, state, probe=False)
                if code == 0:
                    state.waiting_reason = "Completed"
                    self._mark_dirty()
                    break
                if policy == "Never":
                    self._mark_dirty()  # pod_status reports the pod Failed
                    return False
                state.restart_count += 1
                state.waiting_reason = "CrashLoopBackOff"
                self._mark_dirty()
                await asyncio.sleep(delay)
                delay = min(delay * 2, self.context.restart_backoff[1])
        return True

    async def _run_once(self, container: Mapping[str, Any], state: ContainerState, probe: bool) -> int:
        """Start the container's process, wait for it to exit and record how it ended."""
        try:
            process = await self._launch(container, state)
        except OSError as err:
            # What a kubelet reports when the runtime cannot start the process (no such
            # executable, bad working directory): terminated with StartError, exit 128.
            log.warning("container %s of %s could not start: %s", state.name, self.name, err)
            self._record_start_error(state, err)
            return START_ERROR_EXIT
        probes = asyncio.create_task(self._probe(container, state, process)) if probe else None
        code = await process.wait()
        if probes is not None:
            probes.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await probes
        self._record_exit(state, code, process.started_at, self.termination_message(container, code))
        return code

    async def _launch(self, container: Mapping[str, Any], state: ContainerState) -> ContainerProcess:
        name = container["name"]
        log_file = self.log_file(name)
        self._log_offsets[name] = log_file.stat().st_size if log_file.exists() else 0
        self.termination_file(name).write_bytes(b"")  # each run of the container starts with none
        process = await ContainerProcess.start(
            self.invocation(container), self.log_file(name), self.pid_file(name)
        )
        self.processes[name] = process
        state.image = container["image"]  # what runs now: a kubelet reports the running image
        state.running_since, state.started = process.started_at, True
        state.waiting_reason = ""
        self._mark_dirty()
        return process

    def _record_start_error(self, state: ContainerState, err: OSError) -> None:
        now = now_rfc3339()
        state.running_since, state.ready, state.started = None, False, False
        state.waiting_reason = ""
        state.last_exit = {
            "exitCode": START_ERROR_EXIT,
            "reason": "StartError",
            "message": str(err),
            "startedAt": now,
            "finishedAt": now,
        }

    def _record_exit(self, state: ContainerState, code: int, started_at: str, message: str = "") -> None:
        state.running_since, state.ready, state.started = None, False, False
        state.waiting_reason = ""
        state.last_exit = {
            "exitCode": code if code >= 0 else 128 - code,
            "reason": "Completed" if code == 0 else "Error",
            "startedAt": started_at,
            "finishedAt": now_rfc3339(),
            **({"message": message} if message else {}),
        }
        self.processes.pop(state.name, None)

    def termination_message(self, container: Mapping[str, Any], code: int) -> str:
        """What a kubelet reports as the container's termination message: its file, else with
        ``FallbackToLogsOnError`` and a failed exit the end of this run's log."""
        name = container["name"]
        with contextlib.suppress(OSError):
            with self.termination_file(name).open("rb") as handle:
                text = handle.read(MESSAGE_FILE_BYTES).decode(errors="replace")
            if text.strip():
                return text
        if code == 0 or container.get("terminationMessagePolicy") != "FallbackToLogsOnError":
            return ""
        try:
            with self.log_file(name).open("rb") as handle:
                handle.seek(self._log_offsets.get(name, 0))
                logged = handle.read().decode(errors="replace")
        except OSError:
            return ""
        # CRI log lines: "<time> <stream> <tag> <text>"; the message is the text.
        lines = [line.split(" ", 3)[-1] for line in logged.splitlines()[-MESSAGE_LOG_LINES:]]
        return "\n".join(lines)[-MESSAGE_LOG_BYTES:]

    async def _supervise(self, container: Mapping[str, Any]) -> None:
        """Run a container for the life of the pod, restarting it by its restart policy."""
        name = container["name"]
        state = self.states[name]
        policy = self.pod["spec"].get("restartPolicy") or "Always"
        delay = self.context.restart_backoff[0]
        while not self._stopping:
            if self.hold_file(name).exists():
                # A test crashed this container "for good": stay down until released.
                state.waiting_reason = "CrashLoopBackOff"
                self._mark_dirty()
                await asyncio.sleep(0.5)
                continue
            code = await self._run_once(container, state, probe=True)
            if self._stopping:
                return
            log.info("container %s of %s exited with %s", name, self.name, code)
            if policy == "Never" or (policy == "OnFailure" and code == 0):
                self._mark_dirty()
                return
            state.restart_count += 1
            if name in self._replacing:
                self._replacing.discard(name)
                continue  # stopped for a new image, not crashed: no back-off
            state.waiting_reason = "CrashLoopBackOff"
            self._mark_dirty()
            await asyncio.sleep(delay)
            delay = min(delay * 2, self.context.restart_backoff[1])

    async def _probe(
        self, container: Mapping[str, Any], state: ContainerState, process: ContainerProcess
    ) -> None:
        """Startup gates liveness and readiness; liveness failure restarts the container."""
        startup = container.get("startupProbe")
        if startup and not await self._until(startup, container, want=True):
            return
        readiness, liveness = container.get("readinessProbe"), container.get("livenessProbe")
        if not readiness:
            state.ready = True
            self._mark_dirty()
        tasks = []
        if readiness:
            tasks.append(self._watch_probe(readiness, container, state, "readiness"))
        if liveness:
            tasks.append(self._watch_probe(liveness, container, state, "liveness", process))
        await asyncio.gather(*tasks)

    async def _until(self, probe: Mapping[str, Any], container: Mapping[str, Any], want: bool) -> bool:
        timing = ProbeTiming.of(probe)
        counter = ProbeCounter(timing)
        await asyncio.sleep(timing.initial_delay)
        while True:
            counter.record(await self._probe_once(probe, container))
            if counter.passing == want:
                return True
            await asyncio.sleep(timing.period)

    async def _probe_once(self, probe: Mapping[str, Any], container: Mapping[str, Any]) -> bool:
        return await probe_once(
            probe, container, self.pod_ip, lambda command: self.invocation(container, command)
        )

    async def _watch_probe(
        self,
        probe: Mapping[str, Any],
        container: Mapping[str, Any],
        state: ContainerState,
        kind: str,
        process: ContainerProcess | None = None,
    ) -> None:
        timing = ProbeTiming.of(probe)
        counter = ProbeCounter(timing, passing=(kind == "liveness"))
        await asyncio.sleep(timing.initial_delay)
        while True:
            changed = counter.record(await self._probe_once(probe, container))
            if changed and kind == "readiness":
                state.ready = counter.passing
                self._mark_dirty()
            if changed and kind == "liveness" and not counter.passing and process is not None:
                log.info("liveness probe of %s in %s failed: restarting", state.name, self.name)
                await process.stop(self.grace_seconds())
                return
            await asyncio.sleep(timing.period)

    # ---- status --------------------------------------------------------------------

    def _mark_dirty(self) -> None:
        self._dirty.set()

    def mark_dirty(self) -> None:
        """Write the status again even though nothing changed here (someone else changed it)."""
        self._dirty.set()

    def pod_status(self) -> dict[str, Any]:
        """The status a kubelet would report for this pod now."""
        now = now_rfc3339()
        containers = [s.status(self.uid) for s in self.states.values()]
        all_ready = bool(self.states) and all(s.ready for s in self.states.values())
        running = any(s.running_since for s in self.states.values())
        policy = self.pod["spec"].get("restartPolicy") or "Always"
        finished = [s for s in self.states.values() if s.terminated]
        phase = "Pending"
        if self.initialized and (running or self.states):
            phase = "Running"
        if policy != "Always" and self.states and len(finished) == len(self.states):
            failed = any((s.last_exit or {}).get("exitCode") for s in finished)
            phase = "Failed" if failed else "Succeeded"
        if policy == "Never" and any(
            s.terminated and (s.last_exit or {}).get("exitCode") for s in self.init_states.values()
        ):
            phase = "Failed"
        previous = {c["type"]: c for c in (self.pod.get("status") or {}).get("conditions") or []}

        def condition(kind: str, value: bool) -> dict[str, Any]:
            status = "True" if value else "False"
            old = previous.get(kind)
            since = old["lastTransitionTime"] if old and old.get("status") == status else now
            return {"type": kind, "status": status, "lastTransitionTime": since}

        conditions = [
            condition("PodReadyToStartContainers", self.volumes_ready),
            condition("Initialized", self.initialized),
            condition("ContainersReady", all_ready),
            condition("Ready", all_ready),
            condition("PodScheduled", True),
        ]
        status: dict[str, Any] = {
            "phase": phase,
            "podIP": self.pod_ip,
            "podIPs": [{"ip": self.pod_ip}],
            "hostIP": (self.pod.get("status") or {}).get("hostIP"),
            "startTime": (self.pod.get("status") or {}).get("startTime") or now,
            "conditions": conditions,
            "containerStatuses": containers,
        }
        if self.init_states:
            status["initContainerStatuses"] = [s.status(self.uid) for s in self.init_states.values()]
        return status

    async def _status_writer(self) -> None:
        """Coalesce status changes into few writes; retry until the API takes them."""
        while True:
            await self._dirty.wait()
            self._dirty.clear()
            status = self.pod_status()
            try:
                await self.context.write_status(self.pod, status)
                self.pod["status"] = status
            except asyncio.CancelledError:
                raise
            except Exception as err:
                log.warning("status of %s not written: %s", self.name, err)
                self._dirty.set()
                await asyncio.sleep(1)


def _write_file(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
