"""``python -m bench.kafka_convert``: what one log read through two protocols costs.

A Kafka fetch that reaches a batch our producers wrote gets it converted to Kafka's
record format (``headrace.kafka.convert``, column by column with numpy); our
readers decode a Kafka producer's batch record by record
(``headrace.records.kafka_records``). Per batch shape (records per batch, with
keys, with headers), this measures in one process:

- ``to_kafka``: our batch -> Kafka's, the broker's cost per converted batch;
- ``aiokafka_build``: aiokafka's own builder (C extension) encoding the same
  records as a Kafka batch, the peer's cost for the same bytes;
- ``ours_decode`` and ``kafka_decode``: our ``DecodedBatch`` over our batch and
  over a Kafka batch, and ``aiokafka_read``: aiokafka's reader over the Kafka batch.

Each figure is the median of ``--repeat`` timings of ``--loops`` calls, in
microseconds per batch and million records per second. Writes
``bench/results/kafka_convert.json`` and ``kafka_convert.png``.

    .venv/bin/python -m bench.kafka_convert [--repeat 5] [--loops 200]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from aiokafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder

from headrace.kafka.convert import to_kafka
from headrace.records import batch as rb
from headrace.testing import procs

RESULTS = Path(__file__).resolve().parent / "results"
SHAPES = [
    (1, False, False),
    (16, True, False),
    (256, True, False),
    (256, True, True),
    (4096, True, False),
]
VALUE = b"x" * 100


def timed(call: Callable[[], object], loops: int, repeat: int) -> float:
    """Median seconds per call."""
    runs = []
    for _ in range(repeat):
        start = time.perf_counter()
        for _ in range(loops):
            call()
        runs.append((time.perf_counter() - start) / loops)
    return statistics.median(runs)


def shape(n: int, keys: bool, headers: bool, loops: int, repeat: int) -> dict[str, Any]:
    key_list = [b"key-%d" % i for i in range(n)] if keys else None
    header_list = [(("trace", b"t%d" % i),) for i in range(n)] if headers else None
    ours = bytearray(
        rb.encode([VALUE] * n, keys=key_list, headers=header_list, timestamp_ms=1_700_000_000_000)
    )
    rb.stamp(ours, 0, 1)
    stored = bytes(ours)

    def build() -> bytes:
        builder = DefaultRecordBatchBuilder(2, 0, False, -1, -1, -1, 1 << 26)
        for i in range(n):
            builder.append(
                i,
                timestamp=1_700_000_000_000,
                key=key_list[i] if key_list else None,
                value=VALUE,
                headers=list(header_list[i]) if header_list else [],
            )
        return bytes(builder.build())

    kafka_wire = build()
    kafka_stored = rb.stamp_prefix(rb.validate_kafka(kafka_wire), 0, 1) + kafka_wire[16:]
    calls: dict[str, Callable[[], object]] = {
        "to_kafka": lambda: to_kafka(stored),
        "aiokafka_build": build,
        "ours_decode": lambda: rb.DecodedBatch(stored).values,
        "kafka_decode": lambda: rb.DecodedBatch(kafka_stored).values,
        "aiokafka_read": lambda: [r.value for r in DefaultRecordBatch(kafka_wire)],
    }
    scaled = max(1, loops * 16 // max(n, 16))
    figures = {}
    for name, call in calls.items():
        seconds = timed(call, scaled, repeat)
        figures[name] = {
            "us_per_batch": round(seconds * 1e6, 2),
            "m_records_per_s": round(n / seconds / 1e6, 3),
        }
    return {"records": n, "keys": keys, "headers": headers, "figures": figures}


def plot(doc: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [
        f"{s['records']}{' k' if s['keys'] else ''}{' h' if s['headers'] else ''}"
        for s in doc["shapes"]
    ]
    names = list(doc["shapes"][0]["figures"])
    fig, ax = plt.subplots(figsize=(9, 4.5))
    width = 0.8 / len(names)
    for k, name in enumerate(names):
        ax.bar(
            [i + k * width for i in range(len(labels))],
            [s["figures"][name]["m_records_per_s"] for s in doc["shapes"]],
            width,
            label=name,
        )
    ax.set_xticks([i + 0.4 - width / 2 for i in range(len(labels))], labels)
    ax.set_xlabel("records per batch (k: keys, h: headers), 100-byte values")
    ax.set_ylabel("million records / s (one core)")
    ax.set_yscale("log")
    ax.set_title("Kafka <-> headrace batch conversion")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--loops", type=int, default=200)
    args = parser.parse_args()
    doc = {
        "scenario": "kafka_convert",
        "busy_cores_before": round(procs.machine_busy_cores(), 2),
        "shapes": [shape(n, k, h, args.loops, args.repeat) for n, k, h in SHAPES],
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "kafka_convert.json").write_text(json.dumps(doc, indent=2) + "\n")
    plot(doc, RESULTS / "kafka_convert.png")
    print(json.dumps(doc, indent=2))


if __name__ == "__main__":
    main()
