"""The object-store fault campaign, short: 4 rounds on a real local cluster tiering to a
real MinIO behind the fault proxy.

``make chaos-objectstore`` runs 20 rounds with hangs longer than the brokers' read timeout
as well; this runs the same driver and checkers with a fixed seed that draws each of the
other faults once: throttling (503 SlowDown), reset connections and lost answers, a policy
refusing deletes (with the orphan sweep run meanwhile), and MinIO killed with SIGKILL.
"""

from __future__ import annotations

from pathlib import Path

from bench.chaos import campaign
from bench.chaos.objectstore import ObjectStoreCampaign, StoreFaults
from tests.integration.objectstore import servers

KINDS = ("throttle", "reset", "refuse-deletes", "kill-minio")
#: seed 6 draws throttle, refuse-deletes, reset and kill-minio (asserted below)
SEED = 6


async def test_object_store_faults_lose_no_record_and_corrupt_no_manifest(
    tmp_path: Path,
) -> None:
    servers.minio_binary()  # built before the clock of the cluster starts
    settings = campaign.Settings(rounds=4, seed=SEED, warmup_s=2.0)
    faults = StoreFaults(kinds=KINDS, fault_s=(1.5, 3.0), dead_s=(0.5, 2.0))
    report = await ObjectStoreCampaign(tmp_path, settings, faults, progress=lambda _: None).run()

    store = report["objectstore"]
    assert {r["fault"] for r in store["round_log"]} == set(KINDS), store["round_log"]
    counts = report["counts"]
    assert counts["acknowledged"] > 0
    for kind in ("lost", "duplicated", "gaps", "order_violations", "offsets_reused", "undelivered"):
        assert counts[kind] == 0, (kind, report["examples"].get(kind))
    assert counts["corrupt"] == 0, report["examples"].get("corrupt")
    assert report["fresh_cohort"]["undelivered"] == 0, report["fresh_cohort"]
    # the store's side: every manifest parses, has no gap, and lists only objects that are
    # there; uploads resumed after every fault
    assert store["corrupt_manifests"] == 0, store["partitions"]
    assert store["manifest_gaps"] == 0, store["partitions"]
    assert store["listed_objects"] > 0
    assert store["listed_objects_missing"] == 0, store["partitions"]
    assert store["rounds_not_resumed"] == 0, store["round_log"]
    # the sweep deleted nothing while the policy refused deletes, and the orphans it was
    # refused (a deleted incarnation's remains) once the policy was lifted
    assert store["sweeps_refused"] > 0
    assert store["remains_kept_while_refused"] == store["remains_planted"] > 0, store
    assert store["remains_deleted_after_lift"] == store["remains_planted"], store
    faulted = store["requests_faulted"]
    assert faulted.get("slowdown", 0) > 0 and faulted.get("reset", 0) > 0, faulted
    assert report["ok"], report["examples"]
