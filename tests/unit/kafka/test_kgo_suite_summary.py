"""The franz-go suite's summary: counts read from ``go test -json`` events."""

from __future__ import annotations

from tests.integration.kafka.kgo_suite import summarize


def event(action: str, test: str | None = None, output: str = "") -> dict[str, object]:
    e: dict[str, object] = {"Action": action, "Package": "github.com/twmb/franz-go/pkg/kgo"}
    if test is not None:
        e["Test"] = test
    if output:
        e["Output"] = output
    return e


def test_top_level_tests_are_counted_apart_from_subtests() -> None:
    summary = summarize(
        "headrace",
        [
            event("run", "TestA"),
            event("run", "TestA/one"),
            event("pass", "TestA/one"),
            event("pass", "TestA"),
            event("run", "TestB"),
            event("output", "TestB", "    consumer_test.go:12: got 3 != exp 4\n"),
            event("output", "TestB", "[INFO] the client's own log\n"),
            event("fail", "TestB"),
            event("run", "TestC"),
            event("skip", "TestC"),
            event("fail"),
        ],
    )
    assert (summary.passed, summary.failed, summary.skipped) == (["TestA"], ["TestB"], ["TestC"])
    assert summary.subtests == {"pass": 1, "fail": 0, "skip": 0}
    assert summary.failures == {"TestB": ["    consumer_test.go:12: got 3 != exp 4"]}
    assert summary.package == "fail"


def test_a_test_cut_off_by_the_timeout_counts_as_failed() -> None:
    summary = summarize(
        "headrace",
        [
            event("run", "TestLong"),
            event("run", "TestLong/sub"),
            event("output", "TestLong/sub", "panic: test timed out after 4m0s\n"),
            event("fail"),
        ],
    )
    assert summary.failed == ["TestLong"]
    assert summary.subtests == {"pass": 0, "fail": 1, "skip": 0}
    assert summary.failures["TestLong"] == ["panic: test timed out after 4m0s"]
