"""Controllers the runtime benchmark loads into ``kustos run`` (``--extra-controllers``)."""

from __future__ import annotations

import os
import time
from pathlib import Path

from kustos.runtime.controller import Controller
from kustos.runtime.manager import Manager
from kustos.runtime.resources import CONFIGMAPS, NODES

SENT = "bench.kustos.dev/sent"


def register_cache(manager: Manager) -> None:
    """Cache every ConfigMap and Node, reconciling nothing: what does a cached object cost?"""

    async def nothing(_: str) -> None:
        return None

    manager.add_controller(Controller("bench-configmaps", CONFIGMAPS, nothing))
    manager.add_controller(Controller("bench-nodes", NODES, nothing))


def register_latency(manager: Manager) -> None:
    """Record, per reconcile, the seconds since the client stamped the object it reconciles."""
    out = Path(os.environ["KUSTOS_BENCH_OUT"])
    configmaps = manager.informer(CONFIGMAPS)

    async def measure(key: str) -> None:
        obj = configmaps.get(key)
        sent = ((obj or {}).get("metadata", {}).get("annotations") or {}).get(SENT)
        if sent:
            latency = time.time() - float(sent)
            with out.open("a") as sink:  # noqa: ASYNC230 - a few bytes to a local file
                sink.write(f"{latency:.6f}\n")

    manager.add_controller(Controller("bench-latency", CONFIGMAPS, measure, workers=4))
