"""Where a one-machine process group listens: its store and gloo's pairs on loopback (controller/rendezvous.py)."""

from __future__ import annotations

import datetime
import os
import sys

import pytest
import torch
import torch.distributed as dist

from tests.support.processes import listeners
from verl.controller.rendezvous import is_loopback, tcp_store
from verl.controller.worker import free_port


@pytest.mark.parametrize(
    "host, loopback",
    [
        ("127.0.0.1", True),
        ("127.0.0.2", True),
        ("localhost", True),
        ("::1", True),
        ("10.1.2.3", False),
        ("node-7", False),
    ],
)
def test_is_loopback(host, loopback):
    assert is_loopback(host) is loopback


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads sockets from /proc (Linux)")
def test_a_loopback_store_listens_on_loopback_only():
    before = listeners([os.getpid()])
    port = free_port("127.0.0.1")
    store = tcp_store("127.0.0.1", port, 1, True, datetime.timedelta(seconds=10))
    opened = listeners([os.getpid()]) - before
    assert [(listener.address, listener.port) for listener in opened] == [("127.0.0.1", port)]
    store.set("k", "v")  # a working store, not only a socket
    assert tcp_store("127.0.0.1", port, 1, False, datetime.timedelta(seconds=10)).get("k") == b"v"
    del store


def test_a_taken_port_names_the_address():
    port = free_port("127.0.0.1")
    store = tcp_store("127.0.0.1", port, 1, True, datetime.timedelta(seconds=10))
    with pytest.raises(RuntimeError, match=f"127.0.0.1:{port}"):
        tcp_store("127.0.0.1", port, 1, True, datetime.timedelta(seconds=10))
    del store


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads sockets from /proc (Linux)")
def test_a_world_of_one_opens_no_socket_and_computes():
    from verl.utils.world_of_one import world_of_one

    before = listeners([os.getpid()])
    with world_of_one():
        t = torch.ones(3)
        dist.all_reduce(t)
        assert t.tolist() == [1.0, 1.0, 1.0]
        assert {listener for listener in listeners([os.getpid()]) - before if not listener.loopback} == set()
