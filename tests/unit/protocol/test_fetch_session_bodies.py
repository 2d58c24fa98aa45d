"""Replica fetch session bodies: incremental fetches, forgotten partitions and session
resets survive the wire, and a body from before sessions reads as a full fetch."""

from __future__ import annotations

import json
import struct

import pytest

from headrace.errors import MalformedFrame
from headrace.protocol import replication as rp


def test_an_incremental_fetch_round_trips() -> None:
    fetch = rp.ReplicaFetch(
        2,
        500,
        [rp.FetchPosition("default/a", 3, 7, 120)],
        incremental=True,
        forgotten=[("default/b", 0), ("default/a", 9)],
    )
    back = rp.ReplicaFetch.decode(fetch.encode())
    assert back == fetch


def test_an_idle_incremental_fetch_is_small_whatever_the_session_holds() -> None:
    body = rp.ReplicaFetch(2, 500, [], incremental=True).encode()
    assert len(body) < 100


def test_a_fetch_without_session_fields_is_a_full_one() -> None:
    header = {
        "follower_id": 1,
        "max_wait_ms": 0,
        "partitions": [{"topic": "default/a", "partition": 0, "epoch": 1, "offset": 0}],
    }
    raw = json.dumps(header).encode()
    fetch = rp.ReplicaFetch.decode(struct.pack("<I", len(raw)) + raw)
    assert not fetch.incremental and fetch.forgotten == []
    assert [p.partition for p in fetch.positions] == [0]


def test_a_session_reset_round_trips_and_bad_forgotten_entries_are_refused() -> None:
    reset = rp.ReplicaFetchOk(session_reset=True)
    assert rp.ReplicaFetchOk.decode(b"".join(bytes(p) for p in reset.encode_parts())).session_reset
    plain = rp.ReplicaFetchOk([rp.FetchedPartition("default/a", 0, high_watermark=4)])
    decoded = rp.ReplicaFetchOk.decode(b"".join(bytes(p) for p in plain.encode_parts()))
    assert not decoded.session_reset and decoded.partitions[0].high_watermark == 4
    raw = json.dumps(
        {"follower_id": 1, "max_wait_ms": 0, "forgotten": [["only-a-topic"]], "partitions": []}
    ).encode()
    with pytest.raises(MalformedFrame):
        rp.ReplicaFetch.decode(struct.pack("<I", len(raw)) + raw)
