"""Progress bars for the CLI's long commands: on a terminal, and nowhere else.

A progress bar is drawn on stderr, so it is shown when stderr is a terminal
and never when stderr is a pipe or a file: ``headrace produce t < big.jsonl``
in a shell shows it, the same command in a script, under ``2>log`` or in CI
prints nothing but its result line. stdout is never touched, so output piped
to another tool stays clean either way. Built on rich.
"""

from __future__ import annotations

import sys
from types import TracebackType
from typing import TYPE_CHECKING, Any, Literal, TextIO

if TYPE_CHECKING:
    from rich.progress import Progress as RichProgress
    from rich.progress import TaskID

Unit = Literal["bytes", "records"]


def wanted(stream: TextIO) -> bool:
    """True when ``stream`` is a terminal (a closed or odd stream counts as a pipe)."""
    try:
        return stream.isatty()
    except (ValueError, AttributeError):
        return False


class Progress:
    """One task's progress: ``advance(n)`` as work completes, in a ``with`` block.

    ``total`` is in ``unit`` (None when unknown: a count and a rate, no bar).
    ``records`` is a running record count shown beside a byte bar.
    """

    def __init__(
        self,
        description: str,
        *,
        total: float | None,
        unit: Unit,
        stream: TextIO | None = None,
        quiet: bool = False,
    ) -> None:
        self.stream = stream if stream is not None else sys.stderr
        #: ``quiet``: the caller knows better (say, a person is typing on the same terminal)
        self.enabled = not quiet and wanted(self.stream)
        self.description = description
        self.total = total
        self.unit: Unit = unit
        self._bar: RichProgress | None = None
        self._task: TaskID | None = None

    def __enter__(self) -> Progress:
        if not self.enabled:
            return self
        # imported here: commands that never draw a bar do not pay for rich's import
        from rich import progress as rp
        from rich.console import Console

        amount: list[rp.ProgressColumn] = (
            [rp.DownloadColumn(), rp.TransferSpeedColumn()]
            if self.unit == "bytes"
            else [rp.MofNCompleteColumn(), rp.TextColumn("{task.fields[rate]}")]
        )
        bar = rp.Progress(
            rp.TextColumn("{task.description}"),
            rp.BarColumn(),
            *amount,
            rp.TextColumn("{task.fields[records]}"),
            rp.TimeElapsedColumn(),
            rp.TimeRemainingColumn(),
            console=Console(file=self.stream),
            transient=False,
        )
        bar.start()
        self._bar = bar
        self._task = bar.add_task(self.description, total=self.total, records="", rate="")
        return self

    def advance(self, amount: float, *, records: int | None = None) -> None:
        if self._bar is None or self._task is None:
            return
        task_id = self._task
        fields: dict[str, Any] = {}
        if records is not None and self.unit == "bytes":
            fields["records"] = f"{records:,} records"
        if self.unit == "records":
            speed = self._bar.tasks[task_id].speed
            fields["rate"] = f"{speed:,.0f} records/s" if speed else ""
        self._bar.update(task_id, advance=amount, **fields)

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._bar is None:
            return
        self._bar.stop()
        self._bar = None
