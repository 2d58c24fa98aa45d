"""``headrace roundtrip`` against a real broker: it reads back its own records only, on a
topic that already holds others' records, and starts at its own offsets, not at the
beginning."""

from __future__ import annotations

from headrace.testing.procs import BrokerProcess, run_headrace


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
