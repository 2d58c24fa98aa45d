"""Turn a results document into the markdown tables, the target verdicts and the plot.

Pure functions over the JSON written by ``bench.run`` except ``update_docs``
and ``plot``, which write files.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bench import docs_block

START_MARKER = "<!-- bench:results:start -->"
END_MARKER = "<!-- bench:results:end -->"


# ---------------------------------------------------------------------------- lookups


def _rows(doc: dict[str, Any], scenario: str) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = doc.get("scenarios", {}).get(scenario, {}).get("rows", [])
    return rows


def _find(rows: list[dict[str, Any]], **match: Any) -> dict[str, Any] | None:
    for row in rows:
        if all(row.get(k) == v for k, v in match.items()):
            return row
    return None


def _rps(row: dict[str, Any] | None) -> float | None:
    return None if row is None else float(row["records_per_s"])


def _fmt_rate(row: dict[str, Any] | None) -> str:
    if row is None:
        return "-"
    text = f"{row['records_per_s'] / 1e3:,.0f}k/s ({row['mb_per_s']:,.0f} MB/s)"
    others = [a["records_per_s"] for a in row.get("other_attempts", []) if "records_per_s" in a]
    if others:
        every = [row["records_per_s"], *others]
        text += f" [{min(every) / 1e3:,.0f}k-{max(every) / 1e3:,.0f}k]"
    return text


def _ratio(a: float | None, b: float | None) -> str:
    if a is None or not b:
        return "-"
    return f"{a / b:.2f}x"


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def _s(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


# ---------------------------------------------------------------------------- targets


def targets(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """The issue's targets with the measured values and a verdict (None = not measured)."""
    produce = _rows(doc, "produce")
    out: list[dict[str, Any]] = []

    hr = _rps(
        _find(
            produce,
            system="headrace",
            client="send_many",
            durability="interval",
            partitions=1,
            value_bytes=100,
        )
    )
    out.append(
        {
            "target": "produce 100 B, fsync interval, 1 partition ≥ 1,000,000 records/s",
            "measured": None if hr is None else f"{hr:,.0f} records/s",
            "met": None if hr is None else hr >= 1_000_000,
        }
    )
    for durability, appendfsync in (("interval", "everysec"), ("always", "always")):
        mine = _rps(
            _find(
                produce,
                system="headrace",
                client="send_many",
                durability=durability,
                partitions=1,
                value_bytes=100,
            )
        )
        theirs = _rps(
            _find(
                produce,
                system="redis",
                client="redis-benchmark",
                durability=durability,
                value_bytes=100,
            )
        )
        ok = None if mine is None or theirs is None else mine >= theirs
        out.append(
            {
                "target": f"produce 100 B ≥ 1.0x Redis pipelined XADD (fsync {durability} vs appendfsync {appendfsync})",
                "measured": None
                if ok is None
                else f"{mine / theirs:.2f}x ({mine:,.0f} vs {theirs:,.0f})",  # type: ignore[operator]
                "met": ok,
            }
        )
    consume = _find(_rows(doc, "consume"), system="headrace", partitions=1)
    crps = _rps(consume)
    records = 0 if consume is None else int(consume["records"])
    full = records >= 10_000_000
    out.append(
        {
            "target": "catch-up consume of 10M records ≥ 2,000,000 records/s",
            "measured": None
            if crps is None
            else f"{crps:,.0f} records/s over {records:,} records"
            + ("" if full else " (fewer than 10M: no verdict)"),
            "met": None if crps is None or not full else crps >= 2_000_000,
        }
    )
    lat = _find(_rows(doc, "latency"), system="headrace", rate=10_000)
    p99 = None if lat is None else lat["latency_ms"]["p99"]
    out.append(
        {
            "target": "p99 produce-to-delivery at 10k records/s ≤ 5 ms",
            "measured": None if lat is None else f"{_ms(p99)} ms",
            "met": None if lat is None else (p99 is not None and p99 <= 5.0),
        }
    )
    rec = [r for r in _rows(doc, "recovery") if r["size_gb"] >= 5.0]
    if rec:
        r = rec[-1]
        worst = max(r["kill_recent_cold"]["ready_s"], r["kill_recent_warm"]["ready_s"])
        out.append(
            {
                "target": "restart to ready, 5 GB log, recent recovery point ≤ 5 s",
                "measured": f"{worst:.2f} s (cold {r['kill_recent_cold']['ready_s']:.2f}, warm {r['kill_recent_warm']['ready_s']:.2f})",
                "met": worst <= 5.0,
            }
        )
    else:
        out.append(
            {
                "target": "restart to ready, 5 GB log, recent recovery point ≤ 5 s",
                "measured": None,
                "met": None,
            }
        )
    tiered = _rows(doc, "tiered")
    up1 = _find(tiered, client="tier_upload", partitions=1)
    up_many = max(
        (r for r in tiered if r.get("client") == "tier_upload" and r["partitions"] > 1),
        key=lambda r: r["partitions"],
        default=None,
    )
    measured = None
    if up1 is not None:
        measured = f"{up1['mb_per_s']:,.0f} MB/s (1 partition)"
        if up_many is not None:
            measured += f"; {up_many['mb_per_s']:,.0f} MB/s ({up_many['partitions']} partitions)"
    out.append(
        {
            "target": "tiered upload to MinIO, 16 MiB objects, 1 partition ≥ 200 MB/s",
            "measured": measured,
            "met": None if up1 is None else up1["mb_per_s"] >= 200,
        }
    )
    read = _find(tiered, client="tier_read")
    out.append(
        {
            "target": "tiered sequential read from MinIO (readahead) ≥ 200 MB/s",
            "measured": None if read is None else f"{read['mb_per_s']:,.0f} MB/s",
            "met": None if read is None else read["mb_per_s"] >= 200,
        }
    )
    return out


# ---------------------------------------------------------------------------- markdown


def _scenario_note(doc: dict[str, Any], name: str) -> str:
    sc = doc.get("scenarios", {}).get(name)
    if not sc:
        return f"_{name}: not measured_"
    load = sc.get("load", {})
    quick = " **(--quick: reduced sizes)**" if sc.get("quick") else ""
    attempts = sc.get("attempts", [])
    repeated = (
        f"; run {len(attempts)} times, each measurement kept from the attempt with the least"
        " interference"
        if len(attempts) > 1
        else ""
    )
    commit = f" with headrace {sc['headrace_commit']}" if sc.get("headrace_commit") else ""
    return (
        f"_run {sc.get('run_utc', '?')}{commit}{quick}; load average at start"
        f" {load.get('loadavg')}, other processes busy before start:"
        f" {load.get('busy_cores_before')} cores, during the run:"
        f" {sc.get('mean_foreign_cores', '?')} cores on average (kept measurements){repeated}_"
    )


def markdown(doc: dict[str, Any]) -> str:
    lines: list[str] = []
    add = lines.append
    add(
        "_Each cell is the kept measurement (the attempt least disturbed by other processes);"
        " [low-high] is the range over all attempts when a scenario was repeated._"
    )
    add("")
    machine = doc.get("machine", {})
    add(
        f"Machine: {machine.get('cpus')} cores ({machine.get('cpu_model')}), "
        f"{machine.get('mem_gb')} GB RAM, Linux {machine.get('kernel')}, Python {machine.get('python')}, "
        f"{machine.get('redis')}. The headrace commit is named per scenario."
    )
    touch = machine.get("page_cache_write")
    if touch:
        add("")
        add(
            f"Page-cache writes into memory the VM handed back to the host cost"
            f" {touch['cold_mb_per_cpu_s']:,.0f} MB per CPU-second, into just-freed memory"
            f" {touch['warm_mb_per_cpu_s']:,.0f} MB per CPU-second (see *The machine*)."
        )
    add("")

    def section(title: str, scenario: str) -> list[dict[str, Any]]:
        """A scenario's heading and note; its rows."""
        add(f"### {title}")
        add("")
        add(_scenario_note(doc, scenario))
        add("")
        return _rows(doc, scenario)

    # targets
    add("### Targets")
    add("")
    add("| target | measured | met |")
    add("|---|---|---|")
    for t in targets(doc):
        verdict = "-" if t["met"] is None else ("yes" if t["met"] else "**no**")
        add(f"| {t['target']} | {t['measured'] or 'not measured'} | {verdict} |")
    add("")

    # produce
    produce = section("1. Produce throughput (acks=leader)", "produce")
    add(
        "| value | durability | headrace 1 partition | headrace 8 partitions "
        "| Redis XADD, redis-benchmark | Redis XADD, redis-py | headrace 1p / redis-benchmark |"
    )
    add("|---|---|---|---|---|---|---|")
    sizes = sorted({r["value_bytes"] for r in produce})
    for durability in ("interval", "always"):
        for size in sizes:
            h1 = _find(
                produce,
                system="headrace",
                client="send_many",
                durability=durability,
                partitions=1,
                value_bytes=size,
            )
            h8 = _find(
                produce,
                system="headrace",
                client="send_many",
                durability=durability,
                partitions=8,
                value_bytes=size,
            )
            rb = _find(
                produce,
                system="redis",
                client="redis-benchmark",
                durability=durability,
                value_bytes=size,
            )
            rp = _find(
                produce, system="redis", client="redis-py", durability=durability, value_bytes=size
            )
            if not any((h1, h8, rb, rp)):
                continue
            label = f"{durability} / {'everysec' if durability == 'interval' else 'always'}"
            add(
                f"| {size} B | {label} | {_fmt_rate(h1)} | {_fmt_rate(h8)} | {_fmt_rate(rb)}"
                f" | {_fmt_rate(rp)} | {_ratio(_rps(h1), _rps(rb))} |"
            )
    per = _find(produce, system="headrace", client="send")
    if per is not None:
        add("")
        batch = _find(
            produce,
            system="headrace",
            client="send_many",
            durability=per["durability"],
            partitions=per["partitions"],
            value_bytes=per["value_bytes"],
        )
        add(
            f"Per-record API (`await producer.send()`, {per['value_bytes']} B, 1 partition, fsync "
            f"{per['durability']}): {_fmt_rate(per)}, client {per['cpu']['client_cores']:.2f} cores"
            f" busy — {_ratio(_rps(per), _rps(batch))} of `send_many`. "
            f"Redis via redis-py (also per-record Python work): {_fmt_rate(_find(produce, client='redis-py', durability='interval', value_bytes=100))}."
        )
    add("")

    # consume
    consume = section("2. Catch-up consume (100 B records, from the earliest offset)", "consume")
    add("| system | partitions / streams | records | records/s | MB/s | vs Redis |")
    add("|---|---|---|---|---|---|")
    redis_c = _find(consume, system="redis")
    for row in consume:
        who = (
            "headrace (`batches()` + `values()` + `ack_batch`)"
            if row["system"] == "headrace"
            else f"Redis ({row.get('client')})"
        )
        timed = " (time limit hit)" if row.get("timed_out") else ""
        add(
            f"| {who} | {row['partitions']} | {row['records']:,}{timed} | {row['records_per_s']:,.0f}"
            f" | {row['mb_per_s']:,.0f} | {_ratio(_rps(row), _rps(redis_c)) if row['system'] == 'headrace' else '1.00x'} |"
        )
    add("")

    # latency
    lat = section(
        "3. Produce-to-delivery latency (open loop, 100 B, fsync interval / appendfsync everysec)",
        "latency",
    )
    add(
        "| rate | system | p50 ms | p99 ms | p99.9 ms | max ms | missing | sender lag max ms"
        " | other processes, cores | p99 headrace / Redis |"
    )
    add("|---|---|---|---|---|---|---|---|---|---|")
    for rate in sorted({r["rate"] for r in lat}):
        red = _find(lat, system="redis", rate=rate)
        for system in ("headrace", "redis"):
            found = _find(lat, system=system, rate=rate)
            if found is None:
                continue
            row = found
            q = row["latency_ms"]
            ratio = "-"
            if system == "headrace" and red is not None and q["p99"] and red["latency_ms"]["p99"]:
                ratio = f"{q['p99'] / red['latency_ms']['p99']:.3g}x"
            add(
                f"| {rate:,}/s | {system} | {_ms(q['p50'])} | {_ms(q['p99'])} | {_ms(q['p99_9'])}"
                f" | {_ms(q['max'])} | {q['missing']} | {_ms(row.get('max_sender_behind_ms'))}"
                f" | {row['cpu'].get('foreign_cores', 0):.2f} | {ratio} |"
            )
    add("")

    # recovery
    rec = section("4. Restart time vs log size (1 partition, 1 KiB records)", "recovery")
    add(
        "| log size | SIGKILL right after writing: tail to scan → ready s (recovery ms)"
        " | SIGKILL, recent recovery point, cold cache: ready s (recovery ms)"
        " | same, warm cache | SIGTERM: shutdown s | after SIGTERM: ready s (recovery ms) |"
    )
    add("|---|---|---|---|---|---|")

    def cell(case: dict[str, Any]) -> str:
        return f"{case['ready_s']:.2f} ({case['recovery_seconds'] * 1000:,.1f} ms)"

    for row in rec:
        stale = row.get("kill_stale")
        stale_txt = "-" if stale is None else f"{stale['tail_bytes'] / 1e6:,.0f} MB → {cell(stale)}"
        add(
            f"| {row['log_bytes'] / 1e9:.2f} GB | {stale_txt} | {cell(row['kill_recent_cold'])}"
            f" | {cell(row['kill_recent_warm'])} | {row['clean']['shutdown_s']:.2f}"
            f" | {cell(row['clean'])} |"
        )
    add("")
    add(
        "_ready s: process spawn to the first `/readyz` 200 (includes interpreter start-up and"
        " imports; the 0 GB row is that floor). recovery ms: `recovery_seconds` from `/readyz`"
        " (the log recovery alone)._"
    )
    add("")

    # tiered
    tiered = section("5. Tiered storage: PartitionTier against a local MinIO", "tiered")
    add("| what | partitions | data | MB/s | client cores | MinIO cores | other processes, cores |")
    add("|---|---|---|---|---|---|---|")
    labels = {
        "tier_upload": "upload (`PartitionTier.upload`)",
        "tier_read": "sequential read, readahead on",
        "tier_read_no_prefetch": "sequential read, no readahead",
    }
    for row in tiered:
        cpu = row.get("cpu", {})
        data = f"{row['bytes'] / 1e6:,.0f} MB"
        if "objects" in row:
            data += f" in {row['objects']} objects of {row['object_bytes'] / 2**20:,.0f} MiB"
        else:
            data += f", {row.get('read_bytes', 0) / 2**20:,.0f} MiB per read"
        others = [a["mb_per_s"] for a in row.get("other_attempts", []) if "mb_per_s" in a]
        rate = f"{row['mb_per_s']:,.0f}"
        if others:
            rate += (
                f" [{min([row['mb_per_s'], *others]):,.0f}-{max([row['mb_per_s'], *others]):,.0f}]"
            )
        add(
            f"| {labels.get(row['client'], row['client'])} | {row['partitions']} | {data} | {rate}"
            f" | {cpu.get('client_cores', 0):.2f} | {cpu.get('server_cores', 0):.2f}"
            f" | {cpu.get('foreign_cores', 0):.2f} |"
        )
    return "\n".join(lines)


def update_docs(path: Path, table: str) -> bool:
    """Replace the text between the markers in ``path``; False if the markers are missing."""
    return docs_block.replace_between(path, START_MARKER, END_MARKER, table)


# ---------------------------------------------------------------------------- plot


def plot(doc: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(3, 2, figsize=(14, 15))
    colors = {
        "headrace": "#1f77b4",
        "headrace 8p": "#6baed6",
        "redis": "#d62728",
        "redis-py": "#f4a6a6",
    }

    # produce: grouped bars per (size, durability)
    ax = axes[0][0]
    produce = _rows(doc, "produce")
    groups: list[str] = []
    series: dict[str, list[float]] = {
        "headrace": [],
        "headrace 8p": [],
        "redis": [],
        "redis-py": [],
    }
    for durability in ("interval", "always"):
        for size in sorted({r["value_bytes"] for r in produce}):
            groups.append(f"{size} B\n{durability}")
            pick = {
                "headrace": _find(
                    produce,
                    system="headrace",
                    client="send_many",
                    durability=durability,
                    partitions=1,
                    value_bytes=size,
                ),
                "headrace 8p": _find(
                    produce,
                    system="headrace",
                    client="send_many",
                    durability=durability,
                    partitions=8,
                    value_bytes=size,
                ),
                "redis": _find(
                    produce,
                    system="redis",
                    client="redis-benchmark",
                    durability=durability,
                    value_bytes=size,
                ),
                "redis-py": _find(
                    produce,
                    system="redis",
                    client="redis-py",
                    durability=durability,
                    value_bytes=size,
                ),
            }
            for key, row in pick.items():
                series[key].append((_rps(row) or 0.0) / 1e6)
    labels = {
        "headrace": "headrace 1 partition (send_many)",
        "headrace 8p": "headrace 8 partitions (send_many)",
        "redis": "Redis XADD (redis-benchmark)",
        "redis-py": "Redis XADD (redis-py pipeline)",
    }
    width = 0.2
    for i, (key, values) in enumerate(series.items()):
        xs = [g + (i - 1.5) * width for g in range(len(groups))]
        bars = ax.bar(xs, values, width, label=labels[key], color=colors[key])
        ax.bar_label(bars, labels=[f"{v:.2f}" if v else "" for v in values], fontsize=6)
    ax.set_xticks(range(len(groups)), groups)
    ax.set_ylabel("million records/s")
    ax.set_title("Produce throughput (acks=leader; interval=everysec, always=always)")
    ax.legend(fontsize=8)

    # consume
    ax = axes[0][1]
    consume = _rows(doc, "consume")
    names = [
        f"{r['system']}\n{r['partitions']} {'partition' if r['system'] == 'headrace' else 'stream'}"
        + ("s" if r["partitions"] > 1 else "")
        for r in consume
    ]
    bars = ax.bar(
        names,
        [r["records_per_s"] / 1e6 for r in consume],
        color=[colors["headrace" if r["system"] == "headrace" else "redis"] for r in consume],
    )
    ax.bar_label(bars, labels=[f"{r['records_per_s'] / 1e6:.2f}" for r in consume], fontsize=8)
    ax.axhline(2.0, color="gray", linestyle="--", linewidth=1, label="target 2M/s")
    ax.set_ylabel("million records/s")
    ax.set_title("Catch-up consume, 100 B records")
    ax.legend(fontsize=8)

    # latency percentiles
    ax = axes[1][0]
    lat = _rows(doc, "latency")
    rates = sorted({r["rate"] for r in lat})
    pct = ("p50", "p99", "p99_9", "max")
    width = 0.1
    for s_i, system in enumerate(("headrace", "redis")):
        for p_i, p in enumerate(pct):
            values = []
            for rate in rates:
                row = _find(lat, system=system, rate=rate)
                values.append((row["latency_ms"][p] or 0.0) if row else 0.0)
            xs = [g + (s_i * len(pct) + p_i - 3.5) * width for g in range(len(rates))]
            base = colors["headrace" if system == "headrace" else "redis"]
            ax.bar(
                xs,
                values,
                width,
                color=base,
                alpha=0.35 + 0.65 * (p_i + 1) / len(pct),
                label=f"{system} {p}",
            )
    ax.set_xticks(range(len(rates)), [f"{r:,}/s" for r in rates])
    ax.set_yscale("log")
    ax.axhline(5.0, color="gray", linestyle="--", linewidth=1)
    ax.set_ylabel("ms (log scale)")
    ax.set_title("Produce-to-delivery latency (open loop); dashed: 5 ms target")
    ax.legend(fontsize=7, ncol=4, loc="upper center", bbox_to_anchor=(0.5, -0.07))

    # recovery
    ax = axes[1][1]
    rec = _rows(doc, "recovery")
    xs = [r["log_bytes"] / 1e9 for r in rec]
    for key, label, style in (
        ("kill_recent_cold", "SIGKILL, recent recovery point, cold cache", "o-"),
        ("kill_recent_warm", "SIGKILL, recent recovery point, warm cache", "s-"),
        ("clean", "after SIGTERM", "^-"),
    ):
        ax.plot(xs, [r[key]["ready_s"] for r in rec], style, label=label)
    stale = [(r["log_bytes"] / 1e9, r["kill_stale"]["ready_s"]) for r in rec if r.get("kill_stale")]
    if stale:
        ax.plot(
            [s[0] for s in stale], [s[1] for s in stale], "x--", label="SIGKILL right after writing"
        )
    ax.axhline(5.0, color="gray", linestyle="--", linewidth=1)
    ax.set_xlabel("log size (GB)")
    ax.set_ylabel("spawn to /readyz 200 (s)")
    ax.set_title("Restart to ready vs log size; dashed: 5 s target")
    ax.legend(fontsize=8)

    # tiered storage
    ax = axes[2][0]
    tiered = _rows(doc, "tiered")
    names = [
        f"upload\n{r['partitions']} partition{'s' if r['partitions'] > 1 else ''}"
        if r["client"] == "tier_upload"
        else ("read\nreadahead" if r["client"] == "tier_read" else "read\nno readahead")
        for r in tiered
    ]
    bars = ax.bar(names, [r["mb_per_s"] for r in tiered], color=colors["headrace"])
    ax.bar_label(bars, labels=[f"{r['mb_per_s']:,.0f}" for r in tiered], fontsize=8)
    ax.axhline(200.0, color="gray", linestyle="--", linewidth=1, label="target 200 MB/s")
    ax.set_ylabel("MB/s")
    ax.set_title("Tiered storage: PartitionTier against a local MinIO (16 MiB objects)")
    ax.legend(fontsize=8)
    axes[2][1].axis("off")

    when = doc.get("run_utc", "")
    fig.suptitle(f"headrace vs Redis Streams — {doc.get('machine', {}).get('cpus')} cores, {when}")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
