"""Length-prefixed frames and an incremental decoder (pure).

Every frame, in both directions::

    off size field
    0   4    length          u32  bytes after this field (8 + body)
    4   2    op              u16  operation code (see ``Op``)
    6   2    flags           u16  bit 0 response, bit 1 push, bit 2 no-reply
    8   4    correlation_id  u32  echoed in the response; 0 on pushes
    12  ...  body

The decoder is fed bytes as they arrive and hands back whole frames; it never
touches a socket, so tests drive it with arbitrary byte splits.
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


class FrameDecoder:
    """Turns a byte stream into frames.

    ``feed`` appends bytes; ``next_frame`` returns the next complete frame or
    None. A length below the header size or above ``max_frame_bytes`` is a
    protocol violation the connection cannot recover from (the stream has lost
    its framing), so those raise; everything else about a frame is the
    caller's to judge.
    """

    __slots__ = ("_buf", "_max", "_pos")

    def __init__(self, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES) -> None:
        self._buf = bytearray()
        self._pos = 0
        self._max = max_frame_bytes

    def feed(self, data: bytes | bytearray | memoryview) -> None:
        if self._pos and self._pos >= len(self._buf) // 2:
            del self._buf[: self._pos]
            self._pos = 0
        self._buf += data

    @property
    def buffered(self) -> int:
        return len(self._buf) - self._pos

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
        available = len(buf) - pos
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
        if available < FRAME_HEADER_SIZE:
            return None
        _, op, flags, correlation_id = FRAME_HEADER.unpack_from(buf, pos)
        end = pos + 4 + length
        if len(buf) < end:
            return None
        # One copy (bytearray slicing would copy twice). The buffer is kept, not
        # cleared: freeing and re-growing it per frame costs a page fault per page.
        body = bytes(memoryview(buf)[pos + FRAME_HEADER_SIZE : end])
        self._pos = end
        return Frame(op, flags, correlation_id, body)
