"""The blocking clients and the CLI kept open across the faults of ``reliability.md`` §8.

A ``BlockingProducer`` sends keyed records one ``send`` at a time on a thread of its own
(acks=all), and a ``BlockingConsumer`` polls and acks on another; beside them a
``headrace produce --acks all`` reads lines from a pipe the test keeps feeding, and a
``headrace consume`` prints what it gets. Meanwhile the cluster goes through a leader's
kill -9, its return and the preferred-leader hand-back, a graceful restart (SIGTERM), a
paused broker (SIGSTOP until its partitions failed over), a controller kill -9, a
grow repartition and a shrink.

The tables say both see what the async clients do and that the application does
nothing: so no ``send`` or ``poll`` raises, ``produce`` exits 0 once its input ends
(every line acknowledged), and every acknowledged record reaches both consumers.

Then, on the same cluster, the same four across a delete and a re-create of their
topic: while it is gone a ``send`` and a new ``produce`` fail with ``UnknownTopic``;
after the re-create the same clients go on with the new topic.
Real controller and broker processes.
"""

from __future__ import annotations

import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from headrace.cli.processes import alive
from headrace.client.blocking import BlockingConsumer, BlockingProducer
from headrace.errors import UnknownTopic
from headrace.testing import procs, waiting
from headrace.testing.kept_open import MORE, KeptOpenClients, PollingThread, cli
from tests.integration.localcluster import (
    LocalCluster,
    all_in_sync,
    running_cluster,
    topic_manifest,
)
from tests.integration.test_repartition import repartition_manifest, repartition_status

TOPIC = "default/blocking"
PARTITIONS = 6
GROWN = 8
SHRUNK = 4


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """One three-broker local cluster for the tests here, each on a topic of its own."""
    with running_cluster(tmp_path_factory.mktemp("kept-open") / "local") as c:
        yield c


def leaders(c: LocalCluster) -> list[int | None]:
    return [p["leader"] for p in c.partitions(TOPIC)]


def pid_of(c: LocalCluster, broker: int) -> int:
    return int(next(b["pid"] for b in c.record["brokers"] if b["id"] == broker))


def test_blocking_clients_and_the_cli_kept_open_across_every_fault_raise_nothing_and_lose_nothing(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    assert cluster.apply(topic_manifest("blocking", PARTITIONS)).returncode == 0
    cluster.wait(lambda: all_in_sync(cluster, TOPIC, PARTITIONS), 60, "topic online and in sync")
    with KeptOpenClients(cluster.bootstrap, TOPIC, tmp_path) as clients:

        def whole_again(what: str, partitions: int = PARTITIONS) -> None:
            cluster.wait(lambda: all_in_sync(cluster, TOPIC, partitions), 90, what)
            cluster.wait(clients.more_acked(), 60, f"{MORE} more sends acknowledged after {what}")

        clients.start()
        cluster.wait(clients.more_acked(), 60, "the first sends acknowledged")

        # a leader's kill -9, then its return and the hand-back of its partitions
        pid = pid_of(cluster, 0)
        cluster.kill_broker(0)
        cluster.wait(lambda: not alive(pid), 30, "broker 0 stopped")
        cluster.wait(lambda: 0 not in leaders(cluster), 30, "broker 0's partitions failed over")
        cluster.wait(clients.more_acked(), 60, "sends acknowledged by the new leaders")
        cluster.restart_broker(0)
        whole_again("broker 0's return")
        cluster.wait(lambda: 0 in leaders(cluster), 90, "broker 0 leads again (the hand-back)")

        # a graceful restart
        pid = pid_of(cluster, 1)
        cluster.signal_broker(1, signal.SIGTERM)
        cluster.wait(lambda: not alive(pid), 30, "broker 1 stopped (SIGTERM)")
        cluster.restart_broker(1)
        whole_again("broker 1's graceful restart")

        # a paused broker, resumed once its partitions failed over
        cluster.signal_broker(2, signal.SIGSTOP)
        try:
            cluster.wait(lambda: 2 not in leaders(cluster), 30, "the paused broker's failover")
            cluster.wait(clients.more_acked(), 60, "sends acknowledged while broker 2 is paused")
        finally:
            cluster.signal_broker(2, signal.SIGCONT)
        whole_again("broker 2's resumption")

        # a controller kill -9 (it is not on the data path)
        cluster.kill_controller()
        cluster.restart_controller()
        whole_again("the controller's restart")

        # a grow: the producers route again, the cohorts take the new partitions
        applied = cluster.apply(repartition_manifest("blocking-8", "blocking", GROWN))
        assert applied.returncode == 0, applied.stderr.decode()
        cluster.wait(
            lambda: repartition_status(cluster, "blocking-8").get("phase") == "Finalized",
            90,
            f"the grow to {GROWN} partitions finalized",
        )
        whole_again("the grow", GROWN)

        # a shrink: the retired partitions stay (read-only), keys are routed to fewer
        applied = cluster.apply(repartition_manifest("blocking-4", "blocking", SHRUNK))
        assert applied.returncode == 0, applied.stderr.decode()
        cluster.wait(
            lambda: repartition_status(cluster, "blocking-4").get("phase") == "Finalized",
            90,
            f"the shrink to {SHRUNK} partitions finalized",
        )
        whole_again("the shrink", GROWN)
        ran = clients.finish()
    print(
        f"\n{ran}; across kill -9, hand-back, SIGTERM, SIGSTOP and a controller kill -9,"
        " a grow and a shrink"
    )


AGAIN = "default/again"


def test_blocking_clients_and_the_cli_across_a_topic_delete_and_re_create(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    """While the topic is gone a kept-open ``send`` waits for it (``TOPIC_WAIT_S``) and
    raises ``UnknownTopic``, and a ``produce`` started then prints ``error:
    UnknownTopic`` and exits 1. After the re-create the same ``BlockingProducer`` and the
    same ``headrace produce`` (fed nothing while the topic was gone) store their records
    in the new topic, and the same ``BlockingConsumer`` and ``headrace consume`` receive
    them: no ``poll`` raised, ``consume`` never exited."""
    assert cluster.apply(topic_manifest("again", 3)).returncode == 0
    cluster.wait(lambda: all_in_sync(cluster, AGAIN, 3), 60, "topic online and in sync")
    bootstrap = ["--bootstrap", cluster.bootstrap]
    printed = tmp_path / "consume.out"
    consume = cli(
        ["consume", AGAIN, "--cohort", "cli", "--from-beginning", "--idle-timeout", "600",
         *bootstrap],
        printed,
    )  # fmt: skip
    produce = cli(
        ["produce", AGAIN, "--acks", "all", *bootstrap],
        tmp_path / "produce.out",
        stdin=subprocess.PIPE,
    )
    assert produce.stdin is not None
    producer = BlockingProducer(cluster.bootstrap, acks="all")
    polls = PollingThread(cluster.bootstrap, "again")
    polls.start()
    #: a consumer that holds a batch of the old topic unacknowledged across the re-create
    holder = BlockingConsumer(cluster.bootstrap, "again", "holder", start="earliest")

    def send_and_feed(prefix: bytes) -> set[bytes]:
        """12 keyed ``send``s and 12 lines to ``produce``: the values."""
        assert produce.stdin is not None
        sent = [b"%s-%d" % (prefix, i) for i in range(12)]
        for i, value in enumerate(sent):
            producer.send("again", value, key=b"k%d" % i)
        fed = [b"%s-cli-%d" % (prefix, i) for i in range(12)]
        produce.stdin.write(b"".join(line + b"\n" for line in fed))
        produce.stdin.flush()
        return {*sent, *fed}

    def received(wanted: set[bytes], what: str) -> None:
        def missing() -> dict[str, set[bytes]]:
            gaps = {
                "BlockingConsumer": wanted - polls.received,
                "consume": wanted - set(printed.read_bytes().split()),
            }
            return {who: gap for who, gap in gaps.items() if gap}

        try:
            waiting.until(lambda: not missing(), 60, what)
        except waiting.NotReached:
            raise AssertionError(f"{what}: not received {missing()}") from None

    try:
        received(send_and_feed(b"old"), "the old topic's records received by both")
        held = waiting.until(
            lambda: next((b for b in holder.poll(timeout_s=0.2) if b.last_offset >= 1), None),
            60,
            "a batch of at least two records of the old topic, held unacknowledged",
        )
        cluster.cli("topics", "delete", "again", "--dir", str(cluster.dir))
        cluster.wait(lambda: not cluster.partitions(AGAIN), 30, "topic deleted")
        late = cli(["produce", AGAIN, *bootstrap], tmp_path / "late.out", stdin=subprocess.PIPE)
        assert late.stdin is not None
        late.stdin.write(b"too-late\n")
        late.stdin.close()
        with pytest.raises(UnknownTopic):
            producer.send("again", b"too-late", key=b"k0")
        assert late.wait(timeout=60) == 1
        assert "error: UnknownTopic" in (tmp_path / "late.err").read_text()

        # sent at once: the clients wait for the topic (as for one created moments ago)
        assert cluster.apply(topic_manifest("again", 3)).returncode == 0
        new = send_and_feed(b"new")
        produce.stdin.close()
        returncode = produce.wait(timeout=120)
        produce_err = (tmp_path / "produce.err").read_text(errors="replace")
        assert returncode == 0, f"produce exited {returncode}: {produce_err[-2000:]}"
        received(new, "the re-created topic's records received by both")
        assert consume.poll() is None, "consume exited"

        # The held batch acknowledged now: it is the old topic's, so it is ignored. Its
        # offsets, acknowledged in the new topic, would skip that many of its records.
        first = waiting.until(
            lambda: next(
                (
                    b
                    for b in holder.poll(timeout_s=0.2, max_records=1)
                    if b.partition == held.partition and b.offsets()[0] == 0
                ),
                None,
            ),
            60,
            f"the new topic's first record of partition {held.partition}",
        )
        holder.ack_batch(held)
        holder.ack_batch(first)
        cluster.wait(
            lambda: (cluster.cursor(AGAIN, "holder", held.partition) or 0) >= 1,
            30,
            "the holder's acknowledgement reaching the leader",
        )
        assert cluster.cursor(AGAIN, "holder", held.partition) == first.last_offset + 1
    finally:
        producer.close()
        holder.close()
        polls.stop()
        procs.reap(produce)
        procs.reap(consume)
    assert not polls.failed, f"polls raised: {polls.failed[:3]}"
