"""No sequence of spec edits, index changes or operator restarts deletes a topic's data on
a cluster unless that Topic's deletion asked for it.

A cluster's loop (``ClusterRuntime``) is driven as the operator drives it: its desired
Topics are its entry of the Topics index (``handlers.topics_index``, keyed by
``clusterRef``), its statuses live on the objects of a fake API, its brokers are a
scripted fleet that applies what is pushed. Hypothesis then edits specs, moves Topics to
another cluster and back (an API server with an older CRD lets ``clusterRef`` change),
deletes Topics with either policy, removes finalizers by hand, loses Topics from the watch
for a step, stops brokers and restarts the operator, in any order.

What deletes data is a push: a topology that names neither the topic nor, under
``retained``, the topic to keep aside makes every broker that holds it remove its copies
(and the leaders its objects). So the check is on every pushed topology: a topic it
pushed before may go missing from one only if a ``deletionPolicy: Delete`` deletion of
that Topic on this cluster was asked for, or if it was retained and its deletion (either
policy) was asked for (the Retain finalizer then lets it go once every broker moved its
copy aside).
"""

from __future__ import annotations

import asyncio
import copy
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule
from operator_fakes import CLUSTER, FakeApi, topic

from headrace.operator import finalizing, handlers
from headrace.operator.bodies import meta_of, parse_topic
from headrace.operator.kube import ObjectRef
from headrace.operator.running import ClusterPorts, ClusterRuntime, DesiredObjects
from headrace.protocol.endpoints import BrokerEndpoint
from tests.unit.controller.controller_fakes import ManualClock, ScriptedFleet

NAMES = ("a", "b", "c")
names = st.sampled_from(NAMES)
policies = st.sampled_from(["Retain", "Delete"])


def ref(name: str) -> ObjectRef:
    return ObjectRef("headrace.dev/v1alpha1", "Topic", "ns", name)


class Deletions(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.clock = ManualClock()
        self.api = FakeApi(CLUSTER)
        endpoints = tuple(BrokerEndpoint(i, f"10.0.0.{i}", 9092, 9644) for i in range(3))
        self.fleet = ScriptedFleet(endpoints, self.clock)
        self.runtime = self._start()
        #: pushes checked so far
        self.checked = 0
        #: topics some push named (placed or retained): the brokers may hold them
        self.placed: set[str] = set()
        self.aside: set[str] = set()
        #: Topics of this cluster whose deletion was asked for (with Delete / any policy)
        self.delete_asked: set[str] = set()
        self.deletion_asked: set[str] = set()
        #: topics kept aside whose deletion was asked for before a new Topic of that name
        #: was applied: ending their keeping aside stays allowed (the new Topic's own
        #: deletion is not asked for, and its data is checked as placed once pushed)
        self.aside_of_an_asked_deletion: set[str] = set()
        #: names some push placed whose Topic was applied anew since, and that no push has
        #: named as a topic since: that Topic is not placed yet (it may not be while the
        #: old one's copies are being set aside, or while no broker is up)
        self.not_placed_anew: set[str] = set()

    # ------------------------------------------------------------------ the world

    def _topics(self) -> list[dict[str, Any]]:
        return [copy.deepcopy(b) for r, b in self.api.objects.items() if r.kind == "Topic"]

    def _index(self) -> list[dict[str, Any]]:
        """This cluster's entry of the Topics index, as kopf builds it."""
        mine = []
        for body in self._topics():
            entry = handlers.topics_index(namespace="ns", spec=body["spec"], body=body)
            mine += [b for key, b in entry.items() if key == ("ns", "demo")]
        return mine

    def _start(self) -> ClusterRuntime:
        """The operator (re)starts: a new loop from what the API holds now."""
        cluster = self.api.body("BrokerCluster", "demo")
        return ClusterRuntime(
            DesiredObjects(cluster, self._index()),
            ClusterPorts(self.api, self.clock, fleet=self.fleet),
        )

    def _existing(self, name: str) -> dict[str, Any] | None:
        body = self.api.objects.get(ref(name))
        return copy.deepcopy(body) if body is not None else None

    def _edit(self, body: dict[str, Any]) -> None:
        body["metadata"]["generation"] = int(body["metadata"].get("generation", 1)) + 1
        self.api.put(body)

    async def _steps(self, count: int, index: list[dict[str, Any]] | None) -> None:
        for _ in range(count):
            wanted = self._index() if index is None else index
            self.runtime.sync(self.api.body("BrokerCluster", "demo"), wanted)
            await self.runtime.step()
            self.clock.advance(1000)
            # the API server lets a deleted object go with its last finalizer
            for body in self._topics():
                if meta_of(body).deleting and not meta_of(body).finalizers:
                    self.api.objects.pop(ObjectRef.of(body), None)

    def _run(self, count: int, index: list[dict[str, Any]] | None = None) -> None:
        asyncio.run(self._steps(count, index))
        self._check_pushes()

    def _check_pushes(self) -> None:
        for doc in self.fleet.pushed[self.checked :]:
            named = {t["name"] for t in doc["topics"]}
            retained = set(doc.get("retained", []))
            for name in sorted(self.placed | self.aside):
                if name in named or name in retained:
                    continue
                may = name in self.delete_asked or (
                    name in self.aside
                    and (name in self.deletion_asked or name in self.aside_of_an_asked_deletion)
                )
                assert may, (
                    f"generation {doc['generation']} deletes {name}'s data: no deletion of it"
                    " was asked for"
                )
                self.placed.discard(name)
                self.aside.discard(name)
                self.aside_of_an_asked_deletion.discard(name)
            self.placed = (self.placed - retained) | named
            self.not_placed_anew -= named
            self.aside |= retained - named
        self.checked = len(self.fleet.pushed)

    # ------------------------------------------------------------------ what people do

    @rule(name=names, partitions=st.integers(1, 3), policy=policies)
    def apply(self, name: str, partitions: int, policy: str) -> None:
        """kubectl apply: create the Topic on this cluster, or edit its spec."""
        body = self._existing(name)
        if body is None:
            body = topic(name, partitions)
            body["spec"]["deletionPolicy"] = policy
            # the handler gives a new Topic the data finalizer before the loop serves it
            body["metadata"]["finalizers"] = [finalizing.TOPIC_FINALIZER]
            self.api.put(body)
            full = f"ns/{name}"
            if full in self.placed or full in self.aside:
                self.not_placed_anew.add(full)
            if full in self.aside and full in self.deletion_asked:
                self.aside_of_an_asked_deletion.add(full)
            self.delete_asked.discard(full)
            self.deletion_asked.discard(full)
        elif not meta_of(body).deleting:
            body["spec"]["partitions"] = partitions
            body["spec"]["deletionPolicy"] = policy
            self._edit(body)
        self._run(1)

    @rule(name=names, cluster=st.sampled_from(["other", "demo"]), wipe=st.booleans())
    def move(self, name: str, cluster: str, wipe: bool) -> None:
        """kubectl patch of clusterRef (an API server whose CRD lacks the CEL rule)."""
        body = self._existing(name)
        if body is None or meta_of(body).deleting:
            return
        body["spec"]["clusterRef"] = {"name": cluster}
        if wipe and cluster != "demo":
            body.pop("status", None)  # the other cluster's loop rewrote it
        self._edit(body)
        self._run(1)

    @rule(name=names)
    def delete(self, name: str) -> None:
        """kubectl delete topic: the finalizer holds it while the loop lets the data go."""
        body = self._existing(name)
        if body is None or meta_of(body).deleting:
            return
        if body["spec"]["clusterRef"]["name"] == "demo":
            self.deletion_asked.add(f"ns/{name}")
            if finalizing.policy_of(parse_topic(body)).value == "Delete":
                self.delete_asked.add(f"ns/{name}")
        body["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
        self.api.put(body)
        self._run(1)

    @rule(name=names)
    def remove_finalizer_by_hand(self, name: str) -> None:
        body = self._existing(name)
        if body is not None and meta_of(body).deleting:
            self.api.objects.pop(ref(name))
        self._run(1)

    @rule()
    def watch_loses_topics(self) -> None:
        """A step from an index that lacks every Topic (a relist in progress)."""
        self._run(1, index=[])

    @rule(broker=st.integers(0, 2), up=st.booleans())
    def broker(self, broker: int, up: bool) -> None:
        (self.fleet.down.discard if up else self.fleet.down.add)(broker)
        self._run(1)

    @rule()
    def restart(self) -> None:
        self.runtime = self._start()
        self._run(1)

    @rule(steps=st.integers(1, 8))
    def wait(self, steps: int) -> None:
        self._run(steps)

    @invariant()
    def placed_topics_of_this_cluster_stay_placed(self) -> None:
        """A Topic of this cluster that is not being deleted is never out of the state
        once placed (the loop keeps what it placed until a deletion asks otherwise). The
        Topic: a new one of a name placed before is not placed until a push names it."""
        for name in self.placed - self.not_placed_anew:
            body = self._existing(name.partition("/")[2])
            ours = body is not None and body["spec"]["clusterRef"]["name"] == "demo"
            if ours and body is not None and not meta_of(body).deleting:
                assert name in self.runtime.loop.state.topics


TestDeletions = Deletions.TestCase
TestDeletions.settings = settings(
    max_examples=60,
    stateful_step_count=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)


# ---------------------------------------------------------------------- falsifying cases
# Runs Hypothesis found, replayed step by step (a state machine takes no ``@example``).


def replay(*steps: tuple[str, dict[str, Any]], machine: Deletions | None = None) -> Deletions:
    machine = machine or Deletions()
    for rule_name, arguments in steps:
        getattr(machine, rule_name)(**arguments)
        machine.placed_topics_of_this_cluster_stay_placed()
    return machine


def test_ending_a_set_aside_pushes_a_new_generation() -> None:
    """A restart sets aside a Topic moved to another cluster; its deletion then ends the
    setting aside: a change of the pushed topology, so a new generation (a broker that
    was down must not get the old number with other content)."""
    replay(
        ("apply", {"name": "a", "partitions": 1, "policy": "Delete"}),
        ("broker", {"broker": 0, "up": False}),
        ("move", {"cluster": "other", "name": "a", "wipe": False}),
        ("restart", {}),
        ("move", {"cluster": "demo", "name": "a", "wipe": False}),
        ("delete", {"name": "a"}),
        ("broker", {"broker": 0, "up": True}),
    )


def test_a_generation_keeps_its_lrs_when_a_broker_comes_back() -> None:
    """The pushed ``lrs`` leaves out the brokers down when a generation is committed: a
    broker that comes back later gets that same document, not one rebuilt with itself in."""
    replay(
        ("restart", {}),
        ("broker", {"broker": 0, "up": False}),
        ("apply", {"name": "a", "partitions": 1, "policy": "Retain"}),
        ("restart", {}),
        ("apply", {"name": "c", "partitions": 1, "policy": "Retain"}),
        ("delete", {"name": "c"}),
        ("broker", {"broker": 0, "up": True}),
    )


def test_a_retain_deletion_released_by_hand_ends_its_keeping_aside_at_once() -> None:
    """The Retain deletion of ``b`` ends (its finalizer removed by hand): the push that
    drops it from ``retained`` is a generation of its own, not one left to a later change
    (by then a new Topic ``b`` that is not placed yet would see its data deleted)."""
    replay(
        ("restart", {}),
        ("broker", {"broker": 0, "up": False}),
        ("apply", {"name": "a", "partitions": 1, "policy": "Retain"}),
        ("apply", {"name": "b", "partitions": 1, "policy": "Retain"}),
        ("restart", {}),
        ("watch_loses_topics", {}),
        ("delete", {"name": "b"}),
        ("remove_finalizer_by_hand", {"name": "b"}),
        ("apply", {"name": "b", "partitions": 1, "policy": "Retain"}),
    )


def test_a_topic_applied_again_after_its_retain_deletion_lets_the_old_one_go() -> None:
    """The Retain deletion of ``a`` ends in one step (broker 0, down from the start, never
    held it), and a new Topic ``a`` is applied: the push that ends the old one's keeping
    aside comes before the new one is placed. Its brokers moved their copies aside, so
    nothing is deleted: the old Topic's deletion allowed it (the check once took the new
    Topic's apply for a withdrawal of that permission)."""
    replay(
        ("broker", {"broker": 0, "up": False}),
        ("apply", {"name": "a", "partitions": 1, "policy": "Retain"}),
        ("delete", {"name": "a"}),
        ("apply", {"name": "a", "partitions": 1, "policy": "Retain"}),
    )


def test_a_retain_deletion_sets_aside_on_brokers_down_while_it_ran() -> None:
    """``a`` (on broker 1 only: 0 and 2 are down) is deleted with Retain while broker 1 is
    down too, so no push told a broker to set it aside; its finalizer is then removed by
    hand. The Topic is gone, but its deletion asked to retain: the loop keeps ``a`` under
    ``retained`` until broker 1 moved its copy aside (a push naming it nowhere would make
    broker 1 delete it when it comes back)."""
    machine = replay(
        ("restart", {}),
        ("broker", {"broker": 0, "up": False}),
        ("broker", {"broker": 2, "up": False}),
        ("apply", {"name": "a", "partitions": 1, "policy": "Retain"}),
        ("broker", {"broker": 1, "up": False}),
        ("delete", {"name": "a"}),
        ("remove_finalizer_by_hand", {"name": "a"}),
        ("broker", {"broker": 0, "up": True}),
    )
    assert "ns/a" in machine.fleet.pushed[-1]["retained"]
    replay(("broker", {"broker": 1, "up": True}), ("wait", {"steps": 3}), machine=machine)
    # broker 2 is one of its replicas too (placed while down): it may hold a copy
    assert "ns/a" in machine.fleet.pushed[-1]["retained"]
    replay(("broker", {"broker": 2, "up": True}), ("wait", {"steps": 3}), machine=machine)
    # every replica moved it aside: the name leaves ``retained``, at a generation of its own
    last = machine.fleet.pushed[-1]
    assert "ns/a" not in last.get("retained", [])
    assert all(machine.fleet.generation(b) == last["generation"] for b in (0, 1, 2))


def test_a_new_topic_waits_for_the_old_one_to_be_set_aside() -> None:
    """``a`` is deleted with Retain while every broker is down, its finalizer removed by
    hand, and a new Topic ``a`` applied. The new one is not placed while no broker is up
    (the invariant is about a placed Topic, not about a name placed before), nor later
    before every broker holding the old copy moved it aside: a broker told of the new
    ``a`` first would drop the old copy as a superseded incarnation instead."""
    machine = replay(
        ("apply", {"name": "a", "partitions": 1, "policy": "Retain"}),
        ("broker", {"broker": 0, "up": False}),
        ("broker", {"broker": 1, "up": False}),
        ("broker", {"broker": 2, "up": False}),
        ("delete", {"name": "a"}),
        ("remove_finalizer_by_hand", {"name": "a"}),
        ("apply", {"name": "a", "partitions": 1, "policy": "Retain"}),
    )
    assert "ns/a" not in machine.runtime.loop.state.topics
    first_told: dict[int, str] = {}
    push = machine.fleet.push

    async def recording_push(broker_id: int, topology: Any) -> int | None:
        before = machine.fleet.generation(broker_id)
        held = await push(broker_id, topology)
        if held is not None and held > before and broker_id not in first_told:
            if "ns/a" in topology.get("retained", []):
                first_told[broker_id] = "retained"
            elif "ns/a" in {t["name"] for t in topology["topics"]}:
                first_told[broker_id] = "placed"
        return held

    machine.fleet.push = recording_push  # type: ignore[method-assign]
    replay(
        ("broker", {"broker": 0, "up": True}),
        ("wait", {"steps": 3}),
        ("broker", {"broker": 1, "up": True}),
        ("broker", {"broker": 2, "up": True}),
        ("wait", {"steps": 5}),
        machine=machine,
    )
    assert first_told == {0: "retained", 1: "retained", 2: "retained"}
    assert "ns/a" in machine.runtime.loop.state.topics
