"""``headrace cluster health`` from a controller state document (pure rules)."""

from __future__ import annotations

from typing import Any

from headrace.cli.cluster import health_report, report_lines


def _state(live: list[int], partitions: list[dict[str, Any]], problems: list[Any]) -> dict:
    return {
        "cluster": {
            "generation": 3,
            "brokers": [{"id": i, "host": f"127.0.0.{2 + i}"} for i in range(3)],
            "topics": [{"name": "default/t", "partitions": partitions}],
        },
        "live": live,
        "problems": problems,
    }


def _p(index: int, leader: int | None, replicas: list[int], lrs: list[int], state: str) -> dict:
    return {
        "partition": index,
        "leader": leader,
        "replicas": replicas,
        "liveReplicas": lrs,
        "state": state,
    }


def test_a_full_cluster_is_healthy() -> None:
    report = health_report(_state([0, 1, 2], [_p(0, 0, [0, 1, 2], [0, 1, 2], "Online")], []), "c")
    assert report.healthy and report.reasons() == []
    assert report_lines(report)[0].endswith("yes")


def test_a_dead_broker_an_offline_and_an_under_replicated_partition_are_reported() -> None:
    report = health_report(
        _state(
            [0, 1],
            [
                _p(0, 0, [0, 1, 2], [0, 1], "Online"),
                _p(1, None, [2], [], "Offline"),
                _p(2, 1, [1, 0], [1, 0], "Online"),
            ],
            [{"topic": "default/u", "reason": "TooFewBrokers", "message": "3 replicas, 2 brokers"}],
        ),
        "c",
    )
    assert not report.healthy
    assert report.brokers_down == [2]
    assert report.offline == ["default/t/1"]
    assert report.under_replicated == ["default/t/0"]
    assert report.problems == ["default/u: TooFewBrokers: 3 replicas, 2 brokers"]
    assert report.to_json()["reasons"] == [
        "brokers_down",
        "offline_partitions",
        "under_replicated_partitions",
        "problems",
    ]


def test_a_replica_on_a_down_broker_counts_before_the_live_replica_sets_shrink() -> None:
    # Broker 2 has just missed its heartbeats: the leaders have not yet dropped it from
    # their live replica sets, and broker 2 led partition 1. Neither partition is whole.
    report = health_report(
        _state(
            [0, 1],
            [
                _p(0, 0, [0, 1, 2], [0, 1, 2], "Online"),
                _p(1, 2, [2, 0, 1], [2, 0, 1], "Online"),
                _p(2, 1, [1, 0], [1, 0], "Online"),
            ],
            [],
        ),
        "c",
    )
    assert report.brokers_down == [2]
    assert report.offline == ["default/t/1"]
    assert report.under_replicated == ["default/t/0"]
