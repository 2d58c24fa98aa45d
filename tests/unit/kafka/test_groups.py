"""The classic group protocol's core: joins, syncs, heartbeats, expiry and commits."""

from __future__ import annotations

from headrace.kafka.errors import ErrorCode
from headrace.kafka.groups import (
    Committed,
    Coordinator,
    GroupState,
    JoinAnswer,
    JoinAsk,
    Reply,
    SyncAnswer,
)

SESSION_MS = 10_000


def ask(
    member_id: str = "", *, protocols: tuple[str, ...] = ("range",), instance: str | None = None
) -> JoinAsk:
    return JoinAsk(
        "g",
        member_id,
        "client",
        "127.0.0.1",
        SESSION_MS,
        SESSION_MS,
        "consumer",
        tuple((name, name.encode()) for name in protocols),
        instance,
    )


def answers(replies: list[Reply]) -> dict[object, JoinAnswer | SyncAnswer]:
    return {reply.token: reply.answer for reply in replies}


def test_a_lone_member_joins_syncs_and_is_stable() -> None:
    core = Coordinator()
    (joined,) = core.join(0, "j1", ask(), "m1")
    assert joined.token == "j1"
    assert joined.answer == JoinAnswer(ErrorCode.NONE, 1, "range", "m1", "m1", (("m1", b"range"),))
    (synced,) = core.sync(0, "s1", "g", 1, "m1", {"m1": b"all"})
    assert synced.answer == SyncAnswer(ErrorCode.NONE, b"all")
    assert core.groups["g"].state is GroupState.STABLE
    assert core.heartbeat(1, "g", 1, "m1") == ErrorCode.NONE


def test_a_second_member_makes_the_first_rejoin_and_both_get_the_new_generation() -> None:
    core = Coordinator()
    core.join(0, "j1", ask(), "m1")
    core.sync(0, "s1", "g", 1, "m1", {"m1": b"all"})
    assert core.join(1, "j2", ask(), "m2") == []  # parked until m1 rejoins
    assert core.heartbeat(1, "g", 1, "m1") == ErrorCode.REBALANCE_IN_PROGRESS
    got = answers(core.join(2, "j1b", ask("m1"), "unused"))
    assert got["j1b"] == JoinAnswer(
        ErrorCode.NONE, 2, "range", "m1", "m1", (("m1", b"range"), ("m2", b"range"))
    )
    assert got["j2"] == JoinAnswer(ErrorCode.NONE, 2, "range", "m1", "m2", ())
    assert core.sync(2, "s2", "g", 2, "m2", {}) == []  # the follower waits for the leader
    got = answers(core.sync(2, "s1", "g", 2, "m1", {"m1": b"a", "m2": b"b"}))
    assert got == {"s1": SyncAnswer(ErrorCode.NONE, b"a"), "s2": SyncAnswer(ErrorCode.NONE, b"b")}


def test_a_member_that_stops_heartbeating_is_removed_and_the_group_rebalances() -> None:
    core = Coordinator()
    core.join(0, "j1", ask(), "m1")
    core.join(0, "j2", ask(), "m2")  # m1's first join already completed generation 1
    core.join(0, "j1b", ask("m1"), "unused")  # gen 2: m1 and m2
    core.sync(0, "s1", "g", 2, "m1", {"m1": b"a", "m2": b"b"})
    core.heartbeat(9, "g", 2, "m1")
    assert core.tick(SESSION_MS / 1000 + 1) == []  # m2 expired; m1 must rejoin
    assert set(core.groups["g"].members) == {"m1"}
    assert core.heartbeat(11, "g", 2, "m1") == ErrorCode.REBALANCE_IN_PROGRESS
    (rejoined,) = core.join(11, "j1c", ask("m1"), "unused")
    assert isinstance(rejoined.answer, JoinAnswer) and rejoined.answer.generation == 3


def test_a_member_that_does_not_rejoin_in_time_is_dropped_from_the_generation() -> None:
    core = Coordinator()
    core.join(0, "j1", ask(), "m1")
    core.join(0, "j2", ask(), "m2")
    core.join(0, "j1b", ask("m1"), "unused")
    core.sync(0, "s1", "g", 2, "m1", {})
    core.join(1, "j3", ask(), "m3")  # m1 and m2 must rejoin within the rebalance timeout
    core.heartbeat(2, "g", 2, "m2")  # alive, but never rejoins
    core.join(2, "j1c", ask("m1"), "unused")
    got = answers(core.tick(1 + SESSION_MS / 1000))
    assert {a.member_id for a in got.values() if isinstance(a, JoinAnswer)} == {"m1", "m3"}
    assert set(core.groups["g"].members) == {"m1", "m3"}
    assert core.heartbeat(12, "g", 3, "m2") == ErrorCode.UNKNOWN_MEMBER_ID


def test_refusals() -> None:
    core = Coordinator()
    core.join(0, "j1", ask(), "m1")
    (bad,) = core.join(0, "x", ask(protocols=("sticky",)), "m9")
    assert bad.answer == JoinAnswer(ErrorCode.INCONSISTENT_GROUP_PROTOCOL)
    (unknown,) = core.join(0, "y", ask("ghost"), "m9")
    assert isinstance(unknown.answer, JoinAnswer)
    assert unknown.answer.error == ErrorCode.UNKNOWN_MEMBER_ID
    short = JoinAsk("g", "", "c", "h", 10, 10, "consumer", (("range", b""),))
    assert core.join(0, "z", short, "m9")[0].answer == JoinAnswer(ErrorCode.INVALID_SESSION_TIMEOUT)
    (stale,) = core.sync(0, "s", "g", 7, "m1", {})
    assert stale.answer == SyncAnswer(ErrorCode.ILLEGAL_GENERATION)
    assert core.delete("g") == ErrorCode.NON_EMPTY_GROUP
    assert core.delete("nope") == ErrorCode.GROUP_ID_NOT_FOUND


def test_commits_come_from_the_current_generation_or_from_outside_an_empty_group() -> None:
    core = Coordinator()
    assert core.may_commit("solo", -1, "") == ErrorCode.NONE  # assign(): no membership
    core.join(0, "j1", ask(), "m1")
    core.sync(0, "s1", "g", 1, "m1", {"m1": b"all"})
    assert core.may_commit("g", -1, "") == ErrorCode.ILLEGAL_GENERATION
    assert core.may_commit("g", 0, "m1") == ErrorCode.ILLEGAL_GENERATION
    assert core.may_commit("g", 1, "m2") == ErrorCode.UNKNOWN_MEMBER_ID
    assert core.may_commit("g", 1, "m1") == ErrorCode.NONE
    core.commit("g", "t", 0, Committed(42, 3, "meta"))
    assert core.committed("g") == {("t", 0): Committed(42, 3, "meta")}
    code, _ = core.leave(1, "g", "m1")
    assert code == ErrorCode.NONE
    assert core.groups["g"].state is GroupState.EMPTY
    assert core.delete("g") == ErrorCode.NONE
    assert core.committed("g") == {}


def test_a_member_commits_through_a_rebalance_until_it_has_joined_the_next_generation() -> None:
    """As Kafka's coordinator: while the group prepares a rebalance, members of the current
    generation still commit what they processed (the next owner of their partitions starts
    there); between the join and the sync the generation has no assignment yet, and its
    commits are told ``REBALANCE_IN_PROGRESS``."""
    core = Coordinator()
    core.join(0, "j1", ask(), "m1")
    core.sync(0, "s1", "g", 1, "m1", {"m1": b"all"})
    core.join(1, "j2", ask(), "m2")
    assert core.groups["g"].state is GroupState.PREPARING_REBALANCE
    assert core.may_commit("g", 1, "m1") == ErrorCode.NONE
    core.join(2, "j1b", ask("m1"), "unused")
    assert core.groups["g"].state is GroupState.COMPLETING_REBALANCE
    assert core.may_commit("g", 2, "m1") == ErrorCode.REBALANCE_IN_PROGRESS
    assert core.may_commit("g", 1, "m1") == ErrorCode.ILLEGAL_GENERATION
    core.sync(2, "s2", "g", 2, "m1", {"m1": b"a", "m2": b"b"})
    assert core.may_commit("g", 2, "m1") == ErrorCode.NONE


def subscription(*topics: str) -> bytes:
    """A consumer's member metadata (ConsumerProtocolSubscription v0), written out."""
    names = b"".join(len(t).to_bytes(2, "big") + t.encode() for t in topics)
    return b"\x00\x00" + len(topics).to_bytes(4, "big") + names + b"\xff\xff\xff\xff"


def test_offsets_are_deleted_from_an_empty_group_or_for_topics_no_member_subscribes_to() -> None:
    core = Coordinator()
    assert core.delete_offsets("g", [("t", 0)]) == (ErrorCode.GROUP_ID_NOT_FOUND, {})
    for partition in (0, 1):
        core.commit("g", "t", partition, Committed(5, 0, ""))
        core.commit("g", "other", partition, Committed(7, 0, ""))
    # empty: any of them, including one that was never committed
    code, results = core.delete_offsets("g", [("t", 0), ("t", 9)])
    assert code == ErrorCode.NONE
    assert results == {("t", 0): ErrorCode.NONE, ("t", 9): ErrorCode.NONE}
    assert set(core.committed("g")) == {("t", 1), ("other", 0), ("other", 1)}
    # a member subscribed to "t": its offsets stay, the others' go
    member = JoinAsk(
        "g", "", "c", "h", SESSION_MS, SESSION_MS, "consumer", (("range", subscription("t")),)
    )
    core.join(0, "j1", member, "m1")
    code, results = core.delete_offsets("g", [("t", 1), ("other", 0)])
    assert code == ErrorCode.NONE
    assert results == {("t", 1): ErrorCode.GROUP_SUBSCRIBED_TO_TOPIC, ("other", 0): ErrorCode.NONE}
    assert set(core.committed("g")) == {("t", 1), ("other", 1)}


def test_offsets_of_a_group_with_members_whose_subscriptions_cannot_be_read_stay() -> None:
    core = Coordinator()
    core.commit("g", "t", 0, Committed(5, 0, ""))
    core.join(0, "j1", ask(), "m1")  # metadata b"range": not a subscription
    assert core.delete_offsets("g", [("t", 0)]) == (ErrorCode.NON_EMPTY_GROUP, {})
    connect = JoinAsk("h", "", "c", "h", SESSION_MS, SESSION_MS, "connect", (("default", b""),))
    core.commit("h", "t", 0, Committed(5, 0, ""))
    core.join(0, "j2", connect, "m2")
    assert core.delete_offsets("h", [("t", 0)]) == (ErrorCode.NON_EMPTY_GROUP, {})
    assert core.committed("g") and core.committed("h")


def stable_with_a_static_leader(core: Coordinator) -> None:
    """Generation 2: static s1 (member m1, the leader) holds b"a", dynamic m2 holds b"b"."""
    core.join(0, "j1", ask(instance="s1"), "m1")
    core.join(0, "j2", ask(), "m2")
    core.join(0, "j1b", ask("m1", instance="s1"), "unused")
    core.sync(0, "s2", "g", 2, "m2", {})
    core.sync(0, "s1", "g", 2, "m1", {"m1": b"a", "m2": b"b"}, "s1")
    assert core.groups["g"].state is GroupState.STABLE


def test_a_static_member_that_rejoins_gets_its_assignment_back_without_a_rebalance() -> None:
    """KIP-345: a restarted static member joins with no member id; it is given a new one
    in the current generation, and its old assignment, and the other members see nothing.
    The answer names the old leader id, so that a restarted leader does not assign."""
    core = Coordinator()
    stable_with_a_static_leader(core)
    (rejoined,) = core.join(3, "j3", ask(instance="s1"), "m3")
    assert rejoined.answer == JoinAnswer(ErrorCode.NONE, 2, "range", "m1", "m3", ())
    group = core.groups["g"]
    assert group.state is GroupState.STABLE and group.generation == 2
    assert list(group.members) == ["m3", "m2"] and group.leader == "m3"
    assert core.heartbeat(3, "g", 2, "m2") == ErrorCode.NONE
    (synced,) = core.sync(3, "s3", "g", 2, "m3", {}, "s1")
    assert synced.answer == SyncAnswer(ErrorCode.NONE, b"a")
    assert core.heartbeat(4, "g", 2, "m3", "s1") == ErrorCode.NONE
    assert core.may_commit("g", 2, "m3", "s1") == ErrorCode.NONE


def test_a_second_member_with_the_same_instance_id_fences_the_first() -> None:
    core = Coordinator()
    stable_with_a_static_leader(core)
    core.join(1, "j3", ask(), "m3")  # a rebalance: m1's rejoin is parked
    assert core.join(1, "j1c", ask("m1", instance="s1"), "unused") == []
    got = answers(core.join(2, "j4", ask(instance="s1"), "m4"))
    assert got["j1c"] == JoinAnswer(ErrorCode.FENCED_INSTANCE_ID)
    assert "m1" not in core.groups["g"].members
    # the fenced member's every request, with its instance id, is refused as fenced
    assert core.heartbeat(2, "g", 2, "m1", "s1") == ErrorCode.FENCED_INSTANCE_ID
    assert core.heartbeat(2, "g", 2, "m1") == ErrorCode.UNKNOWN_MEMBER_ID
    assert core.may_commit("g", 2, "m1", "s1") == ErrorCode.FENCED_INSTANCE_ID
    (refused,) = core.sync(2, "s", "g", 2, "m1", {}, "s1")
    assert refused.answer == SyncAnswer(ErrorCode.FENCED_INSTANCE_ID)
    (rejoin,) = core.join(2, "j1d", ask("m1", instance="s1"), "unused")
    assert rejoin.answer == JoinAnswer(ErrorCode.FENCED_INSTANCE_ID, member_id="m1")
    assert core.leave(2, "g", "m1", "s1")[0] == ErrorCode.FENCED_INSTANCE_ID
    # the rebalance goes on with the new holder of the instance id
    got = answers(core.join(3, "j2b", ask("m2"), "unused"))
    assert {a.member_id for a in got.values() if isinstance(a, JoinAnswer)} == {"m2", "m3", "m4"}
    assert {a.generation for a in got.values() if isinstance(a, JoinAnswer)} == {3}


def test_a_static_member_leaves_by_its_instance_id() -> None:
    core = Coordinator()
    stable_with_a_static_leader(core)
    assert core.leave(1, "g", "", "nobody")[0] == ErrorCode.UNKNOWN_MEMBER_ID
    assert core.leave(1, "g", "m2", "s1")[0] == ErrorCode.FENCED_INSTANCE_ID
    assert core.groups["g"].state is GroupState.STABLE
    code, _ = core.leave(1, "g", "", "s1")
    assert code == ErrorCode.NONE
    assert list(core.groups["g"].members) == ["m2"]
    assert core.groups["g"].state is GroupState.PREPARING_REBALANCE
    # the instance id is free again: the next member with it is a new member
    core.join(2, "j2b", ask("m2"), "unused")
    assert core.join(3, "j5", ask(instance="s1"), "m5") == []  # a rebalance for it
    assert core.groups["g"].members["m5"].instance_id == "s1"


def test_a_static_rejoin_that_changes_the_group_protocol_rebalances() -> None:
    core = Coordinator()
    core.join(0, "j1", ask(instance="s1"), "m1")
    core.sync(0, "s1", "g", 1, "m1", {"m1": b"a"}, "s1")
    (rejoined,) = core.join(1, "j2", ask(protocols=("sticky", "range"), instance="s1"), "m2")
    # alone in the group, it completes the rebalance at once, as the new leader
    assert rejoined.answer == JoinAnswer(
        ErrorCode.NONE, 2, "sticky", "m2", "m2", (("m2", b"sticky"),)
    )


def test_a_static_member_rejoining_during_a_rebalance_takes_its_place_in_it() -> None:
    core = Coordinator()
    stable_with_a_static_leader(core)
    core.join(1, "j3", ask(), "m3")
    core.join(1, "j2b", ask("m2"), "unused")
    got = answers(core.join(2, "j4", ask(instance="s1"), "m4"))
    joined = {a.member_id: a for a in got.values() if isinstance(a, JoinAnswer)}
    assert set(joined) == {"m2", "m3", "m4"}
    assert joined["m4"].leader == "m4" and len(joined["m4"].members) == 3


def test_a_static_member_that_misses_its_session_is_removed() -> None:
    core = Coordinator()
    stable_with_a_static_leader(core)
    core.heartbeat(SESSION_MS / 1000, "g", 2, "m2")
    core.tick(SESSION_MS / 1000 + 1)
    assert list(core.groups["g"].members) == ["m2"]
    # its instance id joins again as a new member, through a rebalance
    assert core.join(11, "j5", ask(instance="s1"), "m5") == []
    got = answers(core.join(11, "j2b", ask("m2"), "unused"))
    assert {a.member_id for a in got.values() if isinstance(a, JoinAnswer)} == {"m2", "m5"}
