"""The fuzzer process: sends inputs to a running broker, one fresh connection each.

    python -m bench.fuzz.sender --bootstrap HOST:PORT --seconds 30 --stats stats.json
        [--engine auto|atheris|random] [--seed N] [--corpus DIR]

``atheris`` (when importable, the default): libFuzzer mutates a corpus seeded
with ``inputs.seeds()``, steered by coverage of the broker's own decoders run
on each input in this process (``inputs.shadow_decode``). ``random``: a seeded
mutator over the same seeds. Either way each input is written to the broker
after a handshake (unless its first byte is odd), whatever the broker answers
is read until it is quiet for 20 ms or hangs up, and the connection is closed.

The statistics file is rewritten every second and at the end: inputs, complete
frames among them, bytes, how often the broker hung up on us. The process
ends itself at the deadline (``os._exit``: libFuzzer would otherwise keep going).
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import random
import socket
import struct
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

_HANDSHAKE_OP = 2
_HEADER = struct.Struct("<IHHI")


class Sender:
    def __init__(self, bootstrap: str, deadline: float, stats_path: Path, engine: str) -> None:
        host, _, port = bootstrap.rpartition(":")
        self.address = (host, int(port))
        self.deadline = deadline
        self.stats_path = stats_path
        self.stats: dict[str, Any] = {
            "engine": engine,
            "inputs": 0,
            "frames": 0,
            "bytes": 0,
            "closed_by_broker": 0,
            "connect_errors": 0,
            "slow_handshakes": 0,
        }
        self._written = time.monotonic()
        self._hello = b""

    def set_hello(self, frame: bytes) -> None:
        self._hello = frame

    def deliver(self, data: bytes, frames: int) -> None:
        if not data:
            return
        self.stats["inputs"] += 1
        self.stats["frames"] += frames
        self.stats["bytes"] += len(data)
        try:
            with socket.create_connection(self.address, timeout=5) as sock:
                if data[0] % 2 == 0 and not self._handshake(sock):
                    return
                sock.sendall(data[1:])
                self._drain(sock)
        except (ConnectionError, BrokenPipeError):
            self.stats["closed_by_broker"] += 1
        except OSError:
            self.stats["connect_errors"] += 1
        now = time.monotonic()
        if now - self._written >= 1.0:
            self.write_stats()
        if now >= self.deadline:
            self.write_stats()
            os._exit(0)

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

    def _drain(self, sock: socket.socket) -> None:
        sock.settimeout(0.02)
        received = 0
        try:
            while received < (4 << 20):
                chunk = sock.recv(65536)
                if not chunk:
                    self.stats["closed_by_broker"] += 1
                    return
                received += len(chunk)
        except TimeoutError:
            return

    def write_stats(self) -> None:
        self._written = time.monotonic()
        tmp = self.stats_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.stats))
        tmp.replace(self.stats_path)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.fuzz.sender")
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--seconds", type=float, required=True)
    parser.add_argument("--stats", type=Path, required=True)
    parser.add_argument("--engine", choices=("auto", "atheris", "random"), default="auto")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--corpus", type=Path, default=None)
    args = parser.parse_args()
    engine = args.engine
    atheris: Any = None
    if engine in ("auto", "atheris"):
        # optional, and imported before headrace so that it can instrument headrace's decoders
        try:
            atheris = importlib.import_module("atheris")
        except ImportError:
            if engine == "atheris":
                raise
            engine = "random"
        else:
            engine = "atheris"
    if atheris is not None:
        with atheris.instrument_imports(include=["headrace"]):
            from bench.fuzz import inputs
    else:
        from bench.fuzz import inputs
    from headrace.protocol import messages as msg
    from headrace.protocol.frames import encode_frame

    sender = Sender(args.bootstrap, time.monotonic() + args.seconds, args.stats, engine)
    hello = msg.Handshake(msg.PROTOCOL_VERSION, "fuzzer", None).encode()
    sender.set_hello(encode_frame(_HANDSHAKE_OP, 0xFFFFFFFF, hello))
    seeds = inputs.seeds()
    sender.write_stats()
    if atheris is None:
        rng = random.Random(args.seed)
        while True:
            data = inputs.random_input(rng, seeds)
            sender.deliver(data, inputs.shadow_decode(data))
    corpus = args.corpus or args.stats.parent / "corpus"
    corpus.mkdir(parents=True, exist_ok=True)
    for i, seed in enumerate(seeds):
        (corpus / f"seed-{i:02d}").write_bytes(seed)

    def one_input(data: bytes) -> None:
        sender.deliver(data, inputs.shadow_decode(data))

    run: Callable[[bytes], None] = one_input
    atheris.Setup([sys.argv[0], "-max_len=4096", f"-seed={args.seed or 1}", str(corpus)], run)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
