"""The pod process runner: the dev cluster's kubelet for allow-listed images (F-DEV-2).

It watches nodes and pods. A pod whose containers all use allow-listed images and
that kwok has given an IP on a live node runs as real local processes (see
``sandbox``); its logs are registered with kwok so that ``kubectl logs`` shows
them. A deleted pod's processes get SIGTERM, then SIGKILL after the grace period,
and the pod object is then removed, as a kubelet would. A node that stops being
managed by kwok (the test helper's "node down") has all its processes killed and
its pods' status left as it was: nobody is there to report.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import os
import shutil
import sys
from pathlib import Path
from typing import Any

import httpx2
from lightkube import AsyncClient
from lightkube.core.exceptions import ApiError
from lightkube.generic_resource import create_namespaced_resource
from lightkube.models.authentication_v1 import BoundObjectReference, TokenRequestSpec
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import (
    ConfigMap,
    PersistentVolume,
    PersistentVolumeClaim,
    Pod,
    Secret,
    ServiceAccountToken,
)
from lightkube.types import PatchType

from kustos.devcluster.binaries import ETCD_VERSIONS, binary_path
from kustos.devcluster.kwokconfig import MANAGED_LABEL
from kustos.devcluster.network import ClusterNetwork, hosts_file, resolv_conf
from kustos.devcluster.podspec import match_image, pod_hostname, pod_is_runnable, pod_is_runner_owned
from kustos.devcluster.sandbox import PodNamespaces, Sandbox, SandboxContext
from kustos.images import KUSTOS_IMAGE_REPOSITORY
from kustos.runtime.informer import Informer, new_state_only
from kustos.runtime.resources import NODES, PODS

log = logging.getLogger(__name__)

KwokLogs = create_namespaced_resource("kwok.x-k8s.io", "v1alpha1", "Logs", "logs")
PARTITIONED_ANNOTATION = "kustos.dev/partitioned"  # cluster.PARTITIONED_ANNOTATION


class NodePartitioned(RuntimeError):
    """The pod's node is cut off: its status cannot reach the API server."""


def sandbox_dir(pods_dir: Path, pod: dict[str, Any]) -> Path:
    meta = pod["metadata"]
    return pods_dir / f"{meta['namespace']}_{meta['name']}_{meta['uid']}"


def bin_paths_for(image: str, images_dir: Path, scripts_dir: Path | None = None) -> dict[str, Path]:
    """The local executables (command name -> path) that stand in for an image.

    An etcd image gets a directory of plain-named links (etcd, etcdctl, ...) to its
    built binaries under ``images_dir``; the operator's own image gets the console
    scripts of the runner's Python environment (``scripts_dir``, by default the
    directory of ``sys.executable``), whatever its tag: the local install is the image.
    """
    match = match_image(image, ETCD_VERSIONS)
    if match is None:
        return {}
    paths: dict[str, Path] = {}
    if match.binaries:
        version = next(iter(match.binaries.values()))
        shim = images_dir / f"{next(iter(match.binaries))}-{version}"
        shim.mkdir(parents=True, exist_ok=True)
        for name, ver in match.binaries.items():
            link = shim / name
            if not link.exists():
                with contextlib.suppress(FileExistsError):
                    link.symlink_to(binary_path(name, ver))
            paths[name] = link
    scripts = scripts_dir or Path(sys.executable).parent
    paths.update({name: scripts / name for name in match.scripts})
    return paths


class PodRunner:
    """Runs allow-listed pods as processes and keeps their status true."""

    def __init__(
        self,
        client: AsyncClient,
        raw: httpx2.AsyncClient,
        state_dir: Path,
        restart_backoff: tuple[float, float] = (1.0, 30.0),
        api_port: int | None = None,
    ) -> None:
        self._client = client
        network_file = state_dir / "network.json"
        self._network = ClusterNetwork.from_file(network_file) if network_file.exists() else None
        self._api_port = api_port
        self._partitioned: set[str] = set()
        self._pods = Informer(raw, PODS)
        self._nodes = Informer(raw, NODES)
        self._pods.add_handler(new_state_only(self._on_pod))
        self._nodes.add_handler(new_state_only(self._on_node))
        self._pods_dir = state_dir / "pods"
        self._images_dir = state_dir / "images"
        self._restart_backoff = restart_backoff
        self._sandboxes: dict[str, Sandbox] = {}
        self._terminating: set[str] = set()
        self._background: set[asyncio.Task[None]] = set()
        self._nodes_up: dict[str, bool] = {}
        self._lock = asyncio.Lock()

    # ---- entry points --------------------------------------------------------------

    async def run(self) -> None:
        self._pods_dir.mkdir(parents=True, exist_ok=True)
        await asyncio.gather(
            self._nodes.run(),
            self._pods.run(),
        )

    async def shutdown(self) -> None:
        """The runner is going away: its processes go too (like a node powering off)."""
        await asyncio.gather(
            *(s.stop(grace_seconds=5, write_status=False) for s in self._sandboxes.values()),
            return_exceptions=True,
        )
        for uid in self._sandboxes:
            self._pod_network_down(uid)
        self._sandboxes.clear()

    # ---- events --------------------------------------------------------------------

    async def _on_node(self, event: str, node: dict[str, Any]) -> None:
        name = node["metadata"]["name"]
        labels = node["metadata"].get("labels") or {}
        up = event != "DELETED" and labels.get(MANAGED_LABEL) == "true"
        partitioned = (
            not up and (node["metadata"].get("annotations") or {}).get(PARTITIONED_ANNOTATION) == "true"
        )
        was_up = self._nodes_up.get(name)
        self._nodes_up[name] = up
        if partitioned and name not in self._partitioned:
            log.info("node %s is partitioned: its pods' links go down, their processes stay", name)
            self._partitioned.add(name)
            self._set_links(name, up=False)
        elif up and name in self._partitioned:
            log.info("node %s is healed: links up, catching up with its pods", name)
            self._partitioned.discard(name)
            self._set_links(name, up=True)
            await self._resync_node(name)
            for sandbox in self._sandboxes.values():
                if sandbox.pod["spec"].get("nodeName") == name:
                    # What the node controller wrote meanwhile (Ready False) is overwritten
                    # with the truth, as a reconnecting kubelet's status sync does.
                    sandbox.mark_dirty()
        elif (was_up and not up) or (name in self._partitioned and not up and not partitioned):
            # A partitioned node stopped (a fencing agent powered it off) dies like any other.
            self._partitioned.discard(name)
            log.info("node %s went down: killing its processes", name)
            for uid, sandbox in list(self._sandboxes.items()):
                if sandbox.pod["spec"].get("nodeName") == name:
                    sandbox.kill_all()
                    del self._sandboxes[uid]
                    self._pod_network_down(uid)
        elif up and not was_up:
            # A node coming back resyncs its pods, as a rebooted kubelet does.
            await self._resync_node(name)

    async def _resync_node(self, node: str) -> None:
        pods = [p for p in self._pods.list() if (p.get("spec") or {}).get("nodeName") == node]
        present = {p["metadata"]["uid"] for p in pods}
        for uid, sandbox in list(self._sandboxes.items()):
            if sandbox.pod["spec"].get("nodeName") == node and uid not in present:
                # Deleted while the node could not hear it: what a kubelet finds on reconnecting.
                async with self._lock:
                    await self._forget(uid, grace=0)
        for pod in pods:
            await self._on_pod("MODIFIED", pod)

    def _set_links(self, node: str, up: bool) -> None:
        if self._network is None:
            return
        for uid, sandbox in self._sandboxes.items():
            if sandbox.pod["spec"].get("nodeName") == node:
                self._network.set_pod_link(uid, up)

    def _pod_network_down(self, uid: str) -> None:
        if self._network is not None:
            self._network.pod_down(uid)

    async def _on_pod(self, event: str, pod: dict[str, Any]) -> None:
        if not pod_is_runner_owned(pod):
            return
        uid = pod["metadata"]["uid"]
        async with self._lock:
            node = pod["spec"].get("nodeName")
            if node in self._partitioned:
                return  # nothing reaches a partitioned node; it catches up when healed
            if event == "DELETED":
                await self._forget(uid, grace=0)
                return
            if not node or not self._nodes_up.get(node):
                return
            if pod["metadata"].get("deletionTimestamp"):
                if uid not in self._terminating:
                    self._terminating.add(uid)
                    task = asyncio.create_task(self._terminate(pod))
                    self._background.add(task)
                    task.add_done_callback(self._background.discard)
                return
            sandbox = self._sandboxes.get(uid)
            if sandbox is not None:
                sandbox.pod["metadata"] = pod["metadata"]
                sandbox.update_images(pod["spec"])
                return
            status = pod.get("status") or {}
            if status.get("phase") in ("Succeeded", "Failed"):
                return  # finished for good: a kubelet never starts a terminal pod again
            pod_ip = status.get("podIP")
            if not pod_ip:
                return  # kwok hands out the IP first
            if not pod_is_runnable(pod, ETCD_VERSIONS):
                await self._report_unavailable_image(pod)
                return
            if self._network is not None and ipaddress.ip_address(pod_ip) not in self._network.cidr:
                await self._report_unreachable_ip(pod, pod_ip)
                return
            await self._start(pod, pod_ip)

    # ---- acting --------------------------------------------------------------------

    async def _start(self, pod: dict[str, Any], pod_ip: str) -> None:
        directory = sandbox_dir(self._pods_dir, pod)
        directory.mkdir(parents=True, exist_ok=True)
        base_env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8"}
        namespaces = None
        if self._network is not None:
            namespaces = await self._pod_network_up(pod, pod_ip, directory)
            if self._api_port is not None:
                port = str(self._api_port)
                base_env.update(
                    KUBERNETES_SERVICE_HOST=self._network.gateway,
                    KUBERNETES_SERVICE_PORT=port,
                    KUBERNETES_SERVICE_PORT_HTTPS=port,
                    KUBERNETES_PORT=f"tcp://{self._network.gateway}:{port}",
                )
        context = SandboxContext(
            write_status=self._write_status,
            resolve_claim=self._resolve_claim,
            read_source=self._read_source,
            bin_paths_for=self._bin_paths_for,
            base_env=base_env,
            restart_backoff=self._restart_backoff,
            request_token=self._request_token,
        )
        sandbox = Sandbox(pod=pod, pod_ip=pod_ip, directory=directory, context=context, namespaces=namespaces)
        self._sandboxes[pod["metadata"]["uid"]] = sandbox
        await self._register_logs(pod, sandbox)
        log.info("starting pod %s on %s at %s", sandbox.name, pod["spec"]["nodeName"], pod_ip)
        sandbox.start()

    async def _pod_network_up(self, pod: dict[str, Any], pod_ip: str, directory: Path) -> PodNamespaces:
        """The pod's network namespace on the bridge, and the files of its mount namespace."""
        assert self._network is not None
        uid = pod["metadata"]["uid"]
        self._network.pod_down(uid)  # the remains of an earlier start of this pod
        for argv in self._network.pod_up_commands(uid, pod_ip):
            process = await asyncio.create_subprocess_exec(
                *argv, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE
            )
            _, err = await process.communicate()
            if process.returncode != 0:
                raise RuntimeError(f"{' '.join(argv)}: {err.decode().strip()}")
        namespace = pod["metadata"]["namespace"]
        hostname = pod_hostname(pod)
        etc = directory / "etc"
        etc.mkdir(parents=True, exist_ok=True)
        (etc / "resolv.conf").write_text(resolv_conf(namespace, self._network.gateway))
        (etc / "hosts").write_text(hosts_file(pod_ip, hostname, pod["spec"].get("subdomain"), namespace))
        return PodNamespaces(self._network.netns(uid), etc / "resolv.conf", etc / "hosts", hostname)

    async def _request_token(self, pod: dict[str, Any], audience: str | None, seconds: int) -> str:
        """A token of the pod's service account bound to the pod, from the TokenRequest API."""
        meta = pod["metadata"]
        bound = BoundObjectReference(apiVersion="v1", kind="Pod", name=meta["name"], uid=meta["uid"])
        request = ServiceAccountToken(
            metadata=ObjectMeta(),
            spec=TokenRequestSpec(
                audiences=[audience] if audience else [], expirationSeconds=seconds, boundObjectRef=bound
            ),
        )
        account = pod["spec"].get("serviceAccountName") or "default"
        result = await self._client.create(request, account, namespace=meta["namespace"])
        assert result.status is not None
        return str(result.status.token)

    async def _terminate(self, pod: dict[str, Any]) -> None:
        """Graceful deletion: stop the processes, then let the pod object go."""
        uid = pod["metadata"]["uid"]
        grace = float(pod["metadata"].get("deletionGracePeriodSeconds") or 0)
        try:
            await self._forget(uid, grace=grace)
            name, namespace = pod["metadata"]["name"], pod["metadata"]["namespace"]
            with contextlib.suppress(ApiError):
                # Only this incarnation: a recreated pod of the same name stays.
                current = await self._client.get(Pod, name, namespace=namespace)
                if current.metadata is not None and current.metadata.uid == uid:
                    await self._client.delete(Pod, name, namespace=namespace, grace_period=0)
        finally:
            self._terminating.discard(uid)

    async def _forget(self, uid: str, grace: float) -> None:
        sandbox = self._sandboxes.pop(uid, None)
        if sandbox is None:
            return
        log.info("stopping pod %s (grace %ss)", sandbox.name, grace)
        await sandbox.stop(grace_seconds=grace, write_status=False)
        self._pod_network_down(uid)
        # emptyDir volumes live and die with the pod; claims live elsewhere.
        shutil.rmtree(sandbox.directory / "volumes", ignore_errors=True)

    async def _report_unavailable_image(self, pod: dict[str, Any]) -> None:
        spec = pod["spec"]
        everything = (spec.get("initContainers") or []) + spec["containers"]
        images = ", ".join(
            dict.fromkeys(c["image"] for c in everything if match_image(c["image"], ETCD_VERSIONS) is None)
        )
        built = ", ".join(ETCD_VERSIONS)
        message = (
            f"image {images} is not built in the dev cluster "
            f"(etcd versions built: {built}; any tag of {KUSTOS_IMAGE_REPOSITORY} runs the local kustos)"
        )
        await self._report_waiting(pod, "ErrImagePull", message)

    async def _report_unreachable_ip(self, pod: dict[str, Any], pod_ip: str) -> None:
        """A pod whose IP (from its node's podCIDR) lies outside the pod network would run in a
        namespace that reaches nothing (an address off the bridge, no route to the gateway):
        it is not started, and says why, as a kubelet whose CNI plugin failed keeps the pod
        ContainerCreating with the plugin's error."""
        assert self._network is not None
        node = pod["spec"].get("nodeName")
        message = (
            f"failed to set up the pod network: the pod's IP {pod_ip} (from node {node}'s podCIDR) "
            f"is outside the cluster's pod network {self._network.cidr} on {self._network.bridge}, "
            f"where nothing routes to it; give the node a podCIDR of that network "
            f"(kwokconfig.node_manifest(..., network=...))"
        )
        log.warning(
            "not starting pod %s/%s: %s", pod["metadata"]["namespace"], pod["metadata"]["name"], message
        )
        await self._report_waiting(pod, "ContainerCreating", message)

    async def _report_waiting(self, pod: dict[str, Any], reason: str, message: str) -> None:
        """The pod Pending, each container waiting for ``reason``: what a kubelet reports for a
        pod it cannot start."""
        statuses = [
            {
                "name": c["name"],
                "image": c["image"],
                "imageID": "",
                "ready": False,
                "restartCount": 0,
                "state": {"waiting": {"reason": reason, "message": message}},
            }
            for c in pod["spec"]["containers"]
        ]
        await self._write_status(pod, {"phase": "Pending", "containerStatuses": statuses})

    # ---- what sandboxes ask of the API ---------------------------------------------

    async def _write_status(self, pod: dict[str, Any], status: dict[str, Any]) -> None:
        if pod["spec"].get("nodeName") in self._partitioned:
            raise NodePartitioned(pod["spec"]["nodeName"])  # the sandbox retries after the heal
        meta = pod["metadata"]
        await self._client.patch(
            Pod.Status,
            meta["name"],
            # The uid makes the patch fail on a recreated pod of the same name.
            {"metadata": {"uid": meta["uid"]}, "status": status},
            namespace=meta["namespace"],
            patch_type=PatchType.MERGE,
        )

    async def _resolve_claim(self, namespace: str, claim: str) -> Path | None:
        """The local directory behind a bound claim, or None while it is not bound yet."""
        try:
            pvc = await self._client.get(PersistentVolumeClaim, claim, namespace=namespace)
            if not pvc.spec or not pvc.spec.volumeName:
                return None
            volume = await self._client.get(PersistentVolume, pvc.spec.volumeName)
        except ApiError:
            return None
        spec = volume.spec
        if spec is None:
            return None
        if spec.local is not None:
            return Path(spec.local.path)
        if spec.hostPath is not None:
            return Path(spec.hostPath.path)
        return None

    async def _read_source(self, kind: str, namespace: str, name: str) -> dict[str, str] | None:
        try:
            if kind == "configMap":
                cm = await self._client.get(ConfigMap, name, namespace=namespace)
                return dict(cm.data or {})
            secret = await self._client.get(Secret, name, namespace=namespace)
            return dict(secret.data or {})
        except ApiError:
            return None

    def _bin_paths_for(self, image: str) -> dict[str, Path]:
        return bin_paths_for(image, self._images_dir)

    async def _register_logs(self, pod: dict[str, Any], sandbox: Sandbox) -> None:
        """Point kwok at our log files so ``kubectl logs`` serves them."""
        meta = pod["metadata"]
        spec = pod["spec"]
        names = [c["name"] for c in (spec.get("initContainers") or []) + spec["containers"]]
        body = KwokLogs.from_dict(
            {
                "apiVersion": "kwok.x-k8s.io/v1alpha1",
                "kind": "Logs",
                "metadata": {
                    "name": meta["name"],
                    "namespace": meta["namespace"],
                    "ownerReferences": [
                        {
                            "apiVersion": "v1",
                            "kind": "Pod",
                            "name": meta["name"],
                            "uid": meta["uid"],
                        }
                    ],
                },
                "spec": {"logs": [{"containers": [n], "logsFile": str(sandbox.log_file(n))} for n in names]},
            }
        )
        with contextlib.suppress(ApiError):
            await self._client.delete(KwokLogs, meta["name"], namespace=meta["namespace"])
        try:
            await self._client.create(body)
        except ApiError as err:
            log.warning("logs of %s not registered with kwok: %s", sandbox.name, err)
