"""Loopback address allocation for pods (pure).

Every pod gets its own address in 127.0.0.0/8 so that several pods can listen on the
same port, as they can in a cluster. On Linux the whole /8 is routed to ``lo`` with no
setup. Each test bed draws from its own block ``127.<block>.0.0/16`` (the block is
derived from the state directory, see :func:`block_for`), so two test beds on one
machine, say a developer's and a test's, do not hand out the same address. 127.0.0.1
stays the control plane's. Addresses are handed out round robin, so a pod that comes
back (a StatefulSet member) usually gets a *different* address than its predecessor, as
in a real cluster: nothing may rely on pod IPs.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass, field


def block_for(key: str) -> int:
    """A stable second octet in 1..254 for a test bed identified by ``key``."""
    return 1 + zlib.crc32(key.encode()) % 254


def from_str(addr: str) -> int | None:
    """Dotted quad to integer; None if it is not one."""
    parts = addr.split(".")
    if len(parts) != 4 or not all(p.isdigit() and int(p) < 256 for p in parts):
        return None
    return (int(parts[0]) << 24) | (int(parts[1]) << 16) | (int(parts[2]) << 8) | int(parts[3])


def to_str(n: int) -> str:
    return ".".join(str((n >> s) & 0xFF) for s in (24, 16, 8, 0))


@dataclass
class Pool:
    """Addresses in use, keyed by pod UID, from ``127.<block>.0.2 .. 127.<block>.255.254``.

    65k addresses per block is more pods than a 2-core machine will run.
    """

    block: int = 0
    by_owner: dict[str, int] = field(default_factory=dict)
    next: int = 0

    @property
    def first(self) -> int:
        return (127 << 24) | (self.block << 16) | 2

    @property
    def last(self) -> int:
        return (127 << 24) | (self.block << 16) | (255 << 8) | 254

    def allocate(self, owner: str, prefer: str | None = None) -> str:
        """The owner's address, allocating one if it has none. Raises when full.

        ``prefer`` is an address the owner had before (a runner restart finds it in the
        pod's status); it is kept if it is in the block and free, because a pod's IP may
        not change while the pod lives.
        """
        if owner in self.by_owner:
            return to_str(self.by_owner[owner])
        used = set(self.by_owner.values())
        wanted = from_str(prefer) if prefer else None
        if wanted is not None and self.first <= wanted <= self.last and wanted not in used:
            self.by_owner[owner] = wanted
            return to_str(wanted)
        span = self.last - self.first + 1
        start = self.next if self.first <= self.next <= self.last else self.first
        for i in range(span):
            n = self.first + (start - self.first + i) % span
            if n & 0xFF in (0, 255):  # avoid .0 and .255, which look like network/broadcast
                continue
            if n not in used:
                self.by_owner[owner] = n
                self.next = n + 1 if n < self.last else self.first
                return to_str(n)
        raise RuntimeError("loopback address pool exhausted")

    def release(self, owner: str) -> None:
        self.by_owner.pop(owner, None)
