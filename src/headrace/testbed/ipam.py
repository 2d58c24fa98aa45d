"""Loopback address allocation for pods (pure).

Every pod gets its own address in 127.0.0.0/8 so that several pods can listen on the
same port, as they can in a cluster. On Linux the whole /8 is routed to ``lo`` with no
setup. 127.0.0.1 is left to the control plane, and addresses are handed out round
robin, so a pod that comes back (a StatefulSet member) usually gets a *different*
address than its predecessor, as in a real cluster: nothing may rely on pod IPs.
"""

from __future__ import annotations

from dataclasses import dataclass, field

#: 127.0.0.2 .. 127.0.255.254: 65k pods is more than a 2-core machine will run.
FIRST = (127 << 24) | 2
LAST = (127 << 24) | (255 << 8) | 254


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
    """Addresses in use, keyed by pod UID."""

    by_owner: dict[str, int] = field(default_factory=dict)
    next: int = FIRST

    def allocate(self, owner: str, prefer: str | None = None) -> str:
        """The owner's address, allocating one if it has none. Raises when full.

        ``prefer`` is an address the owner had before (a runner restart finds it in the
        pod's status); it is kept if it is in range and free, because a pod's IP may not
        change while the pod lives.
        """
        if owner in self.by_owner:
            return to_str(self.by_owner[owner])
        used = set(self.by_owner.values())
        wanted = from_str(prefer) if prefer else None
        if wanted is not None and FIRST <= wanted <= LAST and wanted not in used:
            self.by_owner[owner] = wanted
            return to_str(wanted)
        span = LAST - FIRST + 1
        for i in range(span):
            n = FIRST + (self.next - FIRST + i) % span
            if n & 0xFF in (0, 255):  # avoid .0 and .255, which look like network/broadcast
                continue
            if n not in used:
                self.by_owner[owner] = n
                self.next = n + 1 if n < LAST else FIRST
                return to_str(n)
        raise RuntimeError("loopback address pool exhausted")

    def release(self, owner: str) -> None:
        self.by_owner.pop(owner, None)
