"""``headrace produce`` and ``headrace consume`` as a user pipes them, on a 3-broker local
cluster: unkeyed lines are spread over every partition, and ``consume --count N`` exits
once it printed its N records instead of waiting out a grace period."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator

import pytest

from headrace.testing import procs
from tests.integration.localcluster import LocalCluster

PARTITIONS = 6
#: ``consume --count`` must exit this long after printing its last record at the latest:
#: half the 10 s the member's close used to wait for records it handed out and never printed
EXIT_DEADLINE_S = 5.0


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    c = LocalCluster(tmp_path_factory.mktemp("pipes") / "local")
    c.up()
    try:
        yield c
    finally:
        c.down()


def create_topic(c: LocalCluster, name: str) -> None:
    c.cli("topics", "create", name, "-p", str(PARTITIONS), "--dir", str(c.dir))


def partition_ends(c: LocalCluster, topic: str) -> list[int]:
    """Each partition's log end offset on its leader (final once produce, acks=leader,
    returned; the high watermark follows as the followers fetch)."""
    described = c.cli("topics", "describe", topic, "--json", "--dir", str(c.dir))
    details = json.loads(described.stdout)["partition_details"]
    return [p["log_end_offset"] for p in sorted(details, key=lambda p: p["partition"])]


def consume(c: LocalCluster, topic: str, *args: str) -> subprocess.Popen[bytes]:
    """``headrace consume`` as cohort ``readers`` from the beginning; a broken run ends
    after a minute without records rather than hanging the test."""
    command = [
        *procs.HEADRACE_CLI, "consume", topic, "--cohort", "readers", "--from-beginning",
        "--idle-timeout", "60", *args, "--dir", str(c.dir),
    ]  # fmt: skip
    return subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=procs.child_env(),
    )


def test_piped_unkeyed_lines_land_on_every_partition(cluster: LocalCluster) -> None:
    create_topic(cluster, "piped")
    records = 100_000
    # `seq 1 100000 | headrace produce piped`, through a real pipe
    seq = subprocess.Popen(["seq", "1", str(records)], stdout=subprocess.PIPE)
    assert seq.stdout is not None
    produce = subprocess.run(
        [*procs.HEADRACE_CLI, "produce", "piped", "--dir", str(cluster.dir)],
        stdin=seq.stdout,
        capture_output=True,
        timeout=120,
        env=procs.child_env(),
    )
    seq.stdout.close()
    assert seq.wait(10) == 0
    assert produce.returncode == 0, produce.stderr.decode()
    ends = partition_ends(cluster, "piped")
    assert sum(ends) == records
    fair = records / PARTITIONS
    assert all(end > 0 for end in ends), f"a partition got nothing: {ends}"
    assert max(ends) <= 2 * fair, f"a partition holds over twice its fair share: {ends}"


def test_produce_with_a_partition_pins_every_line_there(cluster: LocalCluster) -> None:
    create_topic(cluster, "pinned")
    lines = b"".join(b"line-%d\n" % i for i in range(5_000))
    cluster.cli("produce", "pinned", "--partition", "4", "--dir", str(cluster.dir), stdin=lines)
    assert partition_ends(cluster, "pinned") == [0, 0, 0, 0, 5_000, 0]


def test_consume_count_exits_once_its_records_are_printed(cluster: LocalCluster) -> None:
    create_topic(cluster, "counted")
    total = 3_000
    lines = b"".join(b"r%d\n" % i for i in range(total))
    cluster.cli("produce", "counted", "--dir", str(cluster.dir), stdin=lines)
    assert sum(partition_ends(cluster, "counted")) == total
    # Batches hold hundreds of records, so 100 ends inside one: the member was handed the
    # rest of that batch too, and must neither wait for them nor lose them.
    first = consume(cluster, "counted", "--count", "100")
    assert first.stdout is not None
    printed = [first.stdout.readline() for _ in range(100)]
    assert all(printed), f"fewer than 100 records: {first.stderr.read() if first.stderr else ''!r}"
    try:
        code = first.wait(timeout=EXIT_DEADLINE_S)
    except subprocess.TimeoutExpired:
        first.kill()
        first.wait()
        pytest.fail(f"consume --count 100 still running {EXIT_DEADLINE_S}s after its last record")
    assert code == 0, first.stderr.read() if first.stderr else b""
    assert first.stdout.read() == b"", "printed more than --count records"
    # The cohort goes on where the first member stopped: the rest, each record once.
    rest = consume(cluster, "counted", "--count", str(total - 100))
    out, err = rest.communicate(timeout=120)
    assert rest.returncode == 0, err.decode()
    seen = [line.strip() for line in printed] + out.split()
    assert sorted(seen) == sorted(b"r%d" % i for i in range(total))
