"""A connection's session: the handshake, pings, and its subscription to topology pushes."""

from __future__ import annotations

from headrace.broker import certificates
from headrace.broker.ports import FrameLink, Routes
from headrace.errors import InvalidRequest
from headrace.protocol import messages as msg
from headrace.protocol.frames import Frame, Op


class Session:
    def __init__(self, conn: FrameLink) -> None:
        self.conn = conn
        #: highest topology generation this connection acked (op 102); None until it acks
        self.acked_generation: int | None = None
        #: routing content last sent, so pushes go out only when it changes
        self.sent_routing: object = None
        self.wants_topology = False

    def routes(self) -> Routes:
        return {
            Op.HANDSHAKE: self.on_handshake,
            Op.PING: self.on_ping,
            Op.TOPOLOGY: self.on_topology,
            Op.TOPOLOGY_UPDATE_ACK: self.on_topology_ack,
        }

    def on_handshake(self, frame: Frame) -> None:
        conn = self.conn
        broker = conn.broker
        hello = msg.Handshake.decode(frame.body)
        version = msg.negotiate(hello.lowest_version, hello.protocol_version)
        # only the client CA's certificates name principals, not the brokers' own CA's
        cert = certificates.client_certificate(conn.peercert(), broker.client_issuers)
        conn.access.authenticate(hello.auth_token, cert)
        if len(hello.client_id) > 256:
            raise InvalidRequest("client_id longer than 256 characters")
        conn.authenticated_as(hello.client_id)
        s = broker.settings
        ok = msg.HandshakeOk(
            version,
            s.broker_id,
            s.cluster_id,
            s.max_frame_bytes,
            s.log.max_batch_bytes,
            conn.access.member_identities,
        )
        conn.respond(frame, Op.HANDSHAKE_OK, ok.encode())

    def on_ping(self, frame: Frame) -> None:
        self.conn.respond(frame, Op.PONG, frame.body[:64])

    def on_topology(self, frame: Frame) -> None:
        snapshot, routing = self.conn.broker.topology(self.conn.listener)
        self.wants_topology = True
        self.sent_routing = routing
        self.conn.respond(frame, Op.TOPOLOGY_OK, snapshot.encode())

    def on_topology_ack(self, frame: Frame) -> None:
        ack = msg.TopologyUpdateAck.decode(frame.body)
        if self.acked_generation is None or ack.generation > self.acked_generation:
            self.acked_generation = ack.generation

    def push_topology(self, snapshot: msg.TopologySnapshot, routing: object) -> None:
        if self.wants_topology and routing != self.sent_routing:
            self.sent_routing = routing
            self.conn.push(Op.TOPOLOGY_UPDATE, snapshot.encode())
