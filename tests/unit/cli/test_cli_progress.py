"""The CLI's progress bars (drawn on a terminal only) and produce's line reader."""

from __future__ import annotations

import asyncio
import io
import os
import pty
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from headrace.cli import producing
from headrace.cli.progress import Progress, wanted


@pytest.fixture
def terminal() -> Iterator[tuple[io.TextIOWrapper, int]]:
    """A text stream on the slave side of a pty, and the master fd to read what it shows."""
    master, slave = pty.openpty()
    stream = open(slave, "w", encoding="utf-8", closefd=True)  # noqa: SIM115 -- closed below
    try:
        yield stream, master
    finally:
        stream.close()
        os.close(master)


def read_available(master: int) -> bytes:
    os.set_blocking(master, False)
    chunks = []
    while True:
        try:
            chunk = os.read(master, 65536)
        except BlockingIOError:
            break
        if not chunk:
            break
        chunks.append(chunk)
    return b"".join(chunks)


def test_a_pipe_or_a_file_gets_nothing(tmp_path: Path) -> None:
    piped = io.StringIO()
    with Progress("produce t", total=1000, unit="bytes", stream=piped) as progress:
        progress.advance(500, records=10)
        progress.advance(500, records=20)
    assert not progress.enabled
    assert piped.getvalue() == ""
    with (
        (tmp_path / "log").open("w") as file,
        Progress("bench", total=5, unit="records", stream=file) as progress,
    ):
        progress.advance(5)
    assert (tmp_path / "log").read_text() == ""


def test_a_closed_stream_counts_as_a_pipe() -> None:
    stream = io.StringIO()
    stream.close()
    assert not wanted(stream)


def test_a_terminal_gets_a_bar_with_counts(
    terminal: tuple[io.TextIOWrapper, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TERM", "xterm-256color")
    monkeypatch.setenv("COLUMNS", "120")
    stream, master = terminal
    with Progress("produce orders", total=2_000_000, unit="bytes", stream=stream) as progress:
        assert progress.enabled
        progress.advance(1_000_000, records=12_345)
        progress.advance(1_000_000, records=24_690)
    shown = read_available(master)
    assert b"\x1b[" in shown  # drawn with terminal control sequences
    text = shown.decode(errors="replace")
    assert "produce orders" in text
    assert "24,690 records" in text
    assert "2.0/2.0 MB" in text


def test_quiet_keeps_a_terminal_clean(terminal: tuple[io.TextIOWrapper, int]) -> None:
    stream, master = terminal
    with Progress("produce t", total=None, unit="bytes", stream=stream, quiet=True) as progress:
        progress.advance(10, records=1)
    assert not progress.enabled
    assert read_available(master) == b""


# --------------------------------------------------------------------------- produce's reader


class FakeProducer:
    """Records what produce_lines sends; each call returns an already-settled future."""

    def __init__(self) -> None:
        self.sent: list[tuple[bytes | None, bytes, int | None]] = []

    def _done(self) -> asyncio.Future[Any]:
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        future.set_result(None)
        return future

    async def send_many(
        self, topic: str, values: Sequence[bytes], *, partition: int | None = None
    ) -> list[asyncio.Future[Any]]:
        self.sent += [(None, v, partition) for v in values]
        return [self._done()]

    async def send(
        self, topic: str, value: bytes, *, key: bytes | None = None, partition: int | None = None
    ) -> asyncio.Future[Any]:
        self.sent.append((key, value, partition))
        return self._done()

    async def flush(self) -> None:
        pass


class Trickle(io.BytesIO):
    """A stream whose ``read1`` returns a few bytes at a time, as a slow pipe does."""

    def read1(self, size: int = -1, /) -> bytes:
        return super().read1(min(size, 3) if size > 0 else 3)


def produce(data: bytes, *, key_sep: bytes | None = None, chunked: bool = False) -> FakeProducer:
    producer = FakeProducer()
    stream = Trickle(data) if chunked else io.BytesIO(data)
    progress = Progress("p", total=None, unit="bytes", stream=io.StringIO())
    count = asyncio.run(
        producing.produce_lines(
            producer,  # type: ignore[arg-type]
            "t",
            stream,
            key_sep=key_sep,
            partition=None,
            progress=progress,
        )
    )
    assert count == len(producer.sent)
    return producer


@pytest.mark.parametrize("chunked", [False, True])
def test_lines_split_across_reads_are_whole_records(chunked: bool) -> None:
    data = b"first\nsecond line\r\n\nlast without newline"
    sent = produce(data, chunked=chunked).sent
    assert [v for _, v, _ in sent] == [b"first", b"second line", b"", b"last without newline"]


@pytest.mark.parametrize("chunked", [False, True])
def test_key_separator_splits_at_the_first_occurrence(chunked: bool) -> None:
    sent = produce(b"a=1\nno separator\nb=2=3\n", key_sep=b"=", chunked=chunked).sent
    assert [(k, v) for k, v, _ in sent] == [(b"a", b"1"), (None, b"no separator"), (b"b", b"2=3")]


def test_empty_input_sends_nothing() -> None:
    assert produce(b"").sent == []


def test_remaining_bytes_of_a_file_and_of_a_pipe(tmp_path: Path) -> None:
    path = tmp_path / "in"
    path.write_bytes(b"x" * 100)
    with path.open("rb") as file:
        file.seek(30)
        assert producing.remaining_bytes(file) == 70
    read_end, write_end = os.pipe()
    with os.fdopen(read_end, "rb") as pipe:
        assert producing.remaining_bytes(pipe) is None
    os.close(write_end)
    assert producing.remaining_bytes(io.BytesIO(b"abc")) is None
