"""The Kafka codec against bytes written out by hand from Kafka's message schemas."""

from __future__ import annotations

import pytest

from headrace.kafka import messages as km
from headrace.kafka import schema
from headrace.kafka.wire import MalformedKafkaRequest, Reader, Writer

API_VERSIONS = km.SUPPORTED[km.ApiKey.API_VERSIONS]
METADATA = km.SUPPORTED[km.ApiKey.METADATA]
FETCH = km.SUPPORTED[km.ApiKey.FETCH]


@pytest.mark.parametrize(
    ("value", "encoded"),
    [(0, "00"), (1, "01"), (127, "7f"), (128, "8001"), (300, "ac02"), (2**32 - 1, "ffffffff0f")],
)
def test_unsigned_varints(value: int, encoded: str) -> None:
    w = Writer()
    w.uvarint(value)
    assert w.getvalue().hex() == encoded
    assert Reader(bytes.fromhex(encoded)).uvarint() == value


def test_a_varint_longer_than_five_bytes_is_malformed() -> None:
    with pytest.raises(MalformedKafkaRequest):
        Reader(bytes.fromhex("ffffffffff01")).uvarint()


def test_api_versions_v3_request_has_a_v2_header_and_compact_strings() -> None:
    frame = km.encode_request(API_VERSIONS, 3, 7, "c", km.ApiVersionsRequest("x", "1"))
    # size | key 18 | version 3 | correlation 7 | client id "c" (int16 length) | no header tags
    # | compact "x" | compact "1" | no body tags
    assert frame.hex() == ("000000110012000300000007000163000278023100")
    r = Reader(frame[4:])
    header = km.decode_request_header(r)
    assert header == km.RequestHeader(18, 3, 7, "c")
    km.skip_header_tags(r)
    assert km.decode_request(API_VERSIONS, 3, r) == km.ApiVersionsRequest("x", "1")


def test_api_versions_v3_response_keeps_header_v0() -> None:
    body = km.ApiVersionsResponse(0, [km.ApiVersion(18, 0, 4)], 0)
    frame = b"".join(km.encode_response(API_VERSIONS, 3, 7, body))
    # size | correlation 7 (header v0: no tags) | error 0 | compact array of 1
    # | key 18, min 0, max 4, tags | throttle 0 | tags
    assert frame.hex() == "0000001300000007000002001200000004000000000000"
    assert km.decode_response(API_VERSIONS, 3, frame[4:]) == (7, body)


def test_api_versions_v0_response_has_no_throttle_time() -> None:
    body = km.ApiVersionsResponse(35, [km.ApiVersion(0, 3, 9)])
    frame = b"".join(km.encode_response(API_VERSIONS, 0, 1, body))
    assert frame.hex() == "0000001000000001002300000001000000030009"


def test_metadata_v0_request_and_v1_null_topics() -> None:
    frame = km.encode_request(
        METADATA, 0, 2, None, km.MetadataRequest([km.MetadataRequestTopic(name="t")])
    )
    # client id null = int16 -1; topics int32 count 1; name int16 length 1
    assert frame.hex() == "000000110003000000000002ffff00000001000174"
    frame = km.encode_request(METADATA, 1, 2, None, km.MetadataRequest(None))
    assert frame[-4:].hex() == "ffffffff"  # a null array: every topic


def test_metadata_v9_response_is_flexible() -> None:
    body = km.MetadataResponse(
        brokers=[km.MetadataResponseBroker(1, "h", 9)],
        cluster_id="c",
        controller_id=1,
        topics=[
            km.MetadataResponseTopic(
                name="t",
                partitions=[km.MetadataResponsePartition(0, 0, 1, 5, [1], [1], [])],
            )
        ],
    )
    frame = b"".join(km.encode_response(METADATA, 9, 3, body))
    expected = (
        "00000003"
        "00"  # header v1: correlation, no tags
        "00000000"  # throttle
        "02"
        "00000001"
        "0268"
        "00000009"
        "00"
        "00"  # 1 broker: id, "h", port, null rack, tags
        "0263"  # cluster id "c"
        "00000001"  # controller
        "02"
        "0000"
        "0274"
        "00"  # 1 topic: error, "t", not internal
        "02"
        "0000"
        "00000000"
        "00000001"
        "00000005"
        "0200000001"
        "0200000001"
        "01"
        "00"
        "80000000"
        "00"  # authorized operations omitted, topic tags
        "80000000"  # cluster authorized operations (v8-10) omitted
        "00"  # body tags
    )
    assert frame[4:].hex() == expected
    assert km.decode_response(METADATA, 9, frame[4:]) == (3, body)


def test_tagged_fields_are_written_only_when_set_and_read_back() -> None:
    part = km.FetchPartitionData(partition_index=0, high_watermark=5, records=b"")
    w = Writer()
    schema.encode_into(w, part, 12, True)
    plain = w.getvalue()
    assert plain.endswith(bytes.fromhex("ffffffff0100"))  # preferred replica, records, 0 tags
    part.current_leader = km.LeaderIdAndEpoch(2, 7)
    w = Writer()
    schema.encode_into(w, part, 12, True)
    tagged = w.getvalue()
    # one tag: number 1, 9 bytes (leader, epoch, the struct's own empty tags)
    assert tagged.endswith(bytes.fromhex("010109000000020000000700"))
    decoded = schema.decode_from(Reader(tagged), km.FetchPartitionData, 12, True)
    assert decoded.current_leader == km.LeaderIdAndEpoch(2, 7)


def test_unknown_tags_are_skipped() -> None:
    w = Writer()
    schema.encode_into(w, km.ApiVersionsRequest("a", "b"), 3, True)
    raw = w.getvalue()[:-1] + bytes.fromhex("010502abcd")  # tag 5, 2 bytes
    assert schema.decode_from(Reader(raw), km.ApiVersionsRequest, 3, True) == km.ApiVersionsRequest(
        "a", "b"
    )


def test_fetch_v4_request_round_trip() -> None:
    request = km.FetchRequest(
        max_wait_ms=500,
        min_bytes=1,
        max_bytes=1024,
        isolation_level=1,
        topics=[
            km.FetchTopic(
                "t", partitions=[km.FetchPartition(0, fetch_offset=3, partition_max_bytes=99)]
            )
        ],
    )
    frame = km.encode_request(FETCH, 4, 9, "id", request)
    r = Reader(frame[4:])
    km.decode_request_header(r)
    body = km.decode_request(FETCH, 4, r)
    assert body.topics[0].partitions[0].fetch_offset == 3
    assert body.isolation_level == 1 and body.max_bytes == 1024
    # v4: replica -1, wait, min, max, isolation, 1 topic "t", 1 partition (index, offset, max)
    assert frame[4 + 12 :].hex() == (
        "ffffffff000001f4000000010000040001000000010001740000000100000000000000000000000300000063"
    )


@pytest.mark.parametrize(
    "raw",
    [
        "",  # nothing
        "0000",  # a short header
        "00000001",  # topics count 1, nothing after it
        "7fffffff",  # two billion topics in four bytes
        "00000001fffe",  # a string length of -2
    ],
)
def test_malformed_bodies_raise_a_typed_error(raw: str) -> None:
    with pytest.raises(MalformedKafkaRequest):
        km.decode_request(METADATA, 0, Reader(bytes.fromhex(raw)))


def test_trailing_bytes_after_a_request_are_ignored_as_kafka_does() -> None:
    # librdkafka's all-topics Metadata v12, as it sends it: a 4-byte slot for the null
    # topics array, so allow_auto_topic_creation reads 0 and three bytes are left over
    raw = bytes.fromhex("00000000010000")
    body = km.decode_request(METADATA, 12, Reader(raw))
    assert body.topics is None


def test_api_versions_advertises_exactly_the_supported_table() -> None:
    advertised = {(v.api_key, v.min_version, v.max_version) for v in km.advertised_versions()}
    assert advertised == {
        (0, 3, 9),
        (1, 4, 12),
        (2, 1, 7),
        (3, 0, 12),
        (8, 2, 9),
        (9, 1, 9),
        (10, 0, 2),
        (11, 0, 5),
        (12, 0, 3),
        (13, 0, 3),
        (14, 0, 3),
        (15, 0, 4),
        (16, 0, 2),
        (17, 1, 1),
        (18, 0, 4),
        (19, 0, 4),
        (20, 0, 3),
        (22, 0, 4),
        (23, 0, 3),
        (32, 0, 3),
        (33, 0, 2),
        (36, 0, 1),
        (37, 0, 3),
        (42, 0, 1),
        (44, 0, 1),
        (47, 0, 0),
        (60, 0, 0),
        (68, 0, 1),
        (69, 0, 0),
    }


def test_group_requests_read_as_aiokafka_writes_them() -> None:
    """aiokafka's own structs encode; ours decode (the groups' schemas, field by field)."""
    from aiokafka.protocol.commit import OffsetCommitRequest_v3, OffsetFetchRequest_v3
    from aiokafka.protocol.group import JoinGroupRequest_v5, SyncGroupRequest_v3

    def ours(key: km.ApiKey, version: int, raw: bytes) -> object:
        return schema.decode_from(Reader(raw), km.SUPPORTED[key].request, version, False)

    join = JoinGroupRequest_v5("g", 6000, 30000, "m", "static-1", "consumer", [("range", b"md")])
    assert ours(km.ApiKey.JOIN_GROUP, 5, join.encode()) == km.JoinGroupRequest(
        "g", 6000, 30000, "m", "static-1", "consumer", [km.JoinGroupRequestProtocol("range", b"md")]
    )
    sync = SyncGroupRequest_v3("g", 4, "m", None, [("m", b"assigned")])
    assert ours(km.ApiKey.SYNC_GROUP, 3, sync.encode()) == km.SyncGroupRequest(
        "g", 4, "m", None, [km.SyncGroupRequestAssignment("m", b"assigned")]
    )
    commit = OffsetCommitRequest_v3("g", 4, "m", -1, [("t", [(0, 42, "meta")])])
    assert ours(km.ApiKey.OFFSET_COMMIT, 3, commit.encode()) == km.OffsetCommitRequest(
        "g",
        4,
        "m",
        None,
        -1,
        [km.OffsetCommitRequestTopic("t", [km.OffsetCommitRequestPartition(0, 42, -1, "meta")])],
    )
    fetch = OffsetFetchRequest_v3("g", None)
    assert ours(km.ApiKey.OFFSET_FETCH, 3, fetch.encode()) == km.OffsetFetchRequest("g", None)


def test_group_responses_read_as_aiokafka_reads_them() -> None:
    from aiokafka.protocol.commit import OffsetFetchResponse_v3
    from aiokafka.protocol.group import JoinGroupResponse_v5

    join = km.JoinGroupResponse(
        0, 0, 3, "range", "m1", "m2", [km.JoinGroupResponseMember("m1", None, b"md")]
    )
    w = Writer()
    schema.encode_into(w, join, 5, False)
    theirs = JoinGroupResponse_v5.decode(w.getvalue())
    assert (theirs.generation_id, theirs.group_protocol, theirs.leader_id, theirs.member_id) == (
        3,
        "range",
        "m1",
        "m2",
    )
    assert [tuple(m) for m in theirs.members] == [("m1", None, b"md")]
    fetched = km.OffsetFetchResponse(
        0,
        [km.OffsetFetchResponseTopic("t", [km.OffsetFetchResponsePartition(0, 42, -1, "", 0)])],
        0,
    )
    w = Writer()
    schema.encode_into(w, fetched, 3, False)
    decoded = OffsetFetchResponse_v3.decode(w.getvalue())
    assert decoded.topics[0][1][0][:2] == (0, 42)


OFFSET_FETCH = km.SUPPORTED[km.ApiKey.OFFSET_FETCH]


def test_offset_fetch_v8_asks_for_several_groups_as_kafkas_schema_writes_it() -> None:
    """v8 (KIP-709): a groups array, each with nullable topics, then require_stable;
    v9 adds each group's member id and epoch (KIP-848). Flexible since v6."""
    v8 = bytes.fromhex(
        "03"  # two groups
        "0261 00 00"  # "a", topics null, tags
        "0262 02 0274 03 00000000 00000002 00 00"  # "b": topic "t", partitions [0, 2]
        "01 00"  # require_stable, tags
    )
    asked = km.OffsetFetchRequest(
        groups=[
            km.OffsetFetchRequestGroup("a", None, -1, None),
            km.OffsetFetchRequestGroup("b", None, -1, [km.OffsetFetchRequestTopic("t", [0, 2])]),
        ],
        require_stable=True,
    )
    assert schema.decode_from(Reader(v8), OFFSET_FETCH.request, 8, True) == asked
    v9 = bytes.fromhex("02 0261 036d31 00000007 00 00 00 00")  # "a", member "m1", epoch 7
    assert schema.decode_from(Reader(v9), OFFSET_FETCH.request, 9, True) == km.OffsetFetchRequest(
        groups=[km.OffsetFetchRequestGroup("a", "m1", 7, None)]
    )
    answer = km.OffsetFetchResponse(
        0,
        groups=[
            km.OffsetFetchResponseGroup(
                "a",
                [km.OffsetFetchResponseTopic("t", [km.OffsetFetchResponsePartition(0, 42, 3, "")])],
            ),
            km.OffsetFetchResponseGroup("b", [], 113),
        ],
    )
    w = Writer()
    schema.encode_into(w, answer, 8, True)
    assert w.getvalue() == bytes.fromhex(
        "00000000 03"  # throttle, two groups
        "0261 02 0274 02 00000000 000000000000002a 00000003 01 0000 00 00 0000 00"
        "0262 01 0071 00"  # "b": no topics, STALE_MEMBER_EPOCH
        "00"
    )
    assert OFFSET_FETCH.supports(9) and not OFFSET_FETCH.supports(10)
    assert not OFFSET_FETCH.flexible(5) and OFFSET_FETCH.flexible(6)


def test_offset_fetch_v7_is_one_group_and_flexible() -> None:
    raw = bytes.fromhex("02670202740200000001000000")
    assert schema.decode_from(Reader(raw), OFFSET_FETCH.request, 7, True) == km.OffsetFetchRequest(
        "g", [km.OffsetFetchRequestTopic("t", [1])]
    )
    answer = km.OffsetFetchResponse(0, [], 16)
    w = Writer()
    schema.encode_into(w, answer, 7, True)
    assert w.getvalue().hex() == "0000000001001000"


def test_leave_group_v3_names_members_by_member_or_instance_id() -> None:
    api = km.SUPPORTED[km.ApiKey.LEAVE_GROUP]
    raw = bytes.fromhex(
        "0001 67"  # group "g"
        "00000002"  # two members
        "0000 0002 7331"  # by instance id "s1" (no member id)
        "0002 6d32 ffff"  # by member id "m2" (a null instance id)
    )
    assert schema.decode_from(Reader(raw), api.request, 3, False) == km.LeaveGroupRequest(
        "g", "", [km.LeaveGroupMember("", "s1"), km.LeaveGroupMember("m2", None)]
    )
    answer = km.LeaveGroupResponse(0, 0, [km.LeaveGroupMemberResponse("", "s1", 82)])
    w = Writer()
    schema.encode_into(w, answer, 3, False)
    assert w.getvalue() == bytes.fromhex("00000000 0000 00000001 0000 0002 7331 0052")
    assert api.supports(3) and not api.supports(4)


def test_offset_delete_v0_as_kafkas_schema_writes_it() -> None:
    """OffsetDelete v0 (its only version): group, topics, partitions; the response puts the
    error code before the throttle time."""
    api = km.SUPPORTED[km.ApiKey.OFFSET_DELETE]
    raw = bytes.fromhex(
        "0001"
        "67"  # group_id "g"
        "00000001"
        "0001"
        "74"  # one topic "t"
        "00000002"
        "00000000"
        "00000003"  # partitions 0 and 3
    )
    assert schema.decode_from(Reader(raw), api.request, 0, False) == km.OffsetDeleteRequest(
        "g",
        [
            km.OffsetDeleteRequestTopic(
                "t", [km.OffsetDeleteRequestPartition(0), km.OffsetDeleteRequestPartition(3)]
            )
        ],
    )
    answer = km.OffsetDeleteResponse(
        0, 0, [km.OffsetDeleteResponseTopic("t", [km.OffsetDeleteResponsePartition(3, 86)])]
    )
    w = Writer()
    schema.encode_into(w, answer, 0, False)
    assert w.getvalue().hex() == ("0000000000000000000100017400000001000000030056")
    assert not api.flexible(0) and api.supports(0) and not api.supports(1)


CREATE_PARTITIONS = km.SUPPORTED[km.ApiKey.CREATE_PARTITIONS]


def test_create_partitions_v0_as_kafkas_schema_writes_it() -> None:
    """Topics (name, new count, nullable assignments), timeout, validate_only; the answer
    is the throttle time, then per topic its name, error code and nullable message."""
    raw = bytes.fromhex(
        "00000001"  # one topic
        "000174"  # name "t"
        "00000004"  # count 4
        "ffffffff"  # assignments: null
        "00007530"  # timeout_ms 30000
        "01"  # validate_only
    )
    asked = km.CreatePartitionsRequest([km.CreatePartitionsTopic("t", 4, None)], 30000, True)
    assert schema.decode_from(Reader(raw), CREATE_PARTITIONS.request, 0, False) == asked
    answer = km.CreatePartitionsResponse(0, [km.CreatePartitionsTopicResult("t", 37, None)])
    w = Writer()
    schema.encode_into(w, answer, 0, False)
    assert w.getvalue().hex() == "00000000000000010001740025ffff"
    assert not CREATE_PARTITIONS.flexible(1) and CREATE_PARTITIONS.flexible(2)


def test_create_partitions_v2_is_flexible() -> None:
    raw = bytes.fromhex(
        "02"  # one topic
        "0274"  # name "t"
        "00000003"  # count 3
        "02"  # one assignment
        "03"
        "00000001"
        "00000002"  # broker_ids [1, 2]
        "00"  # the assignment's tags
        "00"  # the topic's tags
        "000003e8"  # timeout_ms 1000
        "00"  # validate_only false
        "00"  # the body's tags
    )
    asked = km.CreatePartitionsRequest(
        [km.CreatePartitionsTopic("t", 3, [km.CreatePartitionsAssignment([1, 2])])], 1000, False
    )
    assert schema.decode_from(Reader(raw), CREATE_PARTITIONS.request, 2, True) == asked
    answer = km.CreatePartitionsResponse(
        0, [km.CreatePartitionsTopicResult("t", 44, "no"), km.CreatePartitionsTopicResult("u", 0)]
    )
    frame = b"".join(km.encode_response(CREATE_PARTITIONS, 2, 9, answer))
    # size | correlation 9, header tags | throttle | compact array of 2
    # | "t", 44, compact "no", tags | "u", 0, null (compact 0), tags | tags
    assert frame[4:].hex() == ("000000090000000000030274002c036e6f0002750000000000")
    assert km.decode_response(CREATE_PARTITIONS, 2, frame[4:]) == (9, answer)


def test_create_partitions_as_aiokafka_writes_and_reads_it() -> None:
    from aiokafka.protocol.admin import CreatePartitionsRequest_v1, CreatePartitionsResponse_v1

    theirs = CreatePartitionsRequest_v1(
        [("orders", (6, [[1], [2]])), ("audit", (2, None))], 500, False
    )
    assert schema.decode_from(
        Reader(theirs.encode()), CREATE_PARTITIONS.request, 1, False
    ) == km.CreatePartitionsRequest(
        [
            km.CreatePartitionsTopic(
                "orders",
                6,
                [km.CreatePartitionsAssignment([1]), km.CreatePartitionsAssignment([2])],
            ),
            km.CreatePartitionsTopic("audit", 2, None),
        ],
        500,
        False,
    )
    w = Writer()
    answer = km.CreatePartitionsResponse(
        0, [km.CreatePartitionsTopicResult("orders", 37, "Topic already has 6 partition(s).")]
    )
    schema.encode_into(w, answer, 1, False)
    decoded = CreatePartitionsResponse_v1.decode(w.getvalue())
    assert [tuple(t) for t in decoded.topic_errors] == [
        ("orders", 37, "Topic already has 6 partition(s).")
    ]


INCREMENTAL_ALTER_CONFIGS = km.SUPPORTED[km.ApiKey.INCREMENTAL_ALTER_CONFIGS]
ALTER_CONFIGS = km.SUPPORTED[km.ApiKey.ALTER_CONFIGS]


def test_incremental_alter_configs_v0_as_kafkas_schema_writes_it() -> None:
    """Resources (type, name, configs of name, operation, nullable value), validate_only;
    the answer: throttle time, then per resource error code, message, type and name."""
    raw = bytes.fromhex(
        "00000001"  # one resource
        "02"  # type: topic
        "000174"  # name "t"
        "00000002"  # two configs
        "000c" + b"retention.ms".hex() + "00"
        "0003"
        + b"100".hex()  # SET "100"
        + "000d"
        + b"segment.bytes".hex()
        + "01"
        "ffff"  # DELETE, null value
         + "00"  # validate_only false
    )
    assert schema.decode_from(
        Reader(raw), INCREMENTAL_ALTER_CONFIGS.request, 0, False
    ) == km.IncrementalAlterConfigsRequest(
        [
            km.IncrementalAlterConfigsResource(
                2,
                "t",
                [
                    km.IncrementalAlterableConfig("retention.ms", 0, "100"),
                    km.IncrementalAlterableConfig("segment.bytes", 1, None),
                ],
            )
        ],
        False,
    )
    answer = km.AlterConfigsResponse(0, [km.AlterConfigsResourceResponse(40, "no", 2, "t")])
    w = Writer()
    schema.encode_into(w, answer, 0, False)
    assert w.getvalue().hex() == "0000000000000001002800026e6f02000174"


def test_incremental_alter_configs_v1_is_flexible() -> None:
    raw = bytes.fromhex(
        "02"  # one resource
        "02"  # type: topic
        "0274"  # compact "t"
        "02"  # one config
        "0d" + b"retention.ms".hex() + "00"
        "04" + b"100".hex() + "00"  # SET "100", tags
        "00"  # the resource's tags
        "01"  # validate_only
        "00"  # the body's tags
    )
    asked = km.IncrementalAlterConfigsRequest(
        [
            km.IncrementalAlterConfigsResource(
                2, "t", [km.IncrementalAlterableConfig("retention.ms", 0, "100")]
            )
        ],
        True,
    )
    assert schema.decode_from(Reader(raw), INCREMENTAL_ALTER_CONFIGS.request, 1, True) == asked
    answer = km.AlterConfigsResponse(0, [km.AlterConfigsResourceResponse(0, None, 2, "t")])
    frame = b"".join(km.encode_response(INCREMENTAL_ALTER_CONFIGS, 1, 5, answer))
    # correlation 5, header tags | throttle | one resource: error 0, null message
    # (compact 0), type 2, compact "t", tags | tags
    assert frame[4:].hex() == "000000050000000000020000000202740000"
    assert km.decode_response(INCREMENTAL_ALTER_CONFIGS, 1, frame[4:]) == (5, answer)
    assert not INCREMENTAL_ALTER_CONFIGS.flexible(0)


def test_alter_configs_as_aiokafka_writes_and_reads_it() -> None:
    from aiokafka.protocol.admin import AlterConfigsRequest_v1, AlterConfigsResponse_v1

    theirs = AlterConfigsRequest_v1([(2, "t", [("retention.ms", "100")])], True)
    assert schema.decode_from(
        Reader(theirs.encode()), ALTER_CONFIGS.request, 1, False
    ) == km.AlterConfigsRequest(
        [km.AlterConfigsResource(2, "t", [km.AlterableConfig("retention.ms", "100")])], True
    )
    w = Writer()
    answer = km.AlterConfigsResponse(0, [km.AlterConfigsResourceResponse(44, "why", 2, "t")])
    schema.encode_into(w, answer, 1, False)
    decoded = AlterConfigsResponse_v1.decode(w.getvalue())
    assert [tuple(r) for r in decoded.resources] == [(44, "why", 2, "t")]
    assert ALTER_CONFIGS.flexible(2) and not ALTER_CONFIGS.flexible(1)


def test_list_offsets_v7_is_v6_asking_for_the_max_timestamp() -> None:
    api = km.SUPPORTED[km.ApiKey.LIST_OFFSETS]
    raw = bytes.fromhex(
        "ffffffff"  # replica_id -1
        "00"  # isolation_level
        "02"  # one topic
        "0274"  # compact "t"
        "02"  # one partition
        "00000000"  # partition 0
        "ffffffff"  # current_leader_epoch -1
        "fffffffffffffffd"  # timestamp -3: MAX_TIMESTAMP
        "00"
        "00"
        "00"  # the partition's, the topic's and the body's tags
    )
    assert schema.decode_from(Reader(raw), api.request, 7, True) == km.ListOffsetsRequest(
        -1,
        0,
        [km.ListOffsetsTopic("t", [km.ListOffsetsPartition(0, -1, km.MAX_TIMESTAMP)])],
    )
    assert api.supports(7) and not api.supports(8)


def test_consumer_group_heartbeat_v1_reads_as_librdkafka_writes_it() -> None:
    """librdkafka 2.16's join (``rd_kafka_ConsumerGroupHeartbeatRequest``), byte by byte:
    compact strings, a null instance and rack id, an empty regex, no assignor, and an empty
    owned list; then the answer with an assignment reads back."""
    api = km.SUPPORTED[km.ApiKey.CONSUMER_GROUP_HEARTBEAT]
    raw = bytes.fromhex(
        "0267"  # group id "g"
        "036d31"  # member id "m1"
        "00000000"  # member epoch 0
        "00"  # instance id: null
        "00"  # rack id: null
        "000493e0"  # rebalance timeout 300000
        "020274"  # subscribed topic names ["t"]
        "01"  # regex: ""
        "00"  # server assignor: null
        "01"  # topic partitions: []
        "00"  # no tagged fields
    )
    body = km.decode_request(api, 1, Reader(raw))
    assert body == km.ConsumerGroupHeartbeatRequest(
        "g", "m1", 0, None, None, 300_000, ["t"], "", None, []
    )
    tid = bytes(range(16))
    answer = km.ConsumerGroupHeartbeatResponse(
        0,
        0,
        None,
        "m1",
        3,
        2000,
        km.HeartbeatAssignment([km.HeartbeatTopicPartitions(tid, [0, 2])]),
    )
    frame = b"".join(km.encode_response(api, 1, 7, answer))
    assert km.decode_response(api, 1, frame[4:]) == (7, answer)
    # no assignment: a null struct, one byte
    unchanged = km.ConsumerGroupHeartbeatResponse(0, 0, None, "m1", 3, 2000, None)
    frame = b"".join(km.encode_response(api, 1, 7, unchanged))
    assert frame.endswith(bytes.fromhex("ff" + "00"))  # null marker, then no tags
