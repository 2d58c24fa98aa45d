"""The test bed's atomic volume writer (``e2e.testbed.projection``): the kubelet's
``..data`` layout, one atomic switch per update, no rewrite of an unchanged payload."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from e2e.testbed import podspec, projection


def test_first_write_makes_the_kubelet_layout(tmp_path: Path) -> None:
    assert projection.write(tmp_path, {"acl.json": b"{}", "conf/a.txt": b"A"}, 0o644)
    assert os.readlink(tmp_path / "..data").startswith("..")
    assert os.readlink(tmp_path / "acl.json") == "..data/acl.json"
    assert os.readlink(tmp_path / "conf") == "..data/conf"
    assert (tmp_path / "acl.json").read_bytes() == b"{}"
    assert (tmp_path / "conf" / "a.txt").read_bytes() == b"A"
    assert projection.current(tmp_path) == {"acl.json": b"{}", "conf/a.txt": b"A"}


def test_an_update_swaps_every_file_at_once_and_cleans_up(tmp_path: Path) -> None:
    projection.write(tmp_path, {"acl.json": b"v1", "gone.txt": b"x"}, 0o600)
    before = (tmp_path / "acl.json").stat()
    old_dir = os.readlink(tmp_path / "..data")
    assert projection.write(tmp_path, {"acl.json": b"v2", "new.txt": b"y"}, 0o600)
    after = (tmp_path / "acl.json").stat()
    # a watcher that stats the path (the brokers' ACL reload) sees a new file
    assert after.st_ino != before.st_ino
    assert (tmp_path / "acl.json").read_bytes() == b"v2"
    assert (tmp_path / "new.txt").read_bytes() == b"y"
    assert not (tmp_path / "gone.txt").exists() and not (tmp_path / "gone.txt").is_symlink()
    assert not (tmp_path / old_dir).exists()
    hidden = {p.name for p in tmp_path.iterdir() if p.name.startswith("..")}
    assert hidden == {"..data", os.readlink(tmp_path / "..data")}
    assert (after.st_mode & 0o777) == 0o600


def test_an_unchanged_payload_is_not_written_again(tmp_path: Path) -> None:
    projection.write(tmp_path, {"k": b"same"}, 0o644)
    inode = (tmp_path / "k").stat().st_ino
    assert not projection.write(tmp_path, {"k": b"same"}, 0o644)
    assert (tmp_path / "k").stat().st_ino == inode


def test_an_open_reader_keeps_the_old_content_whole(tmp_path: Path) -> None:
    projection.write(tmp_path, {"k": b"old"}, 0o644)
    with open(tmp_path / "k", "rb") as reader:
        projection.write(tmp_path, {"k": b"new"}, 0o644)
        assert reader.read() == b"old"
    assert (tmp_path / "k").read_bytes() == b"new"


@pytest.mark.parametrize("bad", ["../up", "/abs", "..hidden", "a/../../b"])
def test_paths_that_escape_or_hide_are_refused(tmp_path: Path, bad: str) -> None:
    with pytest.raises(projection.PayloadError):
        projection.write(tmp_path, {bad: b"x"}, 0o644)


def test_a_pinned_subpath_keeps_what_was_there_at_start(tmp_path: Path) -> None:
    volume = tmp_path / "volume"
    projection.write(volume, {"app.conf": b"color=blue"}, 0o644)
    pinned = projection.pin(volume / "app.conf", tmp_path / "subpaths" / "0")
    projection.write(volume, {"app.conf": b"color=red"}, 0o644)
    assert pinned.read_bytes() == b"color=blue"
    assert not pinned.is_symlink()
    container = {
        "volumeMounts": [{"name": "v", "mountPath": "/etc/app.conf", "subPath": "app.conf"}]
    }
    [mount] = podspec.mounts(container, {"v": volume}, {0: pinned})
    assert mount.host_path == pinned


def test_updating_volume_kinds() -> None:
    assert podspec.updates_in_place({"name": "a", "configMap": {"name": "x"}})
    assert podspec.updates_in_place({"name": "a", "secret": {"secretName": "x"}})
    assert podspec.updates_in_place({"name": "a", "projected": {"sources": []}})
    assert not podspec.updates_in_place({"name": "a", "emptyDir": {}})
