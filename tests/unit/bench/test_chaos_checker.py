"""The fault campaign's checker (bench/chaos/checking.py): each check can fail."""

from __future__ import annotations

from bench.chaos.checking import (
    Acked,
    Delivery,
    LeaderClaim,
    ObjectHealth,
    Transition,
    check,
    check_control,
)


def stored_of(*values: bytes) -> dict[int, list[tuple[int, bytes]]]:
    return {0: list(enumerate(values))}


def test_a_clean_run_passes_and_counts_redeliveries() -> None:
    stored = stored_of(b"k:0", b"k:1", b"j:0")
    acked = [Acked(v, 0, o) for o, v in stored[0]]
    deliveries = [Delivery("m", 0, o, v) for o, v in stored[0]] + [Delivery("n", 0, 1, b"k:1")]
    verdict = check(acked, stored, deliveries)
    assert verdict["ok"], verdict
    assert verdict["counts"]["redeliveries"] == 1


def test_each_violation_is_found() -> None:
    stored = {0: [(0, b"k:1"), (1, b"k:0"), (2, b"k:1"), (4, b"j:0")]}
    acked = [
        Acked(b"k:1", 0, 0),
        Acked(b"x:0", 0, 0),  # the same offset acknowledged for another value
        Acked(b"lost:0", 0, 9),
    ]
    deliveries = [Delivery("m", 0, 0, b"k:1"), Delivery("m", 0, 1, b"other:0")]
    counts = check(acked, stored, deliveries)["counts"]
    assert counts["gaps"] == 1  # offset 3 missing
    assert counts["order_violations"] == 1  # k:0 at offset 1 after k:1 at offset 0
    assert counts["duplicated"] == 1  # k:1 twice
    assert counts["lost"] == 2  # x:0 (another value at 0) and lost:0
    assert counts["offsets_reused"] == 2  # acked twice at 0, delivered with another value at 1
    assert counts["undelivered"] == 1  # lost:0 was never delivered (x:0 shares 0@0)


def test_a_key_crossing_partitions_at_a_cutover_must_keep_its_order() -> None:
    """Key k moves from partition 0 to partition 1 at a cutover: its new records may be
    delivered only after its old ones (a redelivery of an old one later is fine)."""
    stored = {0: [(0, b"k:0"), (1, b"k:1")], 1: [(0, b"k:2"), (1, b"k:3")]}
    acked = [Acked(v, p, o) for p, records in stored.items() for o, v in records]
    in_order = [
        Delivery("m", 0, 0, b"k:0"),
        Delivery("m", 0, 1, b"k:1"),
        Delivery("n", 1, 0, b"k:2"),
        Delivery("m", 0, 1, b"k:1"),  # redelivered after a crash: allowed
        Delivery("n", 1, 1, b"k:3"),
    ]
    verdict = check(acked, stored, in_order, in_order=in_order)
    assert verdict["ok"], verdict
    assert verdict["counts"]["key_order_violations"] == 0

    early = [in_order[0], in_order[2], in_order[1], in_order[4]]  # k:2 before k:1
    verdict = check(acked, stored, early, in_order=early)
    assert not verdict["ok"]
    assert verdict["counts"]["key_order_violations"] == 1
    assert "seq 1" in verdict["examples"]["key_order_violations"][0]


def test_the_control_planes_checks_each_find_their_violation() -> None:
    claims = [
        LeaderClaim("status", 0, 3, 1),
        LeaderClaim("broker 1", 0, 3, 1),
        LeaderClaim("broker 2", 0, 3, 2),  # a second leader at epoch 3
        LeaderClaim("status", 1, 3, 2),  # another partition: not a split
        LeaderClaim("status", 0, 4, 2),
    ]
    transitions = [
        Transition(0, "repartition", "grow-0", finished=True, times=1),
        Transition(1, "unload", "move-1", finished=False, times=0, detail="phase Sealing"),
        Transition(2, "rollout", "demo-0", finished=True, times=2),
    ]
    objects = [
        ObjectHealth("Topic", "chaos", "True", stalled=False, reason="Ready"),
        ObjectHealth("BrokerCluster", "demo", "False", stalled=True, reason="ScaleDownBlocked"),
        ObjectHealth("Unload", "move-1", "False", stalled=False, reason="Moving"),
        ObjectHealth("Repartition", "grow-0", None, stalled=False, reason=""),
    ]
    verdict = check_control(claims, transitions, objects)
    assert not verdict["ok"]
    counts = verdict["counts"]
    assert counts["epochs_seen"] == 3
    assert counts["split_epochs"] == 1
    assert counts["unfinished_transitions"] == 1
    assert counts["repeated_transitions"] == 1
    assert counts["unhealthy_objects"] == 2
    assert verdict["examples"]["split_epochs"] == [
        "partition 0 epoch 3: broker 1 (seen by status), broker 2 (seen by broker 2)"
    ]


def test_a_clean_control_plane_passes() -> None:
    verdict = check_control(
        [LeaderClaim("status", 0, 1, 0), LeaderClaim("broker 0", 0, 1, 0)],
        [Transition(0, "scale-up", "demo", finished=True, times=1)],
        [ObjectHealth("Topic", "chaos", "True", stalled=False, reason="Ready")],
    )
    assert verdict["ok"], verdict
