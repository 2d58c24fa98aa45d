"""Repartitions in the operator: which cluster's loop serves one, and the one nobody serves.

A Repartition names a topic (``spec.topicRef``), not a cluster. The loop of the
BrokerCluster that owns that Topic (its ``clusterRef``) serves it: the desired
state it takes at every step holds the Repartitions of its Topics, as kopf's index
last delivered them (``held``), and the shared ``ControlLoop`` runs the transition (the
pure core ``headrace.control.repartitions``) and writes the Repartition's
status through ``KubeStatusStore``, as in local mode.

A Repartition of a Topic that does not exist belongs to no loop, so the kopf
handler fails it here (``missing_topic_status``), once, after reading the
Topic from the API server (the index may lag a Topic applied in the same
``kubectl apply``). A Topic created later does not revive it: a one-shot
request that failed stays failed, as the core's own refusals do. One of a
Topic whose BrokerCluster does not exist is told it waits for that cluster
(``missing_cluster_status``); the cluster's loop takes it from there.

Deleting a Repartition needs no finalizer: before its cutover nothing has
changed yet, and after it the transition marker in the Topic's status carries
everything the transition needs, so it rolls forward to Finalized and only
the record of it goes (``ControlLoop.forget_repartition``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Final

from headrace.control import documents
from headrace.control.model import RepartitionPhase, RepartitionProgress
from headrace.operator.bodies import Parsed, parse_repartition
from headrace.operator.statuses import KubeStatusStore
from headrace.resources import Repartition
from headrace.resources.meta import READY

KIND: Final = "Repartition"


def topic_of(repartition: Parsed[Repartition]) -> str | None:
    """'namespace/topic' that the Repartition asks to change (None: its spec does not
    parse, so it names none)."""
    if repartition.resource is None:
        return None
    return f"{repartition.meta.namespace}/{repartition.resource.spec.topic_ref.name}"


def owned(
    bodies: Iterable[Mapping[str, Any]], topics: Iterable[str]
) -> list[tuple[Parsed[Repartition], Mapping[str, Any]]]:
    """The Repartitions among ``bodies`` whose topic is one of ``topics`` ('ns/name'), each
    parsed, beside its body (what the control loop adopts)."""
    mine = set(topics)
    parsed = ((parse_repartition(b), b) for b in bodies if b.get("kind", KIND) == KIND)
    return [(r, b) for r, b in parsed if topic_of(r) in mine]


def held(
    store: KubeStatusStore,
    bodies: Iterable[Mapping[str, Any]],
    topics: Iterable[str],
) -> dict[str, Mapping[str, Any]]:
    """The loop's Repartitions: those of ``bodies`` whose topic is in ``topics``, by
    'namespace/name', each as its body (``DesiredState.repartitions``).

    The loop adopts a new one with the status it has; one it already serves keeps the
    loop's own record (its status comes back through the watch, the loop's is never
    older); one it serves that is not here is forgotten (deleted: see the module).
    """
    mine: dict[str, Mapping[str, Any]] = {}
    for repartition, body in owned(bodies, topics):
        store.remember(body)
        mine[repartition.meta.full_name] = body
    return mine


def missing_topic_status(repartition: Parsed[Repartition], now_ms: int) -> dict[str, Any] | None:
    """The status of a Repartition whose Topic does not exist: Failed, saying so. None when
    it already has a phase (one served before keeps its record: its topic may have been
    deleted after it finished)."""
    message = f"topic {topic_of(repartition)} does not exist"
    return _unserved(repartition, RepartitionPhase.FAILED, message, now_ms)


def missing_cluster_status(
    repartition: Parsed[Repartition], cluster: str, now_ms: int
) -> dict[str, Any] | None:
    """The status of a Repartition whose Topic's BrokerCluster does not exist: Pending (the
    cluster's loop serves it once the cluster exists). None when it already has a phase."""
    topic = topic_of(repartition)
    message = f"waiting: BrokerCluster {cluster!r} of topic {topic} does not exist"
    return _unserved(repartition, RepartitionPhase.PENDING, message, now_ms)


def _unserved(
    repartition: Parsed[Repartition], phase: RepartitionPhase, message: str, now_ms: int
) -> dict[str, Any] | None:
    model = repartition.resource
    if model is None or repartition.status_problem is not None:
        return None  # what it says cannot be known: nothing is written over it
    if model.status is not None and model.status.phase:
        return None
    ready = None if model.status is None else model.status.condition(READY)
    progress = RepartitionProgress(repartition.meta.full_name, phase=phase, message=message)
    return documents.repartition_status(
        progress,
        repartition.meta.generation,
        None if ready is None else ready.model_dump(mode="json", by_alias=True, exclude_unset=True),
        documents.condition_time(now_ms),
    )
