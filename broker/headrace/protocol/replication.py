"""Broker-to-broker replication bodies (pure).

A replica fetch covers every partition a follower replicates from one
leader, over the one connection between the two brokers. Bodies are a JSON
header (length-prefixed) followed by the raw batches of each partition in
header order, so record bytes are never re-encoded::

    u32 json_length | json header | partition 0 batches | partition 1 batches | ...

Fetch sessions (Kafka's KIP-227, with the connection as the session): the
first fetch on a connection is *full* (every position); the leader keeps
them. Later fetches are *incremental*: only positions that changed, and the
partitions the follower stopped fetching (``forgotten``); the leader answers
only partitions with news (records, a moved high watermark or log start,
cursors, an error) besides those asked about. An idle pair of brokers then
exchanges a few dozen bytes per long poll whatever the partition count.
A leader that holds no session for the connection answers an
incremental fetch with ``session_reset``: the follower starts over in full.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import Any, Final

from headrace.errors import MalformedFrame
from headrace.protocol.messages import decode_json, encode_json, field_of

_JSON_LENGTH: Final = struct.Struct("<I")


def _split(body: bytes) -> tuple[dict[str, Any], memoryview]:
    if len(body) < 4:
        raise MalformedFrame("replication body too short")
    (n,) = _JSON_LENGTH.unpack_from(body, 0)
    if len(body) < 4 + n:
        raise MalformedFrame("replication header truncated")
    return decode_json(body[4 : 4 + n]), memoryview(body)[4 + n :]


def _join(header: dict[str, Any]) -> bytes:
    raw = encode_json(header)
    return _JSON_LENGTH.pack(len(raw)) + raw


@dataclass(frozen=True, slots=True)
class FetchPosition:
    topic: str
    partition: int
    #: the leader epoch the follower believes current; a mismatch is refused
    epoch: int
    #: the follower's log end offset: it has everything below
    offset: int
    max_bytes: int = 1024 * 1024


@dataclass(frozen=True, slots=True)
class ReplicaFetch:
    follower_id: int
    max_wait_ms: int
    positions: list[FetchPosition]
    #: False: the positions are all the follower fetches (a new session); True: only the
    #: changed ones, on top of the session the leader holds for this connection
    incremental: bool = False
    #: incremental only: partitions the follower no longer fetches from this leader
    forgotten: list[tuple[str, int]] = field(default_factory=list)

    def encode(self) -> bytes:
        return _join(
            {
                "follower_id": self.follower_id,
                "max_wait_ms": self.max_wait_ms,
                "incremental": self.incremental,
                "forgotten": [[t, i] for t, i in self.forgotten],
                "partitions": [
                    {
                        "topic": p.topic,
                        "partition": p.partition,
                        "epoch": p.epoch,
                        "offset": p.offset,
                        "max_bytes": p.max_bytes,
                    }
                    for p in self.positions
                ],
            }
        )

    @classmethod
    def decode(cls, body: bytes) -> ReplicaFetch:
        obj, _ = _split(body)
        try:
            positions = [
                FetchPosition(
                    str(p["topic"]),
                    int(p["partition"]),
                    int(p["epoch"]),
                    int(p["offset"]),
                    int(p.get("max_bytes", 1024 * 1024)),
                )
                for p in field_of(obj, "partitions", list)
            ]
            incremental = bool(obj.get("incremental", False))
            forgotten = [(str(t), int(i)) for t, i in obj.get("forgotten", [])]
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise MalformedFrame(f"malformed replica fetch: {exc}") from exc
        return cls(
            field_of(obj, "follower_id", int),
            field_of(obj, "max_wait_ms", int),
            positions,
            incremental,
            forgotten,
        )


@dataclass(slots=True)
class FetchedPartition:
    topic: str
    partition: int
    error: int = 0
    message: str = ""
    high_watermark: int = 0
    log_end_offset: int = 0
    log_start_offset: int = 0
    epoch: int = 0
    data: bytes | memoryview = b""
    #: cohort cursors of the partition, sent when they changed since this follower's last fetch
    cursors: dict[str, int] | None = None
    #: the leader's (partitioning version, cutover offset): where that version's records
    #: begin in this partition. Read after ``data``, and set before any record of the
    #: version is appended, so a follower that copies a record of it copies its cutover
    #: too. None: the leader has none, or is a release that does not send it
    cutover: tuple[int, int] | None = None


@dataclass(slots=True)
class ReplicaFetchOk:
    partitions: list[FetchedPartition] = field(default_factory=list)
    #: the leader holds no session for this connection: fetch again, in full
    session_reset: bool = False

    def encode_parts(self) -> list[bytes | memoryview]:
        header = {
            "session_reset": self.session_reset,
            "partitions": [
                {
                    "topic": p.topic,
                    "partition": p.partition,
                    "error": p.error,
                    "message": p.message,
                    "hw": p.high_watermark,
                    "leo": p.log_end_offset,
                    "log_start": p.log_start_offset,
                    "epoch": p.epoch,
                    "size": len(p.data),
                    **({"cursors": p.cursors} if p.cursors is not None else {}),
                    **({"cutover": list(p.cutover)} if p.cutover is not None else {}),
                }
                for p in self.partitions
            ],
        }
        return [_join(header), *(p.data for p in self.partitions if len(p.data))]

    @classmethod
    def decode(cls, body: bytes) -> ReplicaFetchOk:
        obj, rest = _split(body)
        out = cls(session_reset=bool(obj.get("session_reset", False)))
        pos = 0
        try:
            for p in field_of(obj, "partitions", list):
                size = int(p["size"])
                if size < 0 or pos + size > len(rest):
                    raise MalformedFrame("replica fetch data shorter than announced")
                cursors = p.get("cursors")
                out.partitions.append(
                    FetchedPartition(
                        str(p["topic"]),
                        int(p["partition"]),
                        int(p["error"]),
                        str(p.get("message", "")),
                        int(p["hw"]),
                        int(p["leo"]),
                        int(p["log_start"]),
                        int(p["epoch"]),
                        rest[pos : pos + size],
                        {str(k): int(v) for k, v in cursors.items()}
                        if isinstance(cursors, dict)
                        else None,
                        _cutover(p.get("cutover")),
                    )
                )
                pos += size
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise MalformedFrame(f"malformed replica fetch response: {exc}") from exc
        return out


def _cutover(raw: object) -> tuple[int, int] | None:
    """``[version, offset]``, or absent (None)."""
    if raw is None:
        return None
    if (
        not isinstance(raw, list)
        or len(raw) != 2
        or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in raw)
    ):
        raise MalformedFrame(f"replica fetch cutover must be [version, offset], not {raw!r}")
    return raw[0], raw[1]


@dataclass(frozen=True, slots=True)
class EpochQuery:
    topic: str
    partition: int
    epoch: int


@dataclass(frozen=True, slots=True)
class EpochAnswer:
    topic: str
    partition: int
    #: the largest epoch the leader knows that is <= the asked one (-1: none)
    epoch: int
    #: where that epoch's records end in the leader's log: the follower truncates there
    end_offset: int
    error: int = 0


def encode_epoch_queries(queries: list[EpochQuery]) -> bytes:
    return encode_json(
        {
            "partitions": [
                {"topic": q.topic, "partition": q.partition, "epoch": q.epoch} for q in queries
            ]
        }
    )


def decode_epoch_queries(body: bytes) -> list[EpochQuery]:
    obj = decode_json(body)
    try:
        return [
            EpochQuery(str(q["topic"]), int(q["partition"]), int(q["epoch"]))
            for q in field_of(obj, "partitions", list)
        ]
    except (KeyError, TypeError, ValueError) as exc:
        raise MalformedFrame(f"malformed epoch query: {exc}") from exc


def encode_epoch_answers(answers: list[EpochAnswer]) -> bytes:
    return encode_json(
        {
            "partitions": [
                {
                    "topic": a.topic,
                    "partition": a.partition,
                    "epoch": a.epoch,
                    "end_offset": a.end_offset,
                    "error": a.error,
                }
                for a in answers
            ]
        }
    )


def decode_epoch_answers(body: bytes) -> list[EpochAnswer]:
    obj = decode_json(body)
    try:
        return [
            EpochAnswer(
                str(a["topic"]),
                int(a["partition"]),
                int(a["epoch"]),
                int(a["end_offset"]),
                int(a.get("error", 0)),
            )
            for a in field_of(obj, "partitions", list)
        ]
    except (KeyError, TypeError, ValueError) as exc:
        raise MalformedFrame(f"malformed epoch answer: {exc}") from exc
