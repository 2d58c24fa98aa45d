"""The NFQUEUE delay forwarder's pure parts: its netlink codec and its delay line.

The kernel side (a real queue, real packets) is in ``tests/integration/test_partitions.py``."""

from __future__ import annotations

import socket
import struct

import pytest

from bench import delayline as dl


def _packet_message(packet_id: int, queue: int = 14) -> bytes:
    """A PACKET message as the kernel sends it: the header attribute, then another one."""
    hdr = dl.attribute(dl.PACKET_HDR, struct.pack("!IHB", packet_id, 0x0800, 1))
    mark = dl.attribute(3, struct.pack("!I", 7))  # NFQA_MARK, to be skipped
    return dl.message(dl.MSG_PACKET, queue, hdr + mark, flags=0, seq=0)


def _error_message(seq: int, errno_: int) -> bytes:
    body = struct.pack("=i", -errno_) + struct.pack("=IHHII", 16, dl.MSG_CONFIG, 5, seq, 0)
    return struct.pack("=IHHII", 16 + len(body), dl.NLMSG_ERROR, 0, seq, 0) + body


def test_attributes_are_padded_to_four_bytes() -> None:
    # PARAMS is 5 bytes of value: length 9, padded to 12
    params = dl.attribute(dl.CFG_PARAMS, struct.pack("!IB", 0, dl.COPY_META))
    assert len(params) == 12
    assert struct.unpack_from("=HH", params) == (9, dl.CFG_PARAMS)


def test_config_binds_the_queue_and_asks_for_acknowledgements() -> None:
    requests = dl.config_messages(14, maxlen=1000)
    assert len(requests) == 4
    for seq, request in enumerate(requests, start=1):
        length, kind, flags, got_seq, _port = struct.unpack_from("=IHHII", request)
        assert (length, kind, got_seq) == (len(request), dl.MSG_CONFIG, seq)
        assert flags == dl.NLM_F_REQUEST | dl.NLM_F_ACK
        family, version, queue = struct.unpack_from("!BBH", request, 16)
        assert (family, version, queue) == (socket.AF_UNSPEC, 0, 14)
    # the first one is the BIND command: u8 command, pad, be16 protocol family
    assert requests[0][20:28] == struct.pack("=HH", 8, dl.CFG_CMD) + struct.pack(
        "!BxH", dl.CMD_BIND, socket.AF_INET
    )
    assert struct.pack("!I", 1000) in requests[2]


def test_a_batch_verdict_names_the_last_packet_it_covers() -> None:
    message = dl.verdict_batch(14, 123_456)
    length, kind, flags, _seq, _port = struct.unpack_from("=IHHII", message)
    assert (length, kind, flags) == (len(message), dl.MSG_VERDICT_BATCH, dl.NLM_F_REQUEST)
    assert message[20:] == struct.pack("=HH", 12, dl.VERDICT_HDR) + struct.pack(
        "!II", dl.NF_ACCEPT, 123_456
    )


def test_parse_reads_packet_ids_and_answers_from_one_datagram() -> None:
    datagram = _packet_message(5) + _packet_message(6) + _error_message(2, 0)
    received = dl.parse(datagram + _error_message(3, 16))
    assert received.packet_ids == [5, 6]
    assert received.answers == [(2, 0), (3, 16)]


def test_parse_refuses_a_message_longer_than_the_datagram() -> None:
    with pytest.raises(ValueError, match="netlink message of length"):
        dl.parse(_packet_message(5)[:-4])


def test_the_delay_line_releases_in_order_and_only_when_due() -> None:
    line = dl.DelayLine(0.2)
    assert line.wait_s(0.0) is None
    line.hold(1, now=10.0)
    line.hold(2, now=10.05)
    line.hold(3, now=10.3)
    assert line.release(10.19) is None
    assert line.wait_s(10.19) == pytest.approx(0.01)
    # both due by 10.25: one verdict up to id 2 covers them
    assert line.release(10.25) == 2
    assert len(line) == 1
    assert line.wait_s(10.6) == 0.0
    assert line.release(10.6) == 3
    assert not line


def test_a_negative_delay_is_refused() -> None:
    with pytest.raises(ValueError, match="must not be negative"):
        dl.DelayLine(-0.1)
