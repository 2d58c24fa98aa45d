"""A deliberately low-level client for protocol tests: plain sockets, raw frames."""

from __future__ import annotations

import socket

from headrace.protocol import messages as msg
from headrace.protocol.frames import FRAME_HEADER, Frame, FrameDecoder, Op, encode_frame


class RawConnection:
    def __init__(self, bootstrap: str, *, handshake: bool = True, token: str | None = None) -> None:
        host, _, port = bootstrap.rpartition(":")
        self.sock = socket.create_connection((host, int(port)), timeout=10)
        self.decoder = FrameDecoder(64 * 1024 * 1024)
        self.next_id = 1
        if handshake:
            frame = self.call(
                Op.HANDSHAKE, msg.Handshake(msg.PROTOCOL_VERSION, "raw", token).encode()
            )
            assert frame.op == Op.HANDSHAKE_OK, frame

    def send_raw(self, data: bytes) -> None:
        self.sock.sendall(data)

    def send(self, op: int, body: bytes) -> int:
        cid = self.next_id
        self.next_id += 1
        self.sock.sendall(encode_frame(op, cid, body))
        return cid

    def recv(self) -> Frame:
        while True:
            frame = self.decoder.next_frame()
            if frame is not None:
                return frame
            data = self.sock.recv(1 << 20)
            if not data:
                raise ConnectionError("closed by broker")
            self.decoder.feed(data)

    def call(self, op: int, body: bytes) -> Frame:
        cid = self.send(op, body)
        while True:
            frame = self.recv()
            if frame.correlation_id == cid:
                return frame

    def closed_by_peer(self) -> bool:
        self.sock.settimeout(5)
        try:
            while True:
                data = self.sock.recv(65536)
                if not data:
                    return True
        except (ConnectionResetError, BrokenPipeError):
            return True
        except TimeoutError:
            return False

    def close(self) -> None:
        self.sock.close()


def error_of(frame: Frame) -> msg.ErrorBody:
    assert frame.op == Op.ERROR, f"expected an error, got op {frame.op}"
    return msg.ErrorBody.decode(frame.body)


HEADER_SIZE = FRAME_HEADER.size
