"""The Events of a cluster's decisions (``eventing``): one per object and kind per step,
and an identical one posted again counted on the stored Event, as client-go's
``EventCorrelator`` does, not one Event per partition."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import kopf
import pytest
from kopf._core.engines import posting
from operator_fakes import CLUSTER, FakeApi, topic

from headrace.control.reconcile import Event
from headrace.operator import handlers
from headrace.operator.eventing import Correlator, Note, Target, aggregate
from headrace.operator.running import ClusterPorts, ClusterRuntime, DesiredObjects
from headrace.protocol.endpoints import BrokerEndpoint
from tests.unit.controller.controller_fakes import ManualClock, ScriptedFleet

PARTITIONS = 12


@pytest.fixture
async def kopf_events() -> AsyncIterator[asyncio.Queue[Any]]:
    """kopf's own Event queue (what ``kopf.event`` posts through), caught here."""
    queue: asyncio.Queue[Any] = asyncio.Queue()
    token = posting.event_queue_var.set(queue)
    settings_token = posting.settings_var.set(kopf.OperatorSettings())
    loop_token = posting.event_queue_loop_var.set(asyncio.get_running_loop())
    yield queue
    posting.event_queue_var.reset(token)
    posting.settings_var.reset(settings_token)
    posting.event_queue_loop_var.reset(loop_token)


def events_written(api: FakeApi, queue: asyncio.Queue[Any]) -> list[tuple[str, str]]:
    """(reason, message) of every Event written: applied by the operator or queued in kopf."""
    applied = [(m["reason"], m["message"]) for m in api.applied if m.get("kind") == "Event"]
    queued = []
    while not queue.empty():
        event = queue.get_nowait()
        queued.append((event.reason, event.message))
    return applied + queued


async def test_a_transition_on_many_partitions_writes_one_event_per_kind(
    kopf_events: asyncio.Queue[Any],
) -> None:
    api = FakeApi(CLUSTER, topic(partitions=PARTITIONS))
    clock = ManualClock()
    fleet = ScriptedFleet(
        tuple(BrokerEndpoint(i, f"10.0.0.{i}", 9092, 9644) for i in range(3)), clock
    )
    context = handlers.OperatorContext(api=api, clock=clock)
    key = ("ns", "demo")
    topics = {key: [api.body("Topic", "orders")]}
    clusters = {key: [api.body("BrokerCluster", "demo")]}
    runtime = ClusterRuntime(
        DesiredObjects(api.body("BrokerCluster", "demo"), topics[key]),
        ClusterPorts(
            api, clock, fleet=fleet, events=handlers.event_sink(context, key, topics, clusters)
        ),
    )

    async def steps(count: int) -> None:
        for _ in range(count):
            runtime.sync(api.body("BrokerCluster", "demo"), [api.body("Topic", "orders")])
            await runtime.step()
            clock.advance(1000)

    await steps(6)
    events_written(api, kopf_events)
    led = [p for p in runtime.loop.state.topics["ns/orders"].partitions if p.leader == 0]
    assert len(led) >= 3
    fleet.down.add(0)  # broker 0 dies: every partition it led fails over
    await steps(12)
    written = events_written(api, kopf_events)
    reasons = [reason for reason, _ in written]
    assert len(written) == len(set(reasons)), f"more than one Event per kind: {reasons}"
    assert any(str(len(led)) in message for _, message in written), written


def test_aggregate_counts_the_partitions_and_names_the_first() -> None:
    orders = Target("headrace.dev/v1alpha1", "Topic", "ns", "orders", "u1")
    events = [Event("LeaderLost", f"ns/orders/{i}", f"leader 0 lost, epoch {i}") for i in range(8)]
    events.append(Event("BrokerRegistered", "broker/3", "10.0.0.3:9092"))
    cluster = Target("headrace.dev/v1alpha1", "BrokerCluster", "ns", "demo", "u2")

    def target_of(event: Event) -> Target:
        return orders if event.subject.startswith("ns/orders") else cluster

    notes = aggregate(events, target_of)
    assert [(n.target.name, n.reason, n.decisions) for n in notes] == [
        ("orders", "LeaderLost", 8),
        ("demo", "BrokerRegistered", 1),
    ]
    assert notes[0].message == (
        "8 partitions (ns/orders/0, ns/orders/1, ns/orders/2, ns/orders/3, ns/orders/4 and 3"
        " more); ns/orders/0: leader 0 lost, epoch 0"
    )
    assert notes[1].message == "broker/3: 10.0.0.3:9092"


def test_an_identical_event_is_counted_again_within_the_window() -> None:
    target = Target("v1", "Topic", "ns", "orders", "u1")
    note = Note(target, "Normal", "LeaderElected", "ns/orders/0: leader 1")
    correlator = Correlator(window_ms=60_000)
    first = correlator.record(note, 1_000)
    again = correlator.record(note, 30_000)
    assert (again.name, again.count, again.first_ms, again.last_ms) == (
        first.name,
        2,
        1_000,
        30_000,
    )
    assert again.manifest()["count"] == 2
    later = correlator.record(note, 200_000)  # past the window: a new Event
    assert later.name != first.name and later.count == 1
    other = correlator.record(Note(target, "Normal", "LeaderElected", "ns/orders/1"), 200_000)
    assert other.name != later.name


async def test_an_event_goes_on_the_topic_even_when_it_leaves_the_index_before_the_flush() -> None:
    """Found in CI: a step that lets a deleted Topic go reports TopicDataRetained, removes
    the finalizer, and kopf drops the Topic from its index before the step's end; looked
    up at the flush, the Event went on the BrokerCluster instead of the Topic."""
    api = FakeApi(CLUSTER, topic())
    key = ("ns", "demo")
    topics: dict[Any, list[Any]] = {key: [api.body("Topic", "orders")]}
    clusters = {key: [api.body("BrokerCluster", "demo")]}
    context = handlers.OperatorContext(api=api, clock=ManualClock())
    sink = handlers.event_sink(context, key, topics, clusters)
    sink(Event("TopicDataRetained", "ns/orders", "moved aside"))
    topics[key] = []  # the Topic is gone from kopf's index
    await sink.flush()
    (written,) = [m for m in api.applied if m.get("kind") == "Event"]
    assert written["involvedObject"]["kind"] == "Topic"
    assert written["involvedObject"]["name"] == "orders"
