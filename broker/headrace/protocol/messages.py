"""Message bodies for every op (pure).

Hot-path bodies (produce, fetch, delivery, ack, credit) are fixed structs
followed by raw record batches, so neither side parses per record. Control
bodies (handshake, topology, cohort membership, redirects, topic admin) are
UTF-8 JSON objects: they are rare, and JSON keeps them easy to evolve and to
debug. ``docs/wire-protocol.md`` lists every field.
"""

from __future__ import annotations

import enum
import json
import struct
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, Final, TypeVar

from headrace.errors import InvalidRequest, MalformedFrame, UnsupportedVersion
from headrace.protocol.endpoints import BrokerEndpoint

#: the newest wire protocol version this build speaks; a handshake settles on the highest
#: version both sides speak (``negotiate``), so a client and a broker one version apart
#: work together and a cluster upgrades one process at a time
PROTOCOL_VERSION: Final = 1
#: the oldest version this build still speaks (raise it one release after a change)
MIN_PROTOCOL_VERSION: Final = 1
MAX_TOPIC_NAME_BYTES: Final = 255


class Acks(enum.IntEnum):
    NONE = 0
    LEADER = 1
    ALL = 2


class Isolation(enum.IntEnum):
    COMMITTED = 0
    UNCOMMITTED = 1


# --------------------------------------------------------------------------- helpers

_TOPIC_LEN = struct.Struct("<H")


def _pack_topic(topic: str) -> bytes:
    raw = topic.encode()
    if len(raw) > MAX_TOPIC_NAME_BYTES:
        raise InvalidRequest(f"topic name longer than {MAX_TOPIC_NAME_BYTES} bytes")
    return _TOPIC_LEN.pack(len(raw)) + raw


def _unpack_topic(body: bytes, pos: int) -> tuple[str, int]:
    if len(body) < pos + 2:
        raise MalformedFrame("body too short for the topic length")
    (n,) = _TOPIC_LEN.unpack_from(body, pos)
    end = pos + 2 + n
    if len(body) < end:
        raise MalformedFrame("body too short for the topic name")
    try:
        return body[pos + 2 : end].decode(), end
    except UnicodeDecodeError as exc:
        raise MalformedFrame("topic name is not UTF-8") from exc


def _unpack_fixed(fmt: struct.Struct, body: bytes, what: str) -> tuple[Any, ...]:
    if len(body) < fmt.size:
        raise MalformedFrame(f"{what} body needs {fmt.size} bytes, got {len(body)}")
    return fmt.unpack_from(body, 0)


def encode_json(obj: Mapping[str, Any]) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode()


def decode_json(body: bytes) -> dict[str, Any]:
    try:
        obj = json.loads(body)
    except (ValueError, RecursionError) as exc:
        # ValueError covers JSONDecodeError, UnicodeDecodeError and integers
        # past the int-string limit; RecursionError is deeply nested arrays.
        raise MalformedFrame(f"body is not valid JSON: {exc}") from exc
    if not isinstance(obj, dict):
        raise MalformedFrame("body must be a JSON object")
    return obj


T = TypeVar("T")


def field_of(obj: Mapping[str, Any], name: str, kind: type[T], default: T | None = None) -> T:
    """Read a typed field from a decoded JSON body, raising MalformedFrame on mismatch."""
    if name not in obj or obj[name] is None:
        if default is not None:
            return default
        raise MalformedFrame(f"missing field {name!r}")
    value = obj[name]
    if kind is int and isinstance(value, bool):
        raise MalformedFrame(f"field {name!r} must be an integer")
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if not isinstance(value, kind):
        raise MalformedFrame(f"field {name!r} must be {kind.__name__}")
    return value


# --------------------------------------------------------------------------- errors


_ERROR = struct.Struct("<HH")


@dataclass(frozen=True, slots=True)
class ErrorBody:
    code: int
    message: str
    details: dict[str, Any] = field(default_factory=dict)

    def encode(self) -> bytes:
        msg = self.message.encode()[:65535]
        tail = encode_json(self.details) if self.details else b""
        return _ERROR.pack(self.code, len(msg)) + msg + tail

    @classmethod
    def decode(cls, body: bytes) -> ErrorBody:
        code, n = _unpack_fixed(_ERROR, body, "error")
        if len(body) < 4 + n:
            raise MalformedFrame("error message truncated")
        message = body[4 : 4 + n].decode(errors="replace")
        details = decode_json(body[4 + n :]) if len(body) > 4 + n else {}
        return cls(code, message, details)


# --------------------------------------------------------------------------- produce

#: acks u8, timeout_ms u32, partitioning_version u32, partition u32
_PRODUCE = struct.Struct("<BIII")
#: base_offset u64, leader_epoch i32, high_watermark u64
_PRODUCE_OK = struct.Struct("<QiQ")


@dataclass(frozen=True, slots=True)
class ProduceRequest:
    topic: str
    partition: int
    partitioning_version: int
    acks: Acks
    timeout_ms: int
    batch: bytes | memoryview

    def encode_prefix(self) -> bytes:
        """Everything before the batch, so the batch can be written without a copy."""
        return _PRODUCE.pack(
            self.acks, self.timeout_ms, self.partitioning_version, self.partition
        ) + _pack_topic(self.topic)

    def encode(self) -> bytes:
        return self.encode_prefix() + bytes(self.batch)

    @classmethod
    def decode(cls, body: bytes) -> ProduceRequest:
        acks, timeout_ms, version, partition = _unpack_fixed(_PRODUCE, body, "produce")
        topic, pos = _unpack_topic(body, _PRODUCE.size)
        try:
            acks_enum = Acks(acks)
        except ValueError as exc:
            raise MalformedFrame(f"unknown acks value {acks}") from exc
        return cls(topic, partition, version, acks_enum, timeout_ms, memoryview(body)[pos:])


@dataclass(frozen=True, slots=True)
class ProduceResponse:
    base_offset: int
    leader_epoch: int
    high_watermark: int

    def encode(self) -> bytes:
        return _PRODUCE_OK.pack(self.base_offset, self.leader_epoch, self.high_watermark)

    @classmethod
    def decode(cls, body: bytes) -> ProduceResponse:
        return cls(*_unpack_fixed(_PRODUCE_OK, body, "produce response"))


# --------------------------------------------------------------------------- fetch

#: isolation u8, max_bytes u32, max_wait_ms u32, partition u32, offset u64
_FETCH = struct.Struct("<BIIIQ")
#: high_watermark u64, log_start_offset u64, log_end_offset u64
_FETCH_OK = struct.Struct("<QQQ")


@dataclass(frozen=True, slots=True)
class FetchRequest:
    topic: str
    partition: int
    offset: int
    max_bytes: int
    max_wait_ms: int = 0
    isolation: Isolation = Isolation.COMMITTED

    def encode(self) -> bytes:
        return _FETCH.pack(
            self.isolation, self.max_bytes, self.max_wait_ms, self.partition, self.offset
        ) + _pack_topic(self.topic)

    @classmethod
    def decode(cls, body: bytes) -> FetchRequest:
        isolation, max_bytes, max_wait_ms, partition, offset = _unpack_fixed(_FETCH, body, "fetch")
        topic, _ = _unpack_topic(body, _FETCH.size)
        try:
            iso = Isolation(isolation)
        except ValueError as exc:
            raise MalformedFrame(f"unknown isolation {isolation}") from exc
        return cls(topic, partition, offset, max_bytes, max_wait_ms, iso)


@dataclass(frozen=True, slots=True)
class FetchResponseHeader:
    high_watermark: int
    log_start_offset: int
    log_end_offset: int

    def encode(self) -> bytes:
        return _FETCH_OK.pack(self.high_watermark, self.log_start_offset, self.log_end_offset)

    @classmethod
    def decode(cls, body: bytes) -> tuple[FetchResponseHeader, memoryview]:
        fields = _unpack_fixed(_FETCH_OK, body, "fetch response")
        return cls(*fields), memoryview(body)[_FETCH_OK.size :]


# --------------------------------------------------------------------------- cohort data path

#: partition u32, gate_epoch u32, high_watermark u64, first_offset u64 (followed by batches);
#: first_offset is where the member resumes: records below it in the first batch are skipped
DELIVERY_HEADER: Final = struct.Struct("<IIQQ")
#: partition u32, gate_epoch u32, offset u64  (cumulative: every offset <= offset)
ACK: Final = struct.Struct("<IIQ")
#: partition u32, acked_offset i64 (-1: nothing acked)
ACK_OK: Final = struct.Struct("<Iq")
#: credit in bytes the member grants on top of what it granted before
CREDIT: Final = struct.Struct("<I")


@dataclass(frozen=True, slots=True)
class Delivery:
    partition: int
    gate_epoch: int
    high_watermark: int
    first_offset: int
    batches: memoryview

    @classmethod
    def decode(cls, body: bytes) -> Delivery:
        partition, gate_epoch, hw, first = _unpack_fixed(DELIVERY_HEADER, body, "delivery")
        return cls(partition, gate_epoch, hw, first, memoryview(body)[DELIVERY_HEADER.size :])


@dataclass(frozen=True, slots=True)
class Ack:
    partition: int
    gate_epoch: int
    offset: int

    def encode(self) -> bytes:
        return ACK.pack(self.partition, self.gate_epoch, self.offset)

    @classmethod
    def decode(cls, body: bytes) -> Ack:
        return cls(*_unpack_fixed(ACK, body, "ack"))


# --------------------------------------------------------------------------- JSON control bodies


J = TypeVar("J", bound="JsonBody")


class JsonBody:
    """Mixin for dataclass bodies that travel as JSON objects."""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)  # type: ignore[call-overload, no-any-return]

    def encode(self) -> bytes:
        return encode_json(self.to_json())


def negotiate(
    lowest: int,
    highest: int,
    own_lowest: int = MIN_PROTOCOL_VERSION,
    own_highest: int = PROTOCOL_VERSION,
) -> int:
    """The highest protocol version in both ranges (inclusive), as Kafka's ApiVersions
    settles each API's version; ``UnsupportedVersion`` naming both ranges if none."""
    version = min(highest, own_highest)
    if version < max(lowest, own_lowest) or lowest > highest:
        raise UnsupportedVersion(
            f"protocol versions {lowest}..{highest} offered, {own_lowest}..{own_highest}"
            " spoken here: upgrade the older side"
        )
    return version


@dataclass(frozen=True, slots=True)
class Handshake(JsonBody):
    #: the newest version the client speaks
    protocol_version: int
    client_id: str
    auth_token: str | None = None
    #: the oldest version the client speaks; None (a client from before negotiation): it
    #: speaks ``protocol_version`` only
    min_protocol_version: int | None = None

    @property
    def lowest_version(self) -> int:
        return (
            self.protocol_version
            if self.min_protocol_version is None
            else self.min_protocol_version
        )

    @classmethod
    def decode(cls, body: bytes) -> Handshake:
        obj = decode_json(body)
        token = obj.get("auth_token")
        if token is not None and not isinstance(token, str):
            raise MalformedFrame("field 'auth_token' must be a string")
        lowest = obj.get("min_protocol_version")
        if lowest is not None and (not isinstance(lowest, int) or isinstance(lowest, bool)):
            raise MalformedFrame("field 'min_protocol_version' must be an integer")
        return cls(
            field_of(obj, "protocol_version", int),
            field_of(obj, "client_id", str, ""),
            token,
            lowest,
        )


@dataclass(frozen=True, slots=True)
class HandshakeOk(JsonBody):
    #: the version this connection speaks: the highest both sides do (``negotiate``)
    protocol_version: int
    broker_id: int
    cluster_id: str
    max_frame_bytes: int
    max_batch_bytes: int
    #: signed member identities are on: get one (op IDENTITY) and join with it
    member_identities: bool = False

    @classmethod
    def decode(cls, body: bytes) -> HandshakeOk:
        obj = decode_json(body)
        return cls(
            field_of(obj, "protocol_version", int),
            field_of(obj, "broker_id", int),
            field_of(obj, "cluster_id", str),
            field_of(obj, "max_frame_bytes", int),
            field_of(obj, "max_batch_bytes", int),
            field_of(obj, "member_identities", bool, False),
        )


def _address_json(broker: BrokerEndpoint) -> dict[str, Any]:
    """A broker as clients see it: the client wire carries no admin port."""
    return {"id": broker.id, "host": broker.host, "port": broker.port}


@dataclass(frozen=True, slots=True)
class TopicRouting(JsonBody):
    """Routing for one topic: partition count, version, and the owner of each partition."""

    name: str
    partitions: int
    partitioning_version: int
    owners: list[int]
    epochs: list[int]
    #: keys are spread over partitions ``0..routing_partitions-1``: fewer than
    #: ``partitions`` while a shrink drains the partitions it retires (0: all of them)
    routing_partitions: int = 0
    #: which incarnation of the topic this is: another one after the topic was deleted and
    #: created again under the same name ("": unknown, a topic from before creation ids)
    creation_id: str = ""

    @property
    def route_count(self) -> int:
        """How many partitions keyed and spread records go to."""
        return self.routing_partitions or self.partitions


@dataclass(frozen=True, slots=True)
class TopologySnapshot(JsonBody):
    """Body of TopologyOk (op 7) and TopologyUpdate (op 101).

    Snapshots are ordered by ``(epoch, generation)``: ``epoch`` is when the
    generation counter began (Unix ms; 0 for a counter that has always been
    kept, and for the controller's, which is durable), so a counter that lost its
    history and started again is still newer than everything the old one numbered.
    """

    generation: int
    cluster_id: str
    brokers: list[BrokerEndpoint]
    topics: list[TopicRouting]
    epoch: int = 0

    @property
    def order(self) -> tuple[int, int]:
        """What "newer" compares: the counter's epoch first, then its generation."""
        return (self.epoch, self.generation)

    def to_json(self) -> dict[str, Any]:
        return {
            "epoch": self.epoch,
            "generation": self.generation,
            "cluster_id": self.cluster_id,
            "brokers": [_address_json(b) for b in self.brokers],
            "topics": [asdict(t) for t in self.topics],
        }

    @classmethod
    def decode(cls, body: bytes) -> TopologySnapshot:
        obj = decode_json(body)
        try:
            brokers = [
                BrokerEndpoint(int(b["id"]), str(b["host"]), int(b["port"]))
                for b in field_of(obj, "brokers", list)
            ]
            topics = [
                TopicRouting(
                    str(t["name"]),
                    int(t["partitions"]),
                    int(t["partitioning_version"]),
                    [int(o) for o in t["owners"]],
                    [int(e) for e in t["epochs"]],
                    int(t.get("routing_partitions") or 0),
                    str(t.get("creation_id") or ""),
                )
                for t in field_of(obj, "topics", list)
            ]
        except (KeyError, TypeError, ValueError, OverflowError) as exc:
            raise MalformedFrame(f"malformed topology: {exc}") from exc
        return cls(
            field_of(obj, "generation", int),
            field_of(obj, "cluster_id", str),
            brokers,
            topics,
            field_of(obj, "epoch", int, 0),
        )


@dataclass(frozen=True, slots=True)
class Redirect(JsonBody):
    """Names the current owner of a partition (None when it has none right now)."""

    topic: str
    partition: int
    owner: BrokerEndpoint | None
    partitioning_version: int
    generation: int
    reason: str

    def to_json(self) -> dict[str, Any]:
        return {
            "topic": self.topic,
            "partition": self.partition,
            "owner": _address_json(self.owner) if self.owner else None,
            "partitioning_version": self.partitioning_version,
            "generation": self.generation,
            "reason": self.reason,
        }

    @classmethod
    def decode(cls, body: bytes) -> Redirect:
        obj = decode_json(body)
        owner_obj = obj.get("owner")
        owner = None
        if owner_obj is not None:
            if not isinstance(owner_obj, dict):
                raise MalformedFrame("field 'owner' must be an object")
            owner = BrokerEndpoint(
                field_of(owner_obj, "id", int),
                field_of(owner_obj, "host", str),
                field_of(owner_obj, "port", int),
            )
        return cls(
            field_of(obj, "topic", str),
            field_of(obj, "partition", int),
            owner,
            field_of(obj, "partitioning_version", int),
            field_of(obj, "generation", int),
            field_of(obj, "reason", str, ""),
        )


@dataclass(frozen=True, slots=True)
class CohortJoin(JsonBody):
    cohort: str
    topic: str
    member_id: str
    #: where a partition without a cursor starts: "earliest" or "latest"
    start: str = "latest"
    session_timeout_ms: int = 10_000
    isolation: int = int(Isolation.COMMITTED)
    #: the signed identity token binding ``member_id`` to the principal (op IDENTITY);
    #: required when the handshake said ``member_identities``
    identity: str | None = None

    @classmethod
    def decode(cls, body: bytes) -> CohortJoin:
        obj = decode_json(body)
        identity = obj.get("identity")
        if identity is not None and not isinstance(identity, str):
            raise MalformedFrame("field 'identity' must be a string")
        return cls(
            field_of(obj, "cohort", str),
            field_of(obj, "topic", str),
            field_of(obj, "member_id", str),
            field_of(obj, "start", str, "latest"),
            field_of(obj, "session_timeout_ms", int, 10_000),
            field_of(obj, "isolation", int, int(Isolation.COMMITTED)),
            identity,
        )


@dataclass(frozen=True, slots=True)
class IdentityRequest(JsonBody):
    """Identity (op 46): ask the cluster for a member id bound to this principal.

    ``hint`` becomes the readable start of the issued id; the rest is random."""

    hint: str

    @classmethod
    def decode(cls, body: bytes) -> IdentityRequest:
        return cls(field_of(decode_json(body), "hint", str))


@dataclass(frozen=True, slots=True)
class IdentityOk(JsonBody):
    """IdentityOk (op 47): the issued member id and the token to present when joining."""

    member_id: str
    token: str

    @classmethod
    def decode(cls, body: bytes) -> IdentityOk:
        obj = decode_json(body)
        return cls(field_of(obj, "member_id", str), field_of(obj, "token", str))


@dataclass(frozen=True, slots=True)
class Assignment(JsonBody):
    """Pushed (op 40) whenever a member's partition set changes.

    ``partitions`` maps partition -> gate epoch for gates the member holds now;
    ``revoked`` lists partitions the member must finish and release.
    ``sequence`` orders views sent to a member (the join response included):
    a gate grant can be pushed before the client has handled its join
    response, and the plan ``generation`` does not change on a grant, so the
    client applies a view only if its sequence is newer than the last one.
    """

    cohort: str
    generation: int
    partitions: dict[int, int]
    revoked: list[int]
    grace_ms: int
    sequence: int = 0

    def to_json(self) -> dict[str, Any]:
        return {
            "cohort": self.cohort,
            "generation": self.generation,
            "partitions": {str(p): e for p, e in self.partitions.items()},
            "revoked": self.revoked,
            "grace_ms": self.grace_ms,
            "sequence": self.sequence,
        }

    @classmethod
    def decode(cls, body: bytes) -> Assignment:
        obj = decode_json(body)
        try:
            parts = {int(p): int(e) for p, e in field_of(obj, "partitions", dict).items()}
            revoked = [int(p) for p in field_of(obj, "revoked", list)]
        except (TypeError, ValueError, OverflowError) as exc:
            raise MalformedFrame(f"malformed assignment: {exc}") from exc
        return cls(
            field_of(obj, "cohort", str),
            field_of(obj, "generation", int),
            parts,
            revoked,
            field_of(obj, "grace_ms", int),
            field_of(obj, "sequence", int, 0),
        )


@dataclass(frozen=True, slots=True)
class Release(JsonBody):
    """A member gives back revoked partitions once its in-flight records are acked."""

    partitions: list[int]

    @classmethod
    def decode(cls, body: bytes) -> Release:
        obj = decode_json(body)
        try:
            return cls([int(p) for p in field_of(obj, "partitions", list)])
        except (TypeError, ValueError, OverflowError) as exc:
            raise MalformedFrame(f"malformed release: {exc}") from exc


@dataclass(frozen=True, slots=True)
class Seek(JsonBody):
    """Move a held partition's cursor: the next delivery starts at ``offset``."""

    partition: int
    offset: int

    @classmethod
    def decode(cls, body: bytes) -> Seek:
        obj = decode_json(body)
        return cls(field_of(obj, "partition", int), field_of(obj, "offset", int))


@dataclass(frozen=True, slots=True)
class TopologyUpdateAck(JsonBody):
    generation: int

    @classmethod
    def decode(cls, body: bytes) -> TopologyUpdateAck:
        return cls(field_of(decode_json(body), "generation", int))


@dataclass(frozen=True, slots=True)
class CreateTopic(JsonBody):
    name: str
    partitions: int
    config: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def decode(cls, body: bytes) -> CreateTopic:
        obj = decode_json(body)
        return cls(
            field_of(obj, "name", str),
            field_of(obj, "partitions", int),
            field_of(obj, "config", dict, {}),
        )


@dataclass(frozen=True, slots=True)
class TopicName(JsonBody):
    name: str

    @classmethod
    def decode(cls, body: bytes) -> TopicName:
        return cls(field_of(decode_json(body), "name", str))


# --------------------------------------------------------------------------- cohort admin

#: where ``ResetCursors`` moves a cursor; ``offset`` and ``timestamp`` carry a ``value``
RESET_TARGETS: Final = ("earliest", "latest", "offset", "timestamp")


@dataclass(frozen=True, slots=True)
class DescribeCohorts(JsonBody):
    """DescribeCohorts (op 56): the cohorts on the partitions the answering broker leads."""

    #: only this cohort (None: every cohort)
    cohort: str | None = None

    @classmethod
    def decode(cls, body: bytes) -> DescribeCohorts:
        obj = decode_json(body) if body else {}
        cohort = obj.get("cohort")
        if cohort is not None and not isinstance(cohort, str):
            raise MalformedFrame("field 'cohort' must be a string")
        return cls(cohort)


@dataclass(frozen=True, slots=True)
class ResetCursors(JsonBody):
    """ResetCursors (op 58): move a cohort's cursors on the partitions the broker leads.

    ``to`` is one of ``RESET_TARGETS``; ``value`` is the offset or the timestamp (ms since
    the epoch) for ``offset`` and ``timestamp``. ``partitions`` None means every partition.
    ``dry_run`` checks and reports the new cursors without moving them.
    """

    topic: str
    cohort: str
    to: str
    value: int | None = None
    partitions: list[int] | None = None
    dry_run: bool = False

    @classmethod
    def decode(cls, body: bytes) -> ResetCursors:
        obj = decode_json(body)
        to = field_of(obj, "to", str)
        if to not in RESET_TARGETS:
            raise InvalidRequest(f"'to' must be one of {', '.join(RESET_TARGETS)}, got {to!r}")
        value = obj.get("value")
        if to in ("offset", "timestamp"):
            value = field_of(obj, "value", int)
            if value < 0:
                raise InvalidRequest(f"{to} must not be negative, got {value}")
        elif value is not None:
            raise InvalidRequest(f"'value' goes with 'offset' or 'timestamp', not {to!r}")
        raw = obj.get("partitions")
        partitions = None
        if raw is not None:
            if not isinstance(raw, list) or not all(
                isinstance(p, int) and not isinstance(p, bool) for p in raw
            ):
                raise MalformedFrame("field 'partitions' must be a list of integers")
            partitions = list(raw)
        dry_run = obj.get("dry_run", False)
        if not isinstance(dry_run, bool):
            raise MalformedFrame("field 'dry_run' must be a boolean")
        return cls(
            field_of(obj, "topic", str),
            field_of(obj, "cohort", str),
            to,
            value,
            partitions,
            dry_run,
        )
