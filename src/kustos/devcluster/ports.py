"""Free TCP ports for the listeners the dev cluster, its tests and benchmarks start.

A port found by binding to port 0 comes from the kernel's ephemeral range, the range every
outgoing connection also takes its local port from: between the choice and the listener's own
bind, a connection opened anywhere on the machine may take it ("address already in use", seen
once in CI for an operator's metrics port). These ports are chosen below that range instead,
where only another listener can take them, and above the well-known ports Kubernetes and etcd
listen on.
"""

from __future__ import annotations

import random
import socket
from pathlib import Path

LOWEST = 20000
EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")


def _first_ephemeral() -> int:
    try:
        return int(EPHEMERAL_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default


def free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """``count`` distinct ports nothing listens on at ``host`` now, outside the ephemeral range
    (the kernel's choice only when that range leaves none below it)."""
    high = _first_ephemeral()
    chosen: list[int] = []
    candidates = random.sample(range(LOWEST, high), k=min(high - LOWEST, 200)) if high > LOWEST else []
    for port in candidates:
        if len(chosen) == count:
            break
        with socket.socket() as sock:
            try:
                sock.bind((host, port))
            except OSError:
                continue
        chosen.append(port)
    while len(chosen) < count:
        with socket.socket() as sock:
            sock.bind((host, 0))
            port = int(sock.getsockname()[1])
        if port not in chosen:
            chosen.append(port)
    return chosen


def free_port(host: str = "127.0.0.1") -> int:
    """One port nothing listens on at ``host`` now (see ``free_ports``)."""
    return free_ports(1, host)[0]
