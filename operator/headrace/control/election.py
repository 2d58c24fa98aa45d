"""Leader election and LRS membership of one partition (pure state machine).

Theory of operation
-------------------
The controller keeps, per partition, a durable ``PartitionStatus``: the
replica set, the leader, the leader epoch, the live replica set (LRS) and the
election state. Every reconcile step feeds it what the controller sees now:
which brokers are live, dead or not yet heard from (``liveness``), and the
latest report of each live replica. The first row of the table whose state
and guard match fires; then the first row matching the new status, and so on
until none does, so a second step on the same evidence changes nothing.

    state     guard (first match wins)                     next              effect
    --------  -------------------------------------------  ----------------  -------------------------------------
    ONLINE    leader is dead                               ELECTING/OFFLINE  nominate (new round)
    ONLINE    leader draining; a non-draining LRS member   ELECTING          hand off: nominate among non-draining
              is live
    ONLINE    leader reports an LRS at this epoch that     ONLINE            LRS := leader's report
              differs from the stored one
    ONLINE    quiet period over, preferred replica still   ELECTING          hand back: nominate the preferred
              eligible, its log end >= the leader's HW                       replica
    ONLINE    preferred replica became eligible, no quiet  ONLINE            deadline := now + quiet period
              period running
    ONLINE    quiet period running, preferred replica no   ONLINE            deadline := None
              longer eligible
    ELECTING  candidate reports leader at this epoch       ONLINE            leader := candidate; LRS := its report
    ELECTING  candidate is dead                            ELECTING/OFFLINE  nominate the next untried member
    ELECTING  deadline passed, candidate live              ELECTING/OFFLINE  nominate the next untried member
    OFFLINE   an untried LRS member is live                ELECTING          nominate
    OFFLINE   retry deadline passed; a tried LRS member    ELECTING          forget the tried; nominate
              is live

**Nominate** picks, among LRS members that are live and not yet tried in this
round, the one with the smallest lag (log end offset behind the highest one
reported by the LRS; a member that reports nothing ranks last), non-draining
before draining, then by broker id. The candidate gets ``leader_epoch + 1``
and ``candidate_wait_ms`` to promote itself: it sees itself named
``candidate`` in the topology push, promotes at that epoch, and says so in its
next heartbeat (role ``leader``, that epoch). While it promotes ``leader`` is
None. If no member is eligible the partition goes OFFLINE with its epoch and
LRS unchanged, and waits for an LRS member to come (back) up.

**Preferred-leader rebalance** (with ``preferred_leader_rebalance`` on) is
how leadership goes back to where placement put it after a failover. The
preferred replica is the first of the replica set; it is *eligible* when it
is not the leader, is live and not draining, is in the LRS, reports itself a
follower at the current epoch (it has caught up with this leader), and the
controller is not warming up, and no replica move runs (``moves`` places the
leader then). Once eligible, an ONLINE partition carries a
``deadline_ms`` (the only time ONLINE has one): the end of the quiet period
(``preferred_leader_quiet_ms``). If the replica stays eligible until then it
is nominated through the same path as any election (epoch + 1, LRS member
only, promotion confirmed by its own report); if it stops being eligible the
deadline is cleared and the next return starts a new quiet period. A
partition an unload is sealing is not handed back until the seal is gone, nor
while the preferred replica's reported log end is below the leader's reported
high watermark (defence in depth: it would lack acknowledged records). A
preferred replica that fails to promote in time is followed by the next
candidate as usual (usually the leader it replaced, at a higher epoch).

Before the table runs, brokers that are dead are struck off ``tried``: a
member that failed, died and came back deserves a new chance, which is how "a
known broker comes back" re-elects an Offline partition.

Invariants (tested with random failure schedules):

* epochs only grow, and every new nominee gets a larger one than any before;
* only LRS members are ever nominated (no unclean election);
* a partition only becomes ONLINE under a broker that is live and reported
  the promotion itself; a leader that is merely *unheard* (the controller has
  just restarted) is left in place, and absence of news never advances an
  election;
* the LRS always contains the leader and only replicas.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Final

from headrace.control.liveness import Liveness
from headrace.control.model import PartitionState, PartitionStatus, normalise_lrs
from headrace.control.settings import ControlSettings
from headrace.protocol.coordination import PartitionReport

ONLINE, ELECTING, OFFLINE = PartitionState.ONLINE, PartitionState.ELECTING, PartitionState.OFFLINE


@dataclass(frozen=True, slots=True)
class Seen:
    """One step's evidence about one partition."""

    liveness: Liveness
    #: broker id -> that broker's report for this partition; live brokers only
    reports: Mapping[int, PartitionReport]
    now_ms: int
    settings: ControlSettings
    #: broker id -> the topology generation its heartbeat says it applied (live brokers)
    applied: Mapping[int, int] = field(default_factory=dict)
    #: a repartition in flight still needs this partition's cutover offset
    #: (``control.repartitions``): the leadership is not handed over by choice until the
    #: marker has it. A follower copies the offset with the records, but one following a
    #: broker of an older release has none, and would report its own log end
    cutover_pending: bool = False


@dataclass(frozen=True, slots=True)
class Rule:
    """One row of the table."""

    name: str
    state: PartitionState
    guard: Callable[[PartitionStatus, Seen], bool]
    act: Callable[[PartitionStatus, Seen], PartitionStatus]


# --------------------------------------------------------------------------- helpers


def lag_order(status: PartitionStatus, seen: Seen) -> list[int]:
    """Live LRS members not tried yet, best candidate first."""
    top = max(
        (r.log_end_offset for b, r in seen.reports.items() if b in status.live_replicas),
        default=0,
    )

    def rank(b: int) -> tuple[bool, int, int]:
        report = seen.reports.get(b)
        lag = top - report.log_end_offset if report is not None else top + 1
        return (b in seen.liveness.draining, lag, b)

    pool = [b for b in status.live_replicas if b in seen.liveness.live and b not in status.tried]
    return sorted(pool, key=rank)


def nominate(
    status: PartitionStatus, seen: Seen, *, allow_draining: bool = True
) -> PartitionStatus:
    """ELECTING under the best untried live LRS member, or OFFLINE if there is none."""
    pool = lag_order(status, seen)
    if not allow_draining:
        pool = [b for b in pool if b not in seen.liveness.draining]
    if not pool:
        return replace(
            status,
            state=OFFLINE,
            leader=None,
            candidate=None,
            deadline_ms=seen.now_ms + seen.settings.offline_retry_ms,
        )
    best = pool[0]
    return replace(
        status,
        state=ELECTING,
        leader=None,
        candidate=best,
        leader_epoch=status.leader_epoch + 1,
        deadline_ms=seen.now_ms + seen.settings.candidate_wait_ms,
        tried=(*status.tried, best),
    )


def _leader_report(
    broker: int | None, status: PartitionStatus, seen: Seen
) -> PartitionReport | None:
    """``broker``'s report if it says it leads at the current epoch."""
    if broker is None:
        return None
    report = seen.reports.get(broker)
    if report is None or report.role != "leader" or report.leader_epoch != status.leader_epoch:
        return None
    return report


# --------------------------------------------------------------------------- guards and actions


def _leader_dead(s: PartitionStatus, seen: Seen) -> bool:
    return s.leader is None or s.leader in seen.liveness.dead


def _new_round(s: PartitionStatus, seen: Seen) -> PartitionStatus:
    return nominate(replace(s, tried=()), seen)


def _leader_draining_with_successor(s: PartitionStatus, seen: Seen) -> bool:
    return (
        not seen.cutover_pending
        and s.leader in seen.liveness.draining
        and any(b not in seen.liveness.draining for b in lag_order(replace(s, tried=()), seen))
    )


def _hand_off(s: PartitionStatus, seen: Seen) -> PartitionStatus:
    return nominate(replace(s, tried=()), seen, allow_draining=False)


def _reported_lrs(s: PartitionStatus, seen: Seen) -> tuple[int, ...] | None:
    """The LRS the leader's report supports, None without a report.

    While a move is in flight and the leader has not applied the push that started it
    (its heartbeat's generation is below ``target_generation``), its LRS may still count
    a replica the move adds back by the progress it had before it dropped its copy:
    such a report may take members out, never put any in. Recorded,
    a stale member would ride every later push as in sync, and a leader applying one of
    those (having missed the push that started the move) would not make it fetch again.
    """
    report = _leader_report(s.leader, s, seen)
    if report is None or s.leader is None:
        return None
    reported = tuple(report.live_replicas)
    if s.target and seen.applied.get(s.leader, 0) < s.target_generation:
        reported = tuple(b for b in reported if b in s.live_replicas)
    return normalise_lrs(s.replicas, reported, s.leader)


def _lrs_reported(s: PartitionStatus, seen: Seen) -> bool:
    lrs = _reported_lrs(s, seen)
    return lrs is not None and lrs != s.live_replicas


def _record_lrs(s: PartitionStatus, seen: Seen) -> PartitionStatus:
    lrs = _reported_lrs(s, seen)
    if lrs is None:  # ruled out by the guard
        return s
    return replace(s, live_replicas=lrs)


def _preferred_eligible(s: PartitionStatus, seen: Seen) -> bool:
    """The preferred replica could take the leadership back now (see the module doc)."""
    if not seen.settings.preferred_leader_rebalance or not s.replicas or s.target:
        return False  # (during a replica move the move places the leader: ``moves``)
    preferred = s.replicas[0]
    report = seen.reports.get(preferred)
    return (
        s.leader is not None
        and s.leader != preferred
        and not seen.liveness.warming_up
        and preferred in seen.liveness.live
        and preferred not in seen.liveness.draining
        and preferred in s.live_replicas
        and report is not None
        and report.role == "follower"
        and report.leader_epoch == s.leader_epoch
    )


def _rebalance_due(s: PartitionStatus, seen: Seen) -> bool:
    # A partition an unload is sealing waits: the seal must finish under this leader. The
    # seal does not touch the quiet period (the unload step runs after this table and
    # may set it in the same step; a second step must change nothing). So does one whose
    # cutover offset a repartition still needs: a new leader would report its own log end,
    # which may hold post-cutover records, and the offset would come out high.
    return (
        s.deadline_ms is not None
        and seen.now_ms >= s.deadline_ms
        and not s.seal
        and not seen.cutover_pending
        and _preferred_eligible(s, seen)
        and _preferred_holds_leader_hw(s, seen)
    )


def _preferred_holds_leader_hw(s: PartitionStatus, seen: Seen) -> bool:
    """Defence in depth: the preferred replica's reported log end covers the leader's
    reported HW, so it holds every record acknowledged so far. Checked at hand-back only:
    under load the two reports are from different moments, and a quiet period must not
    restart every time the follower's last report trails the leader's."""
    preferred = seen.reports.get(s.replicas[0])
    current = seen.reports.get(s.leader) if s.leader is not None else None
    return (
        preferred is not None
        and current is not None
        and preferred.log_end_offset >= current.high_watermark
    )


def _hand_back(s: PartitionStatus, seen: Seen) -> PartitionStatus:
    preferred = s.replicas[0]
    return replace(
        s,
        state=ELECTING,
        leader=None,
        candidate=preferred,
        leader_epoch=s.leader_epoch + 1,
        deadline_ms=seen.now_ms + seen.settings.candidate_wait_ms,
        tried=(preferred,),
    )


def _quiet_period_due(s: PartitionStatus, seen: Seen) -> bool:
    return s.deadline_ms is None and _preferred_eligible(s, seen)


def _start_quiet_period(s: PartitionStatus, seen: Seen) -> PartitionStatus:
    return replace(s, deadline_ms=seen.now_ms + seen.settings.preferred_leader_quiet_ms)


def _quiet_period_broken(s: PartitionStatus, seen: Seen) -> bool:
    return s.deadline_ms is not None and not _preferred_eligible(s, seen)


def _end_quiet_period(s: PartitionStatus, seen: Seen) -> PartitionStatus:
    return replace(s, deadline_ms=None)


def _candidate_promoted(s: PartitionStatus, seen: Seen) -> bool:
    return _leader_report(s.candidate, s, seen) is not None


def _promote(s: PartitionStatus, seen: Seen) -> PartitionStatus:
    report = _leader_report(s.candidate, s, seen)
    if report is None or s.candidate is None:  # ruled out by the guard
        return s
    return replace(
        s,
        state=ONLINE,
        leader=s.candidate,
        live_replicas=normalise_lrs(s.replicas, report.live_replicas, s.candidate),
        candidate=None,
        deadline_ms=None,
        tried=(),
    )


def _candidate_dead(s: PartitionStatus, seen: Seen) -> bool:
    return s.candidate is None or s.candidate in seen.liveness.dead


def _candidate_timed_out(s: PartitionStatus, seen: Seen) -> bool:
    return (
        s.deadline_ms is not None
        and seen.now_ms >= s.deadline_ms
        and s.candidate in seen.liveness.live
    )


def _next_candidate(s: PartitionStatus, seen: Seen) -> PartitionStatus:
    return nominate(s, seen)


def _untried_member_live(s: PartitionStatus, seen: Seen) -> bool:
    return bool(lag_order(s, seen))


def _retry_due(s: PartitionStatus, seen: Seen) -> bool:
    return (
        s.deadline_ms is not None
        and seen.now_ms >= s.deadline_ms
        and bool(lag_order(replace(s, tried=()), seen))
    )


#: The transition table. ``step`` fires the first row whose state and guard match.
RULES: Final[tuple[Rule, ...]] = (
    Rule("LeaderLost", ONLINE, _leader_dead, _new_round),
    Rule("LeaderDraining", ONLINE, _leader_draining_with_successor, _hand_off),
    Rule("LiveReplicasChanged", ONLINE, _lrs_reported, _record_lrs),
    Rule("PreferredLeaderRebalance", ONLINE, _rebalance_due, _hand_back),
    Rule("PreferredReplicaInSync", ONLINE, _quiet_period_due, _start_quiet_period),
    Rule("PreferredReplicaLost", ONLINE, _quiet_period_broken, _end_quiet_period),
    Rule("LeaderElected", ELECTING, _candidate_promoted, _promote),
    Rule("CandidateLost", ELECTING, _candidate_dead, _next_candidate),
    Rule("CandidateTimedOut", ELECTING, _candidate_timed_out, _next_candidate),
    Rule("ReplicaBack", OFFLINE, _untried_member_live, nominate),
    Rule("OfflineRetry", OFFLINE, _retry_due, _new_round),
)


#: more rows than any chain can fire in one step (each nomination needs fresh evidence)
MAX_ROWS_PER_STEP: Final = 8


def step(
    status: PartitionStatus,
    liveness: Liveness,
    reports: Mapping[int, PartitionReport],
    now_ms: int,
    settings: ControlSettings,
    applied: Mapping[int, int] | None = None,
    *,
    cutover_pending: bool = False,
) -> tuple[PartitionStatus, tuple[Rule, ...]]:
    """The partition's next status, and the rows that fired, in order.

    Rows fire until none matches, so one step reaches the status the
    evidence supports (a promotion confirmed in the same heartbeat as a
    nomination, say) and a second step on the same evidence changes nothing.
    ``applied``: the generation each live broker's heartbeat says it applied (a leader
    behind a move's start is not trusted to add LRS members: ``_reported_lrs``).
    ``cutover_pending``: a repartition in flight still needs the partition's cutover offset
    from its leader (no hand-back or drain hand-off until it has it).
    """
    seen = Seen(liveness, reports, now_ms, settings, applied or {}, cutover_pending)
    fired: list[Rule] = []
    while len(fired) < MAX_ROWS_PER_STEP:
        if status.state is not ONLINE:
            status = replace(status, tried=tuple(b for b in status.tried if b not in liveness.dead))
        rule = next(
            (r for r in RULES if r.state is status.state and r.guard(status, seen)),
            None,
        )
        if rule is None:
            break
        status = rule.act(status, seen)
        fired.append(rule)
    return status, tuple(fired)


def first_status(partition: int, replicas: tuple[int, ...]) -> PartitionStatus:
    """A new partition: ONLINE under its first replica at epoch 1, every replica in the LRS.

    Placement only uses live brokers and the logs are empty, so there is
    nothing to elect between and nothing any replica could be missing.
    """
    return PartitionStatus(
        partition=partition,
        replicas=replicas,
        leader=replicas[0],
        leader_epoch=1,
        live_replicas=replicas,
        state=ONLINE,
    )
