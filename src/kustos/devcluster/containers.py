"""One container as one local process: start, log, stop (F-DEV-2).

Output is written in the CRI log format (``<RFC3339Nano> stdout F <line>``), which
is what kubelets write and what kwok serves to ``kubectl logs``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from datetime import UTC, datetime
from pathlib import Path
from typing import IO

from kustos.devcluster.podspec import Invocation


def now_rfc3339() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _cri_timestamp() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%f000Z")


async def _copy_lines(stream: asyncio.StreamReader, name: str, sink: IO[str]) -> None:
    while True:
        line = await stream.readline()
        if not line:
            return
        text = line.decode(errors="replace").rstrip("\n")
        sink.write(f"{_cri_timestamp()} {name} F {text}\n")
        sink.flush()


class ContainerProcess:
    """A started container process, its pid file and its log pump."""

    def __init__(self, process: asyncio.subprocess.Process, pid_file: Path, pump: asyncio.Task[None]):
        self.process = process
        self.pid_file = pid_file
        self.started_at = now_rfc3339()
        self._pump = pump

    @classmethod
    async def start(cls, invocation: Invocation, log_file: Path, pid_file: Path) -> ContainerProcess:
        log_file.parent.mkdir(parents=True, exist_ok=True)
        process = await asyncio.create_subprocess_exec(
            *invocation.argv,
            env=invocation.env,
            cwd=invocation.cwd,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            # Its own process group, so that stopping it also stops what it spawned.
            start_new_session=True,
        )
        pid_file.write_text(str(process.pid))
        sink = log_file.open("a", encoding="utf-8")
        assert process.stdout is not None and process.stderr is not None

        async def pump() -> None:
            try:
                await asyncio.gather(
                    _copy_lines(process.stdout, "stdout", sink),  # type: ignore[arg-type]
                    _copy_lines(process.stderr, "stderr", sink),  # type: ignore[arg-type]
                )
            finally:
                sink.close()

        return cls(process, pid_file, asyncio.create_task(pump()))

    async def wait(self) -> int:
        code = await self.process.wait()
        with contextlib.suppress(Exception):
            async with asyncio.timeout(5):
                await self._pump
        self.pid_file.unlink(missing_ok=True)
        return code

    def signal_group(self, sig: signal.Signals) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, sig)

    async def stop(self, grace_seconds: float) -> int:
        """SIGTERM, then SIGKILL once the grace period is over, as the kubelet does."""
        if self.process.returncode is None:
            self.signal_group(signal.SIGTERM)
            try:
                async with asyncio.timeout(grace_seconds):
                    await self.process.wait()
            except TimeoutError:
                self.signal_group(signal.SIGKILL)
        return await self.wait()

    def kill(self) -> None:
        self.signal_group(signal.SIGKILL)
