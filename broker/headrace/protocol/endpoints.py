"""Where a broker listens (pure): the one endpoint type of both planes.

A broker advertises its id, host, client port and admin port in every
heartbeat (and, with a Kafka listener, that listener's ``KafkaAddress``; with
more listeners than the default one, each named listener's advertised
``ListenerAddress``); the controller keeps them in its cluster state and pushes
them to the brokers, which route replication and redirects by them; clients
learn the id, host and client port from the topology snapshot: the address of
the listener their connection came in through (``on``), like Kafka's advertised
listeners. Each holder knows
what it was told: the controller's ``--broker ID=HOST:ADMIN_PORT`` list names
no client port, a client's snapshot no admin port. A port nobody told the
holder is ``-1``.

Each document that carries endpoints encodes them itself (the client wire
carries ``id``/``host``/``port``); ``to_json``/``from_json`` are the camelCase
form the controller persists and brokers heartbeat.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from headrace.protocol.jsonfields import objects, optional, required

#: a port the holder of the endpoint was not told
UNKNOWN_PORT = -1
#: the listener ``host``/``port`` name: the broker's ``--host``/``--port``, which brokers
#: replicate through and the controller's documents have always carried
DEFAULT_LISTENER = "internal"


@dataclass(frozen=True, slots=True)
class KafkaAddress:
    """Where a broker's Kafka listener is reached (its advertised host and port): what
    Kafka's ``Metadata`` and ``FindCoordinator`` name for that broker."""

    host: str
    port: int

    def to_json(self) -> dict[str, Any]:
        return {"host": self.host, "port": self.port}

    @classmethod
    def from_json(cls, doc: Mapping[str, Any], where: str = "kafka address") -> KafkaAddress:
        return cls(required(doc, "host", str, where), required(doc, "port", int, where))


@dataclass(frozen=True, slots=True)
class ListenerAddress:
    """Where one of a broker's named (non-default) listeners is reached: its advertised
    host and port; ``pending`` while its address is not known yet (a load balancer that
    has none): the broker is then left out of that listener's topology."""

    name: str
    host: str
    port: int

    @classmethod
    def pending(cls, name: str) -> ListenerAddress:
        """Listener ``name`` with no address yet (no host, ``UNKNOWN_PORT``)."""
        return cls(name, "", UNKNOWN_PORT)

    @property
    def assigned(self) -> bool:
        return self.port != UNKNOWN_PORT

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "host": self.host, "port": self.port}

    @classmethod
    def from_json(cls, doc: Mapping[str, Any], where: str = "listener") -> ListenerAddress:
        return cls(
            required(doc, "name", str, where),
            required(doc, "host", str, where),
            required(doc, "port", int, where),
        )


@dataclass(frozen=True, slots=True)
class BrokerEndpoint:
    id: int
    host: str
    #: the client (and replication) port
    port: int = UNKNOWN_PORT
    #: the admin HTTP port: heartbeats, topology pushes, metrics
    admin_port: int = UNKNOWN_PORT
    #: its Kafka listener; None: it runs none (or runs a release from before this field)
    kafka: KafkaAddress | None = None
    #: its other data listeners (``DEFAULT_LISTENER`` is ``host``/``port``), by name; empty:
    #: it has none (or runs a release from before this field)
    listeners: tuple[ListenerAddress, ...] = ()

    @property
    def admin_url(self) -> str:
        return f"http://{self.host}:{self.admin_port}"

    def on(self, listener: str) -> BrokerEndpoint | None:
        """The broker as a client that came in through ``listener`` must dial it: that
        listener's address, with no admin port (the client wire carries none); None while
        that address is pending (no address beats one the client cannot reach). A broker
        that does not name ``listener`` (one not upgraded yet, or configured without it)
        is given by its default address: what every client was told before listeners."""
        for named in self.listeners:
            if named.name == listener:
                return BrokerEndpoint(self.id, named.host, named.port) if named.assigned else None
        return BrokerEndpoint(self.id, self.host, self.port)

    def to_json(self) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "id": self.id,
            "host": self.host,
            "port": self.port,
            "adminPort": self.admin_port,
        }
        if self.kafka is not None:
            doc["kafka"] = self.kafka.to_json()
        if self.listeners:
            doc["listeners"] = [listener.to_json() for listener in self.listeners]
        return doc

    @classmethod
    def from_json(cls, doc: Mapping[str, Any], where: str = "broker") -> BrokerEndpoint:
        """Every field but ``kafka`` and ``listeners`` is required (absent: no Kafka
        listener, no named listeners); raises ``InvalidRequest`` naming ``where``."""
        kafka = optional(doc, "kafka", dict, where)
        listeners = objects(doc, "listeners", where)
        return cls(
            required(doc, "id", int, where),
            required(doc, "host", str, where),
            required(doc, "port", int, where),
            required(doc, "adminPort", int, where),
            None if kafka is None else KafkaAddress.from_json(kafka, f"{where}: kafka"),
            tuple(ListenerAddress.from_json(n, f"{where}: listeners") for n in listeners),
        )
