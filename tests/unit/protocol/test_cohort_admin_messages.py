"""DescribeCohorts (op 56) and ResetCursors (op 58) bodies: typed, bad input refused."""

from __future__ import annotations

import pytest

from headrace.errors import InvalidRequest, MalformedFrame
from headrace.protocol import messages as msg
from headrace.protocol.frames import Op


def test_the_ops_answer_with_op_plus_one() -> None:
    assert Op.DESCRIBE_COHORTS_OK == Op.DESCRIBE_COHORTS + 1 == 57
    assert Op.RESET_CURSORS_OK == Op.RESET_CURSORS + 1 == 59


def test_describe_cohorts_round_trips_and_takes_an_empty_body() -> None:
    assert msg.DescribeCohorts.decode(msg.DescribeCohorts("c").encode()) == msg.DescribeCohorts("c")
    assert msg.DescribeCohorts.decode(b"") == msg.DescribeCohorts(None)
    with pytest.raises(MalformedFrame):
        msg.DescribeCohorts.decode(b'{"cohort": 3}')


def test_reset_cursors_round_trips() -> None:
    for body in (
        msg.ResetCursors("default/t", "c", "earliest"),
        msg.ResetCursors("default/t", "c", "offset", 42, [0, 2], dry_run=True),
        msg.ResetCursors("default/t", "c", "timestamp", 1_700_000_000_000),
    ):
        assert msg.ResetCursors.decode(body.encode()) == body


@pytest.mark.parametrize(
    ("body", "error", "text"),
    [
        (b'{"topic":"t","cohort":"c","to":"yesterday"}', InvalidRequest, "'to' must be one of"),
        (b'{"topic":"t","cohort":"c","to":"offset"}', MalformedFrame, "missing field 'value'"),
        (b'{"topic":"t","cohort":"c","to":"offset","value":-1}', InvalidRequest, "negative"),
        (b'{"topic":"t","cohort":"c","to":"latest","value":3}', InvalidRequest, "goes with"),
        (b'{"topic":"t","cohort":"c","to":"latest","partitions":[true]}', MalformedFrame, "list"),
        (b'{"topic":"t","cohort":"c","to":"latest","dry_run":1}', MalformedFrame, "boolean"),
        (b'{"cohort":"c","to":"latest"}', MalformedFrame, "missing field 'topic'"),
    ],
)
def test_reset_cursors_refuses_bad_bodies(body: bytes, error: type[Exception], text: str) -> None:
    with pytest.raises(error, match=text):
        msg.ResetCursors.decode(body)
