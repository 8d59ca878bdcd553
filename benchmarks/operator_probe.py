"""The wrapper ``operator_cpu_bench`` runs ``kustos run`` under (``python -m benchmarks.operator_probe
run ...``): it counts API and etcd requests inside the operator and toggles a cProfile on
SIGUSR1 / SIGUSR2; nothing in kustos knows.

Its own module, importing nothing but the standard library's smallest parts before kustos: the
bench's side (httpx, the dev cluster's code) loaded into the operator added ~7 MiB to the RSS
the benches report as the operator's, and a timer or thread of theirs would add to its idle CPU.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from collections import Counter
from pathlib import Path
from typing import Any


def _kind_of(path: str) -> str:
    """``/api/v1/namespaces/x/pods/y/status`` -> ``pods/status``; watches say ``pods (watch)``."""
    parts = [p for p in path.split("?")[0].split("/") if p]
    parts = parts[1:] if parts[:1] == ["api"] else parts[2:] if parts[:1] == ["apis"] else parts
    parts = parts[1:]  # the version
    if parts[:1] == ["namespaces"] and len(parts) > 2:
        parts = parts[2:]
    kind = parts[0] if parts else "?"
    if len(parts) > 2:
        kind += "/" + parts[2]
    return kind + (" (watch)" if "watch=" in path else "")


def main(argv: list[str]) -> None:
    """Run ``kustos`` with counters and a profiler toggled by signals."""
    import kustos.etcd.client as etcd_client
    import kustos.runtime.kube as kube
    from kustos.entry import main

    counts: Counter[str] = Counter()
    out = Path(os.environ["KUSTOS_CPU_BENCH_OUT"])
    profiler: list[Any] = []  # a cProfile.Profile while profiling

    send = kube.CountingTransport.handle_async_request

    async def counted_send(self: Any, request: Any) -> Any:
        what = f"api {request.method} {_kind_of(request.url.raw_path.decode())}"
        counts[what] += 1
        response = await send(self, request)
        if response.status_code >= 400:  # a refused write (409: written onto a stale copy) is a wasted pass
            counts[f"{what} -> {response.status_code}"] += 1
        return response

    post = etcd_client.EtcdClient._post

    async def counted_post(self: Any, path: str, *args: Any, **kwargs: Any) -> Any:
        counts[f"etcd {path}"] += 1
        return await post(self, path, *args, **kwargs)

    client_init = etcd_client.EtcdClient.__init__

    def counted_init(self: Any, *args: Any, **kwargs: Any) -> None:
        counts["etcd clients built"] += 1
        client_init(self, *args, **kwargs)

    import kustos.runtime.record as record

    changed = record.status_changed

    def logged_changed(obj: dict[str, Any], status: dict[str, Any]) -> bool:
        """With KUSTOS_CPU_BENCH_DIFFS: each status write's changed fields, to ``status-diffs.log``."""
        result = changed(obj, status)
        if result and os.environ.get("KUSTOS_CPU_BENCH_DIFFS"):
            old = obj.get("status") or {}
            new = {**status, "observedGeneration": (obj.get("metadata") or {}).get("generation")}
            diff = {k: (old.get(k), new.get(k)) for k in {*old, *new} if old.get(k) != new.get(k)}
            with (out / "status-diffs.log").open("a") as log:
                log.write(json.dumps(diff, default=str) + "\n")
        return result

    record.status_changed = logged_changed  # type: ignore[assignment]
    kube.CountingTransport.handle_async_request = counted_send  # type: ignore[method-assign]
    etcd_client.EtcdClient._post = counted_post  # type: ignore[method-assign]
    etcd_client.EtcdClient.__init__ = counted_init  # type: ignore[method-assign]

    def start(_sig: int, _frame: Any) -> None:
        counts.clear()
        if os.environ.get("KUSTOS_CPU_BENCH_PROFILE"):
            import cProfile

            profiler[:] = [cProfile.Profile()]
            profiler[0].enable()

    def stop(_sig: int, _frame: Any) -> None:
        name = (out / "current").read_text().strip()
        if profiler:
            profiler[0].disable()
            profiler[0].dump_stats(out / f"{name}.prof")
            profiler.clear()
        (out / f"{name}.json").write_text(json.dumps(dict(counts)))

    signal.signal(signal.SIGUSR1, start)
    signal.signal(signal.SIGUSR2, stop)
    sys.argv = ["kustos", *argv]
    main()


if __name__ == "__main__":
    main(sys.argv[1:])
