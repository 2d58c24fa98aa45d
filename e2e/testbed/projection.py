"""Projected volume files, written the way the kubelet's ``AtomicWriter`` writes them.

A ConfigMap, Secret, downwardAPI or projected volume is a directory whose content a
running pod sees change all at once, never half old and half new. The kubelet gets that
with one level of indirection (and so does this module):

* the payload is written into a fresh hidden directory ``..<timestamp>``;
* ``..data`` is a symlink to it, replaced by a rename of ``..data_tmp`` (atomic);
* each top-level entry a pod sees (``acl.json``, ``nested/``) is a symlink
  ``<entry> -> ..data/<entry>``, so a reader that opens ``acl.json`` gets the new file
  (a new inode) as soon as ``..data`` turns, and a ``stat`` of it tells a watcher that it
  changed;
* the previous ``..<timestamp>`` directory and entries no longer in the payload are
  removed last.

A payload equal to what is in force is not written again (no new inode, no reload in the
pods). ``subPath`` mounts never see updates: the runner copies them at container start
(:func:`pin`), as the kubelet bind-mounts the file that was there.
"""

from __future__ import annotations

import datetime
import os
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path, PurePosixPath

DATA_LINK = "..data"
_TMP_LINK = "..data_tmp"


class PayloadError(ValueError):
    """A payload path that is absolute, climbs out of the volume, or is hidden (``..x``)."""


def _check(payload: Mapping[str, bytes]) -> None:
    for rel in payload:
        parts = PurePosixPath(rel).parts
        if not rel or PurePosixPath(rel).is_absolute() or ".." in parts:
            raise PayloadError(f"volume item path {rel!r} escapes the volume")
        if parts[0].startswith(".."):
            raise PayloadError(f"volume item path {rel!r} starts with '..' (reserved)")


def current(target: Path) -> dict[str, bytes] | None:
    """The payload in force under ``target``, or None before the first write."""
    data = target / DATA_LINK
    if not data.is_symlink():
        return None
    root = target / os.readlink(data)
    out: dict[str, bytes] = {}
    for path in root.rglob("*"):
        if path.is_file():
            out[path.relative_to(root).as_posix()] = path.read_bytes()
    return out


def write(target: Path, payload: Mapping[str, bytes], mode: int) -> bool:
    """Make ``payload`` the volume's content in one atomic step; False if it already is."""
    _check(payload)
    target.mkdir(parents=True, exist_ok=True)
    if current(target) == dict(payload):
        return False
    data_link = target / DATA_LINK
    old_dir = os.readlink(data_link) if data_link.is_symlink() else None
    stamp = datetime.datetime.now(datetime.UTC).strftime("..%Y_%m_%d_%H_%M_%S.")
    new_dir = Path(tempfile.mkdtemp(prefix=stamp, dir=target))
    new_dir.chmod(0o755)
    for rel, content in payload.items():
        path = new_dir / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "wb") as handle:
            handle.write(content)
        path.chmod(mode)
    tmp_link = target / _TMP_LINK
    tmp_link.unlink(missing_ok=True)
    tmp_link.symlink_to(new_dir.name)
    tmp_link.rename(data_link)  # the switch: readers see all old or all new
    tops = {PurePosixPath(rel).parts[0] for rel in payload}
    for top in tops:
        visible = target / top
        if not visible.is_symlink():
            visible.symlink_to(f"{DATA_LINK}/{top}")
    for entry in target.iterdir():
        if not entry.name.startswith("..") and entry.name not in tops:
            _remove(entry)
    if old_dir is not None and old_dir != new_dir.name:
        shutil.rmtree(target / old_dir, ignore_errors=True)
    return True


def pin(source: Path, destination: Path) -> Path:
    """A copy of what ``source`` (a ``subPath`` in a volume) is now, at ``destination``,
    which never changes after: what a container's ``subPath`` mount shows. Copied again
    on each container start, as the kubelet mounts the file found at that moment."""
    _remove(destination)
    destination.parent.mkdir(parents=True, exist_ok=True)
    if source.is_dir():
        shutil.copytree(source, destination, symlinks=False)
    elif source.exists():
        shutil.copy2(source, destination)
    else:  # the kubelet creates a missing subPath as an empty directory
        destination.mkdir()
    return destination


def _remove(path: Path) -> None:
    if path.is_symlink() or path.is_file():
        path.unlink()
    elif path.is_dir():
        shutil.rmtree(path)
