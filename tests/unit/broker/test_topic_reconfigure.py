"""A standalone broker's topic settings changed after creation: checked, written, in force."""

from __future__ import annotations

from pathlib import Path

import pytest

from headrace.broker.topics import TopicRegistry
from headrace.errors import InvalidTopicSpec
from headrace.storage.bookkeeping import FsyncPolicy, LogConfig


def test_new_settings_are_in_force_for_open_logs_and_survive_a_restart(tmp_path: Path) -> None:
    base = LogConfig(fsync=FsyncPolicy.NONE)
    registry = TopicRegistry(tmp_path, base)
    registry.create("orders", 2, {"segment_bytes": 4096})
    registry.reconfigure("orders", {"segment_bytes": 4096, "retention_bytes": 1})
    for partition in registry.get("orders").partitions.values():
        assert (partition.log.config.retention_bytes, partition.log.config.segment_bytes) == (
            1,
            4096,
        )
    registry.close()

    again = TopicRegistry(tmp_path, base)
    again.load()
    assert again.get("orders").config == {"segment_bytes": 4096, "retention_bytes": 1}
    assert again.get("orders").partition(0).log.config.retention_bytes == 1
    again.close()


def test_a_bad_setting_changes_nothing(tmp_path: Path) -> None:
    registry = TopicRegistry(tmp_path, LogConfig(fsync=FsyncPolicy.NONE))
    registry.create("orders", 1, {"retention_ms": 5})
    with pytest.raises(InvalidTopicSpec):
        registry.reconfigure("orders", {"retention_ms": 5, "segment_bytes": 0})
    assert registry.get("orders").config == {"retention_ms": 5}
    assert registry.get("orders").partition(0).log.config.segment_bytes > 0
    registry.close()


def test_settings_the_controller_changes_are_in_force_for_open_logs(tmp_path: Path) -> None:
    """Cluster mode: ``ensure_topic`` with new settings (``headrace topics alter -c``)
    changes what the hosted partitions' logs roll and retain by, not only the topic file."""
    registry = TopicRegistry(tmp_path, LogConfig(fsync=FsyncPolicy.NONE))
    topic = registry.ensure_topic("orders", 1, 1, {"retention_ms": 5}, "id-1")
    registry.open_partition(topic, 0)
    registry.ensure_topic("orders", 1, 1, {"retention_ms": 7, "segment_bytes": 2048}, "id-1")
    config = registry.get("orders").partition(0).log.config
    assert (config.retention_ms, config.segment_bytes) == (7, 2048)
    registry.close()
