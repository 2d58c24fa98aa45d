"""Bad input gets a typed error; the connection or broker stays healthy; nothing is lost."""

from __future__ import annotations

import struct

import pytest

from headrace import errors
from headrace.protocol import messages as msg
from headrace.protocol.frames import FRAME_HEADER, Op
from headrace.records import batch as rb
from headrace.testing.procs import BrokerProcess
from headrace.testing.reading import read_partition
from tests.integration.raw import RawConnection, error_of


def produce_body(topic: str, batch: bytes, version: int = 1, partition: int = 0) -> bytes:
    return msg.ProduceRequest(topic, partition, version, msg.Acks.LEADER, 5000, batch).encode()


@pytest.fixture
def seeded(broker: BrokerProcess) -> RawConnection:
    conn = RawConnection(broker.bootstrap)
    frame = conn.call(Op.CREATE_TOPIC, msg.CreateTopic("bad", 1).encode())
    assert frame.op == Op.CREATE_TOPIC_OK
    frame = conn.call(
        Op.PRODUCE, produce_body("bad", rb.encode([b"keep-1", b"keep-2"], timestamp_ms=0))
    )
    assert frame.op == Op.PRODUCE_OK
    return conn


def assert_still_serving(conn: RawConnection) -> None:
    frame = conn.call(Op.PRODUCE, produce_body("bad", rb.encode([b"after"], timestamp_ms=0)))
    assert frame.op == Op.PRODUCE_OK, error_of(frame)


async def assert_nothing_lost(broker: BrokerProcess, extra: list[bytes] = ()) -> None:  # type: ignore[assignment]
    values = [r.value for r in await read_partition(broker.bootstrap, "bad", 0)]
    assert values[:2] == [b"keep-1", b"keep-2"]
    assert all(v in (b"keep-1", b"keep-2", b"after") for v in values), values


async def test_wrong_crc_is_rejected_and_the_connection_stays_usable(
    broker: BrokerProcess, seeded: RawConnection
) -> None:
    batch = bytearray(rb.encode([b"x" * 50], timestamp_ms=0))
    batch[-1] ^= 0x01
    err = error_of(seeded.call(Op.PRODUCE, produce_body("bad", bytes(batch))))
    assert err.code == errors.CorruptBatch.CODE and "CRC" in err.message
    assert_still_serving(seeded)
    await assert_nothing_lost(broker)


async def test_batch_whose_length_disagrees_with_the_frame_is_rejected(
    broker: BrokerProcess, seeded: RawConnection
) -> None:
    batch = rb.encode([b"y" * 50], timestamp_ms=0)
    err = error_of(seeded.call(Op.PRODUCE, produce_body("bad", batch[:-5])))
    assert err.code == errors.CorruptBatch.CODE
    err = error_of(seeded.call(Op.PRODUCE, produce_body("bad", b"\x00" * 10)))
    assert err.code == errors.CorruptBatch.CODE
    assert_still_serving(seeded)
    await assert_nothing_lost(broker)


async def test_oversized_batch_gets_batch_too_large(
    broker: BrokerProcess, seeded: RawConnection
) -> None:
    big = rb.encode(
        [b"z" * (1024 * 1024)] * 9, timestamp_ms=0
    )  # 9 MiB > the 8 MiB default max_batch_bytes
    err = error_of(seeded.call(Op.PRODUCE, produce_body("bad", big)))
    assert err.code == errors.BatchTooLarge.CODE
    assert_still_serving(seeded)
    await assert_nothing_lost(broker)


async def test_unknown_op_gets_unknown_operation(
    broker: BrokerProcess, seeded: RawConnection
) -> None:
    err = error_of(seeded.call(999, b"whatever"))
    assert err.code == errors.UnknownOperation.CODE
    assert_still_serving(seeded)


async def test_unknown_topic_and_partition(broker: BrokerProcess, seeded: RawConnection) -> None:
    err = error_of(seeded.call(Op.PRODUCE, produce_body("nope", rb.encode([b"a"], timestamp_ms=0))))
    assert err.code == errors.UnknownTopic.CODE
    err = error_of(
        seeded.call(Op.PRODUCE, produce_body("bad", rb.encode([b"a"], timestamp_ms=0), partition=7))
    )
    assert err.code == errors.UnknownPartition.CODE
    err = error_of(seeded.call(Op.FETCH, msg.FetchRequest("nope", 0, 0, 1024).encode()))
    assert err.code == errors.UnknownTopic.CODE
    assert_still_serving(seeded)


async def test_malformed_bodies_get_malformed_frame(
    broker: BrokerProcess, seeded: RawConnection
) -> None:
    for op, body in [
        (Op.PRODUCE, b"\x01"),
        (Op.FETCH, b""),
        (Op.COHORT_JOIN, b"not json"),
        (Op.COHORT_JOIN, b"[1,2]"),
        (Op.CREATE_TOPIC, b'{"name": 5}'),
    ]:
        err = error_of(seeded.call(op, body))
        assert err.code == errors.MalformedFrame.CODE, (op, err)
    assert_still_serving(seeded)


async def test_invalid_cohort_member_ids_are_rejected(
    broker: BrokerProcess, seeded: RawConnection
) -> None:
    for member in ["", "-starts-with-dash", "has space", "x" * 200, "semi;colon"]:
        join = msg.CohortJoin("c", "bad", member)
        err = error_of(seeded.call(Op.COHORT_JOIN, join.encode()))
        assert err.code == errors.InvalidMemberId.CODE, member
    frame = seeded.call(Op.COHORT_JOIN, msg.CohortJoin("c", "bad", "good-member").encode())
    assert frame.op == Op.COHORT_JOIN_OK
    # one member identity per connection
    err = error_of(seeded.call(Op.COHORT_JOIN, msg.CohortJoin("c", "bad", "another").encode()))
    assert err.code == errors.AlreadyJoined.CODE
    # the same identity from a second connection is refused while the first holds it
    other = RawConnection(broker.bootstrap)
    err = error_of(other.call(Op.COHORT_JOIN, msg.CohortJoin("c", "bad", "good-member").encode()))
    assert err.code == errors.MemberIdInUse.CODE


async def test_stale_partitioning_version_is_redirected_not_accepted(
    broker: BrokerProcess, seeded: RawConnection
) -> None:
    frame = seeded.call(
        Op.PRODUCE, produce_body("bad", rb.encode([b"stale"], timestamp_ms=0), version=7)
    )
    assert frame.op == Op.REDIRECT
    redirect = msg.Redirect.decode(frame.body)
    assert redirect.partitioning_version == 1 and redirect.owner is not None
    assert redirect.owner.port == broker.port
    values = [r.value for r in await read_partition(broker.bootstrap, "bad", 0)]
    assert b"stale" not in values


async def test_request_before_handshake_is_refused(
    broker: BrokerProcess, seeded: RawConnection
) -> None:
    conn = RawConnection(broker.bootstrap, handshake=False)
    err = error_of(
        conn.call(Op.PRODUCE, produce_body("bad", rb.encode([b"sneaky"], timestamp_ms=0)))
    )
    assert err.code == errors.NotAuthenticated.CODE
    err = error_of(conn.call(Op.HANDSHAKE, msg.Handshake(99, "future").encode()))
    assert err.code == errors.UnsupportedVersion.CODE
    # a newer client that still speaks this broker's version is answered in it
    newer = RawConnection(broker.bootstrap, handshake=False)
    ok = newer.call(Op.HANDSHAKE, msg.Handshake(99, "newer", None, 1).encode())
    assert msg.HandshakeOk.decode(ok.body).protocol_version == msg.PROTOCOL_VERSION


async def test_frame_below_minimum_length_closes_only_that_connection(
    broker: BrokerProcess, seeded: RawConnection
) -> None:
    conn = RawConnection(broker.bootstrap)
    conn.send_raw(struct.pack("<I", 3) + b"abc")
    err = error_of(conn.recv())
    assert err.code == errors.MalformedFrame.CODE
    assert conn.closed_by_peer()
    assert_still_serving(seeded)
    await assert_nothing_lost(broker)


async def test_frame_above_the_limit_is_refused_before_it_is_read(
    broker: BrokerProcess, seeded: RawConnection
) -> None:
    conn = RawConnection(broker.bootstrap)
    # Announce a 1 GiB frame; the broker must not wait for (or buffer) it.
    conn.send_raw(FRAME_HEADER.pack(1 << 30, Op.PRODUCE, 0, 1))
    err = error_of(conn.recv())
    assert err.code == errors.FrameTooLarge.CODE
    assert conn.closed_by_peer()
    assert_still_serving(seeded)


async def test_garbage_stream_does_not_hurt_the_broker(
    broker: BrokerProcess, seeded: RawConnection
) -> None:
    import random

    rng = random.Random(7)
    for _ in range(20):
        conn = RawConnection(broker.bootstrap, handshake=rng.random() < 0.5)
        conn.send_raw(bytes(rng.getrandbits(8) for _ in range(rng.randint(1, 4096))))
        conn.close()
    # pipelined valid frames still work after the storm
    for i in range(50):
        seeded.send(Op.PRODUCE, produce_body("bad", rb.encode([b"after"], timestamp_ms=0)))
    frames = [seeded.recv() for _ in range(50)]
    assert all(f.op == Op.PRODUCE_OK for f in frames)
    assert broker.alive
    await assert_nothing_lost(broker)
