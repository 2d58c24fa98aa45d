"""The blocking client and the CLI kept open across what a cluster goes through
(``reliability.md`` §8, their tables).

``KeptOpenClients`` opens four clients on one topic and keeps them open until
``finish``: a ``BlockingProducer`` sending keyed records one ``send`` at a time on a
thread of its own (acks=all), a ``BlockingConsumer`` polling and acking on another, a
``headrace produce --acks all`` reading lines from a pipe the harness keeps feeding, and
a ``headrace consume`` printing what it gets. The tables say both clients see what the
async clients do and that the application does nothing, so ``finish`` asserts that no
``send`` or ``poll`` raised, that ``produce`` exits 0 once its input ends (every line
acknowledged), and that every acknowledged record reached both consumers.
``KeptOpenCli`` is the two commands alone, of this release or of another (an exported
release, to keep the previous release's client open across an upgrade).
"""

from __future__ import annotations

import abc
import subprocess
import threading
from collections.abc import Callable
from pathlib import Path
from typing import IO

from headrace.client.blocking import BlockingConsumer, BlockingProducer
from headrace.testing import procs, waiting

#: acknowledged sends to wait for after each event: the load is flowing again
MORE = 50


class ClientThread(abc.ABC):
    """A client's loop (``_run``) on a daemon thread of its own until ``stop``, which
    waits up to ``join_timeout_s`` for it, then closes the client once (``_close``)."""

    join_timeout_s = 60.0

    def __init__(self, name: str) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._closed = False

    @abc.abstractmethod
    def _run(self) -> None: ...

    @abc.abstractmethod
    def _close(self) -> None: ...

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=self.join_timeout_s)
        if not self._closed:
            self._closed = True
            self._close()


class SendingThread(ClientThread):
    """One ``send`` after another until stopped; what was acknowledged, what raised."""

    join_timeout_s = 180.0

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.producer = BlockingProducer(bootstrap, acks="all")
        self.topic = topic
        self.acked: list[bytes] = []
        self.failed: list[BaseException] = []
        super().__init__("blocking-sends")

    def _run(self) -> None:
        i = 0
        while not self._stop.is_set():
            value = b"v%d" % i
            try:
                self.producer.send(self.topic, value, key=b"k%d" % (i % 12))
            except Exception as exc:  # the table says none: collected for the assertion
                self.failed.append(exc)
            else:
                self.acked.append(value)
            i += 1

    def _close(self) -> None:
        self.producer.close()


class PollingThread(ClientThread):
    """``poll`` and ``ack`` until stopped; the values received."""

    def __init__(self, bootstrap: str, topic: str, cohort: str = "blocking") -> None:
        self.consumer = BlockingConsumer(bootstrap, topic, cohort, start="earliest")
        self.received: set[bytes] = set()
        self.failed: list[BaseException] = []
        super().__init__("blocking-polls")

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                for batch in self.consumer.poll(timeout_s=0.2):
                    self.received.update(batch.values())
                    self.consumer.ack_batch(batch)
            except Exception as exc:  # the table says none: collected for the assertion
                self.failed.append(exc)

    def _close(self) -> None:
        self.consumer.close()


class FeedingThread(ClientThread):
    """Lines written to a running ``headrace produce`` until stopped; then its input ends."""

    join_timeout_s = 30.0

    def __init__(self, stdin: IO[bytes]) -> None:
        self.stdin = stdin
        self.written: list[bytes] = []
        super().__init__("cli-feed")

    def _run(self) -> None:
        i = 0
        # paced, as a script would write: the pipe must not fill up and hold the last
        # lines back until after the checks
        while not self._stop.wait(0.005):
            line = b"c%d" % i
            try:
                self.stdin.write(line + b"\n")
                self.stdin.flush()
            except (BrokenPipeError, ValueError):  # produce died: finish says how
                return
            self.written.append(line)
            i += 1

    def _close(self) -> None:
        try:
            self.stdin.close()
        except BrokenPipeError:  # produce died: finish says how
            pass


def cli(
    argv: list[str], out: Path, stdin: int = subprocess.DEVNULL, src: Path | None = None
) -> subprocess.Popen[bytes]:
    """The ``headrace`` command, its output in ``out`` and its errors beside it (``.err``);
    ``src``: the headrace exported there (``procs.export_ref``), else this checkout's."""
    with out.open("wb") as stdout, out.with_suffix(".err").open("wb") as stderr:
        return procs.spawn(
            [*procs.HEADRACE_CLI, *argv],
            stdout=stdout,
            stderr=stderr,
            stdin=stdin,
            env=procs.child_env(src),
        )


class KeptOpenCli:
    """A ``headrace produce --acks all`` fed through a pipe and a ``headrace consume`` on
    ``topic``, opened by ``start`` and kept open until ``finish``; ``close`` stops them.
    ``workdir`` holds their output; ``src``: the headrace exported there (the previous
    release, say), else this checkout's."""

    def __init__(self, bootstrap: str, topic: str, workdir: Path, src: Path | None = None) -> None:
        self.bootstrap = bootstrap
        self.topic = topic
        self.src = src
        self.printed = workdir / "consume.out"
        self.produce_out = workdir / "produce.out"
        self.consume: subprocess.Popen[bytes] | None = None
        self.produce: subprocess.Popen[bytes] | None = None
        self.feeds: FeedingThread | None = None

    def start(self, *, consume: bool = True) -> None:
        """Start ``produce`` (fed from now on) and, unless told, ``consume``."""
        if consume:
            self.start_consume()
        self.produce = cli(
            ["produce", self.topic, "--acks", "all", "--bootstrap", self.bootstrap],
            self.produce_out,
            stdin=subprocess.PIPE,
            src=self.src,
        )
        assert self.produce.stdin is not None
        self.feeds = FeedingThread(self.produce.stdin)
        self.feeds.start()

    def start_consume(self) -> None:
        """Start ``consume`` (a cohort of its own, from the topic's start)."""
        self.consume = cli(
            ["consume", self.topic, "--cohort", "cli", "--from-beginning",
             "--idle-timeout", "600", "--bootstrap", self.bootstrap],
            self.printed,
            src=self.src,
        )  # fmt: skip

    def received(self) -> set[bytes]:
        return set(self.printed.read_bytes().split())

    def stop_feeding(self) -> list[bytes]:
        """End ``produce``'s input and assert it exits 0 (every line acknowledged); the
        lines written."""
        assert self.produce is not None, "not started"
        assert self.feeds is not None
        self.feeds.stop()
        returncode = self.produce.wait(timeout=180)
        procs.forget(self.produce)
        produce_err = self.produce_out.with_suffix(".err").read_text(errors="replace")
        assert returncode == 0, f"produce exited {returncode}: {produce_err[-2000:]}"
        return self.feeds.written

    def check_still_consuming(self) -> None:
        assert self.consume is not None, "not started"
        assert self.consume.poll() is None, f"consume exited {self.consume.returncode}"

    def finish(self, timeout: float = 60.0) -> str:
        """``stop_feeding``, then assert every line reached ``consume`` within ``timeout``
        and it still runs. What ran, as a line for the test's output."""
        try:
            wanted = set(self.stop_feeding())
            try:
                waiting.until(
                    lambda: wanted <= self.received(), timeout, "every line received by consume"
                )
            except waiting.NotReached:
                gap = sorted(wanted - self.received())
                raise AssertionError(
                    f"{len(gap)} acknowledged lines not consumed: {gap[:5]}"
                ) from None
            self.check_still_consuming()
        finally:
            self.close()
        return f"{len(wanted)} produce lines acknowledged, all received by consume"

    def close(self) -> None:
        """Stop both commands (idempotent)."""
        try:
            if self.feeds is not None:
                self.feeds.stop()
        finally:
            for proc in (self.produce, self.consume):
                if proc is not None:
                    procs.reap(proc)


class KeptOpenClients:
    """A ``BlockingProducer``, a ``BlockingConsumer``, a ``headrace produce`` fed through a
    pipe and a ``headrace consume`` on ``topic`` (``namespace/name``), opened by ``start``
    and kept open until ``finish``; ``close`` (or leaving the ``with``) stops whatever still
    runs. ``workdir`` holds the commands' output."""

    def __init__(self, bootstrap: str, topic: str, workdir: Path) -> None:
        self.topic = topic
        self.sends = SendingThread(bootstrap, topic)
        self.polls = PollingThread(bootstrap, topic)
        self.commands = KeptOpenCli(bootstrap, topic, workdir)

    def __enter__(self) -> KeptOpenClients:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def start(self) -> None:
        self.commands.start()
        self.polls.start()
        self.sends.start()

    def more_acked(self, count: int = MORE) -> Callable[[], bool]:
        """A condition: ``count`` more blocking sends acknowledged than now."""
        target = len(self.sends.acked) + count
        return lambda: len(self.sends.acked) >= target

    def missing(self, wanted: set[bytes]) -> dict[str, list[bytes]]:
        """What each consumer has not received of ``wanted`` yet (a few of each, sorted,
        and how many)."""
        gaps = {
            "BlockingConsumer": wanted - self.polls.received,
            "consume": wanted - self.commands.received(),
        }
        return {who: [*sorted(gap)[:5], b"(%d)" % len(gap)] for who, gap in gaps.items() if gap}

    def finish(self, timeout: float = 60.0) -> str:
        """Stop writing, then assert: ``produce`` exited 0 (every line acknowledged),
        every acknowledged record reached both consumers within ``timeout``, no ``send``
        or ``poll`` raised. What ran, as a line for the test's output."""
        try:
            self.sends.stop()
            written = self.commands.stop_feeding()
            wanted = set(self.sends.acked) | set(written)
            try:
                waiting.until(
                    lambda: not self.missing(wanted),
                    timeout,
                    "every acknowledged record received by both consumers",
                )
            except waiting.NotReached:
                raise AssertionError(
                    f"acknowledged records not received: {self.missing(wanted)}"
                ) from None
            self.commands.check_still_consuming()
        finally:
            self.close()
        assert not self.sends.failed, f"sends raised: {self.sends.failed[:3]}"
        assert not self.polls.failed, f"polls raised: {self.polls.failed[:3]}"
        return (
            f"{len(self.sends.acked)} blocking sends and {len(written)} produce"
            " lines acknowledged, all received by the blocking consumer and by consume"
        )

    def close(self) -> None:
        """Stop every client still open (idempotent)."""
        try:
            self.sends.stop()
            self.polls.stop()
        finally:
            self.commands.close()
