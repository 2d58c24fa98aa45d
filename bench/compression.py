"""``python -m bench.compression``: batch codecs on JSON events, through a real broker.

For each codec (none, zlib, lz4, zstd) the bench produces the same generated
JSON events (``json_events``: repeated keys, realistic variety, a fixed seed)
to a fresh one-partition topic of one standalone broker process, then
consumes them back as a cohort member, decoding every value. It reports:

- ``ratio``: value bytes / bytes the broker stores (the batches as fetched,
  which are the batches as produced: the broker never recompresses);
- produce and consume throughput (records/s and uncompressed MB/s), the
  client in this process and the broker in its own;
- ``encode_mb_s`` / ``decode_mb_s``: the codec alone, ``records.batch.encode``
  and ``decode`` of the same batches in this process, no broker, one core.

Writes ``bench/results/compression.json`` and ``compression.png`` and rewrites the
table in ``docs/benchmarks.md`` between the ``bench:compression`` markers.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import tempfile
import time
from pathlib import Path
from typing import Any

from bench import docs_block
from headrace.testing import procs

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results"
DOCS = REPO / "docs" / "benchmarks.md"
CODECS = ("none", "zlib", "lz4", "zstd")
START_MARKER = "<!-- bench:compression:start -->"
END_MARKER = "<!-- bench:compression:end -->"

# --------------------------------------------------------------------------- the payload

_EVENT_TYPES = (
    ("page_view", 50),
    ("click", 20),
    ("search", 10),
    ("add_to_cart", 8),
    ("purchase", 4),
    ("login", 4),
    ("logout", 2),
    ("error", 2),
)
_PATHS = ("/", "/search", "/products/{id}", "/cart", "/checkout", "/account", "/help/{id}")
_AGENTS = (
    "Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 (KHTML, like Gecko) "
    "Chrome/124.0.0.0 Safari/537.36",
    "Mozilla/5.0 (Macintosh; Intel Mac OS X 14_4) AppleWebKit/605.1.15 (KHTML, like Gecko) "
    "Version/17.4 Safari/605.1.15",
    "Mozilla/5.0 (iPhone; CPU iPhone OS 17_4 like Mac OS X) AppleWebKit/605.1.15 "
    "(KHTML, like Gecko) Mobile/15E148",
    "Mozilla/5.0 (X11; Linux x86_64; rv:125.0) Gecko/20100101 Firefox/125.0",
    "okhttp/4.12.0",
)
_COUNTRIES = ("US", "DE", "GB", "FR", "IN", "BR", "JP", "CA", "NL", "SE", "PL", "ES")
_REFERRERS = ("", "https://www.google.com/", "https://news.ycombinator.com/", "https://t.co/x")
_QUERIES = ("red shoes", "usb-c cable", "laptop stand", "coffee", "headphones", "desk lamp")
_ERRORS = ("timeout", "payment_declined", "not_found", "rate_limited")


def json_events(count: int, seed: int = 15) -> list[bytes]:
    """``count`` JSON-encoded web/app events, the same bytes for the same seed.

    Every event has the same dozen keys, then fields that depend on its type:
    what an analytics pipeline produces, and what codecs are usually judged on.
    Values vary the way real ones do: ids and timestamps are unique, users
    repeat with a skewed distribution, strings come from small vocabularies.
    """
    rng = random.Random(seed)
    kinds = [k for k, _ in _EVENT_TYPES]
    weights = [w for _, w in _EVENT_TYPES]
    clock_ms = 1_767_225_600_000  # 2026-01-01T00:00:00Z
    out: list[bytes] = []
    for _ in range(count):
        clock_ms += rng.randint(0, 40)
        kind = rng.choices(kinds, weights)[0]
        user = int(rng.paretovariate(1.2) * 1000) % 250_000
        path = rng.choice(_PATHS).format(id=rng.randint(1, 60_000))
        event: dict[str, Any] = {
            "event_id": f"{rng.getrandbits(128):032x}",
            "type": kind,
            "ts": clock_ms,
            "user_id": f"u{user:07d}",
            "session_id": f"s{(user * 7919 + clock_ms // 1_800_000) % 10**9:09d}",
            "path": path,
            "referrer": rng.choice(_REFERRERS),
            "user_agent": rng.choice(_AGENTS),
            "country": rng.choice(_COUNTRIES),
            "device": rng.choice(("desktop", "mobile", "tablet")),
            "app_version": f"3.{rng.randint(0, 14)}.{rng.randint(0, 9)}",
            "latency_ms": round(rng.lognormvariate(3.5, 0.6), 1),
        }
        if kind == "search":
            event["query"] = rng.choice(_QUERIES)
            event["results"] = rng.randint(0, 480)
        elif kind in ("add_to_cart", "purchase"):
            items = [
                {"sku": f"SKU-{rng.randint(1, 60_000):06d}", "qty": rng.randint(1, 3)}
                for _ in range(rng.randint(1, 4))
            ]
            event["items"] = items
            event["amount"] = round(sum(rng.uniform(3, 120) * i["qty"] for i in items), 2)
            event["currency"] = "EUR" if event["country"] in ("DE", "FR", "NL", "ES") else "USD"
        elif kind == "error":
            event["error"] = {"code": rng.choice(_ERRORS), "retryable": rng.random() < 0.5}
        out.append(json.dumps(event, separators=(",", ":")).encode())
    return out


# --------------------------------------------------------------------------- measuring


def codec_only(values: list[bytes], codec: str, batch_records: int) -> dict[str, float]:
    """Encode and decode ``values`` in batches with ``codec``, no broker: MB/s of values."""
    from headrace.records import batch as rb
    from headrace.records import codecs

    codec_id = codecs.codec_id(codec)
    chunks = [values[i : i + batch_records] for i in range(0, len(values), batch_records)]
    total = sum(map(len, values)) / 1e6
    encode_s = decode_s = float("inf")
    # best of three: on a shared machine the fastest pass is the least disturbed one
    for _ in range(3):
        started = time.perf_counter()
        batches = [rb.encode(c, timestamp_ms=0, compression=codec_id) for c in chunks]
        encoded = time.perf_counter()
        for b in batches:
            rb.decode(b).values  # noqa: B018 -- the decode (inflate and slice) is the measurement
        decoded = time.perf_counter()
        encode_s = min(encode_s, encoded - started)
        decode_s = min(decode_s, decoded - encoded)
    return {
        "encode_mb_s": round(total / encode_s, 1),
        "decode_mb_s": round(total / decode_s, 1),
    }


async def through_broker(
    bootstrap: str, topic: str, values: list[bytes], codec: str
) -> dict[str, Any]:
    """Produce ``values`` with ``codec``, then consume them all back; timings and bytes."""
    from headrace.client import Consumer, Producer

    async with Producer(bootstrap, compression=codec, linger_ms=5) as producer:
        started = time.perf_counter()
        futures = []
        step = 10_000
        for i in range(0, len(values), step):
            futures += await producer.send_many(topic, values[i : i + step], partition=0)
        await producer.flush()
        for f in futures:
            await f
        produce_s = time.perf_counter() - started

    stored = 0
    received = 0
    consumer = await Consumer(
        bootstrap, topic, "bench", member_id="bench-0", start="earliest"
    ).start()
    try:
        started = time.perf_counter()
        while received < len(values):
            batches = await consumer.getmany(timeout_s=10.0)
            if not batches:
                raise RuntimeError(f"consumer stalled at {received} of {len(values)} records")
            for batch in batches:
                stored += len(batch.data)
                received += len(batch.values())  # decompresses and slices every value
                consumer.ack_batch(batch)
        consume_s = time.perf_counter() - started
    finally:
        await consumer.close()
    return {"produce_s": produce_s, "consume_s": consume_s, "stored_bytes": stored}


#: as in bench.run: wait for other processes to leave the cores this idle before a codec
BUSY_FOREIGN_CORES = 0.3


def settle(limit_s: float | None, log: Any) -> dict[str, Any] | None:
    """Wait (up to ``limit_s``) for a quiet machine; the load then (None: not sampled)."""
    if limit_s is None:
        return None
    from bench import scenarios

    deadline = time.monotonic() + limit_s
    while True:
        load = scenarios.load_snapshot()
        if load["busy_cores_before"] <= BUSY_FOREIGN_CORES or time.monotonic() >= deadline:
            return load
        log(f"   machine busy ({load['busy_cores_before']} cores): waiting for it to settle")
        time.sleep(5.0)


def measure(
    records: int,
    seed: int,
    work_dir: Path,
    log: Any = print,
    codecs: tuple[str, ...] = CODECS,
    settle_s: float | None = None,
) -> dict[str, Any]:
    """One broker, one topic per codec; the result document.

    ``settle_s``: before each codec, wait up to this long for other processes to go
    idle and record the load in the row (None: neither).
    """
    from headrace.aio import run

    values = json_events(records, seed)
    value_bytes = sum(map(len, values))
    log(f"{records:,} JSON events, {value_bytes / records:.0f} B each on average (seed {seed})")
    broker = procs.BrokerProcess(work_dir / "data")
    rows: list[dict[str, Any]] = []
    broker.start()
    try:
        for codec in codecs:
            topic = f"compression-{codec}"
            broker.create_topic(topic, 1)
            load = settle(settle_s, log)
            timing = run(through_broker(broker.bootstrap, topic, values, codec))
            row = {
                "codec": codec,
                "records": records,
                "value_bytes": value_bytes,
                "stored_bytes": timing["stored_bytes"],
                "ratio": round(value_bytes / timing["stored_bytes"], 2),
                "produce_records_per_s": round(records / timing["produce_s"]),
                "produce_mb_s": round(value_bytes / 1e6 / timing["produce_s"], 1),
                "consume_records_per_s": round(records / timing["consume_s"]),
                "consume_mb_s": round(value_bytes / 1e6 / timing["consume_s"], 1),
                **codec_only(values, codec, batch_records=1_000),
            }
            if load is not None:
                row["busy_cores_before"] = load["busy_cores_before"]
            log(
                f"  {codec:5} ratio {row['ratio']:5.2f}  produce {row['produce_records_per_s']:>9,}/s"
                f"  consume {row['consume_records_per_s']:>9,}/s"
                f"  encode {row['encode_mb_s']} MB/s  decode {row['decode_mb_s']} MB/s"
            )
            rows.append(row)
    finally:
        broker.kill9()
    return {
        "scenario": "compression",
        "run_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "seed": seed,
        "records": records,
        "mean_value_bytes": round(value_bytes / records, 1),
        "machine": {"load": [round(x, 2) for x in os.getloadavg()]},
        "rows": rows,
    }


# --------------------------------------------------------------------------- publishing


def markdown(doc: dict[str, Any]) -> str:
    sampled = all("busy_cores_before" in r for r in doc["rows"])
    lines = [
        f"_{doc['records']:,} JSON events of {doc['mean_value_bytes']:.0f} B on average"
        f" (seed {doc['seed']}), one partition, acks=leader; run {doc['run_utc']},"
        f" load average {doc['machine']['load'][0]} at the end"
        + ("; *busy* is other processes' busy cores just before each codec" if sampled else "")
        + "._",
        "",
        "| codec | ratio | stored MB | produce records/s | produce MB/s | consume records/s"
        " | consume MB/s | codec encode MB/s | codec decode MB/s |"
        + (" busy |" if sampled else ""),
        "|---|--:|--:|--:|--:|--:|--:|--:|--:|" + ("--:|" if sampled else ""),
    ]
    for r in doc["rows"]:
        lines.append(
            f"| {r['codec']} | {r['ratio']:.2f} | {r['stored_bytes'] / 1e6:.1f}"
            f" | {r['produce_records_per_s']:,} | {r['produce_mb_s']}"
            f" | {r['consume_records_per_s']:,} | {r['consume_mb_s']}"
            f" | {r['encode_mb_s']} | {r['decode_mb_s']} |"
            + (f" {r['busy_cores_before']} |" if sampled else "")
        )
    return "\n".join(lines)


def update_docs(path: Path, table: str) -> bool:
    return docs_block.replace_between(path, START_MARKER, END_MARKER, table)


def plot(doc: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = doc["rows"]
    names = [r["codec"] for r in rows]
    fig, axes = plt.subplots(1, 3, figsize=(12, 3.5))
    panels = (
        ("compression ratio", [r["ratio"] for r in rows]),
        ("produce, records/s", [r["produce_records_per_s"] for r in rows]),
        ("consume, records/s", [r["consume_records_per_s"] for r in rows]),
    )
    for ax, (title, values) in zip(axes, panels, strict=True):
        ax.bar(names, values, color=["#888888", "#4c72b0", "#55a868", "#c44e52"][: len(rows)])
        ax.set_title(title)
    fig.suptitle(f"batch codecs on {doc['records']:,} JSON events")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.compression", description=__doc__)
    parser.add_argument("--records", type=int, default=300_000)
    parser.add_argument("--seed", type=int, default=15)
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--no-docs", action="store_true", help="do not rewrite docs/benchmarks.md")
    parser.add_argument(
        "--settle-s",
        type=float,
        default=120.0,
        help="before each codec, wait up to this long for other processes to go idle",
    )
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="headrace-compression-") as tmp:
        doc = measure(args.records, args.seed, Path(tmp), settle_s=args.settle_s)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "compression.json").write_text(json.dumps(doc, indent=2) + "\n")
    plot(doc, args.out / "compression.png")
    table = markdown(doc)
    if not args.no_docs and not update_docs(DOCS, table):
        print(f"{DOCS} has no {START_MARKER} markers; table not written")
    print(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
