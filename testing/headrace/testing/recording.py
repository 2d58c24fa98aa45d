"""A transport that keeps what a protocol writes: how the unit tests drive a connection
(``server.Connection``, ``kafka_listener.KafkaConnection``) without a socket."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any


class RecordingTransport:
    """The parts of ``asyncio.Transport`` a connection uses; what it writes is kept in
    ``written``, and ``close`` only marks it closed."""

    def __init__(self, peer: tuple[str, int] = ("127.0.0.1", 1)) -> None:
        self.written = bytearray()
        self.closed = False
        self.peer = peer

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.written += data

    def writelines(self, parts: Iterable[bytes | bytearray | memoryview]) -> None:
        for part in parts:
            self.written += part

    def close(self) -> None:
        self.closed = True

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self.peer if name == "peername" else default

    def set_write_buffer_limits(self, high: int, low: int) -> None:
        pass
