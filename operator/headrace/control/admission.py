"""What an applied Topic asks for that this cluster cannot honour (pure).

``apply`` is admission: before a Topic is stored, ``topic_problems`` compares
its spec with the cluster that would run it, the way an admission webhook
would, so that a spec which can never be carried out is refused with one
readable line instead of being stored, reported "applied" and left to show
up only as a Ready condition later.

    reason                  when
    ----------------------  --------------------------------------------------------
    UnknownCluster          ``clusterRef.name`` is not this cluster's name
    NotEnoughBrokers        ``replicas`` exceeds the brokers the cluster has at all
                            (not the live ones: a dead broker is a passing problem)
    ReplicasChange          the topic exists with another replication factor
    CompactionUnsupported   ``cleanupPolicy: compact``: local mode schedules no compaction

A spec that passes may still wait (for brokers to come up, say); those are
the reconcile step's ``Problem``s, not admission's. An edit of ``partitions``
is not refused: it starts a live repartition (``repartitions``).

``repartition_problems`` does the same for a Repartition:

    reason                  when
    ----------------------  --------------------------------------------------------
    UnknownTopic            no Topic of that name has been applied
    SamePartitionCount      the topic already has (or is repartitioning to) that count
    TopicUnloading          an Unload of the topic is unfinished, or a partition sealed

The control core checks the same again when the request starts, so a request
that slips past (applied while an Unload was being applied, say) fails with
the reason instead of running.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

from headrace.control.documents import full_name
from headrace.control.model import TopicStatus
from headrace.resources import operations as operation_models
from headrace.resources import topics as topic_models


@dataclass(frozen=True, slots=True)
class AdmissionProblem:
    #: "topic namespace/name"
    subject: str
    #: CamelCase, from the table in the module docstring
    reason: str
    #: one line, naming what was asked and what the cluster has
    message: str

    def line(self) -> str:
        return f"{self.subject}: {self.message}"


def topic_problems(
    resource: Mapping[str, Any],
    *,
    cluster_name: str,
    brokers: int,
    existing: TopicStatus | None,
) -> list[AdmissionProblem]:
    """The problems of one Topic document whose spec already validated (``spec_of``).

    ``brokers``: how many brokers the cluster has; ``existing``: the topic's
    status if it has been placed.
    """
    spec = topic_models.TopicSpec.model_validate(resource.get("spec"))
    subject = f"topic {full_name(resource)}"
    problems: list[AdmissionProblem] = []

    def problem(reason: str, message: str) -> None:
        problems.append(AdmissionProblem(subject, reason, message))

    if spec.cluster_ref.name != cluster_name:
        problem(
            "UnknownCluster",
            f"clusterRef {spec.cluster_ref.name!r} is not this cluster: it is named"
            f" {cluster_name!r}",
        )
    if spec.replicas > brokers:
        problem(
            "NotEnoughBrokers",
            f"{spec.replicas} replicas need {spec.replicas} brokers, the cluster has {brokers}",
        )
    if existing is not None and existing.partitions:
        rf = existing.partitions[0].replication_factor
        if spec.replicas != rf:
            problem(
                "ReplicasChange",
                f"replicas {spec.replicas}, but the topic has {rf}: changing the replication"
                " factor is not supported",
            )
    if spec.cleanup_policy is topic_models.CleanupPolicy.COMPACT:
        problem(
            "CompactionUnsupported",
            "cleanupPolicy compact needs scheduled compaction, which local mode does not run:"
            " use delete and run `headrace compact TOPIC --keep-last-per-key`",
        )
    return problems


def repartition_problems(
    resource: Mapping[str, Any],
    *,
    topics: Mapping[str, Mapping[str, Any]],
    existing: Mapping[str, TopicStatus],
    unloading: Collection[str],
) -> list[AdmissionProblem]:
    """The problems of one Repartition document (validated by its model).

    ``topics``: the applied Topic resources by name; ``existing``: the placed
    topics' statuses; ``unloading``: topics with an unfinished Unload.
    """
    spec = operation_models.RepartitionSpec.model_validate(resource.get("spec"))
    namespace = resource.get("metadata", {}).get("namespace", "default")
    topic = f"{namespace}/{spec.topic_ref.name}"
    subject = f"repartition {full_name(resource)}"
    if topic not in topics:
        return [AdmissionProblem(subject, "UnknownTopic", f"topic {topic} does not exist")]
    problems: list[AdmissionProblem] = []
    status = existing.get(topic)
    if status is not None:
        now = status.routing_partitions
        if spec.partitions == now:
            problems.append(
                AdmissionProblem(
                    subject,
                    "SamePartitionCount",
                    f"topic {topic} already has {now} partitions: nothing to repartition",
                )
            )
    if topic in unloading:
        problems.append(
            AdmissionProblem(
                subject,
                "TopicUnloading",
                f"topic {topic} is mid-Unload: apply the Repartition once the Unload finishes",
            )
        )
    return problems
