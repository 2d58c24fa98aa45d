"""A fixed packet delay without ``netem``: the kernel queues packets, we hold their verdicts.

This kernel has no ``sch_netem``, so ``tc qdisc ... netem delay`` cannot delay a
broker's packets. It does have ``nfnetlink_queue`` and the ``NFQUEUE`` target:
an iptables rule in the broker's namespace hands each packet that arrives on
its ``eth0`` to netfilter queue ``N``, where the kernel keeps the packet (the
real skb, on its real path into the broker's TCP stack) until a userspace
program bound to that queue gives a verdict. This module is that program, and
it gives every verdict ``delay`` after the packet arrived: the packets go on
late, in the order they came, and nothing in the broker or the client knows
(see ``NetnsCluster.delay``).

Why the packets the broker *receives*: a packet held on its way *out* is still
charged to its sending socket, and TCP Small Queues then lets the sender have
only a couple of packets below TCP at a time, so a bulk flow crawls at a few
kB/s (netem avoids this by orphaning the skb, which userspace cannot do).
Arriving packets were orphaned when they crossed the veth pair. Every round
trip through the broker is ``delay`` longer either way, as with netem on its
egress.

Run inside the namespace whose queue it serves (queues belong to a namespace)::

    ip netns exec NS python -m bench.delayline --queue 14 --delay-ms 200

It prints ``bound queue N`` once the kernel accepted the binding. On SIGTERM it
keeps releasing what it holds at each packet's time, reads what the kernel still
queued, and exits once nothing is held (remove the iptables rule first, or new
packets keep arriving). Loss is not done here: ``NetnsCluster.lossy`` drops
packets with nft.

Theory of operation. Packet ids grow by one per packet in a queue, and every
packet is held for the same time, so the packets due at any moment are exactly
those up to some id: one ``VERDICT_BATCH`` ("accept everything up to id k")
releases them, whatever their number. The userspace side never reads payload
(``COPY_META``), so a packet costs one small netlink message in and a share of
one verdict out. If the socket buffer overflows and a packet's message is lost,
the batch verdict still covers that packet: it is released with the next one.

The wire format, netlink (host byte order) around nfnetlink (network byte order
inside the attributes), as ``include/uapi/linux/netfilter/nfnetlink_queue.h``
defines it::

    nlmsghdr  u32 length | u16 type | u16 flags | u32 seq | u32 port id
    nfgenmsg  u8 family  | u8 version (0)       | be16 res_id (the queue number)
    nlattr    u16 length | u16 type | value, padded to 4 bytes

    type = NFNL_SUBSYS_QUEUE (3) << 8 | PACKET (0) / VERDICT (1) / CONFIG (2) / VERDICT_BATCH (3)
    CONFIG attributes:  CMD (1) u8 command, u8 pad, be16 pf | PARAMS (2) be32 copy range,
                        u8 copy mode | QUEUE_MAXLEN (3) be32 | MASK (4) be32 | FLAGS (5) be32
    PACKET attribute:   PACKET_HDR (1) be32 packet id, be16 hw protocol, u8 hook
    VERDICT attribute:  VERDICT_HDR (2) be32 verdict, be32 packet id

``DelayLine`` and the codec functions are pure; ``serve`` is the socket loop.
"""

from __future__ import annotations

import argparse
import collections
import errno
import os
import select
import signal
import socket
import struct
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass

# ---------------------------------------------------------------------------- constants

NETLINK_NETFILTER = 12
SOL_NETLINK = 270
NETLINK_NO_ENOBUFS = 5  # a full receive buffer drops messages quietly instead of failing recv
SO_RCVBUFFORCE = 33  # root may exceed net.core.rmem_max

NLM_F_REQUEST = 0x1
NLM_F_ACK = 0x4
NLMSG_ERROR = 0x2
NLA_TYPE_MASK = 0x3FFF  # strips NLA_F_NESTED and NLA_F_NET_BYTEORDER

NFNL_SUBSYS_QUEUE = 3
MSG_PACKET = NFNL_SUBSYS_QUEUE << 8 | 0
MSG_VERDICT = NFNL_SUBSYS_QUEUE << 8 | 1
MSG_CONFIG = NFNL_SUBSYS_QUEUE << 8 | 2
MSG_VERDICT_BATCH = NFNL_SUBSYS_QUEUE << 8 | 3

CFG_CMD = 1
CFG_PARAMS = 2
CFG_QUEUE_MAXLEN = 3
CFG_MASK = 4
CFG_FLAGS = 5
CMD_BIND = 1
COPY_META = 1  # the packet's metadata, never its payload
#: hand GSO packets over whole: no software segmentation for a program that never reads them
CFG_F_GSO = 0x4

PACKET_HDR = 1
VERDICT_HDR = 2
NF_DROP = 0
NF_ACCEPT = 1

#: packets one queue may hold. At 200 ms that is 250,000 packets/s before the kernel drops
#: any (it drops rather than delays less when the queue is full, like a full netem queue)
DEFAULT_MAXLEN = 50_000

_NLMSGHDR = struct.Struct("=IHHII")  # length, type, flags, seq, port id
_NFGENMSG = struct.Struct("!BBH")  # family, version, res_id (the queue number)
_NLATTR = struct.Struct("=HH")  # length, type
_PACKET_HDR = struct.Struct("!IHB")  # packet id, hw protocol, hook
_VERDICT_HDR = struct.Struct("!II")  # verdict, packet id
_CONFIG_CMD = struct.Struct("!BxH")  # command, pad, pf
_CONFIG_PARAMS = struct.Struct("!IB")  # copy range, copy mode


class NetlinkError(RuntimeError):
    """The kernel refused a configuration message (``errno`` is its error number)."""

    def __init__(self, errno_: int, what: str) -> None:
        super().__init__(f"{what}: {os.strerror(errno_)} (errno {errno_})")
        self.errno = errno_


# ---------------------------------------------------------------------------- codec (pure)


def _align(n: int) -> int:
    return (n + 3) & ~3


def attribute(kind: int, value: bytes) -> bytes:
    length = _NLATTR.size + len(value)
    return _NLATTR.pack(length, kind) + value + b"\0" * (_align(length) - length)


def message(kind: int, queue: int, attributes: bytes, *, flags: int, seq: int) -> bytes:
    """One nfnetlink message for ``queue`` (port id 0: the kernel fills in ours)."""
    body = _NFGENMSG.pack(socket.AF_UNSPEC, 0, queue) + attributes
    return _NLMSGHDR.pack(_NLMSGHDR.size + len(body), kind, flags, seq, 0) + body


def config_messages(queue: int, maxlen: int = DEFAULT_MAXLEN) -> list[bytes]:
    """Bind ``queue``, ask for metadata only, a long queue, and whole GSO packets; each
    message asks for an acknowledgement (seq 1, 2, 3, 4), so a refusal is seen."""
    flags = NLM_F_REQUEST | NLM_F_ACK
    parts = [
        attribute(CFG_CMD, _CONFIG_CMD.pack(CMD_BIND, socket.AF_INET)),
        attribute(CFG_PARAMS, _CONFIG_PARAMS.pack(0, COPY_META)),
        attribute(CFG_QUEUE_MAXLEN, struct.pack("!I", maxlen)),
        attribute(CFG_FLAGS, struct.pack("!I", CFG_F_GSO))
        + attribute(CFG_MASK, struct.pack("!I", CFG_F_GSO)),
    ]
    return [
        message(MSG_CONFIG, queue, part, flags=flags, seq=seq)
        for seq, part in enumerate(parts, start=1)
    ]


def verdict_batch(queue: int, up_to_id: int, verdict: int = NF_ACCEPT) -> bytes:
    """``verdict`` for every packet of ``queue`` whose id is at most ``up_to_id``."""
    hdr = attribute(VERDICT_HDR, _VERDICT_HDR.pack(verdict, up_to_id))
    return message(MSG_VERDICT_BATCH, queue, hdr, flags=NLM_F_REQUEST, seq=0)


@dataclass(frozen=True)
class Received:
    """What one netlink datagram said: the ids of queued packets, and any error answers
    (``(seq, errno)``; errno 0 is an acknowledgement)."""

    packet_ids: list[int]
    answers: list[tuple[int, int]]


def _attributes(data: bytes) -> Iterator[tuple[int, bytes]]:
    pos = 0
    while pos + _NLATTR.size <= len(data):
        length, kind = _NLATTR.unpack_from(data, pos)
        if length < _NLATTR.size:
            raise ValueError(f"netlink attribute of length {length}")
        yield kind & NLA_TYPE_MASK, data[pos + _NLATTR.size : pos + length]
        pos += _align(length)


def parse(data: bytes) -> Received:
    """The packet ids and answers in one datagram (it may hold several messages)."""
    ids: list[int] = []
    answers: list[tuple[int, int]] = []
    pos = 0
    while pos + _NLMSGHDR.size <= len(data):
        length, kind, _flags, seq, _port = _NLMSGHDR.unpack_from(data, pos)
        if length < _NLMSGHDR.size or pos + length > len(data):
            raise ValueError(f"netlink message of length {length} at {pos} in {len(data)}")
        body = data[pos + _NLMSGHDR.size : pos + length]
        if kind == NLMSG_ERROR:
            (code,) = struct.unpack_from("=i", body)
            answers.append((seq, -code))
        elif kind == MSG_PACKET:
            for attr_kind, value in _attributes(body[_NFGENMSG.size :]):
                if attr_kind == PACKET_HDR:
                    ids.append(_PACKET_HDR.unpack_from(value)[0])
        pos += _align(length)
    return Received(ids, answers)


# ---------------------------------------------------------------------------- the delay (pure)


class DelayLine:
    """Packets held for ``delay_s`` each, first in, first out.

    ``hold`` notes a packet at ``now``; ``release(now)`` forgets every packet that is
    due and returns the highest such id (one batch verdict covers them), or None."""

    def __init__(self, delay_s: float) -> None:
        if delay_s < 0:
            raise ValueError(f"delay must not be negative, got {delay_s}")
        self.delay_s = delay_s
        self._held: collections.deque[tuple[float, int]] = collections.deque()

    def __len__(self) -> int:
        return len(self._held)

    def hold(self, packet_id: int, now: float) -> None:
        self._held.append((now + self.delay_s, packet_id))

    def release(self, now: float) -> int | None:
        last: int | None = None
        while self._held and self._held[0][0] <= now:
            last = self._held.popleft()[1]
        return last

    def wait_s(self, now: float) -> float | None:
        """Seconds until the next packet is due (0 if one is), None if nothing is held."""
        if not self._held:
            return None
        return max(0.0, self._held[0][0] - now)


# ---------------------------------------------------------------------------- the socket loop


def open_queue(queue: int, maxlen: int = DEFAULT_MAXLEN) -> socket.socket:
    """A netlink socket bound to netfilter queue ``queue`` in this namespace."""
    sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_NETFILTER)
    try:
        sock.bind((0, 0))
        sock.setsockopt(socket.SOL_SOCKET, SO_RCVBUFFORCE, 8 << 20)
        sock.setsockopt(SOL_NETLINK, NETLINK_NO_ENOBUFS, 1)
        for request in config_messages(queue, maxlen):
            sock.send(request)
            (seq,) = struct.unpack_from("=I", request, 8)
            answer = parse(sock.recv(65536)).answers
            if answer != [(seq, 0)]:
                code = answer[0][1] if answer else errno.EPROTO
                raise NetlinkError(code, f"configuring queue {queue} (message {seq})")
    except BaseException:
        sock.close()
        raise
    return sock


def serve(queue: int, delay_s: float, maxlen: int = DEFAULT_MAXLEN) -> int:
    """Hold every packet of ``queue`` for ``delay_s``; returns once stopped and drained.
    The return value is the number of packets delayed."""
    stopping = False

    def stop(_signum: int, _frame: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    line = DelayLine(delay_s)
    delayed = 0
    with open_queue(queue, maxlen) as sock:
        print(f"bound queue {queue}, delay {delay_s * 1000:.0f} ms", flush=True)
        while True:
            now = time.monotonic()
            last = line.release(now)
            if last is not None:
                sock.send(verdict_batch(queue, last))
            wait = line.wait_s(now)
            if stopping:
                wait = 0.0 if wait is None else min(wait, 0.05)
            readable, _, _ = select.select([sock], [], [], 0.5 if wait is None else wait)
            if readable:
                received = parse(sock.recv(65536))
                arrived = time.monotonic()
                for packet_id in received.packet_ids:
                    line.hold(packet_id, arrived)
                delayed += len(received.packet_ids)
            elif stopping and not line:
                return delayed


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--queue", type=int, required=True, help="netfilter queue number")
    parser.add_argument("--delay-ms", type=float, required=True, help="hold time per packet")
    parser.add_argument("--maxlen", type=int, default=DEFAULT_MAXLEN, help="queue length")
    args = parser.parse_args(argv)
    try:
        delayed = serve(args.queue, args.delay_ms / 1000, args.maxlen)
    except (OSError, NetlinkError) as exc:
        print(f"delayline: {exc}", file=sys.stderr, flush=True)
        raise SystemExit(1) from exc
    print(f"stopped after delaying {delayed} packets", flush=True)


if __name__ == "__main__":
    main()
