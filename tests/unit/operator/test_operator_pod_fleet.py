"""Which pods the operator's loop polls (``PodFleet.refresh``), over the operator's
``ClientApi`` and kmock's API emulator: a pod being deleted stays polled while its
containers may run, so the ``draining`` its ``preStop`` hook starts reaches the loop."""

from __future__ import annotations

from typing import Any

from kube_server import ApiServer

from headrace.operator import workloads
from headrace.operator.kube import ClientApi
from headrace.operator.pods import PodFleet
from tests.unit.controller.controller_fakes import ManualClock

DELETED_AT = "2026-11-24T14:00:00Z"


def pod(
    name: str,
    ip: str | None,
    *,
    deleting: bool = False,
    phase: str = "Running",
    ordinal: str | None = None,
) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "name": name,
        "namespace": "ns",
        "uid": f"uid-{name}",
        "labels": {
            workloads.CLUSTER_LABEL: "demo",
            workloads.POD_INDEX_LABEL: ordinal or name.rpartition("-")[2],
        },
    }
    if deleting:
        meta["deletionTimestamp"] = DELETED_AT
        meta["deletionGracePeriodSeconds"] = 30
    status: dict[str, Any] = {"phase": phase}
    if ip is not None:
        status["podIP"] = ip
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": {}, "status": status}


async def polled_ips(api: ClientApi) -> dict[int, str]:
    fleet = PodFleet(api, "ns", "demo", ManualClock(), 100)
    await fleet.refresh()
    return {broker: endpoint.host for broker, endpoint in fleet.http.brokers.items()}


async def test_a_terminating_pod_with_an_ip_stays_polled_so_its_drain_is_heard(
    server: ApiServer, api: ClientApi
) -> None:
    server.put(pod("demo-0", "10.0.0.10"))
    # ``kubectl delete pod demo-1``: the preStop drain runs, the broker still answers
    server.put(pod("demo-1", "10.0.0.11", deleting=True))
    server.put(pod("demo-2", "10.0.0.12"))
    assert await polled_ips(api) == {0: "10.0.0.10", 1: "10.0.0.11", 2: "10.0.0.12"}
    # were a second pod of the same ordinal ever listed, the one not being deleted wins
    server.put(pod("demo-1-next", "10.0.0.21", ordinal="1"))
    assert (await polled_ips(api))[1] == "10.0.0.21"
    server.put(pod("demo-1-next", "10.0.0.21", ordinal="1", phase="Failed"))

    # its containers done (phase Failed or Succeeded), or no IP (not yet, or any more):
    # nothing to poll there
    server.put(pod("demo-1", "10.0.0.11", deleting=True, phase="Failed"))
    server.put(pod("demo-2", "10.0.0.12", deleting=True, phase="Succeeded"))
    assert await polled_ips(api) == {0: "10.0.0.10"}
    server.put(pod("demo-1", None, deleting=True))
    server.put(pod("demo-2", None, phase="Pending"))  # the StatefulSet's replacement, unstarted
    assert await polled_ips(api) == {0: "10.0.0.10"}


async def test_a_scale_downs_terminating_pod_is_polled_too(
    server: ApiServer, api: ClientApi
) -> None:
    """A removed ordinal's pod drains like any other: polled until its process is gone
    (the loop places nothing on it: ``members`` is the spec's ordinals, not the polled)."""
    for ordinal in range(3):
        server.put(pod(f"demo-{ordinal}", f"10.0.0.{10 + ordinal}"))
    server.put(pod("demo-3", "10.0.0.13", deleting=True))
    assert set(await polled_ips(api)) == {0, 1, 2, 3}
