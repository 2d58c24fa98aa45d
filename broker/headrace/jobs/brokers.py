"""The brokers' side of the streaming source: high watermarks and the not-yet-uploaded tail.

Plain ``Fetch`` requests through ``ClusterClient`` (to each partition's leader),
committed isolation, run on a private event loop: Spark calls the stream
reader's methods synchronously, on the driver (offsets) and on executors (reads).
"""

from __future__ import annotations

import asyncio

from headrace.client.cluster import ClusterClient
from headrace.errors import HeadraceError
from headrace.protocol import messages as msg
from headrace.protocol.frames import Op
from headrace.records import batch as rb

#: bytes asked for per Fetch while reading a tail range
FETCH_BYTES = 8 << 20


def high_watermarks(bootstrap: str, topic: str, positions: dict[int, int]) -> dict[int, int]:
    """Each partition's high watermark, asked with a Fetch at ``positions[p]`` (an offset
    the log holds); partitions the brokers cannot answer for are left out, and so
    are partitions of a topic the brokers do not know. ``positions`` may name
    partitions beyond the topic's: they are ignored."""

    async def ask() -> dict[int, int]:
        cluster = ClusterClient(bootstrap)
        found: dict[int, int] = {}
        try:
            await cluster.start()
            try:
                count = cluster.routing.topic(topic).partitions
            except HeadraceError:
                return found
            for p in range(count):
                offset = positions.get(p, 0)
                try:
                    conn = await cluster.connection_for(topic, p)
                    req = msg.FetchRequest(topic, p, offset, 1, 1)
                    frame = await conn.request(Op.FETCH, req.encode())
                except HeadraceError:
                    continue  # below the log start of an untiered topic, or no leader now
                head, _ = msg.FetchResponseHeader.decode(frame.body)
                found[p] = head.high_watermark
        finally:
            await cluster.close()
        return found

    return asyncio.run(ask())


def log_range(bootstrap: str, topic: str, partition: int, offset: int) -> tuple[int, int]:
    """``(log_start_offset, high_watermark)`` of the partition's leader, asked with a
    Fetch at ``offset``; the broker's error (``OffsetOutOfRange`` if ``offset`` is
    outside its log) is raised as it is."""

    async def ask() -> tuple[int, int]:
        cluster = ClusterClient(bootstrap)
        try:
            await cluster.start()
            conn = await cluster.connection_for(topic, partition)
            req = msg.FetchRequest(topic, partition, offset, 1, 1)
            frame = await conn.request(Op.FETCH, req.encode())
            head, _ = msg.FetchResponseHeader.decode(frame.body)
            return head.log_start_offset, head.high_watermark
        finally:
            await cluster.close()

    return asyncio.run(ask())


def fetch_range(bootstrap: str, topic: str, partition: int, start: int, end: int) -> bytes:
    """Whole batches holding offsets ``[start, end)`` (committed), from the partition's
    leader; the first may start below ``start``."""

    async def read() -> bytes:
        cluster = ClusterClient(bootstrap)
        parts: list[bytes] = []
        offset = start
        try:
            await cluster.start()
            while offset < end:
                conn = await cluster.connection_for(topic, partition)
                req = msg.FetchRequest(topic, partition, offset, FETCH_BYTES, 100)
                frame = await conn.request(Op.FETCH, req.encode())
                _, data = msg.FetchResponseHeader.decode(frame.body)
                if not data:
                    raise HeadraceError(
                        f"{topic}/{partition}: the broker returned nothing at offset {offset}"
                        f" (below the end {end} it reported)"
                    )
                last_end = 0
                for pos, header in rb.scan(data):
                    offset = header.next_offset
                    last_end = pos + header.size
                    if offset >= end:
                        break
                parts.append(bytes(data[:last_end]))
        finally:
            await cluster.close()
        return b"".join(parts)

    return asyncio.run(read())
