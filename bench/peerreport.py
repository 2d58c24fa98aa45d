"""Tables and the plot for ``bench.peerbench``'s results (``bench/results/peers.json``).

Pure formatting, apart from ``publish``: every ratio is headrace's figure over
the peer's, so above 1 means headrace did better (for latency and failover,
where less is better, the ratio is the peer's over headrace's and says so).
"""

from __future__ import annotations

import importlib.metadata
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench import docs_block

START_MARKER = "<!-- bench:peers:start -->"
END_MARKER = "<!-- bench:peers:end -->"


def client_versions() -> dict[str, str]:
    out = {}
    for name in ("confluent-kafka", "aiokafka", "nats-py"):
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = "not installed"
    return out


def _rows(doc: dict[str, Any], scenario: str) -> list[dict[str, Any]]:
    return list(doc.get("scenarios", {}).get(scenario, {}).get("rows", []))


def _find(rows: list[dict[str, Any]], **match: Any) -> dict[str, Any] | None:
    for r in rows:
        if all(r.get(k) == v for k, v in match.items()):
            return r
    return None


def _rate(r: dict[str, Any] | None) -> str:
    return f"{r['records_per_s'] / 1e6:.3f}M" if r else "-"


def _ratio(a: dict[str, Any] | None, b: dict[str, Any] | None, key: str = "records_per_s") -> str:
    if not a or not b or not b.get(key):
        return "-"
    return f"{a[key] / b[key]:.2f}x"


def _cpu(r: dict[str, Any] | None, key: str = "server_cpu_s_per_m") -> str:
    if not r or r.get(key) is None:
        return "-"
    return f"{r[key]:.2f}"


def _busy(*rows: dict[str, Any] | None) -> str:
    values = [r["busy_cores_before"] for r in rows if r and "busy_cores_before" in r]
    return f"{max(values):.2f}" if values else "-"


def _configs(rows: list[dict[str, Any]]) -> list[tuple[str, int, int]]:
    seen: list[tuple[str, int, int]] = []
    for r in rows:
        if r["system"] != "headrace":
            continue
        key = (r["acks"], r["partitions"], r["value_bytes"])
        if key not in seen:
            seen.append(key)
    return seen


def produce_tables(doc: dict[str, Any]) -> list[str]:
    rows = _rows(doc, "produce")
    if not rows:
        return []
    out = [
        "### Produce, batch path (compares servers)",
        "",
        "headrace `send_many` (lists of 10,000 values) against Kafka's Java"
        " `ProducerPerformance`; one standalone server each, fsync every ~1 s on both"
        " (Kafka: `log.flush.interval.ms=1000` and `log.flush.scheduler.interval.ms=1000`),"
        " and Kafka again at its default (page cache only, no fsync); NATS JetStream"
        " (`sync_interval: 1s`) with natscli's `nats bench js pub async` (Go client, 500"
        " in flight; one stream, so one partition only, and always acknowledged once"
        " stored). Server CPU is seconds of the server process per million records.",
        "",
        "| acks | partitions | value | headrace | Kafka (fsync 1 s) | headrace/Kafka"
        " | Kafka (default flush) | headrace/Kafka default | NATS | headrace/NATS"
        " | server CPU s/M: headrace | Kafka | Kafka default | NATS"
        " | Kafka/headrace server CPU | NATS/headrace server CPU | busy cores |",
        "|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|",
    ]
    for acks, parts, size in _configs(rows):
        key = {"acks": acks, "partitions": parts, "value_bytes": size}
        hr = _find(rows, system="headrace", client="send_many", **key)
        kf = _find(rows, system="kafka", client="ProducerPerformance", **key)
        kd = _find(rows, system="kafka-default-flush", client="ProducerPerformance", **key)
        nt = _find(
            rows, system="nats", client="nats bench js pub async", partitions=parts,
            value_bytes=size,
        )  # fmt: skip
        out.append(
            f"| {acks} | {parts} | {size} B | {_rate(hr)} | {_rate(kf)} | {_ratio(hr, kf)}"
            f" | {_rate(kd)} | {_ratio(hr, kd)} | {_rate(nt)} | {_ratio(hr, nt)}"
            f" | {_cpu(hr)} | {_cpu(kf)} | {_cpu(kd)} | {_cpu(nt)}"
            f" | {_ratio(kf, hr, 'server_cpu_s_per_m')} | {_ratio(nt, hr, 'server_cpu_s_per_m')}"
            f" | {_busy(hr, kf, kd, nt)} |"
        )
    out += [
        "",
        "### Produce, per-record Python clients (compares client APIs, each on its own server)",
        "",
        "One call per record, the client batching underneath: headrace"
        " `await producer.send()`, confluent-kafka `produce()` + `poll(0)` (librdkafka, in"
        " C), aiokafka `await send()`, nats-py JetStream `publish_async()` (a JetStream"
        " publish is acknowledged once stored, so its row serves both acks; 8 partitions"
        " are 8 streams). Servers as above (Kafka with fsync every 1 s, NATS"
        " `sync_interval: 1s`). CPU columns: seconds per million records.",
        "",
        "| acks | partitions | value | headrace `send()` | confluent-kafka | aiokafka"
        " | nats-py JetStream | headrace/confluent | headrace/aiokafka | headrace/NATS"
        " | server CPU s/M: headrace | Kafka | NATS | client CPU s/M: headrace"
        " | confluent | aiokafka | nats-py | busy cores |",
        "|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|",
    ]
    for acks, parts, size in _configs(rows):
        key = {"acks": acks, "partitions": parts, "value_bytes": size}
        hr = _find(rows, system="headrace", client="send", **key)
        ck = _find(rows, system="kafka", client="confluent-kafka", **key)
        ak = _find(rows, system="kafka", client="aiokafka", **key)
        nt = _find(
            rows, system="nats", client="nats-py publish_async", partitions=parts,
            value_bytes=size,
        )  # fmt: skip
        out.append(
            f"| {acks} | {parts} | {size} B | {_rate(hr)} | {_rate(ck)} | {_rate(ak)}"
            f" | {_rate(nt)} | {_ratio(hr, ck)} | {_ratio(hr, ak)} | {_ratio(hr, nt)}"
            f" | {_cpu(hr)} | {_cpu(ck)} | {_cpu(nt)}"
            f" | {_cpu(hr, 'client_cpu_s_per_m')} | {_cpu(ck, 'client_cpu_s_per_m')}"
            f" | {_cpu(ak, 'client_cpu_s_per_m')} | {_cpu(nt, 'client_cpu_s_per_m')}"
            f" | {_busy(hr, ck, ak, nt)} |"
        )
    return out


def replicated_table(doc: dict[str, Any]) -> list[str]:
    rows = _rows(doc, "replicated")
    if not rows:
        return []
    single = _rows(doc, "produce")
    out = [
        "### Replicated: 3 brokers, RF=3, acks=all, minInSync 2 (100 B)",
        "",
        "`headrace local up` (three broker processes and the controller) against a"
        " 3-node KRaft Kafka (each node broker and controller), fsync every ~1 s on both;"
        " headrace's topics untiered, as the RF=1 rows' broker and Kafka are."
        " Server CPU is all three servers' seconds per million records.",
        "",
        "| family | partitions | headrace | Kafka | headrace/Kafka | headrace RF=3 / RF=1"
        " | server CPU s/M: headrace | Kafka | busy cores |",
        "|---|--:|--:|--:|--:|--:|--:|--:|--:|",
    ]
    for r in rows:
        if r["system"] != "headrace":
            continue
        peer = _find(
            rows,
            system="kafka",
            family=r["family"],
            partitions=r["partitions"],
        )
        rf1 = _find(
            single,
            system="headrace",
            client=r["client"],
            acks="all",
            partitions=r["partitions"],
            value_bytes=100,
        )
        label = (
            "batch (`send_many` / ProducerPerformance)"
            if r["family"] == "batch"
            else ("per-record (`send()` / confluent-kafka)")
        )
        out.append(
            f"| {label} | {r['partitions']} | {_rate(r)} | {_rate(peer)} | {_ratio(r, peer)}"
            f" | {_ratio(r, rf1).replace('x', '') if rf1 else '-'} | {_cpu(r)} | {_cpu(peer)}"
            f" | {_busy(r, peer)} |"
        )
    return out


def consume_table(doc: dict[str, Any]) -> list[str]:
    rows = _rows(doc, "consume")
    if not rows:
        return []
    hr = _find(rows, system="headrace")
    out = [
        f"### Consume: catch-up of {hr['records'] if hr else 0:,} records of 100 B, one partition",
        "",
        "A new consumer from the earliest offset. ConsumerPerformance's rate is its own"
        " `nMsg.sec`; ours and confluent-kafka's are from start (joining included) to the"
        " last record.",
        "",
        "| system | client | records/s | headrace/this | server CPU s/M | client CPU s/M"
        " | busy cores |",
        "|---|---|--:|--:|--:|--:|--:|",
    ]
    for r in rows:
        out.append(
            f"| {r['system']} | {r['client']} | {_rate(r)} | {_ratio(hr, r)} | {_cpu(r)}"
            f" | {_cpu(r, 'client_cpu_s_per_m')} | {_busy(r)} |"
        )
    return out


def latency_table(doc: dict[str, Any]) -> list[str]:
    rows = _rows(doc, "latency")
    if not rows:
        return []
    out = [
        "### Produce-to-consume latency (one partition, 100 B, acks=1, linger 1 ms)",
        "",
        "One open-loop harness for both (`bench.worker.OpenLoop`: latency from each"
        " record's intended send time, no coordinated omission): headrace's Producer and"
        " Consumer, and confluent-kafka's `produce()` and a consumer thread. Milliseconds;"
        " the ratio is Kafka's p99 over headrace's (above 1: headrace lower).",
        "",
        "| rate/s | headrace p50 | p99 | p99.9 | max | Kafka p50 | p99 | p99.9 | max"
        " | Kafka p99 / headrace p99 | busy cores |",
        "|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|",
    ]
    for r in rows:
        if r["system"] != "headrace":
            continue
        k = _find(rows, system="kafka", rate=r["rate"])
        a = r["latency_ms"]
        b = k["latency_ms"] if k else {}
        ratio = f"{b['p99'] / a['p99']:.2f}x" if k and a.get("p99") and b.get("p99") else "-"
        out.append(
            f"| {r['rate']:,} | {a['p50']} | {a['p99']} | {a['p99_9']} | {a['max']}"
            f" | {b.get('p50', '-')} | {b.get('p99', '-')} | {b.get('p99_9', '-')}"
            f" | {b.get('max', '-')} | {ratio} | {_busy(r, k)} |"
        )
    return out


def failover_table(doc: dict[str, Any]) -> list[str]:
    rows = _rows(doc, "failover")
    if not rows:
        return []
    hr = _find(rows, system="headrace")
    k = _find(rows, system="kafka")
    out = [
        "### Failover: kill -9 of the partition leader under acks=all load",
        "",
        "3 nodes, one partition, RF=3, minInSync 2, one 100 B record in flight at a"
        " time; both at their default timeouts. The figure is the time from the kill to"
        " the first acknowledged produce after it.",
        "",
        "| system | first ack after the kill, s | failed sends | busy cores |",
        "|---|--:|--:|--:|",
    ]
    for r in rows:
        out.append(
            f"| {r['system']} | {r['first_ack_after_kill_s']} | {r['failed_sends']} | {_busy(r)} |"
        )
    if hr and k and hr.get("first_ack_after_kill_s") and k.get("first_ack_after_kill_s"):
        out += [
            "",
            f"Kafka / headrace: {k['first_ack_after_kill_s'] / hr['first_ack_after_kill_s']:.2f}x.",
        ]
    return out


def scale_table(doc: dict[str, Any]) -> list[str]:
    rows = _rows(doc, "scale")
    if not rows:
        return []
    base = rows[0]
    out = [
        "### Idle cost against partition count (headrace only)",
        "",
        "`headrace local up` with 3 brokers, the partitions in topics of at most 4,096,"
        " RF=3, no traffic. *Settled*: the controller ran 10 steps in a row with no"
        " generation bump and no Offline partition. Idle CPU is each broker process's cores over"
        " 10 s. Heartbeat: a full `GET /v1/heartbeat` body, and the delta"
        " (`?since=`) the controller polls every broker for once a second when"
        " nothing changed. Controller step: its process CPU per control-loop step"
        " (polls parsed, reconcile, dashboard) over the idle window. The produce"
        " column is acks=all `send_many` of 100 B to one more 8-partition topic"
        " beside the idle ones.",
        "",
        "| partitions | all led after, s | settled after, s | idle cores per broker | controller cores"
        " | controller step, ms CPU | heartbeat full, bytes | heartbeat per idle poll, bytes"
        " | broker RSS MB | acks=all produce | of the smallest | busy cores |",
        "|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|",
    ]
    for r in rows:
        rate, first = r.get("produce_records_per_s"), base.get("produce_records_per_s")
        share = f"{rate / first:.0%}" if rate and first else "-"
        produced = f"{rate / 1e6:.3f}M" if rate else f"failed: {r.get('produce_error', '?')}"
        out.append(
            f"| {r['partitions']:,} | {r['online_s']} | {r.get('settled_s', '-')}"
            f" | {r['idle_broker_cores_mean']:.3f}"
            f" | {r['idle_controller_cores']:.3f} | {r.get('controller_step_cpu_ms', '-')}"
            f" | {max(r['heartbeat_bytes']):,}"
            f" | {max(r.get('heartbeat_delta_bytes') or r['heartbeat_bytes']):,}"
            f" | {max(x or 0 for x in r['broker_rss_mb']):.0f}"
            f" | {produced} | {share} | {_busy(r)} |"
        )
    return out


def _reason(error: str) -> str:
    """A failure's last non-empty line (a tool's own last words), safe in italics."""
    said = [line.strip() for line in error.splitlines() if line.strip()]
    last = said[-1] if said else error
    return last.replace("\\", "\\\\").replace("_", "\\_").replace("*", "\\*")


def markdown(doc: dict[str, Any]) -> str:
    versions = doc.get("versions", {})
    clients = ", ".join(f"{k} {v}" for k, v in versions.get("clients", {}).items())
    # scenarios may come from different runs (``--only`` keeps the others'): say when
    when = ", ".join(
        f"{name} {scenario.get('run_utc', '?')}"
        for name, scenario in doc.get("scenarios", {}).items()
    )
    lines = [
        f"_Run {doc['run_utc']}{' (quick)' if doc.get('quick') else ''}: Kafka"
        f" {versions.get('kafka')} (KRaft), nats-server {versions.get('nats_server')};"
        f" {clients}. *busy cores* is other processes' CPU just before a measurement"
        " (the largest over the row's systems). Each scenario's time (UTC): "
        f"{when}._",
        "",
    ]
    for part in (
        produce_tables,
        replicated_table,
        consume_table,
        latency_table,
        failover_table,
        scale_table,
    ):
        block = part(doc)
        if block:
            lines += [*block, ""]
    for name, scenario in doc.get("scenarios", {}).items():
        if scenario.get("failed"):
            lines += [f"_The {name} scenario stopped early ({_reason(scenario['failed'])}):"
                      " its tables hold the rows measured before that._", ""]  # fmt: skip
    lines.append("![headrace against Kafka and NATS](../bench/results/peers.png)")
    return "\n".join(lines)


def plot(doc: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in _rows(doc, "produce") if r.get("partitions") == 1]
    if not rows:
        return
    series = [
        ("headrace send_many", "headrace", "send_many", "#4c72b0"),
        ("Kafka ProducerPerformance", "kafka", "ProducerPerformance", "#c44e52"),
        ("NATS nats bench (Go)", "nats", "nats bench js pub async", "#da8bc3"),
        ("headrace send()", "headrace", "send", "#55a868"),
        ("confluent-kafka", "kafka", "confluent-kafka", "#dd8452"),
        ("aiokafka", "kafka", "aiokafka", "#8172b3"),
        ("nats-py JetStream", "nats", "nats-py publish_async", "#937860"),
    ]
    configs = [(a, s) for a, p, s in _configs(rows) if p == 1]
    fig, ax = plt.subplots(figsize=(12, 4.5))
    width = 0.8 / len(series)
    for i, (label, system, client, colour) in enumerate(series):
        values = []
        for acks, size in configs:
            match = {"system": system, "client": client, "partitions": 1, "value_bytes": size}
            if system != "nats":
                match["acks"] = acks
            r = _find(rows, **match)
            # a row not measured (a failed run) is no bar, not a zero
            values.append(r["records_per_s"] / 1e6 if r else float("nan"))
        ax.bar([x + i * width for x in range(len(configs))], values, width, label=label,
               color=colour)  # fmt: skip
    ax.set_xticks([x + 0.4 - width / 2 for x in range(len(configs))])
    ax.set_xticklabels([f"acks={a}, {s} B" for a, s in configs])
    ax.set_ylabel("million records/s")
    ax.set_title("produce, one partition (batch path and per-record Python clients)")
    ax.legend(fontsize=8, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def update_docs(path: Path, text: str) -> bool:
    return docs_block.replace_between(path, START_MARKER, END_MARKER, text)


def publish(doc: dict[str, Any], out: Path, docs: Path | None, log: Callable[[str], None]) -> None:
    name = "peers-quick" if doc.get("quick") else "peers"
    plot(doc, out / f"{name}.png")
    text = markdown(doc)
    if docs is not None and not update_docs(docs, text):
        log(f"{docs} has no {START_MARKER} markers; tables not written")
    log("")
    log(text)
