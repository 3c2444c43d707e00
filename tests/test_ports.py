"""The port of the workers' own store on one node: free, and outside the ephemeral range."""

from __future__ import annotations


def test_the_workers_store_port_is_free_and_below_the_ephemeral_range():
    import random
    import socket

    from trainguard.supervisor.ports import _ephemeral_low, private_port

    ports = [private_port(random.Random(seed)) for seed in range(20)]
    assert all(1024 <= p < _ephemeral_low() for p in ports)
    with socket.socket() as s:
        s.bind(("", ports[0]))  # free: it can be listened on
