"""``python -m bench.operator_idle``: the operator's API writes on an idle cluster.

Counts write requests (POST, PUT, PATCH, APPLY, DELETE) the API server served
over a quiet window, from its ``apiserver_request_total`` metric, by group,
resource and subresource. Point it at a cluster where the operator runs a
BrokerCluster and Topics and nothing else changes them: the ``headrace.dev``
rows are then the operator's writes (nobody else writes those objects; kubectl
applies are not idle). The apps/v1 and core rows show the workload's objects;
``leases`` mixes the operator's Lease renewals (one per ``duration/6``) with
the nodes' heartbeats, so it is reported apart.

    python -m bench.operator_idle --kubeconfig PATH --seconds 600
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import time
from collections import Counter

WRITE_VERBS = {"POST", "PUT", "PATCH", "APPLY", "DELETE", "DELETECOLLECTION"}
_LINE = re.compile(r"^apiserver_request_total\{(?P<labels>[^}]*)\} (?P<value>\S+)$")
_LABEL = re.compile(r'(\w+)="([^"]*)"')


def writes(kubeconfig: str, kubectl: str) -> Counter[str]:
    """Write requests served so far, by 'group/resource[/subresource] verb code'."""
    text = subprocess.run(
        [kubectl, "get", "--raw", "/metrics"],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "KUBECONFIG": kubeconfig},
    ).stdout
    counts: Counter[str] = Counter()
    for line in text.splitlines():
        match = _LINE.match(line)
        if match is None:
            continue
        labels = dict(_LABEL.findall(match["labels"]))
        if labels.get("verb") not in WRITE_VERBS:
            continue
        resource = "/".join(
            p
            for p in (labels.get("group") or "core", labels["resource"], labels.get("subresource"))
            if p
        )
        counts[f"{resource} {labels['verb']} {labels['code']}"] += int(float(match["value"]))
    return counts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kubeconfig", default=os.environ.get("KUBECONFIG"), required=False)
    parser.add_argument("--kubectl", default="kubectl")
    parser.add_argument("--seconds", type=float, default=600.0)
    args = parser.parse_args()
    before = writes(args.kubeconfig, args.kubectl)
    started = time.monotonic()
    time.sleep(args.seconds)
    after = writes(args.kubeconfig, args.kubectl)
    window = time.monotonic() - started
    delta = {k: after[k] - before[k] for k in after if after[k] != before[k]}
    headrace = {k: v for k, v in delta.items() if k.startswith("headrace.dev/")}
    print(
        json.dumps(
            {
                "window_seconds": round(window, 1),
                "headrace_dev_writes": sum(headrace.values()),
                "writes_by_resource": dict(sorted(delta.items())),
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
