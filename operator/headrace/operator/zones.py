"""The rack of each broker on Kubernetes: the zone of the node its pod runs on.

Placement spreads a partition's replicas over racks (``control.placement``), as
Kafka's ``broker.rack`` does. On Kubernetes the rack is the node's
``topology.kubernetes.io/zone`` label. A pod cannot read its node's labels: the
downward API does not expose them, and an init container that asks the API server
(Strimzi's way) needs every broker pod to run with a token allowed to read nodes. So
the operator, which already follows every broker pod (``spec.nodeName`` is set once
it is scheduled), reads those nodes itself, by name (RBAC: ``get`` on ``nodes``, no
list or watch), and hands the control loop each broker's zone (``ControlLoop.racks``).
The broker pods keep no API access at all (docs/decisions.md).

A node's zone is read once and remembered for ``refresh_ms`` (zones of a node do not
change in practice; a node name reused for a new machine is picked up then). A node
without the label, or one the operator may not read, gives its brokers no rack: each
is then a rack of its own, which is how placement works without zones.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import Any, Final

from headrace.operator import workloads
from headrace.operator.kube import KubeApi, KubeApiError, ObjectRef

log = logging.getLogger(__name__)

#: the well-known label of a node's zone
ZONE_LABEL: Final = "topology.kubernetes.io/zone"


class NodeZones:
    """Broker id -> zone of its pod's node, from node reads remembered a while."""

    def __init__(self, api: KubeApi, refresh_ms: int = 600_000) -> None:
        self.api = api
        self.refresh_ms = refresh_ms
        #: node name -> (its zone or None, when it was read in clock ms)
        self._nodes: dict[str, tuple[str | None, int]] = {}
        self._refused = False
        #: node reads made (for tests and the API-load figures)
        self.reads = 0

    async def racks(self, pods: Iterable[Mapping[str, Any]], now_ms: int) -> dict[int, str]:
        """The zone of every scheduled broker pod's node that has one."""
        racks: dict[int, str] = {}
        for pod in pods:
            broker = workloads.broker_id_of(pod)
            node = (pod.get("spec") or {}).get("nodeName")
            if broker is None or not node:
                continue
            zone = await self._zone(str(node), now_ms)
            if zone:
                racks[broker] = zone
        return racks

    async def _zone(self, node: str, now_ms: int) -> str | None:
        known = self._nodes.get(node)
        if known is not None and now_ms - known[1] < self.refresh_ms:
            return known[0]
        self.reads += 1
        try:
            body = await self.api.get(ObjectRef("v1", "Node", "", node))
        except KubeApiError as exc:
            if not self._refused:
                log.warning(
                    "cannot read node %s (%s): brokers get no zone, replicas are spread over"
                    " brokers only",
                    node,
                    exc,
                )
                self._refused = True
            body = None
        labels = ((body or {}).get("metadata") or {}).get("labels") or {}
        zone = labels.get(ZONE_LABEL)
        self._nodes[node] = (str(zone) if zone else None, now_ms)
        return self._nodes[node][0]
