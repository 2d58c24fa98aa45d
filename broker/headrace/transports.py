"""Socket set-up both ends of a connection share, and a free loopback port for a server
about to start (an adapter, not pure)."""

from __future__ import annotations

import asyncio
import socket
from typing import cast


def adopt(transport: asyncio.BaseTransport) -> asyncio.Transport:
    """Type a new transport and turn off Nagle: frames are small and latency matters.

    uvloop's transports implement the asyncio.Transport interface without
    subclassing it, so this casts rather than checks.
    """
    tcp = cast(asyncio.Transport, transport)
    sock = tcp.get_extra_info("socket")
    if sock is not None:
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError:
            pass  # not a TCP socket (a Unix socket in tests): nothing to tune
    return tcp


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on right now (another process may take it before we do)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])
