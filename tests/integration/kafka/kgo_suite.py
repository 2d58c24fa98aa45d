"""franz-go's own integration suite, its ``pkg/kgo`` tests, against a headrace broker's
Kafka listener, or against Kafka itself to tell apart the tests that fail there too
(docs/kafka.md §6). Minutes long, so not in ``make test``: ``make kafka-kgo-suite``.

    python -m tests.integration.kafka.kgo_suite [--server headrace|kafka] [--run REGEX]
        [--timeout 40m] [--records N] [--out var/kgo-suite]

The suite names its broker in its environment (``pkg/kgo/helpers_test.go``):
``KGO_SEEDS`` the seed brokers; ``KGO_TEST_RF=1``, the replication factor of the topics it
creates (a standalone headrace broker keeps one replica, and the Kafka here is one node);
``KGO_TEST_RECORDS``, the records of its ETL tests (500,000 by default: far more than a
shared two-core machine gets through in the suite's time). It has no switch for
transactions, so ``TestTxnEtl`` is left out with ``-skip`` (``--skip``): transactions are
not served, so its producer fails at once (``TRANSACTIONAL_ID_AUTHORIZATION_FAILED``), but
its consumers wait for records until the suite's timeout, holding the ETL slots that
``TestGroupETL`` waits for, so every test after it would time out with it. Run it alone
to see it fail: ``--run TestTxnEtl --skip '' --timeout 3m``. TLS, SCRAM
and OAUTHBEARER are left unset: those tests skip. Share groups and static membership are
turned on only when ApiVersions offers them; headrace does not, so those tests skip.

The broker is a standalone one (``headrace broker --standalone --kafka-port``), not
``headrace local up``: the suite makes its topics with ``CreateTopics``, which in a cluster
is refused (topics are the controller's, docs/kafka.md §5).

One change to the suite (``peers/build.sh kgo-src``): ``randsha``, which names its topics,
gives 63 hex digits instead of 64, because a headrace topic name is at most 63 characters
(docs/kafka.md §4). Nothing else is touched.

Writes OUT/<server>.jsonl (``go test -json``) and OUT/<server>-summary.json, and prints
the counts and each failed test with the lines it logged about the failure.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from headrace.testing.procs import REPO, BrokerProcess, free_port

BUILD = Path(__file__).resolve().parent / "peers" / "build.sh"
#: a test's own t.Errorf/t.Logf line (``    file_test.go:12: ...``), or the package's panic
TEST_LOG = re.compile(r"^(\s+\w+_test\.go:\d+: |panic: )")


@dataclass
class TestResult:
    name: str
    action: str = "run"
    elapsed_s: float = 0.0
    output: list[str] = field(default_factory=list)

    @property
    def failure_lines(self) -> list[str]:
        """What the test logged about its failure: its ``file_test.go:N:`` lines and the
        package's panic or timeout, without the client's own log."""
        keep = list(dict.fromkeys(line.rstrip() for line in self.output if TEST_LOG.match(line)))
        # the first lines say what went wrong, the last how the test ended
        return keep if len(keep) <= 12 else keep[:6] + keep[-6:]


@dataclass
class Summary:
    server: str
    passed: list[str]
    failed: list[str]
    skipped: list[str]
    subtests: dict[str, int]
    package: str
    failures: dict[str, list[str]]


def summarize(server: str, events: Iterable[dict[str, object]]) -> Summary:
    """Counts of ``go test -json`` events: top-level tests by outcome, subtests apart."""
    tests: dict[str, TestResult] = {}
    package = "unknown"
    package_output: list[str] = []
    for event in events:
        name = event.get("Test")
        action = str(event.get("Action"))
        if not isinstance(name, str):
            if action in ("pass", "fail", "skip"):
                package = action
            elif action == "output":
                package_output.append(str(event.get("Output", "")))
            continue
        result = tests.setdefault(name, TestResult(name))
        if action == "output":
            result.output.append(str(event.get("Output", "")))
        elif action in ("pass", "fail", "skip"):
            result.action = action
            result.elapsed_s = float(str(event.get("Elapsed", 0.0)))
    top = [t for t in tests.values() if "/" not in t.name]
    # a test still running when the package panicked or timed out counts as failed
    failed = sorted(t.name for t in top if t.action in ("fail", "run"))
    # a subtest's lines (the timeout's panic among them) belong to its test
    failures = {
        n: [line for t in tests.values() if t.name.split("/")[0] == n for line in t.failure_lines]
        for n in failed
    }
    if package == "fail" and not failed:
        failures["(package)"] = [line.rstrip() for line in package_output[-12:]]
    subtests = {"pass": 0, "fail": 0, "skip": 0}
    for t in tests.values():
        if "/" in t.name:
            subtests["fail" if t.action == "run" else t.action] += 1
    return Summary(
        server=server,
        passed=sorted(t.name for t in top if t.action == "pass"),
        failed=failed,
        skipped=sorted(t.name for t in top if t.action == "skip"),
        subtests=subtests,
        package=package,
        failures=failures,
    )


def suite_source() -> Path:
    out = subprocess.run(
        ["bash", str(BUILD), "kgo-src"], check=True, capture_output=True, text=True
    ).stdout
    return Path(out.strip().rpartition("kgosrc=")[2])


def run_suite(src: Path, seeds: str, args: argparse.Namespace, jsonl: Path) -> None:
    env = {
        **os.environ,
        "GOTOOLCHAIN": "local",
        "KGO_SEEDS": seeds,
        "KGO_TEST_RF": "1",
        "KGO_TEST_RECORDS": str(args.records),
    }
    argv = ["nice", "-n", "10", "go", "test", "-json", "-count=1", "-timeout", args.timeout]
    if args.run:
        argv += ["-run", args.run]
    if args.skip:
        argv += ["-skip", args.skip]
    argv.append("./pkg/kgo")
    print(f"kgo suite: {' '.join(argv)} against {args.server} at {seeds}", file=sys.stderr)
    with jsonl.open("w") as out:
        subprocess.run(argv, cwd=src, env=env, stdout=out, check=False)


def read_events(jsonl: Path) -> list[dict[str, object]]:
    events = []
    for line in jsonl.read_text().splitlines():
        if line.startswith("{"):
            events.append(json.loads(line))
    return events


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--server", choices=("headrace", "kafka"), default="headrace")
    parser.add_argument("--run", default="", help="go test -run: a regex of test names")
    parser.add_argument("--skip", default="^TestTxnEtl$", help="go test -skip: a regex")
    parser.add_argument("--timeout", default="40m", help="go test -timeout")
    parser.add_argument("--records", type=int, default=20000, help="KGO_TEST_RECORDS")
    parser.add_argument("--out", type=Path, default=REPO / "var" / "kgo-suite")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    src = suite_source()
    home = args.out / f"{args.server}-data"
    shutil.rmtree(home, ignore_errors=True)
    home.mkdir()
    jsonl = args.out / f"{args.server}.jsonl"
    if args.server == "headrace":
        kafka_port = free_port()
        broker = BrokerProcess(
            data_dir=home / "broker", extra_args=["--kafka-port", str(kafka_port)]
        )
        broker.spawn()
        try:
            broker.wait_ready()
            run_suite(src, f"127.0.0.1:{kafka_port}", args, jsonl)
        finally:
            broker.stop()
    else:
        from bench.peerservers import KafkaCluster

        cluster = KafkaCluster(home, nodes=1)
        cluster.start()
        try:
            run_suite(src, cluster.bootstrap, args, jsonl)
        finally:
            cluster.stop()
    summary = summarize(args.server, read_events(jsonl))
    (args.out / f"{args.server}-summary.json").write_text(json.dumps(asdict(summary), indent=1))
    print(
        f"kgo suite against {args.server}: {len(summary.passed)} passed,"
        f" {len(summary.failed)} failed, {len(summary.skipped)} skipped"
        f" (subtests: {summary.subtests}); package {summary.package}"
    )
    for name, lines in summary.failures.items():
        print(f"FAIL {name}")
        for line in lines:
            print(f"    {line.strip()}")
    shutil.rmtree(home, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
