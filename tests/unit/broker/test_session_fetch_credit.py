"""A session fetch proves a follower alive only for the partitions its session holds
(``Replication._fetched_for``): a follower that stopped fetching a partition (not ready,
moving, a topology not yet applied) must fall silent for it, and so leave its LRS, while
its fetches of other partitions go on."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from headrace.broker.fetch_sessions import FetchSession
from headrace.broker.replicating import Replication
from headrace.protocol import replication as rp


def partition(topic: str, index: int) -> Any:
    return SimpleNamespace(topic=SimpleNamespace(name=topic), index=index)


def test_a_fetch_credits_only_the_partitions_its_session_holds() -> None:
    replication = Replication(SimpleNamespace(), lambda _event: None)  # type: ignore[arg-type]
    session = FetchSession(follower_id=2)
    session.positions[("ns/orders", 0)] = rp.FetchPosition("ns/orders", 0, 1, 10)
    replication.sessions[2] = session
    replication.fetched_ms[2] = 5_000

    assert replication._fetched_for(partition("ns/orders", 0)) == {2: 5_000}
    # partition 1 is not in the session (never sent, or forgotten): no credit
    assert replication._fetched_for(partition("ns/orders", 1)) == {}
    session.forget(("ns/orders", 0))
    assert replication._fetched_for(partition("ns/orders", 0)) == {}
