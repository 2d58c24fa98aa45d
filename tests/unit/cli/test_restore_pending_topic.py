"""Local mode's restore into a Topic still pending: finished when it is held for the same
snapshot, refused naming both snapshots when it is held for another."""

from __future__ import annotations

import click
import pytest

from headrace.cli.snapshots import refuse_unless_held_for
from headrace.control.documents import restored_topic
from headrace.control.model import RestoreStage

NIGHTLY = "local/default/orders/3f1d/snapshots/nightly.json"
HOURLY = "local/default/orders/3f1d/snapshots/hourly.json"
SPEC = {"clusterRef": {"name": "local"}}


def test_a_pending_topic_is_finished_only_by_a_restore_of_its_snapshot() -> None:
    pending = restored_topic("default", "copy", SPEC, 2, RestoreStage.PENDING, NIGHTLY, "back")
    refuse_unless_held_for(pending, NIGHTLY)
    with pytest.raises(click.ClickException) as refused:
        refuse_unless_held_for(pending, HOURLY)
    message = refused.value.format_message()
    assert "topic default/copy" in message
    assert "nightly of default/orders" in message and "hourly of default/orders" in message


def test_a_topic_applied_pending_without_a_snapshot_is_left_to_the_stores_claim() -> None:
    by_hand = restored_topic("default", "copy", SPEC, 2, RestoreStage.PENDING, NIGHTLY)
    del by_hand["metadata"]["annotations"]["headrace.dev/restore-snapshot"]
    refuse_unless_held_for(by_hand, HOURLY)
