"""A Topic created from a snapshot: held while its restore is written, then placed at
incarnation 1 so that its brokers open every partition from the restore's sealed state."""

from __future__ import annotations

from typing import Any

import pytest
from test_control_reconcile import Controller

from headrace.control import documents
from headrace.control.model import RestoreStage, TopicSpec
from headrace.errors import InvalidTopicSpec

T = "default/orders-restored"


def topic(annotations: dict[str, str] | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": "orders-restored", "namespace": "default", "uid": "u-1"}
    if annotations is not None:
        meta["annotations"] = annotations
    return {
        "apiVersion": documents.API_VERSION,
        "kind": "Topic",
        "metadata": meta,
        "spec": {"clusterRef": {"name": "c"}, "partitions": 2},
    }


@pytest.mark.parametrize(
    ("annotations", "stage"),
    [
        (None, RestoreStage.NONE),
        ({"other": "x"}, RestoreStage.NONE),
        ({documents.RESTORE_ANNOTATION: "pending"}, RestoreStage.PENDING),
        ({documents.RESTORE_ANNOTATION: "written"}, RestoreStage.WRITTEN),
    ],
)
def test_the_restore_annotation_is_read_into_the_spec(
    annotations: dict[str, str] | None, stage: RestoreStage
) -> None:
    assert documents.spec_of(topic(annotations)).restore is stage


def test_an_unknown_restore_stage_is_refused_by_name() -> None:
    with pytest.raises(InvalidTopicSpec, match=r"headrace\.dev/restore is 'done'"):
        documents.spec_of(topic({documents.RESTORE_ANNOTATION: "done"}))


def test_a_pending_restore_is_not_placed_until_written_then_placed_at_incarnation_1() -> None:
    pending = TopicSpec(T, 2, replicas=2, creation_id="u-1", restore=RestoreStage.PENDING)
    c = Controller(specs=[pending])
    d = c.step()
    c.run(2)
    assert T not in c.state.topics
    assert [p.reason for p in d.problems if p.topic == T] == ["WaitingForRestore"]
    c.specs = [TopicSpec(T, 2, replicas=2, creation_id="u-1", restore=RestoreStage.WRITTEN)]
    c.step()
    placed = c.state.topics[T]
    assert placed.creation_id == "u-1"
    assert [(p.moves, p.start_offset) for p in placed.partitions] == [(1, None), (1, None)]


def test_a_plain_topic_starts_at_incarnation_0() -> None:
    c = Controller(specs=[TopicSpec(T, 2, replicas=2)])
    c.step()
    assert [(p.moves, p.start_offset) for p in c.state.topics[T].partitions] == [(0, None)] * 2


NIGHTLY = "c/default/orders/3f1d/snapshots/nightly.json"


def test_a_restored_topic_records_its_snapshot_and_its_topic_restore() -> None:
    spec = {"clusterRef": {"name": "c"}}
    doc = documents.restored_topic(
        "default", "copy", spec, 3, RestoreStage.PENDING, NIGHTLY, "back"
    )
    meta = doc["metadata"]
    assert meta["annotations"][documents.RESTORE_SNAPSHOT_ANNOTATION] == NIGHTLY
    assert meta["labels"] == {documents.TOPIC_RESTORE_LABEL: "back"}
    assert documents.restore_held_for(meta["annotations"]) == NIGHTLY
    # once released it is held for nothing; applied pending by hand, for no snapshot
    written = documents.restored_topic("default", "copy", spec, 3, RestoreStage.WRITTEN, NIGHTLY)
    assert "labels" not in written["metadata"]
    assert documents.restore_held_for(written["metadata"]["annotations"]) is None
    assert documents.restore_held_for({documents.RESTORE_ANNOTATION: "pending"}) is None
