"""Read a partition back with plain FETCH requests (no cohort), for verification."""

from __future__ import annotations

from headrace.client.cluster import ClusterClient
from headrace.client.connection import ConnectOptions
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
