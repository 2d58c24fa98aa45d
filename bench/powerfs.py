"""A FUSE file system that forgets, on "power cut", everything not yet fsynced.

``kill -9`` keeps the page cache, so it never tests whether a program's
fsyncs are in the right places. Like LazyFS (which Jepsen used to find NATS
losing acknowledged writes), this pass-through file system keeps two images:

- the *live* image: the backing directory, which every read and write goes
  to (the page cache, in effect);
- the *durable* image: what a disk would hold after a power loss. A file's
  content enters it only through fsync/fdatasync of that file (only the
  ranges written since its last sync are copied); a directory's entries
  (creates, unlinks, renames, mkdirs) only through fsync of the directory.

``cut`` throws the live image away and rebuilds it from the durable one:
writes never synced vanish, a file created but whose directory was never
synced vanishes (even if the file itself was synced), a rename not followed
by a directory sync is undone. This is the strict POSIX reading, stricter
than ext4 in ordered mode; a program that survives it survives a real disk.

Files are tracked by an id of our own, given at creation, not by the backing
inode number: an inode freed by an unlink may be reused by a later create
while the durable image still names the old file.

Run as a process (``python -m bench.powerfs BACKING MOUNTPOINT --control SOCK``);
a Unix socket takes one-line commands: ``cut`` (the caller has killed every
process using the mount first, as a power loss would) and ``stats``, each
answered with one JSON line. ``PowerLossMount`` starts, drives and unmounts
it. Needs ``/dev/fuse``, libfuse3 (Debian's ``fuse3``) and ``mfusepy``.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import json
import os
import shutil
import socket
import stat
import subprocess
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from headrace.testing import waiting

ROOT_ID = 0
#: how many bytes ``_copy_range`` moves per read
_CHUNK = 1 << 20


@dataclass
class DurableImage:
    """What survives a power cut: directory entries and file contents, by file id."""

    #: directory id -> {name: (file id, is a directory)}
    dirs: dict[int, dict[str, tuple[int, bool]]] = field(default_factory=dict)
    #: file id -> the shadow file holding its synced content (absent: never synced, empty)
    shadows: Path = Path()


def _copy_range(src_fd: int, dst_fd: int, offset: int, length: int) -> None:
    end = offset + length
    while offset < end:
        chunk = os.pread(src_fd, min(_CHUNK, end - offset), offset)
        if not chunk:
            return
        os.pwrite(dst_fd, chunk, offset)
        offset += len(chunk)


class PowerLossFS:
    """The file system's operations (mfusepy's high-level, path-based API).

    One lock serialises every operation: correctness over speed (a broker
    writes a few kilobytes per batch; this is a test rig, not a product).
    """

    use_ns = True

    def __init__(self, backing: Path, shadows: Path) -> None:
        self.backing = backing
        self.shadows = shadows
        self._mutex = threading.RLock()
        self._next_id = ROOT_ID + 1
        #: backing inode -> our file id, for files and directories that exist live
        self.ids: dict[int, int] = {}
        #: file id -> (offset, length) written since its last fsync
        self.dirty: dict[int, list[list[int]]] = {}
        self.durable = DurableImage(shadows=shadows)
        self.open_fds: set[int] = set()
        self.cuts = 0
        self.fsyncs = 0
        self.dir_fsyncs = 0
        self.snapshot()

    # ---------------------------------------------------------------- bookkeeping

    def _real(self, path: str) -> str:
        return os.path.join(self.backing, path.lstrip("/"))

    def _new_id(self, ino: int) -> int:
        fid = self._next_id
        self._next_id += 1
        self.ids[ino] = fid
        return fid

    def _id_of(self, real: str) -> int:
        st = os.lstat(real)
        if real.rstrip("/") == str(self.backing).rstrip("/"):
            return ROOT_ID
        fid = self.ids.get(st.st_ino)
        return fid if fid is not None else self._new_id(st.st_ino)

    def _shadow(self, fid: int) -> Path:
        return self.shadows / str(fid)

    def snapshot(self) -> None:
        """Take the live image as durable (at mount, and after a cut rebuilt it)."""
        shutil.rmtree(self.shadows, ignore_errors=True)
        self.shadows.mkdir(parents=True)
        self.ids = {os.lstat(self.backing).st_ino: ROOT_ID}
        self.dirty = {}
        self.durable.dirs = {}
        for top, dirnames, filenames in os.walk(self.backing):
            entries: dict[str, tuple[int, bool]] = {}
            for name in dirnames:
                entries[name] = (self._new_id(os.lstat(os.path.join(top, name)).st_ino), True)
            for name in filenames:
                real = os.path.join(top, name)
                fid = self._new_id(os.lstat(real).st_ino)
                shutil.copyfile(real, self._shadow(fid))
                entries[name] = (fid, False)
            self.durable.dirs[self._id_of(top)] = entries

    def _forget(self, real: str) -> None:
        """``real`` is about to lose its last name: its id must not be reused."""
        with contextlib.suppress(FileNotFoundError):
            st = os.lstat(real)
            if stat.S_ISDIR(st.st_mode) or st.st_nlink <= 1:
                fid = self.ids.pop(st.st_ino, None)
                if fid is not None:
                    self.dirty.pop(fid, None)

    def sync_file(self, fd: int) -> None:
        """fsync/fdatasync: the file's size and every range written since make it durable."""
        st = os.fstat(fd)
        fid = self.ids.get(st.st_ino)
        if fid is None:
            fid = self._new_id(st.st_ino)
        ranges = self.dirty.pop(fid, [])
        shadow_fd = os.open(self._shadow(fid), os.O_RDWR | os.O_CREAT, 0o600)
        try:
            os.ftruncate(shadow_fd, st.st_size)
            for offset, length in ranges:
                if offset < st.st_size:
                    _copy_range(fd, shadow_fd, offset, min(length, st.st_size - offset))
        finally:
            os.close(shadow_fd)
        self.fsyncs += 1

    def sync_dir(self, real: str) -> None:
        """fsync of a directory: its current entries become the durable ones."""
        entries: dict[str, tuple[int, bool]] = {}
        for name in os.listdir(real):
            child = os.path.join(real, name)
            entries[name] = (self._id_of(child), stat.S_ISDIR(os.lstat(child).st_mode))
        self.durable.dirs[self._id_of(real)] = entries
        self.dir_fsyncs += 1

    def cut(self) -> dict[str, Any]:
        """Power loss: the live image becomes the durable one. Returns what was thrown away."""
        with self._mutex:
            for fd in list(self.open_fds):
                with contextlib.suppress(OSError):
                    os.close(fd)
            self.open_fds.clear()
            live_bytes = sum(
                os.lstat(os.path.join(top, name)).st_size
                for top, _dirs, names in os.walk(self.backing)
                for name in names
            )
            for child in os.listdir(self.backing):
                real = os.path.join(self.backing, child)
                if os.path.isdir(real) and not os.path.islink(real):
                    shutil.rmtree(real)
                else:
                    os.unlink(real)
            kept = self._rebuild(ROOT_ID, str(self.backing))
            self.cuts += 1
            self.snapshot()
            return {"cut": self.cuts, "live_bytes": live_bytes, "kept_bytes": kept}

    def _rebuild(self, dir_id: int, real: str) -> int:
        kept = 0
        for name, (fid, is_dir) in self.durable.dirs.get(dir_id, {}).items():
            target = os.path.join(real, name)
            if is_dir:
                os.mkdir(target)
                kept += self._rebuild(fid, target)
            elif self._shadow(fid).exists():
                shutil.copyfile(self._shadow(fid), target)
                kept += os.path.getsize(target)
            else:
                Path(target).touch()  # named durably, content never synced
        return kept

    def stats(self) -> dict[str, Any]:
        with self._mutex:
            return {
                "cuts": self.cuts,
                "fsyncs": self.fsyncs,
                "dir_fsyncs": self.dir_fsyncs,
                "dirty_files": len(self.dirty),
            }

    # ---------------------------------------------------------------- FUSE operations

    def getattr(self, path: str, fh: int | None = None) -> dict[str, Any]:
        with self._mutex:
            st = os.fstat(fh) if fh is not None else os.lstat(self._real(path))
        keys = ("st_mode", "st_nlink", "st_uid", "st_gid", "st_size", "st_ino")
        out: dict[str, Any] = {k: getattr(st, k) for k in keys}
        out.update(st_atime=st.st_atime_ns, st_mtime=st.st_mtime_ns, st_ctime=st.st_ctime_ns)
        return out

    def access(self, path: str, amode: int) -> int:
        if not os.access(self._real(path), amode):
            raise OSError(errno.EACCES, path)
        return 0

    def readdir(self, path: str, fh: int) -> list[str]:
        with self._mutex:
            return [".", "..", *os.listdir(self._real(path))]

    def opendir(self, path: str) -> int:
        return 0

    def fsyncdir(self, path: str, datasync: int, fh: int) -> int:
        with self._mutex:
            self.sync_dir(self._real(path))
        return 0

    def mkdir(self, path: str, mode: int) -> int:
        with self._mutex:
            real = self._real(path)
            os.mkdir(real, mode)
            self._new_id(os.lstat(real).st_ino)
        return 0

    def rmdir(self, path: str) -> int:
        with self._mutex:
            real = self._real(path)
            self._forget(real)
            os.rmdir(real)
        return 0

    def unlink(self, path: str) -> int:
        with self._mutex:
            real = self._real(path)
            self._forget(real)
            os.unlink(real)
        return 0

    def rename(self, old: str, new: str) -> int:
        with self._mutex:
            self._forget(self._real(new))  # replaced: the old target loses its name
            os.rename(self._real(old), self._real(new))
        return 0

    def chmod(self, path: str, mode: int) -> int:
        os.chmod(self._real(path), mode)
        return 0

    def utimens(self, path: str, times: tuple[int, int] | None = None) -> int:
        with self._mutex:
            os.utime(self._real(path), ns=times)
        return 0

    def statfs(self, path: str) -> dict[str, int]:
        sv = os.statvfs(self._real(path))
        keys = ("f_bavail", "f_bfree", "f_blocks", "f_bsize", "f_favail", "f_ffree", "f_files")
        out = {k: getattr(sv, k) for k in keys}
        out.update(f_flag=sv.f_flag, f_frsize=sv.f_frsize, f_namemax=sv.f_namemax)
        return out

    def create(self, path: str, mode: int, fi: Any = None) -> int:
        with self._mutex:
            real = self._real(path)
            fd = os.open(real, os.O_RDWR | os.O_CREAT | os.O_TRUNC, mode)
            self._new_id(os.fstat(fd).st_ino)
            self.open_fds.add(fd)
            return fd

    def open(self, path: str, flags: int) -> int:
        with self._mutex:
            # O_APPEND is the kernel's business: it sends writes at the file's end
            fd = os.open(self._real(path), flags & ~(os.O_CREAT | os.O_EXCL | os.O_APPEND))
            self.open_fds.add(fd)
            return fd

    def read(self, path: str, size: int, offset: int, fh: int) -> bytes:
        with self._mutex:
            return os.pread(fh, size, offset)

    def write(self, path: str, data: bytes, offset: int, fh: int) -> int:
        with self._mutex:
            written = os.pwrite(fh, data, offset)
            st = os.fstat(fh)
            fid = self.ids.get(st.st_ino)
            if fid is None:
                fid = self._new_id(st.st_ino)
            ranges = self.dirty.setdefault(fid, [])
            if ranges and ranges[-1][0] + ranges[-1][1] == offset:
                ranges[-1][1] += written  # appends: one growing range
            else:
                ranges.append([offset, written])
            return written

    def truncate(self, path: str, length: int, fh: int | None = None) -> int:
        with self._mutex:
            if fh is not None:
                os.ftruncate(fh, length)
            else:
                os.truncate(self._real(path), length)
        return 0

    def fallocate(self, path: str, mode: int, offset: int, size: int, fh: int) -> int:
        raise OSError(errno.EOPNOTSUPP, path)

    def flush(self, path: str, fh: int) -> int:
        return 0

    def fsync(self, path: str, datasync: int, fh: int) -> int:
        with self._mutex:
            self.sync_file(fh)
        return 0

    def release(self, path: str, fh: int) -> int:
        with self._mutex:
            if fh in self.open_fds:
                self.open_fds.discard(fh)
                os.close(fh)
        return 0


def _serve_control(fs: PowerLossFS, sock_path: Path) -> None:
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    with contextlib.suppress(FileNotFoundError):
        sock_path.unlink()
    server.bind(str(sock_path))
    server.listen(4)
    while True:
        conn, _ = server.accept()
        with conn, conn.makefile("rwb") as stream:
            for line in stream:
                command = line.decode().strip()
                if command == "cut":
                    reply: dict[str, Any] = fs.cut()
                elif command == "stats":
                    reply = fs.stats()
                else:
                    reply = {"error": f"unknown command {command!r}"}
                stream.write(json.dumps(reply).encode() + b"\n")
                stream.flush()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("backing", type=Path)
    parser.add_argument("mountpoint", type=Path)
    parser.add_argument("--control", type=Path, required=True, help="Unix socket for commands")
    args = parser.parse_args(argv)
    import mfusepy

    class PowerLossOperations(PowerLossFS, mfusepy.Operations):  # type: ignore[misc]
        """Ours first; mfusepy's defaults (ignored by libfuse) for the rest."""

    backing = args.backing.resolve()
    fs = PowerLossOperations(backing, backing.parent / f"{backing.name}.durable")
    threading.Thread(target=_serve_control, args=(fs, args.control), daemon=True).start()
    # No attribute or entry caching, and no page cache (direct_io): after a cut the
    # kernel must not serve sizes or bytes from the image that was thrown away.
    mfusepy.FUSE(
        fs,
        str(args.mountpoint),
        foreground=True,
        nothreads=False,
        direct_io=True,
        attr_timeout=0,
        entry_timeout=0,
        negative_timeout=0,
        fsname="powerfs",
    )


class PowerLossMount:
    """A ``powerfs`` process mounted at ``root/mnt`` over ``root/backing``."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.backing = root / "backing"
        self.mountpoint = root / "mnt"
        self.control = root / "control.sock"
        self.log_path = root / "powerfs.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 20.0) -> None:
        from headrace.testing import procs

        self.backing.mkdir(parents=True, exist_ok=True)
        self.mountpoint.mkdir(parents=True, exist_ok=True)
        self.proc = procs.spawn(
            [
                sys.executable,
                "-m",
                "bench.powerfs",
                str(self.backing),
                str(self.mountpoint),
                "--control",
                str(self.control),
            ],
            self.log_path,
        )
        waiting.until(
            lambda: (
                self._check_alive() and os.path.ismount(self.mountpoint) and self.control.exists()
            ),
            timeout,
            f"powerfs mounted at {self.mountpoint}",
        )

    def _check_alive(self) -> bool:
        if self.proc is not None and self.proc.poll() is not None:
            raise RuntimeError(
                f"powerfs exited with {self.proc.returncode}: {self.log_path.read_text()[-2000:]}"
            )
        return True

    def command(self, command: str, timeout: float = 60.0) -> dict[str, Any]:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(timeout)
            s.connect(str(self.control))
            s.sendall(command.encode() + b"\n")
            with s.makefile("rb") as stream:
                reply: dict[str, Any] = json.loads(stream.readline())
        return reply

    def cut(self) -> dict[str, Any]:
        """Power loss. Every process with a file open on the mount must be dead first."""
        return self.command("cut")

    def stop(self) -> None:
        from headrace.testing import procs

        if self.proc is None:
            return
        subprocess.run(
            ["fusermount3", "-u", "-z", str(self.mountpoint)], check=False, capture_output=True
        )
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(10)
        procs.reap(self.proc)
        self.proc = None


def fuse_unavailable() -> str | None:
    """Why a powerfs mount cannot work here, or None when it can."""
    if not os.path.exists("/dev/fuse"):
        return "no /dev/fuse"
    if shutil.which("fusermount3") is None:
        return "fusermount3 missing (Debian package fuse3)"
    try:
        import mfusepy  # noqa: F401
    except (ImportError, OSError) as exc:  # OSError: libfuse itself is missing
        return f"mfusepy/libfuse3 unavailable: {exc}"
    if os.geteuid() != 0:
        return "not root: mounting FUSE needs root here"
    return None


if __name__ == "__main__":
    main()
