"""Kafka's own tools and clients in other languages, unchanged, against the Kafka listener of a
standalone broker: Kafka's Java tools (kafka-topics, the console producer and consumer,
kafka-consumer-groups) and Java producer with its default configuration, a franz-go program
(Go), and kcat (librdkafka, from Debian). ``peer_tools`` builds them (cached); the perf tools'
run is opt-in (``make kafka-peers``)."""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import time
from collections import defaultdict

import pytest
from confluent_kafka import Consumer, Producer
from confluent_kafka import TopicPartition as CTopicPartition

from headrace.testing.reading import create_topic, read_partition
from tests.integration.kafka import peer_tools
from tests.integration.kafka.conftest import KafkaBroker

TOOLS = "org.apache.kafka.tools"
GROUPS = f"{TOOLS}.consumer.group.ConsumerGroupCommand"

#: the heavy runs (Kafka's perf tools) only when asked: `make kafka-peers`
ALL_PEERS = os.environ.get("HEADRACE_KAFKA_PEERS_ALL") == "1"


def _java(main: str, *args: str, stdin: str | None = None) -> str:
    return peer_tools.run(peer_tools.java_command(main, *args), stdin=stdin).stdout


def _group_table(out: str) -> dict[int, tuple[int, int, int]]:
    """kafka-consumer-groups --describe: partition -> (current offset, log end, lag)."""
    rows = {}
    for line in out.splitlines():
        cells = line.split()
        if len(cells) >= 6 and cells[2].isdigit():
            rows[int(cells[2])] = (int(cells[3]), int(cells[4]), int(cells[5]))
    return rows


def _keys_in_order(records: list[tuple[int, int, str, str]]) -> dict[str, list[str]]:
    """(partition, offset, key, value) in log order -> each key's values in that order."""
    by_key: dict[str, list[str]] = defaultdict(list)
    for _, _, key, value in sorted(records):
        by_key[key].append(value)
    return by_key


def test_java_tools_topics_console_round_trip_group_lag_and_reset(kafka: KafkaBroker) -> None:
    server = ["--bootstrap-server", kafka.bootstrap]
    topic = "java-orders"
    out = _java(f"{TOOLS}.TopicCommand", *server, "--create", "--topic", topic, "--partitions", "3")
    assert f"Created topic {topic}." in out
    out = _java(f"{TOOLS}.TopicCommand", *server, "--describe", "--topic", topic)
    assert "PartitionCount: 3" in out and "ReplicationFactor: 1" in out
    assert len(re.findall(r"Partition: \d+\tLeader: 0\tReplicas: 0\tIsr: 0", out)) == 3, out

    # keyed records: one key's records go to one partition, in the order sent
    sent = [(f"k{i % 5}", f"v{i}") for i in range(30)]
    _java(
        f"{TOOLS}.ConsoleProducer",
        *server,
        "--topic",
        topic,
        "--reader-property",
        "parse.key=true",
        "--reader-property",
        "key.separator=:",
        stdin="".join(f"{k}:{v}\n" for k, v in sent),
    )
    consume = [
        f"{TOOLS}.consumer.ConsoleConsumer",
        *server,
        "--topic",
        topic,
        "--group",
        "java-readers",
        "--from-beginning",
        "--max-messages",
        "30",
        "--formatter-property",
        "print.key=true",
        "--formatter-property",
        "print.partition=true",
        "--formatter-property",
        "print.offset=true",
    ]
    out = _java(*consume)
    got = []
    for line in out.splitlines():
        match = re.fullmatch(r"Partition:(\d+)\tOffset:(\d+)\t(\S+)\t(\S+)", line)
        if match:
            got.append((int(match[1]), int(match[2]), match[3], match[4]))
    assert sorted(value for *_, value in got) == sorted(value for _, value in sent)
    expected: dict[str, list[str]] = defaultdict(list)
    for key, value in sent:
        expected[key].append(value)
    assert _keys_in_order(got) == expected

    # the console consumer committed on exit: no lag; five more records give a lag of five
    out = _java(GROUPS, *server, "--describe", "--group", "java-readers")
    assert _group_table(out) and all(lag == 0 for *_, lag in _group_table(out).values()), out
    _java(
        f"{TOOLS}.ConsoleProducer",
        *server,
        "--topic",
        topic,
        stdin="".join(f"late{i}\n" for i in range(5)),
    )
    table = _group_table(_java(GROUPS, *server, "--describe", "--group", "java-readers"))
    assert sum(lag for *_, lag in table.values()) == 5
    assert sum(end for _, end, _ in table.values()) == 35

    # reset the group to the start: the lag is the whole topic
    out = _java(
        GROUPS,
        *server,
        "--reset-offsets",
        "--group",
        "java-readers",
        "--topic",
        topic,
        "--to-earliest",
        "--execute",
    )
    table = _group_table(_java(GROUPS, *server, "--describe", "--group", "java-readers"))
    assert {current for current, _, _ in table.values()} == {0}, out
    assert sum(lag for *_, lag in table.values()) == 35

    # forget the group's offsets of the topic (OffsetDelete): the group has none left
    out = _java(GROUPS, *server, "--delete-offsets", "--group", "java-readers", "--topic", topic)
    assert len(re.findall(rf"{topic}\s+\d+\s+Successful", out)) == 3, out
    assert _group_table(_java(GROUPS, *server, "--describe", "--group", "java-readers")) == {}

    _java(GROUPS, *server, "--delete", "--group", "java-readers")
    assert "java-readers" not in _java(GROUPS, *server, "--list").split()
    _java(f"{TOOLS}.TopicCommand", *server, "--delete", "--topic", topic)
    assert topic not in _java(f"{TOOLS}.TopicCommand", *server, "--list").split()


def test_java_tools_alter_configs_refuse_a_grow_and_get_the_max_timestamp_offset(
    kafka: KafkaBroker,
) -> None:
    """kafka-configs --alter and --describe (IncrementalAlterConfigs), kafka-topics --alter
    --partitions (CreatePartitions: refused, saying why), kafka-get-offsets --time -3
    (ListOffsets v7)."""
    server = ["--bootstrap-server", kafka.bootstrap]
    topic = "java-settings"
    _java(f"{TOOLS}.TopicCommand", *server, "--create", "--topic", topic, "--partitions", "2")
    configs = ["kafka.admin.ConfigCommand", *server, "--entity-type", "topics"]
    out = _java(*configs, "--alter", "--entity-name", topic, "--add-config", "retention.ms=3600000")
    assert f"Completed updating config for topic {topic}." in out
    out = _java(*configs, "--describe", "--entity-name", topic)
    assert "retention.ms=3600000" in out, out
    refused = subprocess.run(
        peer_tools.java_command(
            "kafka.admin.ConfigCommand",
            *configs[1:],
            "--alter",
            "--entity-name",
            topic,
            "--add-config",
            "min.insync.replicas=2",
        ),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert refused.returncode != 0 and "min.insync.replicas" in refused.stdout + refused.stderr
    grow = subprocess.run(
        peer_tools.java_command(
            f"{TOOLS}.TopicCommand", *server, "--alter", "--topic", topic, "--partitions", "4"
        ),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    said = grow.stdout + grow.stderr
    assert grow.returncode != 0 and "PolicyViolationException" in said, said
    assert "partition count is fixed at creation" in said

    _java(f"{TOOLS}.ConsoleProducer", *server, "--topic", topic, stdin="a\nb\nc\n")
    out = _java(f"{TOOLS}.GetOffsetShell", *server, "--topic", topic, "--time", "-3")
    # topic:partition:offset for each partition holding a record: the first of its newest
    found = {int(p): int(o) for p, o in (line.rsplit(":", 2)[1:] for line in out.split())}
    expected = {}
    for partition in (0, 1):
        stored = asyncio.run(read_partition(kafka.broker.bootstrap, topic, partition))
        if stored:
            newest = max(r.timestamp_ms for r in stored)
            expected[partition] = next(r.offset for r in stored if r.timestamp_ms == newest)
    assert found == expected and expected, out


def test_java_consumer_protocol_and_kafka_consumer_groups_describe_its_members(
    kafka: KafkaBroker,
) -> None:
    """Kafka's console consumer with ``group.protocol=consumer`` (KIP-848) reads and commits;
    while a librdkafka member of the same protocol holds the partitions,
    kafka-consumer-groups --describe shows it (ConsumerGroupDescribe)."""
    server = ["--bootstrap-server", kafka.bootstrap]
    topic, group = "java-kip848", "java-new-protocol"
    asyncio.run(create_topic(kafka.broker.bootstrap, topic, 3))
    producer = Producer({"bootstrap.servers": kafka.bootstrap})
    for i in range(30):
        producer.produce(topic, b"v%d" % i, partition=i % 3)
    assert producer.flush(30) == 0
    out = _java(
        f"{TOOLS}.consumer.ConsoleConsumer",
        *server,
        "--topic",
        topic,
        "--group",
        group,
        "--from-beginning",
        "--max-messages",
        "30",
        "--command-property",
        "group.protocol=consumer",
    )
    read = [line for line in out.splitlines() if re.fullmatch(r"v\d+", line)]
    assert sorted(read) == sorted(f"v{i}" for i in range(30)), out

    member = Consumer(
        {
            "bootstrap.servers": kafka.bootstrap,
            "group.id": group,
            "group.protocol": "consumer",
            "client.id": "rdkafka-member",
        }
    )
    try:
        member.subscribe([topic])
        deadline = time.monotonic() + 30
        while len(member.assignment()) < 3:
            assert time.monotonic() < deadline, "the member never got every partition"
            member.poll(0.2)
        table = _java(GROUPS, *server, "--describe", "--group", group)
        rows = [line.split() for line in table.splitlines() if line.startswith(group)]
        # the console consumer's commits, and the member holding every partition
        assert sorted((r[2], r[3], r[8]) for r in rows) == [
            (str(p), "10", "rdkafka-member") for p in range(3)
        ], table
        state = _java(GROUPS, *server, "--describe", "--group", group, "--state")
        assert re.search(rf"{group}\s+\S+\s+\(0\)\s+uniform\s+Stable\s+1", state), state
        verbose = _java(GROUPS, *server, "--describe", "--group", group, "--members", "--verbose")
        assert f"{topic}:0,1,2" in verbose, verbose
    finally:
        member.close()


def test_java_producer_with_the_default_config_is_idempotent(kafka: KafkaBroker) -> None:
    """Kafka's producer as an application gets it: only the bootstrap servers and
    serializers set, so acks=all and idempotence on (InitProducerId, sequences)."""
    asyncio.run(create_topic(kafka.broker.bootstrap, "java-default", 3))
    source = peer_tools.PEERS / "java" / "DefaultProducer.java"
    done = peer_tools.run(
        peer_tools.java_command(str(source), kafka.bootstrap, "java-default", "40")
    )
    assert "Instantiated an idempotent producer" in done.stderr, done.stderr
    producer_id = re.search(r"ProducerId set to (\d+) with epoch 0", done.stderr)
    assert producer_id is not None and int(producer_id[1]) > 0, done.stderr
    acked: dict[int, dict[int, str]] = defaultdict(dict)
    for line in done.stdout.splitlines():
        index, partition, offset = map(int, line.split())
        acked[partition][offset] = f"v{index}"
    assert sum(len(offsets) for offsets in acked.values()) == 40
    # read back through the native protocol: every acknowledged record, once, where it was told
    for partition, offsets in acked.items():
        stored = asyncio.run(read_partition(kafka.broker.bootstrap, "java-default", partition))
        assert {r.offset: r.value.decode() for r in stored} == offsets


def test_java_admin_lists_groups_offsets_with_offset_fetch_v9(kafka: KafkaBroker) -> None:
    """Kafka's admin client asks for committed offsets in OffsetFetch's groups form (v8+,
    KIP-709; v9 with KIP-848's member fields) when the broker serves it. It sends one
    request per group here: it batches groups only after a batched FindCoordinator (v4+)."""
    topic = "java-offsets"
    asyncio.run(create_topic(kafka.broker.bootstrap, topic, 2))
    for group, offsets in (("offsets-a", (3, 5)), ("offsets-b", (7, 0))):
        committer = Consumer({"bootstrap.servers": kafka.bootstrap, "group.id": group})
        try:
            committer.commit(
                offsets=[CTopicPartition(topic, p, o) for p, o in enumerate(offsets) if o],
                asynchronous=False,
            )
        finally:
            committer.close()
    source = peer_tools.PEERS / "java" / "GroupOffsets.java"
    done = peer_tools.run(
        peer_tools.java_command(str(source), kafka.bootstrap, "offsets-a", "offsets-b")
    )
    assert sorted(done.stdout.split("\n")[:-1]) == [
        f"offsets-a {topic} 0 3",
        f"offsets-a {topic} 1 5",
        f"offsets-b {topic} 0 7",
    ], done.stdout
    sent = [line for line in done.stderr.splitlines() if "Sending OFFSET_FETCH request" in line]
    assert len(sent) == 2, done.stderr[-3000:]
    for line in sent:
        assert "apiVersion=9," in line and "groups=[OffsetFetchRequestGroup(" in line, line
    assert any("groupId='offsets-a'" in line for line in sent)
    assert any("groupId='offsets-b'" in line for line in sent)


def test_java_admin_removes_a_static_member_by_its_instance_id(kafka: KafkaBroker) -> None:
    """A static librdkafka member that closed keeps its place until its session ends (here
    5 minutes); Kafka's admin client sees its instance id and removes it by that id
    (LeaveGroup v3), and the other member takes every partition in the rebalance."""
    topic, group = "java-static", "static-admin"
    asyncio.run(create_topic(kafka.broker.bootstrap, topic, 4))

    def member(instance: str | None) -> Consumer:
        config: dict[str, str | int] = {
            "bootstrap.servers": kafka.bootstrap,
            "group.id": group,
            "session.timeout.ms": 300_000,
            "heartbeat.interval.ms": 500,
        }
        if instance is not None:
            config["group.instance.id"] = instance
        return Consumer(config)

    def held(c: Consumer) -> int:
        return len(c.assignment())

    other, static = member(None), member("static-1")
    static_open = True
    try:
        other.subscribe([topic])
        static.subscribe([topic])
        deadline = time.monotonic() + 60
        while not held(other) == held(static) == 2:
            assert time.monotonic() < deadline, "the two members never shared the partitions"
            other.poll(0.1)
            static.poll(0.1)
        static.close()  # a static member does not leave when it closes
        static_open = False
        source = peer_tools.PEERS / "java" / "RemoveStaticMember.java"
        done = peer_tools.run(
            peer_tools.java_command(str(source), kafka.bootstrap, group, "static-1")
        )
        members = [
            line.split()[2] for line in done.stdout.splitlines() if line.startswith("member")
        ]
        assert sorted(members) == ["-", "static-1"], done.stdout
        assert "removed static-1" in done.stdout
        deadline = time.monotonic() + 60
        while held(other) != 4:
            assert time.monotonic() < deadline, "the other member never took every partition"
            other.poll(0.1)
    finally:
        other.close()
        if static_open:
            static.close()


def test_franz_go_produces_acks_all_and_consumes_in_a_group_with_commits(
    kafka: KafkaBroker,
) -> None:
    franzgo = peer_tools.require("franzgo")["franzgo"]
    asyncio.run(create_topic(kafka.broker.bootstrap, "go-orders", 3))
    produced = [
        json.loads(line)
        for line in peer_tools.run(
            [franzgo, "produce", kafka.bootstrap, "go-orders", "50"]
        ).stdout.splitlines()
    ]
    assert len(produced) == 50
    consumed = [
        json.loads(line)
        for line in peer_tools.run(
            [franzgo, "consume", kafka.bootstrap, "go-orders", "go-readers", "50"]
        ).stdout.splitlines()
    ]
    assert consumed[-1]["event"] == "committed"
    as_tuples = [(e["partition"], e["offset"], e["key"], e["value"]) for e in consumed[:-1]]
    assert sorted(as_tuples) == sorted(
        (e["partition"], e["offset"], e["key"], e["value"]) for e in produced
    )
    # one key's records in the order franz-go sent them (its produce order)
    sent: dict[str, list[str]] = defaultdict(list)
    for e in produced:
        sent[e["key"]].append(e["value"])
    assert _keys_in_order(as_tuples) == sent
    # the group's commits, as Kafka's own tool reads them: every partition at its end
    table = _group_table(
        _java(GROUPS, "--bootstrap-server", kafka.bootstrap, "--describe", "--group", "go-readers")
    )
    assert len(table) == 3 and all(current == end for current, end, _ in table.values())
    assert sum(current for current, _, _ in table.values()) == 50


def test_kcat_metadata_produce_consume_and_group_consume(kafka: KafkaBroker) -> None:
    kcat = peer_tools.require("kcat")["kcat"]
    asyncio.run(create_topic(kafka.broker.bootstrap, "kcat-orders", 3))
    server = ["-b", kafka.bootstrap]
    metadata = json.loads(peer_tools.run([kcat, *server, "-L", "-J", "-t", "kcat-orders"]).stdout)
    assert [b["id"] for b in metadata["brokers"]] == [0]
    (topic,) = metadata["topics"]
    assert topic["topic"] == "kcat-orders"
    assert sorted(p["partition"] for p in topic["partitions"]) == [0, 1, 2]
    assert all(p["leader"] == 0 for p in topic["partitions"])

    lines = "".join(f"k{i % 4}:v{i}\n" for i in range(24))
    peer_tools.run([kcat, *server, "-P", "-t", "kcat-orders", "-K:", "-X", "acks=all"], stdin=lines)
    fmt = ["-f", "%p %o %k %s\\n"]

    def records(out: str) -> list[tuple[int, int, str, str]]:
        rows = [line.split() for line in out.splitlines() if line]
        return [(int(p), int(o), k, v) for p, o, k, v in rows]

    read = records(peer_tools.run([kcat, *server, "-C", "-t", "kcat-orders", "-e", *fmt]).stdout)
    assert sorted(v for *_, v in read) == sorted(f"v{i}" for i in range(24))
    assert _keys_in_order(read) == {f"k{k}": [f"v{i}" for i in range(k, 24, 4)] for k in range(4)}
    group = [kcat, *server, "-G", "kcat-readers", "-X", "auto.offset.reset=earliest"]
    in_group = records(peer_tools.run([*group, "-e", *fmt, "kcat-orders"]).stdout)
    assert sorted(in_group) == sorted(read)
    # the group committed what it read: a second run from the group's offsets reads nothing
    assert records(peer_tools.run([*group, "-e", *fmt, "kcat-orders"]).stdout) == []


@pytest.mark.skipif(not ALL_PEERS, reason="Kafka's perf tools: make kafka-peers")
def test_java_perf_tools_producer_consumer_and_end_to_end_latency(kafka: KafkaBroker) -> None:
    asyncio.run(create_topic(kafka.broker.bootstrap, "java-perf", 3))
    out = _java(
        f"{TOOLS}.ProducerPerformance",
        "--topic",
        "java-perf",
        "--num-records",
        "50000",
        "--record-size",
        "100",
        "--throughput",
        "-1",
        "--bootstrap-server",
        kafka.bootstrap,
        "--command-property",
        "acks=all",
    )
    assert "50000 records sent" in out, out
    out = _java(
        f"{TOOLS}.ConsumerPerformance",
        "--bootstrap-server",
        kafka.bootstrap,
        "--topic",
        "java-perf",
        "--num-records",
        "50000",
    )
    assert re.search(r", 50000, ", out.splitlines()[-1]), out
    # EndToEndLatency wants a one-partition topic
    asyncio.run(create_topic(kafka.broker.bootstrap, "java-latency", 1))
    out = _java(f"{TOOLS}.EndToEndLatency", kafka.bootstrap, "java-latency", "500", "all", "100")
    assert "Avg latency" in out, out
