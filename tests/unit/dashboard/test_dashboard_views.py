"""The dashboard's view model: what a person sees, from the controller's documents (pure)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from headrace.control.liveness import Liveness
from headrace.control.model import (
    ClusterState,
    CohortPlan,
    MoveProgress,
    PartitionStatus,
    RepartitionProgress,
    RepartitionRequest,
    TopicStatus,
    Transition,
    UnloadProgress,
    UnloadRequest,
)
from headrace.control.reconcile import Problem
from headrace.dashboard.observing import Observer
from headrace.dashboard.rates import RateHistory
from headrace.dashboard.views import Observed, dashboard_view
from headrace.protocol.coordination import CohortReport, Heartbeat, PartitionReport
from headrace.protocol.endpoints import BrokerEndpoint
from headrace.resources.operations import FinalizedBy, MovePhase, RepartitionPhase, UnloadPhase
from headrace.resources.topics import PartitionState

T = "default/orders"


def partition(
    index: int, replicas: tuple[int, ...], leader: int | None, lrs: tuple[int, ...], state: str
) -> PartitionStatus:
    return PartitionStatus(
        partition=index,
        replicas=replicas,
        leader=leader,
        leader_epoch=3,
        live_replicas=lrs,
        state=PartitionState(state),
    )


def cluster(transition: Transition | None = None) -> ClusterState:
    return ClusterState(
        generation=7,
        brokers={b: BrokerEndpoint(b, f"127.0.0.{b + 2}", 9092, 9644) for b in range(3)},
        topics={
            T: TopicStatus(
                name=T,
                partitioning_version=1,
                partitions=(
                    partition(0, (0, 1, 2), 0, (0, 1, 2), "Online"),
                    partition(1, (1, 2, 0), 1, (1, 0), "Online"),
                    partition(2, (2,), None, (2,), "Offline"),
                ),
                cohort_plans={"readers": CohortPlan("readers", 1, {"m1": (0, 1, 2)})},
                transition=transition,
            )
        },
    )


def observed(now: int, liveness: Liveness | None, **changes: Any) -> Observed:
    """What a control loop holds after a step: the cluster above, a problem, an unload moving."""
    unload = (
        UnloadRequest("default/move", T, (0,)),
        UnloadProgress(
            "default/move",
            UnloadPhase.MOVING,
            (MoveProgress(0, MovePhase.SEALING, from_broker=0),),
            message="sealing partition 0",
        ),
    )
    return replace(
        Observed(
            state=cluster(),
            heartbeats=heartbeats(now),
            liveness=liveness,
            now_ms=now,
            problems=(Problem(T, "NotEnoughBrokers", "replicas 4 > 3"),),
            adoption_floor=7,
            steps=42,
            unloads=(unload,),
        ),
        **changes,
    )


def heartbeats(now: int) -> dict[int, Heartbeat]:
    def hb(broker: int, received: int, *reports: PartitionReport) -> Heartbeat:
        return Heartbeat(
            BrokerEndpoint(broker, f"127.0.0.{broker + 2}", 9092, 9644),
            received_ms=received,
            partitions=reports,
            cohorts=(CohortReport(T, "readers", ("m1",)),) if broker == 0 else (),
            generation=7,
        )

    return {
        0: hb(
            0,
            now - 200,
            PartitionReport(
                T,
                0,
                "leader",
                3,
                120,
                100,
                (0, 1, 2),
                log_start_offset=10,
                stored_through=80,
                cursors={"readers": 60},
            ),
        ),
        1: hb(1, now - 300, PartitionReport(T, 1, "leader", 3, 50, 50, (1, 0))),
        2: hb(2, now - 9_000, PartitionReport(T, 2, "leader", 3, 30, 30, (2,))),
    }


def view() -> dict[str, Any]:
    now = 1_000_000
    liveness = Liveness(frozenset({0, 1}), frozenset({2}), frozenset(), frozenset())
    return dashboard_view(observed(now, liveness, charts={"windowMs": 1}))


def test_brokers_show_health_from_liveness() -> None:
    brokers = {b["id"]: b for b in view()["brokers"]}
    assert [brokers[b]["health"] for b in (0, 1, 2)] == ["up", "up", "down"]
    assert brokers[2]["lastHeartbeatAgoMs"] == 9_000
    assert brokers[0]["address"] == "127.0.0.2:9092"
    assert (brokers[0]["leaderOf"], brokers[0]["replicaOf"]) == (1, 2)


def test_partitions_show_offsets_and_flag_offline_and_under_replicated() -> None:
    rows = view()["partitions"]
    assert [(r["offline"], r["underReplicated"]) for r in rows] == [
        (False, False),
        (False, True),
        (True, False),
    ]
    first = rows[0]
    assert (first["highWatermark"], first["logStartOffset"], first["storedThrough"]) == (
        100,
        10,
        80,
    )
    assert first["offsetsStale"] is False
    assert rows[2]["highWatermark"] == 30 and rows[2]["offsetsStale"] is True, (
        "an offline partition shows its last known offsets, marked stale"
    )


def test_cohorts_show_lag_per_partition() -> None:
    (cohort,) = view()["cohorts"]
    assert (cohort["topic"], cohort["cohort"], cohort["members"]) == (T, "readers", ["m1"])
    assert [(p["partition"], p["member"], p["cursor"], p["lag"]) for p in cohort["partitions"]] == [
        (0, "m1", 60, 40),
        (1, "m1", None, None),
        (2, "m1", None, None),
    ]
    assert cohort["lag"] == 40


def test_transitions_and_problems_read_as_sentences() -> None:
    v = view()
    (unload,) = v["transitions"]["unloads"]
    assert (unload["name"], unload["phase"], unload["message"]) == (
        "default/move",
        "Moving",
        "sealing partition 0",
    )
    assert v["transitions"]["repartitions"] == []
    assert v["problems"] == [
        "Broker 2 at 127.0.0.4:9092 is down (last heartbeat 9.0 s ago).",
        f"Partition 2 of {T} is offline: no live replica of broker 2 can lead it.",
        f"Partition 1 of {T} is under-replicated: 2 of 3 replicas live (broker 1, broker 0).",
        f"Topic {T}: replicas 4 > 3 (NotEnoughBrokers).",
    ]
    assert v["summary"] == {
        "brokers": 3,
        "brokersUp": 2,
        "brokersDown": 1,
        "topics": 1,
        "partitions": 3,
        "offline": 1,
        "underReplicated": 1,
        "problems": 4,
        "healthy": False,
    }


def test_an_empty_controller_shows_an_empty_healthy_view() -> None:
    v = dashboard_view(Observed(ClusterState(), {}, None, 0))
    assert v["brokers"] == [] and v["partitions"] == [] and v["problems"] == []
    assert v["summary"]["healthy"] is True


def test_the_observer_keeps_a_dead_brokers_last_heartbeat_for_the_view() -> None:
    now = 1_000_000
    observer = Observer("local", RateHistory(interval_ms=1_000))
    observer.observe(now - 9_000, heartbeats(now))
    # the loop has dropped broker 2 (its admin port refused the poll)
    alive = {b: hb for b, hb in heartbeats(now).items() if b != 2}
    observer.observe(now, alive)
    liveness = Liveness(frozenset({0, 1}), frozenset({2}), frozenset(), frozenset())
    v = observer.view(observed(now, liveness, heartbeats=alive))
    broker_2 = next(b for b in v["brokers"] if b["id"] == 2)
    assert (broker_2["health"], broker_2["lastHeartbeatAgoMs"]) == ("down", 9_000)
    assert v["partitions"][2]["highWatermark"] == 30 and v["partitions"][2]["offsetsStale"]
    assert [s["name"] for s in v["charts"]["produce"]["series"]] == [T]


def test_a_repartition_in_flight_shows_its_phase_versions_and_release_progress() -> None:
    now = 1_000_000
    marker = Transition(
        request="default/grow",
        from_partitions=4,
        to_partitions=8,
        from_version=1,
        to_version=2,
        cutover_ms=now - 1_500,
        adoption_timeout_ms=30_000,
        adoption_generation=17,
        cutover_offsets={0: 5, 1: 9},
        released={"billing": (0, 4)},
    )
    finished = (
        RepartitionRequest("default/old", T, 4),
        RepartitionProgress(
            "default/old", RepartitionPhase.FINALIZED, finalized_by=FinalizedBy.ADOPTION_TIMED_OUT
        ),
    )
    waiting = (RepartitionRequest("default/next", T, 2), None)
    v = dashboard_view(observed(now, None, state=cluster(marker), repartitions=(finished, waiting)))
    (row,) = v["transitions"]["repartitions"]
    assert (row["topic"], row["phase"], row["kind"], row["fromVersion"], row["toVersion"]) == (
        T,
        "Draining",
        "Grow",
        1,
        2,
    )
    assert row["adoptionGeneration"] == 17 and row["cutoverOffsetsKnown"] == 2
    assert row["cohortsReleased"] == {"billing": "2/8"}
    assert row["sinceCutoverMs"] == 1_500 and row["adoptionDeadlineInMs"] is None
    (done,) = v["transitions"]["finishedRepartitions"]
    assert (done["name"], done["finalizedBy"]) == ("default/old", "AdoptionTimedOut")
