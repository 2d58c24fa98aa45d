"""What an ACL check costs a request on the broker (the produce path's one check per batch).

    .venv/bin/python -m bench.acl_check

Times ``ConnectionAccess.require`` in-process: with ACLs off (the open mode),
on with the connection's decision cached (every request after the first to a
topic), and on uncached (the first request to each topic) against a principal
holding 51 prefix patterns whose match is the last one. Per request, not per
record: a batch of any size pays it once.
"""

from __future__ import annotations

import json
import tempfile
import timeit
from pathlib import Path
from typing import Any

from headrace.broker.config import BrokerSettings
from headrace.security.access import Access, ConnectionAccess
from headrace.security.acl import Operation, hash_token

PATTERNS = [f"team-{i}/*" for i in range(50)] + ["default/orders*"]


class _NoCounter:
    def labels(self, operation: str) -> Any:
        return self

    def inc(self) -> None:
        pass


def _session(directory: Path, acl: bool) -> ConnectionAccess:
    settings = BrokerSettings(data_dir=directory, acl_file=directory / "acl.yaml" if acl else None)
    session = Access(settings.access_settings(), _NoCounter()).session()
    session.authenticate("token", None)
    return session


def main() -> None:
    directory = Path(tempfile.mkdtemp(prefix="acl-bench-"))
    grants = [{"operations": ["produce"], "topics": PATTERNS}]
    principal = {"name": "writer", "tokens": [hash_token("token")], "grants": grants}
    (directory / "acl.yaml").write_text(json.dumps({"version": 1, "principals": [principal]}))
    n = 1_000_000
    for label, session in (
        ("ACLs off", _session(directory, acl=False)),
        ("ACLs on, decision cached", _session(directory, acl=True)),
    ):
        seconds = timeit.timeit(
            lambda s=session: s.require(Operation.PRODUCE, "orders-eu"), number=n
        )
        print(f"{label:32} {seconds / n * 1e9:8.0f} ns per request")
    session = _session(directory, acl=True)
    topics = [f"default/orders-{i}" for i in range(4000)]

    def first_requests() -> None:
        session._decisions.clear()
        for topic in topics:
            session.require(Operation.PRODUCE, topic)

    seconds = timeit.timeit(first_requests, number=5)
    print(f"{'ACLs on, first request to a topic':32} {seconds / 5 / len(topics) * 1e9:8.0f} ns")


if __name__ == "__main__":
    main()
