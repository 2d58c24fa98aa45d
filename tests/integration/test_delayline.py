"""The NFQUEUE delay on real packets, without a broker: one namespace, one veth pair.

``bench/delayline.py`` holds each packet that arrives in the namespace for 1 s (long
enough for the test to see every datagram held at once, however loaded the machine).
Numbered UDP datagrams sent from the root namespace must all arrive, in the order
sent, none of them sooner than the delay; and the ones still held when the delay
is removed must be released, not dropped (a UDP datagram is never resent, so a
drop would show). The broker scenarios are in ``test_partitions.py``.
"""

from __future__ import annotations

import json
import os
import socket
import struct
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench import netns
from headrace.testing import procs, waiting

pytestmark = [
    pytest.mark.skipif(
        netns.delay_unavailable() is not None, reason=f"delay: {netns.delay_unavailable()}"
    ),
    pytest.mark.timeout(60),
]

DATAGRAMS = 20
DELAY_S = 1.0
PORT = 7414
_DATAGRAM = struct.Struct("!Id")  # sequence number, send time (CLOCK_MONOTONIC, one per host)

#: runs in the namespace: prints "ready", then one JSON line [[seq, sent, received], ...]
#: once every datagram came or none came for 10 s
_RECEIVER = f"""
import json, socket, struct, time
sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
sock.bind(("0.0.0.0", {PORT}))
sock.settimeout(10)
print("ready", flush=True)
got = []
try:
    while len(got) < {DATAGRAMS}:
        seq, sent = struct.unpack("!Id", sock.recv(64))
        got.append([seq, sent, time.monotonic()])
except TimeoutError:
    pass  # the rest never came
print(json.dumps(got), flush=True)
"""


@pytest.fixture
def namespace() -> Iterator[tuple[str, str]]:
    """A namespace whose ``eth0`` (the returned address) is a veth peer of the root's."""
    netns.remove_stale()
    tag = f"{os.getpid()}dl"
    name, host_side = f"{netns.NS_PREFIX}{os.getpid()}-dl", f"hr{tag}"
    subnet = netns._free_subnet()
    inside = f"{subnet}.2"
    try:
        for argv in (
            ["ip", "netns", "add", name],
            ["ip", "link", "add", host_side, "type", "veth", "peer", "name", "eth0", "netns", name],
            ["ip", "addr", "add", f"{subnet}.1/24", "dev", host_side],
            ["ip", "link", "set", host_side, "up"],
            ["ip", "netns", "exec", name, "ip", "addr", "add", f"{inside}/24", "dev", "eth0"],
            ["ip", "netns", "exec", name, "ip", "link", "set", "eth0", "up"],
        ):
            netns._run(*argv)
        yield name, inside
    finally:
        subprocess.run(["ip", "netns", "del", name], capture_output=True, check=False)
        subprocess.run(["ip", "link", "del", host_side], capture_output=True, check=False)


def test_held_datagrams_arrive_late_in_order_and_none_is_dropped_at_the_heal(
    namespace: tuple[str, str], tmp_path: Path
) -> None:
    name, address = namespace
    receiver = subprocess.Popen(
        [*netns._in_namespace(name), "-c", _RECEIVER],
        stdout=subprocess.PIPE,
        text=True,
    )
    delay = netns.Delay(name, DELAY_S * 1000, tmp_path / "delay.log")
    try:
        assert receiver.stdout is not None
        assert receiver.stdout.readline().strip() == "ready"
        delay.start()
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sender:
            # one at a time, each once the one before is held: their release times spread
            # out, so a program that quit at its first release would strand the others
            for seq in range(DATAGRAMS):
                sender.sendto(_DATAGRAM.pack(seq, time.monotonic()), (address, PORT))
                waiting.until(lambda n=seq + 1: delay.held() == n, 5, f"{seq + 1} held")
        delay.stop()  # while all of them are still held: they must still be delivered
        out, _ = receiver.communicate(timeout=20)
    finally:
        delay.kill()
        procs.kill_group(receiver)
        receiver.wait(5)
    got = json.loads(out)
    assert [seq for seq, _, _ in got] == list(range(DATAGRAMS)), f"reordered or lost: {got}"
    early = [(seq, received - sent) for seq, sent, received in got if received - sent < DELAY_S]
    assert not early, f"datagrams through in under {DELAY_S} s: {early[:3]}"
    assert f"stopped after delaying {DATAGRAMS} packets" in (tmp_path / "delay.log").read_text()
