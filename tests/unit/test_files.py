"""The one atomic write helper: replace-or-keep, the fsyncs it promises, modes."""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from headrace import files


def _record_fsyncs(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every ``os.fsync`` (of a file or of a directory) and ``os.replace``, in order."""
    events: list[str] = []
    real = {"fsync": os.fsync, "replace": os.replace}

    def spy(name: str) -> Callable[..., None]:
        def call(*args: Any) -> None:
            if name == "fsync":
                is_dir = os.path.isdir(f"/proc/self/fd/{args[0]}")
                events.append("fsync-dir" if is_dir else "fsync-file")
            else:
                events.append("rename")
            real[name](*args)

        return call

    for name in real:
        monkeypatch.setattr(os, name, spy(name))
    return events


def test_sync_write_fsyncs_file_then_renames_then_fsyncs_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    events = _record_fsyncs(monkeypatch)
    files.write_json_atomic(tmp_path / "doc.json", {"b": 1, "a": 2}, sort_keys=True)
    assert events == ["fsync-file", "rename", "fsync-dir"]
    assert (tmp_path / "doc.json").read_text() == '{"a": 2, "b": 1}'
    assert sorted(p.name for p in tmp_path.iterdir()) == ["doc.json"]


def test_unsynced_write_only_renames(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    events = _record_fsyncs(monkeypatch)
    files.write_atomic(tmp_path / "f", b"x", sync=False)
    assert events == ["rename"]
    assert (tmp_path / "f").read_bytes() == b"x"


def test_json_matches_json_dump(tmp_path: Path) -> None:
    doc = {"z": [1, 2], "a": {"k": "v"}}
    files.write_json_atomic(tmp_path / "d", doc, indent=2, sort_keys=True)
    assert (tmp_path / "d").read_text() == json.dumps(doc, indent=2, sort_keys=True)


def test_mode_applies_to_the_new_file(tmp_path: Path) -> None:
    files.write_atomic(tmp_path / "secret", b"s", mode=0o600)
    assert stat.S_IMODE((tmp_path / "secret").stat().st_mode) == 0o600


def test_a_failed_write_keeps_the_old_content_and_no_temporary(tmp_path: Path) -> None:
    target = tmp_path / "f"
    target.write_bytes(b"old")

    def crash_mid_write() -> None:
        with files.atomic_writer(target) as fh:
            fh.write(b"new")
            raise RuntimeError("crash mid-write")

    with pytest.raises(RuntimeError):
        crash_mid_write()
    assert target.read_bytes() == b"old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f"]


def test_named_temporary_and_exclusive(tmp_path: Path) -> None:
    target, tmp = tmp_path / "f.json", tmp_path / "f.tmp"
    files.write_atomic(target, b"1", tmp=tmp)
    assert target.read_bytes() == b"1" and not tmp.exists()
    tmp.write_bytes(b"someone else's")
    with pytest.raises(FileExistsError):
        with files.atomic_writer(target, tmp=tmp, exclusive=True):
            pass
    assert tmp.read_bytes() == b"someone else's"  # not ours: left alone
    assert target.read_bytes() == b"1"


def test_mkdir_durable_syncs_the_parent_of_every_directory_it_creates(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    synced: list[Path] = []
    monkeypatch.setattr(files, "fsync_directory", synced.append)
    (tmp_path / "a").mkdir()
    files.mkdir_durable(tmp_path / "a" / "b" / "c")
    assert (tmp_path / "a" / "b" / "c").is_dir()
    # the new names "b" and "c" live in a and a/b: those two are synced, parents first
    assert synced == [tmp_path / "a", tmp_path / "a" / "b"]
    synced.clear()
    files.mkdir_durable(tmp_path / "a" / "b")  # exists already: nothing to make durable
    assert synced == []


def test_directory_syncs_fsync_each_directory_once_at_flush(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    events = _record_fsyncs(monkeypatch)
    syncs = files.DirectorySyncs()
    made = [tmp_path / "t" / str(i) for i in range(20)]
    for directory in made:
        files.mkdir_durable(directory, syncs)
        syncs.add(directory)  # as a new segment file in it would
    assert events == []  # nothing synced yet
    syncs.flush()
    # the topic directory's parent, the topic directory (once), each partition directory
    assert events == ["fsync-dir"] * 22
    syncs.flush()
    assert events == ["fsync-dir"] * 22  # nothing owed twice


def test_directory_syncs_flush_raises_the_first_error(tmp_path: Path) -> None:
    syncs = files.DirectorySyncs()
    for i in range(4):
        (tmp_path / str(i)).mkdir()
        syncs.add(tmp_path / str(i))
    syncs.add(tmp_path / "gone")
    with pytest.raises(FileNotFoundError):
        syncs.flush()
