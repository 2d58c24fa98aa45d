"""The local-mode controller process's entry point (``headrace controller``): serve one
``ControllerSettings`` until SIGTERM or SIGINT; SIGHUP reloads the API's credentials.
With a local cluster's directory it runs the TopicSnapshotSchedules too
(``controller.schedules``).

The CLI reads the command line into those settings; nothing here parses options.
"""

from __future__ import annotations

import asyncio
import logging
import signal

from headrace.aio import run
from headrace.controller.admin import ControllerAdmin
from headrace.controller.controlling import Controller, ControllerSettings
from headrace.controller.schedules import LocalSchedules, ScheduleClock
from headrace.controller.store import FileStore


def serve(settings: ControllerSettings) -> None:
    """Run the controller and its admin API until SIGTERM or SIGINT, then stop both."""
    if not logging.getLogger().isEnabledFor(logging.INFO):
        logging.getLogger("headrace").setLevel(logging.INFO)

    async def serve_until_stopped() -> None:
        c = Controller(settings)
        admin = ControllerAdmin(c)
        await admin.start()
        await c.start()
        schedules = None
        if settings.local_dir is not None:
            clock = ScheduleClock(settings.schedule_clock_rate)
            schedules = LocalSchedules(FileStore(settings.state_dir), settings.local_dir, clock)
            schedules.start()
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        loop.add_signal_handler(signal.SIGHUP, admin.access.reload)
        await stop.wait()
        if schedules is not None:
            await schedules.stop()
        await c.stop()
        await admin.stop()

    run(serve_until_stopped())
