"""The broker's adoption tracker over real sockets: who counts, and for how long.

A connection counts only after its first ``TopologyUpdateAck``; it holds the
highest generation it acked; the broker's label (``adoption_floor``, the
heartbeat's ``adoption``) is the lowest over the connections that count; a
closed connection stops counting at once. Frames on one connection are handled
in order, so a ``Ping`` answered after an ack proves the ack was handled.
"""

from __future__ import annotations

from headrace.protocol import messages as msg
from headrace.protocol.frames import Op
from headrace.testing.procs import BrokerProcess
from headrace.testing.waiting import until
from tests.integration.raw import RawConnection


def floor(broker: BrokerProcess) -> object:
    return broker.get_json("/v1/status")["adoption_floor"]


def ack(conn: RawConnection, generation: int) -> None:
    conn.send(Op.TOPOLOGY_UPDATE_ACK, msg.TopologyUpdateAck(generation).encode())
    assert conn.call(Op.PING, b"after the ack").op == Op.PONG


def test_the_label_is_the_lowest_ack_of_connections_that_acked(broker: BrokerProcess) -> None:
    a = RawConnection(broker.bootstrap)
    b = RawConnection(broker.bootstrap)
    try:
        g = msg.TopologySnapshot.decode(a.call(Op.TOPOLOGY, b"{}").body).generation
        b.call(Op.TOPOLOGY, b"{}")
        assert a.call(Op.PING, b"").op == Op.PONG
        assert floor(broker) is None  # asked for the topology, never acked: not counted
        ack(b, g + 5)
        assert floor(broker) == g + 5
        ack(a, g)
        assert floor(broker) == g  # the lowest over connections
        ack(a, g - 1)
        assert floor(broker) == g  # a connection keeps the highest it acked
        a.close()
        until(lambda: floor(broker) == g + 5, 10, "the closed connection forgotten")
        b.close()
        until(lambda: floor(broker) is None, 10, "no connection left that acked")
    finally:
        a.close()
        b.close()


def test_a_push_goes_out_when_the_routing_content_changes(broker: BrokerProcess) -> None:
    watcher = RawConnection(broker.bootstrap)
    try:
        before = msg.TopologySnapshot.decode(watcher.call(Op.TOPOLOGY, b"{}").body)
        broker.post_json("/v1/topics", {"name": "pushed", "partitions": 2})
        frame = watcher.recv()
        assert frame.op == Op.TOPOLOGY_UPDATE
        pushed = msg.TopologySnapshot.decode(frame.body)
        assert pushed.generation > before.generation
        assert [t.name for t in pushed.topics] == ["default/pushed"]
    finally:
        watcher.close()
