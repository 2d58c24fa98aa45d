"""A partition leader's live replica set (LRS) and high watermark (pure).

Theory of operation
-------------------
Followers pull: each fetch names the offset the follower wants next, which is
its log end offset (LEO). From those the leader keeps, per follower, its LEO
and the last time it was *caught up* (its LEO reached the leader's LEO as of
that fetch). The high watermark (HW) is the smallest LEO over the LRS,
leader included: every LRS member has every record below it, so it is what
``acks=all`` waits for and what committed reads may see. It never goes back.

    event                                     effect
    ----------------------------------------  ---------------------------------------------
    fetch from f at offset o                  f.leo = o; if o >= leader LEO: f.caught_up = now
    fetch from f not in LRS, o >= HW          f re-enters the LRS (it has everything committed)
    tick: f in LRS, now - f.caught_up > lag   f leaves the LRS (HW may advance once the
                                              controller has recorded it: below)
    tick: f in LRS, now - f.fetched > silence f leaves the LRS (it stopped fetching: dead)
    tick: f in LRS, leader LEO - f.leo > max  f leaves the LRS (record-count bound, if set)
    become leader                             LRS = (controller's LRS within replicas) plus the leader;
                                              every follower starts "caught up now" (grace)
    a push names the controller's LRS         ``recorded`` := it (``record_controllers``)
    session fetch from f, at time t           (``fetched_ms[f] = t``) a fetch at f's known LEO:
                                              counts as fetched at t, and caught up at t if
                                              that LEO is the leader's; f rejoins (``rejoin``)
    replica set changes (a move)              an added follower starts outside the LRS at LEO 0
                                              and enters it like any other (fetch at >= HW); a
                                              removed one leaves the LRS and is forgotten
    a move this leader has not seen starts    every follower outside the controller's LRS
      (``move_generation`` is new)            starts over as an added one (see ``reassign``)

A fetch session (``protocol.replication``) names a partition only when the
follower's position in it changed; every fetch over the session is still
proof that the follower is alive and, where its known LEO is the leader's,
caught up, for the partitions the session holds (a partition the follower
stopped fetching is forgotten from it, and then falls silent). ``fetched_ms``
(the last session fetch of each follower broker whose session holds the
partition) carries that to ``tick`` and ``rejoin`` without touching every
partition on every fetch.

The leader never removes itself. Followers outside ``replicas`` are ignored.

The HW waits for the LRS *and* for every member of the LRS the controller last recorded
(``recorded``, pushed with each topology). The controller elects among the LRS it has
recorded, so a follower this leader dropped may still be elected until the controller
has recorded its removal (from this leader's heartbeat) and pushed it back: records it
lacks are not committed before then, or that election would lose acknowledged writes (a
follower dies, the leader drops it and acknowledges on, then the leader and the other
follower go down before the controller heard, and the dead one comes back first). A
member joining needs no such wait: it only makes the HW wait for more. A leader without
a controller (``recorded`` None) goes by its own LRS.

Two clocks, because a dead follower and a slow one are different failures. A
follower that keeps fetching but trails the leader gets ``lag_max_ms`` (10 s)
to catch up before it is dropped. A follower that stops fetching altogether
has died or lost the network: a live one fetches at least once per long-poll
wait (500 ms by default), so ``fetch_silence_max_ms`` (3 s) of silence is
proof enough, and dropping it then lets the HW move on for ``acks=all``
producers instead of stalling them for the whole lag bound. An idle follower
is always caught up, so only the silence bound can notice that it is gone.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field


@dataclass(slots=True)
class FollowerProgress:
    leo: int = 0
    last_fetch_ms: int = 0
    last_caught_up_ms: int = 0


@dataclass(slots=True)
class LeaderReplicaSet:
    leader_id: int
    replicas: list[int]
    lrs: set[int]
    high_watermark: int
    #: a follower not caught up for this long leaves the LRS
    lag_max_ms: int = 10_000
    #: a follower this many records behind leaves the LRS; -1 = no record bound
    lag_max_records: int = -1
    #: a follower that has not fetched for this long leaves the LRS
    fetch_silence_max_ms: int = 3_000
    followers: dict[int, FollowerProgress] = field(default_factory=dict)
    #: the topology generation that started the partition's move in flight, as last
    #: pushed (0: no move, or a controller that does not say)
    move_generation: int = 0
    #: the LRS the controller last recorded, as pushed (``record_controllers``); None: no
    #: controller has said
    recorded: set[int] | None = None

    @classmethod
    def become_leader(
        cls,
        leader_id: int,
        replicas: list[int],
        lrs: list[int],
        high_watermark: int,
        now_ms: int,
        *,
        lag_max_ms: int = 10_000,
        lag_max_records: int = -1,
        fetch_silence_max_ms: int = 3_000,
        move_generation: int = 0,
    ) -> LeaderReplicaSet:
        members = {r for r in lrs if r in replicas} | {leader_id}
        followers = {r: FollowerProgress(0, now_ms, now_ms) for r in replicas if r != leader_id}
        return cls(
            leader_id,
            list(replicas),
            members,
            high_watermark,
            lag_max_ms,
            lag_max_records,
            fetch_silence_max_ms,
            followers,
            move_generation,
            set(members),
        )

    def record_controllers(self, lrs: Collection[int]) -> bool:
        """The controller's LRS, as a push names it (see the module). True if it changed
        what the HW waits for."""
        recorded = {r for r in lrs if r in self.replicas}
        if recorded == self.recorded:
            return False
        self.recorded = recorded
        return True

    def reassign(
        self,
        replicas: list[int],
        now_ms: int,
        *,
        in_sync: Collection[int] | None = None,
        move_generation: int = 0,
    ) -> bool:
        """The replica set changed under this leader (a move, ``control.moves``). True if
        the LRS changed.

        An added follower is *not* in the LRS: it holds nothing yet, and admitting it
        would hold the HW (and every ``acks=all`` producer) back until it had copied the
        whole log. It enters once it has fetched up to the HW, as a returning follower
        does. A removed follower leaves at once, so the HW no longer waits for it.

        ``move_generation`` and ``in_sync`` (the controller's LRS, pushed with it): when
        a move this leader has not seen yet starts, every follower outside ``in_sync``
        starts over as an added one, out of the LRS at LEO 0, and must fetch again to
        count as in sync. A leader that missed the push removing broker B from the
        partition, then got the one adding it back, saw B stay a member throughout; B
        dropped its copy in between and starts empty, but its old progress here would
        keep it in the LRS, and the move would complete on it. The
        controller's LRS never names a replica the move adds, so B is reset; an old
        member the controller had not yet heard was in sync is reset too, and re-enters
        at its next fetch (its session position, ``broker.replicating``).
        """
        before = set(self.lrs)
        self.replicas = list(replicas)
        if move_generation and move_generation != self.move_generation and in_sync is not None:
            for r in self.followers:
                if r not in in_sync:
                    self.followers[r] = FollowerProgress(0, now_ms, now_ms)
                    self.lrs.discard(r)
        self.move_generation = move_generation
        for r in replicas:
            if r != self.leader_id and r not in self.followers:
                self.followers[r] = FollowerProgress(0, now_ms, now_ms)
        for r in list(self.followers):
            if r not in replicas:
                del self.followers[r]
        self.lrs = {r for r in self.lrs if r in replicas or r == self.leader_id}
        return self.lrs != before

    def on_fetch(self, follower: int, fetch_offset: int, leader_leo: int, now_ms: int) -> bool:
        """Record a follower's fetch. Returns True if the LRS changed."""
        progress = self.followers.get(follower)
        if progress is None:
            return False
        progress.leo = fetch_offset
        progress.last_fetch_ms = now_ms
        if fetch_offset >= leader_leo:
            progress.last_caught_up_ms = now_ms
        if (
            follower not in self.lrs
            and fetch_offset >= self.high_watermark
            and self._within_record_bound(fetch_offset, leader_leo)
        ):
            self.lrs.add(follower)
            return True
        return False

    def tick(
        self, leader_leo: int, now_ms: int, fetched_ms: Mapping[int, int] | None = None
    ) -> set[int]:
        """Drop followers that lag too long or too far, or stopped fetching. The removed ones.

        ``fetched_ms``: each follower broker's last fetch over its session (see the module).
        """
        removed = set()
        for follower in sorted(self.lrs - {self.leader_id}):
            progress = self.followers[follower]
            last_fetch = self._last_fetch(follower, progress, fetched_ms)
            caught_up = progress.last_caught_up_ms
            if progress.leo >= leader_leo:
                caught_up = max(caught_up, last_fetch)
            too_slow = now_ms - caught_up > self.lag_max_ms
            too_far = not self._within_record_bound(progress.leo, leader_leo)
            silent = now_ms - last_fetch > self.fetch_silence_max_ms
            if too_slow or too_far or silent:
                self.lrs.discard(follower)
                removed.add(follower)
        return removed

    def rejoin(self, leader_leo: int, now_ms: int, fetched_ms: Mapping[int, int]) -> set[int]:
        """Re-admit followers outside the LRS that fetch over their session and hold
        everything committed: what ``on_fetch`` does for a position sent again, for one
        that has not changed (an idle partition). The re-admitted ones."""
        added = set()
        for follower, progress in self.followers.items():
            if follower in self.lrs:
                continue
            last_fetch = self._last_fetch(follower, progress, fetched_ms)
            if (
                now_ms - last_fetch <= self.fetch_silence_max_ms
                and progress.leo >= self.high_watermark
                and self._within_record_bound(progress.leo, leader_leo)
            ):
                self.lrs.add(follower)
                added.add(follower)
        return added

    @staticmethod
    def _last_fetch(
        follower: int, progress: FollowerProgress, fetched_ms: Mapping[int, int] | None
    ) -> int:
        if fetched_ms is None:
            return progress.last_fetch_ms
        return max(progress.last_fetch_ms, fetched_ms.get(follower, progress.last_fetch_ms))

    def advance(self, leader_leo: int) -> bool:
        """Recompute the HW from the LRS and the controller's (see the module); True if it
        moved (it only moves forward)."""
        waited_for = self.lrs | (self.recorded or set())
        candidate = min(
            [leader_leo, *(p.leo for f, p in self.followers.items() if f in waited_for)]
        )
        if candidate > self.high_watermark:
            self.high_watermark = candidate
            return True
        return False

    def _within_record_bound(self, follower_leo: int, leader_leo: int) -> bool:
        return self.lag_max_records < 0 or leader_leo - follower_leo <= self.lag_max_records

    def sorted_lrs(self) -> list[int]:
        return sorted(self.lrs)
