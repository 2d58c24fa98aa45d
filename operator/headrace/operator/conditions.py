"""A BrokerCluster's conditions and ``observedGeneration``, judged from what a step found.

No I/O: ``cluster_conditions`` takes the cluster's body and what the step of its loop
(``running``) found (live brokers, scale-down blockers, the object store's and the TLS
Secrets' health, the replica moves, the workload's applies) and returns the status to
write; the handlers (``handlers``) judge a cluster whose loop cannot start with the same
``stalled_condition``.

``Stalled`` (kstatus's ``Failed``): an object whose spec cannot be honoured as it
stands, which waiting will not fix (a refused scale down, a Topic spec the loop
refuses: ``REFUSALS``), also carries ``Stalled=True`` with the Ready reason; the
condition goes away once the spec can be honoured again. Its ``lastTransitionTime``
stays put while it holds, as Ready's does.

A Topic or BrokerCluster annotated ``headrace.dev/paused: "true"`` (``paused``) is not
reconciled; it says so in a ``Paused`` condition.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from headrace.control import moves
from headrace.control.documents import condition
from headrace.operator import bodies, objectstores, tlssecrets, workloads
from headrace.operator.bodies import Meta, Parsed
from headrace.resources import BrokerCluster

PAUSED_ANNOTATION: Final = "headrace.dev/paused"

#: Ready reasons that refuse the spec as it stands (waiting cannot fix them): the object is
#: also ``Stalled``. Unavailability (PartitionsOffline, BelowMinInSync) is not: it passes;
#: nor is NotEnoughBrokers while the Topic's replicas fit the cluster's (brokers not up yet).
REFUSALS: Final = frozenset(
    {
        "ScaleDownBlocked",
        "ClusterNotFound",
        "InvalidSpec",
        "UnknownCluster",
        "NotEnoughBrokers",
        "ReplicasChange",
        "DuplicateSpec",
        "CompactionUnsupported",
        objectstores.CREDENTIALS_MISSING,
        tlssecrets.TLS_MISSING,
        tlssecrets.TLS_INVALID,
        #: the auth Secret's replication token does not parse (``handlers.cluster_loop``)
        "ReplicationTokenInvalid",
        #: the API server refused the workload for the spec as it stands (``ApplyFailure``)
        "Invalid",
        "Forbidden",
        "BadRequest",
        workloads.STORAGE_SHRINK,
        workloads.STORAGE_NOT_EXPANDABLE,
    }
)


@dataclass(frozen=True, slots=True)
class ApplyFailure:
    """An apply of the cluster's workload that failed: for which generation, and why
    (``reason``: the API server's, such as ``Invalid``, or the operator's own refusal)."""

    generation: int
    reason: str
    message: str


@dataclass
class WorkloadOutcome:
    """What the applies of one cluster's workload came to since the operator started
    (``handlers.apply_workload`` records it). The BrokerCluster's ``observedGeneration``
    is ``applied``: a generation counts as observed once its workload is applied."""

    #: the latest generation whose workload the API server took; None: none yet
    applied: int | None = None
    #: the latest apply's failure; None once an apply succeeds
    failure: ApplyFailure | None = None
    #: the StatefulSet's pod count in the latest apply that succeeded: more than
    #: ``spec.replicas`` while a scale down keeps brokers that still hold replicas
    replicas: int | None = None


def paused(meta: Meta) -> bool:
    return meta.annotations.get(PAUSED_ANNOTATION, "").lower() == "true"


def stalled_condition(
    ready: Mapping[str, Any] | None, previous: Mapping[str, Any] | None, now: str
) -> dict[str, Any] | None:
    """``Stalled=True`` beside a Ready condition whose reason is a refusal; else None."""
    if ready is None or ready.get("status") != "False" or ready.get("reason") not in REFUSALS:
        return None
    return condition(
        "Stalled",
        "True",
        str(ready["reason"]),
        str(ready.get("message", "")),
        int(ready.get("observedGeneration") or 1),
        previous,
        now,
    )


def cluster_conditions(
    cluster: Parsed[BrokerCluster],
    live: Iterable[int] | None,
    now: str,
    blockers: Mapping[int, list[str]] | None = None,
    store: objectstores.StoreHealth | None = None,
    reassignment: moves.Summary | None = None,
    tls: tuple[str, str] | None = None,
    workload: WorkloadOutcome | None = None,
) -> dict[str, Any]:
    """The BrokerCluster's ``conditions`` and ``observedGeneration`` (the workload's part).

    ``workload``: what the applies of its workload came to (None: not tracked, and the
    body's generation counts as observed). ``observedGeneration`` is then the generation
    last applied (as stored while none was applied since the operator started), and a
    failed apply makes Ready False with its reason: kstatus and Argo CD must not call a
    cluster current whose workload the API server refused.

    ``store``: the object store's health (``objectstores``), None when the cluster has no
    object store: a missing credentials Secret makes Ready False, an unreachable endpoint
    shows in ``ObjectStoreReachable``.

    ``live``: the live broker ids of the latest step; None while the cluster is paused.
    ``blockers``: brokers a scale down would remove that still hold replicas
    (``workloads.scale_down_blockers``). ``reassignment``: how the replica moves go
    (``control.moves``); with it, a scale down whose replicas can move is ``ScalingDown``
    (they move off first), and only one that cannot (it would lose a partition's last
    in-sync replica, or go below a replication factor) is refused as ``ScaleDownBlocked``;
    a ``Rebalancing`` condition says whether moves are in flight. ``tls``: a TLS Secret
    problem (reason, message: ``tlssecrets``), which makes Ready False.
    """
    generation = cluster.meta.generation
    stored = bodies.stored_status(cluster)
    types = set() if stored is None else {c.type for c in stored.conditions}
    previous = {t: bodies.stored_condition(cluster, t) for t in types}
    replicas = 3 if cluster.resource is None else cluster.resource.spec.replicas
    observed: int | None = generation
    failure = None
    if workload is not None:
        observed = workload.applied
        if observed is None and stored is not None:
            observed = stored.observed_generation
        failure = workload.failure
    conditions = []
    if live is None:
        old = previous.get("Ready")
        if old is not None:
            conditions.append(old)
        conditions.append(
            condition(
                "Paused",
                "True",
                "Paused",
                f"annotation {PAUSED_ANNOTATION} is true: not reconciled",
                generation,
                previous.get("Paused"),
                now,
            )
        )
    else:
        missing = sorted(set(range(replicas)) - set(live))
        if failure is not None:
            ready = ("False", failure.reason, failure.message)
        elif tls is not None:
            ready = ("False", *tls)
        elif store is not None and store.credentials is not None:
            ready = ("False", objectstores.CREDENTIALS_MISSING, store.credentials)
        elif blockers and reassignment is not None and not reassignment.blocked:
            ready = (
                "False",
                "ScalingDown",
                f"scaling down to {replicas}: moving replicas off brokers {sorted(blockers)}"
                f" before they are removed ({reassignment.moving} partitions moving,"
                f" {reassignment.waiting} waiting)",
            )
        elif blockers:
            held = "; ".join(f"broker {b}: {', '.join(p)}" for b, p in sorted(blockers.items()))
            why = (
                "; ".join(reassignment.blocked)
                if reassignment is not None
                else "move them off with an Unload first"
            )
            ready = (
                "False",
                "ScaleDownBlocked",
                f"scaling down to {replicas} would remove brokers that still hold replicas"
                f" ({held}): {why}",
            )
        elif missing:
            ready = ("False", "BrokersNotLive", f"brokers {missing} are not live")
        else:
            ready = ("True", "AllBrokersLive", f"{replicas} brokers live")
        conditions.append(condition("Ready", *ready, generation, previous.get("Ready"), now))
        stalled = stalled_condition(conditions[-1], previous.get("Stalled"), now)
        if stalled is not None:
            conditions.append(stalled)
        kept = previous.get(objectstores.REACHABLE_CONDITION)
        if store is not None and not store.endpoint_known and store.uploads is None and kept:
            conditions.append(kept)  # not checked yet (a restart): as stored
        elif store is not None:
            reachable = (
                ("False", objectstores.UNREACHABLE, store.unreachable)
                if store.unreachable is not None
                else ("False", objectstores.UPLOADS_FAILING, store.uploads)
                if store.uploads is not None
                else ("True", "EndpointAnswers", "the object store's endpoint accepts connections")
            )
            conditions.append(
                condition(
                    objectstores.REACHABLE_CONDITION,
                    *reachable,
                    generation,
                    previous.get(objectstores.REACHABLE_CONDITION),
                    now,
                )
            )
        if reassignment is not None:
            conditions.append(
                condition(
                    "Rebalancing",
                    *_rebalancing(reassignment),
                    generation,
                    previous.get("Rebalancing"),
                    now,
                )
            )
    if observed is None:
        return {"conditions": conditions}
    return {"observedGeneration": observed, "conditions": conditions}


#: the condition of a cluster whose external listener is behind load balancers: whether
#: every broker's has an address (a broker without one is left out of that listener's
#: topology, so external clients cannot reach the partitions it leads)
EXTERNAL_ADDRESSES_CONDITION: Final = "ExternalAddressesAssigned"
EXTERNAL_ADDRESS_PENDING: Final = "ExternalAddressPending"


def external_addresses_condition(
    pending: Iterable[int], generation: int, previous: Mapping[str, Any] | None, now: str
) -> dict[str, Any]:
    """``ExternalAddressesAssigned``: False (``ExternalAddressPending``) while some brokers'
    load balancers have no address, naming them; True once every one has."""
    waiting = sorted(pending)
    if waiting:
        judged = (
            "False",
            EXTERNAL_ADDRESS_PENDING,
            f"brokers {waiting} wait for their load balancer's address"
            " (status.loadBalancer.ingress of their external Services): external clients"
            " are not told of them, the internal listener serves as before",
        )
    else:
        judged = ("True", "AllAddressesAssigned", "every broker's load balancer has an address")
    return condition(EXTERNAL_ADDRESSES_CONDITION, *judged, generation, previous, now)


def _rebalancing(summary: moves.Summary) -> tuple[str, str, str]:
    """The ``Rebalancing`` condition's status, reason and message."""
    if summary.rebalancing:
        return (
            "True",
            "MovingReplicas",
            f"{summary.moving} partitions moving replicas, {summary.waiting} waiting",
        )
    return ("False", "Balanced", "no replica moves in flight")
