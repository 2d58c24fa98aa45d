"""The Kafka fuzzer's inputs: seeds that the listener's decoders accept whole, mutations
that break what they say they break, and answers counted by code."""

from __future__ import annotations

import random
import struct
from collections import Counter

from bench.fuzz import kafka_inputs as ki
from headrace.kafka import messages as km
from headrace.kafka.errors import ErrorCode
from headrace.kafka.wire import Reader
from headrace.records import batch as rb


def produce_seeds() -> list[bytes]:
    requests = ki.seed_requests()
    # the first len(requests) seeds are one request each, in order
    return [
        seed
        for seed, (api, _, _) in zip(ki.seeds(), requests, strict=False)
        if api == km.ApiKey.PRODUCE
    ]


def test_every_seed_request_decodes_whole_and_produces_valid_batches() -> None:
    requests = ki.seed_requests()
    for seed, (api, version, _) in zip(ki.seeds(), requests, strict=False):
        shadow = ki.shadow_decode(seed)
        assert shadow.frames == 1
        assert [(a.key, v) for _, a, v in shadow.requests] == [(api, version)]
    assert {api for api, _, _ in requests} >= {
        km.ApiKey.API_VERSIONS,
        km.ApiKey.METADATA,
        km.ApiKey.PRODUCE,
        km.ApiKey.FETCH,
        km.ApiKey.LIST_OFFSETS,
        km.ApiKey.FIND_COORDINATOR,
        km.ApiKey.JOIN_GROUP,
        km.ApiKey.OFFSET_COMMIT,
        km.ApiKey.SASL_HANDSHAKE,
    }
    flexible = {km.SUPPORTED[api].flexible(v) for api, v, _ in requests}
    assert flexible == {True, False}
    assert rb.validate_kafka(ki.seed_batch()).record_count == len(ki.SEED_VALUES)
    # four Produce seeds of three records each
    assert sum(ki.shadow_decode(s).well_formed_records for s in produce_seeds()) == 12


def test_a_mutated_batch_is_never_well_formed() -> None:
    for seed in range(300):
        rng = random.Random(seed)
        frame = rng.choice(produce_seeds())
        mutated = ki.mutate_batch(frame, rng)
        assert mutated != frame, seed
        assert ki.shadow_decode(mutated).well_formed_records == 0, (seed, mutated.hex())


def test_a_byte_flipped_under_the_crc_leaves_the_request_parseable() -> None:
    frame = bytearray(produce_seeds()[0])
    at = ki._batch_at(bytes(frame))
    frame[at + rb.KAFKA_HEADER_SIZE + 2] ^= 0x01  # inside the first record
    shadow = ki.shadow_decode(bytes(frame))
    assert len(shadow.requests) == 1  # the broker reads it, and refuses its batch
    assert shadow.well_formed_records == 0


def test_the_fence_completes_a_flexible_produce_cut_before_its_tags() -> None:
    # Produce v9 ends with three tagged-field counts (partition, topic, request), all 0; the
    # fence's size prefix starts with zero bytes, so the broker sees the request whole
    v9 = produce_seeds()[3]
    assert ki.shadow_decode(v9).requests[0][2] == 9
    cut = v9[:-3]
    assert ki.shadow_decode(cut).well_formed_records == 0
    assert ki.shadow_decode(cut, ki.fence()).well_formed_records == 3


def test_header_and_framing_mutations_change_the_frame() -> None:
    frame = ki.seeds()[0]
    rng = random.Random(3)
    assert any(ki.mutate_header(frame, rng) != frame for _ in range(20))
    for _ in range(20):
        frames = ki.mutate_framing([frame], 0, rng)
        assert frames != [frame]


def test_answers_are_counted_by_code_and_the_fence_is_not() -> None:
    shadow = ki.shadow_decode(produce_seeds()[0])
    (correlation_id, api, version) = shadow.requests[0]
    partition = km.PartitionProduceResponse(0, ErrorCode.CORRUPT_MESSAGE, -1)
    body = km.ProduceResponse([km.TopicProduceResponse(ki.SEED_TOPIC, [partition])])
    produce_answer = b"".join(km.encode_response(api, version, correlation_id, body))
    error_only = struct.pack(">iih", 6, 99, ErrorCode.INVALID_REQUEST)
    fence_api = km.SUPPORTED[km.ApiKey.API_VERSIONS]
    fence_answer = b"".join(
        km.encode_response(fence_api, 0, ki.FENCE_CORRELATION_ID, km.ApiVersionsResponse(0, [], 0))
    )
    codes: Counter[str] = Counter()
    answers = ki.tally_answers(produce_answer + error_only + fence_answer, shadow, codes)
    assert answers == 2
    assert codes == Counter({"CORRUPT_MESSAGE": 1, "INVALID_REQUEST": 1})
    assert ki.split_frames(fence_answer)[0][0][4:8] == ki.FENCE_CORRELATION_ID.to_bytes(4, "big")


def test_the_fence_is_an_api_versions_request() -> None:
    frame = ki.fence()
    header = km.decode_request_header(Reader(frame[4:]))
    assert (header.api_key, header.api_version) == (km.ApiKey.API_VERSIONS, 0)
