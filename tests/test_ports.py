"""The stack's ports are picked where nothing else takes them between the pick and the server's bind."""

from __future__ import annotations

import socket

import pytest

from devstack import processes
from devstack.processes import LOOPBACK, ephemeral_ports, free_port


def test_picked_ports_lie_below_the_ephemeral_range_and_are_never_picked_twice():
    """The dev server's own random ports and every outbound connection come from the ephemeral range."""
    ports = [free_port() for _ in range(300)]
    ephemeral = ephemeral_ports()
    assert len(set(ports)) == len(ports)
    assert all(processes._OWN_PORTS_FROM <= p < ephemeral.start for p in ports), sorted(ports)[:5]


def test_a_port_in_use_is_passed_over(monkeypatch: pytest.MonkeyPatch):
    with socket.socket() as taken:
        taken.bind((LOOPBACK, free_port()))
        busy = taken.getsockname()[1]
        spare = free_port()
        offered = iter([busy, spare])
        monkeypatch.setattr(processes._pick, "randrange", lambda *_: next(offered))
        processes._picked.discard(spare)
        assert free_port() == spare
