"""The fault campaign, short: 5 rounds of kill -9 on a real local cluster (issue 14 §1).

``make chaos`` runs 100 rounds; this runs the same driver and checker with a
fixed seed whose targets cover a leader, a follower, the controller and an
Unload, so every kind of fault is exercised on each ``make test``.
"""

from __future__ import annotations

from pathlib import Path

from bench.chaos import campaign

#: seed 20 draws leader, follower, controller and unload targets within 5 rounds (asserted below)
SEED = 20


async def test_five_rounds_of_kill9_lose_duplicate_and_reorder_nothing(tmp_path: Path) -> None:
    settings = campaign.Settings(rounds=5, seed=SEED, restart_delay_s=(0.2, 1.5))
    report = await campaign.Campaign(tmp_path, settings, progress=lambda _: None).run()

    assert {r["target"] for r in report["round_log"]} == set(campaign.TARGETS)
    counts = report["counts"]
    assert counts["acknowledged"] > 0
    assert report["ok"], (campaign.table(report), report["examples"])
    for kind in ("lost", "duplicated", "gaps", "order_violations", "offsets_reused", "undelivered"):
        assert counts[kind] == 0, (kind, report["examples"].get(kind))
    assert report["rounds_not_recovered"] == 0, report["round_log"]
