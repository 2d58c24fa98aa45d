"""``python -m bench.tier_retention``: the object store's size under retention, over time.

One standalone broker process tiers a one-partition topic to a real MinIO
server. The topic has ``retention_ms`` set (``--retention-s``, default 5 s)
and a small local copy (``local_retention_bytes`` 64 KiB), and a producer
writes at a steady rate (``--rate`` records/s of 100 bytes) for
``--periods`` retention periods (default 12). Every second the bench samples:

- the objects under the partition's prefix (count and bytes, everything the
  bucket holds for it: listed, and removed but in their grace period);
- the segment objects the manifest lists, and its ``retainedFrom``;
- the first offset a fresh consumer gets (the stored start, else the local
  one) and the age of the newest record in the batch there: how far past
  retention the oldest readable data is (retention removes whole objects).

Writes ``bench/results/tier_retention.json`` and ``tier_retention.png``. The
figures to look at: the count and bytes level off after the first period
instead of growing with the log, and the oldest readable age stays within
retention plus about one object's span and one retention round.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from pathlib import Path
from typing import Any

from headrace.client import Producer
from headrace.objectstore.minio_store import MinioStore
from headrace.records import batch as rb
from headrace.testing import procs
from headrace.testing.minio import MinioServer
from headrace.testing.reading import create_topic
from headrace.tiered.layout import partition_prefix
from headrace.tiered.tier import PartitionTier
from tests.integration.objectstore import servers

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results"
TOPIC = "default/retained"
BUCKET = "retention"
VALUE = 100


def sample(broker: procs.BrokerProcess, store: MinioStore, tier: PartitionTier) -> dict[str, Any]:
    prefix = partition_prefix("b", TOPIC, 0)
    infos = list(store.list(prefix))
    manifest = tier.manifest(refresh=True)
    doc = broker.get_json(f"/v1/topics/{TOPIC}")
    part = dict(doc["partition_details"][0])  # type: ignore[index]
    stored = manifest.start_offset
    first = part["log_start_offset"] if stored is None else min(stored, part["log_start_offset"])
    oldest_age_ms = None
    if stored is not None and first == stored:
        seg = manifest.covering(first)
        if seg is not None:
            head = rb.read_header(store.get_range(seg.key, 0, rb.HEADER_SIZE))
            oldest_age_ms = int(time.time() * 1000) - head.max_timestamp
    return {
        "objects": len(infos),
        "object_bytes": sum(i.size for i in infos),
        "segment_objects": sum(1 for i in infos if i.key.endswith(".log")),
        "listed_segments": len(manifest.segments),
        "listed_bytes": sum(s.size for s in manifest.segments),
        "retained_from": manifest.retained_from,
        "first_offset": first,
        "log_end_offset": part["log_end_offset"],
        "oldest_readable_age_ms": oldest_age_ms,
    }


async def measure(workdir: Path, retention_s: float, periods: int, rate: int) -> dict[str, Any]:
    minio = MinioServer(servers.minio_binary(), workdir / "minio")
    minio.start()
    broker = procs.BrokerProcess(
        workdir / "data",
        extra_args=[
            "--object-store",
            f"s3://{minio.endpoint}/{BUCKET}?create_bucket=1",
            "--cluster-id",
            "b",
            "--segment-bytes",
            str(64 * 1024),
            "--retention-check-interval-ms",
            "500",
            "--tier-delete-grace-ms",
            "2000",
        ],
        env={
            "HEADRACE_OBJECT_STORE_ACCESS_KEY": minio.access_key,
            "HEADRACE_OBJECT_STORE_SECRET_KEY": minio.secret_key,
        },
    )
    broker.start()
    store = MinioStore(minio.settings(BUCKET))
    tier = PartitionTier(store, partition_prefix("b", TOPIC, 0))
    samples: list[dict[str, Any]] = []
    try:
        retention_ms = int(retention_s * 1000)
        await create_topic(
            broker.bootstrap,
            TOPIC,
            1,
            {
                "retention_ms": retention_ms,
                "local_retention_bytes": 64 * 1024,
                "upload_interval_ms": 500,
            },
        )
        tick = 0.1
        per_tick = max(1, int(rate * tick))
        produced = 0
        started = time.monotonic()
        next_sample = started
        async with Producer(broker.bootstrap, acks="leader", linger_ms=1) as producer:
            while time.monotonic() < started + periods * retention_s:
                await producer.send_many(
                    TOPIC, [b"v" * VALUE for _ in range(per_tick)], partition=0
                )
                await producer.flush()
                produced += per_tick
                if time.monotonic() >= next_sample:
                    row = await asyncio.to_thread(sample, broker, store, tier)
                    row["t_s"] = round(time.monotonic() - started, 2)
                    samples.append(row)
                    next_sample += 1.0
                await asyncio.sleep(tick)
    finally:
        tier.close()
        store.close()
        broker.stop()
        minio.stop()
    settled = [s for s in samples if s["t_s"] >= 2 * retention_s]
    ages = [s["oldest_readable_age_ms"] for s in settled if s["oldest_readable_age_ms"] is not None]
    return {
        "retention_ms": retention_ms,
        "periods": periods,
        "rate_records_per_s": rate,
        "value_bytes": VALUE,
        "records": produced,
        "settled_from_s": 2 * retention_s,
        "settled_objects_max": max((s["objects"] for s in settled), default=None),
        "settled_object_bytes_max": max((s["object_bytes"] for s in settled), default=None),
        "last_objects": samples[-1]["objects"] if samples else None,
        "oldest_readable_age_ms_max": max(ages, default=None),
        "samples": samples,
    }


def plot(doc: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = doc["samples"]
    t = [r["t_s"] for r in rows]
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.5))
    axes[0].plot(t, [r["objects"] for r in rows], label="objects in the bucket")
    axes[0].plot(t, [r["listed_segments"] for r in rows], label="segments listed")
    axes[0].set_title("object count")
    axes[0].legend()
    axes[1].plot(t, [r["object_bytes"] / 1e6 for r in rows], label="bucket")
    axes[1].plot(t, [r["listed_bytes"] / 1e6 for r in rows], label="listed")
    axes[1].set_title("MB stored")
    axes[1].legend()
    axes[2].plot(t, [r["log_end_offset"] for r in rows], label="log end")
    axes[2].plot(t, [r["first_offset"] for r in rows], label="first offset (earliest)")
    axes[2].set_title("offsets")
    axes[2].legend()
    for ax in axes:
        ax.set_xlabel("s")
    fig.suptitle(
        f"retention.ms={doc['retention_ms']} over {doc['periods']} periods,"
        f" {doc['rate_records_per_s']} records/s of {doc['value_bytes']} B"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.tier_retention", description=__doc__)
    parser.add_argument("--retention-s", type=float, default=5.0)
    parser.add_argument("--periods", type=int, default=12)
    parser.add_argument("--rate", type=int, default=2000, help="records per second")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="headrace-tier-retention-") as tmp:
        doc = asyncio.run(measure(Path(tmp), args.retention_s, args.periods, args.rate))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "tier_retention.json").write_text(json.dumps(doc, indent=2) + "\n")
    plot(doc, args.out / "tier_retention.png")
    summary = {k: v for k, v in doc.items() if k != "samples"}
    print(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
