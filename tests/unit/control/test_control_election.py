"""Leader election: every row of the table, candidate order, then random schedules."""

from __future__ import annotations

from dataclasses import dataclass, replace

import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from headrace.control import election
from headrace.control.liveness import Liveness
from headrace.control.model import PartitionState, PartitionStatus
from headrace.control.settings import ControlSettings
from headrace.protocol.coordination import PartitionReport

ONLINE, ELECTING, OFFLINE = PartitionState.ONLINE, PartitionState.ELECTING, PartitionState.OFFLINE
SETTINGS = ControlSettings(liveness_ttl_ms=3_000, candidate_wait_ms=5_000, offline_retry_ms=30_000)
NOW = 1_000_000
T = "default/t"


def part(
    state: PartitionState,
    leader: int | None = None,
    *,
    epoch: int = 3,
    lrs: tuple[int, ...] = (0, 1, 2),
    candidate: int | None = None,
    deadline: int | None = None,
    tried: tuple[int, ...] = (),
) -> PartitionStatus:
    return PartitionStatus(0, (0, 1, 2, 3), leader, epoch, lrs, state, candidate, deadline, tried)


def seen(
    live: tuple[int, ...] = (),
    dead: tuple[int, ...] = (),
    unheard: tuple[int, ...] = (),
    draining: tuple[int, ...] = (),
) -> Liveness:
    return Liveness(frozenset(live), frozenset(dead), frozenset(unheard), frozenset(draining))


def follower(b: int, leo: int = 10, epoch: int = 3) -> PartitionReport:
    return PartitionReport(T, 0, "follower", epoch, leo, 0)


def leader(b: int, epoch: int, lrs: tuple[int, ...], leo: int = 10) -> PartitionReport:
    return PartitionReport(T, 0, "leader", epoch, leo, leo, lrs)


@dataclass(frozen=True)
class Row:
    name: str
    before: PartitionStatus
    liveness: Liveness
    reports: dict[int, PartitionReport]
    after: PartitionStatus
    rule: str | None
    now: int = NOW


WAIT = NOW + SETTINGS.candidate_wait_ms
RETRY = NOW + SETTINGS.offline_retry_ms
QUIET = NOW + SETTINGS.preferred_leader_quiet_ms

ROWS = [
    # ---------------------------------------------------------------- ONLINE
    Row(
        "leader dead: the least lagging live LRS member is nominated at epoch + 1",
        part(ONLINE, 0),
        seen(live=(1, 2), dead=(0,)),
        {1: follower(1, leo=7), 2: follower(2, leo=9)},
        part(ELECTING, None, epoch=4, candidate=2, deadline=WAIT, tried=(2,)),
        "LeaderLost",
    ),
    Row(
        "leader dead, no live LRS member: Offline, epoch and LRS kept",
        part(ONLINE, 0),
        seen(live=(), dead=(0, 1, 2)),
        {},
        part(OFFLINE, None, deadline=RETRY),
        "LeaderLost",
    ),
    Row(
        "leader dead, only a replica outside the LRS is live: Offline (no unclean election)",
        part(ONLINE, 0),
        seen(live=(3,), dead=(0, 1, 2)),
        {3: follower(3, leo=99)},
        part(OFFLINE, None, deadline=RETRY),
        "LeaderLost",
    ),
    Row(
        "leader draining: hand off to a non-draining LRS member",
        part(ONLINE, 0),
        seen(live=(0, 1, 2), draining=(0, 2)),
        {0: leader(0, 3, (0, 1, 2)), 1: follower(1, leo=5), 2: follower(2, leo=10)},
        part(ELECTING, None, epoch=4, candidate=1, deadline=WAIT, tried=(1,)),
        "LeaderDraining",
    ),
    Row(
        "leader draining, every other LRS member draining too: stays",
        part(ONLINE, 0),
        seen(live=(0, 1, 2), draining=(0, 1, 2)),
        {0: leader(0, 3, (0, 1, 2))},
        part(ONLINE, 0),
        None,
    ),
    Row(
        "leader reports a new LRS at its epoch: recorded, replicas only, leader kept",
        part(ONLINE, 0),
        seen(live=(0, 1, 2)),
        {0: leader(0, 3, (1, 9))},
        part(ONLINE, 0, lrs=(0, 1)),
        "LiveReplicasChanged",
    ),
    Row(
        "leader reports an LRS at an older epoch: ignored",
        part(ONLINE, 0),
        seen(live=(0, 1, 2)),
        {0: leader(0, 2, (0,))},
        part(ONLINE, 0),
        None,
    ),
    Row(
        "a follower's report never changes the LRS",
        part(ONLINE, 0),
        seen(live=(0, 1, 2)),
        {0: PartitionReport(T, 0, "follower", 3, 0, 0, (0,)), 1: leader(1, 3, (1,))},
        part(ONLINE, 0),
        None,
    ),
    Row(
        "leader live, same LRS: nothing",
        part(ONLINE, 0),
        seen(live=(0, 1, 2)),
        {0: leader(0, 3, (2, 1, 0))},
        part(ONLINE, 0),
        None,
    ),
    Row(
        "leader unheard (controller just restarted): left in place",
        part(ONLINE, 0),
        seen(live=(1, 2), unheard=(0,)),
        {1: follower(1), 2: follower(2)},
        part(ONLINE, 0),
        None,
    ),
    # ---------------------------------------------------------------- ONLINE: preferred leader
    Row(
        "preferred replica back in sync under another leader: the quiet period starts",
        part(ONLINE, 1),
        seen(live=(0, 1, 2)),
        {0: follower(0), 1: leader(1, 3, (0, 1, 2))},
        part(ONLINE, 1, deadline=QUIET),
        "PreferredReplicaInSync",
    ),
    Row(
        "quiet period running: wait",
        part(ONLINE, 1, deadline=NOW + 1),
        seen(live=(0, 1, 2)),
        {0: follower(0), 1: leader(1, 3, (0, 1, 2))},
        part(ONLINE, 1, deadline=NOW + 1),
        None,
    ),
    Row(
        "quiet period over, preferred still in sync: handed back at epoch + 1",
        part(ONLINE, 1, deadline=NOW),
        seen(live=(0, 1, 2)),
        {0: follower(0), 1: leader(1, 3, (0, 1, 2))},
        part(ELECTING, None, epoch=4, candidate=0, deadline=WAIT, tried=(0,)),
        "PreferredLeaderRebalance",
    ),
    Row(
        "quiet period over, but the preferred replica's log end is below the leader's HW: wait",
        part(ONLINE, 1, deadline=NOW),
        seen(live=(0, 1, 2)),
        {0: follower(0, leo=9), 1: leader(1, 3, (0, 1, 2))},
        part(ONLINE, 1, deadline=NOW),
        None,
    ),
    Row(
        "quiet period over, but the leader's report (its HW) is missing: wait",
        part(ONLINE, 1, deadline=NOW),
        seen(live=(0, 1, 2)),
        {0: follower(0)},
        part(ONLINE, 1, deadline=NOW),
        None,
    ),
    Row(
        "preferred replica left the LRS during the quiet period: cleared",
        part(ONLINE, 1, deadline=NOW, lrs=(1, 2)),
        seen(live=(0, 1, 2)),
        {0: follower(0), 1: leader(1, 3, (1, 2))},
        part(ONLINE, 1, lrs=(1, 2)),
        "PreferredReplicaLost",
    ),
    Row(
        "preferred replica live but not in the LRS (catching up): no quiet period",
        part(ONLINE, 1, lrs=(1, 2)),
        seen(live=(0, 1, 2)),
        {0: follower(0, leo=3), 1: leader(1, 3, (1, 2))},
        part(ONLINE, 1, lrs=(1, 2)),
        None,
    ),
    Row(
        "preferred replica has not applied the current epoch yet: no quiet period",
        part(ONLINE, 1),
        seen(live=(0, 1, 2)),
        {0: follower(0, epoch=2), 1: leader(1, 3, (0, 1, 2))},
        part(ONLINE, 1),
        None,
    ),
    Row(
        "preferred replica draining: no quiet period",
        part(ONLINE, 1),
        seen(live=(0, 1, 2), draining=(0,)),
        {0: follower(0), 1: leader(1, 3, (0, 1, 2))},
        part(ONLINE, 1),
        None,
    ),
    Row(
        "quiet period over, but an unload is sealing the partition: wait for it",
        replace(part(ONLINE, 1, deadline=NOW), seal=True),
        seen(live=(0, 1, 2)),
        {0: follower(0), 1: leader(1, 3, (0, 1, 2))},
        replace(part(ONLINE, 1, deadline=NOW), seal=True),
        None,
    ),
    Row(
        "controller warming up: no quiet period",
        part(ONLINE, 1),
        seen(live=(0, 1, 2), unheard=(3,)),
        {0: follower(0), 1: leader(1, 3, (0, 1, 2))},
        part(ONLINE, 1),
        None,
    ),
    # ---------------------------------------------------------------- ELECTING
    Row(
        "candidate reports leader at the new epoch: Online, LRS from its report",
        part(ELECTING, None, epoch=4, candidate=2, deadline=WAIT, tried=(1, 2)),
        seen(live=(1, 2)),
        {2: leader(2, 4, (2, 1))},
        part(ONLINE, 2, epoch=4, lrs=(1, 2)),
        "LeaderElected",
    ),
    Row(
        "candidate reports leader at an older epoch: still waiting",
        part(ELECTING, None, epoch=4, candidate=2, deadline=WAIT, tried=(2,)),
        seen(live=(1, 2)),
        {2: leader(2, 3, (2,))},
        part(ELECTING, None, epoch=4, candidate=2, deadline=WAIT, tried=(2,)),
        None,
    ),
    Row(
        "candidate dead: next one at once, epoch + 1",
        part(ELECTING, None, epoch=4, candidate=2, deadline=WAIT, tried=(2,)),
        seen(live=(1,), dead=(0, 2)),
        {1: follower(1)},
        part(ELECTING, None, epoch=5, candidate=1, deadline=WAIT, tried=(1,)),
        "CandidateLost",
    ),
    Row(
        "candidate dead, nobody else: Offline",
        part(ELECTING, None, epoch=4, candidate=2, deadline=WAIT, tried=(1, 2)),
        seen(live=(1,), dead=(0, 2)),
        {1: follower(1)},
        part(OFFLINE, None, epoch=4, deadline=RETRY, tried=(1,)),
        "CandidateLost",
    ),
    Row(
        "deadline passed, candidate live but silent about it: next candidate",
        part(ELECTING, None, epoch=4, candidate=2, deadline=NOW, tried=(2,)),
        seen(live=(1, 2), dead=(0,)),
        {1: follower(1), 2: follower(2)},
        part(ELECTING, None, epoch=5, candidate=1, deadline=WAIT, tried=(2, 1)),
        "CandidateTimedOut",
    ),
    Row(
        "deadline passed, every live member tried: Offline",
        part(ELECTING, None, epoch=5, candidate=1, deadline=NOW, tried=(2, 1)),
        seen(live=(1, 2), dead=(0,)),
        {1: follower(1), 2: follower(2)},
        part(OFFLINE, None, epoch=5, deadline=RETRY, tried=(2, 1)),
        "CandidateTimedOut",
    ),
    Row(
        "deadline passed, candidate unheard (controller restarted): wait",
        part(ELECTING, None, epoch=4, candidate=2, deadline=NOW - 1, tried=(2,)),
        seen(live=(1,), unheard=(0, 2)),
        {1: follower(1)},
        part(ELECTING, None, epoch=4, candidate=2, deadline=NOW - 1, tried=(2,)),
        None,
    ),
    Row(
        "deadline not reached: wait",
        part(ELECTING, None, epoch=4, candidate=2, deadline=NOW + 1, tried=(2,)),
        seen(live=(1, 2), dead=(0,)),
        {1: follower(1), 2: follower(2)},
        part(ELECTING, None, epoch=4, candidate=2, deadline=NOW + 1, tried=(2,)),
        None,
    ),
    # ---------------------------------------------------------------- OFFLINE
    Row(
        "an untried LRS member is live: nominated",
        part(OFFLINE, None, epoch=5, deadline=RETRY, tried=(2,)),
        seen(live=(1, 2), dead=(0,)),
        {1: follower(1, leo=3), 2: follower(2, leo=9)},
        part(ELECTING, None, epoch=6, candidate=1, deadline=WAIT, tried=(2, 1)),
        "ReplicaBack",
    ),
    Row(
        "only tried members live, before the retry deadline: stays",
        part(OFFLINE, None, epoch=5, deadline=NOW + 1, tried=(1, 2)),
        seen(live=(1, 2), dead=(0,)),
        {1: follower(1), 2: follower(2)},
        part(OFFLINE, None, epoch=5, deadline=NOW + 1, tried=(1, 2)),
        None,
    ),
    Row(
        "retry deadline passed, a tried member live: a new round",
        part(OFFLINE, None, epoch=5, deadline=NOW, tried=(1, 2)),
        seen(live=(1, 2), dead=(0,)),
        {1: follower(1, leo=4), 2: follower(2, leo=9)},
        part(ELECTING, None, epoch=6, candidate=2, deadline=WAIT, tried=(2,)),
        "OfflineRetry",
    ),
    Row(
        "a tried member that died is struck off, so its return counts",
        part(OFFLINE, None, epoch=5, deadline=RETRY, tried=(1, 2)),
        seen(live=(2,), dead=(0, 1)),
        {2: follower(2)},
        part(OFFLINE, None, epoch=5, deadline=RETRY, tried=(2,)),
        None,
    ),
    Row(
        "only a replica outside the LRS is live: stays Offline",
        part(OFFLINE, None, epoch=5, deadline=NOW, lrs=(0, 1)),
        seen(live=(2, 3), dead=(0, 1)),
        {2: follower(2), 3: follower(3)},
        part(OFFLINE, None, epoch=5, deadline=NOW, lrs=(0, 1)),
        None,
    ),
    Row(
        "nobody live: stays Offline",
        part(OFFLINE, None, epoch=5, deadline=NOW),
        seen(dead=(0, 1, 2, 3)),
        {},
        part(OFFLINE, None, epoch=5, deadline=NOW),
        None,
    ),
]


@pytest.mark.parametrize("row", ROWS, ids=[r.name for r in ROWS])
def test_table_row(row: Row) -> None:
    after, rules = election.step(row.before, row.liveness, row.reports, row.now, SETTINGS)
    assert after == row.after
    assert [r.name for r in rules] == ([row.rule] if row.rule else [])


def test_every_rule_has_a_row() -> None:
    assert {r.name for r in election.RULES} == {r.rule for r in ROWS if r.rule}


def test_the_dead_leaders_return_later_re_elects_an_offline_partition() -> None:
    def names(rules: tuple[election.Rule, ...]) -> list[str]:
        return [r.name for r in rules]

    status = part(ONLINE, 0, lrs=(0,))
    status, rules = election.step(status, seen(live=(1, 2), dead=(0,)), {}, NOW, SETTINGS)
    assert (status.state, names(rules)) == (OFFLINE, ["LeaderLost"])
    status, rules = election.step(status, seen(live=(1, 2), dead=(0,)), {}, NOW + 1, SETTINGS)
    assert rules == ()
    status, rules = election.step(status, seen(live=(0, 1, 2)), {0: follower(0)}, NOW + 2, SETTINGS)
    assert (status.state, status.candidate, status.leader_epoch) == (ELECTING, 0, 4)
    assert names(rules) == ["ReplicaBack"]
    status, rules = election.step(
        status, seen(live=(0, 1, 2)), {0: leader(0, 4, (0,))}, NOW + 3, SETTINGS
    )
    assert (status.state, status.leader, status.leader_epoch) == (ONLINE, 0, 4)
    assert names(rules) == ["LeaderElected"]


def test_one_step_follows_the_evidence_through_several_rows() -> None:
    # the nominee already reports leadership at the epoch it is about to get
    status, rules = election.step(
        part(ONLINE, 0),
        seen(live=(1,), dead=(0,)),
        {1: leader(1, 4, (1, 2))},
        NOW,
        SETTINGS,
    )
    assert [r.name for r in rules] == ["LeaderLost", "LeaderElected"]
    assert status == part(ONLINE, 1, epoch=4, lrs=(1, 2))


# --------------------------------------------------------------------------- candidate order


def order(
    reports: dict[int, PartitionReport],
    live: tuple[int, ...] = (1, 2, 3),
    draining: tuple[int, ...] = (),
    lrs: tuple[int, ...] = (0, 1, 2, 3),
) -> list[int]:
    view = election.Seen(seen(live=live, draining=draining), reports, NOW, SETTINGS)
    return election.lag_order(part(ONLINE, 0, lrs=lrs), view)


def test_smallest_lag_first_then_lowest_id() -> None:
    assert order({1: follower(1, 5), 2: follower(2, 9), 3: follower(3, 9)}) == [2, 3, 1]


def test_a_member_that_reports_nothing_ranks_last() -> None:
    assert order({1: follower(1, 0), 3: follower(3, 4)}) == [3, 1, 2]


def test_draining_members_rank_after_the_others() -> None:
    assert order({1: follower(1, 5), 2: follower(2, 9)}, draining=(2,)) == [1, 3, 2]


def test_only_live_lrs_members_are_candidates() -> None:
    reports = {b: follower(b, 9) for b in (1, 2, 3)}
    assert order(reports, live=(2, 3), lrs=(0, 1, 2)) == [2]


def test_first_status_is_online_under_the_first_replica_at_epoch_1() -> None:
    assert election.first_status(4, (2, 0)) == PartitionStatus(4, (2, 0), 2, 1, (2, 0), ONLINE)


# --------------------------------------------------------------------------- random schedules

BROKERS = range(4)


verdicts = st.lists(
    st.sampled_from(["live", "dead", "unheard", "draining"]), min_size=4, max_size=4
)
samples = st.tuples(
    st.sampled_from(["none", "follower", "leader", "confirm"]),
    st.integers(0, 12),
    st.integers(0, 20),
    st.lists(st.integers(0, 5), max_size=4).map(tuple),
)


Sample = tuple[str, int, int, tuple[int, ...]]


@st.composite
def schedules(draw: st.DrawFn) -> list[tuple[Liveness, list[Sample], int]]:
    steps = []
    now = NOW
    for verdict, sample, wait in draw(
        st.lists(
            st.tuples(
                verdicts,
                st.lists(samples, min_size=4, max_size=4),
                st.integers(0, 8_000) | st.just(SETTINGS.offline_retry_ms),
            ),
            min_size=1,
            max_size=30,
        )
    ):
        liveness = seen(
            live=tuple(b for b in BROKERS if verdict[b] in ("live", "draining")),
            dead=tuple(b for b in BROKERS if verdict[b] == "dead"),
            unheard=tuple(b for b in BROKERS if verdict[b] == "unheard"),
            draining=tuple(b for b in BROKERS if verdict[b] == "draining"),
        )
        now += wait
        steps.append((liveness, sample, now))
    return steps


def reports_of(
    liveness: Liveness, sample: list[Sample], status: PartitionStatus
) -> dict[int, PartitionReport]:
    """What live brokers say; "confirm" claims leadership at the current epoch."""
    reports: dict[int, PartitionReport] = {}
    for b in liveness.live:
        kind, epoch, leo, lrs = sample[b]
        if kind == "follower":
            reports[b] = PartitionReport(T, 0, "follower", epoch, leo, 0)
        elif kind in ("leader", "confirm"):
            epoch = status.leader_epoch if kind == "confirm" else epoch
            reports[b] = PartitionReport(T, 0, "leader", epoch, leo, leo, lrs)
    return reports


@settings(max_examples=200, deadline=None)
@given(schedules())
def test_invariants_hold_on_any_schedule(
    steps: list[tuple[Liveness, list[Sample], int]],
) -> None:
    status = election.first_status(0, (0, 1, 2, 3))
    for liveness, sample, now in steps:
        before = status
        reports = reports_of(liveness, sample, status)
        status, rules = election.step(status, liveness, reports, now, SETTINGS)
        for rule in rules:
            event(rule.name)
        assert status.leader_epoch >= before.leader_epoch, "epochs never go back"
        assert set(status.live_replicas) <= set(status.replicas)
        if status.state is ONLINE:
            assert status.leader in status.live_replicas
            assert status.leader not in liveness.dead
            assert (status.candidate, status.deadline_ms, status.tried) == (None, None, ())
        else:
            assert status.leader is None
        if status.leader is not None and status.leader != before.leader:
            # a new leader proved its promotion itself, at its own epoch, and was nominated
            # from the LRS while live
            assert status.leader in liveness.live
            assert status.leader in status.live_replicas
            if not {"LiveReplicasChanged", "LeaderElected"} & {r.name for r in rules[:-1]}:
                assert status.leader in before.live_replicas
            assert reports[status.leader].role == "leader"
            assert reports[status.leader].leader_epoch == status.leader_epoch
            assert status.leader_epoch > before.leader_epoch or status.leader == before.candidate
        if status.owner is not None and status.owner != before.owner:
            assert status.leader_epoch > before.leader_epoch or (
                status.leader == before.candidate
            ), "a new owner always comes with a new epoch"
        if status.candidate is not None and status.candidate != before.candidate:
            # nominating never changes the LRS, so the nominee is in the one it was chosen from
            assert status.candidate in status.live_replicas, "only LRS members are nominated"
            if not {"LiveReplicasChanged", "LeaderElected"} & {r.name for r in rules}:
                assert status.candidate in before.live_replicas
            assert status.candidate in liveness.live
        if not rules:
            assert replace(status, tried=before.tried) == before, "no row, no change but pruning"
        again, more = election.step(status, liveness, reports, now, SETTINGS)
        assert (again, more) == (status, ()), "a second step on the same evidence is a no-op"


def test_preferred_leader_rebalance_after_a_failover_and_return() -> None:
    """Kill the preferred leader, bring it back in sync, wait out the quiet period."""

    def names(rules: tuple[election.Rule, ...]) -> list[str]:
        return [r.name for r in rules]

    now = NOW
    status = part(ONLINE, 0, lrs=(0, 1, 2))
    status, rules = election.step(status, seen(live=(1, 2), dead=(0,)), {}, now, SETTINGS)
    assert (status.state, status.candidate, status.leader_epoch) == (ELECTING, 1, 4)
    status, rules = election.step(
        status, seen(live=(1, 2), dead=(0,)), {1: leader(1, 4, (1, 2))}, now, SETTINGS
    )
    assert (status.state, status.leader, status.live_replicas) == (ONLINE, 1, (1, 2))
    # broker 0 returns, catches up, and the leader takes it back into the LRS
    now += 1_000
    back = seen(live=(0, 1, 2))
    in_sync = {0: follower(0, epoch=4), 1: leader(1, 4, (0, 1, 2))}
    status, rules = election.step(status, back, in_sync, now, SETTINGS)
    assert names(rules) == ["LiveReplicasChanged", "PreferredReplicaInSync"]
    assert (status.leader, status.deadline_ms) == (1, now + SETTINGS.preferred_leader_quiet_ms)
    # nothing happens during the quiet period, and the same evidence changes nothing
    status, rules = election.step(status, back, in_sync, now + 5_000, SETTINGS)
    assert rules == ()
    now += SETTINGS.preferred_leader_quiet_ms
    status, rules = election.step(status, back, in_sync, now, SETTINGS)
    assert names(rules) == ["PreferredLeaderRebalance"]
    assert (status.state, status.candidate, status.leader_epoch) == (ELECTING, 0, 5)
    status, rules = election.step(
        status, back, {0: leader(0, 5, (0, 1, 2)), 1: follower(1, epoch=5)}, now, SETTINGS
    )
    assert (status.state, status.leader, status.leader_epoch, status.deadline_ms) == (
        ONLINE,
        0,
        5,
        None,
    )


def test_preferred_leader_rebalance_can_be_turned_off() -> None:
    off = replace(SETTINGS, preferred_leader_rebalance=False)
    status = part(ONLINE, 1)
    reports = {0: follower(0), 1: leader(1, 3, (0, 1, 2))}
    after, rules = election.step(status, seen(live=(0, 1, 2)), reports, NOW, off)
    assert (after, rules) == (status, ())


def test_a_preferred_replica_that_fails_to_promote_gives_way_to_the_next() -> None:
    status = part(ELECTING, None, epoch=4, candidate=0, deadline=NOW, tried=(0,))
    reports = {0: follower(0, epoch=3), 1: follower(1, epoch=3)}
    after, rules = election.step(status, seen(live=(0, 1, 2)), reports, NOW, SETTINGS)
    assert [r.name for r in rules] == ["CandidateTimedOut"]
    assert (after.candidate, after.leader_epoch) == (1, 5)
