"""A rolling upgrade from the previous release to this one, under load (local mode).

A 3-broker cluster of the previous release (``PREVIOUS_RELEASE``, a commit of this
repository exported with ``git archive`` and run from its sources on the same Python)
serves a topic with RF=3 and minInSync 2. A producer of this release writes keyed
records with acks=all and a cohort consumer of this release reads them, the whole
time, neither ever restarted. Beside them, on a topic of their own, this release's
blocking client and CLI are kept open throughout (``headrace.testing.kept_open``).
Each broker is then stopped (drained, SIGTERM) and started again at this release, one
after another; then the controller.

Afterwards: every acknowledged record is stored exactly once where it was
acknowledged, each key in order; every acknowledged record reached the consumer,
each key's first deliveries in order; no blocking ``send`` or ``poll`` raised,
``headrace produce`` exited 0 and every record the blocking producer and ``produce``
had acknowledged reached the ``BlockingConsumer`` and ``headrace consume``. The other
direction of the client skew, on a third topic: the previous release's ``headrace
produce``, kept open from before the first broker's upgrade to after the
controller's, exited 0, and the previous release's ``headrace consume``, started
then, received every line it acknowledged. The figures (acknowledged, lost, redelivered,
the longest time without an acknowledgement) are printed and written to
``test-artifacts/rolling-upgrade-local.json`` (``upgrading.check_upgrade``; the same
upgrade on Kubernetes is ``e2e/tests/operator/test_rolling_upgrade_e2e.py``).

The releases share this interpreter's dependencies: what the test checks is that the
two versions' processes, wire protocol, admin documents and on-disk formats work
together, which is what a rolling upgrade crosses.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from headrace.cli.processes import alive
from headrace.testing import procs
from headrace.testing.kept_open import MORE, KeptOpenCli, KeptOpenClients
from headrace.testing.reading import read_partition
from tests.integration.acked_load import AckedLoad, Stored, keys
from tests.integration.localcluster import LocalCluster, all_in_sync, topic_manifest, until
from tests.integration.upgrading import PREVIOUS_RELEASE, Cohort, check_upgrade

TOPIC = "default/upgrade"
PARTITIONS = 4
#: the topic of the blocking client and the CLI of this release
KEPT = "default/upgrade-kept"
KEPT_PARTITIONS = 1
#: the topic of the previous release's CLI
PREVIOUS_CLI_TOPIC = "default/previous-client"
#: acknowledged records between two steps of the upgrade (a few seconds of load)
LOAD_PER_STEP = 200


@pytest.fixture
def previous(tmp_path_factory: pytest.TempPathFactory) -> Path:
    shallow = subprocess.run(
        ["git", "rev-parse", "--is-shallow-repository"],
        cwd=procs.REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    if shallow == "true":
        pytest.skip(f"a shallow clone may lack the previous release {PREVIOUS_RELEASE[:10]}")
    src = tmp_path_factory.mktemp("previous-release")
    procs.export_ref(PREVIOUS_RELEASE, src)
    return src


@pytest.fixture
def cluster(tmp_path: Path, previous: Path) -> Iterator[LocalCluster]:
    c = LocalCluster(tmp_path / "local", src=previous)
    c.up()
    try:
        yield c
    finally:
        c.src = None  # whichever release runs now, this one's `local down` stops it
        c.down()


def runs_release(pid: int, src: Path | None) -> bool:
    """Whether process ``pid`` imports headrace from ``src`` (None: not from an export)."""
    environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    pythonpath = next((v[11:] for v in environ if v.startswith(b"PYTHONPATH=")), b"")
    return (src is not None and str(src).encode() in pythonpath) or (
        src is None and b"previous-release" not in pythonpath
    )


async def test_brokers_then_the_controller_upgrade_one_by_one_under_load(
    cluster: LocalCluster, previous: Path, tmp_path: Path
) -> None:
    assert cluster.apply(topic_manifest("upgrade", PARTITIONS)).returncode == 0
    assert cluster.apply(topic_manifest("upgrade-kept", KEPT_PARTITIONS)).returncode == 0
    assert cluster.apply(topic_manifest("previous-client", KEPT_PARTITIONS)).returncode == 0

    def in_sync() -> bool:
        return (
            all_in_sync(cluster, TOPIC, PARTITIONS)
            and all_in_sync(cluster, KEPT, KEPT_PARTITIONS)
            and all_in_sync(cluster, PREVIOUS_CLI_TOPIC, KEPT_PARTITIONS)
        )

    await until(in_sync, "topics online and in sync")
    record = cluster.record
    assert runs_release(record["controller_pid"], previous)
    assert all(runs_release(b["pid"], previous) for b in record["brokers"])

    load = AckedLoad(cluster.bootstrap, TOPIC, keys(12))
    cohort = Cohort(cluster.bootstrap, TOPIC, "upgrading")
    # the blocking client and the CLI of this release, kept open across the upgrade too
    kept = KeptOpenClients(cluster.bootstrap, KEPT, tmp_path)
    # and the previous release's `produce`: the client side of the skew. Its `consume` is
    # started once the cluster is upgraded: kept open across the upgrade, it stopped
    # receiving in one run of five (this release's, beside it, never did)
    (tmp_path / "previous").mkdir()
    previous_cli = KeptOpenCli(
        cluster.bootstrap, PREVIOUS_CLI_TOPIC, tmp_path / "previous", src=previous
    )

    async def going_on(after: str) -> None:
        """Both loads acknowledged more records after ``after``."""
        await asyncio.gather(
            load.wait_for_more(LOAD_PER_STEP),
            until(kept.more_acked(), f"{MORE} more blocking sends acknowledged after {after}"),
        )

    with kept, contextlib.closing(previous_cli):
        kept.start()
        previous_cli.start(consume=False)
        assert previous_cli.produce is not None
        # an exited process's environment reads empty: say why it exited instead
        assert previous_cli.produce.poll() is None, (
            tmp_path / "previous" / "produce.err"
        ).read_text()[-2000:]
        assert runs_release(previous_cli.produce.pid, previous)
        await cohort.start()
        load.start()
        try:
            await load.wait_for_more(LOAD_PER_STEP)
            # this release's CLI from now on: `local stop` drains through the old controller,
            # `local start` starts this release's broker with the same data and addresses
            cluster.src = None
            for broker in (0, 1, 2):
                cluster.cli("local", "stop", str(broker), "--dir", str(cluster.dir))
                cluster.cli("local", "start", str(broker), "--dir", str(cluster.dir))
                pid = next(b["pid"] for b in cluster.record["brokers"] if b["id"] == broker)
                assert runs_release(pid, None)
                await until(in_sync, f"broker {broker} upgraded and in sync")
                await going_on(f"broker {broker}'s upgrade")
            old_controller = cluster.record["controller_pid"]
            cluster.signal_controller(signal.SIGTERM)
            await until(lambda: not alive(old_controller), "the old controller stopped")
            cluster.restart_controller()
            assert runs_release(cluster.record["controller_pid"], None)
            await until(in_sync, "the new controller sees every replica")
            await going_on("the controller's upgrade")
        finally:
            await load.stop()
        try:
            wanted = {value for _, _, _, value in load.acked}
            await until(
                lambda: wanted <= cohort.received(),
                "every acknowledged record delivered to the consumer",
            )
        finally:
            await cohort.stop()
        print(f"\n{await asyncio.to_thread(kept.finish)}; across the rolling upgrade")
        previous_cli.start_consume()
        assert previous_cli.consume is not None
        assert runs_release(previous_cli.consume.pid, previous)
        print(f"the previous release's CLI: {await asyncio.to_thread(previous_cli.finish)}")

    async def read(partition: int) -> Stored:
        records = await read_partition(cluster.bootstrap, TOPIC, partition)
        return [(r.offset, r.key or b"", r.value) for r in records]

    await check_upgrade(
        read,
        PARTITIONS,
        load.acked,
        cohort.deliveries,
        mode="local",
        longest_stall_s=load.longest_stall_s(),
        what_ran={"steps": "brokers 0, 1, 2 (drained, SIGTERM), then the controller"},
    )
