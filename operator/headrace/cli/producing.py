"""``headrace produce``: one record per line of a byte stream, with progress.

The stream is read in chunks of whatever is available (``read1``), so a big
file or pipe goes through in large ``send_many`` calls, while a person typing
lines into a terminal still sees each line sent as they press Enter.
"""

from __future__ import annotations

import asyncio
import os
import stat
from collections.abc import Awaitable, Callable
from typing import Any, BinaryIO

from headrace.cli.progress import Progress
from headrace.client.producer import Producer

#: bytes asked of the stream per read: large enough to amortise the executor hop
READ_CHUNK_BYTES = 1 << 20


def is_terminal(stream: BinaryIO) -> bool:
    try:
        return stream.isatty()
    except (ValueError, AttributeError):
        return False


def remaining_bytes(stream: BinaryIO) -> int | None:
    """Bytes left in ``stream`` when it is a regular file (the bar's total), else None."""
    try:
        fd = stream.fileno()
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            return None
        return max(0, info.st_size - os.lseek(fd, 0, os.SEEK_CUR))
    except (OSError, ValueError, AttributeError):
        return None


async def produce_lines(
    producer: Producer,
    topic: str,
    stream: BinaryIO,
    *,
    key_sep: bytes | None,
    partition: int | None,
    progress: Progress,
) -> int:
    """Send every line of ``stream`` (without its line ending); return how many.

    With ``key_sep`` a line is split at its first separator into key and value
    (a line without one has no key). Waits until every record is acknowledged.
    """
    loop = asyncio.get_running_loop()
    # BinaryIO does not promise read1; stdin's buffer and BytesIO have it
    read_chunk: Callable[[int], bytes] = getattr(stream, "read1", stream.read)
    pending: list[Awaitable[Any]] = []
    sent = 0
    tail = b""
    while True:
        chunk = await loop.run_in_executor(None, read_chunk, READ_CHUNK_BYTES)
        if chunk:
            lines = (tail + chunk).split(b"\n")
            tail = lines.pop()  # an incomplete last line waits for the next chunk
        else:
            lines = [tail] if tail else []
            tail = b""
        values = [line.removesuffix(b"\r") for line in lines]
        if values:
            if key_sep is None:
                pending += await producer.send_many(topic, values, partition=partition)
            else:
                for line in values:
                    key, sep, value = line.partition(key_sep)
                    pending.append(
                        await producer.send(
                            topic,
                            value if sep else line,
                            key=key if sep else None,
                            partition=partition,
                        )
                    )
            sent += len(values)
        progress.advance(len(chunk), records=sent)
        if not chunk:
            break
    await producer.flush()
    for receipt in pending:
        await receipt
    return sent
