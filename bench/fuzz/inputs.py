"""What the fuzzer sends: seed frames, mutations of them, and a local shadow decode (pure).

An input is a byte stream the sender writes to one fresh connection, after a
handshake unless the input's first byte is odd (then the stream starts
unauthenticated, as an attacker's would). The seeds are well-formed request
streams for every client operation, so mutations of them reach past the frame
header into each request's body and into record batches.

``shadow_decode`` runs the broker's own decoders (frames, request bodies,
record batches) over an input in the fuzzer's process. It sends nothing; it
gives atheris coverage to steer by (the broker is another process, so its
coverage does not reach the fuzzer) and counts the complete frames an input
holds.
"""

from __future__ import annotations

import random
import struct
from collections.abc import Callable

from headrace.errors import HeadraceError
from headrace.protocol import messages as msg
from headrace.protocol.frames import FLAG_NO_REPLY, FrameDecoder, Op, encode_frame
from headrace.records import batch as rb

#: the topic seeds name; the producer running alongside uses a name no seed knows
SEED_TOPIC = "default/fuzz"
MAX_FRAME_BYTES = 1 << 20

_DECODERS: dict[int, Callable[[bytes], object]] = {
    Op.HANDSHAKE: msg.Handshake.decode,
    Op.PRODUCE: msg.ProduceRequest.decode,
    Op.FETCH: msg.FetchRequest.decode,
    Op.COHORT_JOIN: msg.CohortJoin.decode,
    Op.ACK: msg.Ack.decode,
    Op.RELEASE: msg.Release.decode,
    Op.SEEK: msg.Seek.decode,
    Op.CREATE_TOPIC: msg.CreateTopic.decode,
    Op.DELETE_TOPIC: msg.TopicName.decode,
    Op.DESCRIBE_COHORTS: msg.DescribeCohorts.decode,
    Op.RESET_CURSORS: msg.ResetCursors.decode,
    Op.TOPOLOGY_UPDATE_ACK: msg.TopologyUpdateAck.decode,
}


def seeds() -> list[bytes]:
    """Well-formed request streams, one per kind of request (and a few combined)."""
    batch = rb.encode(
        [b"value-1", b"value-2"],
        keys=[b"k", None],
        producer_id=7,
        base_sequence=0,
        timestamp_ms=1_700_000_000_000,
    )
    produce = msg.ProduceRequest(SEED_TOPIC, 0, 0, msg.Acks.ALL, 1000, b"")
    bodies: list[tuple[int, bytes, int]] = [
        (Op.PING, b"", 0),
        (Op.TOPOLOGY, b"{}", 0),
        (Op.CREATE_TOPIC, msg.CreateTopic(SEED_TOPIC, 2, {}).encode(), 0),
        (Op.PRODUCE, produce.encode_prefix() + batch, 0),
        (Op.PRODUCE, produce.encode_prefix() + batch, FLAG_NO_REPLY),
        (Op.FETCH, msg.FetchRequest(SEED_TOPIC, 0, 0, 65536, 50).encode(), 0),
        (
            Op.FETCH,
            msg.FetchRequest(SEED_TOPIC, 1, 0, 65536, 0, msg.Isolation.UNCOMMITTED).encode(),
            0,
        ),
        (Op.COHORT_JOIN, msg.CohortJoin("fuzzers", SEED_TOPIC, "member-f", "earliest").encode(), 0),
        (Op.CREDIT, msg.CREDIT.pack(65536), FLAG_NO_REPLY),
        (Op.COHORT_HEARTBEAT, b"{}", 0),
        (Op.ACK, msg.Ack(0, 1, 0).encode(), 0),
        (Op.SEEK, msg.Seek(0, 0).encode(), 0),
        (Op.COHORT_LEAVE, b"{}", 0),
        (Op.DESCRIBE_TOPICS, b"{}", 0),
        (Op.DESCRIBE_COHORTS, msg.DescribeCohorts(SEED_TOPIC).encode(), 0),
        (Op.TOPOLOGY_UPDATE_ACK, msg.TopologyUpdateAck(1).encode(), FLAG_NO_REPLY),
        (Op.REPLICA_FETCH, b"{}", 0),
        (Op.OFFSET_FOR_EPOCH, b"{}", 0),
    ]
    frames = [encode_frame(op, i + 1, body, flags) for i, (op, body, flags) in enumerate(bodies)]
    out = [b"\x00" + f for f in frames]
    out.append(b"\x00" + b"".join(frames[:6]))  # a pipelined session
    out.append(b"\x00" + b"".join(frames[6:13]))  # a cohort member's life
    out.append(
        b"\x01"
        + encode_frame(Op.HANDSHAKE, 1, msg.Handshake(msg.PROTOCOL_VERSION, "fuzz", None).encode())
    )
    return out


def mutate(data: bytes, rng: random.Random, pool: list[bytes]) -> bytes:
    """A few random edits of ``data`` (the fallback when atheris is not installed)."""
    buf = bytearray(data)
    for _ in range(rng.randint(1, 6)):
        choice = rng.randrange(8)
        pos = rng.randrange(len(buf) + 1)
        if choice == 0 and buf:  # flip a bit
            i = min(pos, len(buf) - 1)
            buf[i] ^= 1 << rng.randrange(8)
        elif choice == 1 and buf:  # an interesting byte
            buf[min(pos, len(buf) - 1)] = rng.choice((0, 1, 0x7F, 0x80, 0xFF))
        elif choice == 2:  # insert random bytes
            buf[pos:pos] = rng.randbytes(rng.randint(1, 16))
        elif choice == 3 and buf:  # delete a run
            del buf[pos : pos + rng.randint(1, 16)]
        elif choice == 4 and len(buf) >= pos + 4:  # an interesting 32-bit value (lengths, offsets)
            value = rng.choice(
                (0, 1, 11, 12, 0x7FFFFFFF, 0x80000000, 0xFFFFFFFF, MAX_FRAME_BYTES + 1)
            )
            struct.pack_into("<I", buf, pos, value)
        elif choice == 5 and pool:  # splice in part of another seed
            other = rng.choice(pool)
            start = rng.randrange(len(other))
            buf[pos:pos] = other[start : start + rng.randint(1, 64)]
        elif choice == 6:  # truncate
            del buf[pos:]
        else:  # duplicate a run (a repeated frame, say)
            buf[pos:pos] = buf[pos : pos + rng.randint(1, 64)]
    return bytes(buf)


def random_input(rng: random.Random, pool: list[bytes]) -> bytes:
    """One input: mostly a mutated seed, sometimes plain random bytes."""
    if rng.random() < 0.1:
        return rng.randbytes(rng.randint(1, 256))
    return mutate(rng.choice(pool), rng, pool)


def shadow_decode(data: bytes) -> int:
    """Decode ``data`` (after its mode byte) as the broker would; returns complete frames seen."""
    decoder = FrameDecoder(MAX_FRAME_BYTES)
    decoder.feed(data[1:])
    frames = 0
    while True:
        try:
            frame = decoder.next_frame()
        except HeadraceError:
            return frames
        if frame is None:
            return frames
        frames += 1
        decode = _DECODERS.get(frame.op)
        if decode is None:
            continue
        try:
            request = decode(bytes(frame.body))
        except HeadraceError:
            continue
        if isinstance(request, msg.ProduceRequest):
            try:
                rb.validate(bytes(request.batch))
                rb.decode(request.batch).records(0)
            except HeadraceError:
                continue
