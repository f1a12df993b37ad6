"""The one free-port helper of nre_ray (:func:`nre_ray.cluster.ports.free_port`)."""

from __future__ import annotations

import socket

from nre_ray.cluster.ports import free_port


def test_the_free_port_helper_gives_a_port_a_server_can_take_and_not_one_taken() -> None:
    """:func:`nre_ray.cluster.ports.free_port` (the stand-in's ports, HAProxy's, the dashboard's, and the tests'):
    a server listens on the port it gives; ``taken`` ports are never given again; ``""`` checks every address."""
    chosen: list[int] = []
    for _ in range(5):
        chosen.append(free_port(taken=chosen))
    assert len(set(chosen)) == 5
    with socket.socket() as server:
        server.bind(("127.0.0.1", chosen[0]))
        server.listen()
        assert free_port("") != chosen[0]
