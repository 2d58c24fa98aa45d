"""The consumer group protocol of KIP-848: broker-side assignment and reconciliation (pure).

Theory of operation. A member heartbeats (``ConsumerGroupHeartbeat``) with its
epoch, its subscription and the partitions it owns; the coordinator answers with
the member's epoch and the partitions it may use now. Three epochs drive it:

* the **group epoch** is bumped whenever what the assignment depends on changes: a
  member joins, leaves or is expired, a subscription changes, or a subscribed
  topic's partition count changes;
* the **assignment epoch** is the group epoch the current *target* assignment was
  computed for (by the group's assignor, over every member's subscription);
* each **member epoch** is the assignment epoch the member has caught up with.

A member moves toward its target one heartbeat at a time (``_reconcile``), and a
partition is never given to two members at once: a member whose target lost
partitions first keeps only the partitions it keeps (``UNREVOKED_PARTITIONS``,
its epoch unchanged) until a heartbeat of its own no longer lists the lost ones;
only then does it take its new epoch. A member whose target gained partitions
still held (assigned or being revoked) by another gets them on a later heartbeat
after that owner let them go (``UNRELEASED_PARTITIONS``). A member that does not
revoke within its rebalance timeout, or that stops heartbeating for the session
timeout, is removed, which frees its partitions.

Errors as Kafka's coordinator answers them: a heartbeat with an epoch the
coordinator does not expect is ``FENCED_MEMBER_EPOCH`` (the member gives up its
partitions and rejoins with epoch 0); an unknown member is ``UNKNOWN_MEMBER_ID``.
A member that heartbeats with its previous epoch and owns nothing outside its
current assignment is accepted: the answer that raised its epoch was lost.

A subscription is topic names, a regular expression (matched whole against every
topic name the member may see, at each of its heartbeats, so new topics join it), or
both. Not served: static membership (an instance id is recorded and shown, but the
member is dynamic). The adapter (``broker.kafka_consumer_groups``) supplies the
clock, the topics and ids.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Final

from headrace.kafka.errors import ErrorCode

#: topic id -> partitions
Assignment = dict[bytes, frozenset[int]]

JOIN_EPOCH: Final = 0
LEAVE_EPOCH: Final = -1
STATIC_LEAVE_EPOCH: Final = -2

UNIFORM: Final = "uniform"
RANGE: Final = "range"
ASSIGNORS: Final = (UNIFORM, RANGE)


@dataclass(frozen=True, slots=True)
class TopicInfo:
    """A subscribed topic as the assignor sees it."""

    name: str
    topic_id: bytes
    partitions: int


@dataclass(frozen=True, slots=True)
class TopicView:
    """The topics as the heartbeating member may see them."""

    #: a subscribed name -> its id and partition count; None if there is no such topic
    lookup: Callable[[str], TopicInfo | None]
    #: every topic name a regular expression may match (those the member may read)
    names: Callable[[], Iterable[str]]


@dataclass(frozen=True, slots=True)
class ConsumerGroupSettings:
    #: a member silent this long is removed (Kafka's ``group.consumer.session.timeout.ms``)
    session_timeout_ms: int = 45_000
    #: the interval members are told to heartbeat at. Lower than Kafka's 5 s: a partition
    #: moves only after the revoking member's heartbeat and then the receiving member's,
    #: and a heartbeat is a small request.
    heartbeat_interval_ms: int = 2_000
    #: the assignor when a member names none
    default_assignor: str = UNIFORM


class MemberState(enum.Enum):
    STABLE = "stable"
    #: waiting for the member to confirm it gave up ``revoking``
    UNREVOKED_PARTITIONS = "unrevoked_partitions"
    #: some of its target is still held by other members
    UNRELEASED_PARTITIONS = "unreleased_partitions"


@dataclass(slots=True)
class Member:
    member_id: str
    client_id: str
    client_host: str
    instance_id: str | None
    rack_id: str | None
    subscribed: tuple[str, ...]
    #: the subscription's regular expression, and the names it matched at the last heartbeat
    regex: str | None
    server_assignor: str | None
    rebalance_timeout_ms: int
    session_ends_at: float
    matched: tuple[str, ...] = ()
    epoch: int = 0
    previous_epoch: int = -1
    state: MemberState = MemberState.STABLE
    #: the partitions the member may use (what it was last told)
    assigned: Assignment = field(default_factory=dict)
    #: the partitions it must give up before it moves on
    revoking: Assignment = field(default_factory=dict)
    revocation_ends_at: float | None = None

    def topics(self) -> list[str]:
        """The subscription's topic names: those named, then those matched."""
        return sorted(set(self.subscribed) | set(self.matched))


class GroupState(enum.Enum):
    """As Kafka's ``kafka-consumer-groups.sh`` names them."""

    EMPTY = "Empty"
    ASSIGNING = "Assigning"
    RECONCILING = "Reconciling"
    STABLE = "Stable"


@dataclass(slots=True)
class ConsumerGroup:
    group_id: str
    epoch: int = 0
    assignment_epoch: int = 0
    members: dict[str, Member] = field(default_factory=dict)
    #: member id -> the partitions it should own at ``assignment_epoch``
    target: dict[str, Assignment] = field(default_factory=dict)
    #: the subscribed topics the target was computed over (name -> info)
    topics: dict[str, TopicInfo] = field(default_factory=dict)

    @property
    def state(self) -> GroupState:
        if not self.members:
            return GroupState.EMPTY
        if self.assignment_epoch < self.epoch:
            return GroupState.ASSIGNING
        if any(
            m.epoch != self.assignment_epoch or m.state is not MemberState.STABLE
            for m in self.members.values()
        ):
            return GroupState.RECONCILING
        return GroupState.STABLE

    def assignor(self, default: str) -> str:
        """The assignor most members name (ties: the default, then by name)."""
        named = [m.server_assignor for m in self.members.values() if m.server_assignor]
        if not named:
            return default
        return max(sorted(set(named)), key=lambda a: (named.count(a), a == default))


@dataclass(frozen=True, slots=True)
class HeartbeatAsk:
    """A ``ConsumerGroupHeartbeat``; None fields are unchanged since the last one."""

    group_id: str
    member_id: str
    member_epoch: int
    client_id: str = ""
    client_host: str = ""
    instance_id: str | None = None
    rack_id: str | None = None
    rebalance_timeout_ms: int = -1
    subscribed: tuple[str, ...] | None = None
    subscribed_regex: str | None = None
    server_assignor: str | None = None
    owned: Assignment | None = None


@dataclass(frozen=True, slots=True)
class HeartbeatAnswer:
    error: ErrorCode
    message: str | None = None
    member_id: str | None = None
    member_epoch: int = -1
    heartbeat_interval_ms: int = 0
    #: None = unchanged since the last answer
    assignment: Assignment | None = None


class ConsumerGroups:
    """Every consumer-protocol group this broker coordinates."""

    def __init__(self, settings: ConsumerGroupSettings | None = None) -> None:
        self.settings = settings or ConsumerGroupSettings()
        self.groups: dict[str, ConsumerGroup] = {}

    def has_members(self, group_id: str) -> bool:
        group = self.groups.get(group_id)
        return group is not None and bool(group.members)

    # ------------------------------------------------------------------ heartbeat

    def heartbeat(
        self, now: float, ask: HeartbeatAsk, topics: TopicView, new_member_id: str
    ) -> HeartbeatAnswer:
        """One heartbeat. ``new_member_id`` names a joining member that brings no id
        (version 0 of the request; version 1's clients choose their own)."""
        refused = self._check(ask)
        if refused is not None:
            return refused
        if ask.member_epoch in (LEAVE_EPOCH, STATIC_LEAVE_EPOCH):
            return self._leave(ask)
        group = self.groups.setdefault(ask.group_id, ConsumerGroup(ask.group_id))
        # what the target depends on changed: one new group epoch for all of it
        changed = False
        if ask.member_epoch == JOIN_EPOCH:
            member_id = ask.member_id or new_member_id
            # a rejoin owns nothing now (checked): what it held is free
            group.members.pop(member_id, None)
            group.target.pop(member_id, None)
            member = Member(
                member_id,
                ask.client_id,
                ask.client_host,
                ask.instance_id,
                ask.rack_id,
                ask.subscribed or (),
                ask.subscribed_regex or None,
                ask.server_assignor,
                ask.rebalance_timeout_ms,
                now + self.settings.session_timeout_ms / 1000,
            )
            group.members[member_id] = member
            changed = True
        else:
            found = group.members.get(ask.member_id)
            if found is None:
                return self._refuse(
                    ErrorCode.UNKNOWN_MEMBER_ID, f"no member {ask.member_id!r} in the group"
                )
            member = found
            fenced = self._fenced(member, ask)
            if fenced is not None:
                return fenced
            member.session_ends_at = now + self.settings.session_timeout_ms / 1000
            if ask.subscribed is not None and ask.subscribed != member.subscribed:
                member.subscribed = ask.subscribed
                changed = True
            regex = None if ask.subscribed_regex is None else ask.subscribed_regex or None
            if ask.subscribed_regex is not None and regex != member.regex:
                member.regex = regex
                changed = True
            if ask.server_assignor is not None and ask.server_assignor != member.server_assignor:
                member.server_assignor = ask.server_assignor
                changed = True
            if ask.rebalance_timeout_ms >= 0:
                member.rebalance_timeout_ms = ask.rebalance_timeout_ms
            if ask.rack_id is not None:
                member.rack_id = ask.rack_id
            if ask.instance_id is not None:
                member.instance_id = ask.instance_id
        matched = _matching(member.regex, topics)
        if matched != member.matched:
            member.matched = matched
            changed = True
        seen = _subscribed_topics(group, topics)
        if seen != group.topics:
            group.topics = seen
            changed = True
        if changed:
            group.epoch += 1
        if group.assignment_epoch < group.epoch:
            self._assign(group)
        before = (member.epoch, dict(member.assigned))
        self._reconcile(now, group, member, ask.owned)
        moved = before != (member.epoch, member.assigned)
        told = (
            ask.member_epoch == JOIN_EPOCH
            or moved
            or (
                ask.owned is not None
                and _without_empty(ask.owned) != _without_empty(member.assigned)
            )
        )
        return HeartbeatAnswer(
            ErrorCode.NONE,
            None,
            member.member_id,
            member.epoch,
            self.settings.heartbeat_interval_ms,
            dict(member.assigned) if told else None,
        )

    def _check(self, ask: HeartbeatAsk) -> HeartbeatAnswer | None:
        def invalid(why: str) -> HeartbeatAnswer:
            return self._refuse(ErrorCode.INVALID_REQUEST, why)

        if not ask.group_id:
            return invalid("GroupId can't be empty.")
        if ask.instance_id == "":
            return invalid("InstanceId can't be empty.")
        if ask.rack_id == "":
            return invalid("RackId can't be empty.")
        if ask.subscribed_regex:  # librdkafka sends "" for none
            try:
                re.compile(ask.subscribed_regex)
            except re.error as exc:
                return self._refuse(
                    ErrorCode.INVALID_REGULAR_EXPRESSION,
                    f"SubscribedTopicRegex {ask.subscribed_regex!r} is invalid: {exc}",
                )
        if ask.member_epoch > 0 or ask.member_epoch in (LEAVE_EPOCH, STATIC_LEAVE_EPOCH):
            if not ask.member_id:
                return invalid("MemberId can't be empty.")
        elif ask.member_epoch == JOIN_EPOCH:
            if ask.rebalance_timeout_ms < 0:
                return invalid("RebalanceTimeoutMs must be provided in first request.")
            if ask.owned is None or any(ask.owned.values()):
                return invalid("TopicPartitions must be empty when (re-)joining.")
            if not ask.subscribed and not ask.subscribed_regex:
                return invalid("SubscribedTopicNames or SubscribedTopicRegex must be set.")
        else:
            return invalid("MemberEpoch is invalid.")
        if ask.server_assignor is not None and ask.server_assignor not in ASSIGNORS:
            return self._refuse(
                ErrorCode.UNSUPPORTED_ASSIGNOR,
                f"ServerAssignor {ask.server_assignor} is not supported. "
                f"Supported assignors: {', '.join(ASSIGNORS)}.",
            )
        return None

    @staticmethod
    def _refuse(code: ErrorCode, why: str) -> HeartbeatAnswer:
        return HeartbeatAnswer(code, why)

    def _fenced(self, member: Member, ask: HeartbeatAsk) -> HeartbeatAnswer | None:
        if ask.member_epoch > member.epoch:
            why = f"epoch {ask.member_epoch} is ahead of the coordinator's {member.epoch}"
        elif ask.member_epoch < member.epoch and (
            ask.member_epoch != member.previous_epoch or not _within(ask.owned, member.assigned)
        ):
            why = f"epoch {ask.member_epoch} is behind the coordinator's {member.epoch}"
        else:
            return None
        return self._refuse(
            ErrorCode.FENCED_MEMBER_EPOCH, f"{why}: give up every partition and rejoin"
        )

    def _leave(self, ask: HeartbeatAsk) -> HeartbeatAnswer:
        group = self.groups.get(ask.group_id)
        if group is None or ask.member_id not in group.members:
            return self._refuse(
                ErrorCode.UNKNOWN_MEMBER_ID, f"no member {ask.member_id!r} in the group"
            )
        self._remove(group, ask.member_id)
        return HeartbeatAnswer(ErrorCode.NONE, None, ask.member_id, ask.member_epoch, 0)

    # ------------------------------------------------------------------ time

    def tick(self, now: float) -> list[tuple[str, str]]:
        """Remove members whose session ended, or that did not revoke within their
        rebalance timeout; returns (group, member) of each removed."""
        removed = []
        for group in self.groups.values():
            for member in list(group.members.values()):
                late_revoking = (
                    member.revocation_ends_at is not None and member.revocation_ends_at <= now
                )
                if member.session_ends_at <= now or late_revoking:
                    self._remove(group, member.member_id)
                    removed.append((group.group_id, member.member_id))
        return removed

    # ------------------------------------------------------------------ offsets

    def may_commit(self, group_id: str, member_id: str, epoch: int, version: int) -> ErrorCode:
        """Kafka's rule for a consumer group's OffsetCommit: a member at its current epoch,
        with OffsetCommit v9+; or anyone without an epoch while the group has no members."""
        group = self.groups.get(group_id)
        members = group.members if group is not None else {}
        if epoch < 0 and not members:
            return ErrorCode.NONE
        member = members.get(member_id)
        if member is None:
            return ErrorCode.UNKNOWN_MEMBER_ID
        if version < 9:
            return ErrorCode.UNSUPPORTED_VERSION
        if epoch != member.epoch:
            return ErrorCode.STALE_MEMBER_EPOCH
        return ErrorCode.NONE

    def may_fetch(self, group_id: str, member_id: str | None, epoch: int) -> ErrorCode:
        """Kafka's rule for a consumer group's OffsetFetch (v9+): a request that names a
        member (a consumer, not an admin: null id, epoch -1) must be from a member at its
        current epoch."""
        if member_id is None and epoch < 0:
            return ErrorCode.NONE
        group = self.groups.get(group_id)
        if group is None:
            return ErrorCode.NONE  # a classic group's, or only committed offsets
        member = group.members.get(member_id or "")
        if member is None:
            return ErrorCode.UNKNOWN_MEMBER_ID
        if epoch != member.epoch:
            return ErrorCode.STALE_MEMBER_EPOCH
        return ErrorCode.NONE

    # ------------------------------------------------------------------ assignment

    def _remove(self, group: ConsumerGroup, member_id: str) -> None:
        del group.members[member_id]
        group.target.pop(member_id, None)
        group.epoch += 1

    def _assign(self, group: ConsumerGroup) -> None:
        """A new target for every member at the group epoch."""
        subscriptions = {
            m.member_id: [group.topics[t] for t in m.topics() if t in group.topics]
            for m in group.members.values()
        }
        if group.assignor(self.settings.default_assignor) == RANGE:
            group.target = range_assignment(subscriptions)
        else:
            group.target = uniform_assignment(subscriptions, group.target)
        group.assignment_epoch = group.epoch

    def _reconcile(
        self, now: float, group: ConsumerGroup, member: Member, owned: Assignment | None
    ) -> None:
        """Move ``member`` toward its target: revocations first, then new partitions that
        no other member holds."""
        if member.state is MemberState.UNREVOKED_PARTITIONS:
            if owned is None or _overlaps(owned, member.revoking):
                return
            member.revoking = {}
            member.revocation_ends_at = None
        elif member.state is MemberState.STABLE and member.epoch == group.assignment_epoch:
            return
        target = group.target.get(member.member_id, {})
        lost = _minus(member.assigned, target)
        if lost:
            member.assigned = _intersect(member.assigned, target)
            member.revoking = lost
            member.state = MemberState.UNREVOKED_PARTITIONS
            member.revocation_ends_at = now + member.rebalance_timeout_ms / 1000
            return
        held = _held_by_others(group, member.member_id)
        wanted = _minus(target, member.assigned)
        free = {t: frozenset(p for p in ps if (t, p) not in held) for t, ps in wanted.items()}
        member.assigned = _union(member.assigned, free)
        if member.epoch != group.assignment_epoch:
            member.previous_epoch = member.epoch
            member.epoch = group.assignment_epoch
        unreleased = _minus(target, member.assigned)
        member.state = MemberState.UNRELEASED_PARTITIONS if unreleased else MemberState.STABLE


# --------------------------------------------------------------------------- assignors


def range_assignment(subscriptions: Mapping[str, list[TopicInfo]]) -> dict[str, Assignment]:
    """Per topic, its subscribers in member-id order take contiguous ranges of its
    partitions, the first ones one more when the count does not divide."""
    out: dict[str, Assignment] = {m: {} for m in subscriptions}
    topics = {t.topic_id: t for infos in subscriptions.values() for t in infos}
    for topic_id, info in sorted(topics.items(), key=lambda kv: kv[1].name):
        members = sorted(m for m, infos in subscriptions.items() if info in infos)
        each, extra = divmod(info.partitions, len(members))
        start = 0
        for i, member_id in enumerate(members):
            count = each + (1 if i < extra else 0)
            if count:
                out[member_id][topic_id] = frozenset(range(start, start + count))
            start += count
    return out


def uniform_assignment(
    subscriptions: Mapping[str, list[TopicInfo]], previous: Mapping[str, Assignment]
) -> dict[str, Assignment]:
    """Every partition of the subscribed topics to one of its subscribers, as evenly as
    the subscriptions allow, moving as few partitions from ``previous`` as it can: each
    keeps what it had, the rest go to the least loaded, then partitions move from the
    most loaded to a subscriber with at least two fewer until none can."""
    eligible: dict[tuple[bytes, int], list[str]] = {}
    for member_id in sorted(subscriptions):
        for info in subscriptions[member_id]:
            for p in range(info.partitions):
                eligible.setdefault((info.topic_id, p), []).append(member_id)
    owner: dict[tuple[bytes, int], str] = {}
    for member_id, had in previous.items():
        for topic_id, parts in had.items():
            for p in parts:
                if member_id in eligible.get((topic_id, p), ()):
                    owner[(topic_id, p)] = member_id
    load = {m: 0 for m in subscriptions}
    for member_id in owner.values():
        load[member_id] += 1
    for where in sorted(eligible):
        if where not in owner:
            chosen = min(eligible[where], key=lambda m: (load[m], m))
            owner[where] = chosen
            load[chosen] += 1
    moved = True
    while moved:
        moved = False
        for where in sorted(owner):
            current = owner[where]
            lightest = min(eligible[where], key=lambda m: (load[m], m))
            if load[lightest] + 1 < load[current]:
                owner[where] = lightest
                load[current] -= 1
                load[lightest] += 1
                moved = True
    out: dict[str, Assignment] = {m: {} for m in subscriptions}
    for (topic_id, p), member_id in owner.items():
        out[member_id][topic_id] = out[member_id].get(topic_id, frozenset()) | {p}
    return out


# --------------------------------------------------------------------------- helpers


def _matching(regex: str | None, topics: TopicView) -> tuple[str, ...]:
    if not regex:
        return ()
    pattern = re.compile(regex)  # checked when the heartbeat brought it
    return tuple(sorted(name for name in topics.names() if pattern.fullmatch(name)))


def _subscribed_topics(group: ConsumerGroup, topics: TopicView) -> dict[str, TopicInfo]:
    names = sorted({t for m in group.members.values() for t in m.topics()})
    found = {}
    for name in names:
        info = topics.lookup(name)
        if info is not None and info.partitions > 0:
            found[name] = info
    return found


def _held_by_others(group: ConsumerGroup, member_id: str) -> set[tuple[bytes, int]]:
    held: set[tuple[bytes, int]] = set()
    for other in group.members.values():
        if other.member_id == member_id:
            continue
        for part in (other.assigned, other.revoking):
            held.update((t, p) for t, ps in part.items() for p in ps)
    return held


def _without_empty(a: Assignment) -> Assignment:
    return {t: ps for t, ps in a.items() if ps}


def _minus(a: Assignment, b: Assignment) -> Assignment:
    return _without_empty({t: ps - b.get(t, frozenset()) for t, ps in a.items()})


def _intersect(a: Assignment, b: Assignment) -> Assignment:
    return _without_empty({t: ps & b.get(t, frozenset()) for t, ps in a.items()})


def _union(a: Assignment, b: Assignment) -> Assignment:
    return _without_empty(
        {t: a.get(t, frozenset()) | b.get(t, frozenset()) for t in a.keys() | b.keys()}
    )


def _overlaps(a: Assignment, b: Assignment) -> bool:
    return any(ps & b.get(t, frozenset()) for t, ps in a.items())


def _within(owned: Assignment | None, assigned: Assignment) -> bool:
    if owned is None:
        return False
    return not _minus(owned, assigned)


def assignment_of(pairs: Iterable[tuple[bytes, Iterable[int]]]) -> Assignment:
    """An assignment from (topic id, partitions) pairs, as a request lists them."""
    out: Assignment = {}
    for topic_id, parts in pairs:
        out[topic_id] = out.get(topic_id, frozenset()) | frozenset(parts)
    return out
