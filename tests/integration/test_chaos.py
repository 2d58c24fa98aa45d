"""The fault campaign, short: 6 rounds of kill -9 and SIGSTOP on a real local cluster
.

``make chaos`` runs 100 rounds; this runs the same driver and checker with a
fixed seed whose targets cover a leader, a paused leader, a follower, the
controller, an Unload and a repartition's cutover, so every kind of fault is
exercised on each ``make test``.
"""

from __future__ import annotations

from pathlib import Path

from bench.chaos import campaign

#: seed 2 draws leader, pause, follower, unload, cutover (3 -> 4 partitions) and controller
#: within 6 rounds (asserted below)
SEED = 2


async def test_six_rounds_of_faults_lose_duplicate_and_reorder_nothing(tmp_path: Path) -> None:
    settings = campaign.Settings(
        rounds=6, seed=SEED, restart_delay_s=(0.2, 1.5), targets=campaign.CLASSIC_TARGETS
    )
    report = await campaign.Campaign(tmp_path, settings, progress=lambda _: None).run()

    assert {r["target"] for r in report["round_log"]} == set(campaign.CLASSIC_TARGETS)
    counts = report["counts"]
    assert counts["acknowledged"] > 0
    for kind in ("lost", "duplicated", "gaps", "order_violations", "offsets_reused", "undelivered"):
        assert counts[kind] == 0, (kind, report["examples"].get(kind))
    assert counts["key_order_violations"] == 0, report["examples"].get("key_order_violations")
    assert counts["corrupt"] == 0, report["examples"].get("corrupt")
    # a cohort created afterwards reads every acknowledged record, each key in order across
    # the topic's history (the cutover round's grow)
    assert report["fresh_cohort"]["undelivered"] == 0, report["fresh_cohort"]
    assert report["fresh_cohort"]["key_order"] == 0, report["fresh_cohort"]
    assert report["rounds_not_recovered"] == 0, report["round_log"]
    cutover = next(r for r in report["round_log"] if r["target"] == "cutover")
    assert (cutover["partitions_before"], cutover["partitions_after"]) == (3, 4), cutover
    assert cutover["finalize_s"] is not None and not cutover["note"], cutover
    assert report["partitions_at_end"] == 4
