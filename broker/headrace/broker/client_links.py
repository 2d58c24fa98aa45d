"""The data-protocol connections open to this broker, and the topology pushed to them."""

from __future__ import annotations

from collections.abc import Callable

from headrace.broker.metrics import BrokerMetrics
from headrace.broker.ports import ClientLink
from headrace.protocol import messages as msg
from headrace.protocol.endpoints import DEFAULT_LISTENER


class ClientLinks:
    def __init__(
        self,
        metrics: BrokerMetrics,
        topology: Callable[[str], tuple[msg.TopologySnapshot, object]],
    ) -> None:
        self._metrics = metrics
        #: the snapshot (and its routing content) clients of a listener are given
        self._topology = topology
        self.links: set[ClientLink] = set()

    def opened(self, conn: ClientLink) -> None:
        self.links.add(conn)
        self._metrics.connections.set(len(self.links))

    def closed(self, conn: ClientLink) -> None:
        self.links.discard(conn)
        self._metrics.connections.set(len(self.links))

    def push_topology(self) -> None:
        """Give every connection the snapshot of its listener (each built once)."""
        snapshots: dict[str, tuple[msg.TopologySnapshot, object]] = {}
        snapshots[DEFAULT_LISTENER] = self._topology(DEFAULT_LISTENER)
        self._metrics.topology_generation.set(snapshots[DEFAULT_LISTENER][0].generation)
        for conn in list(self.links):
            if conn.listener not in snapshots:
                snapshots[conn.listener] = self._topology(conn.listener)
            conn.push_topology(*snapshots[conn.listener])

    def adoption_floor(self) -> int | None:
        """Lowest topology generation acked by connections that ever acked (the adoption label)."""
        acked = [c.acked_generation for c in self.links if c.acked_generation is not None]
        return min(acked) if acked else None

    def close_all(self) -> None:
        for conn in list(self.links):
            conn.close()
