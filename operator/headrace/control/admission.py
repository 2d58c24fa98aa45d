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
    PartitionCountChange    the topic exists with another partition count; changing
                            it needs a repartition, which does not exist yet
    ReplicasChange          the topic exists with another replication factor
    CompactionUnsupported   ``cleanupPolicy: compact``: local mode schedules no compaction

A spec that passes may still wait (for brokers to come up, say); those are
the reconcile step's ``Problem``s, not admission's.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from headrace.control.documents import full_name
from headrace.control.model import TopicStatus
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
        have = len(existing.partitions)
        if spec.partitions != have:
            problem(
                "PartitionCountChange",
                f"partitions {spec.partitions}, but the topic has {have}: changing the count"
                " needs a repartition, which is not supported yet",
            )
        rf = len(existing.partitions[0].replicas)
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
