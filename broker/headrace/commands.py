"""Command-line helpers shared by the broker's entry point and the ``headrace`` CLI."""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable
from functools import wraps
from typing import Any, TypeVar

import click

from headrace.errors import HeadraceError

F = TypeVar("F", bound=Callable[..., Any])


def one_line_errors(fn: F) -> F:
    """Print a failure as one line on stderr and exit non-zero, instead of a traceback."""

    @wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except BrokenPipeError:
            # The reader went away (`... | head`): stop quietly, as Unix tools do. Point
            # stdout at /dev/null so the interpreter's final flush cannot complain.
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
            sys.exit(128 + signal.SIGPIPE)
        except HeadraceError as exc:
            click.echo(f"error: {type(exc).__name__}: {exc.message}", err=True)
            sys.exit(1)
        except (OSError, ValueError) as exc:
            click.echo(f"error: {exc}", err=True)
            sys.exit(1)
        except KeyboardInterrupt:
            sys.exit(130)

    return wrapper  # type: ignore[return-value]
