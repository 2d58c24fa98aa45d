"""Repartitions in the operator: which cluster's loop serves one, and the one nobody serves.

A Repartition names a topic (``spec.topicRef``), not a cluster. The loop of the
BrokerCluster that owns that Topic (its ``clusterRef``) serves it: ``sync``
hands it the Repartitions of its Topics, as kopf's index last delivered them,
before every step, and the shared ``ControlLoop`` runs the transition (the
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
from headrace.control.looping import ControlLoop
from headrace.control.model import RepartitionPhase, RepartitionProgress
from headrace.operator.statuses import KubeStatusStore

KIND: Final = "Repartition"


def topic_of(body: Mapping[str, Any]) -> str:
    """'namespace/topic' that the Repartition ``body`` asks to change."""
    namespace = body.get("metadata", {}).get("namespace", "default")
    return f"{namespace}/{((body.get('spec') or {}).get('topicRef') or {}).get('name')}"


def owned(bodies: Iterable[Mapping[str, Any]], topics: Iterable[str]) -> list[Mapping[str, Any]]:
    """The Repartitions among ``bodies`` whose topic is one of ``topics`` ('ns/name')."""
    mine = set(topics)
    return [b for b in bodies if b.get("kind", KIND) == KIND and topic_of(b) in mine]


def sync(
    loop: ControlLoop,
    store: KubeStatusStore,
    bodies: Iterable[Mapping[str, Any]],
    topics: Iterable[str],
) -> None:
    """Make the loop's Repartitions those of ``bodies`` whose topic is in ``topics``.

    A new one is adopted with the status it has (``ControlLoop.adopt_repartition``); one
    the loop already serves keeps the loop's own record (its status comes back through
    the watch, the loop's is never older); one no longer there is forgotten (deleted:
    see the module).
    """
    seen = set()
    for body in owned(bodies, topics):
        name = documents.full_name(body)
        seen.add(name)
        store.remember(body)
        if name not in loop.repartitions:
            loop.adopt_repartition(body)
    for name in set(loop.repartitions) - seen:
        loop.forget_repartition(name)


def missing_topic_status(body: Mapping[str, Any], now_ms: int) -> dict[str, Any] | None:
    """The status of a Repartition whose Topic does not exist: Failed, saying so. None when
    it already has a phase (one served before keeps its record: its topic may have been
    deleted after it finished)."""
    return _unserved(
        body, RepartitionPhase.FAILED, f"topic {topic_of(body)} does not exist", now_ms
    )


def missing_cluster_status(
    body: Mapping[str, Any], cluster: str, now_ms: int
) -> dict[str, Any] | None:
    """The status of a Repartition whose Topic's BrokerCluster does not exist: Pending (the
    cluster's loop serves it once the cluster exists). None when it already has a phase."""
    message = f"waiting: BrokerCluster {cluster!r} of topic {topic_of(body)} does not exist"
    return _unserved(body, RepartitionPhase.PENDING, message, now_ms)


def _unserved(
    body: Mapping[str, Any], phase: RepartitionPhase, message: str, now_ms: int
) -> dict[str, Any] | None:
    status = body.get("status") or {}
    if status.get("phase"):
        return None
    progress = RepartitionProgress(documents.full_name(body), phase=phase, message=message)
    return documents.repartition_status(
        progress,
        documents.generation_of(body),
        documents.previous_ready(status),
        documents.condition_time(now_ms),
    )
