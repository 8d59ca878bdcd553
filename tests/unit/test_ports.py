"""Ports for the dev cluster's listeners come from outside the kernel's ephemeral range."""

from __future__ import annotations

import socket

from kustos.devcluster.ports import LOWEST, _first_ephemeral, free_port, free_ports


def test_ports_are_distinct_bindable_and_below_the_ephemeral_range() -> None:
    ports = free_ports(20)
    assert len(set(ports)) == 20
    assert all(LOWEST <= port < _first_ephemeral() for port in ports)
    for port in ports:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", port))


def test_a_port_someone_listens_on_is_never_given() -> None:
    taken = []
    try:
        for port in free_ports(30):
            sock = socket.socket()
            sock.bind(("127.0.0.1", port))
            sock.listen()
            taken.append(sock)
        busy = {s.getsockname()[1] for s in taken}
        assert not busy & {free_port() for _ in range(50)}
    finally:
        for sock in taken:
            sock.close()
