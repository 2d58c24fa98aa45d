"""Codecs and progress through the real CLI and a real broker.

- ``headrace produce --compression C`` stores batches with codec C exactly as
  sent (the broker never decompresses or recompresses) and ``consume`` reads
  them back.
- Progress bars appear when stderr is a terminal (a pty) and never in a pipe.
"""

from __future__ import annotations

import asyncio
import os
import pty
import re
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from headrace.client.cluster import ClusterClient
from headrace.protocol import messages as msg
from headrace.protocol.frames import Op
from headrace.records import batch as rb
from headrace.records import codecs
from headrace.testing import procs
from headrace.testing.procs import BrokerProcess

ANSI_OR_BAR = re.compile(rb"\x1b\[|\xe2\x94\x81")  # an escape sequence, or rich's bar glyph


def cli(
    broker: BrokerProcess, *args: str, stdin: bytes = b""
) -> subprocess.CompletedProcess[bytes]:
    return procs.run_headrace(*args, "--bootstrap", broker.bootstrap, stdin=stdin, timeout=60)


async def stored_batches(bootstrap: str, topic: str) -> list[bytes]:
    """Partition 0's batches exactly as the broker returns them to a FETCH."""
    cluster = ClusterClient(bootstrap)
    batches: list[bytes] = []
    try:
        await cluster.start()
        conn = await cluster.connection_for(topic, 0)
        offset = 0
        while True:
            req = msg.FetchRequest(topic, 0, offset, 4 * 1024 * 1024, 0, msg.Isolation.COMMITTED)
            frame = await conn.request(Op.FETCH, req.encode())
            head, data = msg.FetchResponseHeader.decode(frame.body)
            if not data:
                return batches
            for pos, header in rb.scan(data):
                batches.append(bytes(data[pos : pos + header.size]))
                offset = header.next_offset
            if offset >= head.high_watermark:
                return batches
    finally:
        await cluster.close()


def json_lines(n: int) -> bytes:
    return b"".join(
        b'{"event":"click","user":%d,"page":"/items/%d","ms":%d}\n' % (i, i % 13, 1000 + i)
        for i in range(n)
    )


@pytest.mark.parametrize("codec", ["none", "zlib", "lz4", "zstd"])
def test_produce_with_each_codec_is_stored_as_sent_and_consumed(
    broker: BrokerProcess, codec: str
) -> None:
    topic = f"codec-{codec}"
    assert cli(broker, "topics", "create", topic, "--partitions", "1").returncode == 0
    lines = json_lines(2_000)
    produced = cli(broker, "produce", topic, "--compression", codec, stdin=lines)
    assert produced.returncode == 0, produced.stderr
    # in a pipe: the result line and nothing else, no progress bar
    assert produced.stderr.decode().strip() == f"produced 2000 records to {topic}"

    batches = asyncio.run(stored_batches(broker.bootstrap, topic))
    assert batches
    assert {rb.read_header(b).compression for b in batches} == {codecs.codec_id(codec)}
    if codec != "none":
        stored = sum(len(b) for b in batches)
        assert stored < len(lines) // 2  # what the broker holds is the compressed bytes
    values = [v for b in batches for v in rb.decode(b).values]
    assert values == lines.splitlines()

    consumed = cli(broker, "consume", topic, "--cohort", "c", "--from-beginning", "--count", "2000")
    assert consumed.returncode == 0, consumed.stderr
    assert consumed.stdout.splitlines() == lines.splitlines()


def test_produce_rejects_an_unknown_codec_before_connecting() -> None:
    out = procs.run_headrace(
        "produce", "t", "--compression", "snappy", "--bootstrap", "127.0.0.1:1"
    )
    assert out.returncode != 0
    assert b"snappy" in out.stderr


def run_with_stderr_on_a_pty(argv: list[str], stdin_path: Path | None) -> tuple[int, bytes]:
    """Run ``argv`` with stderr on a pseudo-terminal (stdout piped); return (rc, pty bytes)."""
    master, slave = pty.openpty()
    captured: list[bytes] = []

    def drain() -> None:
        # read until the child closes its end (EIO on Linux); a full pty would block it
        while True:
            try:
                data = os.read(master, 65536)
            except OSError:
                return
            if not data:
                return
            captured.append(data)

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    env = procs.child_env() | {"TERM": "xterm-256color", "COLUMNS": "120"}
    stdin = stdin_path.open("rb") if stdin_path is not None else subprocess.DEVNULL
    try:
        child = subprocess.run(
            argv,
            stdin=stdin,
            stdout=subprocess.PIPE,
            stderr=slave,
            env=env,
            timeout=120,
            check=False,
        )
    finally:
        os.close(slave)
        if stdin_path is not None:
            stdin.close()  # type: ignore[union-attr]
    reader.join(timeout=30)
    os.close(master)
    return child.returncode, b"".join(captured)


def test_produce_from_a_file_shows_progress_on_a_terminal(
    broker: BrokerProcess, tmp_path: Path
) -> None:
    assert cli(broker, "topics", "create", "progress", "--partitions", "2").returncode == 0
    source = tmp_path / "events.jsonl"
    source.write_bytes(json_lines(50_000))
    argv = [*procs.HEADRACE_CLI, "produce", "progress", "--bootstrap", broker.bootstrap]
    rc, shown = run_with_stderr_on_a_pty(argv, source)
    assert rc == 0, shown
    assert ANSI_OR_BAR.search(shown), shown
    text = shown.decode(errors="replace")
    assert "produce progress" in text
    assert "50,000 records" in text  # the running count beside the byte bar
    assert f"{source.stat().st_size / 1e6:.1f}" in text  # the file's size is the bar's total
    assert "produced 50000 records to progress" in text


def test_bench_shows_progress_on_a_terminal_and_none_in_a_pipe(broker: BrokerProcess) -> None:
    assert cli(broker, "topics", "create", "benchy", "--partitions", "1").returncode == 0
    args = ["bench", "benchy", "--records", "30000", "--value-bytes", "50"]
    args += ["--bootstrap", broker.bootstrap]
    rc, shown = run_with_stderr_on_a_pty([*procs.HEADRACE_CLI, *args], None)
    assert rc == 0, shown
    text = shown.decode(errors="replace")
    assert ANSI_OR_BAR.search(shown), text
    assert "bench benchy" in text and "30000/30000" in text

    piped = procs.run_headrace(*args)
    assert piped.returncode == 0, piped.stderr
    assert piped.stderr == b""
    assert b"records/s" in piped.stdout


def test_produce_typed_at_a_terminal_draws_no_bar_over_the_typing(broker: BrokerProcess) -> None:
    """stdin and stderr on one terminal: a person typing lines. A bar redrawn ten times a
    second would erase the line being typed, so there is none."""
    assert cli(broker, "topics", "create", "typed", "--partitions", "1").returncode == 0
    master, slave = pty.openpty()
    env = procs.child_env() | {"TERM": "xterm-256color"}
    argv = [*procs.HEADRACE_CLI, "produce", "typed", "--bootstrap", broker.bootstrap]
    child = subprocess.Popen(argv, stdin=slave, stdout=subprocess.PIPE, stderr=slave, env=env)
    os.close(slave)
    captured: list[bytes] = []
    reader = threading.Thread(target=lambda: _drain(master, captured), daemon=True)
    reader.start()
    os.write(master, b"one\ntwo\n\x04")  # two lines, then Ctrl-D (end of input)
    assert child.wait(timeout=60) == 0
    reader.join(timeout=30)
    os.close(master)
    shown = b"".join(captured)
    assert b"produced 2 records to typed" in shown
    assert not ANSI_OR_BAR.search(shown), shown


def _drain(master: int, into: list[bytes]) -> None:
    while True:
        try:
            data = os.read(master, 65536)
        except OSError:
            return
        if not data:
            return
        into.append(data)


def test_a_broker_without_the_codec_libraries_stores_and_serves_lz4_and_zstd(
    tmp_path: Path,
) -> None:
    """The broker never decompresses: with lz4 and zstandard unimportable in its process it
    still accepts, stores and serves batches in both codecs."""
    shim = tmp_path / "no-codecs"
    for package in ("lz4", "zstandard"):
        (shim / package).mkdir(parents=True)
        (shim / package / "__init__.py").write_text(
            f"raise ImportError('{package} is hidden from this broker by the test')\n"
        )
    pythonpath = os.pathsep.join(p for p in (str(shim), procs.child_env().get("PYTHONPATH")) if p)
    broker = BrokerProcess(tmp_path / "data", env={"PYTHONPATH": pythonpath})
    broker.start()
    try:
        hidden = subprocess.run(
            [sys.executable, "-c", "import lz4"],
            env={**procs.child_env(), "PYTHONPATH": pythonpath},
            capture_output=True,
            check=False,
        )
        assert b"hidden from this broker" in hidden.stderr  # the shim works
        for codec in ("lz4", "zstd"):
            topic = f"blind-{codec}"
            broker.create_topic(topic, 1)
            produced = cli(broker, "produce", topic, "--compression", codec, stdin=json_lines(500))
            assert produced.returncode == 0, produced.stderr
            batches = asyncio.run(stored_batches(broker.bootstrap, topic))
            assert {rb.read_header(b).compression for b in batches} == {codecs.codec_id(codec)}
            assert [v for b in batches for v in rb.decode(b).values] == json_lines(500).splitlines()
    finally:
        broker.kill9()
