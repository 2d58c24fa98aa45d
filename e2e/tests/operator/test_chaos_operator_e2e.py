"""The operator fault campaign, short: three rounds of ``make chaos-operator`` on the test bed.

``make chaos-operator`` runs 30 rounds over every target; this runs the same driver and
checker (``bench.chaos.operator``) with a fixed seed whose three rounds kill -9 the Lease
holder mid-Repartition and mid-Unload, and freeze it (SIGSTOP) past its lease while the
other replica takes over and elects. The checker's verdict must be clean: every
acknowledged record stored once and delivered, each key in order, no (partition, epoch)
with two leaders, every transition finished exactly once, every object Ready or Stalled
with a reason.

Test bed only: the operators and brokers are host processes the campaign signals.
"""

from __future__ import annotations

import sys
from pathlib import Path

from bench.chaos import operator as campaign
from e2e.support import Cluster

#: seed 2 draws kill-repartition, kill-unload and freeze-holder, in that order
SEED = 2
TARGETS = ("kill-repartition", "kill-unload", "freeze-holder")


async def test_three_operator_fault_rounds_lose_nothing_and_split_no_epoch(
    cluster: Cluster, namespace: str, testbed_only: None, tmp_path: Path
) -> None:
    settings = campaign.Settings(rounds=3, seed=SEED, targets=TARGETS, warmup_records=50)
    report = await campaign.OperatorCampaign(
        cluster, namespace, tmp_path, settings, progress=lambda line: print(line, file=sys.stderr)
    ).run()
    print(campaign.table(report), file=sys.stderr)

    assert [r["target"] for r in report["round_log"]] == list(TARGETS)
    counts = report["counts"]
    assert counts["acknowledged"] > 0
    for kind in ("lost", "duplicated", "gaps", "order_violations", "offsets_reused", "undelivered"):
        assert counts[kind] == 0, (kind, report["examples"].get(kind))
    assert counts["key_order_violations"] == 0, report["examples"].get("key_order_violations")
    assert report["fresh_cohort"]["undelivered"] == 0, report["fresh_cohort"]
    control = report["control"]
    assert control["counts"]["epochs_seen"] > 0
    assert control["ok"], control
    assert report["rounds_not_settled"] == 0, report["round_log"]
    kinds = [t["kind"] for t in report["transitions"]]
    assert kinds == ["repartition", "unload"], report["transitions"]
    assert report["ok"]
