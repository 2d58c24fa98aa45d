"""``headrace get``'s table: the kinds' printer columns read from the kept documents."""

from __future__ import annotations

import datetime as dt

import click
import pytest

from headrace.cli.local_get import column_value, details, kind_named, table
from headrace.resources.snapshots import TopicRestore, TopicSnapshotSchedule

NOW = dt.datetime(2026, 1, 1, 3, 0, tzinfo=dt.UTC).timestamp()
RESTORE = {
    "apiVersion": "headrace.dev/v1alpha1",
    "kind": "TopicRestore",
    "metadata": {
        "name": "copy",
        "namespace": "default",
        "creationTimestamp": "2026-01-01T02:55:00Z",
    },
    "spec": {"snapshotRef": {"name": "s1"}, "topic": "orders-restored"},
    "status": {
        "phase": "Failed",
        "verification": {"outcome": "Failed", "reportKey": "local/r.json", "reason": "gap at 7"},
        "conditions": [
            {
                "type": "Ready",
                "status": "False",
                "reason": "Failed",
                "message": "the restore failed the Spark verification",
                "lastTransitionTime": "2026-01-01T02:56:00Z",
            }
        ],
    },
}


def test_a_kind_is_named_as_kubectl_names_it() -> None:
    assert kind_named("hrrs") is TopicRestore
    assert kind_named("TopicSnapshotSchedules") is TopicSnapshotSchedule
    with pytest.raises(click.BadParameter, match="topicsnapshots"):
        kind_named("topics")


def test_a_column_picks_its_path_and_the_condition_of_its_type() -> None:
    assert column_value(RESTORE, ".status.verification.outcome") == "Failed"
    assert column_value(RESTORE, '.status.conditions[?(@.type=="Ready")].reason') == "Failed"
    assert column_value(RESTORE, '.status.conditions[?(@.type=="Stalled")].reason') is None
    assert column_value(RESTORE, ".status.completedAt") is None


def test_the_table_has_the_printer_columns_and_the_details_the_verdict() -> None:
    header, row = table(TopicRestore, [RESTORE], NOW)
    assert header.split() == [
        "NAME",
        "SNAPSHOT",
        "TOPIC",
        "PHASE",
        "VERIFIED",
        "READY",
        "REASON",
        "AGE",
    ]
    assert row.split() == [
        "copy",
        "s1",
        "orders-restored",
        "Failed",
        "Failed",
        "False",
        "Failed",
        "5m",
    ]
    assert details(RESTORE) == [
        "condition Ready=False Failed: the restore failed the Spark verification",
        "verification Failed, report local/r.json: gap at 7",
    ]
