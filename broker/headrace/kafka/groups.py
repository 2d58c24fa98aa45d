"""Kafka's classic consumer groups: membership, rebalances and committed offsets (pure).

A group's members join, the coordinator (this broker) waits until every known
member has rejoined or the rebalance timeout passes, picks a protocol every member
supports, names a leader and answers every join of the new generation at once;
the leader computes the assignment (client side, as in Kafka) and sends it with
its sync, and every member's sync is answered with its own part. Heartbeats keep
a member's session; one that misses its session timeout is removed and the group
rebalances.

States, as Kafka names them (``DescribeGroups``)::

    Empty --join--> PreparingRebalance --all joined / timeout--> CompletingRebalance
    CompletingRebalance --leader's sync--> Stable
    Stable / CompletingRebalance --join, leave, expiry--> PreparingRebalance
    PreparingRebalance --last member gone--> Empty

The core holds no clock and no sockets: every call takes ``now`` (seconds), and
a request that must wait (a join during a rebalance, a follower's sync before
the leader's) is parked under the caller's token; the calls that complete them
return ``Reply`` values, which the adapter delivers. ``tick`` expires sessions
and ends rebalances whose time is up.

Static members (KIP-345) carry a ``group.instance.id``. One that restarts joins with
no member id and its instance id: it takes its old place under a new member id, with
its old assignment and in the current generation, and the other members see nothing
(a rebalance only if its protocols would change the group's). Whoever held the
instance id before is fenced: its requests get ``FENCED_INSTANCE_ID``. A static member
leaves by its instance id, or when its session times out.

Committed offsets live here too, per group; the adapter persists them before a
commit is answered.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass, field
from enum import Enum

from headrace.kafka.errors import ErrorCode
from headrace.kafka.wire import MalformedKafkaRequest, Reader

#: what a client's session timeout may be (Kafka's group.min/max.session.timeout.ms)
MIN_SESSION_TIMEOUT_MS = 6_000
MAX_SESSION_TIMEOUT_MS = 1_800_000

Token = Hashable


class GroupState(Enum):
    EMPTY = "Empty"
    PREPARING_REBALANCE = "PreparingRebalance"
    COMPLETING_REBALANCE = "CompletingRebalance"
    STABLE = "Stable"


@dataclass(frozen=True, slots=True)
class JoinAsk:
    group_id: str
    member_id: str  # "" for a new member
    client_id: str
    client_host: str
    session_timeout_ms: int
    rebalance_timeout_ms: int
    protocol_type: str
    protocols: tuple[tuple[str, bytes], ...]
    #: ``group.instance.id``: a static member's (KIP-345), None for a dynamic one
    group_instance_id: str | None = None


@dataclass(frozen=True, slots=True)
class JoinAnswer:
    error: ErrorCode
    generation: int = -1
    protocol_name: str = ""
    leader: str = ""
    member_id: str = ""
    #: the members and their metadata for the chosen protocol: only the leader's answer
    members: tuple[tuple[str, bytes], ...] = ()


@dataclass(frozen=True, slots=True)
class SyncAnswer:
    error: ErrorCode
    assignment: bytes = b""


@dataclass(frozen=True, slots=True)
class Reply:
    """The answer to a parked request, for the adapter to deliver."""

    token: Token
    answer: JoinAnswer | SyncAnswer


@dataclass(frozen=True, slots=True)
class Committed:
    offset: int
    leader_epoch: int
    metadata: str


@dataclass(slots=True)
class Member:
    member_id: str
    client_id: str
    client_host: str
    session_timeout_ms: int
    rebalance_timeout_ms: int
    protocols: tuple[tuple[str, bytes], ...]
    expires_at: float
    assignment: bytes = b""
    instance_id: str | None = None
    joining: Token | None = None
    syncing: Token | None = None

    def metadata_for(self, protocol: str) -> bytes:
        return next(meta for name, meta in self.protocols if name == protocol)


@dataclass(slots=True)
class Group:
    group_id: str
    state: GroupState = GroupState.EMPTY
    generation: int = 0
    protocol_type: str = ""
    protocol_name: str = ""
    leader: str = ""
    members: dict[str, Member] = field(default_factory=dict)
    rebalance_ends_at: float = 0.0
    offsets: dict[tuple[str, int], Committed] = field(default_factory=dict)


class Coordinator:
    """Every group this broker coordinates. ``new_member_id(client_id)`` names new members
    (the adapter's: unique across restarts)."""

    def __init__(self) -> None:
        self.groups: dict[str, Group] = {}

    # ------------------------------------------------------------------ membership

    def join(self, now: float, token: Token, ask: JoinAsk, new_id: str) -> list[Reply]:
        """A JoinGroup; ``new_id`` names the member if it is new. The join is answered
        through the returned replies, now or from a later call."""
        refused = _check_join(ask)
        if refused is not None:
            return [Reply(token, JoinAnswer(refused, member_id=ask.member_id))]
        group = self.groups.setdefault(ask.group_id, Group(ask.group_id))
        if group.members and (
            ask.protocol_type != group.protocol_type or not self._shares_a_protocol(group, ask)
        ):
            return [Reply(token, JoinAnswer(ErrorCode.INCONSISTENT_GROUP_PROTOCOL))]
        static = _static_member(group, ask.group_instance_id)
        if ask.member_id and static is not None and static.member_id != ask.member_id:
            return [Reply(token, JoinAnswer(ErrorCode.FENCED_INSTANCE_ID, member_id=ask.member_id))]
        if ask.member_id and ask.member_id not in group.members:
            return [Reply(token, JoinAnswer(ErrorCode.UNKNOWN_MEMBER_ID, member_id=ask.member_id))]
        if not ask.member_id and static is not None:
            return self._rejoin_static(now, token, group, static, ask, new_id)
        replies: list[Reply] = []
        member_id = ask.member_id or new_id
        member = group.members.get(member_id)
        if member is None:
            member = Member(
                member_id,
                ask.client_id,
                ask.client_host,
                ask.session_timeout_ms,
                ask.rebalance_timeout_ms,
                ask.protocols,
                now + ask.session_timeout_ms / 1000,
                instance_id=ask.group_instance_id,
            )
            group.members[member_id] = member
        elif member.joining is not None:
            # a retried join replaces the parked one, which is answered as superseded
            replies.append(Reply(member.joining, JoinAnswer(ErrorCode.REBALANCE_IN_PROGRESS)))
        member.protocols = ask.protocols
        member.session_timeout_ms = ask.session_timeout_ms
        member.rebalance_timeout_ms = ask.rebalance_timeout_ms
        member.expires_at = now + ask.session_timeout_ms / 1000
        member.joining = token
        group.protocol_type = ask.protocol_type
        if group.state is not GroupState.PREPARING_REBALANCE:
            replies += self._prepare_rebalance(now, group)
        return replies + self._complete_join_if_ready(group)

    def sync(
        self,
        now: float,
        token: Token,
        group_id: str,
        generation: int,
        member_id: str,
        assignments: dict[str, bytes],
        instance_id: str | None = None,
    ) -> list[Reply]:
        group = self.groups.get(group_id)
        if _fenced(group, instance_id, member_id):
            return [Reply(token, SyncAnswer(ErrorCode.FENCED_INSTANCE_ID))]
        member = group.members.get(member_id) if group else None
        if group is None or member is None:
            return [Reply(token, SyncAnswer(ErrorCode.UNKNOWN_MEMBER_ID))]
        if generation != group.generation:
            return [Reply(token, SyncAnswer(ErrorCode.ILLEGAL_GENERATION))]
        member.expires_at = now + member.session_timeout_ms / 1000
        if group.state is GroupState.PREPARING_REBALANCE:
            return [Reply(token, SyncAnswer(ErrorCode.REBALANCE_IN_PROGRESS))]
        if group.state is GroupState.STABLE:
            return [Reply(token, SyncAnswer(ErrorCode.NONE, member.assignment))]
        member.syncing = token
        if member_id != group.leader:
            return []
        for each in group.members.values():
            each.assignment = assignments.get(each.member_id, b"")
        group.state = GroupState.STABLE
        replies = []
        for each in group.members.values():
            if each.syncing is not None:
                replies.append(Reply(each.syncing, SyncAnswer(ErrorCode.NONE, each.assignment)))
                each.syncing = None
        return replies

    def heartbeat(
        self,
        now: float,
        group_id: str,
        generation: int,
        member_id: str,
        instance_id: str | None = None,
    ) -> ErrorCode:
        group = self.groups.get(group_id)
        if _fenced(group, instance_id, member_id):
            return ErrorCode.FENCED_INSTANCE_ID
        member = group.members.get(member_id) if group else None
        if group is None or member is None:
            return ErrorCode.UNKNOWN_MEMBER_ID
        if generation != group.generation:
            return ErrorCode.ILLEGAL_GENERATION
        member.expires_at = now + member.session_timeout_ms / 1000
        if group.state is GroupState.PREPARING_REBALANCE:
            return ErrorCode.REBALANCE_IN_PROGRESS
        return ErrorCode.NONE

    def leave(
        self, now: float, group_id: str, member_id: str, instance_id: str | None = None
    ) -> tuple[ErrorCode, list[Reply]]:
        """A LeaveGroup's member: by its member id, or (v3+) by its instance id, where a
        member id given too must be the instance's."""
        group = self.groups.get(group_id)
        if group is None:
            return ErrorCode.UNKNOWN_MEMBER_ID, []
        if instance_id is not None:
            static = _static_member(group, instance_id)
            if static is None:
                return ErrorCode.UNKNOWN_MEMBER_ID, []
            if member_id and member_id != static.member_id:
                return ErrorCode.FENCED_INSTANCE_ID, []
            member_id = static.member_id
        if member_id not in group.members:
            return ErrorCode.UNKNOWN_MEMBER_ID, []
        return ErrorCode.NONE, self._remove(now, group, member_id)

    def tick(self, now: float) -> list[Reply]:
        """Expire sessions and end rebalances whose time is up."""
        replies: list[Reply] = []
        for group in list(self.groups.values()):
            for member in list(group.members.values()):
                # a member parked in a join is waiting for the others, not silent
                if member.joining is None and member.expires_at <= now:
                    replies += self._remove(now, group, member.member_id)
            if group.state is GroupState.PREPARING_REBALANCE and group.rebalance_ends_at <= now:
                for member in list(group.members.values()):
                    if member.joining is None:
                        del group.members[member.member_id]
                replies += self._complete_join_if_ready(group)
        return replies

    # ------------------------------------------------------------------ offsets

    def may_commit(
        self, group_id: str, generation: int, member_id: str, instance_id: str | None = None
    ) -> ErrorCode:
        """Whether a commit is accepted: from a member of the current generation, or from
        a consumer outside any generation (generation -1) while the group has no members.
        As Kafka's coordinator: a rebalance being prepared still takes the current
        generation's commits (what a member processed before it gives its partitions up);
        between the join and the sync the new generation has no assignment to commit."""
        group = self.groups.get(group_id)
        if _fenced(group, instance_id, member_id):
            return ErrorCode.FENCED_INSTANCE_ID
        if generation < 0 and not member_id:
            if group is not None and group.members:
                return ErrorCode.ILLEGAL_GENERATION
            return ErrorCode.NONE
        if group is None or member_id not in group.members:
            return ErrorCode.UNKNOWN_MEMBER_ID
        if generation != group.generation:
            return ErrorCode.ILLEGAL_GENERATION
        if group.state is GroupState.COMPLETING_REBALANCE:
            return ErrorCode.REBALANCE_IN_PROGRESS
        return ErrorCode.NONE

    def commit(self, group_id: str, topic: str, partition: int, committed: Committed) -> None:
        group = self.groups.setdefault(group_id, Group(group_id))
        group.offsets[(topic, partition)] = committed

    def committed(self, group_id: str) -> dict[tuple[str, int], Committed]:
        group = self.groups.get(group_id)
        return dict(group.offsets) if group else {}

    def restore(self, group_id: str, offsets: dict[tuple[str, int], Committed]) -> None:
        """Offsets read back from disk at start."""
        self.groups.setdefault(group_id, Group(group_id)).offsets.update(offsets)

    def delete(self, group_id: str) -> ErrorCode:
        group = self.groups.get(group_id)
        if group is None:
            return ErrorCode.GROUP_ID_NOT_FOUND
        if group.members:
            return ErrorCode.NON_EMPTY_GROUP
        del self.groups[group_id]
        return ErrorCode.NONE

    def delete_offsets(
        self, group_id: str, partitions: list[tuple[str, int]]
    ) -> tuple[ErrorCode, dict[tuple[str, int], ErrorCode]]:
        """Kafka's OffsetDelete: forget the group's committed offsets of ``partitions``.

        As Kafka's coordinator decides: an empty group forgets any of them. A group with
        members keeps those of the topics its members subscribe to, each answered
        ``GROUP_SUBSCRIBED_TO_TOPIC``, and forgets the others. A group whose members'
        subscriptions cannot be read (another protocol type than ``consumer``) refuses
        the whole request with ``NON_EMPTY_GROUP``. An offset that was not committed is
        forgotten all the same (Kafka answers it with no error too)."""
        group = self.groups.get(group_id)
        if group is None:
            return ErrorCode.GROUP_ID_NOT_FOUND, {}
        subscribed: set[str] = set()
        if group.members:
            if group.protocol_type != "consumer":
                return ErrorCode.NON_EMPTY_GROUP, {}
            try:
                for member in group.members.values():
                    for _, metadata in member.protocols:
                        subscribed.update(subscribed_topics(metadata))
            except MalformedKafkaRequest:
                return ErrorCode.NON_EMPTY_GROUP, {}
        results = {}
        for topic, partition in partitions:
            if topic in subscribed:
                results[(topic, partition)] = ErrorCode.GROUP_SUBSCRIBED_TO_TOPIC
            else:
                group.offsets.pop((topic, partition), None)
                results[(topic, partition)] = ErrorCode.NONE
        return ErrorCode.NONE, results

    # ------------------------------------------------------------------ the rebalance

    def _rejoin_static(
        self, now: float, token: Token, group: Group, member: Member, ask: JoinAsk, new_id: str
    ) -> list[Reply]:
        """A static member joining with no member id (a restart): it takes ``member``'s
        place under ``new_id``, and the previous holder's parked requests are fenced."""
        replies: list[Reply] = []
        if member.joining is not None:
            replies.append(Reply(member.joining, JoinAnswer(ErrorCode.FENCED_INSTANCE_ID)))
        if member.syncing is not None:
            replies.append(Reply(member.syncing, SyncAnswer(ErrorCode.FENCED_INSTANCE_ID)))
        member.joining = member.syncing = None
        leader_before = group.leader
        old_id = member.member_id
        # same place in the order: the roster and the choice of a leader stay as they were
        group.members = {(new_id if k == old_id else k): m for k, m in group.members.items()}
        member.member_id = new_id
        if group.leader == old_id:
            group.leader = new_id
        member.client_id = ask.client_id
        member.client_host = ask.client_host
        member.protocols = ask.protocols
        member.session_timeout_ms = ask.session_timeout_ms
        member.rebalance_timeout_ms = ask.rebalance_timeout_ms
        member.expires_at = now + ask.session_timeout_ms / 1000
        if group.state is GroupState.STABLE and _choose_protocol(group) == group.protocol_name:
            # As Kafka answers it: the current generation, and the leader id from before,
            # so that a restarted leader does not compute an assignment the stable group
            # would never hand out; its sync gets its old assignment.
            answer = JoinAnswer(
                ErrorCode.NONE,
                group.generation,
                group.protocol_name,
                leader_before,
                new_id,
            )
            return [*replies, Reply(token, answer)]
        member.joining = token
        if group.state is not GroupState.PREPARING_REBALANCE:
            replies += self._prepare_rebalance(now, group)
        return replies + self._complete_join_if_ready(group)

    @staticmethod
    def _shares_a_protocol(group: Group, ask: JoinAsk) -> bool:
        names = {name for name, _ in ask.protocols}
        return all(
            names & {name for name, _ in member.protocols}
            for member in group.members.values()
            if member.member_id != ask.member_id
        )

    def _prepare_rebalance(self, now: float, group: Group) -> list[Reply]:
        replies = []
        for member in group.members.values():
            if member.syncing is not None:
                replies.append(Reply(member.syncing, SyncAnswer(ErrorCode.REBALANCE_IN_PROGRESS)))
                member.syncing = None
        group.state = GroupState.PREPARING_REBALANCE
        longest = max(m.rebalance_timeout_ms for m in group.members.values())
        group.rebalance_ends_at = now + longest / 1000
        return replies

    def _complete_join_if_ready(self, group: Group) -> list[Reply]:
        if group.state is not GroupState.PREPARING_REBALANCE:
            return []
        if any(m.joining is None for m in group.members.values()):
            return []
        if not group.members:
            group.state = GroupState.EMPTY
            group.generation += 1
            group.leader = group.protocol_name = ""
            return []
        group.generation += 1
        group.state = GroupState.COMPLETING_REBALANCE
        if group.leader not in group.members:
            group.leader = next(iter(group.members))
        group.protocol_name = _choose_protocol(group)
        roster = tuple(
            (m.member_id, m.metadata_for(group.protocol_name)) for m in group.members.values()
        )
        replies = []
        for member in group.members.values():
            assert member.joining is not None
            replies.append(
                Reply(
                    member.joining,
                    JoinAnswer(
                        ErrorCode.NONE,
                        group.generation,
                        group.protocol_name,
                        group.leader,
                        member.member_id,
                        roster if member.member_id == group.leader else (),
                    ),
                )
            )
            member.joining = None
        return replies

    def _remove(self, now: float, group: Group, member_id: str) -> list[Reply]:
        member = group.members.pop(member_id)
        replies = []
        if member.joining is not None:
            replies.append(Reply(member.joining, JoinAnswer(ErrorCode.UNKNOWN_MEMBER_ID)))
        if member.syncing is not None:
            replies.append(Reply(member.syncing, SyncAnswer(ErrorCode.UNKNOWN_MEMBER_ID)))
        if not group.members:
            group.state = GroupState.EMPTY
            group.generation += 1
            group.leader = group.protocol_name = ""
            return replies
        if group.state is GroupState.PREPARING_REBALANCE:
            return replies + self._complete_join_if_ready(group)
        return replies + self._prepare_rebalance(now, group)


def _static_member(group: Group, instance_id: str | None) -> Member | None:
    if instance_id is None:
        return None
    return next((m for m in group.members.values() if m.instance_id == instance_id), None)


def _fenced(group: Group | None, instance_id: str | None, member_id: str) -> bool:
    """Whether a request naming ``instance_id`` comes from a member that no longer holds it
    (another member joined with that instance id since)."""
    static = _static_member(group, instance_id) if group is not None else None
    return static is not None and static.member_id != member_id


def _check_join(ask: JoinAsk) -> ErrorCode | None:
    if not ask.group_id:
        return ErrorCode.INVALID_GROUP_ID
    if not MIN_SESSION_TIMEOUT_MS <= ask.session_timeout_ms <= MAX_SESSION_TIMEOUT_MS:
        return ErrorCode.INVALID_SESSION_TIMEOUT
    if not ask.protocol_type or not ask.protocols:
        return ErrorCode.INCONSISTENT_GROUP_PROTOCOL
    return None


def _choose_protocol(group: Group) -> str:
    """The protocol every member supports that most members list first (ties: the
    leader's order), as Kafka's vote picks it."""
    members = list(group.members.values())
    common = set.intersection(*({name for name, _ in m.protocols} for m in members))
    leader = group.members[group.leader]
    ranked = [name for name, _ in leader.protocols if name in common]

    def votes(name: str) -> int:
        return sum(next(n for n, _ in m.protocols if n in common) == name for m in members)

    return max(ranked, key=lambda name: (votes(name), -ranked.index(name)))


def subscribed_topics(metadata: bytes) -> list[str]:
    """The topics of a consumer's subscription (the ``consumer`` protocol type's member
    metadata: a version, then the topic names; later fields are not needed)."""
    r = Reader(metadata)
    r.int16()  # the subscription's version: the topics come first in every one
    topics = []
    for _ in range(r.int32()):
        name = r.string(compact=False)
        if name is None:
            raise MalformedKafkaRequest("a null topic in a consumer's subscription")
        topics.append(name)
    return topics
