"""The fault campaign's repartition target, short: a grow with two brokers killed at once,
a shrink with the controller killed, and a shrink then a grow back, under keyed acks=all
load with a running cohort; then a fresh cohort reads the topic from the earliest offsets.

``make chaos`` draws this target among the others; ``make chaos-repartition`` runs it alone.
"""

from __future__ import annotations

from pathlib import Path

from bench.chaos import campaign

#: seed 6 draws, with the repartition target only: a grow with two brokers killed at once,
#: a shrink with the controller killed, then a shrink and a grow back (asserted below)
REPARTITION_SEED = 6


async def test_repartitions_under_faults_lose_skip_and_reorder_nothing(tmp_path: Path) -> None:
    settings = campaign.Settings(
        rounds=3, seed=REPARTITION_SEED, restart_delay_s=(0.2, 1.5), targets=("repartition",)
    )
    report = await campaign.Campaign(tmp_path, settings, progress=lambda _: None).run()

    kinds = [r["kind"] for r in report["round_log"]]
    assert sorted(kinds) == sorted(campaign.REPARTITION_KINDS), kinds
    counts = report["counts"]
    assert counts["acknowledged"] > 0
    for kind in ("lost", "duplicated", "gaps", "order_violations", "offsets_reused", "undelivered"):
        assert counts[kind] == 0, (kind, report["examples"].get(kind))
    assert counts["key_order_violations"] == 0, report["examples"].get("key_order_violations")
    assert counts["corrupt"] == 0, report["examples"].get("corrupt")
    # a cohort created after them all reads every acknowledged record, each key in order
    # across the topic's history (the shrink and the grow back included)
    assert report["fresh_cohort"]["undelivered"] == 0, report["fresh_cohort"]
    assert report["fresh_cohort"]["key_order"] == 0, report["fresh_cohort"]
    assert report["rounds_not_recovered"] == 0, report["round_log"]
    assert all(not r["note"] for r in report["round_log"]), report["round_log"]
