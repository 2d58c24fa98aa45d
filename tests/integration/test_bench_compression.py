"""Smoke test of the codec benchmark's code path at a tiny size (no timing asserted)."""

from __future__ import annotations

import json
from pathlib import Path

from bench import compression


def test_json_events_are_deterministic_and_varied() -> None:
    events = compression.json_events(2_000, seed=7)
    assert events == compression.json_events(2_000, seed=7)
    assert events != compression.json_events(2_000, seed=8)
    docs = [json.loads(e) for e in events]
    assert len({d["event_id"] for d in docs}) == len(docs)
    assert {"page_view", "click", "search", "purchase"} <= {d["type"] for d in docs}
    assert all({"ts", "user_id", "path", "user_agent"} <= d.keys() for d in docs)


def test_the_codec_bench_runs_end_to_end_at_a_tiny_size(tmp_path: Path) -> None:
    doc = compression.measure(400, seed=1, work_dir=tmp_path, log=lambda line: None)
    rows = {r["codec"]: r for r in doc["rows"]}
    assert list(rows) == ["none", "zlib", "lz4", "zstd"]
    for codec in ("zlib", "lz4", "zstd"):
        assert rows[codec]["stored_bytes"] < rows["none"]["stored_bytes"]
        assert rows[codec]["ratio"] > 1.5
    assert all(r["records"] == 400 and r["produce_records_per_s"] > 0 for r in rows.values())

    page = tmp_path / "benchmarks.md"
    page.write_text(f"before\n{compression.START_MARKER}\nold\n{compression.END_MARKER}\nafter\n")
    assert compression.update_docs(page, compression.markdown(doc))
    text = page.read_text()
    assert "old" not in text and "| zstd |" in text and text.endswith("after\n")
    compression.plot(doc, tmp_path / "compression.png")
    assert (tmp_path / "compression.png").stat().st_size > 0
