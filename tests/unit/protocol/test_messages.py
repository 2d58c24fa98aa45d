"""Message bodies: every body round-trips; every decoder meets garbage with MalformedFrame."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from headrace.errors import InvalidRequest, MalformedFrame, UnsupportedVersion
from headrace.protocol import messages as m
from headrace.protocol.endpoints import BrokerEndpoint

SETTINGS = settings(max_examples=60, deadline=None)

u8 = st.integers(0, 0xFF)
u16 = st.integers(0, 0xFFFF)
u32 = st.integers(0, 0xFFFF_FFFF)
u64 = st.integers(0, 2**64 - 1)
i32 = st.integers(-(2**31), 2**31 - 1)
i64 = st.integers(-(2**63), 2**63 - 1)
any_int = st.integers(-(2**70), 2**70)
text = st.text(max_size=20)
topics = st.text(max_size=40).filter(lambda t: len(t.encode()) <= m.MAX_TOPIC_NAME_BYTES)
json_scalars = st.none() | st.booleans() | any_int | st.floats(allow_nan=False) | text
json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(text, inner, max_size=3),
    max_leaves=8,
)
brokers = st.builds(BrokerEndpoint, any_int, text, any_int)
routings = st.builds(
    m.TopicRouting,
    text,
    any_int,
    any_int,
    st.lists(any_int, max_size=5),
    st.lists(any_int, max_size=5),
)


# --------------------------------------------------------------------------- binary bodies


@SETTINGS
@given(topics, u32, u32, st.sampled_from(m.Acks), u32, st.binary(max_size=100))
def test_produce_request_round_trip(
    topic: str, partition: int, version: int, acks: m.Acks, timeout_ms: int, batch: bytes
) -> None:
    request = m.ProduceRequest(topic, partition, version, acks, timeout_ms, batch)
    body = request.encode()
    assert body == request.encode_prefix() + batch
    got = m.ProduceRequest.decode(body)
    assert (got.topic, got.partition, got.partitioning_version) == (topic, partition, version)
    assert (got.acks, got.timeout_ms, bytes(got.batch)) == (acks, timeout_ms, batch)
    assert isinstance(got.acks, m.Acks)


@SETTINGS
@given(u64, i32, u64)
def test_produce_response_round_trip(base: int, epoch: int, hw: int) -> None:
    response = m.ProduceResponse(base, epoch, hw)
    assert m.ProduceResponse.decode(response.encode()) == response


@SETTINGS
@given(topics, u32, u64, u32, u32, st.sampled_from(m.Isolation))
def test_fetch_request_round_trip(
    topic: str, partition: int, offset: int, max_bytes: int, wait: int, iso: m.Isolation
) -> None:
    request = m.FetchRequest(topic, partition, offset, max_bytes, wait, iso)
    assert m.FetchRequest.decode(request.encode()) == request


@SETTINGS
@given(u64, u64, u64, st.binary(max_size=50))
def test_fetch_response_header_round_trip(hw: int, start: int, end: int, tail: bytes) -> None:
    header = m.FetchResponseHeader(hw, start, end)
    got, rest = m.FetchResponseHeader.decode(header.encode() + tail)
    assert got == header
    assert bytes(rest) == tail


@SETTINGS
@given(u32, u32, u64, u64, st.binary(max_size=50))
def test_delivery_round_trip(partition: int, epoch: int, hw: int, first: int, tail: bytes) -> None:
    body = m.DELIVERY_HEADER.pack(partition, epoch, hw, first) + tail
    got = m.Delivery.decode(body)
    assert (got.partition, got.gate_epoch, got.high_watermark, got.first_offset) == (
        partition,
        epoch,
        hw,
        first,
    )
    assert bytes(got.batches) == tail


@SETTINGS
@given(u32, u32, u64)
def test_ack_round_trip(partition: int, epoch: int, offset: int) -> None:
    ack = m.Ack(partition, epoch, offset)
    assert m.Ack.decode(ack.encode()) == ack


@SETTINGS
@given(u16, text, st.dictionaries(text, json_values, max_size=3))
def test_error_body_round_trip(code: int, message: str, details: dict[str, Any]) -> None:
    body = m.ErrorBody(code, message, details)
    assert m.ErrorBody.decode(body.encode()) == body


def test_error_body_truncates_a_huge_message() -> None:
    body = m.ErrorBody(5, "x" * 70_000).encode()
    assert len(m.ErrorBody.decode(body).message) == 65535


def test_topic_name_longer_than_the_limit_is_refused() -> None:
    request = m.FetchRequest("t" * (m.MAX_TOPIC_NAME_BYTES + 1), 0, 0, 1)
    with pytest.raises(InvalidRequest):
        request.encode()
    ok = m.FetchRequest("t" * m.MAX_TOPIC_NAME_BYTES, 0, 0, 1)
    assert m.FetchRequest.decode(ok.encode()) == ok


@pytest.mark.parametrize(
    ("decoder", "body", "message"),
    [
        (m.ProduceRequest.decode, b"\x09" + b"\x00" * 12 + b"\x00\x00", "acks"),
        (m.FetchRequest.decode, b"\x07" + b"\x00" * 20 + b"\x00\x00", "isolation"),
        (m.FetchRequest.decode, b"\x00" * 21 + b"\x05\x00ab", "topic name"),
        (m.FetchRequest.decode, b"\x00" * 21 + b"\x02\x00\xff\xfe", "UTF-8"),
        (m.FetchRequest.decode, b"\x00" * 21 + b"\x02", "topic length"),
        (m.Ack.decode, b"\x00" * 15, "16 bytes"),
        (m.ErrorBody.decode, b"\x01\x00\x09\x00abc", "truncated"),
    ],
)
def test_binary_decoders_name_what_is_wrong(
    decoder: Callable[[bytes], object], body: bytes, message: str
) -> None:
    with pytest.raises(MalformedFrame, match=message):
        decoder(body)


# --------------------------------------------------------------------------- JSON bodies

json_bodies = st.one_of(
    st.builds(m.Handshake, any_int, text, st.none() | text),
    st.builds(m.HandshakeOk, any_int, any_int, text, any_int, any_int),
    st.builds(
        m.TopologySnapshot,
        any_int,
        text,
        st.lists(brokers, max_size=3),
        st.lists(routings, max_size=3),
    ),
    st.builds(m.Redirect, text, any_int, st.none() | brokers, any_int, any_int, text),
    st.builds(m.CohortJoin, text, text, text, text, any_int, any_int),
    st.builds(
        m.Assignment,
        text,
        any_int,
        st.dictionaries(any_int, any_int, max_size=4),
        st.lists(any_int, max_size=4),
        any_int,
    ),
    st.builds(m.Release, st.lists(any_int, max_size=4)),
    st.builds(m.Seek, any_int, any_int),
    st.builds(m.TopologyUpdateAck, any_int),
    st.builds(m.CreateTopic, text, any_int, st.dictionaries(text, json_values, max_size=3)),
    st.builds(m.TopicName, text),
)


@settings(max_examples=300, deadline=None)
@given(json_bodies)
def test_json_body_round_trip(body: Any) -> None:
    assert type(body).decode(body.encode()) == body


def test_json_defaults_fill_missing_optional_fields() -> None:
    join = m.CohortJoin.decode(b'{"cohort":"c","topic":"t","member_id":"m"}')
    assert join == m.CohortJoin("c", "t", "m")
    assert m.Handshake.decode(b'{"protocol_version":1}') == m.Handshake(1, "", None)
    assert m.CreateTopic.decode(b'{"name":"n","partitions":3}').config == {}


@pytest.mark.parametrize(
    ("decoder", "body"),
    [
        (m.Handshake.decode, b'{"protocol_version":true}'),
        (m.Handshake.decode, b'{"protocol_version":1.5}'),
        (m.Handshake.decode, b'{"protocol_version":1,"auth_token":3}'),
        (m.Seek.decode, b'{"partition":1}'),
        (m.Seek.decode, b"[1, 2]"),
        (m.Seek.decode, b"\xff\xfe"),
        (
            m.Redirect.decode,
            b'{"topic":"t","partition":0,"owner":[1],"partitioning_version":1,"generation":1}',
        ),
        (
            m.Assignment.decode,
            b'{"cohort":"c","generation":1,"partitions":{"x":1},"revoked":[],"grace_ms":1}',
        ),
        (m.Release.decode, b'{"partitions":[null]}'),
        (
            m.TopologySnapshot.decode,
            b'{"generation":1,"cluster_id":"c","brokers":[{"id":1}],"topics":[]}',
        ),
    ],
)
def test_json_decoders_refuse_wrong_shapes(decoder: Callable[[bytes], object], body: bytes) -> None:
    with pytest.raises(MalformedFrame):
        decoder(body)


# --------------------------------------------------------------------------- fuzzing

BINARY_DECODERS: list[Callable[[bytes], object]] = [
    m.ErrorBody.decode,
    m.ProduceRequest.decode,
    m.ProduceResponse.decode,
    m.FetchRequest.decode,
    m.FetchResponseHeader.decode,
    m.Delivery.decode,
    m.Ack.decode,
]
JSON_TYPES: list[Any] = [
    m.Handshake,
    m.HandshakeOk,
    m.TopologySnapshot,
    m.Redirect,
    m.CohortJoin,
    m.Assignment,
    m.Release,
    m.Seek,
    m.TopologyUpdateAck,
    m.CreateTopic,
    m.TopicName,
    m.IdentityRequest,
    m.IdentityOk,
]
ALL_DECODERS = BINARY_DECODERS + [t.decode for t in JSON_TYPES]

#: every field name the JSON bodies use, so fuzzed objects reach the typed checks
VOCABULARY = sorted(
    {
        "protocol_version", "client_id", "auth_token", "broker_id", "cluster_id",
        "max_frame_bytes", "max_batch_bytes", "generation", "brokers", "topics", "id",
        "host", "port", "name", "partitions", "partitioning_version", "owners", "epochs",
        "topic", "partition", "owner", "reason", "cohort", "member_id", "start",
        "session_timeout_ms", "isolation", "revoked", "grace_ms", "offset", "config",
        "identity", "member_identities", "hint", "token", "min_protocol_version",
    }
)  # fmt: skip
hostile_scalars = (
    st.none()
    | st.booleans()
    | any_int
    | st.floats()
    | text
    | st.sampled_from(["1", "-1", "x", "\ud800"])
)
hostile_json = st.recursive(
    hostile_scalars,
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(st.sampled_from(VOCABULARY) | text, inner, max_size=6)
    ),
    max_leaves=20,
)


def only_malformed(decoder: Callable[[bytes], object], body: bytes) -> object | None:
    try:
        return decoder(body)
    except MalformedFrame:
        return None


@pytest.mark.parametrize("decoder", ALL_DECODERS, ids=lambda d: d.__qualname__)
@settings(max_examples=150, deadline=None)
@given(garbage=st.binary(max_size=80))
def test_decoding_arbitrary_bytes_raises_only_malformed_frame(
    decoder: Callable[[bytes], object], garbage: bytes
) -> None:
    only_malformed(decoder, garbage)


@pytest.mark.parametrize("cls", JSON_TYPES, ids=lambda t: t.__name__)
@settings(max_examples=100, deadline=None)
@given(obj=st.dictionaries(st.sampled_from(VOCABULARY), hostile_json, max_size=len(VOCABULARY)))
def test_decoding_hostile_json_raises_only_malformed_frame(cls: Any, obj: dict[str, Any]) -> None:
    body = json.dumps(obj).encode("utf-8", errors="surrogatepass")
    decoded: Any = only_malformed(cls.decode, body)
    if decoded is not None:
        # whatever was accepted re-encodes to something that decodes the same way
        again = cls.decode(decoded.encode())
        assert again.encode() == decoded.encode()


@pytest.mark.parametrize("decoder", [t.decode for t in JSON_TYPES], ids=lambda d: d.__qualname__)
@pytest.mark.parametrize(
    "body",
    [
        b"[" * 100_000,
        b'{"a":' * 50_000,
        b'{"generation":' + b"9" * 5000 + b"}",
        b"\xef\xbb\xbf{}",
    ],
    ids=["deep-list", "deep-object", "huge-int", "bom"],
)
def test_json_bombs_are_malformed_frames(decoder: Callable[[bytes], object], body: bytes) -> None:
    with pytest.raises(MalformedFrame):
        decoder(body)


@pytest.mark.parametrize(
    ("cls", "body"),
    [
        (
            m.TopologySnapshot,
            {
                "generation": 1,
                "cluster_id": "c",
                "brokers": [{"id": float("inf"), "host": "h", "port": 1}],
                "topics": [],
            },
        ),
        (
            m.Assignment,
            {
                "cohort": "c",
                "generation": 1,
                "partitions": {"1": float("inf")},
                "revoked": [],
                "grace_ms": 1,
            },
        ),
        (m.Release, {"partitions": [float("-inf")]}),
    ],
)
def test_infinite_numbers_are_malformed_frames(cls: Any, body: dict[str, Any]) -> None:
    with pytest.raises(MalformedFrame):
        cls.decode(json.dumps(body).encode())


def test_a_handshake_settles_on_the_highest_version_both_sides_speak() -> None:
    assert m.negotiate(1, 1, 1, 1) == 1
    assert m.negotiate(1, 3, 1, 2) == 2  # a newer client: the broker's newest
    assert m.negotiate(1, 2, 2, 4) == 2  # a newer broker: the client's newest
    for lowest, highest in ((3, 4), (0, 0), (2, 1)):
        with pytest.raises(UnsupportedVersion, match="upgrade the older side"):
            m.negotiate(lowest, highest, 1, 2)


def test_a_handshake_from_before_negotiation_offers_its_one_version() -> None:
    old = m.Handshake.decode(b'{"protocol_version":1,"client_id":"old"}')
    assert (old.lowest_version, old.protocol_version) == (1, 1)
    new = m.Handshake(m.PROTOCOL_VERSION, "new", None, m.MIN_PROTOCOL_VERSION)
    decoded = m.Handshake.decode(new.encode())
    assert decoded == new and decoded.lowest_version == m.MIN_PROTOCOL_VERSION
    with pytest.raises(MalformedFrame, match="min_protocol_version"):
        m.Handshake.decode(b'{"protocol_version":1,"min_protocol_version":"1"}')
