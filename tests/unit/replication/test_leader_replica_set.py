"""The leader's live replica set: slow followers and silent (dead) followers leave it."""

from __future__ import annotations

from headrace.replication.leader import LeaderReplicaSet

START = 1_000


def fresh(**bounds: int) -> LeaderReplicaSet:
    return LeaderReplicaSet.become_leader(0, [0, 1, 2], [0, 1, 2], 0, START, **bounds)


def test_a_follower_that_stops_fetching_leaves_after_the_silence_bound_not_the_lag_bound() -> None:
    lrs = fresh(lag_max_ms=10_000, fetch_silence_max_ms=3_000)
    # both followers are caught up (idle topic) at START + 500; then broker 2 is killed
    for follower in (1, 2):
        assert not lrs.on_fetch(follower, 10, 10, START + 500)
    lrs.on_fetch(1, 10, 10, START + 3_000)
    assert lrs.tick(10, START + 3_500) == set()
    lrs.on_fetch(1, 10, 10, START + 3_501)
    assert lrs.tick(10, START + 3_501) == {2}
    assert lrs.sorted_lrs() == [0, 1]


def test_a_fetching_follower_behind_the_leader_keeps_the_lag_bound() -> None:
    lrs = fresh(lag_max_ms=10_000, fetch_silence_max_ms=3_000)
    now = START
    while now + 400 <= START + 10_000:
        now += 400
        lrs.on_fetch(1, 5, 10, now)  # fetches all the time, never reaches the leader's end
        lrs.on_fetch(2, 10, 10, now)
        assert lrs.tick(10, now) == set()
    now += 400
    lrs.on_fetch(1, 5, 10, now)
    lrs.on_fetch(2, 10, 10, now)
    assert lrs.tick(10, now) == {1}


def test_a_silent_follower_returns_when_it_fetches_from_the_high_watermark() -> None:
    lrs = fresh(fetch_silence_max_ms=3_000)
    lrs.on_fetch(1, 0, 0, START + 3_001)
    assert lrs.tick(0, START + 3_001) == {2}
    assert lrs.on_fetch(2, 0, 0, START + 4_000)
    assert lrs.sorted_lrs() == [0, 1, 2]


def test_become_leader_gives_every_follower_a_full_silence_bound() -> None:
    lrs = fresh(fetch_silence_max_ms=3_000)
    assert lrs.tick(0, START + 3_000) == set()
    assert lrs.tick(0, START + 3_001) == {1, 2}


def test_an_added_follower_enters_the_lrs_only_once_it_has_caught_up_to_the_hw() -> None:
    lrs = fresh()
    for follower in (1, 2):
        lrs.on_fetch(follower, 100, 100, START + 100)
    assert lrs.advance(100) and lrs.high_watermark == 100
    assert not lrs.reassign([0, 1, 2, 3], START + 200)
    assert lrs.sorted_lrs() == [0, 1, 2], "an empty new replica must not hold the HW back"
    assert not lrs.on_fetch(3, 0, 100, START + 300)
    assert not lrs.on_fetch(3, 60, 100, START + 400)
    assert lrs.tick(100, START + 500) == set()
    assert lrs.on_fetch(3, 100, 100, START + 600)
    assert lrs.sorted_lrs() == [0, 1, 2, 3]


def test_a_removed_follower_leaves_the_lrs_and_no_longer_holds_the_hw() -> None:
    lrs = fresh()
    lrs.on_fetch(1, 100, 120, START + 100)
    lrs.on_fetch(2, 40, 120, START + 100)
    lrs.advance(120)
    assert lrs.high_watermark == 40
    assert lrs.reassign([0, 1], START + 200)
    assert lrs.sorted_lrs() == [0, 1]
    assert lrs.advance(120) and lrs.high_watermark == 100
    assert not lrs.on_fetch(2, 120, 120, START + 300), "a removed replica is ignored"
    assert lrs.tick(120, START + 20_000) == {1}, "only the remaining follower is checked"


def test_a_move_the_leader_has_not_seen_makes_followers_outside_the_controllers_lrs_fetch_again() -> (
    None
):
    # This leader missed the push that removed broker 2 (which then
    # dropped its copy) and gets the one adding it back. Broker 2 never stopped being a
    # member here, and its old progress says it is in sync.
    lrs = fresh()
    for follower in (1, 2):
        lrs.on_fetch(follower, 100, 100, START + 100)
    assert lrs.advance(100) and lrs.high_watermark == 100
    assert lrs.reassign([0, 1, 2], START + 200, in_sync=[0, 1], move_generation=7)
    assert lrs.sorted_lrs() == [0, 1], "a follower the controller does not count must fetch again"
    assert lrs.followers[2].leo == 0
    assert not lrs.rejoin(100, START + 300, {1: START + 300, 2: START + 300}), (
        "a session fetch proves it alive, not that it holds the records"
    )
    assert not lrs.on_fetch(2, 0, 100, START + 400), "it starts empty"
    assert lrs.on_fetch(2, 100, 100, START + 900), "it re-enters once it has copied up to the HW"
    # the same move pushed again (or a later push of it) resets nothing
    assert not lrs.reassign([0, 1, 2], START + 1_000, in_sync=[0, 1], move_generation=7)
    assert lrs.sorted_lrs() == [0, 1, 2] and lrs.followers[2].leo == 100
    # no generation (no move, or an older controller): nothing is reset
    assert not lrs.reassign([0, 1, 2], START + 1_100, in_sync=[0, 1], move_generation=0)
    assert lrs.sorted_lrs() == [0, 1, 2]


def test_a_new_leader_takes_the_move_generation_it_was_told_and_resets_nobody_for_it() -> None:
    lrs = LeaderReplicaSet.become_leader(0, [0, 1, 2], [0, 1, 2], 0, START, move_generation=7)
    assert not lrs.reassign([0, 1, 2], START + 100, in_sync=[0, 1], move_generation=7)
    assert lrs.sorted_lrs() == [0, 1, 2]


# ----------------------------------------------------------------- fetch sessions
# A follower's session fetch names a partition only when its position there changed;
# ``fetched_ms`` (its last session fetch) stands for the fetches that did not name it.


def test_an_idle_partition_keeps_followers_that_fetch_over_their_session() -> None:
    lrs = fresh(lag_max_ms=10_000, fetch_silence_max_ms=3_000)
    for follower in (1, 2):
        lrs.on_fetch(follower, 10, 10, START + 100)  # named once, then never again
    for now in range(START + 1_000, START + 30_000, 1_000):
        assert lrs.tick(10, now, {1: now, 2: now}) == set()
    assert lrs.sorted_lrs() == [0, 1, 2]


def test_a_follower_whose_session_stops_leaves_after_the_silence_bound() -> None:
    lrs = fresh(lag_max_ms=10_000, fetch_silence_max_ms=3_000)
    for follower in (1, 2):
        lrs.on_fetch(follower, 10, 10, START + 100)
    fetched = {1: START + 1_000, 2: START + 1_000}
    assert lrs.tick(10, START + 4_000, fetched) == set()
    fetched[1] = START + 4_001  # broker 2's session went quiet at START + 1_000
    assert lrs.tick(10, START + 4_001, fetched) == {2}


def test_a_session_fetch_is_not_catching_up_for_a_follower_that_lags() -> None:
    lrs = fresh(lag_max_ms=10_000, fetch_silence_max_ms=3_000)
    lrs.on_fetch(1, 5, 10, START + 100)  # behind the leader's end, and never names it again
    lrs.on_fetch(2, 10, 10, START + 100)
    now = START + 10_000
    assert lrs.tick(10, now, {1: now, 2: now}) == set()
    now = START + 10_101
    assert lrs.tick(10, now, {1: now, 2: now}) == {1}


def test_a_follower_back_on_its_session_rejoins_if_it_holds_everything_committed() -> None:
    lrs = fresh(lag_max_ms=10_000, fetch_silence_max_ms=3_000)
    lrs.on_fetch(1, 10, 10, START + 100)
    lrs.on_fetch(2, 4, 10, START + 100)
    assert lrs.tick(10, START + 3_200, {}) == {1, 2}  # both went quiet
    lrs.record_controllers([0])  # and the controller has recorded it
    lrs.advance(10)
    assert lrs.high_watermark == 10
    now = START + 5_000
    assert lrs.rejoin(10, now, {1: now, 2: now}) == {1}  # 2 lacks committed records
    assert lrs.sorted_lrs() == [0, 1]
    assert lrs.rejoin(10, now + 10_000, {1: now, 2: now}) == set()  # quiet again: no


def test_a_follower_the_leader_dropped_holds_the_hw_until_the_controller_has_recorded_it() -> None:
    # The controller elects among the LRS it has recorded. Until it has recorded that
    # broker 2 left, broker 2 may still be elected, so records it lacks are not committed:
    # were they acknowledged, that election would lose them.
    lrs = fresh(fetch_silence_max_ms=3_000)
    for follower in (1, 2):
        lrs.on_fetch(follower, 10, 10, START + 100)
    assert lrs.advance(10) and lrs.high_watermark == 10
    lrs.on_fetch(1, 20, 20, START + 3_200)  # broker 2 died; broker 1 copied up to 20
    assert lrs.tick(20, START + 3_200) == {2}
    assert lrs.sorted_lrs() == [0, 1], "the leader reports the LRS it sees"
    assert not lrs.advance(20) and lrs.high_watermark == 10
    assert not lrs.record_controllers([0, 1, 2]), "the same record again changes nothing"
    assert not lrs.advance(20) and lrs.high_watermark == 10
    assert lrs.record_controllers([0, 1])
    assert lrs.advance(20) and lrs.high_watermark == 20


def test_a_follower_back_in_the_lrs_counts_before_the_controller_records_it() -> None:
    lrs = fresh(fetch_silence_max_ms=3_000)
    lrs.on_fetch(1, 0, 0, START + 3_001)
    assert lrs.tick(0, START + 3_001) == {2}
    assert lrs.record_controllers([0, 1])
    assert lrs.on_fetch(2, 0, 0, START + 3_100)  # back, holding everything committed
    lrs.on_fetch(1, 30, 30, START + 3_200)
    lrs.on_fetch(2, 20, 30, START + 3_200)
    # adding a member only makes the HW wait for more: no need to wait for the controller
    assert lrs.advance(30) and lrs.high_watermark == 20
