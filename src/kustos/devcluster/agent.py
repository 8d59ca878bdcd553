"""The dev cluster's node agent: the pod process runner and the local volume provisioner.

It runs as its own process (``python -m kustos.devcluster.agent``) next to the
control plane, so that ``kustos dev up`` can return while the cluster keeps
running, and so that a test crashing the operator never takes pods down with it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
from pathlib import Path
from urllib.parse import urlsplit

import httpx2
import yaml
from lightkube import AsyncClient, KubeConfig

from kustos.devcluster.provisioner import LocalPathProvisioner
from kustos.devcluster.runner import PodRunner
from kustos.runtime.kube import connect, load_config
from kustos.runtime.logs import setup_logging
from kustos.runtime.metrics import Metrics


async def serve(kubeconfig: Path, state_dir: Path, restart_backoff: tuple[float, float]) -> None:
    clients = connect(load_config(kubeconfig), Metrics())
    # The runner and provisioner use lightkube's typed client; the operator does not load lightkube.
    typed = AsyncClient(
        KubeConfig.from_file(kubeconfig), field_manager="kustos-dev", timeout=httpx2.Timeout(30)
    )
    server = yaml.safe_load(kubeconfig.read_text())["clusters"][0]["cluster"]["server"]
    api_port = urlsplit(server).port
    runner = PodRunner(typed, clients.raw, state_dir, restart_backoff=restart_backoff, api_port=api_port)
    provisioner = LocalPathProvisioner(typed, clients.raw, state_dir / "volumes")
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    tasks = [asyncio.create_task(runner.run()), asyncio.create_task(provisioner.run())]
    stopper = asyncio.create_task(stop.wait())
    done, _ = await asyncio.wait([stopper, *tasks], return_when=asyncio.FIRST_COMPLETED)
    stopper.cancel()
    failed = [t for t in done if t is not stopper]
    for task in tasks:
        task.cancel()
    for task in tasks:
        with contextlib.suppress(asyncio.CancelledError):
            await task
    await runner.shutdown()
    await typed.close()
    await clients.close()
    for finished in failed:
        finished.result()  # a loop that ended by itself is a bug: exit non-zero with its traceback


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--kubeconfig", type=Path, required=True)
    parser.add_argument("--state-dir", type=Path, required=True)
    parser.add_argument("--restart-backoff", type=float, nargs=2, default=(1.0, 30.0))
    args = parser.parse_args()
    setup_logging("info")
    low, high = args.restart_backoff
    asyncio.run(serve(args.kubeconfig, args.state_dir, (low, high)))


if __name__ == "__main__":
    main()
