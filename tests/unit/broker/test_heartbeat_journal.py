"""Heartbeat deltas: the broker's journal of partition reports and the poller's merge.

The journal (``broker.reporting.PartitionReports``) runs against fake
partitions here: it only reads a partition's key and hangs listeners on it,
and the report is whatever ``build`` makes of it. The controller's side is
``Heartbeat.merged_into``, fed through the JSON as it would be over HTTP.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any, cast

from headrace.broker.reporting import PartitionReports
from headrace.broker.topics import Partition
from headrace.protocol.coordination import Heartbeat, PartitionReport, parse_since
from headrace.protocol.endpoints import BrokerEndpoint


@dataclass(eq=False)
class FakePartition:
    topic: Any
    index: int
    high_watermark: int = 0
    cursor: int = 0
    listeners: list[Callable[[Any], None]] = field(default_factory=list)
    append_listeners: list[Callable[[Any], None]] = field(default_factory=list)
    cursor_listeners: list[Callable[[Any], None]] = field(default_factory=list)

    def add_listener(self, f: Callable[[Any], None]) -> None:
        self.listeners.append(f)

    def remove_listener(self, f: Callable[[Any], None]) -> None:
        self.listeners.remove(f)

    def add_append_listener(self, f: Callable[[Any], None]) -> None:
        self.append_listeners.append(f)

    def remove_append_listener(self, f: Callable[[Any], None]) -> None:
        self.append_listeners.remove(f)

    def add_cursor_listener(self, f: Callable[[Any], None]) -> None:
        self.cursor_listeners.append(f)

    def remove_cursor_listener(self, f: Callable[[Any], None]) -> None:
        self.cursor_listeners.remove(f)

    def raise_high_watermark(self, hw: int) -> None:
        self.high_watermark = hw
        for f in list(self.listeners):
            f(self)


class Host:
    """Partitions by key, a fake clock, and the journal over them."""

    def __init__(self, count: int) -> None:
        self.now = 0.0
        self.partitions: dict[tuple[str, int], FakePartition] = {}
        for i in range(count):
            self.add("default/t", i)
        self.journal = PartitionReports(
            lambda p: self.build(cast(FakePartition, p)),
            lambda: [cast(Partition, p) for p in self.partitions.values()],
            lambda t, i: cast(Partition | None, self.partitions.get((t, i))),
            sweep_s=10.0,
            clock=lambda: self.now,
        )

    def add(self, topic: str, index: int) -> FakePartition:
        p = FakePartition(SimpleNamespace(name=topic), index)
        self.partitions[(topic, index)] = p
        return p

    @staticmethod
    def build(p: FakePartition) -> PartitionReport:
        return PartitionReport(
            p.topic.name,
            p.index,
            "leader",
            1,
            p.high_watermark,
            p.high_watermark,
            cursors={"c": p.cursor} if p.cursor else {},
        )

    def poll(self, since: str | None) -> Heartbeat:
        """One answer as the controller receives it: through JSON."""
        reports, removed, journal = self.journal.answer(parse_since(since))
        hb = Heartbeat(
            BrokerEndpoint(0, "h", 1), partitions=reports, journal=journal, removed=removed
        )
        return Heartbeat.from_json(hb.to_json(), received_ms=1)


def since_of(hb: Heartbeat) -> str:
    assert hb.journal is not None
    return f"{hb.journal.instance}:{hb.journal.seq}"


def test_an_idle_broker_answers_an_empty_delta_and_rebuilds_nothing() -> None:
    host = Host(1000)
    full = host.poll(None)
    assert full.journal is not None and full.journal.full
    assert [p.partition for p in full.partitions] == list(range(1000))
    rebuilt = host.journal.rebuilt
    since = since_of(full)
    for _ in range(5):
        delta = host.poll(since)
        assert delta.journal is not None and not delta.journal.full
        assert delta.partitions == () and delta.removed == ()
        since = since_of(delta)
    assert host.journal.rebuilt == rebuilt  # no per-partition work while nothing moves


def test_a_marked_change_is_in_the_next_delta_and_merges_into_the_full_view() -> None:
    host = Host(100)
    full = host.poll(None)
    merged = full.merged_into(None)
    assert merged is not None
    _, held = merged
    host.partitions[("default/t", 42)].raise_high_watermark(7)
    delta = host.poll(since_of(full))
    assert [(p.partition, p.high_watermark) for p in delta.partitions] == [(42, 7)]
    merged = delta.merged_into(held)
    assert merged is not None
    view, _ = merged
    assert len(view.partitions) == 100
    by_index = {p.partition: p for p in view.partitions}
    assert by_index[42].high_watermark == 7 and by_index[41].high_watermark == 0
    assert host.poll(since_of(delta)).partitions == ()


def test_an_unmarked_change_arrives_with_the_next_sweep() -> None:
    host = Host(10)
    since = since_of(host.poll(None))
    host.partitions[("default/t", 3)].cursor = 5  # a change no listener announces
    assert host.poll(since).partitions == ()
    host.now += 10.0
    delta = host.poll(since)
    assert [(p.partition, dict(p.cursors)) for p in delta.partitions] == [(3, {"c": 5})]


def test_a_full_report_is_exact_without_waiting_for_the_sweep() -> None:
    host = Host(10)
    host.poll(None)
    host.partitions[("default/t", 3)].cursor = 5
    full = host.poll(None)
    assert {p.partition: dict(p.cursors) for p in full.partitions}[3] == {"c": 5}


def test_removed_and_added_partitions_reach_the_poller() -> None:
    host = Host(4)
    full = host.poll(None)
    merged = full.merged_into(None)
    assert merged is not None
    held = merged[1]
    gone = host.partitions.pop(("default/t", 1))
    host.journal.mark(cast(Partition, gone))
    host.add("default/u", 0)
    host.journal.mark_all()  # a placement
    delta = host.poll(since_of(full))
    assert delta.removed == (("default/t", 1),)
    assert [(p.topic, p.partition) for p in delta.partitions] == [("default/u", 0)]
    merged = delta.merged_into(held)
    assert merged is not None
    assert sorted((p.topic, p.partition) for p in merged[0].partitions) == [
        ("default/t", 0),
        ("default/t", 2),
        ("default/t", 3),
        ("default/u", 0),
    ]
    assert gone.listeners == [] and gone.append_listeners == []  # no longer watched


def test_another_instance_or_a_future_position_gets_a_full_report() -> None:
    host = Host(3)
    full = host.poll(None)
    assert full.journal is not None
    for since in (f"other:{full.journal.seq}", f"{full.journal.instance}:999", "junk", ""):
        answer = host.poll(since)
        assert answer.journal is not None and answer.journal.full, since
        assert len(answer.partitions) == 3


def test_a_delta_without_the_reports_it_builds_on_does_not_merge() -> None:
    host = Host(3)
    full = host.poll(None)
    host.partitions[("default/t", 0)].raise_high_watermark(1)
    delta = host.poll(since_of(full))
    assert delta.merged_into(None) is None


def test_a_heartbeat_without_a_journal_reads_as_before() -> None:
    hb = Heartbeat(
        BrokerEndpoint(0, "h", 1),
        partitions=(Host.build(FakePartition(SimpleNamespace(name="t"), 0)),),
    )
    doc = hb.to_json()
    assert "journal" not in doc and "removed" not in doc
    back = Heartbeat.from_json(doc, received_ms=0)
    merged = back.merged_into(None)
    assert merged is not None and merged[0].partitions == hb.partitions
