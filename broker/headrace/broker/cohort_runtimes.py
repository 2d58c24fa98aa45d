"""The cohorts this broker runs: one ``CohortRuntime`` per (topic, cohort) a member
joined here, made on the first join and dropped once empty or its topic is gone.

A runtime's plan is the pushed topology's, and its delivery holds are a
repartition's (``repartition_holds``); ``refresh`` gives them both after a placement.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from typing import Any

from headrace.broker import cohort_admin
from headrace.broker.cohorting import CohortRuntime
from headrace.broker.ports import BrokerCore, Cohort, TieredReads
from headrace.broker.pushed_topology import PushedTopology
from headrace.broker.repartition_holds import RepartitionHolds
from headrace.cohorts.gates import validate_cohort_name
from headrace.protocol import messages as msg

#: how often every runtime's sessions and grace periods are checked, seconds
TICK_S = 0.25


class CohortRuntimes:
    def __init__(
        self,
        broker: BrokerCore,
        tiering: TieredReads,
        pushed: PushedTopology,
        holds: RepartitionHolds,
        epoch_floor: Callable[[], int],
    ) -> None:
        self._settings = broker.settings
        self._registry = broker.registry
        self._metrics = broker.metrics
        self._tiering = tiering
        self._pushed = pushed
        self._holds = holds
        #: the first gate epoch of this incarnation's cohorts (known once the broker starts)
        self._epoch_floor = epoch_floor
        self.runtimes: dict[tuple[str, str], CohortRuntime] = {}

    def cohort(self, topic_name: str, name: str) -> CohortRuntime:
        """The runtime of cohort ``name`` of ``topic_name``, made and started if new."""
        validate_cohort_name(name)
        topic = self._registry.get(topic_name)
        key = (topic.name, name)
        runtime = self.runtimes.get(key)
        if runtime is None:
            runtime = CohortRuntime(
                topic,
                name,
                grace_ms=self._settings.cohort_grace_ms,
                chunk_bytes=self._settings.delivery_chunk_bytes,
                tiering=self._tiering,
                hold=functools.partial(self._holds.delivery_hold, topic.name, name),
                routed_anew_from=functools.partial(self._holds.routed_anew_from, topic.name),
                epoch_floor=self._epoch_floor(),
            )
            runtime.on_delivered = self._metrics.delivered_bytes.inc
            runtime.on_skipped = functools.partial(self._count_skipped, topic.name, name)
            plan = self._pushed.cohort_plan(topic.name, name)
            if plan is not None:
                runtime.gates.plan = {m: frozenset(ps) for m, ps in plan.items()}
            runtime.start()
            self.runtimes[key] = runtime
        return runtime

    def _count_skipped(self, topic: str, cohort: str, partition: int, records: int) -> None:
        self._metrics.cohort_skipped_records.labels(topic, str(partition), cohort).inc(records)

    def maybe_drop(self, cohort: Cohort) -> None:
        """Stop and forget ``cohort`` if it has no members left."""
        key = (cohort.topic.name, cohort.name)
        runtime = self.runtimes.get(key)
        if runtime is cohort and runtime.empty:
            del self.runtimes[key]
            asyncio.get_running_loop().create_task(runtime.close())

    def of_topic(self, topic: str) -> list[CohortRuntime]:
        return [r for (t, _), r in self.runtimes.items() if t == topic]

    def refresh(self) -> None:
        """After a placement: each runtime's partitions and plan anew; the runtimes of a
        topic deleted (or created again) end."""
        for (topic, cohort), runtime in list(self.runtimes.items()):
            if self._registry.topics.get(topic) is not runtime.topic:
                self._end((topic, cohort))
                continue
            runtime.refresh_partitions()
            runtime.set_plan(self._pushed.cohort_plan(topic, cohort))

    def end_topic(self, topic: str) -> None:
        """Topic ``topic`` is being deleted: end its cohorts."""
        for key in [k for k in self.runtimes if k[0] == topic]:
            self._end(key)

    def _end(self, key: tuple[str, str]) -> None:
        """The cohort's topic is gone: end every membership in it (a member's next request
        gets ``UnknownMember``, and it joins again, the topic's next incarnation if one
        comes), then stop it."""
        runtime = self.runtimes.pop(key)
        runtime.end_memberships()
        asyncio.get_running_loop().create_task(runtime.close())

    async def tick_forever(self) -> None:
        while True:
            await asyncio.sleep(TICK_S)
            for runtime in list(self.runtimes.values()):
                runtime.tick()
                self.maybe_drop(runtime)

    async def close(self) -> None:
        for runtime in list(self.runtimes.values()):
            await runtime.close()

    # ------------------------------------------------------------------ admin

    def _admin_view(self) -> cohort_admin.CohortAdminView:
        return cohort_admin.CohortAdminView(
            self._settings.broker_id, self._registry, self.runtimes, self._tiering.earliest
        )

    def describe(self, request: msg.DescribeCohorts) -> dict[str, Any]:
        return cohort_admin.describe_cohorts(self._admin_view(), request)

    def reset_cursors(self, request: msg.ResetCursors) -> dict[str, Any]:
        return cohort_admin.reset_cursors(self._admin_view(), request)
