"""FrameDecoder: reassembly at any byte split, and hostile length fields."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from headrace.errors import FrameTooLarge, HeadraceError, MalformedFrame
from headrace.protocol import frames as fr

frame_args = st.tuples(
    st.integers(0, 0xFFFF),
    st.integers(0, 0xFFFF_FFFF),
    st.binary(max_size=120),
    st.integers(0, 0xFFFF),
)


def drain(decoder: fr.FrameDecoder) -> list[fr.Frame]:
    out = []
    while (frame := decoder.next_frame()) is not None:
        out.append(frame)
    return out


@settings(max_examples=200, deadline=None)
@given(st.lists(frame_args, min_size=1, max_size=8), st.data())
def test_frames_split_at_arbitrary_points_reassemble_exactly(
    specs: list[tuple[int, int, bytes, int]], data: st.DataObject
) -> None:
    stream = b"".join(fr.encode_frame(op, cid, body, flags) for op, cid, body, flags in specs)
    cuts = sorted(
        data.draw(st.sets(st.integers(1, len(stream) - 1), max_size=12), label="cuts")
        if len(stream) > 1
        else set()
    )
    decoder = fr.FrameDecoder()
    got: list[fr.Frame] = []
    for start, end in zip([0, *cuts], [*cuts, len(stream)], strict=True):
        decoder.feed(memoryview(stream)[start:end])
        got.extend(drain(decoder))
    assert got == [fr.Frame(op, flags, cid, body) for op, cid, body, flags in specs]
    assert decoder.buffered == 0
    assert decoder.next_frame() is None


def test_byte_at_a_time() -> None:
    stream = fr.encode_frame(fr.Op.PING, 7) + fr.encode_frame(fr.Op.PRODUCE, 8, b"xyz")
    decoder = fr.FrameDecoder()
    got = []
    for i in range(len(stream)):
        decoder.feed(stream[i : i + 1])
        got.extend(drain(decoder))
        if i < 11:
            assert got == []
    assert [(f.op, f.correlation_id, f.body) for f in got] == [
        (fr.Op.PING, 7, b""),
        (fr.Op.PRODUCE, 8, b"xyz"),
    ]


def test_buffered_counts_unconsumed_bytes() -> None:
    decoder = fr.FrameDecoder()
    one = fr.encode_frame(1, 1, b"ab")
    decoder.feed(one + one[:5])
    assert decoder.buffered == len(one) + 5
    assert decoder.next_frame() is not None
    assert decoder.buffered == 5
    assert decoder.next_frame() is None


@pytest.mark.parametrize("length", range(fr.MIN_LENGTH))
def test_length_below_the_header_is_malformed(length: int) -> None:
    decoder = fr.FrameDecoder()
    decoder.feed(struct.pack("<IHHI", length, 1, 0, 0) + b"\x00" * 16)
    with pytest.raises(MalformedFrame):
        decoder.next_frame()


def test_minimum_length_is_an_empty_body() -> None:
    decoder = fr.FrameDecoder()
    decoder.feed(struct.pack("<IHHI", fr.MIN_LENGTH, 4, 0, 9))
    assert decoder.next_frame() == fr.Frame(4, 0, 9, b"")


def test_frame_over_the_limit_is_refused_before_its_body_arrives() -> None:
    decoder = fr.FrameDecoder(max_frame_bytes=100)
    decoder.feed(fr.frame_header(1, 1, 100 - fr.FRAME_HEADER_SIZE + 1))
    with pytest.raises(FrameTooLarge):
        decoder.next_frame()


@pytest.mark.parametrize(("length", "error"), [(3, MalformedFrame), (1 << 30, FrameTooLarge)])
def test_bad_length_is_judged_from_its_four_bytes_alone(
    length: int, error: type[Exception]
) -> None:
    decoder = fr.FrameDecoder(max_frame_bytes=1024)
    decoder.feed(struct.pack("<I", length))
    with pytest.raises(error):
        decoder.next_frame()


def test_an_http_answer_is_named_as_such() -> None:
    """A client pointed at an admin port reads "HTTP/1.1 ..." where a length should be."""
    decoder = fr.FrameDecoder()
    decoder.feed(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")
    with pytest.raises(MalformedFrame, match="this is an HTTP port"):
        decoder.next_frame()


def test_frame_exactly_at_the_limit_is_accepted() -> None:
    decoder = fr.FrameDecoder(max_frame_bytes=100)
    body = b"b" * (100 - fr.FRAME_HEADER_SIZE)
    decoder.feed(fr.encode_frame(1, 1, body))
    frame = decoder.next_frame()
    assert frame is not None
    assert frame.body == body


def test_frame_header_matches_encode_frame() -> None:
    body = b"payload"
    assert fr.frame_header(10, 5, len(body), fr.FLAG_RESPONSE) + body == fr.encode_frame(
        10, 5, body, fr.FLAG_RESPONSE
    )


def test_flags() -> None:
    frame = fr.Frame(1, fr.FLAG_RESPONSE, 0, b"")
    assert frame.is_response
    assert not frame.is_push
    push = fr.Frame(1, fr.FLAG_PUSH | fr.FLAG_NO_REPLY, 0, b"")
    assert push.is_push
    assert not push.is_response


def test_request_and_success_ops_pair_up() -> None:
    names = {op.name: op for op in fr.Op}
    for op in fr.Op:
        if f"{op.name}_OK" in names:
            assert names[f"{op.name}_OK"] == op + 1


stream_pieces = st.one_of(
    st.binary(max_size=64),
    frame_args.map(lambda a: fr.encode_frame(a[0], a[1], a[2], a[3])),
    st.integers(0, 300).map(lambda n: struct.pack("<I", n)),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(stream_pieces, max_size=10))
def test_fuzzed_stream_yields_consistent_frames_or_a_headrace_error(
    chunks: list[bytes],
) -> None:
    decoder = fr.FrameDecoder(max_frame_bytes=256)
    fed = b""
    got: list[fr.Frame] = []
    error: HeadraceError | None = None
    try:
        for chunk in chunks:
            decoder.feed(chunk)
            fed += chunk
            while (frame := decoder.next_frame()) is not None:
                got.append(frame)
    except HeadraceError as exc:
        error = exc
    assert error is None or isinstance(error, MalformedFrame | FrameTooLarge)
    for frame in got:
        assert fr.MIN_LENGTH + len(frame.body) + 4 <= 256
    # the frames handed back are exactly a prefix of the stream, re-encoded
    consumed = b"".join(fr.encode_frame(f.op, f.correlation_id, f.body, f.flags) for f in got)
    assert fed.startswith(consumed)
    assert decoder.buffered == len(fed) - len(consumed)


def read_into(decoder: fr.FrameDecoder, stream: bytes, reads: list[int]) -> list[fr.Frame]:
    """Drive ``decoder`` as a BufferedProtocol's transport does: each read fills at most
    the view ``get_buffer`` lends (``reads`` caps each one), then ``buffer_updated``."""
    got: list[fr.Frame] = []
    pos = 0
    cap = iter(reads)
    while pos < len(stream):
        view = decoder.get_buffer(-1)
        assert len(view) > 0
        n = min(len(view), len(stream) - pos, next(cap, len(stream)))
        view[:n] = stream[pos : pos + n]
        view.release()
        decoder.buffer_updated(n)
        pos += n
        got.extend(drain(decoder))
    return got


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, 0xFFFF), st.integers(0, 9), st.integers(0, 200_000)),
        min_size=1,
        max_size=6,
    ),
    st.lists(st.integers(1, 300_000), max_size=40),
)
def test_reads_into_the_decoders_buffer_reassemble_exactly(
    specs: list[tuple[int, int, int]], reads: list[int]
) -> None:
    """Frames small and large (bigger than one read), read at arbitrary sizes straight
    into the decoder's buffer, come back byte for byte, and nothing is left over."""
    bodies = [bytes([i % 251]) * size for i, (_, _, size) in enumerate(specs)]
    stream = b"".join(
        fr.encode_frame(op, cid, body) for (op, cid, _), body in zip(specs, bodies, strict=True)
    )
    decoder = fr.FrameDecoder()
    got = read_into(decoder, stream, reads)
    assert [(f.op, f.correlation_id, f.body) for f in got] == [
        (op, cid, body) for (op, cid, _), body in zip(specs, bodies, strict=True)
    ]
    assert decoder.buffered == 0


def test_a_large_frames_rest_is_lent_whole_and_nothing_past_it() -> None:
    """Once a frame's length is in, the view lent is exactly its missing bytes: the rest
    arrives in one read, and no byte of the next frame lands behind it (to be moved)."""
    decoder = fr.FrameDecoder()
    body = b"r" * 1_000_000
    stream = fr.encode_frame(fr.Op.REPLICA_FETCH_OK, 3, body) + fr.encode_frame(fr.Op.PONG, 4)
    first = decoder.get_buffer(-1)
    assert len(first) == fr.READ_CHUNK
    first[: fr.READ_CHUNK] = stream[: fr.READ_CHUNK]
    first.release()
    decoder.buffer_updated(fr.READ_CHUNK)
    assert decoder.next_frame() is None
    rest = decoder.get_buffer(-1)
    assert len(rest) == fr.FRAME_HEADER_SIZE + len(body) - fr.READ_CHUNK
    rest[:] = stream[fr.READ_CHUNK : fr.FRAME_HEADER_SIZE + len(body)]
    rest.release()
    decoder.buffer_updated(len(body) + fr.FRAME_HEADER_SIZE - fr.READ_CHUNK)
    frame = decoder.next_frame()
    assert frame is not None and frame.body == body and decoder.buffered == 0
    assert read_into(decoder, stream[fr.FRAME_HEADER_SIZE + len(body) :], []) == [
        fr.Frame(fr.Op.PONG, 0, 4, b"")
    ]


def test_a_lent_view_still_held_does_not_stop_the_next_frame() -> None:
    """asyncio's transport keeps the view it read into alive while frames are decoded
    (``buffer_updated``): decoding, and the next ``get_buffer``, must not resize the
    buffer in place (a BufferError with an export alive)."""
    decoder = fr.FrameDecoder()
    stream = fr.encode_frame(1, 1, b"a" * 100) + fr.encode_frame(2, 2, b"b" * 300_000)
    held = decoder.get_buffer(-1)
    held[:] = stream[: len(held)]
    decoder.buffer_updated(len(held))
    assert drain(decoder)[0].body == b"a" * 100
    more = decoder.get_buffer(-1)  # must grow past ``held`` without touching it
    n = len(stream) - len(held)
    more[:n] = stream[len(held) :]
    decoder.buffer_updated(n)
    assert [f.body for f in drain(decoder)] == [b"b" * 300_000]
    held.release()
    more.release()


def test_a_length_field_alone_does_not_make_the_decoder_hold_the_whole_frame() -> None:
    """A peer that sends only the length of a huge (allowed) frame gets at most
    ``FRAME_RESERVE`` of room ahead of its bytes, not ``max_frame_bytes``; the frame still
    reassembles when its bytes do come, in reads of at most that much."""
    decoder = fr.FrameDecoder(max_frame_bytes=64 * 1024 * 1024)
    body = b"b" * (3 * fr.FRAME_RESERVE + 5)
    stream = fr.encode_frame(fr.Op.REPLICA_FETCH_OK, 7, body)
    view = decoder.get_buffer(-1)
    view[: fr.FRAME_HEADER_SIZE] = stream[: fr.FRAME_HEADER_SIZE]
    view.release()
    decoder.buffer_updated(fr.FRAME_HEADER_SIZE)
    assert decoder.next_frame() is None
    room = decoder.get_buffer(-1)
    assert len(room) == fr.FRAME_RESERVE
    room.release()
    frames = read_into(decoder, stream[fr.FRAME_HEADER_SIZE :], [])
    assert frames == [fr.Frame(fr.Op.REPLICA_FETCH_OK, 0, 7, body)]
