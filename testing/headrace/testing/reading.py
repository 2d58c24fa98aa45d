"""Read a partition back with plain FETCH requests (no cohort), for verification; and what a
standalone broker says of a cohort."""

from __future__ import annotations

import asyncio
import contextlib
import json
from typing import Any

from headrace.client.cluster import ClusterClient
from headrace.client.connection import ClientConnection, ConnectOptions
from headrace.errors import HeadraceError
from headrace.protocol import messages as msg
from headrace.protocol.frames import Op
from headrace.records import batch as rb


async def read_partition(
    bootstrap: str,
    topic: str,
    partition: int,
    *,
    isolation: msg.Isolation = msg.Isolation.COMMITTED,
    options: ConnectOptions | None = None,
) -> list[rb.Record]:
    """``options``: the credentials, on a cluster that asks for them."""
    cluster = ClusterClient(bootstrap, options)
    records: list[rb.Record] = []
    try:
        await cluster.start()
        conn = await cluster.connection_for(topic, partition)  # the leader serves reads
        offset = 0
        while True:
            req = msg.FetchRequest(topic, partition, offset, 4 * 1024 * 1024, 0, isolation)
            frame = await conn.request(Op.FETCH, req.encode())
            head, data = msg.FetchResponseHeader.decode(frame.body)
            if not data:
                break
            for pos, header in rb.scan(data):
                batch = bytes(data[pos : pos + header.size])
                rb.check_header(header)  # either format: a Kafka producer's batches too
                assert rb.crc_ok(batch, header), f"CRC mismatch at offset {header.base_offset}"
                records.extend(rb.decode(batch).records(offset))
                offset = header.next_offset
            if offset >= head.high_watermark and isolation is msg.Isolation.COMMITTED:
                break
    finally:
        await cluster.close()
    return records


async def read_all(
    bootstrap: str, topic: str, partition: int, *, attempts: int = 50
) -> list[rb.Record]:
    """``read_partition`` on a cluster whose leadership may be moving (a failover, an
    unload): a read that meets a headrace error is tried again every 0.2 s, up to
    ``attempts`` times, then ``AssertionError``."""
    for _ in range(attempts):
        with contextlib.suppress(HeadraceError):
            return await read_partition(bootstrap, topic, partition)
        await asyncio.sleep(0.2)
    raise AssertionError(f"{topic} partition {partition} unreadable")


def offsets_and_values(records: list[rb.Record]) -> list[tuple[int, bytes]]:
    return [(r.offset, r.value) for r in records]


async def create_topic(
    bootstrap: str, name: str, partitions: int, config: dict[str, int] | None = None
) -> None:
    cluster = ClusterClient(bootstrap)
    try:
        conn = await cluster.bootstrap_connection()
        await conn.request(
            Op.CREATE_TOPIC, msg.CreateTopic(name, partitions, config or {}).encode()
        )
    finally:
        await cluster.close()


async def cohort_partitions(bootstrap: str, cohort: str) -> dict[int, dict[str, Any]]:
    """Partition -> what the broker at ``bootstrap`` says of ``cohort`` on it (its
    ``DescribeCohorts`` answer): ``cursor`` (the next offset it delivers, every record below it
    acknowledged), ``holder``, ``gate_state``, ``high_watermark``. Only partitions led there."""
    host, _, port = bootstrap.rpartition(":")
    conn = await ClientConnection.open(host, int(port), ConnectOptions())
    try:
        request = msg.DescribeCohorts(cohort).encode()
        answer = json.loads((await conn.request(Op.DESCRIBE_COHORTS, request)).body)
    finally:
        await conn.close()
    return {
        int(p["partition"]): p
        for entry in answer["cohorts"]
        if entry["cohort"] == cohort
        for p in entry["partitions"]
    }
