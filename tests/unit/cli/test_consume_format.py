"""``headrace consume`` output lines: text with keys, JSON lines with base64 for binary."""

from __future__ import annotations

import base64
import json

from headrace.cli.consume import json_line, text_line
from headrace.records.batch import Record


def test_json_lines_carry_every_field_and_mark_binary_as_base64() -> None:
    record = Record(7, 1_700_000_000_000, b"k\xff", "héllo".encode(), (("trace", b"\xfe\x01"),))
    line = json_line(2, record)
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    doc = json.loads(line)
    assert doc == {
        "partition": 2,
        "offset": 7,
        "timestamp": 1_700_000_000_000,
        "key": {"base64": base64.b64encode(b"k\xff").decode()},
        "value": "héllo",
        "headers": [{"name": "trace", "value": {"base64": base64.b64encode(b"\xfe\x01").decode()}}],
    }
    assert json.loads(json_line(0, Record(0, 0, None, b"v")))["key"] is None


def test_text_lines_with_keys_and_offsets() -> None:
    keyed = Record(3, 0, b"user-1", b"clicked")
    plain = Record(4, 0, None, b"viewed")
    assert text_line(1, keyed, False, False) == b"clicked\n"
    assert text_line(1, keyed, True, False) == b"user-1\tclicked\n"
    assert text_line(1, plain, True, False) == b"\tviewed\n"
    assert text_line(1, keyed, True, True) == b"1:3 user-1\tclicked\n"
    assert text_line(1, plain, False, True) == b"1:4 viewed\n"
