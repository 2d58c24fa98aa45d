"""The harness's one wait: the value it returns, what counts as "not yet", and what the
error says when the deadline passes."""

from __future__ import annotations

import asyncio
import itertools

import pytest

from headrace.testing.waiting import NotReached, until, until_async


def test_until_returns_the_first_truthy_value() -> None:
    answers = iter([None, 0, "found"])
    assert until(lambda: next(answers), 5, "an answer", poll_s=0) == "found"


def test_until_counts_the_listed_errors_as_not_yet() -> None:
    calls = itertools.count()

    def starting() -> bool:
        if next(calls) < 2:
            raise ConnectionRefusedError("still starting")
        return True

    assert until(starting, 5, "the server", retry_on=(OSError,), poll_s=0) is True


def test_until_lets_other_errors_through() -> None:
    def broken() -> bool:
        raise KeyError("no such partition")

    with pytest.raises(KeyError):
        until(broken, 5, "the partition", retry_on=(OSError,), poll_s=0)


def test_until_names_what_it_waited_for_and_the_last_error() -> None:
    def refused() -> bool:
        raise ConnectionRefusedError("refused")

    with pytest.raises(NotReached, match=r"the broker: not reached within 0\.05s") as caught:
        until(refused, 0.05, "the broker", retry_on=(OSError,), poll_s=0.01)
    assert "ConnectionRefusedError('refused')" in str(caught.value)
    # a failed check to a test, a timeout to the bench's campaigns
    assert isinstance(caught.value, AssertionError)
    assert isinstance(caught.value, TimeoutError)


def test_until_reports_the_last_value_seen() -> None:
    ready_brokers: list[int] = []
    with pytest.raises(NotReached, match=r"^a ready broker: not reached within 0s \(last: \[\]\)$"):
        until(lambda: ready_brokers, 0, "a ready broker", poll_s=0)


async def test_until_async_awaits_a_coroutine_condition() -> None:
    answers = iter([False, False, 7])

    async def poll() -> int | bool:
        await asyncio.sleep(0)
        return next(answers)

    assert await until_async(poll, 5, "seven", poll_s=0) == 7


async def test_until_async_runs_a_blocking_condition_in_a_thread() -> None:
    loop = asyncio.get_running_loop()
    threads: list[bool] = []

    def blocking() -> bool:
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            threads.append(True)  # no loop here: a worker thread
        return True

    assert await until_async(blocking, 5, "the thread", in_thread=True)
    assert threads == [True]
    assert asyncio.get_running_loop() is loop


async def test_until_async_ends_at_once_with_the_error_of_a_watched_task() -> None:
    async def load() -> None:
        raise RuntimeError("the load failed")

    task = asyncio.create_task(load())
    await asyncio.sleep(0)
    with pytest.raises(RuntimeError, match="the load failed"):
        await until_async(lambda: False, 60, "never", watching=[task, None])


async def test_until_async_ignores_a_cancelled_watched_task() -> None:
    task = asyncio.create_task(asyncio.sleep(60))
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    with pytest.raises(NotReached, match=r"^never: not reached within 0\.05s$"):
        await until_async(lambda: False, 0.05, "never", poll_s=0.01, watching=[task])
