"""Container probes (readiness, liveness, startup) run against the real local process."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import httpx

from kustos.devcluster.podspec import Invocation


@dataclass(frozen=True)
class ProbeTiming:
    """The probe's own timing fields, with the Kubernetes defaults."""

    initial_delay: float = 0.0
    period: float = 10.0
    timeout: float = 1.0
    success_threshold: int = 1
    failure_threshold: int = 3

    @classmethod
    def of(cls, probe: Mapping[str, Any]) -> ProbeTiming:
        return cls(
            initial_delay=float(probe.get("initialDelaySeconds") or 0),
            period=float(probe.get("periodSeconds") or 10),
            timeout=float(probe.get("timeoutSeconds") or 1),
            success_threshold=int(probe.get("successThreshold") or 1),
            failure_threshold=int(probe.get("failureThreshold") or 3),
        )


@dataclass
class ProbeCounter:
    """Turns single probe results into a verdict the way the kubelet does: by thresholds."""

    timing: ProbeTiming
    passing: bool = False
    successes: int = 0
    failures: int = 0

    def record(self, ok: bool) -> bool:
        """Record one result; return True when the verdict changed."""
        if ok:
            self.successes, self.failures = self.successes + 1, 0
            if not self.passing and self.successes >= self.timing.success_threshold:
                self.passing = True
                return True
        else:
            self.successes, self.failures = 0, self.failures + 1
            if self.passing and self.failures >= self.timing.failure_threshold:
                self.passing = False
                return True
        return False


def _port(value: Any, container: Mapping[str, Any]) -> int:
    """A probe port is a number or the name of one of the container's ports."""
    if isinstance(value, int) or str(value).isdigit():
        return int(value)
    for port in container.get("ports") or []:
        if port.get("name") == value:
            return int(port["containerPort"])
    raise ValueError(f"no container port named {value!r}")


async def probe_once(
    probe: Mapping[str, Any],
    container: Mapping[str, Any],
    pod_ip: str,
    exec_invocation: Callable[[list[str]], Invocation],
) -> bool:
    """Run one probe; any error or timeout is a failure, as for the kubelet."""
    timeout = ProbeTiming.of(probe).timeout
    try:
        if "httpGet" in probe:
            http = probe["httpGet"]
            scheme = str(http.get("scheme") or "HTTP").lower()
            host = http.get("host") or pod_ip
            url = f"{scheme}://{host}:{_port(http['port'], container)}{http.get('path') or '/'}"
            headers = {h["name"]: h["value"] for h in http.get("httpHeaders") or []}
            async with httpx.AsyncClient(verify=False, timeout=timeout, trust_env=False) as client:
                response = await client.get(url, headers=headers)
            return 200 <= response.status_code < 400
        if "tcpSocket" in probe:
            tcp = probe["tcpSocket"]
            host = tcp.get("host") or pod_ip
            async with asyncio.timeout(timeout):
                _, writer = await asyncio.open_connection(host, _port(tcp["port"], container))
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()
            return True
        if "exec" in probe:
            invocation = exec_invocation(list(probe["exec"].get("command") or []))
            process = await asyncio.create_subprocess_exec(
                *invocation.argv,
                env=invocation.env,
                cwd=invocation.cwd,
                stdout=asyncio.subprocess.DEVNULL,
                stderr=asyncio.subprocess.DEVNULL,
            )
            try:
                async with asyncio.timeout(timeout):
                    return await process.wait() == 0
            except TimeoutError:
                process.kill()
                await process.wait()
                return False
        if "grpc" in probe:
            # No gRPC health client here: a TCP connect is the closest honest check.
            grpc = probe["grpc"]
            async with asyncio.timeout(timeout):
                _, writer = await asyncio.open_connection(pod_ip, int(grpc["port"]))
            writer.close()
            return True
    except (OSError, TimeoutError, httpx.HTTPError, ValueError):
        return False
    return False
