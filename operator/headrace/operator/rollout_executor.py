"""Carries out a BrokerCluster's rolling restart (the adapter of ``rollout_plan``).

After every step of the cluster's loop, ``Rollout.step`` reads the
StatefulSet (its ``updateRevision``; from the watch cache, ``caching``), builds ``rollout_plan.Seen`` from the pods
and the loop's decision, and does what ``rollout_plan.next_action`` says: ask a
broker to drain (``POST /v1/drain`` on its pod IP), or delete its pod. It
returns the BrokerCluster's ``Restarting`` condition: True while pods are
outdated (the message says which broker and why it waits), False once a
rollout finished (kept, so ``lastTransitionTime`` says when), absent before the
first rollout. The drain start times live in memory: an operator restarted
mid-rollout asks again, which is harmless (a drain is idempotent).
"""

from __future__ import annotations

import logging
import ssl
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

import aiohttp

from headrace.control.model import PartitionState
from headrace.control.reconcile import Decision, Event
from headrace.operator import caching, rollout_plan, workloads
from headrace.operator.kube import KubeApi, ObjectRef

log = logging.getLogger(__name__)

RESTARTING = "Restarting"


@dataclass(frozen=True, slots=True)
class RolloutSettings:
    #: how long a drain may take before the pod is deleted anyway, in ms; below the
    #: preStop hook's own bound plus the grace period, so a stuck drain costs one failover
    drain_timeout_ms: int = 20_000
    #: the HTTP timeout of a drain request, in seconds
    request_timeout_s: float = 2.0


def pod_view(pod: Mapping[str, Any]) -> rollout_plan.PodView | None:
    broker = workloads.broker_id_of(pod)
    if broker is None:
        return None
    meta = pod.get("metadata") or {}
    conditions = (pod.get("status") or {}).get("conditions") or []
    ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)
    return rollout_plan.PodView(
        broker,
        (meta.get("labels") or {}).get(rollout_plan.REVISION_LABEL),
        ready,
        bool(meta.get("deletionTimestamp")),
        str(meta.get("uid", "")),
    )


def partition_views(decision: Decision) -> list[rollout_plan.PartitionView]:
    return [
        rollout_plan.PartitionView(
            f"{name}/{p.partition}",
            p.state is PartitionState.ONLINE,
            p.leader,
            tuple(p.replicas),
            tuple(p.live_replicas),
        )
        for name, topic in decision.state.topics.items()
        for p in topic.partitions
    ]


class Rollout:
    """One BrokerCluster's rolling restart; see the module."""

    def __init__(
        self,
        api: KubeApi,
        namespace: str,
        cluster_name: str,
        events: Callable[[Event], None] | None = None,
        settings: RolloutSettings | None = None,
        reads: caching.WorkloadReads | None = None,
    ) -> None:
        """``reads``: where the StatefulSet comes from, and learns of the pods deleted
        (default: read through ``api`` every step)."""
        self.api = api
        self.reads = reads or caching.WorkloadReads(api, namespace, cluster_name)
        self.namespace = namespace
        self.name = cluster_name
        self.events = events
        self.settings = settings or RolloutSettings()
        self.drains_started_ms: dict[int, int] = {}
        #: broker -> uid of the pod deleted, until its replacement is back (``rollout_plan.back``)
        self.restarted: dict[int, str] = {}
        #: brokers this rollout asked to drain (to call it off if they need no restart now)
        self.asked: set[int] = set()
        self.last: rollout_plan.Action = rollout_plan.Idle()
        #: the drain calls' credentials (the replication token when the cluster has auth on)
        self.auth_headers: dict[str, str] = {}
        #: verifies the brokers' admin certificates (None: plain HTTP; ``tlssecrets``)
        self.ssl_context: ssl.SSLContext | None = None

    def _tell(self, kind: str, message: str) -> None:
        log.info("%s/%s: %s", self.namespace, self.name, message)
        if self.events is not None:
            self.events(Event(kind, f"{self.namespace}/{self.name}", message))

    async def step(
        self,
        decision: Decision,
        pods: Iterable[Mapping[str, Any]],
        replicas: int,
        now_ms: int,
    ) -> rollout_plan.Action:
        statefulset = await self.reads.statefulset()
        revision = ((statefulset or {}).get("status") or {}).get("updateRevision")
        # the pods it really has (a refused scale down keeps more than the spec asks)
        replicas = int(((statefulset or {}).get("spec") or {}).get("replicas") or replicas)
        listed = [p for p in pods if workloads.broker_id_of(p) is not None]
        views = {v.broker: v for p in listed if (v := pod_view(p)) is not None}
        for broker in decision.liveness.draining:
            self.drains_started_ms.setdefault(broker, now_ms)
        seen = rollout_plan.Seen(
            revision,
            replicas,
            views,
            decision.liveness.live,
            decision.liveness.draining,
            partition_views(decision),
            now_ms,
            self.drains_started_ms,
            self.settings.drain_timeout_ms,
            dict(self.restarted),
        )
        for broker in rollout_plan.back(seen):
            del self.restarted[broker]
            self._tell("RollingRestart", f"broker {broker}: back in a new pod")
        seen = replace(seen, restarted=dict(self.restarted))
        await self._call_off_drains(seen, listed)
        action = rollout_plan.next_action(seen)
        match action:
            case rollout_plan.Drain(broker):
                pod = next(p for p in listed if workloads.broker_id_of(p) == broker)
                await self._drain(pod)
                self.asked.add(broker)
                self.drains_started_ms.setdefault(broker, now_ms)
                if action != self.last:
                    self._tell("RollingRestart", f"broker {broker}: draining its leadership")
            case rollout_plan.Delete(broker, still_leading, stuck):
                pod = next(p for p in listed if workloads.broker_id_of(p) == broker)
                meta = pod["metadata"]
                await self.api.delete(ObjectRef("v1", "Pod", self.namespace, meta["name"]))
                self.reads.acted_on_pod(pod)
                self.drains_started_ms.pop(broker, None)
                self.asked.discard(broker)
                self.restarted[broker] = str(meta.get("uid", ""))
                if stuck:
                    note = (
                        ": it is not Ready at an outdated revision, so it is replaced first,"
                        " without a drain"
                    )
                elif still_leading:
                    note = f"; the drain timed out, {len(still_leading)} partitions fail over"
                else:
                    note = ", leading nothing"
                self._tell("RollingRestart", f"broker {broker}: deleting pod {meta['name']}{note}")
            case rollout_plan.Idle() if not isinstance(self.last, rollout_plan.Idle):
                self.drains_started_ms.clear()
                self._tell("RollingRestartDone", "every pod runs the current revision")
        self.last = action
        return action

    async def _call_off_drains(
        self, seen: rollout_plan.Seen, listed: Iterable[Mapping[str, Any]]
    ) -> None:
        """A broker this rollout drained whose pod needs no restart any more (the template
        went back): let it lead again."""
        current = set(rollout_plan.outdated(seen))
        for broker in sorted(self.asked - current):
            self.asked.discard(broker)
            self.drains_started_ms.pop(broker, None)
            pod = next((p for p in listed if workloads.broker_id_of(p) == broker), None)
            view = seen.pods.get(broker)
            if pod is not None and view is not None and not view.terminating:
                await self._drain(pod, method="DELETE")
                self._tell(
                    "RollingRestart", f"broker {broker}: no restart needed, drain called off"
                )

    async def _drain(self, pod: Mapping[str, Any], method: str = "POST") -> None:
        ip = (pod.get("status") or {}).get("podIP")
        if not ip:
            return
        scheme = "http" if self.ssl_context is None else "https"
        url = f"{scheme}://{ip}:{workloads.ADMIN_PORT}/v1/drain"
        timeout = aiohttp.ClientTimeout(total=self.settings.request_timeout_s)
        try:
            async with (
                aiohttp.ClientSession(timeout=timeout) as session,
                session.request(
                    method, url, headers=self.auth_headers, ssl=self.ssl_context or True
                ) as response,
            ):
                response.raise_for_status()
        except (aiohttp.ClientError, TimeoutError) as exc:
            # the next step asks again (or finds the broker gone)
            log.warning(
                "%s/%s: drain request to %s failed: %s", self.namespace, self.name, url, exc
            )

    def condition(
        self, previous: Mapping[str, Any] | None, generation: int, now: str
    ) -> dict[str, Any] | None:
        """The ``Restarting`` condition for the last action (see the module)."""
        action = self.last
        if isinstance(action, rollout_plan.Idle):
            if previous is None:
                return None
            status, reason, message = (
                "False",
                "RolloutComplete",
                "every pod runs the current revision",
            )
        else:
            status, reason = "True", "RollingRestart"
            match action:
                case rollout_plan.Wait(_, why):
                    message = why
                case rollout_plan.Drain(broker):
                    message = f"draining broker {broker}"
                case rollout_plan.Delete(broker, _, True):
                    message = f"replacing broker {broker}'s pod: not Ready at an outdated revision"
                case rollout_plan.Delete(broker, _, _):
                    message = f"restarting broker {broker}"
        since = now
        if previous is not None and previous.get("status") == status:
            since = str(previous.get("lastTransitionTime", now))
        return {
            "type": RESTARTING,
            "status": status,
            "observedGeneration": generation,
            "reason": reason,
            "message": message,
            "lastTransitionTime": since,
        }
