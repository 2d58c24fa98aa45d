"""The control core's step on an idle cluster: full reconcile against the steady skip.

``python -m bench.steady_step`` builds an idle 3-broker cluster of N partitions
(RF=3, every replica caught up, nothing appended), settles it with the real
``reconcile``, then times, in process CPU, a full ``reconcile`` and a step
answered by ``control.steady.SteadySteps`` on the same inputs. Each poll gets
new ``Heartbeat`` objects holding the same ``PartitionReport`` objects, as the
controller's fleet builds them from heartbeat deltas. No processes, no
network: this isolates the pure step, which is what the skip changes (the
whole controller's CPU per step is in ``bench.peerbench --only scale``).
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable, Mapping

from headrace.control.model import ClusterState, PartitionState, TopicSpec
from headrace.control.reconcile import StepInputs, reconcile
from headrace.control.settings import ControlSettings
from headrace.control.steady import SteadySteps
from headrace.protocol.coordination import Heartbeat, PartitionReport
from headrace.protocol.endpoints import BrokerEndpoint

SETTINGS = ControlSettings()
BROKERS = 3
TOPIC_PARTITIONS = 2_500


def _reports(state: ClusterState) -> dict[int, tuple[PartitionReport, ...]]:
    """Every broker's reports of an idle, fully replicated cluster."""
    held: dict[int, list[PartitionReport]] = {b: [] for b in range(BROKERS)}
    for topic in state.topics.values():
        for p in topic.partitions:
            assert p.state is PartitionState.ONLINE
            assert p.leader is not None
            for b in p.replicas:
                leads = b == p.leader
                held[b].append(
                    PartitionReport(
                        topic.name,
                        p.partition,
                        "leader" if leads else "follower",
                        p.leader_epoch,
                        100,
                        100 if leads else 0,
                        p.replicas if leads else (),
                        p.moves,
                        0,
                    )
                )
    return {b: tuple(rs) for b, rs in held.items()}


def _poll(reports: Mapping[int, tuple[PartitionReport, ...]], now_ms: int) -> dict[int, Heartbeat]:
    """New heartbeats, each with a new tuple of the same report objects: what the fleet's
    merge of an empty delta into its copy of the reports gives."""
    return {
        b: Heartbeat(BrokerEndpoint(b, f"10.0.0.{b}", 9092, 9644), now_ms, None, False, (*rs,))
        for b, rs in reports.items()
    }


def measure(partitions: int, steps: int) -> dict[str, float]:
    topics = max(1, partitions // TOPIC_PARTITIONS)
    specs = [
        TopicSpec(f"default/t{i}", partitions // topics, replicas=3, min_in_sync=2)
        for i in range(topics)
    ]
    now, since = 1_000_000, 1_000_000
    state = ClusterState()
    reports: dict[int, tuple[PartitionReport, ...]] = {b: () for b in range(BROKERS)}
    for _ in range(4):  # register, create, then settle on reports of the created topics
        now += 1_000
        decision = reconcile(
            StepInputs(state, specs, _poll(reports, now), now, SETTINGS, observing_since_ms=since)
        )
        if decision.changed:
            state = decision.state
        reports = _reports(state)
    skipping = SteadySteps()

    def timed(step: Callable[[StepInputs], object]) -> float:
        nonlocal now
        spent = 0.0
        for _ in range(steps):
            now += 1_000
            inputs = StepInputs(
                state, specs, _poll(reports, now), now, SETTINGS, observing_since_ms=since
            )
            started = time.process_time()
            step(inputs)
            spent += time.process_time() - started
        return spent / steps * 1_000

    full_ms = timed(reconcile)
    skipping.reconcile(
        StepInputs(state, specs, _poll(reports, now), now, SETTINGS, observing_since_ms=since)
    )
    skipped_ms = timed(skipping.reconcile)
    if skipping.skipped != steps:
        raise RuntimeError(f"only {skipping.skipped} of {steps} idle steps were skipped")
    return {"partitions": partitions, "reconcile_ms": full_ms, "skipped_step_ms": skipped_ms}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--partitions", default="10,1000,10000")
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args()
    rows = [measure(int(n), args.steps) for n in args.partitions.split(",")]
    for row in rows:
        print(
            f"{row['partitions']:>6} partitions: reconcile {row['reconcile_ms']:.2f} ms CPU,"
            f" skipped step {row['skipped_step_ms']:.3f} ms CPU"
        )
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
