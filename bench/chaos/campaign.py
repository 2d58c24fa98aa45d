"""The fault campaign's driver: a real local cluster, keyed acks=all load, a cohort, kill -9
and SIGSTOP.

One run:

1. ``headrace local up`` (3 brokers and the controller, on free ports) and a
   topic of ``partitions`` x 3 replicas, minInSync 2, tiered (Unloads need it).
2. Three cohort members (``Consumer``) join with ``start=earliest`` and write a
   delivery log each (``member-N.log``: ``partition offset value`` per line);
   they ack a batch after logging it (at-least-once).
3. One producer (acks=all, idempotent) sends records of ``keys`` keys round
   robin, each value ``key:seq`` with a per-key sequence number.
4. Each round picks, from ``random.Random(seed)``, a target: the ``leader``
   or a ``follower`` of a random partition, the ``controller``, ``unload``
   (an Unload of a random partition; its leader is killed while the seal marker
   is set, if the poll catches it), or ``cutover`` (a Repartition growing the
   topic by one partition; the leader of a random old partition is killed while
   the transition marker is set, if the poll catches it), or ``pause`` (the
   leader of a random partition is stopped with SIGSTOP: it keeps accepting
   connections and answers nothing, then resumes with whatever it had
   received). The victim is kill -9'd (or paused), restarted (or resumed) after
   a random delay, and the round ends when every
   partition is back to a full live replica set (and the Unload, if any,
   finished): that time is measured. A cutover round then waits for its
   Repartition to finalize before the next round.
5. At the end the load stops, the cohort drains, every partition is read back
   with plain FETCHes from offset 0, and ``checking.check`` gives the verdict,
   including each key's order across partitions in the cohort's delivery order
   (a key moves to another partition at a cutover).

The seed is printed first; the same seed gives the same sequence of targets
and delays (the timing of the load around them is the machine's).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import random
import signal
import statistics
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from bench.chaos import checking
from bench.chaos.runner import (
    Cohort,
    RunSettings,
    cluster_up,
    play_rounds,
    read_back,
    rounds_by_target,
)
from bench.chaos.traffic import KeyedTraffic
from headrace.client import Producer
from tests.integration.localcluster import LocalCluster, topic_manifest

log = logging.getLogger("chaos")

TOPIC_NAME = "chaos"
TOPIC = f"default/{TOPIC_NAME}"
COHORT = "chaos-readers"
#: the targets of every campaign before ``repartition`` existed: a seed still draws the same
#: rounds from them (``Settings.targets``)
CLASSIC_TARGETS = ("leader", "follower", "controller", "unload", "cutover", "pause")
#: a repartition round runs one of these (drawn by the seed): a grow with two brokers killed
#: at once mid-transition, a shrink with the controller killed mid-transition, or a shrink
#: then a grow back to the same count (the retired partition numbers come back)
REPARTITION_KINDS = ("grow-double-kill", "shrink-controller-kill", "shrink-grow-back")
TARGETS = (*CLASSIC_TARGETS, "repartition")


@dataclass(frozen=True, slots=True)
class Settings(RunSettings):
    #: the victim stays dead for uniform(min, max) seconds
    restart_delay_s: tuple[float, float] = (0.2, 3.0)
    #: a paused leader stays stopped for uniform(min, max) seconds: around the 3 s liveness
    #: TTL, so some pauses end before a failover and some after it (the old leader then
    #: resumes holding produce requests that were resent to the new one)
    pause_s: tuple[float, float] = (1.0, 10.0)
    #: a round fails if the cluster is not back to full LRS within this (the target is 10 s)
    recovery_timeout_s: float = 60.0
    #: after the load stops: how long the cohort may take to deliver everything acknowledged
    drain_timeout_s: float = 120.0
    members: int = 3
    #: how long to load before the first fault (members joined, producer warmed up)
    warmup_s: float = 1.0
    #: wait for a restarted broker's /readyz before judging the LRS; without it the next
    #: round may kill a second broker while the first is still starting (overlapping faults,
    #: a harsher campaign: two of three replicas down at once)
    wait_ready: bool = True
    #: cutover rounds grow the topic by one partition up to this many; beyond, a cutover
    #: round kills a leader without a repartition (noted in the round)
    max_partitions: int = 12
    #: a cutover round's Repartition finalizes at the latest this long after its drain,
    #: even if a client has not acknowledged the new routing (the default is 30 s)
    adoption_timeout_s: int = 5
    #: how long a cutover round waits for its Repartition to finalize
    finalize_timeout_s: float = 120.0
    #: the targets rounds are drawn from
    targets: tuple[str, ...] = TARGETS
    #: a repartition round shrinks the topic to no fewer partitions than this
    min_partitions: int = 2
    #: after the checks of the running cohort: a fresh cohort reads everything from the
    #: earliest offsets, within this long
    fresh_cohort_timeout_s: float = 120.0


@dataclass(slots=True)
class Round:
    index: int
    target: str
    partition: int
    victim: str
    down_s: float
    #: from the restart to every partition back at a full LRS (None: not within the timeout)
    recovery_s: float | None = None
    #: unload rounds: whether the kill landed while the seal marker was set
    mid_seal: bool | None = None
    #: cutover rounds: the transition's phase when the victim was killed (None: the marker
    #: was not seen, or the round did not repartition), and the partition counts
    mid_cutover: str | None = None
    partitions_before: int | None = None
    partitions_after: int | None = None
    #: cutover rounds: from the restart to the Repartition finalized
    finalize_s: float | None = None
    #: broker rounds: whether the controller dropped the victim from an LRS while it was dead
    #: (if not, the cluster never left a full LRS and ``recovery_s`` is about 0)
    left_lrs: bool | None = None
    #: repartition rounds: which kind (``REPARTITION_KINDS``)
    kind: str | None = None
    #: from the restart (or the round's end of faults) to the next acknowledged produce
    produce_resumed_s: float | None = None
    note: str = ""


def full_lrs(cluster: LocalCluster) -> bool:
    """Every partition Online with a leader and every replica in its live replica set,
    and no Unload in flight (a transition may be: it ends at finalize, not at recovery)."""
    state = cluster.state()
    topics = (state.get("cluster") or {}).get("topics") or []
    parts: list[dict[str, Any]] = next((t["partitions"] for t in topics if t["name"] == TOPIC), [])
    if not parts:
        return False
    moving = any(
        (u.get("status") or {}).get("phase") not in ("Completed", "Failed")
        for u in state.get("unloads") or []
    )
    return not moving and all(
        p["state"] == "Online"
        and p["leader"] is not None
        and sorted(p["liveReplicas"]) == sorted(p["replicas"])
        for p in parts
    )


def broker_ready(cluster: LocalCluster, broker: int) -> bool:
    """The broker's admin port answers /readyz with 200 (a refused connection: not yet)."""
    b = next(b for b in cluster.record["brokers"] if b["id"] == broker)
    try:
        with urllib.request.urlopen(
            f"http://{b['host']}:{b['admin_port']}/readyz", timeout=2
        ) as resp:
            return bool(resp.status == 200)
    except urllib.error.HTTPError:
        return False


def repartition_manifest(name: str, partitions: int, adoption_timeout_s: int) -> str:
    return (
        "apiVersion: headrace.dev/v1alpha1\nkind: Repartition\n"
        f"metadata: {{name: {name}}}\n"
        f"spec:\n  topicRef: {{name: {TOPIC_NAME}}}\n  partitions: {partitions}\n"
        f"  adoptionTimeoutSeconds: {adoption_timeout_s}\n"
    )


def post_manifest(controller_url: str, manifest: str) -> tuple[int, Any]:
    """``POST /v1/apply`` (what ``headrace apply`` does, without a process start)."""
    req = urllib.request.Request(
        f"{controller_url}/v1/apply",
        data=manifest.encode(),
        method="POST",
        headers={"Content-Type": "application/yaml"},
    )
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, json.loads(resp.read() or b"null")
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode(errors="replace")


def repartition_phase(cluster: LocalCluster, name: str) -> str | None:
    for doc in cluster.state().get("repartitions") or []:
        if doc["metadata"]["name"] == name:
            return (doc.get("status") or {}).get("phase")
    return None


def unload_manifest(name: str, partition: int) -> str:
    return (
        "apiVersion: headrace.dev/v1alpha1\nkind: Unload\n"
        f"metadata: {{name: {name}}}\n"
        f"spec:\n  topicRef: {{name: {TOPIC_NAME}}}\n  partitions: [{partition}]\n"
    )


class Campaign:
    def __init__(
        self, directory: Path, settings: Settings, progress: Callable[[str], None] = print
    ) -> None:
        self.dir = directory
        self.settings = settings
        self.rng = random.Random(settings.seed)
        self.progress = progress
        self.cluster = LocalCluster(directory / "local", 3)
        self.rounds: list[Round] = []
        self.traffic = KeyedTraffic(TOPIC, settings.keys, settings.burst, settings.tick_s)
        #: the topic's partition count (cutover and repartition rounds change it)
        self.partitions = settings.partitions
        #: the most partitions the topic ever had: a shrink retires partitions for routing,
        #: not for reading, so every one of them is read back at the end
        self.partitions_ever = settings.partitions
        #: (monotonic time, routing count) at every applied Repartition: a partition takes
        #: no records while retired, which is no stall
        self.routing_counts: list[tuple[float, int]] = [(0.0, settings.partitions)]
        #: set to end ``_catch_transition`` early (its Repartition was refused)
        self._stop_watch = False
        #: each member's gates (partition -> epoch) when the drain ended
        self.final_assignments: dict[str, dict[int, int]] = {}
        #: each member's background tasks (heartbeats, topology following) when the drain ended
        self.member_tasks: dict[str, list[str]] = {}

    # ------------------------------------------------------------------ the run

    async def run(self) -> dict[str, Any]:
        s = self.settings
        self.progress(f"chaos: seed {s.seed}, {s.rounds} rounds, directory {self.dir}")
        started = time.monotonic()
        async with cluster_up(self.cluster):
            return await self._run_on_cluster(started)

    async def _run_on_cluster(self, started: float) -> dict[str, Any]:
        s = self.settings
        c = self.cluster
        await self._prepare()
        proc = await asyncio.to_thread(c.apply, self._topic_manifest())
        if proc.returncode != 0:
            raise RuntimeError(f"apply topic: {proc.stderr.decode()}")
        await asyncio.to_thread(c.wait, lambda: full_lrs(c), 60.0, "topic online")
        cohort = Cohort(self.traffic, COHORT, s.members, self.dir)
        members = await cohort.start(c.bootstrap)
        producer = await Producer(
            c.bootstrap, acks="all", linger_ms=5, delivery_timeout_ms=60_000
        ).start()
        loading = asyncio.create_task(self.traffic.load(producer))
        await asyncio.sleep(s.warmup_s)
        await play_rounds(s.rounds, self._round, self.rounds, describe, self.progress)
        self.traffic.stop_load.set()
        await loading
        await producer.flush()
        await producer.close()
        acked, failed = await self.traffic.outcomes()
        self.progress(f"load stopped: {len(acked)} acknowledged, {failed} failed sends")
        await asyncio.to_thread(c.wait, lambda: full_lrs(c), s.recovery_timeout_s, "full LRS")
        await cohort.drain(acked, s.drain_timeout_s)
        self.final_assignments = {m.name: dict(m.consumer.assignment) for m in members}
        self.member_tasks = {
            m.name: [
                repr(t.exception()) if t.done() and not t.cancelled() else "running"
                for t in m.consumer._tasks
            ]
            for m in members
        }
        await cohort.stop()
        stored = await read_back(c.bootstrap, TOPIC, self.partitions_ever, self.progress)
        verdict = checking.check(
            acked,
            stored,
            cohort.deliveries(),
            failed_sends=failed,
            in_order=self.traffic.delivery_order,
        )
        fresh = await self.traffic.fresh_cohort(
            c.bootstrap, acked, stored, s.fresh_cohort_timeout_s
        )
        verdict["fresh_cohort"] = fresh
        verdict["ok"] = verdict["ok"] and fresh["undelivered"] == 0 and not fresh["key_order"]
        return self._report(verdict, time.monotonic() - started)

    async def _prepare(self) -> None:
        """Runs once the cluster is up, before the topic is created (a hook)."""

    def _topic_manifest(self) -> str:
        return topic_manifest(TOPIC_NAME, self.settings.partitions, replicas=3, min_in_sync=2)

    # ------------------------------------------------------------------ load and cohort

    def _longest_partition_stall(self) -> tuple[int | None, float]:
        """The partition that went longest without an acknowledgement while the load ran
        (the campaign's end counts as one for a partition that stopped taking records)."""
        worst: tuple[int | None, float] = (None, 0.0)
        end = self.traffic.acked_at[-1] if self.traffic.acked_at else 0.0
        for p, times in self.traffic.acked_at_by_partition.items():
            if p >= self.partitions:
                continue  # retired: it takes no records any more, by design
            gaps = [
                self._routed_gap(p, a, b) for a, b in zip(times, [*times[1:], end], strict=False)
            ]
            gap = max(gaps, default=0.0)
            if gap > worst[1]:
                worst = (p, gap)
        return worst

    def _routed_gap(self, partition: int, start: float, end: float) -> float:
        """``end - start`` less the time ``partition`` spent retired in between: from its
        last return to the routing (0: not routed at ``end``)."""
        routed = [n for t, n in self.routing_counts if t <= start][-1] > partition
        since = start
        for t, n in self.routing_counts:
            if start < t <= end:
                if n > partition and not routed:
                    since = t
                routed = n > partition
        return end - since if routed else 0.0

    # ------------------------------------------------------------------ faults

    async def _round(self, index: int) -> Round:
        s = self.settings
        c = self.cluster
        target = self.rng.choice(s.targets)
        partition = self.rng.randrange(self.partitions)
        down_s = self.rng.uniform(*s.restart_delay_s)
        follower_pick = self.rng.random()
        if target == "pause":  # the same draw, stretched: a seed draws what it always drew
            (lo, hi), (plo, phi) = s.restart_delay_s, s.pause_s
            down_s = plo + (down_s - lo) / ((hi - lo) or 1.0) * (phi - plo)
        if target == "repartition":
            return await self._repartition_round(index, partition, down_s)
        parts = await asyncio.to_thread(c.partitions, TOPIC)
        part = parts[partition]
        r = Round(index, target, partition, "", down_s)
        repartition: str | None = None
        if target == "controller":
            r.victim = "controller"
            c.kill_controller()
        else:
            if target == "unload":
                name = f"chaos-{index}"
                proc = await asyncio.to_thread(c.apply, unload_manifest(name, partition))
                if proc.returncode != 0:
                    r.note = f"unload refused: {proc.stderr.decode().strip()}"
                r.mid_seal = await asyncio.to_thread(self._catch_seal, partition)
                part = (await asyncio.to_thread(c.partitions, TOPIC))[partition]
                if not r.mid_seal:
                    r.note = r.note or "seal not seen: killed the leader after the move"
            if target == "cutover":
                repartition = await self._cut_over(r)
                part = (await asyncio.to_thread(c.partitions, TOPIC))[partition]
            if target == "follower":
                followers = [b for b in part["replicas"] if b != part["leader"]]
                victim = followers[int(follower_pick * len(followers))]
            else:
                victim = part["leader"]
            if victim is None:
                victim = part["replicas"][0]
            r.victim = f"broker {victim}"
            if target == "pause":
                # a leader that accepts connections and never answers (SIGSTOP), then
                # resumes with the requests it had received: it must serve none of them
                c.signal_broker(victim, signal.SIGSTOP)
            else:
                c.kill_broker(victim)
        if target == "controller":
            await asyncio.sleep(down_s)  # the fault: how long the controller stays dead
        else:
            # the fault: how long the victim stays dead (watching whether the controller
            # notices: a short outage may end before the victim leaves any LRS)
            r.left_lrs = await asyncio.to_thread(self._watch_drop, victim, down_s)
        if target == "controller":
            await asyncio.to_thread(c.restart_controller)
        elif target == "pause":
            c.signal_broker(victim, signal.SIGCONT)
        else:
            await asyncio.to_thread(c.restart_broker, victim)
        restarted = time.monotonic()
        try:
            if target != "controller" and s.wait_ready:
                # Up first: before the controller notices the death, its view is still
                # "full LRS", and the next round must not kill a second broker meanwhile.
                await asyncio.to_thread(
                    c.wait, lambda: broker_ready(c, victim), s.recovery_timeout_s, "readyz"
                )
            await asyncio.to_thread(c.wait, lambda: full_lrs(c), s.recovery_timeout_s, "full LRS")
            r.recovery_s = time.monotonic() - restarted
            if target == "cutover" and repartition is not None:
                await asyncio.to_thread(
                    c.wait,
                    lambda: repartition_phase(c, repartition) in ("Finalized", "Failed"),
                    s.finalize_timeout_s,
                    f"repartition {repartition} finished",
                )
                r.finalize_s = time.monotonic() - restarted
                phase = await asyncio.to_thread(repartition_phase, c, repartition)
                if phase != "Finalized":
                    r.note = f"repartition {repartition} {phase}"
        except TimeoutError as exc:
            r.note = str(exc)
        return r

    async def _repartition_round(self, index: int, partition: int, down_s: float) -> Round:
        """One of ``REPARTITION_KINDS``; the round ends when every Repartition it applied
        has finalized and every partition is back to a full live replica set."""
        s = self.settings
        c = self.cluster
        kind = self.rng.choice(REPARTITION_KINDS)
        second_pick = self.rng.random()
        r = Round(index, "repartition", partition, "", down_s, kind=kind)
        r.partitions_before = self.partitions
        shrunk = max(s.min_partitions, self.partitions - 1 - int(second_pick * 2))
        try:
            if kind == "grow-double-kill":
                if self.partitions >= s.max_partitions:
                    r.note = f"at {self.partitions} partitions: a shrink instead"
                    await self._repartition_to(r, shrunk, f"chaos-shrink-{index}")
                else:
                    name = f"chaos-grow-{index}"
                    grown = min(s.max_partitions, self.partitions + 1 + int(second_pick * 3))
                    applied = await self._repartition_to(r, grown, name, wait=False)
                    part = (await asyncio.to_thread(c.partitions, TOPIC))[partition]
                    leader = part["leader"] if part["leader"] is not None else part["replicas"][0]
                    other = next(b["id"] for b in c.record["brokers"] if b["id"] != leader)
                    r.victim = f"brokers {leader}+{other}"
                    c.kill_broker(leader)
                    c.kill_broker(other)
                    await asyncio.sleep(down_s)
                    await asyncio.to_thread(c.restart_broker, leader)
                    await asyncio.to_thread(c.restart_broker, other)
                    restarted = time.monotonic()
                    await self._recovered(r, restarted, applied)
            elif kind == "shrink-controller-kill":
                name = f"chaos-shrink-{index}"
                applied = await self._repartition_to(r, shrunk, name, wait=False)
                r.victim = "controller"
                c.kill_controller()
                await asyncio.sleep(down_s)
                await asyncio.to_thread(c.restart_controller)
                await self._recovered(r, time.monotonic(), applied)
            else:  # shrink-grow-back
                back = self.partitions
                await self._repartition_to(r, shrunk, f"chaos-shrink-{index}")
                applied = await self._repartition_to(r, back, f"chaos-back-{index}", wait=False)
                await self._recovered(r, time.monotonic(), applied)
        except TimeoutError as exc:
            r.note = str(exc)
        r.partitions_after = self.partitions
        return r

    async def _repartition_to(
        self, r: Round, partitions: int, name: str, *, wait: bool = True
    ) -> str | None:
        """Apply a Repartition of the topic to ``partitions`` and wait for its transition
        marker (``r.mid_cutover``), then (``wait``) for it to finalize. Its name; None when
        it was refused or not needed."""
        if partitions == self.partitions:
            return None
        # Watch from before the apply, and apply over HTTP rather than with the CLI: a small
        # topic's whole transition can be over within the CLI process's exit.
        watching = asyncio.ensure_future(asyncio.to_thread(self._catch_transition, name))
        manifest = repartition_manifest(name, partitions, self.settings.adoption_timeout_s)
        status, answer = await asyncio.to_thread(
            post_manifest, self.cluster.controller_url, manifest
        )
        if status != 200:
            self._stop_watch = True
            await watching
            self._stop_watch = False
            r.note = f"repartition to {partitions} refused: HTTP {status} {answer}"
            return None
        self.partitions = partitions
        self.routing_counts.append((time.monotonic(), partitions))
        self.partitions_ever = max(self.partitions_ever, partitions)
        r.mid_cutover = r.mid_cutover or await watching
        if wait:
            await self._finalized(r, name)
        return name

    async def _finalized(self, r: Round, name: str) -> None:
        c = self.cluster
        await asyncio.to_thread(
            c.wait,
            lambda: repartition_phase(c, name) in ("Finalized", "Failed"),
            self.settings.finalize_timeout_s,
            f"repartition {name} finished",
        )
        phase = await asyncio.to_thread(repartition_phase, c, name)
        if phase != "Finalized":
            r.note = f"repartition {name} {phase}"

    async def _recovered(self, r: Round, since: float, repartition: str | None) -> None:
        """Wait for a full LRS and the Repartition's finalize; note the times from ``since``,
        and how long acknowledged produce took to resume after it."""
        c = self.cluster
        s = self.settings
        await asyncio.to_thread(c.wait, lambda: full_lrs(c), s.recovery_timeout_s, "full LRS")
        r.recovery_s = time.monotonic() - since
        if repartition is not None:
            await self._finalized(r, repartition)
            r.finalize_s = time.monotonic() - since
        deadline = time.monotonic() + s.recovery_timeout_s
        while (
            resumed := self.traffic.first_ack_after(since)
        ) is None and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        r.produce_resumed_s = resumed

    async def _cut_over(self, r: Round) -> str | None:
        """Apply a Repartition growing the topic by one and wait for its transition marker
        (``r.mid_cutover``: the phase seen). Returns its name; None when not applied."""
        r.partitions_before = self.partitions
        if self.partitions >= self.settings.max_partitions:
            r.note = f"at {self.partitions} partitions: killed the leader without a repartition"
            return None
        name = f"chaos-grow-{r.index}"
        if await self._repartition_to(r, self.partitions + 1, name, wait=False) is None:
            return None
        r.partitions_after = self.partitions
        if r.mid_cutover is None:
            r.note = "transition not seen: killed the leader after the repartition"
        return name

    def _watch_drop(self, broker: int, seconds: float) -> bool:
        """Poll for ``seconds``; True if the controller dropped ``broker`` from an LRS meanwhile."""
        deadline = time.monotonic() + seconds
        dropped = False
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return dropped
            if not dropped:
                with contextlib.suppress(OSError):
                    dropped = any(
                        broker in p["replicas"] and broker not in p["liveReplicas"]
                        for p in self.cluster.partitions(TOPIC)
                    )
            time.sleep(min(0.1, left))

    def _catch_transition(self, name: str) -> str | None:
        """Poll until the topic's transition marker is set (its phase) or the Repartition
        is over (None)."""
        deadline = time.monotonic() + 10.0
        while time.monotonic() < deadline and not self._stop_watch:
            with contextlib.suppress(OSError):
                state = self.cluster.state()
                marker = next(
                    (t for t in state.get("transitions") or [] if t["topic"] == TOPIC), None
                )
                if marker is not None:
                    return str(marker["phase"])
                phase = next(
                    (
                        (d.get("status") or {}).get("phase")
                        for d in state.get("repartitions") or []
                        if d["metadata"]["name"] == name
                    ),
                    None,
                )
                if phase in ("Finalized", "Failed"):
                    return None
            time.sleep(0.01)
        return None

    def _catch_seal(self, partition: int) -> bool:
        """Poll until the partition's seal marker is set (True) or its move is over (False)."""
        deadline = time.monotonic() + 5.0
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError):
                state = self.cluster.state()
                topics = (state.get("cluster") or {}).get("topics") or []
                parts: list[dict[str, Any]] = next(
                    (t["partitions"] for t in topics if t["name"] == TOPIC), []
                )
                if parts and parts[partition].get("seal"):
                    return True
                if not any(
                    (u.get("status") or {}).get("phase") not in ("Completed", "Failed")
                    for u in state.get("unloads") or []
                ):
                    return False
            time.sleep(0.01)
        return False

    # ------------------------------------------------------------------ report

    def _report(self, verdict: dict[str, Any], elapsed_s: float) -> dict[str, Any]:
        recoveries = [r.recovery_s for r in self.rounds if r.recovery_s is not None]
        after_drop = [r.recovery_s for r in self.rounds if r.recovery_s is not None and r.left_lrs]
        by_target = rounds_by_target(self.rounds, TARGETS)
        report = {
            "seed": self.settings.seed,
            "settings": asdict(self.settings),
            "rounds": len(self.rounds),
            "rounds_by_target": by_target,
            "unload_kills_mid_seal": sum(1 for r in self.rounds if r.mid_seal),
            "cutover_kills_mid_transition": sum(1 for r in self.rounds if r.mid_cutover),
            "cutover_kills_by_phase": {
                phase: sum(1 for r in self.rounds if r.mid_cutover == phase)
                for phase in sorted({r.mid_cutover for r in self.rounds if r.mid_cutover})
            },
            "partitions_at_end": self.partitions,
            "cutover_finalize_s": distribution(
                [r.finalize_s for r in self.rounds if r.finalize_s is not None]
            ),
            "elapsed_s": round(elapsed_s, 1),
            "recovery_s": distribution(recoveries),
            "recovery_after_lrs_drop_s": distribution(after_drop),
            "broker_kills_dropped_from_lrs": sum(1 for r in self.rounds if r.left_lrs),
            "rounds_not_recovered": sum(1 for r in self.rounds if r.recovery_s is None),
            "rounds_over_10s": sum(1 for x in recoveries if x > 10.0),
            "member_errors": self.traffic.member_errors[:20],
            "final_assignments": self.final_assignments,
            "member_tasks": self.member_tasks,
            "cohort_delivered_up_to": {
                p: max((o for q, o in self.traffic.delivered if q == p), default=-1)
                for p in range(self.partitions_ever)
            },
            "partitions_ever": self.partitions_ever,
            "repartition_rounds_by_kind": {
                kind: sum(1 for r in self.rounds if r.kind == kind) for kind in REPARTITION_KINDS
            },
            "produce_resumed_after_faults_s": distribution(
                [r.produce_resumed_s for r in self.rounds if r.produce_resumed_s is not None]
            ),
            "longest_partition_stall": dict(
                zip(("partition", "seconds"), self._longest_partition_stall(), strict=True)
            ),
            "longest_produce_stall_s": round(
                max(
                    (
                        b - a
                        for a, b in zip(
                            self.traffic.acked_at, self.traffic.acked_at[1:], strict=False
                        )
                    ),
                    default=0.0,
                ),
                2,
            ),
            **verdict,
            "round_log": [asdict(r) for r in self.rounds],
        }
        return report


def describe(r: Round) -> str:
    """A round's line in the progress."""
    took = "not back" if r.recovery_s is None else f"full LRS {r.recovery_s:.2f}s"
    return (
        f"{r.target:10s} p{r.partition} victim {r.victim:10s}"
        f" down {r.down_s:.2f}s{'' if r.left_lrs is not False else ' (stayed in LRS)'}"
        f"  {took}{'  mid-seal' if r.mid_seal else ''}"
        f"{f'  mid-cutover ({r.mid_cutover})' if r.mid_cutover else ''}"
        f"{f'  finalized {r.finalize_s:.2f}s' if r.finalize_s is not None else ''}"
        f"{'  ' + r.note if r.note else ''}"
    )


def distribution(values: list[float]) -> dict[str, float | int | None]:
    if not values:
        return {"count": 0, "min": None, "median": None, "p90": None, "max": None}
    ordered = sorted(values)
    return {
        "count": len(ordered),
        "min": round(ordered[0], 2),
        "median": round(statistics.median(ordered), 2),
        "p90": round(ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))], 2),
        "max": round(ordered[-1], 2),
    }


def table(report: dict[str, Any]) -> str:
    """The short table printed after a run (and pasted in docs/reliability.md)."""
    c = report["counts"]
    r = report["recovery_s"]
    d = report["recovery_after_lrs_drop_s"]
    rows = [
        ("seed", report["seed"]),
        ("rounds", f"{report['rounds']} {report['rounds_by_target']}"),
        ("unload kills mid-seal", report["unload_kills_mid_seal"]),
        (
            "cutover kills mid-transition",
            f"{report['cutover_kills_mid_transition']} {report['cutover_kills_by_phase']}",
        ),
        ("partitions at the end", report["partitions_at_end"]),
        ("acknowledged records", c["acknowledged"]),
        ("failed sends (not acknowledged)", c["failed_sends"]),
        ("lost", c["lost"]),
        ("duplicated", c["duplicated"]),
        ("offset gaps", c["gaps"]),
        ("order violations (in a partition)", c["order_violations"]),
        ("key order violations (delivery, across partitions)", c["key_order_violations"]),
        ("offsets reused", c["offsets_reused"]),
        ("undelivered to the cohort", c["undelivered"]),
        (
            "a fresh cohort from the earliest: undelivered / key order violations",
            f"{report['fresh_cohort']['undelivered']} / {report['fresh_cohort']['key_order']}",
        ),
        (
            "redeliveries",
            f"{c['redeliveries']} (max {c['max_redeliveries_of_one_record']} of one record)",
        ),
        (
            "full LRS after restart (s)",
            f"median {r['median']}, p90 {r['p90']}, max {r['max']} over {r['count']}",
        ),
        (
            "  rounds whose victim had left an LRS",
            f"median {d['median']}, p90 {d['p90']}, max {d['max']} over {d['count']}",
        ),
        (
            "rounds over 10 s / not back",
            f"{report['rounds_over_10s']} / {report['rounds_not_recovered']}",
        ),
        ("repartition rounds", str(report["repartition_rounds_by_kind"])),
        (
            "produce resumed after a repartition round's faults (s)",
            f"median {report['produce_resumed_after_faults_s']['median']},"
            f" max {report['produce_resumed_after_faults_s']['max']}",
        ),
        ("longest produce stall (s)", report["longest_produce_stall_s"]),
        (
            "longest time one partition took no acknowledged record (s)",
            f"{report['longest_partition_stall']['seconds']:.2f}"
            f" (partition {report['longest_partition_stall']['partition']})",
        ),
        ("verdict", "PASS" if report["ok"] else "FAIL"),
        ("elapsed", f"{report['elapsed_s']} s"),
    ]
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)
