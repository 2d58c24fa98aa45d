"""``headrace cohorts``: seek targets and how brokers' answers merge."""

from __future__ import annotations

import click
import pytest

from headrace.cli import cohorts


def test_seek_targets() -> None:
    assert cohorts.parse_seek_target("earliest") == ("earliest", None)
    assert cohorts.parse_seek_target("LATEST") == ("latest", None)
    assert cohorts.parse_seek_target("42") == ("offset", 42)
    assert cohorts.parse_seek_target("@1700000000000") == ("timestamp", 1_700_000_000_000)
    # ISO 8601: without a zone it is UTC.
    assert cohorts.parse_seek_target("2023-11-14T22:13:20") == ("timestamp", 1_700_000_000_000)
    assert cohorts.parse_seek_target("2023-11-14T23:13:20+01:00") == (
        "timestamp",
        1_700_000_000_000,
    )
    with pytest.raises(click.BadParameter, match="expected earliest, latest"):
        cohorts.parse_seek_target("yesterday")
    with pytest.raises(click.BadParameter):
        cohorts.parse_seek_target("-5")


def _partition(index: int, cursor: int | None, hw: int, holder: str | None = None) -> dict:
    return {
        "partition": index,
        "cursor": cursor,
        "log_start_offset": 0,
        "log_end_offset": hw,
        "high_watermark": hw,
        "holder": holder,
        "gate_state": "held" if holder else "free",
        "gate_epoch": 1,
    }


def test_answers_merge_per_partition_from_the_topology_leader() -> None:
    found = cohorts.BrokerAnswers(
        answers={
            0: {
                "broker_id": 0,
                "cohorts": [
                    {
                        "topic": "default/t",
                        "cohort": "c",
                        "members": ["m1"],
                        "generation": 1,
                        # a stale leader still reporting partition 1
                        "partitions": [_partition(0, 5, 20, "m1"), _partition(1, 0, 3)],
                    }
                ],
            },
            1: {
                "broker_id": 1,
                "cohorts": [
                    {
                        "topic": "default/t",
                        "cohort": "c",
                        "members": ["m2"],
                        "generation": 1,
                        "partitions": [_partition(1, 7, 10, "m2")],
                    }
                ],
            },
        },
        leaders={"default/t": [0, 1, 2]},
    )
    (view,) = cohorts.merge_cohorts(found)
    assert view.members == {"m1", "m2"}
    assert view.partitions[1] == (1, _partition(1, 7, 10, "m2"))
    assert view.total_lag() == 15 + 3
    doc = view.to_json()
    assert [p["lag"] for p in doc["partitions"]] == [15, 3]
    assert [p["leader"] for p in doc["partitions"]] == [0, 1]


def test_a_partition_without_a_cursor_has_no_lag() -> None:
    view = cohorts.CohortView("default/t", "c")
    assert view.lag(_partition(0, None, 10)) is None
