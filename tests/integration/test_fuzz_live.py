"""Live fuzzing, short: 10 s of mutated frames at a running broker process, at its native
listener and at its Kafka listener.

``make fuzz`` runs the same for 5 minutes (native) and 10,000 inputs (Kafka). atheris
drives the mutations when it is installed (the dev extra), else a seeded random mutator
does.
"""

from __future__ import annotations

from pathlib import Path

from bench.fuzz import running


async def test_mutated_frames_neither_crash_nor_hang_the_broker_nor_lose_acked_records(
    tmp_path: Path,
) -> None:
    report = await running.run(tmp_path, running.Settings(seconds=10.0))

    assert report["inputs"] > 50, report  # the fuzzer really ran
    assert report["crashes"] == 0, report
    assert report["hangs"] == 0, report
    assert report["acknowledged"] > 0, report
    assert (report["lost"], report["duplicated"]) == (0, 0), report
    assert report["tracebacks_in_broker_log"] == 0, (tmp_path / "data.broker.log").read_text()


async def test_malformed_kafka_requests_neither_crash_nor_hang_the_broker_nor_store_records(
    tmp_path: Path,
) -> None:
    report = await running.run(tmp_path, running.Settings(seconds=10.0, protocol="kafka"))

    assert report["inputs"] > 50, report  # the fuzzer really ran
    assert report["answers"] > 0, report  # and the listener answered it
    assert report["crashes"] == 0, report
    assert report["hangs"] == 0, report
    assert report["acknowledged"] > 0, report  # aiokafka's records, acks=all
    assert (report["lost"], report["duplicated"]) == (0, 0), report
    # nothing stored but the seeds' valid batches, and no more of them than were sent
    assert report["stored_bad_records"] == 0, report
    assert report["stored_seed_records"] <= report["well_formed_produce_records"], report
    assert report["ok"], report
    assert report["tracebacks_in_broker_log"] == 0, (tmp_path / "data.broker.log").read_text()
