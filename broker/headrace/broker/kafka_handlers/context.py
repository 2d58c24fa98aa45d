"""What a Kafka API handler sees of its connection, and the shape of the dispatch table.

A handler takes a request's header and its decoded body (``kafka.messages``) and
returns the response body, or, when the answer has to wait, a future of it (a
produce waiting on its replicas or on fsync) or a coroutine of it (a long poll, a
rebalance, a commit to the offsets topic). It never touches the socket:
``kafka_listener.KafkaConnection`` cuts the frames, keeps the answers in request
order and writes them.
"""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from headrace.kafka import messages as km

if TYPE_CHECKING:
    from headrace.broker.ports import ConnectionHost
    from headrace.security.access import ConnectionAccess


@dataclasses.dataclass(frozen=True)
class KafkaRequestContext:
    """One Kafka client connection as its handlers see it: who asks, and the broker."""

    #: the broker, seen through the port a connection needs (``ports.ConnectionHost``)
    broker: ConnectionHost
    #: who this connection is and what it may do; authentication fills it in later
    access: ConnectionAccess
    #: the client's ``host:port``, for the log and a group member's host
    peer: str
    #: this broker's Kafka address as its clients reach it
    advertised: Callable[[], tuple[str, int]]


#: one API's handler: (header, decoded request) -> the response body, or a future or
#: a coroutine of it
KafkaHandler = Callable[[km.RequestHeader, Any], object]
#: the APIs one handler object answers, each to its handler
KafkaRoutes = Mapping[km.ApiKey, KafkaHandler]


class KafkaHandlers(abc.ABC):
    """A connection's handlers of one concern. Each subclass names its APIs in
    ``routes()``; the connection builds one table from them all."""

    def __init__(self, context: KafkaRequestContext) -> None:
        # both fixed for the connection's life: read once, not per request
        self.broker = context.broker
        self.access = context.access

    @abc.abstractmethod
    def routes(self) -> KafkaRoutes:
        """Each API this concern answers, to its handler."""
