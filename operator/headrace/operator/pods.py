"""A cluster's pods as the control loop's ``BrokerFleet``: which brokers to poll, and where.

``PodFleet`` finds the pods before every poll (from the watch cache when there is one:
``caching``) and speaks to their brokers over HTTP on the pod IPs (the local
controller's ``HttpFleet``). Behind load balancers, it puts each broker's external
address (its Service's, read by the cluster's loop) in the broker's heartbeats before
the control loop records them (``workloads.advertise_external``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from headrace.control.looping import Clock, Report
from headrace.fleet.http import HttpFleet
from headrace.operator import caching, workloads
from headrace.operator.kube import KubeApi
from headrace.protocol.endpoints import BrokerEndpoint, ListenerAddress


def terminating(pod: Mapping[str, Any]) -> bool:
    """The pod is being deleted (``kubectl delete pod``, an eviction, a rolling restart's
    or a scale down's delete): its ``preStop`` drain may be running."""
    return bool((pod.get("metadata") or {}).get("deletionTimestamp"))


def polled(pod: Mapping[str, Any]) -> bool:
    """Whether the control loop polls the pod's broker: it has an IP and its containers
    have not all finished. A terminating pod stays polled: its ``preStop`` hook
    (``headrace drain``) has the broker report ``draining``, and only a loop that still
    hears it hands its leadership away (``LeaderDraining``) before SIGTERM; dropped at
    the ``deletionTimestamp``, its partitions would wait out the liveness TTL
    (``LeaderLost``) instead. Once its process is gone the poll's refused connection
    counts as down at once, until the pod object goes too."""
    status = pod.get("status") or {}
    return bool(status.get("podIP")) and status.get("phase") not in ("Succeeded", "Failed")


class PodFleet:
    """A ``BrokerFleet``: the cluster's pods, found before every poll (from the watch cache
    when there is one: ``caching``), spoken to over HTTP on their pod IPs (``HttpFleet``)."""

    def __init__(
        self,
        api: KubeApi,
        namespace: str,
        cluster_name: str,
        clock: Clock,
        timeout_ms: int,
        auth_token: str | None = None,
        reads: caching.WorkloadReads | None = None,
    ) -> None:
        """``auth_token``: presented on every poll and push (the cluster's replication
        token when its brokers run with ACLs); ``reads``: where the pods come from
        (default: listed through ``api`` every time)."""
        self.reads = reads or caching.WorkloadReads(api, namespace, cluster_name)
        self.http = HttpFleet([], clock, timeout_ms, auth_token=auth_token)
        #: the cluster's pods as last listed (their waiting reasons: ``objectstores``)
        self.listed: list[dict[str, Any]] = []
        #: each broker's load-balancer address, by id, as its Service's status last gave
        #: it (``workloads.load_balancer_addresses``); None: no LoadBalancer listener
        self.external: Mapping[int, ListenerAddress] | None = None

    async def start(self) -> None:
        await self.http.start()

    async def close(self) -> None:
        await self.http.close()

    async def refresh(self) -> None:
        pods = await self.reads.pods()
        self.listed = pods
        chosen: dict[int, dict[str, Any]] = {}
        for pod in pods:
            broker_id = workloads.broker_id_of(pod)
            if broker_id is None or not polled(pod):
                continue
            other = chosen.get(broker_id)
            # one pod per ordinal under a StatefulSet; should two ever be listed, the one
            # not being deleted is the broker that stays
            if other is None or (terminating(other) and not terminating(pod)):
                chosen[broker_id] = pod
        self.http.brokers = {
            broker_id: BrokerEndpoint(
                broker_id, pod["status"]["podIP"], workloads.DATA_PORT, workloads.ADMIN_PORT
            )
            for broker_id, pod in chosen.items()
        }

    async def poll(self) -> Mapping[int, Report | None]:
        await self.refresh()
        reports = await self.http.poll()
        external = self.external
        if external is None:
            return reports
        return {
            broker_id: None
            if report is None
            else replace(
                report,
                heartbeat=replace(
                    report.heartbeat,
                    broker=workloads.advertise_external(report.heartbeat.broker, external),
                ),
            )
            for broker_id, report in reports.items()
        }

    async def push(self, broker_id: int, topology: Mapping[str, Any]) -> int | None:
        if broker_id not in self.http.brokers:
            return None  # its pod is gone since the poll (deleted, being replaced)
        return await self.http.push(broker_id, topology)
