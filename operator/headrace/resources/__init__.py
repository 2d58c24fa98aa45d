"""The custom resources of group ``headrace.dev``, version ``v1alpha1``.

One source of truth: pydantic models of every kind (``BrokerCluster``,
``Topic``, ``Repartition``, ``Unload``, ``Compaction``, ``CompactionSchedule``,
``TopicSnapshot``, ``TopicSnapshotSchedule``, ``TopicRestore``, ``User``),
from which :mod:`headrace.resources.crdgen` generates ``crds/`` and against which
:func:`load_manifests` validates what users apply. Pure data, no I/O.

    resources = load_manifests(text)   # all or nothing; raises ManifestError
    topic.spec.min_in_sync             # snake_case in Python
    topic.to_manifest()["spec"]["minInSync"]   # camelCase on the wire
"""

from headrace.resources.clusters import BrokerCluster, BrokerClusterSpec, BrokerClusterStatus
from headrace.resources.compactions import (
    Compaction,
    CompactionSchedule,
    CompactionScheduleSpec,
    CompactionScheduleStatus,
    CompactionSpec,
    CompactionStatus,
)
from headrace.resources.loading import (
    KINDS,
    ManifestError,
    in_apply_order,
    load_keys,
    load_manifests,
    load_source_keys,
    load_sources,
)
from headrace.resources.meta import (
    API_VERSION,
    GROUP,
    READY,
    VERSION,
    Condition,
    ConditionStatus,
    ObjectMeta,
    Resource,
    ResourceKey,
    Status,
)
from headrace.resources.operations import (
    Repartition,
    RepartitionSpec,
    RepartitionStatus,
    Unload,
    UnloadSpec,
    UnloadStatus,
)
from headrace.resources.snapshots import (
    TopicRestore,
    TopicRestoreSpec,
    TopicRestoreStatus,
    TopicSnapshot,
    TopicSnapshotSchedule,
    TopicSnapshotScheduleSpec,
    TopicSnapshotScheduleStatus,
    TopicSnapshotSpec,
    TopicSnapshotStatus,
)
from headrace.resources.topics import Topic, TopicSpec, TopicStatus
from headrace.resources.users import User, UserSpec, UserStatus

__all__ = [
    "API_VERSION",
    "GROUP",
    "KINDS",
    "READY",
    "VERSION",
    "BrokerCluster",
    "BrokerClusterSpec",
    "BrokerClusterStatus",
    "Compaction",
    "CompactionSchedule",
    "CompactionScheduleSpec",
    "CompactionScheduleStatus",
    "CompactionSpec",
    "CompactionStatus",
    "Condition",
    "ConditionStatus",
    "ManifestError",
    "ObjectMeta",
    "Repartition",
    "RepartitionSpec",
    "RepartitionStatus",
    "Resource",
    "ResourceKey",
    "Status",
    "Topic",
    "TopicRestore",
    "TopicRestoreSpec",
    "TopicRestoreStatus",
    "TopicSnapshot",
    "TopicSnapshotSchedule",
    "TopicSnapshotScheduleSpec",
    "TopicSnapshotScheduleStatus",
    "TopicSnapshotSpec",
    "TopicSnapshotStatus",
    "TopicSpec",
    "TopicStatus",
    "Unload",
    "UnloadSpec",
    "UnloadStatus",
    "User",
    "UserSpec",
    "UserStatus",
    "in_apply_order",
    "load_keys",
    "load_manifests",
    "load_source_keys",
    "load_sources",
]
