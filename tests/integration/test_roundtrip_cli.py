"""``headrace roundtrip`` against a real broker: it reads back its own records only, on a
topic that already holds others' records, and starts at its own offsets, not at the
beginning."""

from __future__ import annotations

from pathlib import Path

from headrace.testing import waiting
from headrace.testing.procs import HEADRACE_CLI, BrokerProcess, reap, run_headrace, spawn


def test_roundtrip_reads_back_its_own_records_on_a_topic_with_data(
    broker: BrokerProcess,
) -> None:
    broker.create_topic("checks", 3)
    earlier = run_headrace(
        "produce", "checks", "--bootstrap", broker.bootstrap,
        stdin=b"".join(b"earlier-%d\n" % i for i in range(2000)),
    )  # fmt: skip
    assert earlier.returncode == 0, earlier.stderr
    for marker in ("first", "second"):  # two runs: each finds its own, and all of them
        done = run_headrace(
            "roundtrip", "checks", "--records", "50", "--marker", marker,
            "--bootstrap", broker.bootstrap, "--timeout", "60",
        )  # fmt: skip
        assert done.returncode == 0, done.stderr.decode()
        # every one of its records, and none of the 2000 before them: it did not start at
        # the beginning of the topic
        assert (
            f"consumed all 50 records marked {marker} (0 records of others read on the way)"
            in done.stderr.decode()
        ), done.stderr.decode()


def test_roundtrip_of_a_missing_topic_fails_with_one_line(broker: BrokerProcess) -> None:
    done = run_headrace("roundtrip", "absent", "--bootstrap", broker.bootstrap, "--timeout", "5")
    assert done.returncode == 1
    assert done.stderr.decode().strip().startswith("error: UnknownTopic"), done.stderr


def test_roundtrip_started_before_its_cluster_is_reachable_waits_for_it(tmp_path: Path) -> None:
    """``helm test`` may run the check before the cluster's Service routes to a broker
    (kube-proxy programs a ready pod's endpoint a moment after it is ready): the bootstrap
    refuses connections for a while, and the check waits for it within its timeout."""
    broker = BrokerProcess(tmp_path / "broker")
    log = tmp_path / "roundtrip.log"
    check = spawn(
        [*HEADRACE_CLI, "roundtrip", "late", "--records", "20", "--bootstrap", broker.bootstrap,
         "--timeout", "90"],
        log_path=log,
    )  # fmt: skip
    try:
        waiting.until(
            lambda: "not reachable yet" in log.read_text(),
            30,
            "the check to say it waits for the bootstrap",
        )
        assert check.poll() is None, log.read_text()
        broker.start()
        broker.create_topic("late", 2)
        assert check.wait(timeout=90) == 0, log.read_text()
        assert "consumed all 20 records" in log.read_text()
    finally:
        reap(check)
        broker.stop()
