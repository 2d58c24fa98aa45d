"""The control loop's ``Clock`` port (``headrace.control.looping``) on the machine's clock."""

from __future__ import annotations

import time


class SystemClock:
    """The ``Clock`` port: the machine's wall clock."""

    def now_ms(self) -> int:
        return time.time_ns() // 1_000_000
