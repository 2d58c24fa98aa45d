"""What the fuzzer sends to the Kafka listener: seed requests, Kafka-aware mutations, and a
local shadow decode (pure).

An input is a byte stream written as is to one fresh connection (Kafka needs no
handshake here: the fuzzed broker asks for no credentials). The seeds are
well-formed request frames of the APIs the listener serves, built with our own
codec (``headrace.kafka.messages``) at several versions, flexible and not, and
Produce requests carry a valid v2 record batch (ours, converted by
``headrace.kafka.convert``). The mutations aim where a Kafka broker is parsed:

- request headers: api keys and versions out of range or of the other flexibility,
  client id lengths that lie, garbage in the header's tagged fields;
- framing: truncated frames, size prefixes that lie (zero, negative, too big);
- record batches: a byte flipped under the CRC-32C, and header fields (magic,
  length, count, attributes, codec, producer id) changed with the CRC recomputed,
  so that the structural checks behind the CRC are reached too;
- the generic byte edits of ``inputs.mutate``, and plain garbage.

``shadow_decode`` runs the listener's own decoders over an input in the fuzzer's
process: it gives atheris coverage to steer by, and says which requests were
well-formed, so that the sender can match answers to requests and the run can
check that no record of a malformed Produce was stored.
"""

from __future__ import annotations

import functools
import random
import struct
from collections import Counter, deque
from dataclasses import dataclass, field
from typing import Any, Final

from bench.fuzz import inputs
from headrace.checksums import crc32c
from headrace.errors import HeadraceError
from headrace.kafka import convert
from headrace.kafka import messages as km
from headrace.kafka.errors import ErrorCode
from headrace.kafka.wire import Reader
from headrace.records import batch as rb
from headrace.records import kafka_records

#: the topic the seeds produce to and read from (the run creates it with 2 partitions);
#: the Kafka producer alongside uses a name no seed knows
SEED_TOPIC: Final = "fuzz"
#: the topics seeds create and delete (never the seed topic: its records are checked)
CREATED_TOPIC: Final = "fuzz-created"
DELETED_TOPIC: Final = "fuzz-doomed"
SEED_TOPICS: Final = (SEED_TOPIC, CREATED_TOPIC)
#: every record value a seed produces; the only values a stored non-load record may hold
SEED_VALUES: Final = frozenset({b"seed-value-1", b"seed-value-2", b"seed-value-3"})
#: the broker's default frame limit (``max_frame_bytes``)
MAX_FRAME_BYTES: Final = 16 * 1024 * 1024
#: the correlation id of the ApiVersions request the sender appends after each input
FENCE_CORRELATION_ID: Final = 0x7FFEFEFE

_SIZE = struct.Struct(">i")
_CRC = struct.Struct(">I")
#: offsets inside a Kafka v2 batch (big-endian): see ``records/batch.py``
_BATCH_LENGTH_AT: Final = 8
_ATTRIBUTES_AT: Final = 21
_PRODUCER_ID_AT: Final = 43
_RECORDS_COUNT_AT: Final = 57


def seed_batch() -> bytes:
    """A valid Kafka v2 record batch of three records, no producer id (as a plain producer)."""
    values = sorted(SEED_VALUES)
    ours = rb.encode(values, keys=[b"k1", None, b"k3"], timestamp_ms=1_700_000_000_000)
    return convert.to_kafka(ours)


def _request(api_key: km.ApiKey, version: int, correlation_id: int, body: Any) -> bytes:
    return km.encode_request(km.SUPPORTED[api_key], version, correlation_id, "fuzzer", body)


def _produce(version: int, acks: int, partition: int) -> km.ProduceRequest:
    data = km.PartitionProduceData(partition, memoryview(seed_batch()))
    return km.ProduceRequest(None, acks, 5_000, [km.TopicProduceData(SEED_TOPIC, [data])])


def _fetch(version: int, max_wait_ms: int) -> km.FetchRequest:
    partitions = [km.FetchPartition(p, -1, 0, -1, -1, 65536) for p in (0, 1)]
    return km.FetchRequest(
        max_wait_ms=max_wait_ms,
        min_bytes=1,
        topics=[km.FetchTopic(SEED_TOPIC, bytes(16), partitions)],
    )


def seed_requests() -> list[tuple[km.ApiKey, int, Any]]:
    """(api, version, body) of every seed request: each served API, at several versions."""
    A = km.ApiKey
    group = "fuzz-group"
    protocols = [km.JoinGroupRequestProtocol("range", b"\x00\x01\x00\x00\x00\x00")]
    commit = [km.OffsetCommitRequestTopic(SEED_TOPIC, [km.OffsetCommitRequestPartition(0, 1)])]
    offsets_topic = [km.ListOffsetsTopic(SEED_TOPIC, [km.ListOffsetsPartition(0, -1, -2)])]
    epoch_topic = [km.OffsetForLeaderTopic(SEED_TOPIC, [km.OffsetForLeaderPartition(0, -1, 0)])]
    metadata_topics = [km.MetadataRequestTopic(bytes(16), SEED_TOPIC)]
    return [
        (A.API_VERSIONS, 0, km.ApiVersionsRequest()),
        (A.API_VERSIONS, 3, km.ApiVersionsRequest("fuzzer", "1.0")),
        (A.METADATA, 1, km.MetadataRequest(metadata_topics)),
        (A.METADATA, 4, km.MetadataRequest(None, allow_auto_topic_creation=False)),
        (A.METADATA, 9, km.MetadataRequest(metadata_topics)),
        (A.METADATA, 12, km.MetadataRequest(None)),
        (A.PRODUCE, 3, _produce(3, -1, 0)),
        (A.PRODUCE, 7, _produce(7, 1, 1)),
        (A.PRODUCE, 8, _produce(8, 0, 0)),
        (A.PRODUCE, 9, _produce(9, -1, 1)),
        (A.FETCH, 4, _fetch(4, 0)),
        (A.FETCH, 11, _fetch(11, 0)),
        (A.FETCH, 12, _fetch(12, 20)),
        (A.LIST_OFFSETS, 1, km.ListOffsetsRequest(-1, 0, offsets_topic)),
        (A.LIST_OFFSETS, 6, km.ListOffsetsRequest(-1, 1, offsets_topic)),
        (A.OFFSET_FOR_LEADER_EPOCH, 3, km.OffsetForLeaderEpochRequest(-1, epoch_topic)),
        (A.FIND_COORDINATOR, 0, km.FindCoordinatorRequest(group)),
        (A.FIND_COORDINATOR, 2, km.FindCoordinatorRequest(group, 0)),
        (A.JOIN_GROUP, 0, km.JoinGroupRequest(group, 10_000, -1, "", None, "consumer", protocols)),
        (
            A.JOIN_GROUP,
            5,
            km.JoinGroupRequest(group, 10_000, 10_000, "", None, "consumer", protocols),
        ),
        (A.SYNC_GROUP, 3, km.SyncGroupRequest(group, 1, "member-x", None, [])),
        (A.HEARTBEAT, 3, km.HeartbeatRequest(group, 1, "member-x")),
        (A.LEAVE_GROUP, 2, km.LeaveGroupRequest(group, "member-x")),
        (A.OFFSET_COMMIT, 2, km.OffsetCommitRequest(group, -1, "", None, -1, commit)),
        (A.OFFSET_COMMIT, 8, km.OffsetCommitRequest(group, -1, "", None, -1, commit)),
        (
            A.OFFSET_FETCH,
            1,
            km.OffsetFetchRequest(group, [km.OffsetFetchRequestTopic(SEED_TOPIC, [0])]),
        ),
        (A.OFFSET_FETCH, 5, km.OffsetFetchRequest(group, None)),
        (A.DESCRIBE_GROUPS, 4, km.DescribeGroupsRequest([group], True)),
        (A.LIST_GROUPS, 2, km.ListGroupsRequest()),
        (A.DELETE_GROUPS, 1, km.DeleteGroupsRequest(["fuzz-other-group"])),
        (A.INIT_PRODUCER_ID, 0, km.InitProducerIdRequest(None, 60_000)),
        (A.INIT_PRODUCER_ID, 4, km.InitProducerIdRequest(None, 60_000)),
        (
            A.CREATE_TOPICS,
            4,
            km.CreateTopicsRequest([km.CreatableTopic(CREATED_TOPIC, 1, 1)], 5_000),
        ),
        (A.DELETE_TOPICS, 3, km.DeleteTopicsRequest([DELETED_TOPIC], 5_000)),
        (
            A.DESCRIBE_CONFIGS,
            3,
            km.DescribeConfigsRequest(
                [km.DescribeConfigsResource(km.RESOURCE_TOPIC, SEED_TOPIC, None)]
            ),
        ),
        (A.DESCRIBE_CLUSTER, 0, km.DescribeClusterRequest(False)),
        (A.SASL_HANDSHAKE, 1, km.SaslHandshakeRequest("PLAIN")),
        (A.SASL_AUTHENTICATE, 0, km.SaslAuthenticateRequest(b"\x00fuzzer\x00secret")),
        (
            A.CONSUMER_GROUP_HEARTBEAT,
            0,
            km.ConsumerGroupHeartbeatRequest(
                "fuzz-848", "", 0, subscribed_topic_names=[SEED_TOPIC], topic_partitions=[]
            ),
        ),
    ]


def seeds() -> list[bytes]:
    """Well-formed request streams: one per seed request, and a few pipelined sessions."""
    frames = [
        _request(api, version, i + 1, body)
        for i, (api, version, body) in enumerate(seed_requests())
    ]
    out = list(frames)
    out.append(b"".join(frames[:10]))  # a client's start: versions, metadata, produce
    out.append(b"".join(frames[16:27]))  # a group member's life
    return out


# --------------------------------------------------------------------------- mutations


def split_frames(data: bytes) -> tuple[list[bytes], bytes]:
    """The complete size-prefixed frames at the start of ``data`` (prefix included), and
    whatever follows them."""
    frames: list[bytes] = []
    pos = 0
    while len(data) - pos >= 4:
        (size,) = _SIZE.unpack_from(data, pos)
        if size < 0 or len(data) - pos - 4 < size:
            break
        frames.append(data[pos : pos + 4 + size])
        pos += 4 + size
    return frames, data[pos:]


def _framed(payload: bytes) -> bytes:
    return _SIZE.pack(len(payload)) + payload


def _batch_at(frame: bytes) -> int:
    """Where the seeds' record batch starts in ``frame`` (-1: nowhere, or no longer whole)."""
    marker = _seed_batch_marker()
    at = frame.find(marker)
    return -1 if at < rb.MAGIC_OFFSET else at - rb.MAGIC_OFFSET


@functools.cache
def _seed_batch_marker() -> bytes:
    """The seed batch from its magic byte through its producer fields: found where it sits."""
    return seed_batch()[rb.MAGIC_OFFSET : rb.KAFKA_HEADER_SIZE]


def _recrc(batch: bytearray) -> None:
    """Recompute a Kafka batch's CRC-32C over what follows it (its own batch_length's worth)."""
    (length,) = _SIZE.unpack_from(batch, _BATCH_LENGTH_AT)
    end = min(len(batch), 12 + max(length, 0))
    _CRC.pack_into(batch, rb.CRC_START - 4, crc32c(bytes(batch[rb.CRC_START : end])))


def mutate_batch(frame: bytes, rng: random.Random) -> bytes:
    """One edit of the record batch a Produce frame carries (the frame itself when it has none)."""
    begin = _batch_at(frame)
    if begin < 0:
        return frame
    buf = bytearray(frame)
    batch = bytearray(buf[begin:])
    choice = rng.randrange(8)
    if choice <= 1:  # a byte under the CRC flipped: CORRUPT_MESSAGE
        at = rng.randrange(rb.CRC_START, len(batch))
        batch[at] ^= 1 << rng.randrange(8)
    elif choice == 2:  # the CRC itself wrong
        batch[rb.CRC_START - 1 - rng.randrange(4)] ^= 0xFF
    elif choice == 3:  # another magic
        batch[rb.MAGIC_OFFSET] = rng.choice((0, 1, 3, 0xFF))
    elif choice == 4:  # records_count lies, CRC recomputed: INVALID_RECORD
        struct.pack_into(">i", batch, _RECORDS_COUNT_AT, rng.choice((0, -1, 2, 4, 0x7FFFFFFF)))
        _recrc(batch)
    elif choice == 5:  # attributes: codec 5-7, transactional, control; CRC recomputed
        attributes = rng.choice((5, 6, 7, 0x10, 0x20, 0x30, 0x7FFF, -1))
        struct.pack_into(">h", batch, _ATTRIBUTES_AT, attributes)
        _recrc(batch)
    elif choice == 6:  # producer id 0, which this broker never issues; CRC recomputed
        struct.pack_into(">q", batch, _PRODUCER_ID_AT, 0)
        _recrc(batch)
    else:  # batch_length lies
        (length,) = _SIZE.unpack_from(batch, _BATCH_LENGTH_AT)
        lie = rng.choice((0, -1, 8, 48, length - 1, length + 1, 0x7FFFFFFF))
        struct.pack_into(">i", batch, _BATCH_LENGTH_AT, lie)
    buf[begin:] = batch
    return bytes(buf)


def mutate_header(frame: bytes, rng: random.Random) -> bytes:
    """One edit of a frame's request header: api key, version, client id length, tags."""
    if len(frame) < 14:
        return frame
    payload = bytearray(frame[4:])
    api_key, version = struct.unpack_from(">hh", payload, 0)
    choice = rng.randrange(5)
    if choice == 0:  # an api key nobody serves, or another served one
        key = rng.choice((-1, 4, 5, 6, 7, 57, 67, 1000, 0x7FFF, -0x8000, *km.SUPPORTED))
        struct.pack_into(">h", payload, 0, key)
    elif choice == 1:  # a version out of range, or of the other flexibility
        api = km.SUPPORTED.get(api_key)
        near = (api.min_version - 1, api.max_version + 1, api.flexible_from) if api else ()
        struct.pack_into(">h", payload, 2, rng.choice((-1, 0, 1, 0x7FFF, *near)))
    elif choice == 2:  # a client id length that lies
        struct.pack_into(">h", payload, 8, rng.choice((-2, -0x8000, 0x7FFF, len(payload), 0, 1)))
    elif choice == 3:  # the header's tagged fields (flexible versions) made garbage
        (id_length,) = struct.unpack_from(">h", payload, 8)
        at = 10 + max(id_length, 0)
        api = km.SUPPORTED.get(api_key)
        if api is not None and api.flexible(version) and at < len(payload):
            garbage = rng.choice(
                (
                    b"\xff\xff\xff\xff\x0f",  # a tag count past any frame
                    b"\x01\x00\x7f",  # one tag whose size runs past the end
                    b"\x02\x05\x00\x03\x00",  # tags out of order
                    b"\x01\x80\x80\x80\x80\x80\x01",  # a varint too long
                    b"\x01\x00\x01\x00",  # one empty-ish unknown tag (legal)
                )
            )
            payload[at : at + 1] = garbage
    else:  # a correlation id at the edges
        struct.pack_into(">i", payload, 4, rng.choice((0, -1, 0x7FFFFFFF, FENCE_CORRELATION_ID)))
    return _framed(bytes(payload))


def mutate_framing(frames: list[bytes], index: int, rng: random.Random) -> list[bytes]:
    """Truncate frame ``index``, or make its size prefix lie."""
    frame = frames[index]
    if len(frame) < 5:
        return frames
    choice = rng.randrange(4)
    if choice == 0:  # truncated, size prefix left saying the full length: the rest never comes
        frames[index] = frame[: rng.randrange(len(frame))]
        del frames[index + 1 :]
    elif choice == 1:  # truncated and re-framed: a body that ends early
        frames[index] = _framed(frame[4 : 4 + rng.randrange(len(frame) - 4)])
    else:  # the size prefix lies
        lie = rng.choice(
            (
                0,
                -1,
                -0x80000000,
                1,
                7,
                8,
                len(frame) - 5,
                len(frame) - 3,
                MAX_FRAME_BYTES + 1,
                0x7FFFFFFF,
            )
        )
        frames[index] = _SIZE.pack(lie) + frame[4:]
    return frames


def mutate(data: bytes, rng: random.Random, pool: list[bytes]) -> bytes:
    """A few Kafka-aware edits of ``data``, or ``inputs.mutate``'s byte edits."""
    frames, tail = split_frames(data)
    if not frames or rng.random() < 0.2:
        return inputs.mutate(data, rng, pool)
    for _ in range(rng.randint(1, 2)):
        index = rng.randrange(len(frames))
        choice = rng.randrange(4)
        if choice == 0:
            frames[index] = mutate_header(frames[index], rng)
        elif choice == 1:
            frames = mutate_framing(frames, index, rng)
        elif choice == 2:
            frames[index] = mutate_batch(frames[index], rng)
        else:
            frames[index] = inputs.mutate(frames[index], rng, pool)
        if not frames:
            break
    return b"".join(frames) + tail


def random_input(rng: random.Random, pool: list[bytes]) -> bytes:
    """One input: mostly a mutated seed (a Produce half the time), sometimes garbage."""
    roll = rng.random()
    if roll < 0.05:
        return rng.randbytes(rng.randint(1, 256))
    if roll < 0.5:
        produces = [s for s in pool if _batch_at(s) >= 0]
        return mutate(rng.choice(produces or pool), rng, pool)
    return mutate(rng.choice(pool), rng, pool)


# --------------------------------------------------------------------------- shadow decode


@dataclass(slots=True)
class Shadow:
    """What the listener would make of an input."""

    #: complete frames in it
    frames: int = 0
    #: (correlation id, api, version) of each request that decodes, in order
    requests: list[tuple[int, km.Api, int]] = field(default_factory=list)
    #: records in Produce requests the broker may store: the request and its batch valid
    well_formed_records: int = 0


def shadow_decode(data: bytes, then: bytes = b"") -> Shadow:
    """Decode ``data`` as the Kafka listener would (pure: nothing is sent).

    ``then``: the bytes the sender writes after the input (the fence). They count when
    they complete a frame the input left short, as they do at the broker: a flexible
    Produce cut just before its last tagged-field counts is made whole by the zero bytes
    that start the fence's size prefix."""
    shadow = Shadow()
    stream = data + then
    pos = 0
    while len(data) - pos >= 1 and len(stream) - pos >= 4:
        (size,) = _SIZE.unpack_from(stream, pos)
        if size < 8 or size > MAX_FRAME_BYTES or len(stream) - pos - 4 < size:
            return shadow  # the listener closes, or waits for bytes that never come
        frame = stream[pos + 4 : pos + 4 + size]
        pos += 4 + size
        shadow.frames += 1
        r = Reader(frame)
        try:
            header = km.decode_request_header(r)
            api = km.SUPPORTED.get(header.api_key)
            if api is None or not api.supports(header.api_version):
                continue
            if api.flexible(header.api_version):
                km.skip_header_tags(r)
            body = km.decode_request(api, header.api_version, r)
        except HeadraceError:
            continue
        shadow.requests.append((header.correlation_id, api, header.api_version))
        if isinstance(body, km.ProduceRequest):
            shadow.well_formed_records += _storable_records(body)
    return shadow


def _storable_records(req: km.ProduceRequest) -> int:
    """Records of ``req`` that a broker could store: an upper bound on what it may."""
    if req.transactional_id is not None or req.acks not in (-1, 0, 1):
        return 0
    count = 0
    for topic in req.topic_data:
        if topic.name not in SEED_TOPICS:
            continue
        for data in topic.partition_data:
            if data.records is None:
                continue
            try:
                header = rb.validate_kafka(data.records)
                section = kafka_records.inflate(
                    header.compression, data.records[rb.KAFKA_HEADER_SIZE :]
                )
                kafka_records.decode_records(section, header.record_count, header.first_timestamp)
            except HeadraceError:
                continue
            count += header.record_count
    return count


# --------------------------------------------------------------------------- answers


def tally_answers(received: bytes, shadow: Shadow, codes: Counter[str]) -> int:
    """Count the broker's answers in ``received`` and the error codes they carry (by name):
    an answer of only a code (a request it could not parse or does not serve), and each
    Produce partition's code. Returns the number of answers (the fence's excluded)."""
    expected: dict[int, deque[tuple[km.Api, int]]] = {}
    for correlation_id, api, version in shadow.requests:
        expected.setdefault(correlation_id, deque()).append((api, version))
    frames, _ = split_frames(received)
    answers = 0
    for frame in frames:
        body = frame[4:]
        if len(body) < 4:
            continue
        (correlation_id,) = _SIZE.unpack_from(body, 0)
        if correlation_id == FENCE_CORRELATION_ID:
            continue
        answers += 1
        queue = expected.get(correlation_id)
        request = queue.popleft() if queue else None
        if request is not None and request[0].key == km.ApiKey.PRODUCE:
            try:
                _, answer = km.decode_response(request[0], request[1], body)
            except HeadraceError:
                pass
            else:
                for topic in answer.responses:
                    for partition in topic.partition_responses:
                        if partition.error_code != ErrorCode.NONE:
                            codes[_name(partition.error_code)] += 1
                continue
        if len(body) == 6:  # the correlation id and one int16 code
            (code,) = struct.unpack_from(">h", body, 4)
            if code != ErrorCode.NONE:
                codes[_name(code)] += 1
    return answers


def _name(code: int) -> str:
    try:
        return ErrorCode(code).name
    except ValueError:
        return str(code)


def fence() -> bytes:
    """An ApiVersions v0 request: its answer says every request before it was answered."""
    return _request(km.ApiKey.API_VERSIONS, 0, FENCE_CORRELATION_ID, km.ApiVersionsRequest())
