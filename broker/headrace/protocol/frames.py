"""Length-prefixed frames and an incremental decoder (pure).

Every frame, in both directions::

    off size field
    0   4    length          u32  bytes after this field (8 + body)
    4   2    op              u16  operation code (see ``Op``)
    6   2    flags           u16  bit 0 response, bit 1 push, bit 2 no-reply
    8   4    correlation_id  u32  echoed in the response; 0 on pushes
    12  ...  body

The decoder is fed bytes as they arrive (or lends its buffer to the socket's
reads) and hands back whole frames; it never touches a socket, so tests drive
it with arbitrary byte splits.
"""

from __future__ import annotations

import enum
import struct
from dataclasses import dataclass
from typing import Final

from headrace.errors import FrameTooLarge, MalformedFrame

#: length u32, op u16, flags u16, correlation_id u32
FRAME_HEADER: Final = struct.Struct("<IHHI")
FRAME_HEADER_SIZE: Final = FRAME_HEADER.size  # 12
_LENGTH: Final = struct.Struct("<I")
#: the length field counts op, flags and correlation_id as well as the body
MIN_LENGTH: Final = FRAME_HEADER_SIZE - 4
DEFAULT_MAX_FRAME_BYTES: Final = 16 * 1024 * 1024

FLAG_RESPONSE: Final = 1 << 0
FLAG_PUSH: Final = 1 << 1
FLAG_NO_REPLY: Final = 1 << 2
KNOWN_FLAGS: Final = FLAG_RESPONSE | FLAG_PUSH | FLAG_NO_REPLY


class Op(enum.IntEnum):
    """Operation codes. A request's success response is ``op + 1``."""

    ERROR = 1
    HANDSHAKE = 2
    HANDSHAKE_OK = 3
    PING = 4
    PONG = 5
    TOPOLOGY = 6
    TOPOLOGY_OK = 7
    PRODUCE = 10
    PRODUCE_OK = 11
    REDIRECT = 12
    FETCH = 20
    FETCH_OK = 21
    COHORT_JOIN = 30
    COHORT_JOIN_OK = 31
    COHORT_LEAVE = 32
    COHORT_LEAVE_OK = 33
    COHORT_HEARTBEAT = 34
    COHORT_HEARTBEAT_OK = 35
    CREDIT = 36
    ACK = 37
    ACK_OK = 38
    ASSIGNMENT = 40
    RELEASE = 41
    RELEASE_OK = 42
    DELIVERY = 43
    SEEK = 44
    SEEK_OK = 45
    IDENTITY = 46
    IDENTITY_OK = 47
    REPLICA_FETCH = 60
    REPLICA_FETCH_OK = 61
    OFFSET_FOR_EPOCH = 62
    OFFSET_FOR_EPOCH_OK = 63
    CREATE_TOPIC = 50
    CREATE_TOPIC_OK = 51
    DELETE_TOPIC = 52
    DELETE_TOPIC_OK = 53
    DESCRIBE_TOPICS = 54
    DESCRIBE_TOPICS_OK = 55
    DESCRIBE_COHORTS = 56
    DESCRIBE_COHORTS_OK = 57
    RESET_CURSORS = 58
    RESET_CURSORS_OK = 59
    TOPOLOGY_UPDATE = 101
    TOPOLOGY_UPDATE_ACK = 102


KNOWN_OPS: Final = frozenset(int(op) for op in Op)


@dataclass(frozen=True, slots=True)
class Frame:
    op: int
    flags: int
    correlation_id: int
    body: bytes

    @property
    def is_response(self) -> bool:
        return bool(self.flags & FLAG_RESPONSE)

    @property
    def is_push(self) -> bool:
        return bool(self.flags & FLAG_PUSH)


def encode_frame(op: int, correlation_id: int, body: bytes = b"", flags: int = 0) -> bytes:
    return FRAME_HEADER.pack(MIN_LENGTH + len(body), op, flags, correlation_id) + body


def frame_header(op: int, correlation_id: int, body_length: int, flags: int = 0) -> bytes:
    """Just the 12 header bytes, for writing a large body without concatenating."""
    return FRAME_HEADER.pack(MIN_LENGTH + body_length, op, flags, correlation_id)


#: bytes a read may bring when no frame is in progress
READ_CHUNK: Final = 64 * 1024
#: the most room a frame in progress gets ahead of its bytes: a peer that sends only a
#: length field must not make the decoder hold ``max_frame_bytes`` for it (the buffer
#: still grows by doubling as the bytes arrive, so a large frame costs no extra copies
#: beyond the amortised growth)
FRAME_RESERVE: Final = 1024 * 1024


class FrameDecoder:
    """Turns a byte stream into frames.

    Bytes come in one of two ways: ``feed`` copies bytes someone else received,
    or ``get_buffer`` and ``buffer_updated`` (an ``asyncio.BufferedProtocol``'s
    calls) let the socket read straight into the decoder's buffer. The second
    saves a copy of every received byte and the allocation of a bytes object per
    read: on a broker that is the produce path, and on a follower every
    replicated byte. ``next_frame`` returns the next complete frame
    or None; a frame's body is the one copy out of the buffer.

    A length below the header size or above ``max_frame_bytes`` is a protocol
    violation the connection cannot recover from (the stream has lost its
    framing), so those raise; everything else about a frame is the caller's to
    judge.

    The buffer (``_buf``, bytes in ``[_pos, _end)``) is kept, not freed per
    frame (re-growing it costs a page fault per page), and never resized in
    place: a transport may still hold a view of it while frames are decoded.
    """

    __slots__ = ("_buf", "_end", "_max", "_pos", "_want")

    def __init__(self, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES) -> None:
        self._buf = bytearray()
        self._pos = 0
        self._end = 0
        #: the whole length of the frame at ``_pos`` once its length field is in, else 0
        self._want = 0
        self._max = max_frame_bytes

    def feed(self, data: bytes | bytearray | memoryview) -> None:
        n = len(data)
        self._make_room(n)
        self._buf[self._end : self._end + n] = data
        self._end += n

    def get_buffer(self, sizehint: int = -1) -> memoryview:
        """Where the next read may put its bytes: at most the rest of the frame in
        progress (so no byte of the next frame lands behind it and must be moved), capped
        at ``FRAME_RESERVE``, or ``READ_CHUNK`` between frames. ``sizehint`` is ignored,
        as asyncio allows."""
        del sizehint
        pending = self._end - self._pos
        need = min(self._want - pending, FRAME_RESERVE) if self._want > pending else READ_CHUNK
        self._make_room(need)
        return memoryview(self._buf)[self._end : self._end + need]

    def buffer_updated(self, nbytes: int) -> None:
        """``nbytes`` were written at the start of the last ``get_buffer``'s view."""
        self._end += nbytes

    def _make_room(self, n: int) -> None:
        """At least ``n`` free bytes after ``_end``: start over at the front when the
        buffer is drained, move a partial frame to the front, or grow (a new buffer)."""
        pending = self._end - self._pos
        if pending == 0:
            self._pos = self._end = 0
        if len(self._buf) - self._end >= n:
            return
        if pending + n <= len(self._buf):
            view = memoryview(self._buf)[self._pos : self._end]
            # An overlapping move goes through a temporary (slice assignment is a memcpy).
            self._buf[:pending] = view if pending <= self._pos else bytes(view)
            view.release()
        else:
            grown = bytearray(max(pending + n, 2 * len(self._buf)))
            grown[:pending] = memoryview(self._buf)[self._pos : self._end]
            self._buf = grown
        self._pos, self._end = 0, pending

    @property
    def buffered(self) -> int:
        return self._end - self._pos

    @property
    def max_frame_bytes(self) -> int:
        return self._max

    @max_frame_bytes.setter
    def max_frame_bytes(self, value: int) -> None:
        """Change the limit from the next frame on (a broker lifts it after the handshake)."""
        self._max = value

    def next_frame(self) -> Frame | None:
        buf = self._buf
        pos = self._pos
        available = self._end - pos
        if available < 4:
            return None
        # Judge the length as soon as it arrives: a bad one must not wait for more bytes.
        (length,) = _LENGTH.unpack_from(buf, pos)
        if length < MIN_LENGTH or length + 4 > self._max:
            # Only a bad length pays for telling an HTTP server apart (a common mistake:
            # pointing a client at an admin or metrics port).
            if buf[pos : pos + 4] == b"HTTP":
                raise MalformedFrame(
                    "the server answered in HTTP: this is an HTTP port (a broker's admin or a"
                    " controller's), not a headrace data port (a broker's --port, 9092 by default)"
                )
            if length < MIN_LENGTH:
                raise MalformedFrame(f"frame length {length} is below the minimum {MIN_LENGTH}")
            raise FrameTooLarge(f"frame of {length + 4} bytes exceeds the limit of {self._max}")
        if available < length + 4:
            self._want = length + 4
            return None
        _, op, flags, correlation_id = FRAME_HEADER.unpack_from(buf, pos)
        end = pos + 4 + length
        # One copy (bytearray slicing would copy twice).
        body = bytes(memoryview(buf)[pos + FRAME_HEADER_SIZE : end])
        self._pos = end
        self._want = 0
        return Frame(op, flags, correlation_id, body)
