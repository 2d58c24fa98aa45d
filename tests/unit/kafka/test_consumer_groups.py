"""The consumer group protocol's core (KIP-848): joins, revocation before assignment,
leaves, expiry, fencing, commits' member epochs and the assignors."""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import pytest

from headrace.kafka import consumer_groups as cg
from headrace.kafka.errors import ErrorCode
from headrace.kafka.topic_ids import topic_id

T = topic_id("t")
U = topic_id("u")
TOPICS = {"t": cg.TopicInfo("t", T, 4), "u": cg.TopicInfo("u", U, 2)}
SESSION_S = cg.ConsumerGroupSettings().session_timeout_ms / 1000
REBALANCE_MS = 10_000


def lookup(name: str) -> cg.TopicInfo | None:
    return TOPICS.get(name)


VIEW = cg.TopicView(lookup, lambda: list(TOPICS))


def parts(*partitions: int) -> cg.Assignment:
    """Partitions of topic ``t``."""
    return {T: frozenset(partitions)} if partitions else {}


@dataclass(frozen=True)
class Beat:
    """One heartbeat and how it must be answered (``assigned``: None = not sent)."""

    at: float
    member: str
    epoch: int
    owned: cg.Assignment | None = None
    subscribed: tuple[str, ...] | None = None
    error: ErrorCode = ErrorCode.NONE
    answer_epoch: int | None = None
    assigned: cg.Assignment | None = None


def join(at: float, member: str, answer_epoch: int, assigned: cg.Assignment) -> Beat:
    return Beat(at, member, 0, {}, ("t",), ErrorCode.NONE, answer_epoch, assigned)


def run(groups: cg.ConsumerGroups, beats: list[Beat]) -> None:
    for i, beat in enumerate(beats):
        ask = cg.HeartbeatAsk(
            "g",
            beat.member,
            beat.epoch,
            rebalance_timeout_ms=REBALANCE_MS if beat.epoch == 0 else -1,
            subscribed=beat.subscribed,
            owned=beat.owned,
        )
        answer = groups.heartbeat(beat.at, ask, VIEW, "unused")
        assert answer.error == beat.error, (i, beat, answer)
        if beat.error != ErrorCode.NONE:
            continue
        assert (answer.member_epoch, answer.assignment) == (beat.answer_epoch, beat.assigned), (
            i,
            beat,
        )


#: a first member, then a second: the first gives up half before the second gets it
TWO_MEMBERS = [
    join(0, "a", 1, parts(0, 1, 2, 3)),
    Beat(0.1, "a", 1, parts(0, 1, 2, 3), answer_epoch=1),
    # b's target is 0 and 1, still a's: it is told its new epoch and nothing yet
    join(1, "b", 2, {}),
    # a is told to keep 2 and 3 only, at its old epoch (it must revoke 0 and 1 first)
    Beat(2, "a", 1, parts(0, 1, 2, 3), answer_epoch=1, assigned=parts(2, 3)),
    # b asks again before a has revoked: still nothing
    Beat(3, "b", 2, {}, answer_epoch=2),
    # a no longer lists 0 and 1: it takes the new epoch
    Beat(4, "a", 1, parts(2, 3), answer_epoch=2, assigned=parts(2, 3)),
    # and now b gets them
    Beat(5, "b", 2, {}, answer_epoch=2, assigned=parts(0, 1)),
    Beat(6, "b", 2, parts(0, 1), answer_epoch=2),
]

CASES = {
    "a lone member gets every partition": [
        join(0, "a", 1, parts(0, 1, 2, 3)),
        Beat(1, "a", 1, parts(0, 1, 2, 3), answer_epoch=1),
        Beat(2, "a", 1, None, answer_epoch=1),
    ],
    "a second member: revocation first, then assignment": TWO_MEMBERS,
    "a leave hands the partitions over": [
        *TWO_MEMBERS,
        Beat(7, "a", -1, error=ErrorCode.NONE, answer_epoch=-1),
        Beat(8, "b", 2, parts(0, 1), answer_epoch=3, assigned=parts(0, 1, 2, 3)),
        Beat(9, "a", 2, parts(2, 3), error=ErrorCode.UNKNOWN_MEMBER_ID),
    ],
    "a heartbeat ahead of the coordinator is fenced": [
        join(0, "a", 1, parts(0, 1, 2, 3)),
        Beat(1, "a", 2, parts(0, 1, 2, 3), error=ErrorCode.FENCED_MEMBER_EPOCH),
    ],
    "the previous epoch is taken when the owned partitions are within the assignment": [
        *TWO_MEMBERS,
        # a's answer with epoch 2 was lost: it comes back at 1 owning 2 and 3
        Beat(7, "a", 1, parts(2, 3), answer_epoch=2),
    ],
    "the previous epoch with partitions outside the assignment is fenced": [
        *TWO_MEMBERS,
        Beat(7, "a", 1, parts(0, 2, 3), error=ErrorCode.FENCED_MEMBER_EPOCH),
    ],
    "an epoch behind that is not the previous one is fenced": [
        *TWO_MEMBERS,
        Beat(7, "b", 1, parts(0, 1), error=ErrorCode.FENCED_MEMBER_EPOCH),
    ],
    "a fenced member rejoins with epoch 0 and gets the partitions it gave up": [
        *TWO_MEMBERS,
        join(7, "b", 3, parts(0, 1)),
        Beat(8, "a", 2, parts(2, 3), answer_epoch=3, assigned=parts(2, 3)),
    ],
    "a subscription change revokes, then assigns": [
        join(0, "a", 1, parts(0, 1, 2, 3)),
        Beat(
            1,
            "a",
            1,
            parts(0, 1, 2, 3),
            ("t", "u"),
            answer_epoch=2,
            assigned={T: frozenset(range(4)), U: frozenset({0, 1})},
        ),
        Beat(2, "a", 2, None, ("u",), answer_epoch=2, assigned={U: frozenset({0, 1})}),
        Beat(3, "a", 2, {U: frozenset({0, 1})}, answer_epoch=3, assigned={U: frozenset({0, 1})}),
    ],
    "an unknown member": [Beat(0, "x", 5, {}, error=ErrorCode.UNKNOWN_MEMBER_ID)],
}


@pytest.mark.parametrize("beats", CASES.values(), ids=CASES.keys())
def test_heartbeats(beats: list[Beat]) -> None:
    run(cg.ConsumerGroups(), beats)


def test_a_silent_member_is_expired_and_its_partitions_go_to_the_other() -> None:
    groups = cg.ConsumerGroups()
    run(groups, TWO_MEMBERS)
    # b keeps heartbeating, a falls silent
    run(groups, [Beat(SESSION_S, "b", 2, None, answer_epoch=2)])
    assert groups.tick(4 + SESSION_S - 0.1) == []
    assert groups.tick(4 + SESSION_S) == [("g", "a")]
    run(
        groups,
        [
            Beat(4 + SESSION_S, "b", 2, None, answer_epoch=3, assigned=parts(0, 1, 2, 3)),
            Beat(5 + SESSION_S, "a", 2, parts(2, 3), error=ErrorCode.UNKNOWN_MEMBER_ID),
        ],
    )


def test_a_member_that_does_not_revoke_in_its_rebalance_timeout_is_removed() -> None:
    groups = cg.ConsumerGroups()
    run(groups, TWO_MEMBERS[:4])  # a was told to give up 0 and 1 at t=2
    assert groups.tick(2 + REBALANCE_MS / 1000 - 0.1) == []
    assert groups.tick(2 + REBALANCE_MS / 1000) == [("g", "a")]
    run(groups, [Beat(13, "b", 2, {}, answer_epoch=3, assigned=parts(0, 1, 2, 3))])


INVALID = {
    "no group": (cg.HeartbeatAsk("", "m", 0, rebalance_timeout_ms=1, subscribed=("t",), owned={})),
    "no rebalance timeout on join": cg.HeartbeatAsk("g", "m", 0, subscribed=("t",), owned={}),
    "owned partitions on join": cg.HeartbeatAsk(
        "g", "m", 0, rebalance_timeout_ms=1, subscribed=("t",), owned=parts(1)
    ),
    "no subscription on join": cg.HeartbeatAsk("g", "m", 0, rebalance_timeout_ms=1, owned={}),
    "no member id past the join": cg.HeartbeatAsk("g", "", 3),
    "epoch -3": cg.HeartbeatAsk("g", "m", -3),
}


@pytest.mark.parametrize("ask", INVALID.values(), ids=INVALID.keys())
def test_invalid_heartbeats_are_refused(ask: cg.HeartbeatAsk) -> None:
    answer = cg.ConsumerGroups().heartbeat(0, ask, VIEW, "new")
    assert answer.error == ErrorCode.INVALID_REQUEST
    assert answer.message


def test_a_regular_expression_subscribes_whole_names_and_takes_new_topics() -> None:
    groups = cg.ConsumerGroups()
    known = {"t": TOPICS["t"], "tt": cg.TopicInfo("tt", topic_id("tt"), 1)}
    view = cg.TopicView(known.get, lambda: list(known))
    # only names it matches whole: "t.?" matches t and tt, not "xt"
    known["xt"] = cg.TopicInfo("xt", topic_id("xt"), 1)
    ask = cg.HeartbeatAsk(
        "g", "m", 0, rebalance_timeout_ms=1, subscribed=(), subscribed_regex="t.?", owned={}
    )
    answer = groups.heartbeat(0, ask, view, "unused")
    assert answer.assignment == {T: frozenset(range(4)), topic_id("tt"): frozenset({0})}
    # a topic created later joins the subscription at the member's next heartbeat
    known["t3"] = cg.TopicInfo("t3", topic_id("t3"), 2)
    again = groups.heartbeat(1, cg.HeartbeatAsk("g", "m", 1, owned=answer.assignment), view, "")
    assert again.member_epoch == 2
    assert again.assignment == {**answer.assignment, topic_id("t3"): frozenset({0, 1})}
    # an invalid expression is refused with Kafka's code for it
    bad = cg.HeartbeatAsk(
        "g", "n", 0, rebalance_timeout_ms=1, subscribed=(), subscribed_regex="t(", owned={}
    )
    assert groups.heartbeat(2, bad, view, "").error == ErrorCode.INVALID_REGULAR_EXPRESSION


def test_an_unknown_assignor_is_refused_and_a_join_without_an_id_gets_one() -> None:
    groups = cg.ConsumerGroups()
    ask = cg.HeartbeatAsk(
        "g", "", 0, rebalance_timeout_ms=1, subscribed=("t",), server_assignor="sticky", owned={}
    )
    assert groups.heartbeat(0, ask, VIEW, "new").error == ErrorCode.UNSUPPORTED_ASSIGNOR
    ask = cg.HeartbeatAsk("g", "", 0, rebalance_timeout_ms=1, subscribed=("t",), owned={})
    assert groups.heartbeat(0, ask, VIEW, "new").member_id == "new"


COMMITS = {
    # (member, epoch, OffsetCommit version) -> answer, once TWO_MEMBERS has run
    ("a", 2, 9): ErrorCode.NONE,
    ("a", 1, 9): ErrorCode.STALE_MEMBER_EPOCH,
    ("a", 2, 8): ErrorCode.UNSUPPORTED_VERSION,
    ("x", 2, 9): ErrorCode.UNKNOWN_MEMBER_ID,
    ("", -1, 9): ErrorCode.UNKNOWN_MEMBER_ID,  # outside the group while it has members
}


@pytest.mark.parametrize(("asked", "expected"), COMMITS.items(), ids=str)
def test_commits_need_the_current_member_epoch(
    asked: tuple[str, int, int], expected: ErrorCode
) -> None:
    groups = cg.ConsumerGroups()
    run(groups, TWO_MEMBERS)
    member, epoch, version = asked
    assert groups.may_commit("g", member, epoch, version) == expected


FETCHES = {
    # (member id, epoch) of an OffsetFetch v9 -> answer, once TWO_MEMBERS has run
    ("a", 2): ErrorCode.NONE,
    ("a", 1): ErrorCode.STALE_MEMBER_EPOCH,
    ("x", 2): ErrorCode.UNKNOWN_MEMBER_ID,
    (None, -1): ErrorCode.NONE,  # an admin client's: no member named
}


@pytest.mark.parametrize(("asked", "expected"), FETCHES.items(), ids=str)
def test_a_member_fetching_offsets_needs_its_current_epoch(
    asked: tuple[str | None, int], expected: ErrorCode
) -> None:
    groups = cg.ConsumerGroups()
    run(groups, TWO_MEMBERS)
    assert groups.may_fetch("g", *asked) == expected
    assert groups.may_fetch("classic-or-unknown", "a", 1) == ErrorCode.NONE


def test_a_commit_without_an_epoch_is_taken_once_the_group_is_empty() -> None:
    groups = cg.ConsumerGroups()
    run(groups, [join(0, "a", 1, parts(0, 1, 2, 3)), Beat(1, "a", -1, answer_epoch=-1)])
    assert groups.may_commit("g", "", -1, 9) == ErrorCode.NONE
    assert groups.may_commit("other", "", -1, 7) == ErrorCode.NONE


def test_range_gives_contiguous_ranges_per_topic() -> None:
    subscriptions = {"b": [TOPICS["t"]], "a": [TOPICS["t"], TOPICS["u"]], "c": [TOPICS["t"]]}
    assert cg.range_assignment(subscriptions) == {
        "a": {T: frozenset({0, 1}), U: frozenset({0, 1})},
        "b": {T: frozenset({2})},
        "c": {T: frozenset({3})},
    }


def test_uniform_balances_over_unequal_subscriptions_and_keeps_what_it_can() -> None:
    subscriptions = {"a": [TOPICS["t"], TOPICS["u"]], "b": [TOPICS["u"]]}
    first = cg.uniform_assignment(subscriptions, {})
    # b can only take u's partitions; a takes t's and the rest
    assert first["b"] == {U: frozenset({0, 1})}
    assert first["a"] == {T: frozenset(range(4))}
    three = {**subscriptions, "c": [TOPICS["t"]]}
    second = cg.uniform_assignment(three, first)
    sizes = sorted(sum(len(p) for p in a.values()) for a in second.values())
    assert sizes == [2, 2, 2]
    assert second["b"] == first["b"]  # nothing moved that had not to


def test_group_assignor_is_the_one_most_members_name() -> None:
    groups = cg.ConsumerGroups()
    for member, assignor in (("a", "range"), ("b", "range"), ("c", None)):
        ask = cg.HeartbeatAsk(
            "g",
            member,
            0,
            rebalance_timeout_ms=1,
            subscribed=("t",),
            server_assignor=assignor,
            owned={},
        )
        groups.heartbeat(0, ask, VIEW, member)
    assert groups.groups["g"].assignor(cg.UNIFORM) == cg.RANGE


# --------------------------------------------------------------------------- a simulation


@dataclass
class Client:
    """A well-behaved member: it reports what it owns, and gives up what it lost at once
    or, when it lingers, one heartbeat later."""

    member_id: str
    epoch: int = 0
    assigned: cg.Assignment = field(default_factory=dict)
    lingering: cg.Assignment = field(default_factory=dict)
    joined: bool = False

    def owned(self) -> set[tuple[bytes, int]]:
        return {(t, p) for a in (self.assigned, self.lingering) for t, ps in a.items() for p in ps}


@pytest.mark.parametrize("seed", range(25))
def test_no_partition_ever_has_two_owners_and_the_group_settles(seed: int) -> None:
    rng = random.Random(seed)
    groups = cg.ConsumerGroups()
    clients = {f"m{i}": Client(f"m{i}") for i in range(4)}
    now = 0.0

    def beat(client: Client, linger: bool) -> None:
        owned = cg.assignment_of([*client.assigned.items(), *client.lingering.items()])
        if not client.joined:
            ask = cg.HeartbeatAsk(
                "g",
                client.member_id,
                0,
                rebalance_timeout_ms=60_000,
                subscribed=("t", "u"),
                owned={},
            )
            client.joined = True
        else:
            ask = cg.HeartbeatAsk("g", client.member_id, client.epoch, owned=owned)
        client.lingering = {}
        answer = groups.heartbeat(now, ask, VIEW, "unused")
        assert answer.error == ErrorCode.NONE
        client.epoch = answer.member_epoch
        if answer.assignment is not None:
            if linger:  # it keeps reading what it lost until its next heartbeat
                client.lingering = {
                    t: ps - answer.assignment.get(t, frozenset())
                    for t, ps in client.assigned.items()
                }
            client.assigned = answer.assignment
        held: set[tuple[bytes, int]] = set()
        for other in clients.values():
            mine = other.owned()
            assert not held & mine, f"two owners of {held & mine}"
            held |= mine

    for _ in range(200):
        now += 0.1
        client = rng.choice(list(clients.values()))
        if client.joined and rng.random() < 0.05:
            leave = cg.HeartbeatAsk("g", client.member_id, -1)
            assert groups.heartbeat(now, leave, VIEW, "unused").error == ErrorCode.NONE
            clients[client.member_id] = Client(client.member_id)
            continue
        beat(client, linger=rng.random() < 0.5)
    # with prompt heartbeats only from here on, every member reaches its target
    for _ in range(4):
        for client in clients.values():
            beat(client, linger=False)
    assert groups.groups["g"].state is cg.GroupState.STABLE
    owned = [c.owned() for c in clients.values()]
    assert sum(map(len, owned)) == 6 and len(set().union(*owned)) == 6
