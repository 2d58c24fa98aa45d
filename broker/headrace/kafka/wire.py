"""Kafka's primitive types, read and written (pure).

Every integer is big-endian. Flexible versions (KIP-482) add unsigned varints,
compact strings, arrays and bytes (length + 1 as an unsigned varint, 0 = null)
and a tagged-field section after every struct. ``Reader`` raises
``MalformedKafkaRequest`` for anything short or out of range, so a caller can
answer with an error code instead of dying on a ``struct.error``.
"""

from __future__ import annotations

import struct
from typing import Final

from headrace.errors import MalformedFrame

INT8: Final = struct.Struct(">b")
INT16: Final = struct.Struct(">h")
INT32: Final = struct.Struct(">i")
INT64: Final = struct.Struct(">q")
UINT32: Final = struct.Struct(">I")
FLOAT64: Final = struct.Struct(">d")

#: a string or array longer than this is refused before it is allocated
MAX_LENGTH: Final = 1 << 30


class MalformedKafkaRequest(MalformedFrame):
    """Bytes that do not parse as the Kafka message they claim to be."""


class Reader:
    """Reads primitives from a buffer without copying bulk bytes (``records`` stay views)."""

    __slots__ = ("buf", "pos")

    def __init__(self, buf: bytes | bytearray | memoryview, pos: int = 0) -> None:
        self.buf = memoryview(buf)
        self.pos = pos

    @property
    def remaining(self) -> int:
        return len(self.buf) - self.pos

    def _fixed(self, codec: struct.Struct) -> int:
        if self.remaining < codec.size:
            raise MalformedKafkaRequest(
                f"need {codec.size} bytes at {self.pos}, {self.remaining} left"
            )
        (value,) = codec.unpack_from(self.buf, self.pos)
        self.pos += codec.size
        return int(value)

    def int8(self) -> int:
        return self._fixed(INT8)

    def int16(self) -> int:
        return self._fixed(INT16)

    def int32(self) -> int:
        return self._fixed(INT32)

    def int64(self) -> int:
        return self._fixed(INT64)

    def uint32(self) -> int:
        return self._fixed(UINT32)

    def float64(self) -> float:
        if self.remaining < 8:
            raise MalformedKafkaRequest(f"need 8 bytes at {self.pos}, {self.remaining} left")
        (value,) = FLOAT64.unpack_from(self.buf, self.pos)
        self.pos += 8
        return float(value)

    def boolean(self) -> bool:
        return self.int8() != 0

    def uvarint(self) -> int:
        value = 0
        shift = 0
        while True:
            if self.pos >= len(self.buf):
                raise MalformedKafkaRequest("varint runs past the end")
            byte = self.buf[self.pos]
            self.pos += 1
            value |= (byte & 0x7F) << shift
            if not byte & 0x80:
                return value
            shift += 7
            if shift > 28:
                raise MalformedKafkaRequest("unsigned varint longer than 5 bytes")

    def take(self, n: int) -> memoryview:
        if n < 0 or n > self.remaining:
            raise MalformedKafkaRequest(f"need {n} bytes at {self.pos}, {self.remaining} left")
        view = self.buf[self.pos : self.pos + n]
        self.pos += n
        return view

    def length(self, compact: bool, wide: bool = False) -> int:
        """A length prefix; -1 is null. ``wide``: int32 (bytes, arrays) rather than int16."""
        n = self.uvarint() - 1 if compact else (self.int32() if wide else self.int16())
        if n < -1 or n > MAX_LENGTH:
            raise MalformedKafkaRequest(f"length {n} out of range")
        return n

    def string(self, compact: bool) -> str | None:
        n = self.length(compact)
        if n < 0:
            return None
        try:
            return str(self.take(n), "utf-8")
        except UnicodeDecodeError as exc:
            raise MalformedKafkaRequest("string is not UTF-8") from exc

    def blob(self, compact: bool) -> memoryview | None:
        n = self.length(compact, wide=True)
        return None if n < 0 else self.take(n)


class Writer:
    """Appends primitives; bulk buffers (``records``) are kept as separate parts, uncopied."""

    __slots__ = ("_current", "_parts", "_size")

    #: a blob at least this big is sent as its own buffer rather than copied in
    ZERO_COPY_BYTES: Final = 4096

    def __init__(self) -> None:
        self._current = bytearray()
        self._parts: list[bytes | bytearray | memoryview] = []
        self._size = 0

    def _fixed(self, codec: struct.Struct, value: int | float) -> None:
        try:
            self._current += codec.pack(value)
        except struct.error as exc:
            raise ValueError(f"{value!r} does not fit {codec.format}") from exc

    def int8(self, value: int) -> None:
        self._fixed(INT8, value)

    def int16(self, value: int) -> None:
        self._fixed(INT16, value)

    def int32(self, value: int) -> None:
        self._fixed(INT32, value)

    def int64(self, value: int) -> None:
        self._fixed(INT64, value)

    def uint32(self, value: int) -> None:
        self._fixed(UINT32, value)

    def float64(self, value: float) -> None:
        self._fixed(FLOAT64, value)

    def boolean(self, value: bool) -> None:
        self._current.append(1 if value else 0)

    def uvarint(self, value: int) -> None:
        if value < 0:
            raise ValueError(f"unsigned varint of {value}")
        while value >= 0x80:
            self._current.append((value & 0x7F) | 0x80)
            value >>= 7
        self._current.append(value)

    def raw(self, data: bytes | bytearray | memoryview) -> None:
        if len(data) >= self.ZERO_COPY_BYTES:
            self._flush()
            self._parts.append(data)
            self._size += len(data)
        else:
            self._current += data

    def length(self, n: int, compact: bool, wide: bool = False) -> None:
        if compact:
            self.uvarint(n + 1)
        elif wide:
            self.int32(n)
        else:
            self.int16(n)

    def string(self, value: str | None, compact: bool) -> None:
        if value is None:
            self.length(-1, compact)
            return
        data = value.encode()
        self.length(len(data), compact)
        self._current += data

    def blob(self, value: bytes | bytearray | memoryview | None, compact: bool) -> None:
        if value is None:
            self.length(-1, compact, wide=True)
            return
        self.length(len(value), compact, wide=True)
        self.raw(value)

    def blobs(self, parts: list[bytes | bytearray | memoryview] | None, compact: bool) -> None:
        """One ``records`` field made of several buffers (a fetch's batches), uncopied."""
        if parts is None:
            self.length(-1, compact, wide=True)
            return
        self.length(sum(len(p) for p in parts), compact, wide=True)
        for part in parts:
            self.raw(part)

    def _flush(self) -> None:
        if self._current:
            self._parts.append(bytes(self._current))
            self._size += len(self._current)
            self._current = bytearray()

    def parts(self) -> list[bytes | bytearray | memoryview]:
        """The written bytes as buffers to send in order (``transport.writelines``)."""
        self._flush()
        return self._parts

    def size(self) -> int:
        return self._size + len(self._current)

    def getvalue(self) -> bytes:
        return b"".join(self.parts())
