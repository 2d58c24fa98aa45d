"""The fuzzer process: sends inputs to a running broker, one fresh connection each.

    python -m bench.fuzz.sender --bootstrap HOST:PORT --seconds 30 --stats stats.json
        [--protocol native|kafka] [--count N] [--engine auto|atheris|random] [--seed N]
        [--corpus DIR]

``atheris`` (when importable, the default): libFuzzer mutates a corpus seeded
with the protocol's seeds (``inputs.seeds()``, ``kafka_inputs.seeds()``),
steered by coverage of the broker's own decoders run on each input in this
process (``shadow_decode``); for Kafka, half the mutations are
``kafka_inputs.mutate``'s protocol-aware edits. ``random``: a seeded mutator
over the same seeds.

Native inputs are written after a handshake (unless their first byte is odd),
and whatever the broker answers is read until it is quiet for 20 ms or hangs
up. Kafka inputs are written as they are, followed by an ApiVersions request
(the fence) whose answer, the last in Kafka's in-order answers, ends the read
(else 20 ms of quiet or a hang-up does); the answers' error codes are counted.

The statistics file is rewritten every second and at the end: inputs, complete
frames among them, bytes, how often the broker hung up on us (and, for Kafka,
its answers, their error codes by name, and the records of well-formed Produce
requests sent). The process ends itself at the deadline or after ``--count``
inputs (``os._exit``: libFuzzer would otherwise keep going).
"""

from __future__ import annotations

import abc
import argparse
import contextlib
import importlib
import json
import os
import random
import socket
import struct
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

_HANDSHAKE_OP = 2
_HEADER = struct.Struct("<IHHI")


class Sender(abc.ABC):
    """Delivers inputs, one fresh connection each, keeps the statistics, and ends the
    process at the deadline or after ``count`` inputs."""

    def __init__(
        self,
        bootstrap: str,
        deadline: float,
        stats_path: Path,
        engine: str,
        count: int | None = None,
    ) -> None:
        host, _, port = bootstrap.rpartition(":")
        self.address = (host, int(port))
        self.deadline = deadline
        self.count = count
        self.stats_path = stats_path
        self.stats: dict[str, Any] = {
            "engine": engine,
            "inputs": 0,
            "frames": 0,
            "bytes": 0,
            "closed_by_broker": 0,
            "connect_errors": 0,
        }
        self._written = time.monotonic()

    def deliver(self, data: bytes, frames: int) -> None:
        if not data:
            return
        self.stats["inputs"] += 1
        self.stats["frames"] += frames
        self.stats["bytes"] += len(data)
        try:
            with socket.create_connection(self.address, timeout=5) as sock:
                self.exchange(sock, data)
        except (ConnectionError, BrokenPipeError):
            self.stats["closed_by_broker"] += 1
        except OSError:
            self.stats["connect_errors"] += 1
        now = time.monotonic()
        if now - self._written >= 1.0:
            self.write_stats()
        if now >= self.deadline or (self.count is not None and self.stats["inputs"] >= self.count):
            self.write_stats()
            os._exit(0)

    @abc.abstractmethod
    def exchange(self, sock: socket.socket, data: bytes) -> None:
        """Write ``data`` and read what the broker answers."""

    def drain(self, sock: socket.socket, done: Callable[[bytes], bool] | None = None) -> bytes:
        """What the broker sends until it is quiet for 20 ms, hangs up, or ``done`` says
        enough has come."""
        sock.settimeout(0.02)
        received = bytearray()
        try:
            while len(received) < (4 << 20):
                chunk = sock.recv(65536)
                if not chunk:
                    self.stats["closed_by_broker"] += 1
                    break
                received += chunk
                if done is not None and done(bytes(received)):
                    break
        except TimeoutError:
            pass
        return bytes(received)

    def write_stats(self) -> None:
        self._written = time.monotonic()
        tmp = self.stats_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.stats))
        tmp.replace(self.stats_path)


class NativeSender(Sender):
    """Our protocol: a handshake first unless the input's first byte is odd."""

    def __init__(self, *args: Any, hello: bytes, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.stats["slow_handshakes"] = 0
        self._hello = hello

    def exchange(self, sock: socket.socket, data: bytes) -> None:
        if data[0] % 2 == 0 and not self._handshake(sock):
            return
        sock.sendall(data[1:])
        self.drain(sock)

    def _handshake(self, sock: socket.socket) -> bool:
        sock.sendall(self._hello)
        sock.settimeout(5)
        got = b""
        try:
            while len(got) < _HEADER.size or len(got) < _HEADER.unpack_from(got)[0] + 4:
                chunk = sock.recv(65536)
                if not chunk:
                    self.stats["closed_by_broker"] += 1
                    return False
                got += chunk
        except TimeoutError:
            self.stats["slow_handshakes"] += 1
            return False
        return True


class KafkaSender(Sender):
    """Kafka: the input as is, then an ApiVersions request (the fence) whose answer says
    every answer before it has come; the answers' error codes are counted by name."""

    def __init__(self, *args: Any, kafka_inputs: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._inputs = kafka_inputs
        self._fence = kafka_inputs.fence()
        self._fence_id = kafka_inputs.FENCE_CORRELATION_ID.to_bytes(4, "big")
        self._codes: Counter[str] = Counter()
        self.stats.update(
            answers=0, fenced=0, well_formed_produce_records=0, error_codes=self._codes
        )
        self._shadow: Any = None

    def deliver_input(self, data: bytes) -> None:
        self._shadow = self._inputs.shadow_decode(data, self._fence)
        self.stats["well_formed_produce_records"] += self._shadow.well_formed_records
        self.deliver(data, self._shadow.frames)

    def exchange(self, sock: socket.socket, data: bytes) -> None:
        sock.sendall(data + self._fence)
        received = self.drain(sock, self._fenced)
        self.stats["fenced"] += self._fenced(received)
        self.stats["answers"] += self._inputs.tally_answers(received, self._shadow, self._codes)

    def _fenced(self, received: bytes) -> bool:
        """The fence's answer came (it is the last: Kafka answers in order)."""
        frames, rest = self._inputs.split_frames(received)
        return not rest and bool(frames) and frames[-1][4:8] == self._fence_id


def _load_atheris(engine: str) -> Any:
    """atheris, or None when the engine is ``random`` (or ``auto`` without it)."""
    if engine not in ("auto", "atheris"):
        return None
    try:
        return importlib.import_module("atheris")
    except ImportError:
        if engine == "atheris":
            raise
        return None


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.fuzz.sender")
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--protocol", choices=("native", "kafka"), default="native")
    parser.add_argument("--seconds", type=float, required=True)
    parser.add_argument("--count", type=int, default=None, help="stop after this many inputs")
    parser.add_argument("--stats", type=Path, required=True)
    parser.add_argument("--engine", choices=("auto", "atheris", "random"), default="auto")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--corpus", type=Path, default=None)
    args = parser.parse_args()
    # optional, and imported before headrace so that it can instrument headrace's decoders
    atheris = _load_atheris(args.engine)
    engine = "random" if atheris is None else "atheris"
    with atheris.instrument_imports(include=["headrace"]) if atheris else contextlib.nullcontext():
        from bench.fuzz import inputs, kafka_inputs
    from headrace.protocol import messages as msg
    from headrace.protocol.frames import encode_frame

    deadline = time.monotonic() + args.seconds
    sender: Sender
    if args.protocol == "kafka":
        kafka = KafkaSender(
            args.bootstrap, deadline, args.stats, engine, args.count, kafka_inputs=kafka_inputs
        )
        seeds = kafka_inputs.seeds()
        mutate: Callable[[bytes, random.Random, list[bytes]], bytes] = kafka_inputs.mutate
        random_input = kafka_inputs.random_input
        one_input: Callable[[bytes], None] = kafka.deliver_input
        sender = kafka
    else:
        hello = msg.Handshake(msg.PROTOCOL_VERSION, "fuzzer", None).encode()
        native = NativeSender(
            args.bootstrap,
            deadline,
            args.stats,
            engine,
            args.count,
            hello=encode_frame(_HANDSHAKE_OP, 0xFFFFFFFF, hello),
        )
        seeds = inputs.seeds()
        mutate = inputs.mutate
        random_input = inputs.random_input

        def one_input(data: bytes) -> None:
            native.deliver(data, inputs.shadow_decode(data))

        sender = native
    sender.write_stats()
    if atheris is None:
        rng = random.Random(args.seed)
        while True:
            one_input(random_input(rng, seeds))
    corpus = args.corpus or args.stats.parent / "corpus"
    corpus.mkdir(parents=True, exist_ok=True)
    for i, seed in enumerate(seeds):
        (corpus / f"seed-{i:02d}").write_bytes(seed)

    def custom_mutator(data: bytes, max_size: int, seed: int) -> bytes:
        # libFuzzer's byte mutations half the time, the protocol's own edits the other half
        rng = random.Random(seed)
        if rng.random() < 0.5:
            return bytes(atheris.Mutate(data, max_size))
        return mutate(data, rng, seeds)[:max_size]

    argv = [sys.argv[0], "-max_len=4096", f"-seed={args.seed or 1}", str(corpus)]
    if args.protocol == "kafka":
        atheris.Setup(argv, one_input, custom_mutator=custom_mutator)
    else:
        atheris.Setup(argv, one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
