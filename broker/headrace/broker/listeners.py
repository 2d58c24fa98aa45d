"""The broker's sockets: the data port, the named listeners and the Kafka port, and the
addresses clients are told to dial on each.

Every listener serves the broker as a ``ports.ConnectionHost``; a connection of the
data protocol is a ``server.Connection``, one of the Kafka protocol a
``kafka_listener.KafkaConnection`` (whose group coordinator, ``KafkaGroups``, lives
as long as its listener).
"""

from __future__ import annotations

import asyncio
import functools
import logging
from typing import TYPE_CHECKING

from headrace.broker.config import BrokerSettings
from headrace.broker.server import Connection
from headrace.broker.serving_tls import ServingTls
from headrace.protocol.endpoints import BrokerEndpoint, KafkaAddress, ListenerAddress

if TYPE_CHECKING:
    from headrace.broker.kafka_groups import KafkaGroups
    from headrace.broker.kafka_listener import KafkaConnection
    from headrace.broker.ports import ConnectionHost

log = logging.getLogger(__name__)

#: pending connections each listening socket queues
_BACKLOG = 1024


class Listeners:
    def __init__(self, host: ConnectionHost, settings: BrokerSettings, tls: ServingTls) -> None:
        self._host = host
        self._settings = settings
        self._tls = tls
        self._server: asyncio.Server | None = None
        #: the servers of ``settings.listeners``, by name, and the ports they bound
        self._named: dict[str, asyncio.Server] = {}
        self.listener_ports: dict[str, int] = {}
        #: the data port bound (the configured one until ``start``, which may be 0)
        self.port = settings.port
        self._kafka_server: asyncio.Server | None = None
        self.kafka_port = settings.kafka_port
        self.kafka_connections: set[KafkaConnection] = set()
        self.kafka_groups: KafkaGroups | None = None

    async def start(self) -> None:
        """Bind and serve the data port and the named listeners; bind the Kafka port."""
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            lambda: Connection(self._host),
            self._settings.host,
            self._settings.port,
            ssl=self._tls.server,
            reuse_address=True,
            backlog=_BACKLOG,
        )
        self.port = self._server.sockets[0].getsockname()[1]
        for listener in self._settings.listeners:
            server = await loop.create_server(
                functools.partial(Connection, self._host, listener.name),
                listener.host,
                listener.port,
                ssl=self._tls.listener(listener.name),
                reuse_address=True,
                backlog=_BACKLOG,
            )
            self._named[listener.name] = server
            self.listener_ports[listener.name] = server.sockets[0].getsockname()[1]
        if self._settings.kafka_port >= 0:
            await self._start_kafka()

    async def _start_kafka(self) -> None:
        from headrace.broker.kafka_groups import KafkaGroups
        from headrace.broker.kafka_listener import KafkaConnection

        cluster_mode = self._settings.cluster_mode
        # In a cluster, group offsets live in the offsets topic and the heartbeat carries
        # this listener's address (Metadata names every broker's): docs/kafka.md.
        self.kafka_groups = KafkaGroups(
            self._settings.data_dir / "kafka-groups", self._host if cluster_mode else None
        )
        groups = self.kafka_groups
        # A cluster broker binds its port now (the heartbeat names it) but accepts Kafka
        # clients only once it holds the controller's topology (``serve_kafka_clients``), as
        # a Kafka broker serves none before it has caught up with the cluster's metadata:
        # before that its Metadata would name itself alone, and a client that believed it
        # would forget every other broker.
        self._kafka_server = await asyncio.get_running_loop().create_server(
            lambda: KafkaConnection(
                self._host, self.kafka_advertised, self.kafka_connections, groups
            ),
            self._settings.kafka_host or self._settings.host,
            self._settings.kafka_port,
            ssl=self._tls.server,
            reuse_address=True,
            backlog=_BACKLOG,
            start_serving=not cluster_mode,
        )
        self.kafka_port = self._kafka_server.sockets[0].getsockname()[1]
        groups.start()
        log.info("broker %s: Kafka listener on port %d", self._settings.broker_id, self.kafka_port)

    async def serve_kafka_clients(self) -> None:
        """Accept Kafka clients, once a cluster broker holds a topology (``_start_kafka``)."""
        server = self._kafka_server
        if (
            server is not None
            and server.sockets  # empty once ``close`` closed it
            and not server.is_serving()
        ):
            await server.start_serving()

    def close_servers(self) -> None:
        """Stop accepting, and close the Kafka connections (the data connections are the
        host's to close)."""
        if self._server is not None:
            self._server.close()
        for server in self._named.values():
            server.close()
        if self._kafka_server is not None:
            self._kafka_server.close()
        for kafka_conn in list(self.kafka_connections):
            kafka_conn.close()

    async def close_kafka_groups(self) -> None:
        if self.kafka_groups is not None:
            await self.kafka_groups.close()

    # ------------------------------------------------------------------ addresses

    @property
    def kafka_listening(self) -> bool:
        return self._kafka_server is not None

    def kafka_advertised(self) -> tuple[str, int]:
        """Where Kafka clients should connect (Metadata's broker list)."""
        s = self._settings
        host = s.kafka_advertised_host or s.advertised_host or s.kafka_host or s.host
        return (host, s.kafka_advertised_port or self.kafka_port)

    @property
    def advertised(self) -> tuple[str, int]:
        """Where clients should connect: the bound port, even when asked for port 0."""
        return (self._settings.advertised_host or self._settings.host, self.port)

    def advertised_listeners(self) -> tuple[ListenerAddress, ...]:
        """Where clients of each named listener should connect (the bound port unless
        told another: a NodePort or a load balancer forwards to it)."""
        return tuple(
            ListenerAddress(
                listener.name,
                listener.advertised_host or listener.host,
                listener.advertised_port or self.listener_ports.get(listener.name, listener.port),
            )
            for listener in self._settings.listeners
        )

    def own_endpoint(
        self, admin_port: int = -1, kafka: KafkaAddress | None = None
    ) -> BrokerEndpoint:
        """This broker's endpoint: the default listener's address and the named ones'."""
        host, port = self.advertised
        return BrokerEndpoint(
            self._settings.broker_id, host, port, admin_port, kafka, self.advertised_listeners()
        )
