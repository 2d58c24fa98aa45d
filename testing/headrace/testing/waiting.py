"""Wait for a condition with a deadline: how the tests and the bench synchronise with a
process or a cluster (never with a fixed sleep).

``until`` polls from a plain function; ``until_async`` from a coroutine, without
blocking its event loop. Both return the condition's first truthy value, count the
``retry_on`` errors as "not yet" (a server still starting), and at the deadline raise
``NotReached`` naming what was awaited and the last value or error seen.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, TypeVar, cast

T = TypeVar("T")


class NotReached(AssertionError, TimeoutError):
    """The condition did not hold by the deadline.

    A failed check to a test (``AssertionError``) and a timeout to the bench's
    campaigns, which catch ``TimeoutError``.
    """


def until(
    condition: Callable[[], T | None],
    timeout: float,
    what: str,
    *,
    retry_on: tuple[type[Exception], ...] = (),
    poll_s: float = 0.05,
) -> T:
    """Call ``condition`` every ``poll_s`` seconds until it returns something truthy, and
    return that; after ``timeout`` seconds ``NotReached``."""
    deadline = time.monotonic() + timeout
    last: object = None
    while True:
        try:
            found = condition()
        except retry_on as exc:
            last = exc
        else:
            if found:
                return found
            last = found
        if time.monotonic() >= deadline:
            raise NotReached(_message(what, timeout, last))
        time.sleep(poll_s)


async def until_async(
    condition: Callable[[], Awaitable[T | None]] | Callable[[], T | None],
    timeout: float,
    what: str,
    *,
    retry_on: tuple[type[Exception], ...] = (),
    poll_s: float = 0.1,
    in_thread: bool = False,
    watching: Iterable[asyncio.Future[Any] | None] = (),
) -> T:
    """``until`` on an event loop. ``condition`` may be a coroutine function; with
    ``in_thread`` a blocking one (HTTP to a controller, kubectl) runs in a worker thread.
    ``watching``: tasks that run beside the wait (a load, a cohort); one that failed ends
    the wait at once with its own error rather than at the deadline."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    last: object = None
    while True:
        for task in watching:
            if task is not None and task.done() and not task.cancelled():
                task.result()
        try:
            found: Any = await asyncio.to_thread(condition) if in_thread else condition()
            if inspect.isawaitable(found):
                found = await found
        except retry_on as exc:
            last = exc
        else:
            if found:
                return cast(T, found)
            last = found
        if loop.time() >= deadline:
            raise NotReached(_message(what, timeout, last))
        await asyncio.sleep(poll_s)


def _message(what: str, timeout: float, last: object) -> str:
    if isinstance(last, Exception):
        return f"{what}: not reached within {timeout:g}s (last error: {last!r})"
    if last is None or last is False:
        return f"{what}: not reached within {timeout:g}s"
    return f"{what}: not reached within {timeout:g}s (last: {last!r})"
