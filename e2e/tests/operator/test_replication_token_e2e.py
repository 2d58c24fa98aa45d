"""Rotating the replication token of a running, chart-installed cluster
(docs/security.md §9): the three steps on the Secret ``<cluster>-cluster-auth``, under
acks=all load, with no pod restarted.

The brokers read the token from the Secret mounted as a file
(``--replication-token-file``); the test bed's kubelet refreshes it in running pods
(``e2e/testbed/projection.py``) and each broker re-reads it, which its ``/v1/status``
shows as ``credentials.files.replication_token.generation`` going up by one. The operator
re-reads the Secret itself and presents its first token (``ClusterRuntime.refresh_token``),
saying so in a ``ReplicationTokenChanged`` Event.

Each step is written as a person would (a patch of the Secret) and waited for on every
broker, and after step 2 for the operator's Event too, before the next. Meanwhile:

* a watcher reads the Topic's status every half second: every partition stays Online
  with its whole replica set live (a follower whose token its leader refused would leave
  it, and a broker whose heartbeat poll the operator's token failed would go not live);
* no broker counts a refused authentication (``headrace_acl_denials_total``);
* the producers (a User's token) have every batch acknowledged, and every acknowledged
  record is read back;
* a Topic created after step 3 becomes Ready: the operator's topology push carries the
  new token, the only one left;
* the broker pods are the same pods with the same restart counts at the end;
* ``headrace drain``, given the token file as the pods' preStop hook is, is refused
  with the old token alone and drains with the new one.

On the test bed, stand-in or real node: the test reaches the brokers' pod IPs from this
host.
"""

from __future__ import annotations

import base64
import json
import secrets
import threading
import time
import urllib.request
from pathlib import Path

from e2e.support import Cluster, wait_for
from e2e.tests.operator.fixtures import (
    InstalledOperator,
    Load,
    cluster_manifests,
    figure,
    pod_ips,
    wait_ready,
)
from e2e.tests.operator.test_auth_e2e import token_of, user
from e2e.tests.operator.test_lifecycle_e2e import events
from e2e.tests.operator.test_user_live_e2e import VOLUME_REFRESH_S, broker_pods
from headrace.testing import procs
from tests.integration.test_credential_reload import metric

SOURCE = "replication_token"


def token_file(cluster: Cluster, namespace: str) -> str:
    secret = cluster.get("secret", "demo-cluster-auth", namespace)
    return base64.b64decode(secret["data"]["replicationToken"]).decode()


def write_token_file(cluster: Cluster, namespace: str, *tokens: str) -> None:
    """The step as a person takes it: a merge patch of the Secret's ``replicationToken``."""
    text = "".join(f"{t}\n" for t in tokens)
    patch = {"data": {"replicationToken": base64.b64encode(text.encode()).decode()}}
    cluster.kubectl_run(
        "patch", "secret", "demo-cluster-auth", "-n", namespace, "--type", "merge",
        "-p", json.dumps(patch),
    )  # fmt: skip


def token_reloads(ip: str) -> tuple[int, str | None]:
    """(good re-reads, the last re-read's error) of a broker's replication token file."""
    with urllib.request.urlopen(f"http://{ip}:9644/v1/status", timeout=5) as resp:
        files = json.loads(resp.read())["credentials"]["files"]
    state = files[SOURCE]
    return int(state["generation"]), state.get("reload_error")


def refused_authentications(ip: str) -> float:
    return metric(f"http://{ip}:9644", "headrace_acl_denials_total", 'operation="authenticate"')


class ReplicaSetWatch:
    """Reads the Topic's status every half second while the block runs; ``broken`` lists
    each sighting of a partition not Online or with a replica missing from its LRS."""

    def __init__(self, cluster: Cluster, namespace: str, topic: str) -> None:
        self.cluster, self.namespace, self.topic = cluster, namespace, topic
        self.polls = 0
        self.broken: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(0.5):
            status = self.cluster.get("topic", self.topic, self.namespace).get("status") or {}
            self.polls += 1
            for p in status.get("partitions") or []:
                if p.get("state") != "Online" or sorted(p.get("liveReplicas") or []) != sorted(
                    p["replicas"]
                ):
                    self.broken.append(
                        f"partition {p['partition']}: {p.get('state')}, LRS"
                        f" {p.get('liveReplicas')} of {p['replicas']}"
                    )

    def __enter__(self) -> ReplicaSetWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=30)


def whole(cluster: Cluster, namespace: str, topic: str) -> bool:
    status = cluster.get("topic", topic, namespace).get("status") or {}
    parts = status.get("partitions") or []
    return bool(parts) and all(
        p.get("state") == "Online" and sorted(p.get("liveReplicas") or []) == sorted(p["replicas"])
        for p in parts
    )


def test_the_replication_token_rotates_in_three_steps_under_load_without_restarts(
    cluster: Cluster,
    namespace: str,
    host_reaches_pods: None,
    crds: None,
    operator: InstalledOperator,
    tmp_path: Path,
) -> None:
    topic_name = "orders"
    topic = f"{namespace}/{topic_name}"
    docs = cluster_manifests(namespace, partitions=2)
    docs[0]["spec"]["auth"] = {"enabled": True}
    cluster.apply([user("loader", ["produce", "consume"], [topic]), *docs], namespace)
    wait_ready(cluster, "topic", topic_name, namespace, timeout=120)
    wait_ready(cluster, "user", "loader", namespace, timeout=60)
    wait_for("3 broker pod IPs", lambda: len(pod_ips(cluster, namespace)) == 3, 60)
    ips = pod_ips(cluster, namespace)
    bootstrap = ",".join(f"{ip}:9092" for ip in ips.values())
    loader = token_of(cluster, namespace, "loader")
    wait_for("every live replica set whole", lambda: whole(cluster, namespace, topic_name), 60)

    old = token_file(cluster, namespace)
    assert "\n" not in old.strip()  # one token, as the operator made it
    new = secrets.token_urlsafe(32)
    pods = broker_pods(cluster, namespace)
    base = {b: token_reloads(ip)[0] for b, ip in ips.items()}
    denied = {b: refused_authentications(ip) for b, ip in ips.items()}

    with (
        Load(topic, bootstrap, token=loader) as load,
        ReplicaSetWatch(cluster, namespace, topic_name) as watch,
    ):
        wait_for("the load to be acknowledged", lambda: len(load.acked) >= 100, 60)
        for step, lines in enumerate(((old, new), (new, old), (new,)), start=1):
            started = time.monotonic()
            write_token_file(cluster, namespace, *lines)

            def reread(step: int = step) -> bool:
                seen = {b: token_reloads(ip) for b, ip in ips.items()}
                for b, (generation, error) in seen.items():
                    assert error is None, f"broker {b} refused the token file: {error}"
                return all(seen[b][0] == base[b] + step for b in ips)

            wait_for(
                f"every broker to re-read its token file (step {step})", reread, VOLUME_REFRESH_S
            )
            figure(
                f"step {step}: Secret patched to every broker re-read", time.monotonic() - started
            )
            if step == 2:
                # the operator follows from the Secret itself: no step 3 before it does
                wait_for(
                    "the operator to present the new token",
                    lambda: any(
                        e.get("reason") == "ReplicationTokenChanged"
                        for e in events(cluster, namespace, "BrokerCluster", "demo")
                    ),
                    60,
                )
                figure("step 2: Secret patched to the operator's Event", time.monotonic() - started)
            acked = len(load.acked)
            wait_for(
                f"more records acknowledged after step {step}",
                lambda acked=acked: len(load.acked) >= acked + 60,
                60,
            )

    assert not load.failures, load.failures[:3]
    assert watch.polls > 0 and not watch.broken, watch.broken[:10]
    for b, ip in ips.items():
        assert refused_authentications(ip) == denied[b], f"broker {b} refused credentials"

    # after step 3 only the new token is valid: the operator's push of a new Topic uses it
    later = cluster_manifests(namespace, topic="later", partitions=1)[1]
    cluster.apply([later], namespace)
    wait_ready(cluster, "topic", "later", namespace, timeout=120)

    done = procs.run_headrace(
        "consume", topic, "--cohort", "check", "--from-beginning", "--idle-timeout", "5",
        "--bootstrap", bootstrap, timeout=120, env={"HEADRACE_AUTH_TOKEN": loader},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    read = done.stdout.decode().split()
    assert set(load.acked) <= set(read), f"{len(set(load.acked) - set(read))} records lost"
    print(f"\n[e2e figure] {len(load.acked)} records acknowledged, {watch.polls} status polls")
    assert broker_pods(cluster, namespace) == pods  # same pods, none restarted
    assert token_file(cluster, namespace) == f"{new}\n"

    # ``headrace drain`` as the preStop hook runs it: the token from the file the pod's env
    # names. The old token alone is refused now; the new one (after a stale first line,
    # which a 401 skips) drains the broker.
    admin = f"http://{ips[0]}:9644"

    def drain_with(path: Path, *extra: str) -> str:
        done = procs.run_headrace(
            "drain", "--admin-url", admin, "--timeout", "30", *extra, timeout=60,
            env={"HEADRACE_REPLICATION_TOKEN_FILE": str(path)},
        )  # fmt: skip
        assert done.returncode == 0, done.stderr.decode()
        return done.stdout.decode()

    stale = tmp_path / "old.token"
    stale.write_text(f"{old}\n")
    assert "refused the drain (HTTP 401)" in drain_with(stale)
    rotated = tmp_path / "replication.token"
    rotated.write_text(f"{old}\n{new}\n")
    assert "broker 0: drained" in drain_with(rotated)
    assert "drain called off" in drain_with(rotated, "--cancel")
