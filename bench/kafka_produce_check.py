"""``python -m bench.kafka_produce_check``: what validating a Kafka produce costs the broker.

Before a Kafka producer's batch is stored, ``batch.validate_kafka`` checks its
header, its CRC-32C and, for an uncompressed batch, the structure of its record
section (``kafka_records.check_structure``, compiled C). One batch of
``--records`` small records (a 6-byte key, a 16-byte value, and with
``--headers`` one header each), built by aiokafka as a client would, is timed
in one process:

- ``validate_kafka``: the whole check the produce path runs;
- ``structure_check``: the record section's walk alone (the C extension);
- ``crc32c``: the checksum alone, for scale;
- ``validate_and_append``: ``validate_kafka`` and the append to a partition log
  (no fsync), most of a produce's broker work besides the network;
- ``python_decode``: our readers' Python decoder over the same section, what the
  check would cost done in Python (it is not: per-record Python on the hot path).

Each figure is the fastest of ``--repeat`` timings of ``--loops`` calls, in CPU
microseconds of this process per batch. Writes ``bench/results/kafka_produce_check.json``.

    .venv/bin/python -m bench.kafka_produce_check [--records 1000] [--repeat 7] [--loops 300]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from aiokafka.record.default_records import DefaultRecordBatchBuilder

from headrace.checksums import crc32c
from headrace.records import batch as rb
from headrace.records import kafka_records
from headrace.storage import bookkeeping as bk
from headrace.storage.log import PartitionLog
from headrace.testing import procs

RESULTS = Path(__file__).resolve().parent / "results"


def timed(call: Callable[[], object], loops: int, repeat: int) -> float:
    """The fastest of ``repeat`` runs, in CPU seconds of this process per call: on a
    machine shared with other work, wall time measures the neighbours as well."""
    runs = []
    for _ in range(repeat):
        start = time.process_time()
        for _ in range(loops):
            call()
        runs.append((time.process_time() - start) / loops)
    return min(runs)


def kafka_batch(records: int, headers: bool) -> bytes:
    builder = DefaultRecordBatchBuilder(2, 0, False, -1, -1, -1, 1 << 26)
    for i in range(records):
        builder.append(
            i,
            timestamp=1_700_000_000_000 + i,
            key=b"k%05d" % i,
            value=b"value-%010d" % i,
            headers=[("trace", b"t%d" % i)] if headers else [],
        )
    return bytes(builder.build())


def measure(records: int, headers: bool, loops: int, repeat: int) -> dict[str, Any]:
    raw = kafka_batch(records, headers)
    header = rb.validate_kafka(raw)
    section = memoryview(raw)[rb.KAFKA_HEADER_SIZE :]
    config = bk.LogConfig(fsync=bk.FsyncPolicy.NONE)
    with tempfile.TemporaryDirectory(prefix="bench-kafka-check-") as tmp:
        log = PartitionLog.open(Path(tmp) / "p", config)
        try:
            calls: dict[str, Callable[[], object]] = {
                "validate_kafka": lambda: rb.validate_kafka(raw),
                "structure_check": lambda: kafka_records.check_structure(section, records),
                "crc32c": lambda: crc32c(section),
                "validate_and_append": lambda: log.append(raw, rb.validate_kafka(raw), 1),
                "python_decode": lambda: kafka_records.decode_records(
                    section, records, header.first_timestamp
                ),
            }
            figures = {
                name: round(timed(call, loops, repeat) * 1e6, 2) for name, call in calls.items()
            }
        finally:
            log.close()
    return {
        "records": records,
        "headers": headers,
        "batch_bytes": len(raw),
        "us_per_batch": figures,
        "structure_check_ns_per_record": round(figures["structure_check"] * 1e3 / records, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=1000)
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--loops", type=int, default=300)
    args = parser.parse_args()
    doc = {
        "scenario": "kafka_produce_check",
        "busy_cores_before": round(procs.machine_busy_cores(), 2),
        "batches": [
            measure(args.records, headers, args.loops, args.repeat) for headers in (False, True)
        ],
    }
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / "kafka_produce_check.json"
    out.write_text(json.dumps(doc, indent=2) + "\n")
    print(json.dumps(doc, indent=2))


if __name__ == "__main__":
    main()
